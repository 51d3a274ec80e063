"""Elementary functions on MCTensor: sqrt, exp, expm1, log, relu, sigmoid, tanh, to about MC
precision (algorithms in `anynum.mc.functions`).  Registered in the op table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anynum.mc import functions
from anynum.mc._core import Comps
from anynum.mc.ops.rule import apply, positive, unary
from anynum.mc.optable import implements
from anynum.mc.tensor import MCTensor

__all__ = ["exp", "expm1", "log", "relu", "sigmoid", "sqrt", "tanh"]


@implements(torch.sqrt, torch.Tensor.sqrt)
def sqrt(x: MCTensor) -> MCTensor:
    """Square root to about MC precision (Newton in MC arithmetic, ~2u^2 for nc=2).
    ``sqrt(0) = 0`` (sign kept), ``sqrt(inf) = inf``, negative or NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> s = mc.sqrt(mc.MCTensor(torch.tensor([2.0], dtype=torch.float64)))
    >>> -1e-30 < float((s * s - 2.0).to_tensor()) < 1e-30
    True
    """
    return unary(x, functions.sqrt, torch.sqrt, positive)


@implements(torch.exp, torch.Tensor.exp)
def exp(x: MCTensor) -> MCTensor:
    """Exponential to about MC precision.  Overflow -> inf, ``exp(-inf) = 0``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> e = mc.exp(mc.MCTensor(torch.tensor([1.0])))
    >>> -1e-13 < e.to_tensor(torch.float64).item() - 2.718281828459045 < 1e-13
    True
    """
    return unary(x, functions.exp, torch.exp, torch.isfinite)


@implements(torch.expm1, torch.special.expm1, torch.Tensor.expm1)
def expm1(x: MCTensor) -> MCTensor:
    """``exp(x) - 1`` with relative accuracy near 0.  inf -> inf, -inf -> -1, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.expm1(mc.MCTensor(torch.tensor([1e-10], dtype=torch.float64))).item() > 1e-10
    True
    """
    return unary(x, functions.expm1, torch.expm1, torch.isfinite)


@implements(torch.log, torch.Tensor.log)
def log(x: MCTensor) -> MCTensor:
    """Natural logarithm to about MC precision (absolute error ~u^nc where |log x| < 1).
    ``log(0) = -inf``, negative -> NaN, ``log(inf) = inf``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> -1e-13 < mc.log(mc.MCTensor(torch.tensor([2.0]))).item() - 0.6931471805599453 < 1e-13
    True
    """
    return unary(x, functions.log, torch.log, positive)


@implements(torch.relu, F.relu, torch.Tensor.relu)
def relu(x: MCTensor, inplace: bool = False) -> MCTensor:
    """``max(x, 0)`` (exact).  NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.relu(mc.MCTensor(torch.tensor([-1.0, 2.0]))).tolist()
    [0.0, 2.0]
    """
    def fwd(p: Comps) -> Comps:
        keep = (p[0] > 0) | torch.isnan(p[0])
        return tuple(torch.where(keep, c, torch.zeros_like(c)) for c in p)

    return apply(fwd, torch.relu, x.components())


@implements(torch.sigmoid, F.sigmoid, torch.Tensor.sigmoid)
def sigmoid(x: MCTensor) -> MCTensor:
    """``1 / (1 + exp(-x))`` to about MC precision.  ``±inf -> 1 / 0``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.sigmoid(mc.MCTensor(torch.tensor([0.0]))).item()
    0.5
    """
    return unary(x, functions.sigmoid, torch.sigmoid, torch.isfinite)


@implements(torch.tanh, F.tanh, torch.Tensor.tanh)
def tanh(x: MCTensor) -> MCTensor:
    """Hyperbolic tangent to about MC precision (relative, also near 0).  ``±inf -> ±1``.

    >>> import torch
    >>> from anynum import mc
    >>> mc.tanh(mc.MCTensor(torch.tensor([0.0]))).item()
    0.0
    """
    return unary(x, functions.tanh, torch.tanh, torch.isfinite)
