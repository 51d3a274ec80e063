"""Reductions on MCTensor: sum, mean, softmax, log_softmax (tree sums of MC additions).
Registered in the op table.
"""

from __future__ import annotations

import builtins
from typing import Any

import torch
import torch.nn.functional as F

from anynum.errors import AnynumError
from anynum.mc import arith, functions
from anynum.mc._core import Comps
from anynum.mc.ops.arithmetic import div
from anynum.mc.ops.rule import apply, fix, is_mc
from anynum.mc.optable import implements
from anynum.mc.reduce import tree_sum
from anynum.mc.tensor import MCTensor

__all__ = ["log_softmax", "mean", "softmax", "sum"]


def _dims(x: MCTensor, dim: Any) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        return [dim % max(x.dim(), 1)]
    return sorted({d % max(x.dim(), 1) for d in dim})


@implements(torch.sum, torch.Tensor.sum)
def sum(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """Sum over `dim` (all by default) with a tree of MC additions (error <= about
    ``3 ceil(log2 n) u^2 sum|x|`` for nc=2).  NaN/inf propagate as in IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0, 2.0**-30, -1.0]))
    >>> mc.sum(x).item() == 2.0**-30
    True
    """
    if not is_mc(x):
        return builtins.sum(x) if dim is None else builtins.sum(x, dim)
    nc = x.nc
    dims = _dims(x, dim)

    def fwd(p: Comps) -> Comps:
        out = p
        if x.dim() == 0:
            return out
        for d in sorted(dims, reverse=True):
            out = tree_sum(out, d, nc, keepdim)
        native = p[0]
        return fix(out, lambda: torch.sum(native, dim=tuple(dims), keepdim=keepdim))

    def native(v: torch.Tensor) -> torch.Tensor:
        return torch.sum(v, dim=tuple(dims), keepdim=keepdim) if v.dim() else v

    return apply(fwd, native, x.components())


@implements(torch.mean, torch.Tensor.mean)
def mean(x: MCTensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> MCTensor:
    """Mean over `dim`: MC sum divided by the count (exact count).  NaN/inf: IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> mc.mean(mc.MCTensor(torch.tensor([1.0, 2.0]))).item()
    1.5
    """
    dims = _dims(x, dim)
    n = 1
    for d in dims:
        n *= x.shape[d] if x.dim() else 1
    return div(sum(x, dim, keepdim), float(n))


@implements(torch.softmax, F.softmax, torch.Tensor.softmax)
def softmax(x: MCTensor, dim: int | None = None, *args: Any, **kwargs: Any) -> MCTensor:
    """Softmax along `dim` to about MC precision (shift by the max of the leading
    components, MC exp, MC sum, MC division).  NaN -> NaN; +inf entries -> NaN as in torch.

    >>> import torch
    >>> from anynum import mc
    >>> mc.softmax(mc.MCTensor(torch.tensor([0.0, 0.0])), 0).tolist()
    [0.5, 0.5]
    """
    if dim is None:
        raise AnynumError("softmax on MCTensor needs an explicit dim")
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        m = p[0].amax(dim=dim, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        z = arith.sub(p, (m,), nc) if nc > 1 else (p[0] - m,)
        e = functions.exp(z, nc) if nc > 1 else (torch.exp(z[0]),)
        e = fix(e, lambda: torch.exp(z[0]))
        s = tree_sum(e, dim, nc, keepdim=True)
        r = arith.div(e, s, nc)
        return fix(r, lambda: torch.softmax(p[0], dim))

    return apply(fwd, lambda v: torch.softmax(v, dim), x.components())


@implements(torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax)
def log_softmax(x: MCTensor, dim: int | None = None, *args: Any, **kwargs: Any) -> MCTensor:
    """``x - logsumexp(x)`` along `dim` to about MC precision.  NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> v = mc.log_softmax(mc.MCTensor(torch.tensor([0.0, 0.0])), 0).tolist()[0]
    >>> -1e-14 < v + 0.6931471805599453 < 1e-14
    True
    """
    if dim is None:
        raise AnynumError("log_softmax on MCTensor needs an explicit dim")
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        m = p[0].amax(dim=dim, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        z = arith.sub(p, (m,), nc) if nc > 1 else (p[0] - m,)
        e = functions.exp(z, nc) if nc > 1 else (torch.exp(z[0]),)
        e = fix(e, lambda: torch.exp(z[0]))
        s = tree_sum(e, dim, nc, keepdim=True)
        ls = functions.log(s, nc) if nc > 1 else (torch.log(s[0]),)
        r = arith.sub(z, ls, nc)
        return fix(r, lambda: torch.log_softmax(p[0], dim))

    return apply(fwd, lambda v: torch.log_softmax(v, dim), x.components())
