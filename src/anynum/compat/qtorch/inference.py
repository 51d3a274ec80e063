"""Qtorch+'s hook-based inference preparation (its paper's ``prepare_model``, Listing 2).

Weights of the convolution and linear layers are rounded once to a low
format and their inputs rounded by forward pre-hooks; every other layer with
a weight gets a higher "other" format; layers whose running index is in
`excluded` are treated as "other" layers (the Qtorch+ "skip the first and
last layers" setting). The model definition is not edited. For the same
effect through anynum's own API (reversible with `anynum.nn.restore`) see
`anynum.nn.post_quantize` and ``Policy(skip_first_last=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from anynum.compat.qtorch.number import Number
from anynum.compat.qtorch.quant.module import quantize_number
from anynum.errors import InputError

__all__ = ["prepare_model"]

Quant = Number | Callable[[torch.Tensor], torch.Tensor] | None


class _Round:
    """A tensor -> tensor function from a number (round to nearest) or a user function (kept)."""

    def __init__(self, quant: Quant, role: str) -> None:
        if quant is not None and not isinstance(quant, Number) and not callable(quant):
            raise InputError(
                f"{role} must be a qtorch number (e.g. Posit(6, 1)), a function, or None; got {quant!r}."
            )
        self.quant = quant

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if self.quant is None:
            return t
        if isinstance(self.quant, Number):
            return quantize_number(t, self.quant, "nearest")
        return self.quant(t)


class _InputHook:
    """Forward pre-hook rounding a layer's first input (a class, so that the model stays picklable)."""

    def __init__(self, fn: _Round) -> None:
        self.fn = fn

    def __call__(self, module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].is_floating_point():
            return (self.fn(inputs[0]), *inputs[1:])
        return inputs


def prepare_model(
    model: nn.Module,
    linear_weight: Quant = None,
    linear_activation: Quant = None,
    other_weight: Quant = None,
    other_activation: Quant = None,
    excluded: Iterable[int] = (),
    linear_layers: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear),
) -> nn.Module:
    """Prepare `model` in place for low-precision inference; returns it.

    Layers with a ``weight`` are counted in ``named_modules()`` order (0, 1, ...).
    A `linear_layers` layer whose index is not in `excluded` gets `linear_weight`
    on its weight and `linear_activation` on its input; every other layer with a
    weight (including excluded ones) gets `other_weight` and `other_activation`.
    Each may be a number (rounded to nearest) or a function, as in the listing.

    >>> from anynum.compat.qtorch import Posit
    >>> m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> _ = prepare_model(m, Posit(6, 1), Posit(6, 1), Posit(16, 1), Posit(16, 1), excluded=[0])
    >>> bool((m[2].weight == quantize_number(m[2].weight, Posit(6, 1), "nearest")).all())
    True
    """
    lw, la = _Round(linear_weight, "linear_weight"), _Round(linear_activation, "linear_activation")
    ow, oa = _Round(other_weight, "other_weight"), _Round(other_activation, "other_activation")
    skip = set(excluded)
    index = 0
    with torch.no_grad():
        for _, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.Tensor):
                continue
            linear = isinstance(module, linear_layers) and index not in skip
            w_fn, a_fn = (lw, la) if linear else (ow, oa)
            weight.data = w_fn(weight.data)
            module.register_forward_pre_hook(_InputHook(a_fn))
            index += 1
    return model
