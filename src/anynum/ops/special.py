"""The `anynum.ops` functions with signatures of their own: fma, clip, ldexp, frexp, modf, round."""

from __future__ import annotations

from typing import Any

import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.ops import exact
from anynum.ops.build import SHAPE_1, SHAPE_2, call, jnp_like, make_body
from anynum.ops.core import Settings, round_exact
from anynum.rounding import RoundingLike

__all__ = ["around", "clip", "fma", "frexp", "ldexp", "modf", "round"]


def fma(x: Any, y: Any, z: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *,
        overflow: str | None = None, seed: int | None = None, generator: Any = None,
        rand_bits: int | None = None, domain: str = "nan") -> Any:
    """fma: x * y + z with one rounding (fused multiply-add), exact: correctly rounded in every mode.

    NaN, ±inf and -0 follow IEEE 754 fusedMultiplyAdd on the rounded inputs, then the
    format. The arguments are described in `anynum.ops`.

    >>> import anynum as an, torch
    >>> x = torch.tensor([1.0 + 2**-7])
    >>> an.ops.fma(x, x, -torch.tensor([1.0]), "bf16").tolist()   # x*x - 1 exactly, then rounded
    [0.015625]
    """
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)
    body = make_body("fma", exact.fma, None, "", pair=True, down_aware=True)
    return call("fma", (x, y, z), body, opts, jax_like=lambda a, b, c: SHAPE_2(a, b) * SHAPE_1(c))


def clip(x: Any, a_min: Any, a_max: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *,
         overflow: str | None = None, seed: int | None = None, generator: Any = None,
         rand_bits: int | None = None, domain: str = "nan") -> Any:
    """clip: x limited to [a_min, a_max] (both rounded to `fmt` too; None means no bound), exact.

    NaN stays NaN (NumPy's ``np.clip``). The arguments are described in `anynum.ops`.

    >>> import anynum as an, torch
    >>> an.ops.clip(torch.tensor([-3.0, 0.3, 3.0]), -1.0, 1.1, "e4m3fn").tolist()
    [-1.0, 0.3125, 1.125]
    """
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)
    lo = -float("inf") if a_min is None else a_min
    hi = float("inf") if a_max is None else a_max

    def f(v: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(torch.isnan(v), v, torch.minimum(torch.maximum(v, a), b))

    body = make_body("clip", f, None, "", pair=False)
    return call("clip", (x, lo, hi), body, opts, jax_like=lambda a, b, c: SHAPE_2(a, b) * SHAPE_1(c))


def ldexp(x: Any, n: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *,
          overflow: str | None = None, seed: int | None = None, generator: Any = None,
          rand_bits: int | None = None, domain: str = "nan") -> Any:
    """ldexp: x * 2**n for integer n (not rounded), exact and rounded once: correctly rounded in every mode.

    `n` is an integer array or number. NaN, ±inf and ±0 pass through (then the
    format's rules). The arguments are described in `anynum.ops`.

    >>> import anynum as an, torch
    >>> an.ops.ldexp(torch.tensor([1.5, 1.5]), torch.tensor([3, -200]), "bf16", "ru").tolist()
    [12.0, 9.183549615799121e-41]
    """
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)
    dtype_name = str(getattr(n, "dtype", "")).split(".")[-1]
    if isinstance(n, float) or dtype_name.startswith(("float", "bfloat")):
        raise InputError(f"an.ops.ldexp needs integer exponents n, got {type(n).__name__} of floats.")
    body = make_body("ldexp", exact.ldexp, None, "", pair=True)
    return call("ldexp", (x, n), body, opts, jax_like=jnp_like("ldexp"), rounded=(True, False))


def frexp(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, overflow: str | None = None,
          seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
          domain: str = "nan") -> tuple[Any, Any]:
    """frexp: (mantissa, exponent) with x = mantissa * 2**exponent and 0.5 <= |mantissa| < 1; exact.

    The mantissa is rounded to `fmt` (it is exact for float formats); the exponent is
    an int32 array, not rounded. 0, NaN and ±inf give (x, 0) as in NumPy. The
    arguments are described in `anynum.ops`.

    >>> import anynum as an, torch
    >>> m, e = an.ops.frexp(torch.tensor([12.0, -0.3]), "bf16")
    >>> m.tolist(), e.tolist()
    ([0.75, -0.6015625], [4, -1])
    """
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)

    def body(st: Settings, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        m, e = torch.frexp(v)
        return round_exact(m, None, st), e

    return call("frexp", (x,), body, opts, jax_like=jnp_like("frexp"), outputs=("f", "i"))  # type: ignore[no-any-return]


def modf(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, overflow: str | None = None,
         seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
         domain: str = "nan") -> tuple[Any, Any]:
    """modf: (fractional part, integral part) of x, both with x's sign; exact, each rounded once.

    ±inf gives (±0, ±inf) and NaN (NaN, NaN), as in NumPy. The arguments are
    described in `anynum.ops`.

    >>> import anynum as an, torch
    >>> f, i = an.ops.modf(torch.tensor([-2.75, 3.5]), "bf16")
    >>> f.tolist(), i.tolist()
    ([-0.75, 0.5], [-2.0, 3.0])
    """
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)

    def body(st: Settings, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frac, whole = exact.modf(v)
        return round_exact(frac, None, st), round_exact(whole, None, st.with_rng(st.stream(7)))

    return call("modf", (x,), body, opts, jax_like=jnp_like("modf"), outputs=("f", "f"))  # type: ignore[no-any-return]


def round(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, decimals: int = 0,
          overflow: str | None = None, seed: int | None = None, generator: Any = None,
          rand_bits: int | None = None, domain: str = "nan") -> Any:
    """round: x rounded to `decimals` decimal places, ties to even (NumPy's ``np.round``), then to `fmt`.

    With ``decimals=0`` this is exact (`rint`); otherwise NumPy's float64
    algorithm (scale by 10**decimals, round to an integer, scale back) is computed
    once and rounded once. NaN and ±inf pass through. The `rounding` argument is
    the format's rounding mode, not the decimal one. The arguments are described
    in `anynum.ops`.

    >>> import anynum as an, torch
    >>> an.ops.round(torch.tensor([2.5, 0.125]), "bf16", decimals=1).tolist()
    [2.5, 0.10009765625]
    """
    if isinstance(decimals, bool) or not isinstance(decimals, int):
        raise InputError(f"an.ops.round needs an integer decimals=, got {decimals!r}.")
    opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)

    def f(v: torch.Tensor) -> torch.Tensor:
        if decimals == 0:
            return torch.round(v)
        if decimals > 0:
            scale = 10.0**decimals
            return torch.round(v * scale) / scale
        scale = 10.0**-decimals
        return torch.round(v / scale) * scale

    body = make_body("round", f, None, "", pair=False)
    return call("round", (x,), body, opts, jax_like=SHAPE_1)


around = round
