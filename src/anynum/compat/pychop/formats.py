"""Pychop's format names, ``Customs``, ``Options`` and ``float_params``, as anynum formats.

``prec`` names (MATLAB chop / Pychop): 'q43'/'fp8-e4m3' (IEEE-like e4m3, max
240), 'q52'/'fp8-e5m2', 'b'/'bfloat16'/'bf16', 't'/'tf32', 'h'/'half'/'fp16',
's'/'single'/'fp32', 'd'/'double'/'fp64'. Every one is an IEEE-style
`anynum.FloatFormat` (inf and NaN in the top exponent field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import anynum as an
from anynum.errors import FormatError

__all__ = ["PRECISIONS", "Customs", "Options", "float_format", "float_params", "prec_format"]

#: prec name -> (exponent bits, stored fraction bits)
PRECISIONS: dict[str, tuple[int, int]] = {
    "q43": (4, 3),
    "fp8-e4m3": (4, 3),
    "q52": (5, 2),
    "fp8-e5m2": (5, 2),
    "b": (8, 7),
    "bfloat16": (8, 7),
    "bf16": (8, 7),
    "t": (8, 10),
    "tf32": (8, 10),
    "h": (5, 10),
    "half": (5, 10),
    "fp16": (5, 10),
    "s": (8, 23),
    "single": (8, 23),
    "fp32": (8, 23),
    "d": (11, 52),
    "double": (11, 52),
    "fp64": (11, 52),
}


@dataclass
class Customs:
    """A custom float for ``FaultChop(customs=...)`` / ``Chop(customs=...)``.

    Give ``exp_bits`` and ``sig_bits`` (stored fraction bits), or ``t``
    (significand bits with the hidden one) and ``emax`` (largest exponent; the
    format has IEEE layout, so ``emax + 1`` must be a power of two).

    >>> float_format(Customs(exp_bits=5, sig_bits=10)) == float_format(Customs(emax=15, t=11))
    True
    """

    emax: int | None = None
    t: int | None = None
    exp_bits: int | None = None
    sig_bits: int | None = None


@dataclass
class Options:
    """The settings of a chop object, as ``chop.options()`` returns them (MATLAB chop's ``options``)."""

    t: int
    emax: int
    prec: str | None
    subnormal: bool
    rmode: int
    flip: bool
    explim: bool
    p: float


def float_format(customs: Customs, subnormal: bool = True) -> an.FloatFormat:
    """The IEEE-style `anynum.FloatFormat` a `Customs` describes."""
    if customs.exp_bits is not None and customs.sig_bits is not None:
        return an.FloatFormat(customs.exp_bits, customs.sig_bits, subnormals=subnormal)
    if customs.t is None or customs.emax is None:
        raise FormatError(f"Customs needs exp_bits and sig_bits, or t and emax; got {customs!r}.")
    exp_bits = math.log2(customs.emax + 1) + 1 if customs.emax > 0 else 0.5
    if exp_bits != int(exp_bits):
        raise FormatError(
            f"Customs(emax={customs.emax}) has no IEEE layout: emax + 1 must be a power of two "
            "(emax = 2**(exp_bits - 1) - 1), e.g. 7, 15, 127. Use an.FloatFormat(exp_bits, man_bits, "
            "bias=...) with anynum.quantize for other exponent ranges."
        )
    return an.FloatFormat(int(exp_bits), customs.t - 1, subnormals=subnormal)


def prec_format(prec: str, subnormal: bool = True) -> an.FloatFormat:
    """The format of a Pychop ``prec`` name.

    >>> prec_format("q43").max, prec_format("h") == an.FP16
    (240.0, True)
    """
    key = prec.strip().lower() if isinstance(prec, str) else prec
    if key not in PRECISIONS:
        hint = (
            " ('q', quadruple precision, exceeds float64's exponent range)" if key in ("q", "fp128") else ""
        )
        raise FormatError(f"unknown prec {prec!r}{hint}; choose from {sorted(PRECISIONS)} or pass customs=.")
    e, m = PRECISIONS[key]
    return an.FloatFormat(e, m, subnormals=subnormal)


def _params(fmt: an.FloatFormat) -> tuple[float, float, float, float, int, int, int, int]:
    emins = fmt.emin + 1 - fmt.precision
    return (
        fmt.eps / 2,
        fmt.smallest_subnormal,
        fmt.smallest_normal,
        fmt.max,
        fmt.precision,
        emins,
        fmt.emin,
        fmt.emax,
    )


def float_params(prec: str | None = None, binary: bool = False, *argv: object) -> object:
    """``(u, xmins, xmin, xmax, p, emins, emin, emax)`` of a Pychop ``prec``, from the anynum format.

    u is the unit roundoff 2**-p, xmins the smallest subnormal, xmin the smallest
    normal, p the precision with the hidden bit. ``prec=None`` returns
    ``{name: tuple}`` for every name (Pychop returns a pandas DataFrame there);
    `binary` and extra arguments are accepted and ignored.

    >>> u, xmins, xmin, xmax, p, emins, emin, emax = float_params("fp16")
    >>> u == 2**-11, xmins == 2**-24, xmax, p, emins, emin, emax
    (True, True, 65504.0, 11, -24, -14, 15)
    """
    if prec is None:
        return {name: _params(prec_format(name)) for name in PRECISIONS}
    return _params(prec_format(prec))
