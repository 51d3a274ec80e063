"""`quantize`: torch tensors, NumPy arrays (a zero-copy torch view), JAX and Dask arrays.

Checks the arguments, dispatches on the array type, rounds through the router
(`anynum.kernels.route`) and attaches the straight-through gradient.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.kernels.arrays import is_dask_array, is_jax_array, is_jax_tracer, quantize_dask, quantize_jax
from anynum.kernels.route import round_tensor
from anynum.quantize.checks import (
    NUMPY_FLOATS,
    check_out,
    check_overflow_fits,
    check_rand_bits,
    check_representable,
    check_tensor,
)
from anynum.rounding import (
    RandomSource,
    Rounding,
    RoundingLike,
    make_random_source,
    parse_rounding,
)

__all__ = ["quantize", "quantize_tensor"]


# --- autograd -------------------------------------------------------------------------------


class _StraightThrough(torch.autograd.Function):
    """Forward: the rounded values. Backward: the incoming gradient unchanged (STE)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


# --- the front door -------------------------------------------------------------------------


_FITS: dict[tuple[int, str, torch.dtype], Format] = {}


def _check_fits(fmt: Format, overflow: str, dtype: torch.dtype) -> None:
    """check_representable and check_overflow_fits, remembered by the format's identity.

    Their caches hash the format's fields (1-2 us each, a good part of a 4k-element call); the
    entry holds the format, so its id cannot be reused while the entry lives.
    """
    key = (id(fmt), overflow, dtype)
    if _FITS.get(key) is not fmt:
        check_representable(fmt, dtype)
        check_overflow_fits(fmt, overflow, dtype)
        if len(_FITS) >= 4096:
            _FITS.clear()
        _FITS[key] = fmt


def quantize_tensor(
    x: torch.Tensor,
    fmt: Format,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """`quantize` for a torch tensor whose format, mode and policy are already resolved.

    Checks the tensor (dtype, representability, ``out``), rounds it through the
    router without autograd, and returns ``out`` if given, else the rounded
    tensor with the straight-through gradient attached when `x` requires grad.
    """
    check_tensor(x)
    _check_fits(fmt, overflow, x.dtype)
    check_out(out, x)
    # x.detach() makes a new tensor object (about 1 us); a tensor that does not require grad
    # records no graph as it is
    xd = x.detach() if x.requires_grad else x
    if out is not None and out.requires_grad:
        with torch.no_grad():  # writing into a tensor autograd tracks
            y = round_tensor(fmt, xd, mode, overflow, rng, rand_bits, out)
    else:  # a detached input records no graph: no grad mode to switch (a few us per call)
        y = round_tensor(fmt, xd, mode, overflow, rng, rand_bits, out)
    if out is not None:
        return out
    if x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, y)
    return y


def _as_custom_op(
    x: torch.Tensor, fmt: Format, mode: Rounding, overflow: str, seed: int | None, rand_bits: int | None
) -> torch.Tensor:
    """`quantize` inside torch.compile/torch.export: one opaque ``anynum::`` op (`anynum.kernels.customop`).

    Deterministic modes and stochastic ones with an explicit ``seed=`` stay in the graph;
    a stochastic call without a seed draws one here, which the compiler cannot trace.
    """
    check_tensor(x)  # the ops' fake kernels check representability, while tracing
    if not mode.is_stochastic:
        return torch.ops.anynum.round(x, fmt.canonical_name, mode.value, overflow, rand_bits or 0)
    if seed is None:  # drawn here, as eager `quantize` does: a graph break, as documented
        seed = random.getrandbits(62)
    name = fmt.canonical_name
    return torch.ops.anynum.round_seeded(x, name, mode.value, overflow, rand_bits or 0, int(seed))


def _quantize_foreign(
    x: Any,
    fmt: Format,
    mode: Rounding,
    policy: str,
    generator: Any,
    seed: int | None,
    rand_bits: int | None,
    out: Any,
) -> Any:
    """JAX and Dask arrays, through `anynum.kernels.arrays`."""
    kind = "JAX" if is_jax_array(x) else "Dask"
    if out is not None:
        raise InputError(
            f"out= takes torch tensors and NumPy arrays; {kind} arrays are returned, not written."
        )
    name = str(x.dtype)
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise InputError(
            f"quantize needs a float16/bfloat16/float32/float64 {kind} array, got dtype {name}; "
            "convert it first, e.g. x.astype('float32')."
        )
    if kind == "Dask" and isinstance(fmt, Block):
        raise InputError(
            "Block formats share scales across chunk borders and pad rows, so they are not applied "
            "chunk by chunk; quantize x.compute() (or map_blocks over whole-block chunks yourself)."
        )
    traced_x, traced_key = is_jax_tracer(x), is_jax_tracer(generator)
    if mode.is_stochastic and (traced_key or (traced_x and generator is None and seed is None)):
        raise InputError(
            "stochastic rounding under jax.jit/vmap needs a concrete seed= or PRNG key passed from "
            "outside the traced function: a seed drawn while tracing would be reused on every call."
        )
    if generator is not None and is_jax_array(generator):  # a JAX PRNG key: its bits are the seed
        import jax

        with jax.ensure_compile_time_eval():  # a concrete key stays concrete inside jit
            words = [int(w) for w in np.asarray(jax.random.key_data(generator)).reshape(-1)]
        generator, seed = None, sum(w << (32 * i) for i, w in enumerate(reversed(words))) & ((1 << 62) - 1)
    rng = make_random_source(generator, seed, torch.device("cpu")) if mode.is_stochastic else None

    def run(t: torch.Tensor, block_rng: RandomSource | None) -> torch.Tensor:
        return quantize_tensor(t, fmt, mode, policy, block_rng, rand_bits, None)

    return quantize_jax(x, run, rng) if kind == "JAX" else quantize_dask(x, run, rng)


def quantize(
    x: Any,
    fmt: Format | str,
    rounding: RoundingLike = "nearest",
    *,
    overflow: str | None = None,
    generator: Any = None,
    seed: int | None = None,
    rand_bits: int | None = None,
    out: Any = None,
) -> Any:
    """Round every element of `x` onto `fmt`'s grid; returns the input's array type and dtype.

    Args:
        x: torch tensor (float16/bfloat16/float32/float64, any shape, strides and
            device), NumPy array (float16/float32/float64), JAX array (also inside
            ``jax.jit``; gradients pass straight through) or Dask array (lazy, chunk by
            chunk; stochastic results do not depend on the chunking).
        fmt: a Format or a name understood by `anynum.format`.
        rounding: a `Rounding` member or alias ("nearest", "rz", "sr", ...).
        overflow: "saturate", "inf", "nan" (floats) or "saturate", "wrap" (fixed
            point, integers); None uses the format's default ("inf" if it has
            infinities, else "saturate").
        generator: the random stream for stochastic modes (torch or NumPy
            Generator, or a JAX PRNG key); results depend only on it (or `seed`) and `x`.
        seed: an int seed instead of `generator`.
        rand_bits: hardware-style stochastic rounding with this many random bits (1..52).
        out: write the result here (same type, shape, dtype, device) and return it.

    Special values: NaN stays NaN; ±inf follows the overflow policy (saturate:
    ±max; inf: ±inf; nan: NaN); -0 is kept where the format has it. Negative
    inputs to unsigned float formats give NaN. With autograd the gradient passes
    straight through. Raises `RepresentabilityError` if the format's values do
    not fit the input dtype (no silent double rounding).

    >>> import anynum as an, torch
    >>> an.quantize(torch.tensor([1.0 + 2**-11, 70000.0, -1e-9]), "fp16").tolist()
    [1.0, inf, -0.0]
    >>> an.quantize(torch.tensor([70000.0]), an.FP16, overflow="saturate").tolist()
    [65504.0]
    >>> an.quantize(torch.tensor([0.3] * 4), an.E2M1, "sr", seed=0).tolist()  # 0.5 w.p. 0.6
    [0.0, 0.5, 0.5, 0.5]
    """
    fmt = lookup_format(fmt)
    mode = parse_rounding(rounding)
    policy = fmt.check_overflow(overflow)
    check_rand_bits(rand_bits, mode)
    if isinstance(x, torch.Tensor):
        if torch.compiler.is_compiling() and out is None and generator is None:
            return _as_custom_op(x, fmt, mode, policy, seed, rand_bits)
        rng = make_random_source(generator, seed, x.device) if mode.is_stochastic else None
        return quantize_tensor(x, fmt, mode, policy, rng, rand_bits, out)
    if is_jax_array(x) or is_dask_array(x):
        return _quantize_foreign(x, fmt, mode, policy, generator, seed, rand_bits, out)
    if isinstance(x, np.ndarray) or np.isscalar(x):
        arr = np.asarray(x)
        if arr.dtype not in NUMPY_FLOATS:
            raise InputError(
                f"quantize needs a float16/float32/float64 NumPy array, got dtype {arr.dtype}; "
                "convert it first, e.g. x.astype(np.float32)."
            )
        t = torch.from_numpy(arr if arr.ndim == 0 else np.ascontiguousarray(arr))
        rng = make_random_source(generator, seed, t.device) if mode.is_stochastic else None
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != arr.shape or out.dtype != arr.dtype:
                raise InputError("out= must be a NumPy array of the input's shape and dtype.")
            overlaps = np.may_share_memory(out, arr) and not (
                out.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
                and out.strides == arr.strides
            )  # torch cannot see that two arrays share memory: a shifted view goes through a copy
            if out.flags.c_contiguous and out.flags.writeable and out.ndim > 0 and not overlaps:
                quantize_tensor(t, fmt, mode, policy, rng, rand_bits, torch.from_numpy(out))
            else:
                np.copyto(out, quantize_tensor(t, fmt, mode, policy, rng, rand_bits, None).numpy())
            return out
        values = quantize_tensor(t, fmt, mode, policy, rng, rand_bits, None).numpy()
        return values if isinstance(x, np.ndarray) else values[()]
    raise InputError(
        f"quantize accepts torch tensors and NumPy arrays, got {type(x).__module__}.{type(x).__name__}."
    )
