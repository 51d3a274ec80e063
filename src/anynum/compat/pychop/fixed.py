"""Pychop's fixed-point chopper ``Chopf(ibits, fbits, rmode)`` on `anynum.FixedPoint`.

``ibits`` counts the sign bit: the range is ``[-2**(ibits-1), 2**(ibits-1) -
2**-fbits]`` in steps of ``2**-fbits``, i.e. ``anynum.FixedPoint(ibits, fbits)``.
Values beyond the range and ±inf saturate (-inf to the most negative value,
not one step above it as in Pychop), NaN stays NaN, and a zero result keeps
the input's sign. Every rmode 0..10 works (Pychop's Chopf has 1..6). Stochastic
modes draw one seed per call from torch's default generator, unless
``random_state=`` gives the chopper its own stream. Any array kind, on any call
order (Pychop's Chopf binds to the first backend it sees).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import anynum as an
from anynum.compat.pychop.arrays import as_float, kind, namespace
from anynum.compat.pychop.chop import round_array
from anynum.compat.pychop.math import MathMethods
from anynum.compat.pychop.rmodes import parse_rmode
from anynum.compat.straight import straight_through

__all__ = ["Chopf", "round_fixed"]


def round_fixed(x: Any, fmt: an.Format, mode: Any, generator: Any) -> Any:
    """`round_array` onto a two's-complement grid, with zero results taking x's sign.

    >>> round_fixed(np.array([-0.01, 0.3]), an.FixedPoint(4, 2), an.Rounding.NEAREST_EVEN, None).tolist()
    [-0.0, 0.25]
    """
    if kind(x) == "torch":
        with torch.no_grad():
            y = torch.copysign(round_array(x.detach(), fmt, mode, generator), x.detach())
        return straight_through(x, y)
    return namespace(x).copysign(round_array(x, fmt, mode, generator), x)


class Chopf(MathMethods):
    """Fixed point with ``ibits`` integer bits (sign included) and ``fbits`` fraction bits.

    >>> ch = Chopf(ibits=4, fbits=4)
    >>> ch(np.array([0.3, 100.0, -np.inf, np.nan])).tolist()
    [0.3125, 7.9375, -8.0, nan]
    >>> ch.get_format_info()["range"]
    (-8.0, 7.9375)
    """

    def __init__(
        self, ibits: int = 4, fbits: int = 4, rmode: Any = 1, *, random_state: int | None = None
    ) -> None:
        self.fmt = an.FixedPoint(ibits, fbits)
        self.ibits, self.fbits = ibits, fbits
        self.total_bits = ibits + fbits
        self.max_value, self.min_value, self.resolution = self.fmt.max, self.fmt.min, self.fmt.step
        self.rmode, self.mode = parse_rmode(rmode)
        self.random_state = random_state
        self._rng = None if random_state is None else np.random.default_rng(random_state)

    def format_for(self, x: Any) -> an.FixedPoint:
        """The format (the same for every input)."""
        return self.fmt

    @property
    def generator(self) -> np.random.Generator:
        """The stream of stochastic modes: the chopper's own, or one seeded from torch's default generator."""
        if self._rng is not None:
            return self._rng
        return np.random.default_rng(int(torch.randint(0, 2**62, (1,))))

    def quantize(self, x: Any) -> Any:
        """Round `x` onto the fixed-point grid (same array kind and dtype)."""
        stochastic = isinstance(self.mode, an.Rounding) and self.mode.is_stochastic
        return round_fixed(as_float(x), self.fmt, self.mode, self.generator if stochastic else None)

    def __call__(self, x: Any) -> Any:
        return self.quantize(x)

    def get_format_info(self) -> dict[str, Any]:
        """Pychop's summary: format name, total bits, range and resolution."""
        return {
            "format": f"Q{self.ibits}.{self.fbits}",
            "total_bits": self.total_bits,
            "range": (self.min_value, self.max_value),
            "resolution": self.resolution,
        }

    def __repr__(self) -> str:
        return f"Chopf(ibits={self.ibits}, fbits={self.fbits}, rmode={self.rmode})"
