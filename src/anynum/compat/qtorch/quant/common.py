"""Helpers shared by the qtorch facade's quantizers: seeds, input checks, scales."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import anynum as an
from anynum.compat.straight import straight_through
from anynum.errors import InputError

__all__ = ["PRECISION", "as_tensor", "draw_seed", "scaled"]

#: Significand bits (hidden bit included) of each torch float dtype.
PRECISION = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def draw_seed(rounding: Any) -> int | None:
    """A fresh seed from torch's default generator for a stochastic mode, else None.

    >>> _ = torch.manual_seed(0); a = draw_seed("stochastic")
    >>> _ = torch.manual_seed(0); a == draw_seed("stochastic"), draw_seed("nearest")
    (True, None)
    """
    if an.Rounding.parse(rounding).is_stochastic:
        return int(torch.randint(0, 2**62, (1,)))
    return None


def as_tensor(x: Any, name: str) -> torch.Tensor:
    """`x` itself if it is a torch tensor, else an InputError naming the function `name`.

    >>> as_tensor(torch.ones(1), "f").tolist()
    [1.0]
    """
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{name} takes a torch tensor (as QPyTorch does), got {type(x).__name__}; "
            "for NumPy/JAX arrays use anynum.quantize or anynum.compat.pychop."
        )
    return x


def scaled(x: torch.Tensor, scale: float, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``fn(x * scale) / scale`` in float64, rounded once to x's dtype (Qtorch+'s ``scale=``).

    The scale is read as a float32, as Qtorch+ does, so ``x * scale`` is exact for
    inputs up to float32. Gradients pass straight through.

    >>> scaled(torch.tensor([0.3]), 3.0, torch.round).tolist()
    [0.3333333432674408]
    """
    s = float(torch.tensor(float(scale), dtype=torch.float32))
    with torch.no_grad():
        y = (fn(x.detach().to(torch.float64) * s) / s).to(x.dtype)
    return straight_through(x, y)
