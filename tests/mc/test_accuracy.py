"""Arithmetic error bounds (units of u^nc), against exact rational arithmetic.

Bounds for nc = 2 are the published ones (Joldes, Muller, Popescu 2017): add/sub <= 3u^2,
mul <= 4u^2 with FMA and <= 7u^2 without (Dekker), div <= 15u^2; MC-with-tensor variants
2u^2, 2u^2 (1.5u^2 + 4u^3 without FMA) and 3u^2.  Values whose lower components fall in
the subnormal range only carry absolute precision: an absolute slack of a few smallest
subnormals is allowed there (documented limit).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import DTYPES, EMAX, exact, random_mc, rel_err_u, tiny, u

from anynum import mc
from anynum.mc import eft

# exponent ranges that keep every component normal (float16 has only 40 bits of range)
RANGE = {torch.float16: (0, 2), torch.bfloat16: (-30, 30), torch.float32: (-30, 30),
         torch.float64: (-60, 60)}
N = 1500
BOUND2 = {"add": 3, "sub": 3, "mul_fma": 4, "mul_dekker": 7, "div": 15,
          "add_fp": 2, "mul_fp": 2, "div_fp": 3}


def _ops(xc, yc):
    x, y = mc.MCTensor._wrap(xc), mc.MCTensor._wrap(yc)
    ex, ey, ey0 = exact(xc), exact(yc), exact(yc[:1])
    return [
        ("add", x + y, [a + b for a, b in zip(ex, ey)]),
        ("sub", x - y, [a - b for a, b in zip(ex, ey)]),
        ("mul", x * y, [a * b for a, b in zip(ex, ey)]),
        ("div", x / y, [a / b for a, b in zip(ex, ey)]),
        ("add_fp", x + yc[0], [a + b for a, b in zip(ex, ey0)]),
        ("mul_fp", x * yc[0], [a * b for a, b in zip(ex, ey0)]),
        ("div_fp", x / yc[0], [a / b for a, b in zip(ex, ey0)]),
    ]


def _check(dtype, nc, xc, yc, fma, slack=0):
    errs = {}
    with eft.fma_policy(fma):
        use_fma = mc.fma_available(dtype)
        for name, r, want in _ops(xc, yc):
            errs[name] = rel_err_u(exact(r.components()), want, u(dtype) ** nc, slack * tiny(dtype))
            if nc == 2:
                key = name if name != "mul" else ("mul_fma" if use_fma else "mul_dekker")
                bound = BOUND2[key] + (0.01 if name == "mul_fp" else 0)
                assert errs[name] <= bound, (name, dtype, errs[name])
    return errs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fma", [None, False])
def test_nc2_random_bounds(dtype, fma):
    g = torch.Generator().manual_seed(hash((str(dtype), fma)) % 2**31)
    lo, hi = RANGE[dtype]
    errs = _check(dtype, 2, random_mc(N, dtype, 2, g, lo, hi), random_mc(N, dtype, 2, g, lo, hi), fma)
    assert errs["mul"] > 0.1  # the measurement is not vacuous


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc2_cancellation(dtype):
    """y = -x except in the lowest component: the sum is tiny and must be exact-ish."""
    g = torch.Generator().manual_seed(7)
    lo, hi = RANGE[dtype]
    xc = random_mc(N, dtype, 2, g, lo, hi)
    pert = random_mc(N, dtype, 2, g, lo, hi)[1]
    y = mc.MCTensor((-xc[0], -xc[1] + pert * 2.0**-3)) if dtype != torch.float16 else None
    if y is None:
        y = mc.MCTensor((-xc[0], (-xc[1].float() + pert.float() * 0.125).half()))
    r = mc.MCTensor._wrap(xc) + y
    want = [a + b for a, b in zip(exact(xc), exact(y.components()))]
    assert rel_err_u(exact(r.components()), want, u(dtype) ** 2, 0) <= 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc2_wide_exponent_gaps(dtype):
    g = torch.Generator().manual_seed(8)
    lo, hi = RANGE[dtype]
    mid = (lo + hi) // 2
    xc = random_mc(N, dtype, 2, g, hi - 1, hi)
    yc = random_mc(N, dtype, 2, g, lo, lo + 1)  # up to (hi - lo) binades smaller
    _check(dtype, 2, xc, yc, None)
    _check(dtype, 2, yc, xc, None)
    _check(dtype, 2, random_mc(N, dtype, 2, g, mid, mid), yc, None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc2_near_overflow(dtype):
    g = torch.Generator().manual_seed(9)
    e = EMAX[dtype]
    xc = random_mc(N, dtype, 2, g, e - 3, e - 2)
    yc = random_mc(N, dtype, 2, g, -1, 1)
    x = mc.MCTensor._wrap(xc)
    for name, r, want in _ops(xc, yc):
        if name in ("add", "sub", "add_fp"):
            continue  # y is negligible here; covered by the gap test
        got = exact(r.components())
        ok = [(gg, w) for gg, w in zip(got, want) if abs(w) < 2 ** (e - 1)]
        assert ok
        assert rel_err_u([a for a, _ in ok], [b for _, b in ok], u(dtype) ** 2, 0) <= 15
    big = x + mc.MCTensor._wrap(xc)  # 2x: still finite
    assert torch.isfinite(big.components()[0]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_nc2_near_underflow_absolute(dtype):
    """Lower components subnormal: error within the bound plus a few subnormal ulps."""
    from oracle import EMIN, PREC

    g = torch.Generator().manual_seed(10)
    e = EMIN[dtype] + PREC[dtype] // 2
    xc = random_mc(400, dtype, 2, g, e, e + 2)
    yc = random_mc(400, dtype, 2, g, e, e + 2)
    x, y = mc.MCTensor._wrap(xc), mc.MCTensor._wrap(yc)
    r = x + y
    want = [a + b for a, b in zip(exact(xc), exact(yc))]
    assert rel_err_u(exact(r.components()), want, u(dtype) ** 2, 2 * tiny(dtype)) <= 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_more_components_improve(dtype):
    g = torch.Generator().manual_seed(11)
    lo, hi = RANGE[dtype]
    worst = {}
    for nc in (2, 3, 4):
        errs = _check(dtype, nc, random_mc(800, dtype, nc, g, lo, hi),
                      random_mc(800, dtype, nc, g, lo, hi), None)
        worst[nc] = max(errs.values())
        # measured <= ~6 u^nc (bfloat16 nc=4 div), usually < 1
        if nc > 2:
            assert worst[nc] <= 8.0, (nc, errs)
    # in absolute terms: u^4 << u^3 << u^2
    assert worst[3] * u(dtype) ** 3 < worst[2] * u(dtype) ** 2 * 2.0 ** -4
    assert worst[4] * u(dtype) ** 4 < worst[3] * u(dtype) ** 3 * 2.0 ** -4


@settings(max_examples=60, deadline=None)
@given(st.floats(-1e150, 1e150, allow_nan=False, allow_subnormal=False),
       st.floats(-1e150, 1e150, allow_nan=False, allow_subnormal=False),
       st.floats(-1e-3, 1e-3), st.floats(-1e-3, 1e-3))
def test_hypothesis_float64_pairs(a0, b0, da, db):
    """Arbitrary double-double operands (lower component a fraction of an ulp)."""
    from fractions import Fraction

    def dd(v, d):
        hi = torch.tensor([v], dtype=torch.float64)
        lo = hi * (d * 2.0**-53)
        return mc.MCTensor((hi, lo))

    x, y = dd(a0, da), dd(b0, db)
    ex, ey = exact(x.components())[0], exact(y.components())[0]
    for r, w, bound in ((x + y, ex + ey, 3), (x * y, ex * ey, 7), (x - y, ex - ey, 3)):
        got = exact(r.components())[0]
        if w == 0:
            assert got == 0
        elif abs(w) > Fraction(2) ** -900:
            assert abs(got - w) <= bound * u(torch.float64) ** 2 * abs(w)
    if ey != 0 and abs(ey) > Fraction(2) ** -900 and abs(ex) > Fraction(2) ** -900:
        w = ex / ey
        if Fraction(2) ** -900 < abs(w) < Fraction(2) ** 900:
            q = exact((x / y).components())[0]
            assert abs(q - w) <= 15 * u(torch.float64) ** 2 * abs(w)
