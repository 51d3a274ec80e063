"""Exact comparisons and selections on MCTensor values: < <= > >= == !=, maximum, minimum,
where.  Registered in the op table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anynum.mc import arith
from anynum.mc.ops.rule import mc_args
from anynum.mc.optable import implements
from anynum.mc.tensor import MCTensor, wrap

__all__ = ["eq", "ge", "gt", "le", "lt", "maximum", "minimum", "ne", "where"]


def _cmp(x: Any, y: Any, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    (a, b), nc, _ = mc_args(x, y)
    with torch.no_grad():
        d = arith.sub(tuple(c.detach() for c in a), tuple(c.detach() for c in b), nc)
        lead = op(a[0].detach(), b[0].detach())
        z = torch.zeros_like(d[0])
        res = op(d[0], z)
        fin = torch.isfinite(a[0]) & torch.isfinite(b[0])
        return torch.where(fin, res, lead)


@implements(torch.lt, torch.less, torch.Tensor.lt)
def lt(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x < y`` on the values (sign of the MC difference); NaN compares False.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0])) + 2.0**-40
    >>> bool(x > 1.0), bool(x < 1.0)
    (True, False)
    """
    return _cmp(x, y, torch.lt)


@implements(torch.le, torch.less_equal, torch.Tensor.le)
def le(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x <= y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.le)


@implements(torch.gt, torch.greater, torch.Tensor.gt)
def gt(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x > y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.gt)


@implements(torch.ge, torch.greater_equal, torch.Tensor.ge)
def ge(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x >= y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.ge)


@implements(torch.eq, torch.Tensor.eq)
def eq(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x == y`` (see :func:`lt`); NaN is unequal to everything."""
    return _cmp(x, y, torch.eq)


@implements(torch.ne, torch.not_equal, torch.Tensor.ne)
def ne(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x != y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.ne)


@implements(torch.maximum, torch.max)
def maximum(x: Any, y: Any) -> MCTensor:
    """Elementwise maximum of the values (exact); NaN wins.

    >>> import torch
    >>> from anynum import mc
    >>> mc.maximum(mc.MCTensor(torch.tensor([1.0, 5.0])), 2.0).tolist()
    [2.0, 5.0]
    """
    (a, b), nc, _ = mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    take_a = ge(wrap(a), wrap(b)) | torch.isnan(a[0])
    return wrap(tuple(torch.where(take_a, p, q) for p, q in zip(a, b)))


@implements(torch.minimum, torch.min)
def minimum(x: Any, y: Any) -> MCTensor:
    """Elementwise minimum of the values (exact); NaN wins."""
    (a, b), nc, _ = mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    take_a = le(wrap(a), wrap(b)) | torch.isnan(a[0])
    return wrap(tuple(torch.where(take_a, p, q) for p, q in zip(a, b)))


@implements(torch.where)
def where(cond: torch.Tensor, x: Any, y: Any) -> MCTensor:
    """Elementwise selection (exact)."""
    (a, b), nc, _ = mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    return wrap(tuple(torch.where(cond, p, q) for p, q in zip(a, b)))
