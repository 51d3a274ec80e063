"""Quantizer / quantizer / Rounder: forward and backward rounding against torch's own casts."""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.nn.quantizer import Rounder


def test_quantizer_forward_and_backward_match_torch_casts():
    q = an.Quantizer(forward=an.BF16, backward=an.E5M2)
    x = torch.randn(1000, requires_grad=True)
    y = q(x)
    assert torch.equal(y.detach(), x.detach().bfloat16().float())
    g = torch.randn(1000) * 1e-3
    y.backward(g)
    assert torch.equal(x.grad, g.to(torch.float8_e5m2).float())


def test_quantizer_none_directions_pass_through():
    x = torch.randn(10, requires_grad=True)
    y = an.Quantizer(backward="e4m3fn")(x)
    assert torch.equal(y.detach(), x.detach())
    y.backward(torch.full((10,), 0.3))
    assert torch.equal(x.grad, torch.full((10,), 0.3).to(torch.float8_e4m3fn).float())
    z = an.Quantizer(forward="bf16")(x)
    g = torch.full((10,), 0.1 + 2**-20)
    x.grad = None
    z.backward(g)
    assert torch.equal(x.grad, g)


def test_functional_quantizer_and_rounding_modes():
    f = an.nn.quantizer(forward="e4m3fn", forward_rounding="rz")
    x = torch.tensor([1.2, -1.2, 500.0])
    assert f(x).tolist() == [1.125, -1.125, 448.0]


def test_stochastic_errors_are_seeded_independent_and_unbiased():
    def run(seed):
        q = an.Quantizer(backward="e5m2", backward_rounding="sr", seed=seed)
        x = torch.zeros(20000, requires_grad=True)
        grads = []
        for _ in range(2):
            x.grad = None
            q(x).backward(torch.full((20000,), 1.1))
            grads.append(x.grad.clone())
        return grads

    a1, a2 = run(5)
    b1, _ = run(5)
    assert torch.equal(a1, b1)  # same seed, same stream
    assert not torch.equal(a1, a2)  # the stream advances between calls
    assert set(a1.unique().tolist()) == {1.0, 1.25}  # the two e5m2 neighbours of 1.1
    # E[SR(1.1)] = 1.1: P(up) = 0.4; 20000 draws give a standard error of about 0.0035 * 0.25.
    assert abs(a1.mean().item() - 1.1) < 0.005


def test_sr_default_stream_follows_torch_manual_seed():
    torch.manual_seed(1)
    a = Rounder("e4m3fn", "sr")(torch.full((500,), 1.01))
    torch.manual_seed(1)
    b = Rounder("e4m3fn", "sr")(torch.full((500,), 1.01))
    assert torch.equal(a, b)


def test_bad_arguments_raise_anynum_errors():
    with pytest.raises(an.AnynumError, match="unknown"):
        an.Quantizer(forward="e9m9x")
    with pytest.raises(an.AnynumError):
        an.Quantizer(forward="e4m3fn", forward_overflow="inf")
    with pytest.raises(an.AnynumError, match="rand_bits"):
        Rounder("bf16", "nearest", rand_bits=4)
    with pytest.raises(an.AnynumError, match="either"):
        Rounder("bf16", "sr", generator=torch.Generator(), seed=1)
    with pytest.raises(an.AnynumError):
        Rounder("bf16")(torch.arange(3))


def test_top_level_export():
    assert an.Quantizer is an.nn.Quantizer
    assert "Quantizer" in an.__all__
