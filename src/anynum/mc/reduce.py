"""Reductions on component tuples: tree-shaped sums, ``log2(n)`` vectorised MC additions,
never a Python loop over elements.  Error of a sum of n terms, nc = 2: at most about
``3 ceil(log2 n) u^2 sum|x|``.
"""

from __future__ import annotations

import torch

from anynum.mc import arith
from anynum.mc._core import Comps

__all__ = ["sum_all", "tree_sum"]


def tree_sum(x: Comps, dim: int, nc: int, keepdim: bool = False) -> Comps:
    """Sum along `dim` with a balanced tree of vectorised MC additions.

    >>> import torch
    >>> from anynum.mc.reduce import tree_sum
    >>> x = (torch.tensor([1.0, 2.0**-30, -1.0]), torch.zeros(3))
    >>> tree_sum(x, 0, 2)[0].item() == 2.0**-30
    True
    """
    comps = [c.movedim(dim, -1) for c in arith.pad(x, nc)]
    n = comps[0].shape[-1]
    if n == 0:
        out = tuple(torch.zeros(c.shape[:-1], dtype=c.dtype, device=c.device) for c in comps)
    else:
        while n > 1:
            h = n // 2
            a = tuple(c[..., :h] for c in comps)
            b = tuple(c[..., h : 2 * h] for c in comps)
            s = arith.add(a, b, nc)
            if n % 2:
                s = tuple(torch.cat([si, c[..., 2 * h :]], dim=-1) for si, c in zip(s, comps))
            comps = list(s)
            n = h + n % 2
        out = tuple(c[..., 0] for c in comps)
    if keepdim:
        out = tuple(c.unsqueeze(dim) for c in out)
    return out


def sum_all(x: Comps, nc: int) -> Comps:
    """Sum of all elements (see :func:`tree_sum`)."""
    return tree_sum(tuple(c.reshape(-1) for c in x), 0, nc)
