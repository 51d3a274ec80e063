"""Elementary functions on component tuples: exp, expm1, log, sqrt, pow, sigmoid, tanh,
softmax, log_softmax.

Every function is accurate to about the multi-component precision, not just the first
component:

* ``exp``/``expm1``: Cody-Waite reduction ``x = k ln2 + r`` with ln 2 held to nc+1
  components, ``r`` halved ``m`` times, Taylor series of expm1 with exact rational
  coefficients (Horner in MC arithmetic), then ``m`` doublings ``t <- t (t + 2)`` (which do
  not amplify the relative error of ``t`` the way squaring ``1 + t`` would), and an exact
  scaling by ``2**k``.
* ``log``: ``x = 2**E m`` with ``m`` in [0.75, 1.5), then Newton steps
  ``y <- y + (m exp(-y) - 1)`` (each doubles the number of correct bits) and ``E ln2``
  added in MC; the error is absolute (``~u**nc``) where ``|log x| < 1``.
* ``sqrt``: exact even power-of-two scaling, then ``nc - 1`` steps
  ``s <- s + (x - s*s) / (2 s_0)``, each gaining about ``p`` bits.

NaN/inf and out-of-domain inputs are patched by the callers in `anynum.mc.ops` with the
native result of the leading components, so these functions only see the finite case.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache

import torch

from anynum.mc import arith
from anynum.mc._core import Comps, const_comps, const_floats, exponent, fraction_to_floats, info, ldexp
from anynum.mc.eft import raw_two_prod
from anynum.mc.expansion import renormalize


@cache
def _exp_plan(dtype: torch.dtype, nc: int) -> tuple[int, tuple[tuple[float, ...], ...]]:
    """(m halvings, Taylor coefficients 1/j! as nc-term expansions, j = 1..N)."""
    p = info(dtype).precision
    bits = nc * p + 4
    m = {torch.float16: 0, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}[dtype]
    m += 2 * (nc - 2) if nc > 2 and dtype != torch.float16 else 0
    rmax = 0.35 * 2.0**-m
    n = 1
    term = rmax
    while True:
        n += 1
        term *= rmax / n
        if term < 2.0 ** (-bits) * rmax:
            break
    coeffs = []
    fact = 1
    for j in range(1, n + 1):
        fact *= j
        coeffs.append(tuple(fraction_to_floats(Fraction(1, fact), dtype, nc)))
    return m, tuple(coeffs)


def exp_parts(x: Comps, nc: int) -> tuple[torch.Tensor, Comps]:
    """Return (k, t) with exp(x) = 2**k (1 + t); k is integer-valued in x's dtype."""
    x0 = x[0]
    dtype = x0.dtype
    inv_ln2 = 1.0 / math.log(2.0)
    k = torch.round(x0.float() * inv_ln2) if dtype != torch.float64 else torch.round(x0 * inv_ln2)
    k = torch.where(torch.isfinite(k), k, torch.zeros_like(k)).to(dtype)
    # r = x - k ln2, with ln2 to nc+1 components and exact partial products
    ln2 = const_comps(const_floats("ln2", dtype, nc + 1), x0)
    terms: list[torch.Tensor] = list(x)
    for c in ln2:
        p, e = raw_two_prod(k, -c)
        terms += [p, e]
    r = renormalize(terms, nc)
    m, coeffs = _exp_plan(dtype, nc)
    if m:
        r = arith.scale_pow2(r, 2.0**-m)
    # Horner: t = r (c1 + r (c2 + ... + r cN))
    t: Comps = const_comps(coeffs[-1], x0)
    t = tuple(torch.broadcast_to(c, x0.shape) for c in t)
    for coef in reversed(coeffs[:-1]):
        t = arith.mul(t, r, nc)
        t = arith.add(t, const_comps(coef, x0), nc)
    t = arith.mul(t, r, nc)
    two = const_comps((2.0,), x0)
    for _ in range(m):
        t = arith.mul(t, arith.add(t, two, nc), nc)
    return k, t


def exp(x: Comps, nc: int) -> Comps:
    k, t = exp_parts(x, nc)
    one = const_comps((1.0,), x[0])
    y = arith.add(t, one, nc)
    ki = k.to(torch.int32)
    return tuple(ldexp(c, ki) for c in y)


def expm1(x: Comps, nc: int) -> Comps:
    k, t = exp_parts(x, nc)
    one = const_comps((1.0,), x[0])
    y = arith.add(t, one, nc)
    ki = k.to(torch.int32)
    e = tuple(ldexp(c, ki) for c in y)
    big = arith.sub(e, one, nc)
    small = k == 0
    return tuple(torch.where(small, a, b) for a, b in zip(arith.pad(t, nc), big))


def _safe_positive(x: Comps) -> Comps:
    """Replace non-positive or non-finite entries by 1 (the caller patches them)."""
    x0 = x[0]
    ok = (x0 > 0) & torch.isfinite(x0)
    first = torch.where(ok, x0, torch.ones_like(x0))
    return (first, *(torch.where(ok, c, torch.zeros_like(c)) for c in x[1:]))


def log(x: Comps, nc: int) -> Comps:
    x0 = x[0]
    dtype = x0.dtype
    safe = _safe_positive(x)
    e = exponent(safe[0])  # safe0 = f 2^e, f in [0.5, 1)
    mant = ldexp(safe[0], -e)
    e = torch.where(mant < 0.75, e - 1, e)
    xs = tuple(ldexp(c, -e) for c in safe)
    y0 = torch.log(xs[0].float()).to(dtype) if dtype in (torch.float16, torch.bfloat16) else torch.log(xs[0])
    y: Comps = arith.pad((y0,), nc)
    one = const_comps((1.0,), x0)
    steps = 1 if nc <= 2 else (2 if nc <= 4 else 3)
    for _ in range(steps):
        ey = exp(arith.neg(y), nc)
        corr = arith.sub(arith.mul(xs, ey, nc), one, nc)
        y = arith.add(y, corr, nc)
    ln2 = const_comps(const_floats("ln2", dtype, nc + 1), x0)
    ef = e.to(dtype)
    terms: list[torch.Tensor] = list(y)
    for c in ln2:
        p, err = raw_two_prod(ef, c)
        terms += [p, err]
    return renormalize(terms, nc)


def sqrt(x: Comps, nc: int) -> Comps:
    safe = _safe_positive(x)
    e = exponent(safe[0])
    e = e - (e % 2)
    xs = tuple(ldexp(c, -e) for c in safe)
    s0 = torch.sqrt(xs[0])
    s: Comps = arith.pad((s0,), nc)
    den = (2.0 * s0,)
    for _ in range(max(1, nc - 1)):
        r = arith.sub(arith.pad(xs, nc), arith.mul(s, s, nc), nc)
        corr = arith.div(r, den, nc)
        s = arith.add(s, corr, nc)
    half = torch.div(e, 2, rounding_mode="floor")
    return tuple(ldexp(c, half) for c in s)


def reciprocal(x: Comps, nc: int) -> Comps:
    one = const_comps((1.0,), x[0])
    return arith.div(one, x, nc)


def powi(x: Comps, n: int, nc: int) -> Comps:
    """x**n for a Python integer n by binary powering."""
    if n == 0:
        return arith.pad((torch.ones_like(x[0]),), nc)
    neg = n < 0
    n = abs(n)
    result: Comps | None = None
    base = arith.pad(x, nc)
    while n:
        if n & 1:
            result = base if result is None else arith.mul(result, base, nc)
        n >>= 1
        if n:
            base = arith.mul(base, base, nc)
    assert result is not None
    return reciprocal(result, nc) if neg else result


def pow_general(x: Comps, y: Comps, nc: int) -> Comps:
    """x**y = exp(y log x) for x > 0."""
    return exp(arith.mul(arith.pad(y, nc) if len(y) > 1 else y, log(x, nc), nc), nc)


def sigmoid(x: Comps, nc: int) -> Comps:
    one = const_comps((1.0,), x[0])
    e = exp(arith.neg(x), nc)
    return arith.div(one, arith.add(e, one, nc), nc)


def tanh(x: Comps, nc: int) -> Comps:
    x0 = x[0]
    neg = x0 < 0
    ax = tuple(torch.where(neg, -c, c) for c in x)
    t = expm1(arith.scale_pow2(ax, -2.0), nc)  # expm1(-2|x|) in (-1, 0]
    two = const_comps((2.0,), x0)
    r = arith.div(arith.neg(t), arith.add(t, two, nc), nc)
    return tuple(torch.where(neg, -c, c) for c in r)
