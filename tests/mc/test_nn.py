"""MC modules and optimizers: gradients reach MC parameters, tiny updates survive."""

from __future__ import annotations

import io

import pytest
import torch

from anynum import mc
from anynum.errors import AnynumError


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_mclinear_gets_gradient_and_steps(dtype):
    torch.manual_seed(0)
    layer = mc.nn.MCLinear(4, 3, nc=2, dtype=dtype)
    opt = mc.optim.MCSGD(layer.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    x = torch.randn(8, 4).to(dtype)
    loss = layer(x).to_tensor(torch.float32).square().mean()
    loss.backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None
    assert layer.weight.grad.abs().sum() > 0
    before = layer.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, layer.weight.detach())


def test_mcembedding_gradient_and_adam():
    emb = mc.nn.MCEmbedding(6, 3, nc=2, dtype=torch.float32)
    opt = mc.optim.MCAdam(emb.parameters(), lr=1e-2)
    ids = torch.tensor([0, 2, 2])
    emb(ids).to_tensor().sum().backward()
    g = emb.weight.grad
    assert g is not None and g[0, 2].abs().sum() > 0 and g[0, 1].abs().sum() == 0
    before = emb.weight.detach().clone()
    opt.step()
    after = emb.weight.detach()
    assert not torch.equal(before[:, 0], after[:, 0]) and torch.equal(before[:, 1], after[:, 1])


def test_tiny_updates_are_not_lost():
    """lr * grad far below float16 resolution: plain float16 SGD stalls, MCSGD accumulates."""
    p16 = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    pmc = mc.nn.MCParameter(mc.MCTensor(torch.ones(4, dtype=torch.float16), nc=2))
    o16 = torch.optim.SGD([p16], lr=1e-4)
    omc = mc.optim.MCSGD([pmc], lr=1e-4)
    for _ in range(100):
        p16.grad = torch.ones(4, dtype=torch.float16)
        pmc.grad = torch.ones(2, 4, dtype=torch.float16)
        o16.step()
        omc.step()
    assert p16.detach().tolist() == [1.0] * 4  # float16 lost every update
    val = pmc.mc.to_tensor(torch.float64)
    assert torch.allclose(val, torch.full((4,), 1 - 100 * 1e-4, dtype=torch.float64), rtol=0, atol=5e-5)
    # float16 resolution near 1 is 2**-11 ~ 4.9e-4: MC keeps 10x more than that
    assert (val - (1 - 100 * 1e-4)).abs().max() < 2.0**-11 / 10


def test_state_dict_roundtrip_and_sequential():
    net = mc.nn.MCSequential(mc.nn.MCLinear(3, 5, nc=3), torch.nn.ReLU(), mc.nn.ToTensor(),
                             torch.nn.Linear(5, 1))
    buf = io.BytesIO()
    torch.save(net.state_dict(), buf)
    buf.seek(0)
    net2 = mc.nn.MCSequential(mc.nn.MCLinear(3, 5, nc=3), torch.nn.ReLU(), mc.nn.ToTensor(),
                              torch.nn.Linear(5, 1))
    net2.load_state_dict(torch.load(buf))
    x = torch.randn(2, 3)
    assert torch.equal(net(x), net2(x))
    assert isinstance(net2[0].weight, mc.nn.MCParameter)


def test_bad_settings():
    with pytest.raises(AnynumError):
        mc.optim.MCSGD([torch.nn.Parameter(torch.ones(1))], lr=-1)
    with pytest.raises(AnynumError):
        mc.nn.MCLinear(2, 2, dtype=torch.int32)
