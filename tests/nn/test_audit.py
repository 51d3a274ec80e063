"""audit finds leaks that are injected on purpose, and nothing on a clean quantized run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import anynum as an

# Eager kernels: in auto mode, training loops here would reach ANYNUM_COMPILE_MIN elements per
# kernel and compile it (routing: tests/nn/test_quantizer.py; fused = eager: tests/kernels).
pytestmark = pytest.mark.usefixtures("eager_only")


def setup():
    torch.manual_seed(0)
    m = an.nn.convert(
        nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)),
        an.nn.Policy(weight="e4m3fn", bias="bf16", buffer="bf16"),
    )
    opt = an.optim.QuantizedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        weight="e4m3fn",
        momentum="bf16",
        accumulator="fp16",
    )
    return m, opt


def step(m, opt):
    opt.zero_grad()
    m(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()


def test_clean_after_every_step():
    m, opt = setup()
    for _ in range(3):
        step(m, opt)
        assert an.nn.audit(m, optimizer=opt) == []


def test_injected_leaks_are_reported():
    m, opt = setup()
    step(m, opt)
    with torch.no_grad():
        m[0].parametrizations.weight.original[0, 0] = 0.1  # not an e4m3fn value
        m[1].running_mean[3] = 1 / 3
        w = m[2].parametrizations.weight.original
        opt.state[w]["momentum_buffer"][0, 0] = 1e-3 + 2**-20
    leaks = {leak.name: leak for leak in an.nn.audit(m, optimizer=opt)}
    assert set(leaks) == {"0.weight", "1.running_mean", "param[0]", "state[4].momentum_buffer"}
    assert leaks["0.weight"].count == 1 and leaks["0.weight"].example == float(torch.tensor(0.1))
    assert "e4m3fn" in str(leaks["0.weight"])


def test_audit_against_a_declared_policy_of_an_unconverted_model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3))
    leaks = an.nn.audit(m, an.nn.Policy(weight="bf16"))
    assert {leak.name for leak in leaks} == {"0.weight", "0.bias"}
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.bfloat16().float())
    assert an.nn.audit(m, an.nn.Policy(weight="bf16")) == []
    with torch.no_grad():
        m[0].weight[0, 0] = float("inf")  # bf16 has inf: on the grid
    assert an.nn.audit(m, an.nn.Policy(weight="bf16")) == []
    assert [leak.name for leak in an.nn.audit(m, an.nn.Policy(weight="e4m3fn", bias=None))] == ["0.weight"]
