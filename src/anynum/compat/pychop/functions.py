"""Pychop's free math functions, ``sin(x, chop)``, ``add(x, y, chop)``, ``sum(x, chop, axis=None)``.

Each is the chopper's method of the same name (`anynum.compat.pychop.math`,
on `anynum.ops`). The names are Pychop's ``math_func`` list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anynum.compat.pychop.math import apply_ops

__all__ = [
    "add",
    "arccos",
    "arccosh",
    "arcsin",
    "arcsinh",
    "arctan",
    "arctanh",
    "ceil",
    "cos",
    "cosh",
    "cumprod",
    "cumsum",
    "divide",
    "dot",
    "exp",
    "expm1",
    "floor",
    "floor_divide",
    "log",
    "log1p",
    "log2",
    "log10",
    "matmul",
    "mean",
    "mod",
    "multiply",
    "power",
    "prod",
    "round",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "std",
    "subtract",
    "sum",
    "tan",
    "tanh",
    "var",
]


def _unary(name: str) -> Callable[..., Any]:
    def f(x: Any, chop: Any) -> Any:
        return apply_ops(chop, name, (x,))

    f.__name__ = name
    f.__doc__ = f"Pychop ``{name}(x, chop)``: the chopper's ``{name}`` method (one rounding in, one out)."
    return f


def _binary(name: str) -> Callable[..., Any]:
    def f(x: Any, y: Any, chop: Any) -> Any:
        return apply_ops(chop, name, (x, y))

    f.__name__ = name
    f.__doc__ = f"Pychop ``{name}(x, y, chop)``: the chopper's ``{name}`` method."
    return f


def _reduction(name: str) -> Callable[..., Any]:
    def f(x: Any, chop: Any, axis: Any = None) -> Any:
        return apply_ops(chop, name, (x,), axis=axis)

    f.__name__ = name
    f.__doc__ = f"Pychop ``{name}(x, chop, axis=None)``: the chopper's ``{name}`` method."
    return f


sin, cos, tan = _unary("sin"), _unary("cos"), _unary("tan")
arcsin, arccos, arctan = _unary("arcsin"), _unary("arccos"), _unary("arctan")
sinh, cosh, tanh = _unary("sinh"), _unary("cosh"), _unary("tanh")
arcsinh, arccosh, arctanh = _unary("arcsinh"), _unary("arccosh"), _unary("arctanh")
exp, expm1, log, log10, log2, log1p = (_unary(n) for n in ("exp", "expm1", "log", "log10", "log2", "log1p"))
sqrt, square, floor, ceil, sign = (_unary(n) for n in ("sqrt", "square", "floor", "ceil", "sign"))
add, subtract, multiply, divide = (_binary(n) for n in ("add", "subtract", "multiply", "divide"))
power, floor_divide, mod, dot, matmul = (
    _binary(n) for n in ("power", "floor_divide", "mod", "dot", "matmul")
)
sum, prod, mean, std, var = (_reduction(n) for n in ("sum", "prod", "mean", "std", "var"))
cumsum, cumprod = _reduction("cumsum"), _reduction("cumprod")


def round(x: Any, chop: Any) -> Any:
    """Pychop ``round(x, chop)``: the chopper's ``round`` method (to integers)."""
    return apply_ops(chop, "round", (x,))
