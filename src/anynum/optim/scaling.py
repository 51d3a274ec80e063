"""Loss scaling: a static factor (Qtorch+ ``grad_scaling``) or dynamic overflow-skip-and-backoff (AMP).

Overflow is judged against the gradient format's own range, not only by
inf/NaN, so formats that saturate instead of overflowing (posits, OCP FP8
"fn" formats) back off too: a scaled gradient at or beyond the format's
largest value would have been clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from anynum.errors import AnynumError

__all__ = ["DynamicLossScale", "LossScale", "StaticLossScale", "make_loss_scale"]


class LossScale:
    """The current scale and how it reacts to overflow."""

    scale: float = 1.0
    dynamic: bool = False

    def update(self, overflow: bool) -> None:
        """Record one step's outcome."""

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])


class StaticLossScale(LossScale):
    """A fixed scale; overflowing steps are still applied (as with Qtorch+)."""

    def __init__(self, scale: float) -> None:
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise AnynumError(f"grad_scale must be a positive finite number, got {scale!r}.")
        self.scale = float(scale)


@dataclass
class DynamicLossScale(LossScale):
    """AMP-style scaling: skip a step that overflows and multiply the scale by `backoff`;
    after `interval` clean steps multiply it by `growth`. Scales stay powers of two
    when `init`, `growth` and `backoff` are, so unscaling float gradients is exact.

    >>> s = DynamicLossScale(init=8.0, interval=2)
    >>> s.update(True); s.scale
    4.0
    >>> s.update(False); s.update(False); s.scale
    8.0
    """

    init: float = 2.0**16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24

    def __post_init__(self) -> None:
        if not (self.init > 0 and self.growth >= 1 and 0 < self.backoff < 1 and self.interval >= 1):
            raise AnynumError(
                "DynamicLossScale needs init > 0, growth >= 1, 0 < backoff < 1 and interval >= 1; "
                f"got init={self.init}, growth={self.growth}, backoff={self.backoff}, "
                f"interval={self.interval}."
            )
        self.scale = float(self.init)
        self.dynamic = True
        self.clean_steps = 0
        self.skipped = 0

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale = max(self.scale * self.backoff, self.min_scale)
            self.clean_steps = 0
            self.skipped += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.interval:
            self.scale = min(self.scale * self.growth, self.max_scale)
            self.clean_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state.get("clean_steps", 0))
        self.skipped = int(state.get("skipped", 0))


def make_loss_scale(grad_scale: float | str | LossScale) -> LossScale:
    """``1.0``/a number: static; ``"dynamic"``: `DynamicLossScale()`; a LossScale passes through."""
    if isinstance(grad_scale, LossScale):
        return grad_scale
    if grad_scale == "dynamic":
        return DynamicLossScale()
    if isinstance(grad_scale, str):
        raise AnynumError(f"grad_scale must be a number, 'dynamic' or a LossScale, got {grad_scale!r}.")
    return StaticLossScale(grad_scale)
