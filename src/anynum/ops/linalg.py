"""dot and matmul of `anynum.ops`: products of the rounded inputs, accumulated per `accumulate`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.ops import exact
from anynum.ops.accumulate import check_accumulate, engine_matmul
from anynum.ops.build import call, options
from anynum.ops.core import Settings, check_domain, round_exact
from anynum.rounding import RoundingLike

__all__ = ["dot", "matmul"]

_META = np.array((), dtype=np.float64)  # what Dask would otherwise infer by calling the block function


def _contract(a: torch.Tensor, b: torch.Tensor, numpy_dot: bool) -> torch.Tensor:
    """The float64 product: np.matmul rules, or np.dot's (last axis of a, second-to-last of b)."""
    if numpy_dot and a.dim() > 1 and b.dim() > 2:
        return torch.tensordot(a, b, dims=([a.dim() - 1], [b.dim() - 2]))
    return torch.matmul(a, b)


def _dot_like(name: str, x: Any, y: Any, accumulate: Any, order: Any, fma: bool, opts: dict[str, Any],
              numpy_dot: bool) -> Any:
    acc = check_accumulate(name, accumulate, order, fma)

    def accumulated(st: Settings, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if numpy_dot and a.dim() > 1 and b.dim() > 2:
            raise InputError("an.ops.dot with accumulate= takes arrays of at most 2 dimensions; use matmul.")
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        out = engine_matmul(a2, b2, acc, order, fma, st)
        if b.dim() == 1:
            out = out.squeeze(-1)
        if a.dim() == 1:
            out = out.squeeze(-2) if b.dim() > 1 else out.squeeze(0)
        return out

    def body(st: Settings, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.dim() == 0 or b.dim() == 0:
            if not numpy_dot:
                raise InputError(f"an.ops.{name} needs arrays of at least one dimension (NumPy's rule).")
            s, e = exact.multiply(a, b)  # np.dot with a scalar multiplies elementwise
            check_domain(st, s, (a, b), None, "no 0 * inf")
            return round_exact(s, e, st)
        s = _contract(a, b, numpy_dot) if acc is None else accumulated(st, a, b)
        na, nb = torch.isnan(a).to(a.dtype), torch.isnan(b).to(b.dtype)
        nan_in = (_contract(na, torch.ones_like(b), numpy_dot)
                  + _contract(torch.ones_like(a), nb, numpy_dot)) > 0
        check_domain(st, s, (a, b), None, "no 0 * inf or inf - inf", nan_in=nan_in)
        return round_exact(s, None, st)

    def jax_like(a: Any, b: Any) -> Any:
        import jax.numpy as jnp

        return (jnp.dot if numpy_dot else jnp.matmul)(jnp.sin(a), jnp.sin(b))

    def dask(rounded: list[Any], runner: Callable[..., Any]) -> Any:
        import dask.array as da

        a, b = rounded
        if acc is not None:
            raise InputError(
                f"an.ops.{name} with accumulate= on Dask arrays: compute them first (x.compute())."
            )
        s = (da.dot if numpy_dot else da.matmul)(a, b)

        def round_only(st: Settings, v: torch.Tensor) -> torch.Tensor:
            return round_exact(v, None, st)

        return s.map_blocks(runner(round_only), dtype=np.float64, meta=_META)

    return call(name, (x, y), body, opts, jax_like=jax_like, dask=dask)


def dot(x: Any, y: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, accumulate: Any = None,
        order: Any = "sequential", fma: bool = False, overflow: str | None = None, seed: int | None = None,
        generator: Any = None, rand_bits: int | None = None, domain: str = "nan") -> Any:
    """dot: NumPy's dot product of the rounded inputs (float64 accumulation), rounded once.

    A scalar operand multiplies elementwise (exactly). Dask arrays accumulate
    chunk by chunk in float64.

    >>> import anynum as an, numpy as np
    >>> float(an.ops.dot(np.array([1.0, 2.0]), np.array([0.1, 0.2]), "bf16"))
    0.5
    """
    return _dot_like("dot", x, y, accumulate, order, fma,
                     options(fmt, rounding, overflow, seed, generator, rand_bits, domain), True)


def matmul(x: Any, y: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *,
           accumulate: Any = None, order: Any = "sequential", fma: bool = False, overflow: str | None = None,
           seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
           domain: str = "nan") -> Any:
    """matmul: the matrix product of the rounded inputs (NumPy's matmul rules), rounded once.

    Dask arrays accumulate chunk by chunk in float64.

    >>> import anynum as an, numpy as np
    >>> an.ops.matmul(np.eye(2), np.full((2, 2), 0.3), "e4m3fn").tolist()
    [[0.3125, 0.3125], [0.3125, 0.3125]]
    """
    return _dot_like("matmul", x, y, accumulate, order, fma,
                     options(fmt, rounding, overflow, seed, generator, rand_bits, domain), False)
