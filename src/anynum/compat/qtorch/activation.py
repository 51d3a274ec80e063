"""Qtorch+'s posit tanh modules: the bit-trick tanh forward, the exact tanh derivative backward.

>>> import torch
>>> PositTanhModule()(torch.tensor([0.0, 1.0])).tolist()
[0.0, 0.75]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anynum.compat.qtorch.quant.plus import posit_tanh, posit_tanh_enhanced

__all__ = ["PositTanhModule", "PositTanhModuleEnhanced", "RefTanhModule"]


class _PositTanh(torch.autograd.Function):
    """Forward: Qtorch+'s posit(16, 0) tanh; backward: ``grad * (1 - out**2)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, enhanced: bool) -> torch.Tensor:  # type: ignore[override]
        fn = posit_tanh_enhanced if enhanced else posit_tanh
        out = fn(x.detach(), nsize=16, es=0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (out,) = ctx.saved_tensors
        return grad * (1 - out * out), None


class PositTanhModule(nn.Module):
    """tanh through the posit(16, 0) sigmoid trick (Qtorch+ ``PositTanhModule``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _PositTanh.apply(input, False)


class PositTanhModuleEnhanced(nn.Module):
    """`PositTanhModule` with Qtorch+'s correction near ±1 (``posit_tanh_enhanced``).

    >>> PositTanhModuleEnhanced()(torch.tensor([5.0])).tolist()
    [1.0]
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _PositTanh.apply(input, True)


class RefTanhModule(nn.Module):
    """Plain ``torch.tanh``, the reference Qtorch+ compares its posit tanh with.

    >>> RefTanhModule()(torch.tensor([0.0])).tolist()
    [0.0]
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.tanh(input)
