"""Elementary functions against mpmath (400-bit), in units of u^nc."""

from __future__ import annotations

import mpmath
import pytest
import torch
from oracle import DTYPES, PREC, exact, random_mc

from anynum import mc

mpmath.mp.prec = 400
# measured maxima (docs/mc.md) are about half of these
BOUNDS2 = {"exp": 4, "expm1": 10, "log": 4, "sqrt": 3, "sigmoid": 8, "tanh": 12, "recip": 15,
           "softmax": 24, "log_softmax": 5}


def _mp(comps):
    return [mpmath.mpf(f.numerator) / f.denominator for f in exact(comps)]


def _err(got, want, unit, absolute_near_one=False, slack=0):
    worst = 0.0
    for a, b in zip(got, want):
        scale = max(abs(b), 1) if absolute_near_one else abs(b)
        d = abs(a - b) - slack
        if d > 0:
            worst = max(worst, float(d / (unit * scale)))
    return worst


# float16 has no exponent range for 3 components around 1 (documented), so nc=3 is
# checked for the other dtypes
@pytest.mark.parametrize(("dtype", "nc"), [(d, n) for d in DTYPES for n in (2, 3)
                                           if not (d == torch.float16 and n == 3)])
def test_functions_accuracy(dtype, nc):
    g = torch.Generator().manual_seed(5 + nc)
    lo, hi = (-1, 1) if dtype == torch.float16 else (-4, 3)
    xc = random_mc(200, dtype, nc, g, lo, hi)
    x = mc.MCTensor._wrap(xc)
    ex = _mp(xc)
    pos = mc.abs(x)
    ep = [abs(v) for v in ex]
    unit = mpmath.mpf(2) ** (-PREC[dtype] * nc)
    # float16: results below 2**-3 have subnormal lower components (absolute slack)
    slack = mpmath.mpf(2) ** -23 if dtype == torch.float16 else 0
    cases = [("exp", mc.exp, mpmath.exp, x, ex, False), ("expm1", mc.expm1, mpmath.expm1, x, ex, False),
             ("log", mc.log, mpmath.log, pos, ep, True), ("sqrt", mc.sqrt, mpmath.sqrt, pos, ep, False),
             ("sigmoid", mc.sigmoid, lambda v: 1 / (1 + mpmath.exp(-v)), x, ex, False),
             ("tanh", mc.tanh, mpmath.tanh, x, ex, False),
             ("recip", mc.reciprocal, lambda v: 1 / v, x, ex, False)]
    errs = {}
    for name, f, ref, arg, vals, absolute in cases:
        errs[name] = _err(_mp(f(arg).components()), [ref(v) for v in vals], unit, absolute, slack)
    xs = x.reshape(20, 10)
    want = []
    for i in range(20):
        row = ex[i * 10 : (i + 1) * 10]
        m = max(row)
        es = [mpmath.exp(v - m) for v in row]
        s = sum(es)
        want += [e / s for e in es]
    errs["softmax"] = _err(_mp(mc.softmax(xs, 1).components()), want, unit, False, slack)
    errs["log_softmax"] = _err(_mp(mc.log_softmax(xs, 1).components()), [mpmath.log(w) for w in want],
                               unit, True, slack)
    for k, v in errs.items():
        assert v <= BOUNDS2[k] * (1 if nc == 2 else 0.5), (k, dtype, nc, errs)
    assert max(errs.values()) > 0.05  # not vacuous


def test_pow_and_square():
    x = mc.MCTensor(torch.tensor([1.5, 3.0], dtype=torch.float64), nc=2)
    c = (x ** 5).components()
    assert exact(c) == [exact((torch.tensor([1.5], dtype=torch.float64),))[0] ** 5, 243]
    r = mc.pow(x, 0.5)
    got = _mp(r.components())
    for a, b in zip(got, [mpmath.sqrt(1.5), mpmath.sqrt(3)]):
        assert abs(a - b) < 2 ** -100
    assert exact(mc.square(x).components()) == [exact((torch.tensor([2.25]),))[0], 9]


def test_special_values():
    v = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0])
    x = mc.MCTensor(v, nc=2)
    assert torch.equal(mc.exp(x).to_tensor().isnan(), torch.exp(v).isnan())
    for f, ref in ((mc.exp, torch.exp), (mc.log, torch.log), (mc.sqrt, torch.sqrt),
                   (mc.sigmoid, torch.sigmoid), (mc.tanh, torch.tanh), (mc.relu, torch.relu),
                   (mc.reciprocal, torch.reciprocal), (mc.abs, torch.abs), (mc.expm1, torch.expm1)):
        got = f(x).to_tensor()
        want = ref(v)
        assert torch.equal(got.isnan(), want.isnan()), f
        m = ~want.isnan()
        assert torch.equal(got[m], want[m]), f
    y = mc.MCTensor(torch.tensor([1.0, 1.0]), nc=2) / torch.tensor([0.0, -0.0])
    assert y.to_tensor().tolist() == [float("inf"), -float("inf")]
    big = mc.MCTensor(torch.tensor([3e38]), nc=2)
    assert (big * 10).to_tensor().isinf().all()
