"""The qtorch facade's training helpers: OptimLP, lower, sequential_lower, prepare_model, posit tanh modules.

Expected values are built from torch's bfloat16 cast (an independent rounding)
and the optimizers' update rules written out here.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from anynum.compat import qtorch
from anynum.compat.qtorch.auto_low import lower, sequential_lower
from anynum.compat.qtorch.optim import OptimLP
from anynum.compat.qtorch.quant import Quantizer, posit_quantize, quantizer

BF16 = qtorch.FloatingPoint(exp=8, man=7)


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def test_optimlp_step_order_with_accumulator():
    w = nn.Parameter(torch.tensor([1.0, -2.0, 0.3]))
    g = torch.tensor([0.123, -0.456, 3e-3])
    q = quantizer(BF16, forward_rounding="nearest")

    def fp16(t):  # the accumulator format, as a plain torch cast
        return t.half().float()

    opt = OptimLP(
        torch.optim.SGD([w], lr=0.1, momentum=0.9),
        weight_quant=q,
        grad_quant=q,
        momentum_quant=q,
        acc_quant=fp16,
        grad_scaling=4.0,
    )
    acc, buf = w.detach().clone(), None
    for _ in range(3):
        w.grad = g.clone()
        opt.step()
        gq = bf16(g * 4.0)  # grad_scaling multiplies before quantizing and stays (QPyTorch's meaning)
        buf = gq.clone() if buf is None else 0.9 * buf + gq  # SGD's momentum buffer, in float32
        acc = fp16(acc - 0.1 * buf)  # the step runs on the accumulator, which is then quantized
        buf = bf16(buf)  # momentum quantized after the step
        assert torch.equal(opt.weight_acc[w], acc)
        assert torch.equal(w.detach(), bf16(acc))
        assert torch.equal(opt.state[w]["momentum_buffer"], buf)


def test_optimlp_wraps_any_optimizer_and_saves_its_state():
    w = nn.Parameter(torch.randn(4))
    q = quantizer(BF16, forward_rounding="nearest")
    opt = OptimLP(
        torch.optim.RMSprop([w], lr=0.01, momentum=0.5), weight_quant=q, momentum_quant=q, acc_quant=q
    )
    for _ in range(2):
        w.grad = torch.randn(4)
        opt.step()
    state = opt.optim.state[w]
    for key in ("square_avg", "momentum_buffer"):
        assert torch.equal(state[key], bf16(state[key]))
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    w2 = nn.Parameter(w.detach().clone())
    opt2 = OptimLP(
        torch.optim.RMSprop([w2], lr=0.01, momentum=0.5), weight_quant=q, momentum_quant=q, acc_quant=q
    )
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    g = torch.randn(4)
    w.grad, w2.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(w, w2)  # resumed bit-exactly


def test_lower_and_sequential_lower_quantize_outputs_and_pickle():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(5, 4)
    low = sequential_lower(model, ["linear"], BF16, BF16, "nearest", "nearest")
    assert type(low[0]) is nn.Sequential and isinstance(low[0][1], Quantizer)
    assert type(model[0]) is nn.Linear  # the original is untouched
    expected = bf16(model[2](torch.relu(bf16(model[0](x)))))
    assert torch.equal(low(x), expected)
    assert torch.equal(pickle.loads(pickle.dumps(low))(x), expected)
    in_place = lower(copy.deepcopy(model), ["linear"], BF16, None, "nearest")
    assert torch.equal(in_place(x), expected)
    assert torch.equal(pickle.loads(pickle.dumps(in_place))(x), expected)


def test_prepare_model_skips_listed_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    low, high = qtorch.Posit(6, 1), qtorch.Posit(16, 1)
    qtorch.prepare_model(model, low, low, high, high, excluded=[0])

    def p(t, n):
        return posit_quantize(t, n, 1)

    assert torch.equal(model[0].weight, p(ref[0].weight.detach(), 16))  # layer 0 skipped: other format
    assert torch.equal(model[2].weight, p(ref[2].weight.detach(), 6))
    assert torch.equal(model[3].weight, p(ref[3].weight.detach(), 16))  # LayerNorm is an "other" layer
    x = torch.randn(3, 4)
    with torch.no_grad():
        h = model[1](model[0](p(x, 16)))
        h = model[3](model[2](p(h, 6)))
        expected = model[4](p(h, 6))
        assert torch.equal(model(x), expected)
        assert torch.equal(pickle.loads(pickle.dumps(model))(x), expected)


def test_posit_tanh_modules_train():
    x = torch.linspace(-3, 3, 13, requires_grad=True)
    out = qtorch.PositTanhModule()(x)
    out.sum().backward()
    assert torch.equal(x.grad, 1 - out.detach() ** 2)
    assert torch.equal(qtorch.RefTanhModule()(x), torch.tanh(x))
    assert (qtorch.PositTanhModuleEnhanced()(x).abs() <= 1).all()


def test_tutorial_flow_runs_after_changing_the_import(monkeypatch):
    """QPyTorch's Functionality Overview (Qtorch+ edition), with only the import prefix changed."""
    from anynum.compat.qtorch import FixedPoint, FloatingPoint
    from anynum.compat.qtorch.auto_low import sequential_lower
    from anynum.compat.qtorch.optim import OptimLP
    from anynum.compat.qtorch.quant import Quantizer, float_quantize, posit_quantize

    torch.manual_seed(0)
    full = torch.rand(5)
    low = posit_quantize(full, nsize=6, es=2, scale=2)
    assert torch.equal(low, posit_quantize(full * 2, 6, 2) / 2)
    nearest = float_quantize(full, exp=5, man=2, rounding="nearest")
    float_quantize(full, exp=5, man=2, rounding="stochastic")
    assert torch.equal(nearest, full.to(torch.float8_e5m2).float())
    Q = Quantizer(
        forward_number=FixedPoint(wl=4, fl=2),
        backward_number=FloatingPoint(exp=5, man=2),
        forward_rounding="nearest",
        backward_rounding="stochastic",
    )

    class LinearLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.W = nn.Linear(5, 1)

        def forward(self, x):
            return Q(self.W(x))

    lp_model = LinearLP()
    out = lp_model(torch.rand(5))
    loss = nn.BCELoss()(torch.sigmoid(out), torch.Tensor([0]))
    loss.backward()
    optimizer = OptimLP(
        torch.optim.SGD(lp_model.parameters(), momentum=0.9, lr=0.1),
        weight_quant=lambda x: float_quantize(x, exp=5, man=2, rounding="nearest"),
        grad_quant=lambda x: float_quantize(x, exp=5, man=2, rounding="nearest"),
        momentum_quant=lambda x: float_quantize(x, exp=6, man=9, rounding="nearest"),
    )
    optimizer.step()
    w = lp_model.W.weight.detach()
    assert torch.equal(w, w.to(torch.float8_e5m2).float())
    optimizer.zero_grad()
    fp = nn.Sequential(nn.Linear(5, 1))
    lp = sequential_lower(
        fp,
        layer_types=["linear"],
        forward_number=FixedPoint(wl=4, fl=2),
        backward_number=FloatingPoint(exp=5, man=2),
    )
    assert "Quantizer" in repr(lp)


@pytest.mark.parametrize("n,es", [(8, 2), (16, 2)])
def test_qtorch_plus_training_listing(n, es):
    """Qtorch+ paper Listing 1: posit weights, gradients, momenta and accumulators through OptimLP."""
    bit_8, bit_16 = qtorch.Posit(nsize=n, es=es), qtorch.Posit(nsize=16, es=2)
    weight_quant, grad_quant = quantizer(bit_8), quantizer(bit_8)
    momentum_quant, acc_quant = quantizer(bit_16), quantizer(bit_16)
    model = nn.Sequential(
        nn.Linear(4, 4), Quantizer(forward_number=bit_8, backward_number=bit_8), nn.Linear(4, 1)
    )
    optimizer = OptimLP(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
        weight_quant=weight_quant,
        grad_quant=grad_quant,
        momentum_quant=momentum_quant,
        acc_quant=acc_quant,
        grad_scaling=2**10,
    )
    torch.manual_seed(1)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    for p in model.parameters():
        assert torch.equal(p.detach(), posit_quantize(p.detach(), n, es))
