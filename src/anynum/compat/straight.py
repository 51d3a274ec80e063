"""The straight-through estimator for facade results built from several anynum calls.

`anynum.quantize` already passes gradients straight through; a facade that
post-processes its result (a clamp, a reshape across blocks, a scale applied in
float64) computes the values without autograd and attaches them here, so the
peers' quantizers train the same way whatever their internals.

>>> import torch
>>> x = torch.tensor([0.3, 2.0], requires_grad=True)
>>> y = straight_through(x, torch.tensor([0.25, 2.0]))
>>> y.sum().backward(); x.grad.tolist()
[1.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["straight_through"]


class _Straight(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


def straight_through(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`y`'s values with `x`'s gradient passed through unchanged (y computed without autograd)."""
    if x.requires_grad and torch.is_grad_enabled():
        return _Straight.apply(x, y.detach())
    return y
