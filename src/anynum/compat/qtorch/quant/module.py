"""QPyTorch's ``quantizer`` function and ``Quantizer`` module: numbers forward, errors backward.

Both round activations in the forward pass and their gradients ("errors") in
the backward pass, each with its own number and rounding, through the facade's
quantizers (so on anynum's kernels). Unlike QPyTorch's, they pickle and
deepcopy (no local classes), apply ``backward_hooks`` in every configuration,
and their stochastic rounding follows ``torch.manual_seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import anynum as an
from anynum.compat.qtorch.number import BlockFloatingPoint, FixedPoint, FloatingPoint, Number, Posit
from anynum.compat.qtorch.quant.functions import block_quantize, fixed_point_quantize, float_quantize
from anynum.compat.qtorch.quant.plus import posit_quantize
from anynum.errors import InputError

__all__ = ["Quantizer", "quantize_number", "quantizer"]


def quantize_number(x: torch.Tensor, number: Number, rounding: str = "stochastic") -> torch.Tensor:
    """Round `x` onto any facade number (what `quantizer` and `Quantizer` call).

    >>> quantize_number(torch.tensor([0.3]), FloatingPoint(4, 3), "nearest").tolist()
    [0.3125]
    """
    if isinstance(number, FloatingPoint):
        return float_quantize(x, number.exp, number.man, rounding)
    if isinstance(number, FixedPoint):
        return fixed_point_quantize(x, number.wl, number.fl, number.clamp, number.symmetric, rounding)
    if isinstance(number, BlockFloatingPoint):
        return block_quantize(x, number.wl, number.dim, rounding)
    if isinstance(number, Posit):
        return posit_quantize(x, number.nsize, number.es, number.scale, rounding)
    raise InputError(
        "a number must be FloatingPoint, FixedPoint, BlockFloatingPoint or Posit from "
        f"anynum.compat.qtorch, got {number!r}."
    )


def _check_number(number: Any, role: str) -> None:
    if number is not None and not isinstance(number, Number):
        raise InputError(
            f"{role} must be a qtorch number (FloatingPoint, FixedPoint, ...) or None, got {number!r}."
        )


class _Rounding(torch.autograd.Function):
    """Forward: round x (and remember which values the fixed-point clamp moved). Backward: round the error."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, q: _Quantize) -> torch.Tensor:  # type: ignore[override]
        ctx.q = q
        if q.clamping_grad_zero and isinstance(q.forward_number, FixedPoint):
            fmt = q.forward_number.format
            low = -fmt.max if q.forward_number.symmetric else fmt.min
            ctx.save_for_backward((x > fmt.max) | (x < low))
        if q.forward_number is None:
            return x.view_as(x)
        return quantize_number(x.detach(), q.forward_number, q.forward_rounding)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        q: _Quantize = ctx.q
        for hook in q.backward_hooks:
            grad = hook(grad)
        if q.backward_number is not None:
            grad = quantize_number(grad, q.backward_number, q.backward_rounding)
        if ctx.saved_tensors:
            grad = grad.masked_fill(ctx.saved_tensors[0], 0.0)
        return grad, None


class _Quantize:
    """The function `quantizer` returns: a picklable callable holding its configuration."""

    def __init__(
        self,
        forward_number: Number | None,
        backward_number: Number | None,
        forward_rounding: str,
        backward_rounding: str,
        clamping_grad_zero: bool,
        backward_hooks: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    ) -> None:
        _check_number(forward_number, "forward_number")
        _check_number(backward_number, "backward_number")
        if clamping_grad_zero and not isinstance(forward_number, (FixedPoint, type(None))):
            raise InputError("clamping_grad_zero=True works with a FixedPoint forward_number only.")
        if clamping_grad_zero and isinstance(forward_number, FixedPoint) and not forward_number.clamp:
            raise InputError("clamping_grad_zero=True needs a FixedPoint with clamp=True.")
        for r in (forward_rounding, backward_rounding):
            quantize_rounding_check(r)
        self.forward_number = forward_number
        self.backward_number = backward_number
        self.forward_rounding = forward_rounding
        self.backward_rounding = backward_rounding
        self.clamping_grad_zero = clamping_grad_zero
        self.backward_hooks = list(backward_hooks)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.backward_number is None and not self.backward_hooks and not self.clamping_grad_zero:
            # No backward rounding: the quantizers' own straight-through gradient is the answer.
            return (
                x
                if self.forward_number is None
                else quantize_number(x, self.forward_number, self.forward_rounding)
            )
        return _Rounding.apply(x, self)

    def __repr__(self) -> str:
        return (
            f"quantizer(forward={self.forward_number}, backward={self.backward_number}, "
            f"forward_rounding={self.forward_rounding!r}, backward_rounding={self.backward_rounding!r})"
        )


def quantize_rounding_check(rounding: Any) -> None:
    """Raise a clear error for a rounding name neither QPyTorch nor anynum knows.

    QPyTorch takes "nearest" and "stochastic"; the facade also takes every
    `anynum.Rounding` alias ("rz", "ru", "rna", ...).

    >>> quantize_rounding_check("stochastic")
    """
    an.Rounding.parse(rounding)


def quantizer(
    forward_number: Number | None = None,
    backward_number: Number | None = None,
    forward_rounding: str = "stochastic",
    backward_rounding: str = "stochastic",
    clamping_grad_zero: bool = False,
    backward_hooks: Sequence[Callable[[torch.Tensor], torch.Tensor]] = (),
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function rounding its input to `forward_number` and its gradient to `backward_number`.

    None leaves that direction unchanged. ``clamping_grad_zero`` (FixedPoint
    forward numbers) zeroes the gradient of values the forward clamp moved;
    ``backward_hooks`` are applied to the gradient before it is rounded.

    >>> from anynum.compat.qtorch import FloatingPoint
    >>> q = quantizer(FloatingPoint(4, 3), FloatingPoint(5, 2), "nearest", "nearest")
    >>> x = torch.tensor([0.3, 3.3], requires_grad=True)
    >>> y = q(x); y.detach().tolist()
    [0.3125, 3.25]
    >>> y.backward(torch.tensor([0.1, 1000.0])); x.grad.tolist()
    [0.09375, 1024.0]
    """
    return _Quantize(
        forward_number,
        backward_number,
        forward_rounding,
        backward_rounding,
        clamping_grad_zero,
        backward_hooks,
    )


class Quantizer(nn.Module):
    """Module form of `quantizer` (QPyTorch ``Quantizer``): put it between layers.

    It has no parameters or buffers, so models using it save and load as usual,
    and it pickles.

    >>> from anynum.compat.qtorch import FixedPoint
    >>> q = Quantizer(forward_number=FixedPoint(8, 4), forward_rounding="nearest")
    >>> q(torch.tensor([0.3, 100.0])).tolist()
    [0.3125, 7.9375]
    """

    def __init__(
        self,
        forward_number: Number | None = None,
        backward_number: Number | None = None,
        forward_rounding: str = "stochastic",
        backward_rounding: str = "stochastic",
    ) -> None:
        super().__init__()
        self.quantize = quantizer(forward_number, backward_number, forward_rounding, backward_rounding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantize(x)

    def extra_repr(self) -> str:
        q = self.quantize
        assert isinstance(q, _Quantize)
        return (
            f"forward_number={q.forward_number}, backward_number={q.backward_number}, "
            f"forward_rounding={q.forward_rounding!r}, backward_rounding={q.backward_rounding!r}"
        )
