"""`quantized_comm_hook`: a DDP communication hook that rounds gradient buckets before all-reduce.

What it simulates, honestly: each rank rounds its (pre-divided) gradient
bucket onto a low-precision grid, the ranks sum the rounded buckets, and the
sum is rounded onto the grid again - the numbers a low-precision gradient
exchange would deliver when the reduction adds two values at a time at most
once per rank (exact for 2 ranks; for more ranks a real ring all-reduce rounds
every partial sum, which this hook does not model).

What it does not save: the bucket still travels as float32 (or the bucket's
dtype) over the wire, so communication volume and time are those of plain
DDP plus the rounding cost. Use it to study accuracy, not to speed training up;
for real savings with 16-bit formats torch's ``fp16_compress_hook`` and
``bf16_compress_hook`` send 16-bit buffers.

Stochastic rounding of what each rank sends draws from a stream seeded by
``seed + 1 + rank``, so ranks round independently (one stream on every rank
would correlate their errors); the reduced sum is rounded with a stream
seeded by ``seed`` that all ranks share, so they all apply the same gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from anynum.formats.base import Format
from anynum.nn.quantizer import Rounder
from anynum.rounding import RoundingLike

__all__ = ["quantized_comm_hook"]


class _HookState:
    def __init__(self, rounder_args: tuple[Any, ...], seed: int, process_group: Any) -> None:
        self.rounder_args = rounder_args
        self.seed = seed
        self.process_group = process_group
        self.rounders: tuple[Rounder, Rounder] | None = None

    def get(self) -> tuple[Rounder, Rounder]:
        """(send, receive) rounders: per-rank streams for what a rank sends; one stream shared by
        all ranks for the reduced sum, so every rank applies the very same gradient."""
        if self.rounders is None:  # the rank is known only once the process group exists
            fmt, rounding, overflow = self.rounder_args
            rank = dist.get_rank(self.process_group)
            self.rounders = (
                Rounder(fmt, rounding, overflow, seed=self.seed + 1 + rank),
                Rounder(fmt, rounding, overflow, seed=self.seed),
            )
        return self.rounders


def quantized_comm_hook(
    fmt: Format | str,
    rounding: RoundingLike = "nearest",
    *,
    overflow: str | None = None,
    seed: int = 0,
    process_group: Any = None,
) -> tuple[Any, Any]:
    """Build ``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``.

    The hook divides each gradient bucket by the world size, rounds it onto
    `fmt` with `rounding` (stochastic modes: per-rank streams, see the module doc),
    all-reduces (sum) it and rounds the result onto `fmt` again. See the
    module docstring for what this saves (nothing on the wire) and what it
    simulates. NaN/inf follow `fmt`'s overflow policy (`overflow`, default the
    format's).

    >>> state, hook = quantized_comm_hook("bf16")
    >>> callable(hook)
    True
    """
    state = _HookState((fmt, rounding, overflow), seed, process_group)
    Rounder(fmt, rounding, overflow)  # validate now, not inside the backward pass
    return state, _hook


def _hook(state: _HookState, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    send, receive = state.get()
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    sent = send(buf / world)
    fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

    def finish(f: torch.futures.Future[Any]) -> torch.Tensor:
        total = f.value()[0]
        buf.copy_(receive(total))
        return buf

    return fut.then(finish)


# DDP inspects the hook's annotations as objects; postponed (string) annotations fail its check.
_hook.__annotations__ = {
    "state": _HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
