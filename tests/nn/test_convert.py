"""convert / restore / post_quantize / Policy selection and errors."""

from __future__ import annotations

import copy
import importlib
import io

import pytest
import torch
from torch import nn

import anynum as an

# Eager kernels: in auto mode, training loops here would reach ANYNUM_COMPILE_MIN elements per
# kernel and compile it (routing: tests/nn/test_quantizer.py; fused = eager: tests/kernels).
pytestmark = pytest.mark.usefixtures("eager_only")
quantizer_module = importlib.import_module("anynum.nn.quantizer")  # `an.nn.quantizer` is a function


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().bfloat16().float()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 16),
        nn.ReLU(),
        nn.Linear(16, 3),
    )


def test_weights_activations_and_errors_are_rounded():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(5, 4))
    w, b = m[0].weight, m[0].bias
    m = an.nn.convert(m, an.nn.Policy(weight="bf16", activation="bf16", error="e5m2"))
    assert m[0].parametrizations.weight.original is w  # same Parameter: optimizers keep working
    x = torch.randn(7, 5, requires_grad=True)
    y = m(x)
    expected = nn.functional.linear(bf16(x), bf16(w), bf16(b))
    assert torch.equal(y, expected)
    y.backward(torch.randn(7, 4))
    assert torch.equal(x.grad, x.grad.to(torch.float8_e5m2).float())
    assert w.grad is not None and not torch.equal(w.grad, bf16(w.grad))  # STE: weight grads unrounded


def test_optimizer_built_before_convert_updates_the_model():
    m = net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    an.nn.convert(m, an.nn.Policy(weight="e4m3fn"))
    before = m[4].parametrizations.weight.original.clone()
    m(torch.randn(2, 1, 8, 8)).sum().backward()
    opt.step()
    assert not torch.equal(before, m[4].parametrizations.weight.original)


def test_restore_gives_the_original_model_bit_for_bit():
    m = net()
    x = torch.randn(4, 1, 8, 8)
    ref = m(x)
    params = [id(p) for p in m.parameters()]
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    an.nn.convert(m, an.nn.Policy(weight="e2m1", activation="e2m1", error="e5m2", buffer="bf16"))
    assert not torch.equal(m(x), ref)
    m = an.nn.restore(m)
    assert torch.equal(m(x), ref)
    assert [id(p) for p in m.parameters()] == params
    assert sd.keys() == m.state_dict().keys()
    assert all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
    # The very classes: convert's rounding forwards and torch's parametrized classes are gone.
    classes = [nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    assert [type(c) for c in m] == classes
    assert not m[0]._forward_pre_hooks and not an.nn.converted_layers(m)


def test_restore_of_replaced_recurrent_and_attention_layers():
    torch.manual_seed(0)
    m = nn.ModuleDict({"rnn": nn.LSTM(4, 6), "att": nn.MultiheadAttention(6, 2)})
    x = torch.randn(5, 3, 4)
    ref_out = m["rnn"](x)[0]
    ref_att = m["att"](ref_out, ref_out, ref_out)[0]
    an.nn.convert(m, an.nn.Policy(weight="e4m3fn", activation="e4m3fn"))
    assert isinstance(m["rnn"], an.nn.LSTM) and isinstance(m["att"], an.nn.MultiheadAttention)
    out = m["rnn"](x)[0]
    assert torch.equal(out, out.to(torch.float8_e4m3fn).float())
    an.nn.restore(m)
    assert type(m["rnn"]) is nn.LSTM and type(m["att"]) is nn.MultiheadAttention
    out = m["rnn"](x)[0]
    assert torch.equal(out, ref_out)
    assert torch.equal(m["att"](out, out, out)[0], ref_att)


def test_state_dict_round_trip_of_a_converted_model():
    policy = an.nn.Policy(weight="e4m3fn", activation="e4m3fn")
    a = an.nn.convert(net(), policy)
    with torch.no_grad():
        for p in a.parameters():
            p.mul_(1.5)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    torch.manual_seed(123)
    b = an.nn.convert(nn.Sequential(*[copy.deepcopy(c) for c in net()]), policy)
    b.load_state_dict(torch.load(buf))
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(a(x), b(x))
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = copy.deepcopy(a)  # deep copies keep their hooks and parametrizations
    assert torch.equal(c(x), a(x))


def test_selection_include_exclude_per_layer_and_skip_first_last():
    m = net()
    sel = an.nn.select_layers(m, an.nn.Policy(weight="bf16"))
    assert list(sel) == ["0", "2", "4", "6"]
    sel = an.nn.select_layers(m, an.nn.Policy(weight="bf16", skip_first_last=True))
    assert list(sel) == ["2", "4"]
    sel = an.nn.select_layers(m, an.nn.Policy(weight="bf16", include=(nn.Linear,), exclude=("6",)))
    assert list(sel) == ["4"]
    sel = an.nn.select_layers(m, an.nn.Policy(weight="bf16", include=("[01]",)))
    assert list(sel) == ["0", "1"]
    override = an.nn.Policy(weight="e2m1")
    sel = an.nn.select_layers(m, an.nn.Policy(weight="bf16", include=(nn.Linear,), per_layer={"0": override}))
    assert list(sel) == ["0", "4", "6"] and sel["0"][1] is override
    an.nn.convert(m, an.nn.Policy(weight="bf16", per_layer={nn.Conv2d: override}))
    w = m[0].weight
    assert set(w.flatten().tolist()) <= set(an.E2M1.values().tolist())
    assert torch.equal(m[4].weight, bf16(m[4].weight))


def test_policy_naming_missing_layers_raises_with_suggestion():
    m = net()
    with pytest.raises(an.AnynumError, match=r"no such layer.*'4'"):
        an.nn.convert(m, an.nn.Policy(weight="bf16", exclude=("44",)))
    with pytest.raises(an.AnynumError, match="per_layer"):
        an.nn.convert(m, an.nn.Policy(weight="bf16", per_layer={"fc9": an.nn.Policy()}))
    with pytest.raises(an.AnynumError, match="include"):
        an.nn.convert(m, an.nn.Policy(weight="bf16", include=("features.*",)))
    assert not an.nn.converted_layers(m)  # nothing was half-converted


def test_format_that_the_parameter_dtype_cannot_hold_raises():
    m = nn.Linear(3, 3).to(torch.bfloat16)
    with pytest.raises(an.RepresentabilityError if hasattr(an, "RepresentabilityError") else an.AnynumError):
        an.nn.convert(nn.Sequential(m), an.nn.Policy(weight="fp16"))


def test_other_policy_errors():
    with pytest.raises(an.AnynumError, match="activation_at"):
        an.nn.Policy(activation="bf16", activation_at="middle")
    with pytest.raises(an.AnynumError, match="unknown"):
        an.nn.Policy(weight="fp9")
    with pytest.raises(an.AnynumError, match="Policy"):
        an.nn.convert(net(), "bf16")
    m = an.nn.convert(net(), an.nn.Policy(weight="bf16"))
    with pytest.raises(an.AnynumError, match="already converted"):
        an.nn.convert(m, an.nn.Policy(weight="bf16"))


def test_activation_at_output_and_buffers():
    torch.manual_seed(0)
    m = nn.Sequential(nn.BatchNorm1d(4))
    an.nn.convert(m, an.nn.Policy(activation="e4m3fn", activation_at="output", buffer="bf16"))
    y = m(torch.randn(8, 4) * 3)
    assert torch.equal(y, y.to(torch.float8_e4m3fn).float())
    assert torch.equal(m[0].running_var, bf16(m[0].running_var))
    assert an.nn.audit(m) == []


def test_post_quantize_copy_leaves_the_original_alone():
    m = net()
    x = torch.randn(2, 1, 8, 8)
    ref = m(x)
    q = an.nn.post_quantize(m, "e4m3fn", copy_model=True)
    assert torch.equal(m(x), ref)
    assert torch.equal(q[4].weight, q[4].weight.to(torch.float8_e4m3fn).float())
    assert not torch.equal(q(x), ref)
    p = an.nn.post_quantize(m, an.nn.Policy(weight="bf16"))
    assert p is m and torch.equal(m[6].weight, bf16(m[6].weight))


def test_weights_the_optimizer_keeps_on_the_grid_are_not_rounded_again(monkeypatch):
    """After a QuantizedOptimizer step the model sees its stored weights as they are; any later
    in-place change (tracked by the version counter) makes the next forward round them again."""
    calls: list[tuple[int, ...]] = []
    real = quantizer_module.apply_pair

    def counting(x, fwd, bwd):
        calls.append(tuple(x.shape))
        return real(x, fwd, bwd)

    monkeypatch.setattr(quantizer_module, "apply_pair", counting)
    layers = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 2))
    model = an.nn.convert(layers, an.nn.Policy(weight="e4m3fn"))
    opt = an.optim.QuantizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), weight="e4m3fn")
    x = torch.randn(3, 5)
    calls.clear()  # register_parametrization tries each once
    model(x).sum().backward()
    assert len(calls) == 4  # two weights and two biases, not yet on the grid
    opt.step()
    calls.clear()
    out = model(x)
    assert calls == []
    stored = model[0].parametrizations.weight.original
    assert model[0].weight is stored  # the Parameter itself: gradients reach it directly
    assert torch.equal(out, model[2](torch.relu(nn.functional.linear(x, stored, model[0].bias))))
    with torch.no_grad():
        stored.add_(1e-3)  # off the grid again
    assert torch.equal(model[0].weight, stored.to(torch.float8_e4m3fn).float())
    assert calls == [(4, 5)]
    model.load_state_dict({k: v + 1e-3 for k, v in model.state_dict().items()})
    calls.clear()
    model(x)
    assert len(calls) == 4
    # New data keeps the version counter: the storage address and dtype give it away.
    opt.step()
    calls.clear()
    stored.data = stored.data.clone()
    model(x)
    assert calls == [(4, 5)]
    opt.step()
    calls.clear()
    model.double()
    model(x.double())
    assert len(calls) == 4


def test_only_an_identical_deterministic_grid_skips_rounding():
    Rounder = an.nn.Rounder
    w = torch.tensor([0.3, 1.7, -2.2])
    Rounder("e4m3fn").mark_on_grid(w)
    assert Rounder("e4m3fn").is_identity_on(w)
    assert not Rounder("e4m3fn", "sr", seed=0).is_identity_on(w)  # would advance its stream
    assert not Rounder("e4m3fn", overflow="nan").is_identity_on(w)
    assert not Rounder("e5m2").is_identity_on(w)
    assert not Rounder("e4m3fn").is_identity_on(w.clone())
    v = torch.ones(32)
    Rounder(an.Block(an.E2M1, 8)).mark_on_grid(v)  # re-rounding a block format may pick another scale
    assert not Rounder(an.Block(an.E2M1, 8)).is_identity_on(v)


def test_skipping_weight_rounding_changes_no_bit_of_training(monkeypatch):
    def train() -> list[torch.Tensor]:
        model = an.nn.convert(net(), an.nn.Policy(weight="e4m3fn", activation="bf16", error="e5m2"))
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = an.optim.QuantizedOptimizer(sgd, weight="e4m3fn", grad="bf16", momentum="bf16")
        g = torch.Generator().manual_seed(0)
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(8, 1, 8, 8, generator=g)).square().sum().backward()
            opt.step()
        return [t.detach().clone() for t in model.state_dict().values()]

    skipping = train()
    monkeypatch.setattr(an.nn.Rounder, "is_identity_on", lambda self, t: False)
    assert all(torch.equal(a, b) for a, b in zip(skipping, train()))
