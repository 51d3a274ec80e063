"""an.emulate op by op against the hand-rounded composition: round the inputs, compute once in
float64 (or exactly, in fractions), round once."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from emulate_reference import round_exact

import anynum as an

pytestmark = pytest.mark.usefixtures("one_thread")

FMT = an.format("posit(16,2)")


def q(x: torch.Tensor, fmt=FMT, mode="nearest") -> torch.Tensor:
    """Hand rounding: float64 value rounded once, stored as float32."""
    return an.quantize(x.double(), fmt, mode).float()


def raw(shape, seed=0, scale=1.0):
    """Inputs NOT on the grid (the mode must round them first)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


UNARY = {
    "tanh": torch.tanh,
    "exp": torch.exp,
    "sigmoid": torch.sigmoid,
    "sqrt": lambda t: torch.sqrt(t.abs()),
    "log": lambda t: torch.log(t.abs() + 1),
    "neg": torch.neg,
    "relu": torch.relu,
    "sin": torch.sin,
    "reciprocal": torch.reciprocal,
    "gelu": F.gelu,
    "square": torch.square,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops(name):
    f = UNARY[name]
    x = raw((64,), 1)
    with an.emulate(FMT):
        y = f(x)
    xq = q(x).double()
    want = q(f(xq)) if name != "sqrt" else q(torch.sqrt(q(xq.abs()).double()))
    if name == "log":
        want = q(torch.log(q(q(xq.abs()).double() + 1).double()))
    assert y.dtype == torch.float32
    assert torch.equal(y, want), name


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "atan2": torch.atan2,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops(name):
    f = BINARY[name]
    a, b = raw((50,), 2).abs() + 0.1, raw((50,), 3)
    with an.emulate(FMT):
        y = f(a, b)
    want = q(f(q(a).double(), q(b).double()))
    assert torch.equal(y, want)


@pytest.mark.parametrize("mode", ["nearest", "rz", "ru", "rd", "ro", "rna"])
@pytest.mark.parametrize("fmt", ["bf16", "posit(8,1)", "e4m3fn"])
def test_add_mul_fma_round_the_exact_result(mode, fmt):
    """+ - x fma against fractions, including sums whose exact value needs more than 53 bits."""
    f = an.format(fmt)
    vals = torch.tensor(f.values(), dtype=torch.float64)
    vals = vals[vals.abs() <= f.max / 4]
    g = torch.Generator().manual_seed(4)
    a = vals[torch.randint(len(vals), (200,), generator=g)].float()
    b = vals[torch.randint(len(vals), (200,), generator=g)].float()
    c = vals[torch.randint(len(vals), (200,), generator=g)].float()
    with an.emulate(f, mode):
        s, d, p, fm = a + b, a - b, a * b, torch.addcmul(a, b, c)
    for i in range(200):
        fa, fb, fc = Fraction(float(a[i])), Fraction(float(b[i])), Fraction(float(c[i]))
        for got, exact in ((s, fa + fb), (d, fa - fb), (p, fa * fb), (fm, fa + fb * fc)):
            if abs(exact) <= Fraction(f.max):
                assert Fraction(float(got[i])) == round_exact(exact, f, mode), (i, float(got[i]), exact)


@pytest.mark.parametrize("mode", ["nearest", "rz", "ru", "rd", "ro"])
@pytest.mark.parametrize("fmt", ["posit(16,2)", "bf16", "posit(8,1)"])
@pytest.mark.parametrize("c_kernel", [True, False])
def test_scaled_add_and_addcmul_round_the_exact_result(mode, fmt, c_kernel, monkeypatch):
    """a + alpha * b, a - alpha * b, alpha * b - a, a + v * b * c (out of place and in place)
    against fractions: the exact value, rounded once (one C pass, or TwoSum and the torch pair
    rounding where the C kernel is not there)."""
    from anynum.emulate import native

    if not c_kernel:
        monkeypatch.setattr(native, "add_round", lambda x, y, grid: None)
    f = an.format(fmt)
    vals = torch.tensor(f.values(), dtype=torch.float64)
    vals = vals[(vals.abs() <= 2.0**10) & (vals.abs() >= 2.0**-10)]
    g = torch.Generator().manual_seed(6)
    a, b, c = (vals[torch.randint(len(vals), (150,), generator=g)].float() for _ in range(3))
    v = float(an.quantize(torch.tensor([0.001], dtype=torch.float64), f)[0])
    with an.emulate(f, mode):
        outs = [
            torch.add(a, b, alpha=v), torch.sub(a, b, alpha=v), torch.rsub(a, b, alpha=v),
            torch.addcmul(a, b, c, value=v), a.clone().addcmul_(b, c, value=-v), a.clone().add_(b, alpha=-v),
        ]
    fv = Fraction(v)
    for i in range(150):
        fa, fb, fc = Fraction(float(a[i])), Fraction(float(b[i])), Fraction(float(c[i]))
        exact = [fa + fv * fb, fa - fv * fb, fb - fv * fa, fa + fv * fb * fc, fa - fv * fb * fc, fa - fv * fb]
        for got, want in zip(outs, exact):
            assert Fraction(float(got[i])) == round_exact(want, f, mode), (i, float(got[i]), want)


def test_directed_sum_needing_more_than_53_bits():
    one = torch.tensor([1.0], dtype=torch.float64)
    tiny = torch.tensor([2.0**-100], dtype=torch.float64)
    with an.emulate("bf16", "ru"):
        up = one + tiny
        inplace = one.clone()
        inplace.add_(tiny)
    assert up.item() == 1 + 2**-7 and inplace.item() == 1 + 2**-7


def test_reductions_and_dot_products_round_once():
    x, w, b = raw((4, 9), 5), raw((3, 9), 6), raw((3,), 7)
    with an.emulate(FMT):
        s, m = x.sum(1), x.mean(0)
        lin = F.linear(x, w, b)
        mm = x @ w.T
        sm = F.softmax(x, dim=1)
        ls = F.log_softmax(x, dim=1)
        ln = F.layer_norm(x, (9,))
        cs = x.cumsum(1)
    xq, wq, bq = q(x).double(), q(w).double(), q(b).double()
    assert torch.equal(s, q(xq.sum(1)))
    assert torch.equal(m, q(xq.mean(0)))
    assert torch.equal(lin, q(xq @ wq.T + bq))
    assert torch.equal(mm, q(xq @ wq.T))
    assert torch.equal(sm, q(F.softmax(xq, 1)))
    assert torch.equal(ls, q(F.log_softmax(xq, 1)))
    assert torch.equal(ln, q(F.layer_norm(xq, (9,))))
    assert torch.equal(cs, q(xq.cumsum(1)))


def test_convolution_forward_and_backward():
    x = raw((2, 3, 7, 7), 8).requires_grad_()
    w = raw((4, 3, 3, 3), 9).requires_grad_()
    with an.emulate(FMT):
        y = F.conv2d(x, w, padding=1, stride=2)
        y.backward(torch.ones_like(y))
    xq, wq = q(x.detach()).double().requires_grad_(), q(w.detach()).double().requires_grad_()
    y64 = F.conv2d(xq, wq, padding=1, stride=2)
    assert torch.equal(y, q(y64.detach()))
    gx, gw = torch.autograd.grad(y64, (xq, wq), torch.ones_like(y64))
    assert torch.equal(x.grad, q(gx)) and torch.equal(w.grad, q(gw))


def test_gradients_equal_a_hand_rounded_backward():
    """loss = sum(tanh(x @ w)): each backward op rounded once, by hand."""
    x, w = raw((3, 5), 10), raw((5, 2), 11).requires_grad_()
    with an.emulate(FMT):
        loss = torch.tanh(x @ w).sum()
        loss.backward()
    xq, wq = q(x).double(), q(w.detach()).double()
    h = q(xq @ wq).double()
    t = q(torch.tanh(h)).double()
    assert loss.item() == q(t.sum()).item()
    g_t = torch.ones_like(t)  # d sum / d t: ones (on the grid)
    g_h = q(g_t * (1 - t * t)).double()  # tanh_backward, one rounding
    g_w = q(xq.T @ g_h)  # mm, one rounding
    assert torch.equal(w.grad, g_w)


def test_accumulate_applies_to_linear_and_conv_backward():
    """Under accumulate=fmt2 the weight gradient of a linear layer is the sequential sum."""
    from emulate_reference import ref_dot

    p8 = an.format("posit(8,0)")
    x = an.quantize(raw((6, 3), 12), p8)
    w = an.quantize(raw((2, 3), 13), p8).requires_grad_()
    with an.emulate(p8, accumulate=p8):
        y = F.linear(x, w)
        y.backward(torch.ones_like(y))
    for i in range(2):
        for j in range(3):
            want = ref_dot(
                [Fraction(1)] * 6, [Fraction(float(v)) for v in x[:, j]], p8, "sequential", False, p8
            )
            assert Fraction(float(w.grad[i, j])) == want


def test_factories_inplace_out_and_foreach():
    with an.emulate("e4m3fn"):
        z = torch.zeros(3)
        f = torch.full((2,), 0.3)
        r = torch.arange(0.0, 1.0, 0.1)
        n = torch.randn(5, generator=torch.Generator().manual_seed(0))
        t = torch.ones(4)
        t.mul_(0.3)
        o = torch.empty(4)
        torch.add(t, 0.1, out=o)
        ts = [torch.ones(2), torch.ones(3)]
        torch._foreach_mul_(ts, 0.3)
    grid = an.E4M3FN
    for v in (z, f, r, n, t, o, *ts):
        assert torch.equal(v, an.quantize(v, grid)), v
    assert f.tolist() == [0.3125, 0.3125]
    assert torch.equal(r, q(torch.arange(0.0, 1.0, 0.1, dtype=torch.float64), grid))
    assert torch.equal(o, q(t.double() + 0.1015625, grid))
    assert ts[0].tolist() == [0.3125, 0.3125]


def test_integer_and_bool_pass_through():
    i = torch.arange(5)
    with an.emulate("e2m1"):
        j = i * 1000
        m = torch.tensor([0.3, 7.0]) > 0.5
        k = torch.tensor([0.3, 7.0]).argmax()
    assert j.tolist() == [0, 1000, 2000, 3000, 4000] and m.tolist() == [False, True] and int(k) == 1


def test_optimizer_step_is_emulated_and_fused_is_refused():
    w = torch.nn.Parameter(raw((4,), 14))
    opt = torch.optim.Adam([w], lr=0.01, foreach=True)
    with an.emulate("bf16"):
        (w * w).sum().backward()
        opt.step()
    assert torch.equal(w.detach(), an.quantize(w.detach(), "bf16"))
    for v in opt.state[w].values():
        if v.is_floating_point():
            assert torch.equal(v, an.quantize(v, "bf16"))
    fused = torch.optim.Adam([w], lr=0.01, fused=True)
    with pytest.raises(an.AnynumError, match="_fused_adam") as info, an.emulate("bf16"):
        (w * w).sum().backward()
        fused.step()
    assert "foreach" in str(info.value)


def test_nesting_and_exceptions_restore_state():
    x = torch.tensor([1.0 / 3])
    outer = an.emulate("bf16")
    with outer:
        a = x * 1.0
        with an.emulate("e4m3fn"):
            b = x * 1.0  # the innermost mode decides
        c = x * 1.0
    d = x * 1.0
    assert a.item() == c.item() == q(x.double(), an.BF16).item()
    assert b.item() == q(x.double(), an.E4M3FN).item()
    assert d.item() == x.item()
    mkldnn = torch.backends.mkldnn.enabled
    with pytest.raises(ZeroDivisionError), an.emulate("bf16"):
        _ = x * 1.0
        raise ZeroDivisionError
    assert (x * 1.0).item() == x.item()
    assert torch.backends.mkldnn.enabled == mkldnn


def test_decorator_include_exclude():
    @an.emulate("e4m3fn")
    def f(t):
        return t * 1.0 + 0.0

    x = torch.tensor([0.3])
    assert f(x).item() == 0.3125
    with an.emulate("e4m3fn", exclude=["tanh"]):
        t = torch.tanh(x)
        s = x * 1.0
    assert t.item() == torch.tanh(x).item() and s.item() == 0.3125
    with an.emulate("e4m3fn", include="aten.tanh.default"):
        t2 = torch.tanh(x)
        s2 = x * 1.0
    assert t2.item() == an.quantize(torch.tanh(torch.tensor([0.3125])), an.E4M3FN).item()
    assert s2.item() == x.item()


def test_stochastic_emulation_is_reproducible_and_resumable():
    x = raw((1000,), 15)

    def run(mode):
        with mode:
            return x * 1.0 + 0.001

    a, b = run(an.emulate("bf16", "sr", seed=3)), run(an.emulate("bf16", "sr", seed=3))
    assert torch.equal(a, b)
    assert not torch.equal(a, run(an.emulate("bf16", "sr", seed=4)))
    m = an.emulate("bf16", "sr", seed=3)
    run(m)
    state = m.state_dict()
    first = run(m)
    m.load_state_dict(state)
    assert torch.equal(run(m), first)
    g = torch.Generator().manual_seed(9)
    assert torch.equal(
        run(an.emulate("bf16", "sr", generator=g)),
        run(an.emulate("bf16", "sr", generator=torch.Generator().manual_seed(9))),
    )


def test_block_format_quantizes_dot_operands_along_k():
    x, w = raw((4, 64), 16), raw((3, 64), 17)
    with an.emulate("mxfp8_e4m3"):
        y = x @ w.T
        t = torch.tanh(x)
    xq = an.quantize(q(x, an.FP32).double(), an.MXFP8_E4M3)  # blocks along the last axis: K
    wq = an.quantize(q(w, an.FP32).double(), an.MXFP8_E4M3)
    assert torch.equal(y, q(xq @ wq.T, an.FP32))
    assert torch.equal(t, torch.tanh(x.double()).float())  # elementwise: FP32, one rounding


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: an.emulate(3.5), "Format or format name"),
        (lambda: an.emulate("nope"), "unknown format"),
        (lambda: an.emulate("posit(8,0)", accumulate="quire", order=-1), "k >= 1"),
        (lambda: an.emulate("bf16", accumulate="quire"), "Posit"),
        (lambda: an.emulate("bf16", exclude=["not_an_op"]), "aten op"),
        (lambda: an.emulate("bf16", seed=1, generator=torch.Generator()), "both"),
        (lambda: an.emulate("e8m0"), "holds 0"),
    ],
)
def test_bad_input(call, needle):
    with pytest.raises(an.AnynumError, match=needle):
        call()


def test_complex_is_refused():
    # torch.mul, not `*`: torch turns a TypeError raised under an operator into NotImplemented,
    # and AnynumError is a TypeError
    with pytest.raises(an.AnynumError, match="complex"), an.emulate("bf16"):
        torch.mul(torch.ones(2, dtype=torch.complex64), 2)
