"""Accumulation formats, orders and the quire against exact rational dot products (reference.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from emulate_reference import ref_dot, round_exact

import anynum as an
from anynum.emulate import accumulate as acc_mod
from anynum.emulate.accumulate import Accumulation, Accumulator
from anynum.emulate.grid import Grid

pytestmark = pytest.mark.usefixtures("one_thread")

FORMATS = ["posit(8,0)", "posit(8,2)", "bf16", "e4m3fn", "posit(16,1)"]


def _on_grid(shape, fmt, gen, spread=4.0):
    x = torch.randn(*shape, generator=gen, dtype=torch.float64) * torch.exp2(
        (torch.rand(*shape, generator=gen, dtype=torch.float64) - 0.5) * spread
    )
    return an.quantize(x, fmt)


def _check(a, b, acc, order, fma, out_fmt, mode="nearest"):
    got = an.matmul(a, b, fmt=out_fmt, accumulate=acc, order=order, fma=fma, rounding=mode)
    acc_fmt = None if acc == "quire" else an.format(acc)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            ra = [Fraction(float(v)) for v in a[i]]
            rb = [Fraction(float(v)) for v in b[:, j]]
            want = ref_dot(ra, rb, acc_fmt, order, fma, an.format(out_fmt), mode)
            assert Fraction(float(got[i, j])) == want, (i, j, float(got[i, j]), float(want))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("order", ["sequential", "pairwise", 3])
@pytest.mark.parametrize("fma", [False, True])
def test_format_accumulation_matches_fractions(fmt, order, fma):
    gen = torch.Generator().manual_seed(hash((fmt, str(order), fma)) % 2**31)
    a = _on_grid((3, 11), fmt, gen)
    b = _on_grid((11, 4), fmt, gen)
    _check(a, b, fmt, order, fma, fmt)


@pytest.mark.parametrize("mode", ["rz", "ru", "rd", "ro", "rna"])
@pytest.mark.parametrize("fmt", ["bf16", "posit(8,2)"])
def test_directed_modes_round_every_partial_sum(mode, fmt):
    gen = torch.Generator().manual_seed(7)
    a = _on_grid((2, 9), fmt, gen)
    b = _on_grid((9, 3), fmt, gen)
    for order in ("sequential", "pairwise", 2):
        _check(a, b, fmt, order, False, fmt, mode)
    _check(a, b, fmt, "sequential", True, fmt, mode)


@pytest.mark.parametrize("fmt", ["posit(8,0)", "posit(16,2)", "posit(32,2)"])
def test_quire_is_exact_with_cancellation(fmt):
    """Terms spanning the whole range cancel; float64 loses the small ones, the quire does not."""
    p = an.format(fmt)
    big = p.max
    a = torch.tensor([[big, 1.0, -big, 1.0, 3.0, p.smallest_normal]], dtype=torch.float64)
    b = torch.ones(6, 1, dtype=torch.float64)
    a = an.quantize(a, p)
    exact = sum((Fraction(float(v)) for v in a[0]), Fraction(0))
    got = an.matmul(a, b, fmt=p, accumulate="quire")
    # posit32: 5 + minpos rounds to 5 (minpos is far below half an ulp of 5), not to float64's 4
    want = round_exact(exact, p) if p.bits <= 16 else Fraction(5)
    assert Fraction(float(got)) == want
    fl64 = an.matmul(a, b, fmt=p)  # float64 accumulation: big + 1 - big loses the 1
    if p.bits > 8:
        assert float(fl64) != float(got)


def test_quire_random_against_fractions():
    gen = torch.Generator().manual_seed(3)
    for fmt in ("posit(16,2)", "posit(8,0)", "posit(16,1)"):
        a = _on_grid((4, 40), fmt, gen, spread=60.0)
        b = _on_grid((40, 3), fmt, gen, spread=60.0)
        _check(a, b, "quire", "sequential", False, fmt)


def test_order_one_is_sequential_fma():
    gen = torch.Generator().manual_seed(11)
    a = _on_grid((4, 13), "bf16", gen)
    b = _on_grid((13, 5), "bf16", gen)
    one = an.matmul(a, b, fmt="bf16", accumulate="bf16", order=1)
    seq = an.matmul(a, b, fmt="bf16", accumulate="bf16", fma=True)
    assert torch.equal(one, seq)


def test_none_is_float64_rounded_once():
    gen = torch.Generator().manual_seed(5)
    a = _on_grid((5, 7), "e4m3fn", gen)
    b = _on_grid((7, 2), "e4m3fn", gen)
    got = an.matmul(a.float(), b.float(), fmt="e4m3fn")
    assert torch.equal(got, an.quantize(a @ b, an.E4M3FN).float())


def test_accumulator_sum_mean_norm_cumsum_prod():
    out = Grid("posit(16,2)")
    acc = Accumulator(Accumulation.resolve("posit(8,0)"), out)
    x = an.quantize(
        torch.tensor([[1.0, 0.015625, 0.015625, 3.0], [2.0, -2.0, 0.5, 0.25]], dtype=torch.float64),
        "posit(8,0)",
    )
    p8 = an.format("posit(8,0)")
    p16 = an.format("posit(16,2)")

    def seq(vals):
        s = None
        for v in vals:
            s = round_exact(Fraction(v), p8) if s is None else round_exact(s + Fraction(v), p8)
        return s

    rows = x.tolist()
    assert acc.sum(x, (1,), out).tolist() == [float(round_exact(seq(r), p16)) for r in rows]
    assert acc.mean(x, (1,), out).tolist() == [float(round_exact(seq(r) / 4, p16)) for r in rows]
    cs = acc.cumsum(x, 1, out)
    for r, c in zip(rows, cs.tolist()):
        assert c == [float(round_exact(seq(r[: k + 1]), p16)) for k in range(4)]
    pr = acc.prod(x, (1,), out)
    for r, v in zip(rows, pr.tolist()):
        s = round_exact(Fraction(r[0]), p8)
        for t in r[1:]:
            s = round_exact(s * round_exact(Fraction(t), p8), p8)
        assert v == float(round_exact(s, p16))
    q = Accumulator(Accumulation.resolve("quire", result_format=p16), out)
    n2 = q.norm2(x, (1,), out).tolist()
    for r, v in zip(rows, n2):
        ss = sum((Fraction(t) ** 2 for t in r), Fraction(0))
        # the exact square root is irrational in general: bracket it
        lo, hi = (
            Fraction(v) - Fraction(p16.eps) * 4 * abs(Fraction(v)),
            Fraction(v) + Fraction(p16.eps) * 4 * abs(Fraction(v)),
        )
        assert lo**2 <= ss <= hi**2


def test_native_kernel_matches_torch_loop():
    from anynum.emulate import native

    if not native.available():
        pytest.skip("no C compiler or private cache on this machine")
    gen = torch.Generator().manual_seed(2)
    for fmt in ("posit(16,2)", "posit(8,0)", "bf16", "e4m3fn", "fp32", "posit(32,2)"):
        for mode in ("nearest", "rz", "ru", "ro"):
            for fma in (False, True):
                g = Grid(fmt, mode)
                a = g.round(
                    torch.randn(2, 5, 30, generator=gen, dtype=torch.float64)
                    * torch.logspace(-5, 5, 30, dtype=torch.float64)
                )
                b = g.round(torch.randn(30, 6, generator=gen, dtype=torch.float64))
                acc = Accumulator(Accumulation.resolve(fmt, fma=fma), g)
                saved = acc_mod.native_sequential[0]
                try:
                    acc_mod.native_sequential[0] = None
                    ref = acc.dot(a, b, g)
                finally:
                    acc_mod.native_sequential[0] = saved
                assert torch.equal(acc.dot(a, b, g), ref), (fmt, mode, fma)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"accumulate": "quire", "fmt": "bf16"}, "expected a Posit"),
        ({"accumulate": "quire"}, "fmt="),
        ({"accumulate": "bf16", "order": "random"}, "order="),
        ({"accumulate": "bf16", "order": 0}, "k >= 1"),
        ({"accumulate": "bf16", "order": True}, "order="),
        ({"accumulate": 3.5}, "accumulate="),
        ({"accumulate": "mxfp8_e4m3"}, "elementwise format"),
        ({"accumulate": "bf16", "fma": "yes"}, "fma="),
    ],
)
def test_bad_arguments(kwargs, needle):
    a, b = torch.ones(2, 3), torch.ones(3, 2)
    with pytest.raises(an.AnynumError, match=needle) as info:
        an.matmul(a, b, **kwargs)
    assert "expected" in str(info.value).lower()


def test_integer_operand_is_refused():
    with pytest.raises(an.AnynumError, match="floating"):
        an.matmul(torch.ones(2, 3, dtype=torch.int64), torch.ones(3, 2))


def test_matmul_gradients_follow_the_same_rules():
    a = an.quantize(torch.randn(3, 4, dtype=torch.float64), "bf16").requires_grad_()
    b = an.quantize(torch.randn(4, 2, dtype=torch.float64), "bf16").requires_grad_()
    y = an.matmul(a, b, fmt="bf16", accumulate="bf16")
    g = torch.ones_like(y)
    y.backward(g)
    assert torch.equal(a.grad, an.matmul(g, b.detach().T, fmt="bf16", accumulate="bf16"))
    assert torch.equal(b.grad, an.matmul(a.detach().T, g, fmt="bf16", accumulate="bf16"))
