"""QPyTorch / Qtorch+ number classes, each naming the anynum format it stands for.

The classes keep the peers' constructor arguments and attributes (``wl``,
``fl``, ``clamp``, ``symmetric``; ``exp``, ``man``; ``dim``; ``nsize``, ``es``,
``scale``), so code that builds or inspects them runs unchanged. Bad
parameters raise `anynum.errors.FormatError` (the peers use ``assert``). The
facade's quantizers read the attributes; `FloatingPoint.format` and friends give
the anynum format for use with `anynum.quantize` directly.

>>> from anynum.compat.qtorch import FloatingPoint, FixedPoint
>>> FloatingPoint(exp=5, man=10).format
FloatFormat(exp_bits=5, man_bits=10)
>>> FixedPoint(wl=8, fl=4).format          # wl counts the sign bit
FixedPoint(4, 4)
"""

from __future__ import annotations

import math

import anynum as an
from anynum.errors import FormatError

__all__ = ["BlockFloatingPoint", "FixedPoint", "FloatingPoint", "Number", "Posit"]


def _int(name: str, value: object, low: int, high: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):  # type: ignore[operator]
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise FormatError(f"{name} must be an integer {bound}, got {value!r}.")
    return value  # type: ignore[return-value]


class Number:
    """Base class of the number descriptions (QPyTorch ``qtorch.Number``)."""

    @property
    def format(self) -> an.Format:
        """The anynum format this number stands for."""
        raise NotImplementedError


class FixedPoint(Number):
    """Two's-complement fixed point: word length ``wl`` (sign included), ``fl`` fraction bits.

    Range ``[-2**(wl-fl-1), 2**(wl-fl-1) - 2**-fl]`` in steps of ``2**-fl``;
    ``clamp=False`` keeps the step but not the range; ``symmetric=True`` drops
    the most negative value. NaN stays NaN, ±inf saturates (clamp=True).

    >>> FixedPoint(8, 4)
    FixedPoint (wl=8, fl=4)
    """

    def __init__(self, wl: int, fl: int, clamp: bool = True, symmetric: bool = False) -> None:
        self.wl = _int("FixedPoint wl", wl, 1, 53)
        self.fl = _int("FixedPoint fl", fl, -1000)
        if not isinstance(clamp, bool) or not isinstance(symmetric, bool):
            raise FormatError(f"clamp and symmetric must be True or False, got {clamp!r}, {symmetric!r}.")
        self.clamp = clamp
        self.symmetric = symmetric

    @property
    def format(self) -> an.FixedPoint:
        return an.FixedPoint(self.wl - self.fl, self.fl)

    def __repr__(self) -> str:
        return f"FixedPoint (wl={self.wl:d}, fl={self.fl:d})"

    __str__ = __repr__


class FloatingPoint(Number):
    """A binary float with ``exp`` exponent bits and ``man`` stored fraction bits.

    The format is the IEEE-like one (IEEE bias, subnormals, ±inf and NaN in the
    top exponent field): ``FloatingPoint(5, 10)`` is binary16, max 65504.
    QPyTorch's own grid also uses the top binade for numbers (max 131008, no
    inf/NaN); that grid is ``an.FloatFormat(exp, man, specials="none")``. With
    ``exp=1`` there is no room for specials and the facade uses that grid.

    >>> FloatingPoint(8, 7).format == an.BF16
    True
    """

    def __init__(self, exp: int, man: int) -> None:
        self.exp = _int("FloatingPoint exp", exp, 1, 11)
        self.man = _int("FloatingPoint man", man, 0, 52)

    @property
    def format(self) -> an.FloatFormat:
        if self.exp == 1:
            return an.FloatFormat(1, self.man, specials="none")
        return an.FloatFormat(self.exp, self.man)

    def __repr__(self) -> str:
        return f"FloatingPoint (exponent={self.exp:d}, mantissa={self.man:d})"

    __str__ = __repr__


class BlockFloatingPoint(Number):
    """Block floating point: ``wl``-bit two's-complement elements sharing one exponent.

    ``dim=-1`` shares one exponent over the whole tensor; ``dim=d`` gives one
    exponent per index along dimension ``d`` (QPyTorch's convention, not the
    last axis). The shared exponent is ``floor(log2(max|x|))`` and the step
    ``2**(e + 2 - wl)``; elements are sign and magnitude, so the range is
    symmetric, ``±(2**(e + 1) - step)``: the element format is
    ``FixedPoint(2, wl - 2)`` without its most negative code, scaled by a power
    of two (E8M0). A block holding NaN or ±inf becomes NaN.

    >>> BlockFloatingPoint(8).format.element
    FixedPoint(2, 6)
    """

    def __init__(self, wl: int, dim: int = -1) -> None:
        self.wl = _int("BlockFloatingPoint wl", wl, 2, 53)
        self.dim = _int("BlockFloatingPoint dim", dim, -1)

    @property
    def format(self) -> an.Block:
        """The per-tensor Block (``dim=-1``); other dims are applied by `block_quantize`."""
        axis = None if self.dim == -1 else 1
        return an.Block(an.FixedPoint(2, self.wl - 2), None, axis=axis, symmetric=True)

    def __repr__(self) -> str:
        return f"BlockFloatingPoint (wl={self.wl:d}, dim={self.dim:d})"

    __str__ = __repr__


class Posit(Number):
    """Qtorch+ posit(``nsize``, ``es``) with ``scale``: x is rounded as ``x * scale`` and divided back.

    Any ``nsize`` in 2..32 and ``es`` in 0..9 (Qtorch+ stops at 16 bits and es
    1..3). A power-of-two scale is exact (``an.Posit(n, es, scale_exp=log2(scale))``).
    ±inf and NaN become NaR, which reads back as NaN.

    >>> Posit(8, 1).format
    Posit(8, 1)
    >>> Posit(8, 1, scale=4.0).format.scale_exp
    2
    """

    def __init__(self, nsize: int, es: int, scale: float = 1.0) -> None:
        self.nsize = _int("Posit nsize", nsize, 2, 32)
        self.es = _int("Posit es", es, 0, 9)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
            raise FormatError(f"Posit scale must be a positive finite number, got {scale!r}.")
        self.scale = scale

    @property
    def scale_exp(self) -> int | None:
        """log2(scale) when the scale is a power of two (rounding is then exact), else None."""
        mantissa, exponent = math.frexp(float(self.scale))
        return exponent - 1 if mantissa == 0.5 else None

    @property
    def format(self) -> an.Posit:
        k = self.scale_exp
        if k is None:
            raise FormatError(
                f"scale={self.scale!r} is not a power of two, so no single posit format holds "
                "x * scale / scale; posit_quantize applies it in float64 instead."
            )
        return an.Posit(self.nsize, self.es, scale_exp=k)

    def __repr__(self) -> str:
        return f"Posit (exponent={self.es:d}, wordlength={self.nsize:d}, scale={self.scale})"

    __str__ = __repr__
