"""Independent oracles for the mc tests: exact rationals (fractions) and mpmath.

Nothing here calls anynum's arithmetic: inputs are built from raw components and the
expected values are computed exactly from those components.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
PREC = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}
EMIN = {torch.float16: -14, torch.bfloat16: -126, torch.float32: -126, torch.float64: -1022}
EMAX = {torch.float16: 15, torch.bfloat16: 127, torch.float32: 127, torch.float64: 1023}


def u(dtype: torch.dtype) -> Fraction:
    return Fraction(1, 2 ** PREC[dtype])


def tiny(dtype: torch.dtype) -> Fraction:
    return Fraction(2) ** (EMIN[dtype] - PREC[dtype] + 1)


def exact(comps) -> list[Fraction]:
    """Exact value of each element of an expansion given as a tuple of tensors."""
    flat = [c.detach().to(torch.float64).reshape(-1).tolist() for c in comps]
    return [sum((Fraction(c[i]) for c in flat), Fraction(0)) for i in range(len(flat[0]))]


def rel_err_u(got: list[Fraction], want: list[Fraction], unit: Fraction, absolute: Fraction):
    """max over elements of (|got - want| - absolute)_+ / (unit * |want|)."""
    worst = 0.0
    for g, w in zip(got, want):
        d = abs(g - w) - absolute
        if d <= 0:
            continue
        if w == 0:
            return math.inf
        worst = max(worst, float(d / (unit * abs(w))))
    return worst


def round_fraction(v: Fraction, dtype: torch.dtype) -> float:
    """Round a rational to nearest-even in `dtype`, subnormals and overflow included."""
    p, emin, emax = PREC[dtype], EMIN[dtype], EMAX[dtype]
    if v == 0:
        return 0.0
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = max(e, emin) - p + 1  # quantum
    scaled = a / Fraction(2) ** q
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    r = Fraction(n) * Fraction(2) ** q
    maxv = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if r > maxv:
        return sign * math.inf
    return sign * float(r)


def random_mc(n: int, dtype: torch.dtype, nc: int, gen: torch.Generator, lo: int = -8,
              hi: int = 8) -> tuple[torch.Tensor, ...]:
    """Random normalised expansions: x0 with exponent in [lo, hi], each next component
    below half an ulp of the previous one (built from raw bits, exactly)."""
    p = PREC[dtype]
    e = torch.randint(lo, hi + 1, (n,), generator=gen).double()
    m = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5
    sgn = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    c0 = (sgn * m * torch.exp2(e)).to(dtype)
    comps = [c0]
    prev = c0
    for _ in range(nc - 1):
        ulp = torch.exp2(torch.floor(torch.log2(prev.double().abs())) - p + 1)
        frac = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5  # in (-1/2, 1/2)
        nxt = (frac * ulp).to(dtype)
        comps.append(nxt)
        prev = nxt
    return tuple(comps)
