"""JAX and Dask arrays for `anynum.quantize`: thin adapters around the torch kernels.

Neither library is imported unless such an array arrives (``import anynum``
never loads them). Results are the torch path's, bit for bit:

* **JAX**: concrete arrays cross to torch through DLPack (no copy on CPU), so
  every dtype (bfloat16 included) and device works. Inside ``jax.jit`` (or
  any transformation) the rounding runs as a ``jax.pure_callback`` on the host.
  Gradients pass straight through (a custom JVP: d quantize(x)/dx = 1), as for
  torch tensors.
* **Dask**: ``map_blocks`` over the chunks, lazily. Stochastic rounding draws
  each element's random bits by its index in the *whole* array, so results do
  not depend on the chunking.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.rounding import RandomSource

__all__ = [
    "GlobalIndexRandom",
    "is_dask_array",
    "is_jax_array",
    "is_jax_tracer",
    "quantize_dask",
    "quantize_jax",
]

QuantizeTorch = Callable[[torch.Tensor, RandomSource | None], torch.Tensor]


def is_jax_array(x: Any) -> bool:
    """True for a jax.Array (or tracer) without importing jax."""
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib")


def is_jax_tracer(x: Any) -> bool:
    """True for an abstract JAX value (inside jit, vmap, grad, ...)."""
    if not is_jax_array(x):
        return False
    import jax

    return isinstance(x, jax.core.Tracer)


def is_dask_array(x: Any) -> bool:
    """True for a dask.array.Array without importing dask."""
    return type(x).__module__.startswith("dask.array")


class GlobalIndexRandom(RandomSource):
    """A random source for one block of a larger array: local indices map to global ones.

    ``bits_at`` receives row-major indices within the block and asks `base` for
    the bits of the same elements' row-major indices in the whole array, so a
    chunked computation draws exactly the bits of the unchunked one.
    """

    def __init__(self, base: RandomSource, block_start: tuple[int, ...], block_shape: tuple[int, ...],
                 full_shape: tuple[int, ...]):
        self.base = base
        self.block_start = block_start
        self.block_shape = block_shape
        self.full_strides = [int(np.prod(full_shape[d + 1:], dtype=np.int64)) for d in range(len(full_shape))]

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        rest = index
        glob = torch.zeros_like(index)
        for d in range(len(self.block_shape) - 1, -1, -1):
            size = self.block_shape[d]
            glob = glob + (rest % size + self.block_start[d]) * self.full_strides[d]
            rest = rest // size
        return self.base.bits_at(glob, nbits, stream)


def _run_numpy(a: np.ndarray, run: QuantizeTorch, rng: RandomSource | None) -> np.ndarray:
    """`run` on a NumPy array, bfloat16 (ml_dtypes) included, returning the same dtype and shape."""
    a = np.array(a, copy=True, order="C")  # writable and contiguous; keeps 0-d arrays 0-d
    if a.dtype.name == "bfloat16":  # NumPy has no bfloat16: cross through its bits
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return run(t, rng).view(torch.int16).numpy().view(a.dtype)
    return run(torch.from_numpy(a), rng).numpy()


def quantize_jax(x: Any, run: QuantizeTorch, rng: RandomSource | None) -> Any:
    """`run` (a torch quantizer) applied to jax array `x`; see the module docstring."""
    import jax
    import jax.numpy as jnp

    def host(a: np.ndarray) -> np.ndarray:
        return _run_numpy(a, run, rng)

    @jax.custom_jvp
    def q(a: Any) -> Any:
        if isinstance(a, jax.core.Tracer):
            # "sequential": under vmap each example is rounded as its own array (its own indices).
            spec = jax.ShapeDtypeStruct(a.shape, a.dtype)
            return jax.pure_callback(host, spec, a, vmap_method="sequential")
        t = torch.from_dlpack(a)
        return jnp.from_dlpack(run(t, rng).contiguous())

    @q.defjvp
    def _straight_through(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
        return q(primals[0]), tangents[0]

    return q(x)


def quantize_dask(x: Any, run: QuantizeTorch, rng: RandomSource | None) -> Any:
    """`run` applied chunk by chunk to dask array `x`, lazily; see the module docstring."""
    if any(np.isnan(s) for s in x.shape):
        raise InputError(
            "a Dask array with unknown chunk sizes cannot be quantized (stochastic rounding needs "
            "each element's index); call x.compute_chunk_sizes() first."
        )
    full_shape = tuple(int(s) for s in x.shape)

    def block(b: np.ndarray, block_info: dict[Any, Any] | None = None) -> np.ndarray:
        block_rng = rng
        if rng is not None and block_info is not None:
            start = tuple(int(lo) for lo, _ in block_info[0]["array-location"])
            block_rng = GlobalIndexRandom(rng, start, tuple(b.shape), full_shape)
        return _run_numpy(b, run, block_rng)

    return x.map_blocks(block, dtype=x.dtype)
