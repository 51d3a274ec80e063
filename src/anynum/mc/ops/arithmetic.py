"""Arithmetic ops on MCTensor: + - * / (and their torch/method forms), neg, abs, square,
reciprocal, pow.  Registered in the op table (`anynum.mc.optable`).
"""

from __future__ import annotations

import builtins
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc import arith, functions
from anynum.mc._core import Comps
from anynum.mc.ops.rule import apply, fix, is_mc, mc_args, positive
from anynum.mc.optable import implements
from anynum.mc.tensor import MCTensor

__all__ = ["abs", "add", "div", "mul", "neg", "pow", "reciprocal", "square", "sub"]


@implements(torch.add, torch.Tensor.add)
def add(x: Any, y: Any, *, alpha: Any = 1) -> MCTensor:
    """``x + alpha*y`` in MC arithmetic (nc=2: AccurateDWPlusDW, <= 3u^2; DWPlusFP with a
    plain tensor, <= 2u^2).  NaN/inf: IEEE result of the leading components.

    >>> import torch
    >>> from anynum import mc
    >>> (mc.MCTensor(torch.tensor([1.0])) + 2.0**-40).components()[1].item() == 2.0**-40
    True
    """
    if alpha != 1:
        y = mul(y, alpha) if is_mc(y) else y * alpha
    (a, b), nc, _ = mc_args(x, y)
    return apply(lambda p, q: fix(arith.add(p, q, nc), lambda: p[0] + q[0]), torch.add, a, b)


@implements(torch.sub, torch.subtract, torch.Tensor.sub)
def sub(x: Any, y: Any, *, alpha: Any = 1) -> MCTensor:
    """``x - alpha*y`` (same algorithms and bounds as :func:`add`).

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0])) + 2.0**-40
    >>> (x - 1.0).to_tensor().item() == 2.0**-40
    True
    """
    if alpha != 1:
        y = mul(y, alpha) if is_mc(y) else y * alpha
    (a, b), nc, _ = mc_args(x, y)
    return apply(lambda p, q: fix(arith.sub(p, q, nc), lambda: p[0] - q[0]), torch.sub, a, b)


@implements(torch.mul, torch.multiply, torch.Tensor.mul)
def mul(x: Any, y: Any) -> MCTensor:
    """``x * y`` (nc=2: DWTimesDW3 <= 4u^2 with FMA, DWTimesDW1 <= 7u^2 without; with a
    plain tensor DWTimesFP, <= 2u^2).  NaN/inf: IEEE result of the leading components.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0 + 2.0**-20]))
    >>> (x * x).components()[1].item() == 2.0**-40
    True
    """
    (a, b), nc, _ = mc_args(x, y)
    return apply(lambda p, q: fix(arith.mul(p, q, nc), lambda: p[0] * q[0]), torch.mul, a, b)


@implements(torch.div, torch.true_divide, torch.divide, torch.Tensor.div)
def div(x: Any, y: Any, *, rounding_mode: str | None = None) -> MCTensor:
    """``x / y`` (nc=2: DWDivDW2 <= 15u^2; DWDivFP3 <= 3u^2 by a plain tensor).  Division by
    zero, NaN/inf: IEEE result of the leading components (``1/0 = inf``).

    >>> import torch
    >>> from anynum import mc
    >>> q = mc.MCTensor(torch.tensor([1.0])) / 3.0
    >>> -1e-14 < q.to_tensor(torch.float64).item() - 1 / 3 < 1e-14
    True
    """
    if rounding_mode is not None:
        raise AnynumError("MCTensor division supports only rounding_mode=None")
    (a, b), nc, _ = mc_args(x, y)

    def fwd(p: Comps, q: Comps) -> Comps:
        q0 = q[0]
        bad = (q0 == 0) | ~torch.isfinite(q0) | ~torch.isfinite(p[0])
        if bool(bad.any()):
            lows = (torch.where(bad, torch.zeros_like(c), c) for c in q[1:])
            q = (torch.where(bad, torch.ones_like(q0), q0), *lows)
            return fix(arith.div(p, q, nc), lambda: p[0] / q0, bad)
        return fix(arith.div(p, q, nc), lambda: p[0] / q0)

    return apply(fwd, torch.div, a, b)


@implements(torch.neg, torch.negative, torch.Tensor.neg)
def neg(x: MCTensor) -> MCTensor:
    """``-x`` (exact).  NaN/inf: negated.

    >>> import torch
    >>> from anynum import mc
    >>> (-mc.MCTensor(torch.tensor([2.0]))).item()
    -2.0
    """
    return apply(arith.neg, torch.neg, x.components())


@implements(torch.abs, torch.absolute, torch.Tensor.abs)
def abs(x: Any) -> Any:
    """``|x|`` (exact; the sign of the value is that of the leading component).  NaN stays NaN.

    >>> import torch
    >>> from anynum import mc
    >>> abs(mc.MCTensor(torch.tensor([-2.0]))).item()
    2.0
    """
    if not is_mc(x):
        return builtins.abs(x)

    def fwd(p: Comps) -> Comps:
        s = p[0] < 0
        return tuple(torch.where(s, -c, c) for c in p)

    return apply(fwd, torch.abs, x.components())


@implements(torch.square, torch.Tensor.square)
def square(x: MCTensor) -> MCTensor:
    """``x * x`` (same bound as :func:`mul`).  NaN/inf: IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> mc.square(mc.MCTensor(torch.tensor([3.0]))).item()
    9.0
    """
    return mul(x, x)


@implements(torch.reciprocal, torch.Tensor.reciprocal)
def reciprocal(x: MCTensor) -> MCTensor:
    """``1 / x`` (DWDivDW2, <= 15u^2).  ``1/0 = inf``, ``1/inf = 0``.

    >>> import torch
    >>> from anynum import mc
    >>> mc.reciprocal(mc.MCTensor(torch.tensor([4.0]))).item()
    0.25
    """
    return div(1.0, x)


@implements(torch.pow, torch.Tensor.pow)
def pow(x: Any, y: Any) -> Any:
    """``x ** y``: binary powering for Python integers, ``exp(y log x)`` otherwise (x > 0;
    other bases follow the native result of the leading components, e.g. NaN for negative
    bases with fractional exponents).

    >>> import torch
    >>> from anynum import mc
    >>> (mc.MCTensor(torch.tensor([3.0])) ** 2).item()
    9.0
    """
    if not is_mc(x) and not is_mc(y):
        return builtins.pow(x, y)
    if is_mc(x) and isinstance(y, int) and not isinstance(y, bool):
        nc = x.nc
        return apply(lambda p: fix(functions.powi(p, y, nc), lambda: p[0] ** y),
                      lambda v: v**y, x.components())
    (a, b), nc, _ = mc_args(x, y)

    def fwd(p: Comps, q: Comps) -> Comps:
        if nc == 1:
            return (torch.pow(p[0], q[0]),)
        return fix(functions.pow_general(p, q, nc), lambda: torch.pow(p[0], q[0]),
                    ~positive(p[0]) | ~torch.isfinite(q[0]))

    return apply(fwd, torch.pow, a, b)
