"""Reductions and Ozaki matrix products against exact rational arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from oracle import DTYPES, PREC, exact

from anynum import mc
from anynum.errors import AnynumError


def _mc(shape, dtype, nc, seed, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, dtype=torch.float64, generator=g)
    v = v * torch.exp2(torch.randint(-int(spread), int(spread) + 1, shape, generator=g).double())
    return mc.MCTensor(v, nc, dtype=dtype)


def _rows(x):
    """Exact values of a 2-D MC/tensor operand as nested Fraction lists."""
    comps = x.components() if isinstance(x, mc.MCTensor) else (x,)
    flat = exact(comps)
    r, c = x.shape
    return [flat[i * c : (i + 1) * c] for i in range(r)]


def _check_mm(a, b, got, dtype, nc, bound):
    A, B = _rows(a), _rows(b)
    k = len(B)
    gv = exact(got.components())
    n = len(B[0])
    unit = Fraction(1, 2 ** (PREC[dtype] * nc))
    worst = 0.0
    for i in range(len(A)):
        for j in range(n):
            w = sum(A[i][t] * B[t][j] for t in range(k))
            aw = sum(abs(A[i][t] * B[t][j]) for t in range(k))
            if aw:
                worst = max(worst, float(abs(gv[i * n + j] - w) / (unit * aw)))
    assert worst <= bound, worst
    return worst


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("engine", ["int8", "float", "native", "wide"])
def test_matmul_mc_times_tensor_and_mc(dtype, engine):
    a = _mc((9, 70), dtype, 2, 1)
    b = _mc((70, 6), dtype, 1, 2).components()[0]
    worst = _check_mm(a, b, mc.matmul(a, b, engine=engine), dtype, 2, 2.0)
    bm = _mc((70, 6), dtype, 2, 3)
    _check_mm(a, bm, mc.matmul(a, bm, engine=engine), dtype, 2, 2.0)
    _check_mm(b.T.contiguous(), a.T, mc.matmul(b.T, a.T, engine=engine), dtype, 2, 2.0)
    assert worst >= 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_blocked_inner_dim_and_nc3(dtype):
    a = _mc((3, 2500 if dtype == torch.float32 else 300), dtype, 3, 4)
    b = _mc((a.shape[1], 2), dtype, 3, 5)
    _check_mm(a, b, a @ b, dtype, 3, 2.0)


def test_mv_dot_bmm_addmm_shapes_and_values():
    a = _mc((5, 40), torch.float32, 2, 6)
    v = torch.randn(40)
    r = mc.mv(a, v)
    assert r.shape == (5,)
    full = (a @ v.unsqueeze(1)).to_tensor(torch.float64).squeeze(1)
    assert torch.equal(r.to_tensor(torch.float64), full)
    d = mc.dot(a[0], v)
    assert d.shape == () and d.item() == r[0].item()
    x = mc.MCTensor(torch.tensor([1.0, 2.0**-30, -1.0]))
    assert mc.dot(x, torch.ones(3)).item() == 2.0**-30  # not a plain float32 sum
    bt = _mc((4, 5, 40), torch.float32, 2, 7)
    bb = torch.randn(4, 40, 3)
    rb = mc.bmm(bt, bb)
    for i in range(4):
        assert torch.equal(rb[i].to_tensor(torch.float64), (bt[i] @ bb[i]).to_tensor(torch.float64))
    c = torch.randn(5, 3)
    am = mc.addmm(c, a, torch.randn(40, 3))
    assert am.shape == (5, 3)
    with pytest.raises(AnynumError):
        mc.mm(a, v)


def test_sum_mean_tree_exact_cases():
    v = torch.tensor([1.0, 2.0**-40, -1.0, 2.0**-60, 3.0], dtype=torch.float32)
    x = mc.MCTensor(v, nc=2)
    assert exact(mc.sum(x).components())[0] == 3 + Fraction(2) ** -40 + Fraction(2) ** -60 or \
        abs(exact(mc.sum(x).components())[0] - (3 + Fraction(2) ** -40)) < Fraction(2) ** -50
    y = _mc((7, 33), torch.float64, 2, 8)
    s = mc.sum(y, 1)
    rows = _rows(y)
    for got, row in zip(exact(s.components()), rows):
        assert abs(got - sum(row)) <= 20 * Fraction(1, 2**106) * sum(abs(t) for t in row)
    m = mc.mean(y, dim=0, keepdim=True)
    assert m.shape == (1, 33)
    assert mc.sum(y).shape == ()


def test_matmul_nonfinite_follows_native():
    a = mc.MCTensor(torch.tensor([[1.0, float("inf")], [1.0, 2.0]]))
    b = torch.tensor([[1.0], [1.0]])
    r = (a @ b).to_tensor()
    assert r[0, 0].isinf() and r[1, 0] == 3.0


def test_int8_engine_chunked_inner_dim(monkeypatch):
    """Inner dimensions above the int32-exact chunk length are split and summed in int64."""
    from anynum.mc import ozaki_int8

    monkeypatch.setattr(ozaki_int8, "INT_K", 16)
    a = _mc((4, 70), torch.float32, 2, 11)
    bm = _mc((70, 3), torch.float32, 2, 12)
    _check_mm(a, bm, mc.matmul(a, bm, engine="int8"), torch.float32, 2, 2.0)


def test_int8_engine_batched_and_default():
    assert mc.engine.setting() == "auto"  # unless forced, the machine decides (tests/mc/test_engines.py)
    assert mc.engine.resolve(None, torch.device("cpu")) in ("int8", "float")
    a = _mc((2, 3, 5, 40), torch.float64, 2, 13)
    b = _mc((3, 40, 4), torch.float64, 2, 14)
    r = mc.matmul(a, b, engine="int8")
    w = mc.matmul(a, b, engine="wide")
    assert r.shape == (2, 3, 5, 4)
    d = (r - w).to_tensor(torch.float64).abs().max().item()
    assert d <= 1e-28
    bt = torch.randn(3, 40, 4, dtype=torch.float64)
    assert torch.equal(mc.matmul(a[0, 0], bt).to_tensor(), torch.stack([mc.matmul(a[0, 0], bt[i]).to_tensor()
                                                                         for i in range(3)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mag", [20, 36, 50])
def test_int8_engine_diagonal_combination(dtype, mag):
    """The exact integer diagonal sums are combined exactly (int64 Horner groups) and rounded
    once per MC addition: the result is within a few u^2 of the exact rational sum, for
    diagonal sums up to 2**50 (few diagonals per group), with mixed signs and exponents."""
    from anynum.mc import ozaki_int8

    g = torch.Generator().manual_seed(mag)
    levels, m, n = 9, 5, 4
    acc = torch.randint(-(2**mag), 2**mag, (levels, m, n), generator=g, dtype=torch.int64)
    acc[:, 0, 0] = 0
    acc[3, 1, 1] = -(2**mag)  # the extreme value
    ea = torch.randint(-20, 20, (m, 1), generator=g, dtype=torch.int32)
    eb = torch.randint(-20, 20, (1, n), generator=g, dtype=torch.int32)
    got = exact(ozaki_int8.combine_diagonals(acc, ea, eb, 2, dtype))
    unit = Fraction(1, 2 ** (2 * PREC[dtype]))
    for i in range(m):
        for j in range(n):
            terms = [int(acc[d, i, j]) * Fraction(2) ** (int(ea[i, 0]) + int(eb[0, j]) - 14 - 7 * d)
                     for d in range(levels)]
            want = sum(terms, Fraction(0))
            scale = sum((abs(t) for t in terms), Fraction(0))
            assert abs(got[i * n + j] - want) <= 2 * unit * scale, (i, j)


@pytest.mark.parametrize(
    "xs, ys, what",
    [
        ((3, 4), (5, 2), "inner dimensions"),
        ((3, 4), (5,), "inner dimensions"),
        ((2, 3, 4), (3, 4, 2), "batch dimensions"),
    ],
)
def test_matmul_refuses_shapes_torch_would_refuse(xs: tuple, ys: tuple, what: str) -> None:
    """(3x4) @ (5x2) once came back as a 3x2 result: shapes are checked before any slicing."""
    a = mc.MCTensor(torch.randn(xs, dtype=torch.float64), 2)
    b = torch.randn(ys, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        torch.matmul(torch.randn(xs, dtype=torch.float64), b)  # torch agrees these are wrong
    with pytest.raises(AnynumError, match=what):
        mc.matmul(a, b)
    with pytest.raises(AnynumError, match=what):
        mc.matmul(a, mc.MCTensor(b, 2))


@pytest.mark.parametrize("mc_side", ["input", "weight"])
def test_linear_names_the_weight_as_given_when_its_shape_does_not_fit(mc_side: str) -> None:
    """torch.nn.functional.linear takes weight (out, in); a wrong one is reported as given, not
    transposed, and a 1-D weight (in,) works as in torch."""
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    xm, wm = (mc.MCTensor(x), w) if mc_side == "input" else (x, mc.MCTensor(w))
    with pytest.raises(AnynumError, match=r"weight \(5, 3\)") as info:
        torch.nn.functional.linear(xm, wm)
    assert "(3, 5)" not in str(info.value)
    v = torch.randn(4, dtype=torch.float64)
    vm = v if mc_side == "input" else mc.MCTensor(v)
    got = torch.nn.functional.linear(xm, vm)
    assert isinstance(got, mc.MCTensor) and got.shape == (3,)
    assert torch.allclose(got.to_tensor(), x @ v, rtol=1e-12, atol=1e-12)
