"""an.nn.FaultInjector: weights, biases, activations and gradients, reproducible and removable."""

from __future__ import annotations

import copy

import pytest
import torch

import anynum as an
from anynum.errors import InputError


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_weights_flip_in_place_and_are_restored():
    model = mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fi = an.nn.FaultInjector(model, an.E4M3FN, count=1, field="sign", seed=1)
    q = an.quantize(before["0.weight"], an.E4M3FN)
    assert torch.equal(model[0].weight.detach(), -q)  # every element: its e4m3 code with the sign flipped
    assert torch.equal(model[0].bias, before["0.bias"])  # biases are a separate target
    assert fi.flips == {"0.weight": 128, "2.weight": 48}
    fi.remove()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    fi.remove()  # idempotent


def test_rate_and_untouched_elements():
    model = mlp()
    before = model[0].weight.detach().clone()
    with an.nn.FaultInjector(model, "bf16", p=0.01, target=("weight", "bias"), seed=3) as fi:
        changed = model[0].weight.detach() != before
        assert 0 < int(changed.sum()) < before.numel()
        assert fi.flips["0.weight"] >= int(changed.sum()) and "0.bias" in fi.flips
    with an.nn.FaultInjector(model, "bf16", p=0.0, seed=3):
        assert torch.equal(model[0].weight.detach(), before)


def test_reproducible_by_seed():
    a, b = mlp(), mlp()
    with an.nn.FaultInjector(a, "posit(8,2)", p=0.05, field="regime", seed=7), \
            an.nn.FaultInjector(b, "posit(8,2)", p=0.05, field="regime", seed=7):
        assert torch.equal(a[0].weight, b[0].weight)
    c = mlp()
    with an.nn.FaultInjector(c, "posit(8,2)", p=0.05, field="regime", seed=8):
        assert not torch.equal(a[0].weight, c[0].weight)


def test_activation_faults_every_forward():
    model = mlp()
    x = torch.randn(32, 8)
    clean = model(x)
    with an.nn.FaultInjector(model, "e5m2", p=0.02, target="activation", seed=0) as fi:
        y1, y2 = model(x), model(x)
        assert not torch.equal(y1, clean) and not torch.equal(y1, y2)  # transient: new flips per call
        assert fi.flips["0:activation"] > 0 and fi.flips["2:activation"] > 0
    again = copy.deepcopy(model)
    with an.nn.FaultInjector(again, "e5m2", p=0.02, target="activation", seed=0):
        assert torch.equal(again(x), y1)  # the same seed and call order reproduce the flips
    assert torch.equal(model(x), clean)  # hooks removed


def test_gradient_faults():
    model = mlp()
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    clean = model[0].weight.grad.clone()
    model.zero_grad()
    with an.nn.FaultInjector(model, "bf16", count=1, field="sign", target="gradient", seed=0):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    assert torch.equal(model[0].weight.grad, -an.quantize(clean, "bf16"))


def test_converted_layers_give_their_formats():
    model = an.nn.convert(mlp(), an.nn.Policy(weight="e4m3fn", activation="e5m2"))
    with an.nn.FaultInjector(model, count=1, field="exponent", seed=0) as fi:
        w = model[0].parametrizations.weight.original.detach()
        assert torch.equal(an.quantize(w, "e4m3fn"), w)  # still e4m3 values: flips of e4m3 codes
        model(torch.randn(2, 8))
        assert set(fi.flips) == {"0.weight", "2.weight", "0:activation", "2:activation"} or \
            set(fi.flips) >= {"0.weight", "2.weight"}
    with pytest.raises(InputError, match=r"convert it with an\.nn\.convert first, or pass fmt="):
        an.nn.FaultInjector(mlp(), count=1)


def test_tensor_scale_for_integers():
    """Symmetric int8 (scale amax / 127): flipping the two's-complement sign bit moves k by 128."""
    model = mlp()
    w = model[0].weight.detach().clone()
    with an.nn.FaultInjector(model, an.IntFormat(8), count=1, field="sign", scale="tensor", seed=0):
        s = w.abs().max().double() / 127
        k = an.quantize(w.double() / s, an.IntFormat(8))
        want = torch.where(k >= 0, k - 128, k + 128) * s
        assert torch.equal(model[0].weight.detach(), want.float())


def test_bad_arguments():
    with pytest.raises(InputError, match="target must be"):
        an.nn.FaultInjector(mlp(), "bf16", p=0.1, target="weights")
    with pytest.raises(InputError, match="exactly one of"):
        an.nn.FaultInjector(mlp(), "bf16")
    with pytest.raises(InputError, match="scale must be"):
        an.nn.FaultInjector(mlp(), "bf16", p=0.1, scale="channel")
    with pytest.raises(InputError, match=r"torch\.nn\.Module"):
        an.nn.FaultInjector(42, "bf16", p=0.1)
