"""The converted layer's weight attribute: the fast getter agrees with torch's parametrization."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

import anynum as an
from anynum.nn.hooks import WeightQuantization


def _layer(rounding: str = "nearest") -> nn.Linear:
    torch.manual_seed(0)
    return an.nn.convert(nn.Linear(5, 3), an.nn.Policy(weight=("e4m3fn", rounding), seed=4))


def _torch_value(m: nn.Module) -> torch.Tensor:
    """What torch's own parametrization computes: the list module called as torch calls it."""
    return m.parametrizations.weight()


def test_fast_getter_gives_torchs_value_and_gradient() -> None:
    m = _layer()
    w = m.weight
    ref = _torch_value(m)
    assert torch.equal(w, ref)
    assert torch.equal(w, an.quantize(m.parametrizations.weight.original.detach(), an.E4M3FN))
    w.sum().backward()  # straight-through: every element's gradient reaches the stored original
    assert torch.equal(m.parametrizations.weight.original.grad, torch.ones(3, 5))


def test_stochastic_weights_draw_the_same_stream_as_torchs_getter() -> None:
    a, b = _layer("sr"), _layer("sr")
    for _ in range(3):
        assert torch.equal(a.weight, _torch_value(b))


def test_cached_parametrizations_are_computed_once() -> None:
    m = _layer("sr")
    with parametrize.cached():
        first = m.weight
        assert m.weight is first  # torch's cache answers: our getter handed over
    assert m.weight is not first


def test_a_second_parametrization_on_top_is_applied() -> None:
    m = _layer()

    class Double(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    parametrize.register_parametrization(m, "weight", Double())
    q = an.quantize(m.parametrizations.weight.original.detach(), an.E4M3FN)
    assert torch.equal(m.weight, 2 * q)


def test_hooks_on_the_parametrization_are_called() -> None:
    m = _layer()
    calls: list[int] = []
    quant = m.parametrizations.weight[0]
    assert isinstance(quant, WeightQuantization)
    handle = quant.register_forward_hook(lambda mod, args, out: calls.append(1))
    _ = m.weight
    handle.remove()
    _ = m.weight
    assert calls == [1]
    seen: list[int] = []
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(1))
    try:
        _ = m.weight
    finally:
        handle.remove()
    assert seen  # the global hook saw the parametrization modules


def test_restore_removes_the_getter() -> None:
    m = _layer()
    original = m.parametrizations.weight.original
    an.nn.restore(m)
    assert type(m) is nn.Linear and m.weight is original
