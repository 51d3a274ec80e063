"""Run a 2-D matrix-product core on operands with batch dimensions.

The Ozaki engines work on 2-D component matrices: with a 2-D right operand the batch
dimensions of the left one are folded into its rows (one large product instead of many small
ones); with a 2-D left operand the product is transposed so that the batch folds into the
right operand's columns; only when both are batched does it loop over the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anynum.mc._core import Comps

__all__ = ["batched"]


def batched(core: Callable[[Comps, Comps], Comps], a: Comps, b: Comps) -> Comps:
    """``core`` on a (..., m, k) and b (..., k, n), itself taking (m, k) and (k, n) components.

    >>> import torch
    >>> from anynum.mc.batch2d import batched
    >>> r = batched(lambda p, q: (p[0] @ q[0],), (torch.ones(3, 2, 4),), (torch.ones(4, 5),))
    >>> tuple(r[0].shape)
    (3, 2, 5)
    """
    if a[0].dim() == 2 and b[0].dim() == 2:
        return core(a, b)
    m, n = a[0].shape[-2], b[0].shape[-1]
    if b[0].dim() == 2:
        batch = a[0].shape[:-2]
        res = core(tuple(c.reshape(c.shape[:-1].numel(), c.shape[-1]) for c in a), b)  # k may be 0
        return tuple(c.reshape(*batch, m, n) for c in res)
    if a[0].dim() == 2:
        batch = b[0].shape[:-2]
        bt = tuple(c.transpose(-1, -2).reshape(batch.numel() * n, c.shape[-2]) for c in b)
        res = core(bt, tuple(c.T for c in a))
        return tuple(c.reshape(*batch, n, m).transpose(-1, -2) for c in res)
    batch = torch.broadcast_shapes(a[0].shape[:-2], b[0].shape[:-2])
    ab = [c.expand(*batch, *c.shape[-2:]).reshape(-1, *c.shape[-2:]) for c in a]
    bb = [c.expand(*batch, *c.shape[-2:]).reshape(-1, *c.shape[-2:]) for c in b]
    outs = [core(tuple(c[i] for c in ab), tuple(c[i] for c in bb)) for i in range(ab[0].shape[0])]
    return tuple(torch.stack([o[j] for o in outs]).reshape(*batch, m, n) for j in range(len(outs[0])))
