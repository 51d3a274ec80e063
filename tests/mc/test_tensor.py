"""MCTensor behaviour: conversion, correct rounding, structure, errors, autograd."""

from __future__ import annotations

import pytest
import torch
from oracle import DTYPES, exact, random_mc, round_fraction

from anynum import mc
from anynum.errors import AnynumError
from anynum.mc import arith


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("nc", [2, 3])
def test_to_tensor_correctly_rounded(src, nc):
    g = torch.Generator().manual_seed(3)
    comps = random_mc(600, src, nc, g, -3, 3)
    # make ties likely: lower component exactly half an ulp of the leading one
    x = mc.MCTensor._wrap(comps)
    vals = exact(comps)
    for dst in DTYPES:
        got = x.to_tensor(dst).double().tolist()
        want = [round_fraction(v, dst) for v in vals]
        assert got == want, (src, dst)


def test_to_tensor_ties_and_specials():
    one = torch.tensor([1.0, 1.0], dtype=torch.float64)
    half_ulp = torch.tensor([2.0**-53, -(2.0**-54)], dtype=torch.float64)  # exact ties
    tail = torch.tensor([2.0**-120, 2.0**-120], dtype=torch.float64)
    x = mc.MCTensor._wrap((one, half_ulp, tail))
    # the tail breaks each tie: up for the first, back to 1.0 for the second
    assert x.to_tensor(torch.float64).tolist() == [1.0 + 2.0**-52, 1.0]
    x = mc.MCTensor._wrap((one, half_ulp, -tail))
    assert x.to_tensor(torch.float64).tolist() == [1.0, 1.0 - 2.0**-53]
    s = mc.MCTensor(torch.tensor([float("inf"), float("nan"), -float("inf")]), nc=2)
    r = s.to_tensor(torch.float64)
    assert r[0] == float("inf") and r[1].isnan() and r[2] == -float("inf")


def test_construction_and_exactness():
    t = torch.tensor([100.0 / 3.0], dtype=torch.float64)
    x = mc.MCTensor(t, nc=3, dtype=torch.float16)
    assert x.nc == 3 and x.dtype == torch.float16
    # as close as float16 components can get: within half a float16 subnormal ulp
    assert abs(float(exact(x.components())[0]) - 100 / 3) <= 2.0**-25
    y = mc.MCTensor(t, nc=2, dtype=torch.float32)
    assert abs(float(exact(y.components())[0]) - 100 / 3) <= 100 / 3 * 2.0**-48
    y = mc.MCTensor((torch.tensor([1.0]), torch.tensor([1.0])))  # renormalised
    assert y.components()[0].item() == 2.0 and y.components()[1].item() == 0.0
    assert mc.MCTensor([0.5, 0.25], dtype=torch.float64).to_tensor().tolist() == [0.5, 0.25]
    assert "MCTensor(" in repr(x) and "nc=3" in repr(x)


def test_integer_and_mixed_errors():
    with pytest.raises(AnynumError):
        mc.MCTensor(torch.tensor([1, 2]))
    with pytest.raises(AnynumError):
        mc.MCTensor(torch.tensor([1.0]), dtype=torch.int32)
    with pytest.raises(AnynumError):
        mc.MCTensor(torch.tensor([1.0]), nc=0)
    a = mc.MCTensor(torch.ones(2), nc=2)
    b = mc.MCTensor(torch.ones(2, dtype=torch.float64), nc=2)
    with pytest.raises(AnynumError):
        a + b
    with pytest.raises(AnynumError):
        torch.fft.fft(a)  # unsupported torch function names the fix
    with pytest.raises(AnynumError):
        a + "x"


def test_nc_promotion_documented():
    a = mc.MCTensor(torch.ones(2), nc=2)
    c = mc.MCTensor(torch.ones(2), nc=3) + 2.0**-60
    r = a + c
    assert r.nc == 3
    assert exact(r.components())[0] == 2 + __import__("fractions").Fraction(2) ** -60


def test_structural_ops_and_torch_functions():
    x = mc.MCTensor(torch.arange(12.0).reshape(3, 4), nc=2) + 2.0**-40
    assert x.shape == (3, 4) and x.T.shape == (4, 3) and x.mT.shape == (4, 3)
    assert x.reshape(4, 3).shape == (4, 3) and x.view(12).shape == (12,)
    assert x.permute(1, 0).shape == (4, 3) and x.transpose(0, 1).shape == (4, 3)
    assert x[1:, ::2].shape == (2, 2) and x[0, 0].shape == ()
    assert torch.cat([x, x], 0).shape == (6, 4) and torch.stack([x, x]).shape == (2, 3, 4)
    assert torch.reshape(x, (2, 6)).shape == (2, 6) and x.unsqueeze(0).shape == (1, 3, 4)
    assert torch.add(x, 1).nc == 2 and torch.matmul(x, torch.ones(4)).shape == (3,)
    assert (x + torch.ones(4)).shape == (3, 4)  # broadcasting
    assert x.detach().clone().to("cpu").nc == 2
    y = x.clone()
    y[0] = mc.MCTensor(torch.zeros(4))
    assert y[0].to_tensor().tolist() == [0.0] * 4 and x[0, 1].item() == 1.0 + 2.0**-40
    assert bool((x > 1.0)[0, 1]) and not bool((x < 1.0)[0, 1]) and bool((x == x).all())
    assert mc.maximum(x, 5.0).shape == (3, 4)
    z = x.to(torch.float64)
    assert z.dtype == torch.float64 and z.nc == 2


def test_pooled_kernels_bit_identical():
    """Large tensors take the in-place pooled path; results equal the small-tensor path."""
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.float64):
        xc = random_mc(1 << 16, dtype, 2, g, -10, 10)
        yc = random_mc(1 << 16, dtype, 2, g, -10, 10)
        big = [arith.add(xc, yc, 2), arith.add(xc, yc[:1], 2), arith.mul(xc, yc, 2), arith.mul(xc, yc[:1], 2)]
        parts = [([], []) for _ in big]
        for s in range(0, 1 << 16, 4096):
            xs = tuple(c[s : s + 4096] for c in xc)
            ys = tuple(c[s : s + 4096] for c in yc)
            smalls = [arith.add(xs, ys, 2), arith.add(xs, ys[:1], 2),
                      arith.mul(xs, ys, 2), arith.mul(xs, ys[:1], 2)]
            for p, sm in zip(parts, smalls):
                p[0].append(sm[0])
                p[1].append(sm[1])
        for b, p in zip(big, parts):
            assert torch.equal(b[0], torch.cat(p[0])) and torch.equal(b[1], torch.cat(p[1]))


def test_autograd_matches_native():
    torch.manual_seed(0)
    w = torch.randn(3, 4, dtype=torch.float64)
    xin = torch.randn(5, 4, dtype=torch.float64)
    W = mc.MCTensor(w, nc=2, requires_grad=True)
    out = (mc.sigmoid(xin @ W.T) * 2.0 + mc.exp(W).sum()).sum()
    out.backward()
    w2 = w.clone().requires_grad_()
    ref = (torch.sigmoid(xin @ w2.T) * 2.0 + torch.exp(w2).sum()).sum()
    ref.backward()
    assert torch.allclose(W.grad, w2.grad, rtol=1e-12, atol=1e-12)
    for c in W.components():
        assert torch.equal(c.grad, W.grad)  # every component gets d/dvalue
