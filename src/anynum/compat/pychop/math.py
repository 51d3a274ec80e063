"""Pychop's chopped math: ``chop.sin(x)`` and ``sin(x, chop)``, delegated to `anynum.ops`.

Each function rounds its inputs to the chopper's format, computes once in
float64 and rounds the result once with the chopper's mode (`anynum.ops`
documents the accuracy of each). Pychop's names and argument orders are
kept: unary ``f(x, chop)``, binary ``f(x, y, chop)``, reductions
``f(x, chop, axis=None)``; the methods take the same arguments without
``chop``. Out-of-domain inputs raise `anynum.errors.AnynumError` (a
ValueError), as Pychop raises ValueError; `anynum.ops` itself defaults to
NumPy's NaN and RuntimeWarning instead. rmode 0 (ties to odd) has no
chopped math. Integer choppers (``Chopi``) have none either, as in Pychop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from anynum.compat.pychop.arrays import as_float
from anynum.compat.pychop.rmodes import TIES_TO_ODD
from anynum.errors import InputError

__all__ = ["BINARY", "REDUCTIONS", "UNARY", "MathMethods", "apply_ops"]

UNARY = (
    "sin",
    "cos",
    "tan",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "arcsinh",
    "arccosh",
    "arctanh",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "sqrt",
    "cbrt",
    "abs",
    "fabs",
    "reciprocal",
    "square",
    "floor",
    "ceil",
    "sign",
    "erf",
    "erfc",
    "gamma",
    "degrees",
    "radians",
    "angle",
    "real",
    "imag",
    "conj",
    "frexp",
    "modf",
)
BINARY = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "hypot",
    "maximum",
    "minimum",
    "mod",
    "floor_divide",
    "logaddexp",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "dot",
    "matmul",
    "ldexp",
)
REDUCTIONS = ("sum", "prod", "mean", "std", "var", "cumsum", "cumprod")


def apply_ops(chop: Any, name: str, arrays: tuple[Any, ...], **kwargs: Any) -> Any:
    """``anynum.ops.<name>(*arrays, fmt, mode, ...)`` with `chop`'s format, mode and random stream."""
    if not hasattr(chop, "format_for"):
        raise InputError(
            f"chopped math needs a float or fixed-point chopper (Chop, FaultChop, Chopf), got "
            f"{type(chop).__name__}."
        )
    if chop.mode == TIES_TO_ODD:
        raise InputError("rmode 0 (nearest, ties to odd) has no chopped math; use rmode 1 (ties to even).")
    ops = importlib.import_module("anynum.ops")
    fn: Callable[..., Any] | None = getattr(ops, name, None)
    if fn is None:
        raise InputError(f"anynum.ops has no function {name!r}.")
    # ldexp's exponents stay integers; every other argument is an array of floats
    values = tuple(
        a if (name == "ldexp" and i == 1) or isinstance(a, (int, np.integer)) else as_float(a)
        for i, a in enumerate(arrays)
    )
    fmt = chop.format_for(values[0])
    generator = chop.generator if chop.mode.is_stochastic else None
    return fn(*values, fmt, chop.mode, generator=generator, domain="raise", **kwargs)


def _unary(name: str) -> Callable[..., Any]:
    def method(self: Any, x: Any) -> Any:
        return apply_ops(self, name, (x,))

    method.__name__ = name
    method.__doc__ = (
        f"Chopped ``{name}(x)``: input and result rounded to this chopper's format (anynum.ops.{name})."
    )
    return method


def _binary(name: str) -> Callable[..., Any]:
    def method(self: Any, x: Any, y: Any) -> Any:
        return apply_ops(self, name, (x, y))

    method.__name__ = name
    method.__doc__ = f"Chopped ``{name}(x, y)`` (anynum.ops.{name})."
    return method


def _reduction(name: str) -> Callable[..., Any]:
    def method(self: Any, x: Any, axis: Any = None) -> Any:
        return apply_ops(self, name, (x,), axis=axis)

    method.__name__ = name
    method.__doc__ = f"Chopped ``{name}(x, axis)`` (anynum.ops.{name})."
    return method


def _round(self: Any, x: Any, decimals: int = 0) -> Any:
    """Chopped ``round(x, decimals)`` (anynum.ops.round)."""
    return apply_ops(self, "round", (x,), decimals=decimals)


def _clip(self: Any, x: Any, a_min: Any, a_max: Any) -> Any:
    """Chopped ``clip(x, a_min, a_max)`` (anynum.ops.clip)."""
    return apply_ops(self, "clip", (x, a_min, a_max))


def _diff(self: Any, x: Any, n: int = 1) -> Any:
    """Chopped ``diff(x, n)`` (anynum.ops.diff)."""
    return apply_ops(self, "diff", (x,), n=n)


class MathMethods:
    """The chopped math methods of Pychop's chop objects (``chop.sin(x)``, ``chop.add(x, y)``, ...)."""

    round = _round
    clip = _clip
    diff = _diff


for _name in UNARY:
    setattr(MathMethods, _name, _unary(_name))
for _name in BINARY:
    setattr(MathMethods, _name, _binary(_name))
for _name in REDUCTIONS:
    setattr(MathMethods, _name, _reduction(_name))
