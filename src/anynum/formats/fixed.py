"""Uniform grids: two's-complement fixed point and plain integers.

Both are integer codes times a power-of-two step; `FixedPoint` counts the sign
bit in ``int_bits`` (QPyTorch ``FixedPoint(wl, fl)`` is ``FixedPoint(wl - fl, fl)``).
Scale/zero-point integer quantization (per tensor or per channel) is in
`anynum.quantize.quantize_int`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from anynum.errors import FormatError
from anynum.formats.base import Format

__all__ = ["FixedPoint", "IntFormat", "UniformFormat"]

_MAX_CODE_BITS = 53  # codes must be exact integers in float64


@dataclass(frozen=True)
class UniformFormat(Format):
    """Common part of fixed point and integers: codes in [code_min, code_max] times 2**step_exp."""

    overflow_policies: ClassVar[tuple[str, ...]] = ("saturate", "wrap")

    @property
    def step_exp(self) -> int:
        raise NotImplementedError

    @property
    def code_min(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def code_max(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def step(self) -> float:
        return math.ldexp(1.0, self.step_exp)

    @property
    def max(self) -> float:
        return math.ldexp(float(self.code_max), self.step_exp)

    @property
    def min(self) -> float:
        """Most negative value (0 for unsigned)."""
        return math.ldexp(float(self.code_min), self.step_exp)

    @property
    def smallest_normal(self) -> float:
        return self.step

    @property
    def smallest_subnormal(self) -> float:
        return self.step

    @property
    def eps(self) -> float:
        return self.step

    @property
    def emin(self) -> int:
        return self.step_exp

    @property
    def precision(self) -> int:
        return self.bits - int(self.signed)

    def _check_width(self) -> None:
        if not 1 <= self.bits <= _MAX_CODE_BITS:
            raise FormatError(
                f"{type(self).__name__} needs 1..{_MAX_CODE_BITS} bits in all, got {self.bits} "
                "(codes must be exact integers in float64)."
            )
        if not -1000 <= self.step_exp <= 960:
            raise FormatError(f"the step 2**{self.step_exp} is outside float64's exact range.")

    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.to(torch.int64)
        if self.signed:  # reinterpret the low `bits` bits as two's complement
            sign = 1 << (self.bits - 1)
            codes = ((codes & ((1 << self.bits) - 1)) ^ sign) - sign
        return codes.to(torch.float64) * self.step

    def encode_kernel(self, y: torch.Tensor) -> torch.Tensor:
        codes = (torch.where(y != y, 0.0, y) / self.step).to(torch.int64)  # exact: y is on the grid
        return torch.where(y != y, -1, codes & ((1 << self.bits) - 1))  # -1: NaN has no code


@dataclass(frozen=True)
class FixedPoint(UniformFormat):
    """Fixed point with ``int_bits`` integer bits (sign included when signed) and ``frac_bits`` fraction bits.

    Range [-2**(int_bits-1), 2**(int_bits-1) - 2**-frac_bits] in steps of
    2**-frac_bits. ``overflow`` is the default policy: "saturate" (clamp) or
    "wrap" (two's-complement wrap-around). NaN passes through `quantize`
    unchanged (there is no NaN code, so `encode` rejects it); ±inf saturates,
    and becomes NaN under "wrap".

    >>> import anynum as an
    >>> fx = an.FixedPoint(4, 3)          # QPyTorch FixedPoint(wl=7, fl=3)
    >>> fx.max, fx.step
    (7.875, 0.125)
    >>> an.quantize(torch.tensor([0.3, 100.0, -100.0]), fx).tolist()
    [0.25, 7.875, -8.0]
    """

    int_bits: int
    frac_bits: int
    signed: bool = True  # type: ignore[assignment]
    overflow: str = "saturate"

    def __post_init__(self) -> None:
        if not isinstance(self.int_bits, int) or not isinstance(self.frac_bits, int):
            raise FormatError(
                f"FixedPoint needs integer int_bits and frac_bits, got {self.int_bits!r}, {self.frac_bits!r}."
            )
        if self.overflow not in self.overflow_policies:
            raise FormatError(
                f"FixedPoint overflow must be one of {self.overflow_policies}, got {self.overflow!r}."
            )
        self._check_width()

    @property
    def bits(self) -> int:
        return self.int_bits + self.frac_bits

    @property
    def step_exp(self) -> int:
        return -self.frac_bits

    @property
    def default_overflow(self) -> str:
        return self.overflow

    def __repr__(self) -> str:
        if self.name:
            return self.name
        extra = "" if self.signed else ", signed=False"
        extra += "" if self.overflow == "saturate" else f", overflow={self.overflow!r}"
        return f"FixedPoint({self.int_bits}, {self.frac_bits}{extra})"


@dataclass(frozen=True)
class IntFormat(UniformFormat):
    """Integers of ``bits`` bits, two's complement when signed (step 1).

    Used directly, `quantize` rounds to integers and saturates (or wraps with
    ``overflow="wrap"``); unsigned formats clamp negative inputs to 0. For
    scale/zero-point quantization see `anynum.quantize_int`.

    >>> import anynum as an
    >>> an.quantize(torch.tensor([2.5, 3.5, 300.0, -300.0]), an.IntFormat(8)).tolist()
    [2.0, 4.0, 127.0, -128.0]
    """

    bits: int = 8  # type: ignore[assignment]
    signed: bool = True  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool):
            raise FormatError(f"IntFormat bits must be an integer, got {self.bits!r}.")
        self._check_width()

    @property
    def step_exp(self) -> int:
        return 0

    def __repr__(self) -> str:
        if self.name:
            return self.name
        return f"IntFormat({self.bits}{'' if self.signed else ', signed=False'})"
