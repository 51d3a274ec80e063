"""Scratch buffers reused across multi-component operations.

Large temporaries freshly allocated on every operation cost page faults (glibc returns freed
large blocks to the OS), which dominated the run time of the double-word algorithms; reusing
a few scratch buffers per shape removes that cost.  Used by the cache-blocked kernels
(`anynum.mc.blocked`) and the int8 matrix-product engine, only without autograd recording,
and never for results.
"""

from __future__ import annotations

import torch

__all__ = ["MIN_NUMEL", "POOL", "Pool", "poolable_shape"]

MIN_NUMEL = 1 << 15  # below this, fresh tensors are cheap and the pool is not used


class Pool:
    """A few free buffers per (shape, dtype, device), handed out by `take` and returned by `give`.

    A buffer taken is owned by the caller until given back, so nested (reentrant) users never
    share one.

    >>> import torch
    >>> from anynum.mc.scratch import Pool
    >>> pool = Pool()
    >>> t = pool.take(torch.Size((4,)), torch.empty(0))
    >>> pool.give(t); pool.take(torch.Size((4,)), torch.empty(0)) is t
    True
    """

    MAX_KEYS = 6
    MAX_PER_KEY = 12

    def __init__(self) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised buffer of `shape` with `like`'s dtype and device."""
        key = (tuple(shape), like.dtype, like.device)
        lst = self.free.get(key)
        if lst:
            return lst.pop()
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def give(self, *ts: torch.Tensor) -> None:
        """Return buffers for reuse (the oldest shape is forgotten beyond MAX_KEYS shapes)."""
        for t in ts:
            key = (tuple(t.shape), t.dtype, t.device)
            lst = self.free.get(key)
            if lst is None:
                if len(self.free) >= self.MAX_KEYS:
                    self.free.pop(next(iter(self.free)))
                lst = self.free[key] = []
            if len(lst) < self.MAX_PER_KEY:
                lst.append(t)


POOL = Pool()


def poolable_shape(*ts: torch.Tensor) -> torch.Size | None:
    """The broadcast shape of `ts` if they are large enough and autograd is not recording.

    >>> import torch
    >>> from anynum.mc.scratch import poolable_shape
    >>> poolable_shape(torch.zeros(3)) is None, poolable_shape(torch.zeros(1 << 15))
    (True, torch.Size([32768]))
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return None
    shape = ts[0].shape
    if any(t.shape != shape for t in ts[1:]):
        shape = torch.broadcast_shapes(*(t.shape for t in ts))
    if shape.numel() < MIN_NUMEL:
        return None
    return shape
