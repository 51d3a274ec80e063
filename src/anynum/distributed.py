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

Stochastic rounding of what each rank sends draws from a per-rank stream, so ranks round
independently (one stream on every rank would correlate their errors); the reduced sum is
rounded with a stream that all ranks share, so they all apply the same gradient. The
random bits of backward pass k are a pure function of (seed, k, rank or "sum", parameter,
element): they do not depend on how DDP packs gradients into buckets (it repacks them
after the first iteration, and a resumed run starts over). Given the model
(``module=``), its ``state_dict`` saves k (``_anynum_rng.comm.*``) and ``load_state_dict``
restores it on every rank, so a resumed run is bit-identical to the uninterrupted one
(see `anynum.nn.streams`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.nn.quantizer import Rounder
from anynum.nn.streams import CounterStream, register_stream_hooks
from anynum.quantize import quantize
from anynum.rounding import CounterRandom, RandomSource, RoundingLike

__all__ = ["quantized_comm_hook"]

_STREAM_ATTR = "_anynum_comm_stream"


class _ParamAddressed(RandomSource):
    """Counter-based bits addressed by each element's place in the model, not in the bucket."""

    def __init__(self, seed: int, address: torch.Tensor) -> None:
        self.inner = CounterRandom(seed)
        self.address = address

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        where = self.address[index.reshape(-1)].view(index.shape)
        return self.inner.bits_at(where, nbits, stream)


class _HookState:
    def __init__(self, rounder: Rounder, seed: int, process_group: Any, module: nn.Module | None) -> None:
        self.rounder = rounder  # deterministic modes: the rounder itself (fast paths)
        self.stream = CounterStream(seed) if rounder.mode.is_stochastic else None
        self.process_group = process_group
        self.offsets: dict[int, int] = {}  # id(parameter) -> first element's address in the model
        if module is not None:
            total = 0
            for p in module.parameters():
                self.offsets[id(p)] = total
                total += p.numel()
        self.addresses: dict[tuple[int, ...], torch.Tensor] = {}

    def address(self, bucket: Any, buf: torch.Tensor) -> torch.Tensor:
        """The model-wide address of every element of `bucket` (bucket positions without a model)."""
        params = bucket.parameters()
        key = (bucket.index(), *(id(p) for p in params))
        a = self.addresses.get(key)
        if a is None:
            # No model given (or padding): positions in the bucket, shifted by the bucket's index.
            a = torch.arange(buf.numel(), device=buf.device) + ((bucket.index() + 1) << 40)
            if self.offsets and all(id(p) in self.offsets for p in params):
                for p, g in zip(params, bucket.gradients()):  # views of the bucket buffer
                    start = g.storage_offset() - buf.storage_offset()
                    here = torch.arange(g.numel(), device=buf.device) + self.offsets[id(p)]
                    a[start : start + g.numel()] = here
            self.addresses[key] = a
        return a

    def round(self, x: torch.Tensor, rng: RandomSource | None) -> torch.Tensor:
        if rng is None:
            return self.rounder(x)
        r = self.rounder
        return quantize(x, r.fmt, r.mode, overflow=r.overflow, generator=rng)


def _comm_streams(module: nn.Module) -> dict[str, CounterStream | None]:
    return {"comm": module.__dict__.get(_STREAM_ATTR)}


def quantized_comm_hook(
    fmt: Format | str,
    rounding: RoundingLike = "nearest",
    *,
    overflow: str | None = None,
    seed: int = 0,
    process_group: Any = None,
    module: nn.Module | None = None,
) -> tuple[Any, Any]:
    """Build ``(state, hook)`` for ``ddp_model.register_comm_hook(state, hook)``.

    The hook divides each gradient bucket by the world size, rounds it onto
    `fmt` with `rounding` (stochastic modes: per-rank streams, see the module doc),
    all-reduces (sum) it and rounds the result onto `fmt` again. See the
    module docstring for what this saves (nothing on the wire) and what it
    simulates. NaN/inf follow `fmt`'s overflow policy (`overflow`, default the
    format's).

    Pass the model as `module` (the DDP wrapper or the module it wraps) to make the
    stochastic streams part of its ``state_dict`` and to address random bits by
    parameter: then a run resumed from a checkpoint is bit-identical to the
    uninterrupted one. A model can carry one such hook.

    >>> state, hook = quantized_comm_hook("bf16")
    >>> callable(hook)
    True
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise AnynumError(f"seed must be an int, got {seed!r}.")
    rounder = Rounder(fmt, rounding, overflow)  # validates now, not inside the backward pass
    if module is not None and not isinstance(module, nn.Module):
        raise AnynumError(
            f"module= takes the model (a torch.nn.Module or its DDP wrapper), got {type(module).__name__}."
        )
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    state = _HookState(rounder, seed, process_group, inner)
    if inner is not None and state.stream is not None:
        if _STREAM_ATTR in inner.__dict__:
            raise AnynumError("this model already carries a quantized_comm_hook stream; build the hook once.")
        inner.__dict__[_STREAM_ATTR] = state.stream
        register_stream_hooks(inner, _comm_streams)
    return state, _hook


def _hook(state: _HookState, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buf = bucket.buffer()
    send_rng = sum_rng = None
    stream = state.stream
    if stream is not None:
        address = state.address(bucket, buf)
        rank = dist.get_rank(group)
        send_rng = _ParamAddressed(stream.derive("send", rank), address)
        sum_rng = _ParamAddressed(stream.derive("sum"), address)
        if bucket.is_last():  # the backward pass is complete: the next one draws new bits
            stream.advance()
    sent = state.round(buf / world, send_rng)
    fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

    def finish(f: torch.futures.Future[Any]) -> torch.Tensor:
        total = f.value()[0]
        buf.copy_(state.round(total, sum_rng))
        return buf

    return fut.then(finish)


# DDP inspects the hook's annotations as objects; postponed (string) annotations fail its check.
_hook.__annotations__ = {
    "state": _HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
