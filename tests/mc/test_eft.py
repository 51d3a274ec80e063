"""Error-free transforms checked exactly against rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from oracle import DTYPES, EMAX, EMIN, PREC, round_fraction

from anynum import mc
from anynum.errors import AnynumError
from anynum.mc import eft


def _rand(n, dtype, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(lo, hi + 1, (n,), generator=g).double()
    m = (torch.rand(n, generator=g, dtype=torch.float64) + 0.5) * torch.where(
        torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (m * torch.exp2(e)).to(dtype)


def _F(t):
    return [Fraction(v) for v in t.double().tolist()]


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_sum_exact(dtype):
    span = min(EMAX[dtype] - 2, 60)
    a, b = _rand(2000, dtype, -span, span, 1), _rand(2000, dtype, -span, span, 2)
    s, e = mc.two_sum(a, b)
    assert torch.equal(s, a + b)
    for x, y, ss, ee in zip(_F(a), _F(b), _F(s), _F(e)):
        assert ss + ee == x + y
    big = torch.tensor([EMAX[dtype]], dtype=torch.float64).exp2().to(dtype)
    s, e = mc.two_sum(big, big)  # overflow: s = inf, e = 0 (documented)
    assert torch.isinf(s).all() and (e == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_fma", [None, False])
def test_two_prod_exact_whole_range(dtype, use_fma):
    p_, emin, emax = PREC[dtype], EMIN[dtype], EMAX[dtype]
    half = (emax - 2) // 2
    # wide exponents, including operands whose split would overflow without scaling
    a = torch.cat([_rand(1500, dtype, -half, half, 3), _rand(200, dtype, emax - 4, emax - 1, 4)])
    b = torch.cat([_rand(1500, dtype, -half, half, 5), _rand(200, dtype, -3, 0, 6)])
    # small magnitudes (float16 below 1 was inexact in the original MCTensor)
    a = torch.cat([a, _rand(300, dtype, emin // 2, -1, 7)])
    b = torch.cat([b, _rand(300, dtype, emin // 2, -1, 8)])
    with eft.fma_policy(use_fma):
        p, e = mc.two_prod(a, b)
    assert torch.equal(p, a * b)
    for x, y, pp, ee in zip(_F(a), _F(b), _F(p), _F(e)):
        exact = x * y
        if abs(exact) >= Fraction(2) ** (emin + p_) and abs(pp) < Fraction(2) ** emax:
            assert pp + ee == exact, (x, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_splitter_and_exactness(dtype):
    a = torch.cat([_rand(500, dtype, -10, 10, 9), _rand(50, dtype, EMAX[dtype] - 2, EMAX[dtype], 10)])
    hi, lo = mc.split(a)
    assert torch.equal(hi + lo, a)
    keep = PREC[dtype] - (PREC[dtype] + 1) // 2
    for h in _F(hi):
        if h:
            n = h.numerator
            while n % 2 == 0:
                n //= 2
            assert abs(n).bit_length() <= keep + 1
    assert eft.info(dtype).splitter == {torch.float64: 2**27 + 1, torch.float32: 2**12 + 1,
                                        torch.float16: 2**6 + 1, torch.bfloat16: 2**4 + 1}[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lowp_fma_correctly_rounded(dtype):
    a, b, c = (_rand(3000, dtype, -4, 4, s) for s in (11, 12, 13))
    r = eft.fma(a, b, c)
    for x, y, z, rr in zip(_F(a), _F(b), _F(c), r.double().tolist()):
        assert rr == round_fraction(x * y + z, dtype)


def test_fma_probe_is_lazy_and_boolean():
    assert isinstance(mc.fma_available(torch.float32), bool)
    with eft.fma_policy(False):
        assert mc.fma_available(torch.float64) is False
        with pytest.raises(AnynumError):
            eft.fma(torch.ones(1), torch.ones(1), torch.ones(1))


def test_bad_inputs():
    with pytest.raises(AnynumError):
        mc.two_sum(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    with pytest.raises(AnynumError):
        mc.two_prod(torch.ones(2), torch.ones(2, dtype=torch.float64))
