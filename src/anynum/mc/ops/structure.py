"""Structural ops on MCTensor: cat, stack, views and index functions applied to every
component, item assignment, isfinite, isnan, numel.  Exact.  Registered in the op table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc.convert import convert_comps
from anynum.mc.ops.rule import comps_list, is_mc, operand_comps
from anynum.mc.optable import implements
from anynum.mc.tensor import MCTensor, wrap

__all__ = ["cat", "isfinite", "isnan", "numel", "setitem", "stack"]


@implements(torch.cat, torch.concat, torch.concatenate)
def cat(tensors: Sequence[Any], dim: int = 0) -> MCTensor:
    """Concatenate MC tensors (and plain tensors, converted) along `dim` (exact)."""
    comps, nc = comps_list(tensors)
    return wrap(tuple(torch.cat([c[i] for c in comps], dim) for i in range(nc)))


@implements(torch.stack)
def stack(tensors: Sequence[Any], dim: int = 0) -> MCTensor:
    """Stack MC tensors (and plain tensors, converted) along a new `dim` (exact)."""
    comps, nc = comps_list(tensors)
    return wrap(tuple(torch.stack([c[i] for c in comps], dim) for i in range(nc)))


@implements(torch.isfinite)
def isfinite(x: MCTensor) -> torch.Tensor:
    """Whether every component is finite."""
    out = torch.ones_like(x.components()[0], dtype=torch.bool)
    for c in x.components():
        out = out & torch.isfinite(c)
    return out


@implements(torch.isnan)
def isnan(x: MCTensor) -> torch.Tensor:
    """Whether the value is NaN."""
    return torch.isnan(x.to_tensor())


@implements(torch.numel)
def numel(x: MCTensor) -> int:
    return x.numel()


def _structural(name: str) -> Callable[..., MCTensor]:
    def impl(x: MCTensor, *args: Any, **kwargs: Any) -> MCTensor:
        fn = getattr(torch, name)
        return wrap(tuple(fn(c, *args, **kwargs) for c in x.components()))

    impl.__name__ = name
    return impl


for _name in ("reshape", "transpose", "permute", "flatten", "squeeze", "unsqueeze", "clone",
              "t", "flip", "roll", "narrow", "select", "movedim", "swapaxes", "diagonal",
              "tile", "repeat_interleave", "broadcast_to", "index_select", "gather", "tril",
              "triu"):
    implements(getattr(torch, _name))(_structural(_name))


@implements(torch.Tensor.__setitem__)
def setitem(x: MCTensor, idx: Any, value: Any) -> None:
    """``x[idx] = value`` on every component (value converted exactly when it fits).

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.zeros(2))
    >>> x[0] = 1.0 + 2.0**-30
    >>> x.tolist()[0] == 1.0 + 2.0**-30
    True
    """
    if is_mc(value) and value.dtype != x.dtype:
        raise AnynumError(f"cannot assign {value.dtype} components into {x.dtype} ones")
    v = operand_comps(value, x.dtype, x.nc, x.device)
    v = convert_comps(v, x.dtype, x.nc)
    for c, vi in zip(x.components(), v):
        c[idx] = vi
