"""Reductions of `anynum.ops`: sum, prod, mean, var, std, cumsum, cumprod, diff, norm (dot, matmul: linalg).

``accumulate=None`` (the default) computes in float64 and rounds once to `fmt`:
exact where float64 is (short sums of values with few significant bits), and
float64-accurate, not exact, for long sums (DESIGN.md, Resolution 3).

``accumulate=fmt2`` and ``accumulate="quire"`` follow `anynum.emulate`: every
product is rounded to fmt2 (unless ``fma=True``), every partial sum is rounded
to fmt2 in ``order`` ("sequential", "pairwise", or an int k: blocks of k exact
products summed exactly, then added with one rounding), and the result is rounded
to `fmt`; the quire sums exact products exactly and rounds once. See
`anynum.ops.accumulate` for how this reaches the emulation engine (the one
accumulation engine of anynum).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.ops import exact
from anynum.ops.accumulate import check_accumulate, engine_matmul, partial_products, sum_along_last
from anynum.ops.build import call, options
from anynum.ops.core import Settings, check_domain, round_exact
from anynum.rounding import Rounding, RoundingLike

Axes = int | Sequence[int] | None
_META = np.array((), dtype=np.float64)  # what Dask would otherwise infer by calling the block function


# --- arguments --------------------------------------------------------------------------------------


def _axes(name: str, axis: Axes, dim: Axes) -> tuple[int, ...] | None:
    if axis is not None and dim is not None:
        raise InputError(f"an.ops.{name}: pass axis= or its torch alias dim=, not both.")
    a = dim if axis is None else axis
    if a is None:
        return None
    items = (a,) if isinstance(a, (int, np.integer)) else tuple(a)
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items):
        raise InputError(f"an.ops.{name}: axis must be an int, a tuple of ints or None, got {a!r}.")
    return tuple(int(i) for i in items)


def _resolve(name: str, axes: tuple[int, ...] | None, ndim: int) -> list[int]:
    if axes is None:
        return list(range(ndim))
    out = []
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise InputError(f"an.ops.{name}: axis {a} is out of range for a {ndim}-d array.")
        out.append(a % max(ndim, 1))
    if len(set(out)) != len(out):
        raise InputError(f"an.ops.{name}: repeated axis in {axes}.")
    return sorted(out) if ndim else []


def _dask_whole(axes: tuple[int, ...] | None, keepdims: bool, ndim: int,
                reshape: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """Dask plan: the reduced axes in one chunk, then one block function per chunk of the rest."""

    def plan(rounded: list[Any], runner: Callable[..., Any]) -> Any:
        x = rounded[0] if reshape is None else reshape(rounded[0])
        red = _resolve("reduction", axes, x.ndim)
        x = x.rechunk({a: -1 for a in red})
        if keepdims:
            chunks = tuple((1,) if i in red else c for i, c in enumerate(x.chunks))
            return x.map_blocks(runner(), chunks=chunks, dtype=np.float64, meta=_META)
        return x.map_blocks(runner(), drop_axis=red, dtype=np.float64, meta=_META)

    return plan


def _moved(x: torch.Tensor, red: list[int]) -> torch.Tensor:
    """x with the reduced axes flattened into one last axis."""
    keep = [d for d in range(x.dim()) if d not in red]
    y = x.permute(*keep, *red)
    return y.reshape(*[x.shape[d] for d in keep], -1)


def _keep(y: torch.Tensor, x: torch.Tensor, red: list[int], keepdims: bool) -> torch.Tensor:
    if not keepdims:
        return y
    return y.reshape([1 if d in red else x.shape[d] for d in range(x.dim())])


def _nan_in(x: torch.Tensor, red: list[int], keepdims: bool) -> torch.Tensor:
    nan = torch.isnan(x)
    return nan.any(dim=red, keepdim=keepdims) if red else nan


# --- sum, mean, prod -------------------------------------------------------------------------------

def _sum_like(name: str, x: Any, fmt: Any, rounding: Any, axis: Axes, dim: Axes, keepdims: bool,
              accumulate: Any, order: Any, fma: bool, opts: dict[str, Any], mean: bool) -> Any:
    axes = _axes(name, axis, dim)
    acc = check_accumulate(name, accumulate, order, fma)

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        red = _resolve(name, axes, v.dim())
        n = int(np.prod([v.shape[d] for d in red])) if red else 1
        if acc is None:
            s = torch.sum(v, dim=red, keepdim=keepdims) if red else v.clone()
        else:
            s = _keep(sum_along_last(_moved(v, red), acc, order, st), v, red, keepdims)
        if mean:
            s = s / n if n else torch.full_like(s, torch.nan)
        check_domain(st, s, (v,), None, "finite inputs", nan_in=_nan_in(v, red, keepdims))
        return round_exact(s, None, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return (jnp.mean if mean else jnp.sum)(jnp.sin(a), axis=axes, keepdims=keepdims)

    return call(name, (x,), body, opts, jax_like=jax_like, dask=_dask_whole(axes, keepdims, 0))


def sum(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: Axes = None,
        dim: Axes = None, keepdims: bool = False, accumulate: Any = None, order: Any = "sequential",
        fma: bool = False, overflow: str | None = None, seed: int | None = None, generator: Any = None,
        rand_bits: int | None = None, domain: str = "nan") -> Any:
    """sum: the sum of the rounded inputs over `axis`, rounded once (or accumulated per `accumulate`).

    NaN in a reduced slice gives NaN; inf + -inf gives NaN and a RuntimeWarning
    (NumPy). An empty slice sums to 0.

    Beyond the arguments every function takes: ``axis`` (or its torch alias ``dim``:
    an int, a tuple, or None for all), ``keepdims``, and ``accumulate``, ``order`` and
    ``fma`` (module docstring).

    >>> import anynum as an, numpy as np
    >>> an.ops.sum(np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.125]]), "bf16", axis=1).tolist()
    [6.0, 0.875]
    >>> float(an.ops.sum(np.full(3, 0.1), "e4m3fn", "ru"))   # each 0.1 rounds up to 0.1015625 first
    0.3125
    """
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)
    return _sum_like("sum", x, fmt, rounding, axis, dim, keepdims, accumulate, order, fma, opts, False)


def mean(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: Axes = None,
         dim: Axes = None, keepdims: bool = False, accumulate: Any = None, order: Any = "sequential",
         fma: bool = False, overflow: str | None = None, seed: int | None = None, generator: Any = None,
         rand_bits: int | None = None, domain: str = "nan") -> Any:
    """mean: the sum (as `sum`) divided by the count in float64, rounded once.

    An empty slice gives NaN and a RuntimeWarning (NumPy).

    >>> import anynum as an, numpy as np
    >>> an.ops.mean(np.array([[1.0, 2.0, 3.0], [0.5, 0.25, 0.125]]), "bf16", axis=0).tolist()
    [0.75, 1.125, 1.5625]
    """
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)
    return _sum_like("mean", x, fmt, rounding, axis, dim, keepdims, accumulate, order, fma, opts, True)


def prod(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: Axes = None,
         dim: Axes = None, keepdims: bool = False, accumulate: Any = None, order: Any = "sequential",
         fma: bool = False, overflow: str | None = None, seed: int | None = None, generator: Any = None,
         rand_bits: int | None = None, domain: str = "nan") -> Any:
    """prod: the product of the rounded inputs over `axis`, rounded once.

    With ``accumulate=fmt2`` every partial product is rounded to fmt2 (correctly,
    in `rounding`), left to right or as a balanced tree (``order="pairwise"``); the
    quire does not apply to products. 0 * inf gives NaN and a RuntimeWarning.

    >>> import anynum as an, numpy as np
    >>> x = np.full(8, 1.1)
    >>> float(an.ops.prod(x, "bf16")), float(an.ops.prod(x, "bf16", accumulate="e4m3fn"))
    (2.171875, 2.0)
    """
    axes = _axes("prod", axis, dim)
    acc = check_accumulate("prod", accumulate, order, fma)
    if acc == "quire":
        raise InputError("an.ops.prod: the quire sums products; a product has no quire. Use accumulate=None.")
    if isinstance(order, int) and acc is not None:
        raise InputError("an.ops.prod: order must be 'sequential' or 'pairwise' for products.")
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        red = _resolve("prod", axes, v.dim())
        if acc is None:
            flat = _moved(v, red) if red else v.unsqueeze(-1)
            s = _keep(torch.prod(flat, dim=-1), v, red, keepdims)
        else:
            flat = _moved(v, red) if red else v.unsqueeze(-1)
            s = _keep(partial_products(flat, acc, order, st), v, red, keepdims)
        check_domain(st, s, (v,), None, "no 0 * inf", nan_in=_nan_in(v, red, keepdims))
        return round_exact(s, None, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return jnp.prod(jnp.sin(a), axis=axes, keepdims=keepdims)

    return call("prod", (x,), body, opts, jax_like=jax_like, dask=_dask_whole(axes, keepdims, 0))


# --- var, std --------------------------------------------------------------------------------------


def _var_like(name: str, x: Any, axis: Axes, dim: Axes, keepdims: bool, ddof: int, opts: dict[str, Any],
              root: bool) -> Any:
    axes = _axes(name, axis, dim)
    if isinstance(ddof, bool) or not isinstance(ddof, int) or ddof < 0:
        raise InputError(f"an.ops.{name}: ddof must be a non-negative int, got {ddof!r}.")

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        red = _resolve(name, axes, v.dim())
        if red:
            s = torch.var(v, dim=red, correction=ddof, keepdim=keepdims)
        else:
            s = torch.where(torch.isfinite(v), 0.0, torch.nan) / (1 - ddof) if ddof != 1 else v * torch.nan
        s = torch.sqrt(s) if root else s
        check_domain(st, s, (v,), None, "finite inputs and more than ddof of them",
                     nan_in=_nan_in(v, red, keepdims))
        return round_exact(s, None, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return (jnp.std if root else jnp.var)(jnp.sin(a), axis=axes, keepdims=keepdims)

    return call(name, (x,), body, opts, jax_like=jax_like, dask=_dask_whole(axes, keepdims, 0))


def var(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: Axes = None,
        dim: Axes = None, keepdims: bool = False, ddof: int = 0, overflow: str | None = None,
        seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
        domain: str = "nan") -> Any:
    """var: variance over `axis` (NumPy's ``ddof=0`` by default; torch and Pychop use 1), rounded once.

    Computed in float64 (two-pass), not exact. Fewer than ``ddof + 1`` elements
    give NaN and a RuntimeWarning.

    >>> import anynum as an, numpy as np
    >>> float(an.ops.var(np.arange(5.0), "bf16")), float(an.ops.var(np.arange(5.0), "bf16", ddof=1))
    (2.0, 2.5)
    """
    return _var_like("var", x, axis, dim, keepdims, ddof, options(fmt, rounding, overflow, seed, generator,
                                                                 rand_bits, domain), False)


def std(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: Axes = None,
        dim: Axes = None, keepdims: bool = False, ddof: int = 0, overflow: str | None = None,
        seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
        domain: str = "nan") -> Any:
    """std: the square root of `var` (float64), rounded once.

    >>> import anynum as an, numpy as np
    >>> float(an.ops.std(np.arange(5.0), "bf16"))
    1.4140625
    """
    return _var_like("std", x, axis, dim, keepdims, ddof, options(fmt, rounding, overflow, seed, generator,
                                                                 rand_bits, domain), True)


# --- cumulative ------------------------------------------------------------------------------------


def _cumulative(name: str, x: Any, axis: int | None, dim: int | None, accumulate: Any, order: Any,
                fma: bool, opts: dict[str, Any], product: bool) -> Any:
    axes = _axes(name, axis, dim)
    if axes is not None and len(axes) != 1:
        raise InputError(f"an.ops.{name}: axis must be one int or None (flattened), got {axes}.")
    acc = check_accumulate(name, accumulate, order, fma)
    if acc is not None and order != "sequential":
        raise InputError(f"an.ops.{name}: running results are sequential; use order='sequential'.")
    if acc == "quire" and product:
        raise InputError("an.ops.cumprod: the quire sums products; use accumulate=None or a format.")

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        if axes is None:
            v, ax = v.reshape(-1), 0
        else:
            ax = _resolve(name, axes, v.dim())[0]
        w = v.movedim(ax, -1)
        if acc is None:
            s = torch.cumprod(w, dim=-1) if product else torch.cumsum(w, dim=-1)
        elif product:
            cols = [w[..., 0]]
            for i in range(1, w.shape[-1]):
                pair = torch.stack([cols[-1], w[..., i]], dim=-1)
                cols.append(partial_products(pair, acc, "sequential", st))
            s = torch.stack(cols, dim=-1) if cols and w.shape[-1] else w.clone()
        else:  # prefix sums on the engine: x @ upper-triangular ones, fused (each x_i enters exactly)
            n = w.shape[-1]
            tri = torch.triu(torch.ones(n, n, dtype=torch.float64, device=w.device))
            s = engine_matmul(w, tri, acc, "sequential", True, st)
        s = s.movedim(-1, ax)
        check_domain(st, s, (v,), None, "no inf - inf", nan_in=torch.isnan(v).movedim(ax, -1).to(torch.int32)
                     .cumsum(-1).bool().movedim(-1, ax))
        return round_exact(s, None, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return (jnp.cumprod if product else jnp.cumsum)(jnp.sin(a), axis=None if axes is None else axes[0])

    def dask(rounded: list[Any], runner: Callable[..., Any]) -> Any:
        v = rounded[0] if axes is not None else rounded[0].reshape(-1)
        ax = _resolve(name, axes, v.ndim)[0] if axes is not None else 0
        return v.rechunk({ax: -1}).map_blocks(runner(), dtype=np.float64, meta=_META)

    return call(name, (x,), body, opts, jax_like=jax_like, dask=dask)


def cumsum(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: int | None = None,
           dim: int | None = None, accumulate: Any = None, order: Any = "sequential", fma: bool = False,
           overflow: str | None = None, seed: int | None = None, generator: Any = None,
           rand_bits: int | None = None, domain: str = "nan") -> Any:
    """cumsum: running sums along `axis` (None: of the flattened array), each rounded once.

    With ``accumulate=fmt2`` each running sum is the previous one plus the next term,
    rounded to fmt2 (sequential order only).

    >>> import anynum as an, numpy as np
    >>> an.ops.cumsum(np.full(4, 0.1), "bf16").tolist()
    [0.10009765625, 0.2001953125, 0.30078125, 0.400390625]
    """
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)
    return _cumulative("cumsum", x, axis, dim, accumulate, order, fma, opts, False)


def cumprod(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, axis: int | None = None,
            dim: int | None = None, accumulate: Any = None, order: Any = "sequential", fma: bool = False,
            overflow: str | None = None, seed: int | None = None, generator: Any = None,
            rand_bits: int | None = None, domain: str = "nan") -> Any:
    """cumprod: running products along `axis` (None: flattened), each rounded once (or per `accumulate`).

    >>> import anynum as an, numpy as np
    >>> an.ops.cumprod(np.full(4, 1.5), "e4m3fn").tolist()
    [1.5, 2.25, 3.5, 5.0]
    """
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)
    return _cumulative("cumprod", x, axis, dim, accumulate, order, fma, opts, True)


# --- diff, norm ----------------------------------------------------------------------------------


def diff(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, n: int = 1, axis: int = -1,
         dim: int | None = None, overflow: str | None = None, seed: int | None = None, generator: Any = None,
         rand_bits: int | None = None, domain: str = "nan") -> Any:
    """diff: n-th differences along `axis`, rounded once.

    ``n=1`` is an exact subtraction (correctly rounded in every mode); higher orders
    are computed in float64 (exact unless an intermediate difference needs more
    than 53 bits). inf - inf gives NaN and a RuntimeWarning.

    >>> import anynum as an, numpy as np
    >>> an.ops.diff(np.array([1.0, 1.5, 3.0]), "e4m3fn").tolist()
    [0.5, 1.5]
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InputError(f"an.ops.diff: n must be a non-negative int, got {n!r}.")
    axes = _axes("diff", axis, dim)
    assert axes is not None
    if len(axes) != 1:
        raise InputError(f"an.ops.diff: axis must be one int, got {axes}.")
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        if v.dim() == 0:
            raise InputError("an.ops.diff needs an array of at least one dimension.")
        ax = _resolve("diff", axes, v.dim())[0]
        if n == 0:
            return round_exact(v.clone(), None, st)
        w = torch.diff(v, n=n - 1, dim=ax) if n > 1 else v
        m = w.shape[ax]
        hi, lo = w.narrow(ax, 1, builtins.max(m - 1, 0)), w.narrow(ax, 0, builtins.max(m - 1, 0))
        s, e = exact.add(hi, -lo, st.mode is Rounding.DOWN)
        check_domain(st, s, (hi, lo), None, "no inf - inf")
        return round_exact(s, e, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return jnp.diff(jnp.sin(a), n=n, axis=axes[0])

    def dask(rounded: list[Any], runner: Callable[..., Any]) -> Any:
        v = rounded[0]
        ax = _resolve("diff", axes, v.ndim)[0]
        v = v.rechunk({ax: -1})
        chunks = tuple((builtins.max(v.shape[ax] - n, 0),) if i == ax else c for i, c in enumerate(v.chunks))
        return v.map_blocks(runner(), chunks=chunks, dtype=np.float64, meta=_META)

    return call("diff", (x,), body, opts, jax_like=jax_like, dask=dask)


def norm(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, ord: float = 2,
         axis: Axes = None, dim: Axes = None, keepdims: bool = False, accumulate: Any = None,
         order: Any = "sequential", fma: bool = False, overflow: str | None = None, seed: int | None = None,
         generator: Any = None, rand_bits: int | None = None, domain: str = "nan") -> Any:
    """norm: the vector ``ord``-norm over `axis` (all axes: of the flattened array), rounded once.

    ``ord``: 2 (default), 1, inf, -inf, 0 (count of nonzeros) or any p > 0, as
    ``torch.linalg.vector_norm``; for a matrix this is the Frobenius norm at
    ord=2, not NumPy's spectral norm. With ``accumulate=fmt2`` the sum of |x|**p
    (p = 1, 2) is accumulated as `sum`/`dot` do; inf norms are exact.

    >>> import anynum as an, numpy as np
    >>> x = np.array([3.0, -4.0])
    >>> float(an.ops.norm(x, "bf16")), float(an.ops.norm(x, "bf16", ord=1))
    (5.0, 7.0)
    """
    axes = _axes("norm", axis, dim)
    acc = check_accumulate("norm", accumulate, order, fma)
    if acc is not None and ord not in (1, 2, float("inf"), -float("inf")):
        raise InputError(f"an.ops.norm: accumulate= supports ord 1, 2 and ±inf, got {ord!r}.")
    opts = options(fmt, rounding, overflow, seed, generator, rand_bits, domain)

    def body(st: Settings, v: torch.Tensor) -> torch.Tensor:
        red = _resolve("norm", axes, v.dim())
        flat = _moved(v, red) if red else v.unsqueeze(-1)
        if acc is None or ord in (float("inf"), -float("inf")):
            s = torch.linalg.vector_norm(flat, ord=ord, dim=-1)
        elif ord == 1:
            s = sum_along_last(flat.abs(), acc, order, st)
        else:
            s = torch.sqrt(engine_matmul(flat.unsqueeze(-2), flat.unsqueeze(-1), acc, order, fma, st)
                           .reshape(flat.shape[:-1]))
        s = _keep(s, v, red, keepdims)
        check_domain(st, s, (v,), None, "finite inputs", nan_in=_nan_in(v, red, keepdims))
        return round_exact(s, None, st)

    def jax_like(a: Any) -> Any:
        import jax.numpy as jnp

        return jnp.sum(jnp.sin(a), axis=axes, keepdims=keepdims)

    return call("norm", (x,), body, opts, jax_like=jax_like, dask=_dask_whole(axes, keepdims, 0))
