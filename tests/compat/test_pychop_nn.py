"""The Pychop facade's layers, optimizers and post-training quantization.

Expected values are the torch layer run on parameters and outputs rounded by
the chopper (whose own rounding is checked in test_pychop_chop.py), and the
training relations Pychop's layers get wrong: an optimizer built before
training updates the parameters of every layer, gradients reach them, and
``state_dict`` keys are torch's.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from anynum.compat.pychop import Chop, Chopf, ChopiSTE, ChopSTE, ptq
from anynum.compat.pychop import layers as L
from anynum.compat.pychop import optimizers as O

CH = Chop(5, 2)  # e5m2


def _chopped_copy(layer: nn.Module, base: type[nn.Module]) -> nn.Module:
    ref = base.__new__(base)
    ref.__dict__ = copy.deepcopy({k: v for k, v in layer.__dict__.items() if k != "chop"})
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(CH(p))
    return ref


@pytest.mark.parametrize(
    "name,args,shape",
    [
        ("Linear", (4, 3), (2, 4)),
        ("Conv2d", (2, 3, 3), (1, 2, 5, 5)),
        ("ConvTranspose1d", (2, 2, 3), (1, 2, 6)),
        ("BatchNorm1d", (4,), (3, 4)),
        ("LayerNorm", (4,), (3, 4)),
        ("GroupNorm", (2, 4), (3, 4, 2)),
        ("Embedding", (10, 4), None),
        ("AvgPool2d", (2,), (1, 1, 4, 4)),
    ],
)
def test_layer_values(name, args, shape):
    torch.manual_seed(0)
    layer = getattr(L, "Quantized" + name)(*args, chop=CH).eval()
    base = getattr(nn, name)
    ref = _chopped_copy(layer, base).eval()
    x = torch.randint(0, 10, (5,)) if shape is None else torch.randn(shape)
    assert torch.equal(layer(x), CH(ref(x)))
    assert list(layer.state_dict()) == list(base(*args).state_dict())


@pytest.mark.parametrize("name", ["ReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "Softmax"])
def test_activation_layers_round_input_and_output(name):
    x = torch.randn(3, 5)
    kwargs = {"dim": -1} if name == "Softmax" else {}
    layer = getattr(L, "Quantized" + name)(chop=CH, **kwargs)
    assert torch.equal(layer(x), CH(getattr(nn, name)(**kwargs)(CH(x))))


@pytest.mark.parametrize(
    "name,args",
    [
        ("LSTM", (4, 6)),
        ("GRU", (4, 6)),
        ("RNN", (4, 6)),
        ("MultiheadAttention", (4, 2)),
        ("LayerNorm", (4,)),
        ("BatchNorm1d", (4,)),
        ("Linear", (4, 4)),
        ("PReLU", ()),
    ],
)
def test_training_updates_the_real_parameters(name, args):
    torch.manual_seed(0)
    layer = getattr(L, "Quantized" + name)(*args, chop=CH)
    params = dict(layer.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)  # built before the first forward
    x = torch.randn(5, 4, 3) if name == "BatchNorm1d" else torch.randn(5, 3, 4)
    for _ in range(2):
        out = layer(x, x, x) if name == "MultiheadAttention" else layer(x)
        out = out[0] if isinstance(out, tuple) else out
        opt.zero_grad()
        out.pow(2).sum().backward()
        opt.step()
    assert dict(layer.named_parameters()).keys() == params.keys()
    for k, p in layer.named_parameters():
        assert p is params[k]  # never re-wrapped
    assert any(not torch.equal(before[k], p.detach()) for k, p in layer.named_parameters())


def test_lstm_forward_sees_rounded_weights_and_restores_them():
    torch.manual_seed(0)
    layer = L.QuantizedLSTM(3, 4, chop=CH)
    ref = nn.LSTM(3, 4)
    with torch.no_grad():
        for (_, p), (_, q) in zip(layer.named_parameters(), ref.named_parameters()):
            q.copy_(CH(p))
    x = torch.randn(6, 2, 3)
    out, (h, c) = layer(x)
    r_out, (r_h, r_c) = ref(x)
    assert torch.equal(out, CH(r_out)) and torch.equal(h, r_h) and torch.equal(c, r_c)
    assert not torch.equal(layer.weight_ih_l0, CH(layer.weight_ih_l0))  # stored weights stay full precision


def test_positional_chop_integer_layers_and_pickle():
    layer = L.QuantizedSigmoid(CH)
    assert layer.chop is CH
    il = L.IQuantizedLinear(4, 2, chop=ChopiSTE(8, symmetric=True))
    y = il(torch.randn(3, 4))
    assert y.shape == (3, 2)
    m = nn.Sequential(L.QuantizedLinear(4, 4, chop=ChopSTE(5, 2)), L.QuantizedReLU(chop=Chopf(4, 4)))
    x = torch.randn(2, 4)
    assert torch.equal(pickle.loads(pickle.dumps(m))(x), m(x))
    assert L.QuantizedAttention is L.QuantizedMultiheadAttention


def test_optimizers_round_moment_states():
    w = nn.Parameter(torch.randn(5))
    for cls, kwargs in [
        (O.QuantizedSGD, {"lr": 0.1, "momentum": 0.9}),
        (O.QuantizedAdam, {}),
        (O.QuantizedRMSprop, {"momentum": 0.5}),
        (O.QuantizedAdagrad, {}),
        (O.QuantizedAdadelta, {}),
        (O.QuantizedAdamW, {"amsgrad": True}),
    ]:
        opt = cls([w], chop=CH, **kwargs)
        for _ in range(2):
            w.grad = torch.randn(5)
            opt.step()
        states = {k: v for k, v in opt.state[w].items() if k != "step"}
        assert states and all(torch.equal(v, CH(v)) for v in states.values()), cls.__name__


def test_post_quantization_family():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(18, 3))
    model.eval()
    x = torch.randn(4, 1, 5, 5)
    q = ptq.post_quantization(model, CH)
    assert torch.equal(q[4].weight, CH(model[4].weight.detach())) and type(model[0]) is nn.Conv2d
    d = ptq.dynamic_post_quantization(model, CH)
    y = d(x)
    assert torch.equal(y, CH(y))
    s = ptq.static_post_quantization(model, CH, [x], calibration_method="percentile", percentile=90.0)
    ys = s(x * 3)
    assert torch.equal(ys, CH(ys)) and isinstance(s[1], nn.Identity)  # BN folded into the conv
    m = ptq.mixed_post_quantization(model, CH, None)
    assert torch.equal(m[4].weight, CH(model[4].weight.detach()))
    m2 = ptq.mixed_post_quantization(model, None, Chopf(6, 8), calibration_data=[x], dynamic=False)
    pickle.loads(pickle.dumps(m2))(x)
    with pytest.raises(ValueError):
        ptq.static_post_quantization(model, CH, [x], calibration_method="kl_divergence")


def test_a_failing_chopper_leaves_the_parameters_in_place():
    class FailsOnTheBias:
        def __call__(self, t):
            if t.dim() == 1:
                raise ValueError("no")
            return CH(t)

    layer = L.QuantizedLinear(3, 2, chop=FailsOnTheBias())
    params = dict(layer.named_parameters())
    with pytest.raises(ValueError):
        layer(torch.ones(1, 3))
    assert all(p is params[k] for k, p in layer.named_parameters())  # the weight was put back too
    assert layer._parameters["weight"] is params["weight"]
