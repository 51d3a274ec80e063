"""Component dtypes, exact power-of-two scaling and exact constants for `anynum.mc`.

Nothing here is public; the public names live in :mod:`anynum.mc`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import torch

from anynum.errors import AnynumError

Comps = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class DTypeInfo:
    """Binary floating-point parameters of a component dtype."""

    dtype: torch.dtype
    precision: int  # significand bits including the hidden bit
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p."""
        return 2.0 ** (-self.precision)

    @property
    def splitter(self) -> float:
        """Veltkamp splitter 2^ceil(p/2) + 1."""
        return float(2 ** ((self.precision + 1) // 2) + 1)

    @property
    def tiny(self) -> float:
        """Smallest positive subnormal."""
        return 2.0 ** (self.emin - self.precision + 1)


_INFO = {
    torch.float16: DTypeInfo(torch.float16, 11, -14, 15),
    torch.bfloat16: DTypeInfo(torch.bfloat16, 8, -126, 127),
    torch.float32: DTypeInfo(torch.float32, 24, -126, 127),
    torch.float64: DTypeInfo(torch.float64, 53, -1022, 1023),
}

SUPPORTED = tuple(_INFO)


def info(dtype: torch.dtype) -> DTypeInfo:
    """Return the `DTypeInfo` of a component dtype or raise `AnynumError`."""
    try:
        return _INFO[dtype]
    except KeyError:
        raise AnynumError(
            f"MCTensor components must be float16, bfloat16, float32 or float64; got {dtype}. "
            "Convert the input with .to(torch.float32) (or another supported float dtype) first."
        ) from None


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    info(dtype)
    return dtype


def ldexp(x: torch.Tensor, e: torch.Tensor | int) -> torch.Tensor:
    """x * 2**e, exact whenever the result is normal, correctly rounded when it is subnormal.

    The scaling is done in two steps so that the factors 2**(e//2) and 2**(e - e//2) stay
    representable; the intermediate value lies between x and the result in magnitude, so it
    cannot overflow or underflow spuriously.  `e` is an integer tensor broadcastable to x.
    """
    if isinstance(e, int):
        e = torch.tensor(e, dtype=torch.int32)
    e = e.to(x.device)
    e1 = torch.div(e, 2, rounding_mode="floor")
    e2 = e - e1
    two = torch.tensor(2.0, dtype=x.dtype, device=x.device)
    return x * torch.pow(two, e1.to(x.dtype)) * torch.pow(two, e2.to(x.dtype))


def exponent(x: torch.Tensor) -> torch.Tensor:
    """Integer e with |x| < 2**e <= 2|x| for finite nonzero x (0 for zero), as int32."""
    return torch.frexp(x)[1]


# ---------------------------------------------------------------- exact constants
def _round_fraction(v: Fraction, dtype: torch.dtype) -> float:
    """Round a rational to `dtype` (via float64; the tail is recomputed exactly afterwards)."""
    f = float(v)
    if dtype == torch.float64:
        return f
    return float(torch.tensor(f, dtype=torch.float64).to(dtype).item())


def fraction_to_floats(v: Fraction, dtype: torch.dtype, nc: int) -> list[float]:
    """Greedy expansion of a rational number into `nc` floats of `dtype` (largest first)."""
    out: list[float] = []
    rest = v
    for _ in range(nc):
        c = _round_fraction(rest, dtype)
        if not math.isfinite(c):
            return out + [c] + [0.0] * (nc - len(out) - 1) if not out else out + [0.0] * (
                nc - len(out)
            )
        out.append(c)
        rest = rest - Fraction(c)
    return out


@cache
def ln2_fraction(bits: int = 320) -> Fraction:
    """ln 2 to better than 2**-bits, as a Fraction: sum_{k>=1} 1 / (k 2^k)."""
    total = Fraction(0)
    for k in range(1, bits + 8):
        total += Fraction(1, k * (1 << k))
    return total


@cache
def const_floats(name: str, dtype: torch.dtype, nc: int) -> tuple[float, ...]:
    """Named constant as an `nc`-term expansion in `dtype` (cached)."""
    if name == "ln2":
        return tuple(fraction_to_floats(ln2_fraction(), dtype, nc))
    raise KeyError(name)  # pragma: no cover - internal misuse


def const_comps(values: tuple[float, ...] | list[float], like: torch.Tensor) -> Comps:
    """Scalar constant expansion as 0-d tensors matching `like`'s dtype and device."""
    return tuple(torch.tensor(v, dtype=like.dtype, device=like.device) for v in values)


def scalar_comps(value: float | int, dtype: torch.dtype, nc: int, device: torch.device) -> Comps:
    """A Python number as an exact (when it fits) `nc`-term expansion of 0-d tensors."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        t = torch.tensor(value, dtype=dtype, device=device)
        return (t, *tuple(torch.zeros((), dtype=dtype, device=device) for _ in range(nc - 1)))
    vals = fraction_to_floats(Fraction(value), dtype, nc)
    return tuple(torch.tensor(v, dtype=dtype, device=device) for v in vals)
