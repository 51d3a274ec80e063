"""Rounding as `torch.library` custom ops, so quantized and emulated models compile without graph breaks.

Inside ``torch.compile`` (and ``torch.export``) the kernels' Python (the router,
ctypes calls, cache checks) cannot be traced. Callers that may run under a
compiler (`Rounder`, `quantize`) call these ops there instead; each op is opaque to
the compiler, has a fake (meta) implementation for tracing, and runs the router's
kernel at run time, so the values are the same bits as in eager mode.

* ``anynum::round(x, fmt, mode, overflow, rand_bits)``: the deterministic modes.
  ``fmt`` is the format's `canonical_name`, so a traced or exported graph records
  the format as a plain string.
* ``anynum::round_stream(x, fmt, mode, overflow, rand_bits, stream)``: the
  stochastic modes. ``stream`` names a random stream registered in this process
  (`register_stream`); each call draws a fresh seed from it, as the eager path does.
  The op is tagged ``nondeterministic_seeded``, so the compiler never merges two
  calls. Graphs using it are tied to this process (streams are not serialised).
* ``anynum::round_seeded(x, fmt, mode, overflow, rand_bits, seed)``: stochastic
  rounding with a given seed, a pure function (``anynum.quantize(..., seed=s)``).

Every op passes gradients straight through, as `anynum.quantize` does.

>>> import torch, anynum as an
>>> torch.ops.anynum.round(torch.tensor([0.3, 1000.0]), "e4m3fn", "nearest", "saturate", 0).tolist()
[0.3125, 448.0]
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.kernels.representable import check_overflow_fits, check_representable
from anynum.kernels.route import round_tensor
from anynum.rounding import CounterRandom, RandomSource, Rounding, parse_rounding

__all__ = ["register_stream", "round_op", "round_seeded_op", "round_stream_op"]

_streams: dict[int, Callable[[torch.device], RandomSource]] = {}
_stream_ids = itertools.count(1)


@functools.lru_cache(maxsize=1024)
def _resolve(fmt: str, mode: str, overflow: str, dtype: torch.dtype) -> tuple[Format, Rounding]:
    """The format and mode an op names, once `dtype` is known to hold what rounding onto it gives.

    The fake kernels call it too, so a compiled graph fails at trace time where eager
    `quantize` would (`anynum.kernels.representable`).
    """
    f = lookup_format(fmt)
    check_representable(f, dtype)
    check_overflow_fits(f, overflow, dtype)
    return f, parse_rounding(mode)


def _check_while_tracing(fmt: str, mode: str, overflow: str, dtype: torch.dtype) -> None:
    """`_resolve` from a fake kernel: its checks round real tensors, so fake mode is lifted for them."""
    with unset_fake_temporarily():
        _resolve(fmt, mode, overflow, dtype)


@torch.library.custom_op("anynum::round", mutates_args=())
def round_op(x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int) -> torch.Tensor:
    """`x` rounded onto the format named `fmt` in deterministic `mode` (rand_bits unused: pass 0)."""
    f, m = _resolve(fmt, mode, overflow, x.dtype)
    return _unaliased(round_tensor(f, x.detach(), m, overflow, None, None), x)


@round_op.register_fake
def _(x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int) -> torch.Tensor:
    _check_while_tracing(fmt, mode, overflow, x.dtype)
    return torch.empty_like(x)


@torch.library.custom_op(
    "anynum::round_stream", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def round_stream_op(
    x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int, stream: int
) -> torch.Tensor:
    """`x` rounded stochastically, with a fresh seed drawn from registered `stream` (rand_bits 0: exact)."""
    f, m = _resolve(fmt, mode, overflow, x.dtype)
    draw = _streams.get(stream)
    if draw is None:
        raise RuntimeError(f"anynum: random stream {stream} is not registered in this process")
    rng = draw(x.device)
    return _unaliased(round_tensor(f, x.detach(), m, overflow, rng, rand_bits or None), x)


@round_stream_op.register_fake
def _(x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int, stream: int) -> torch.Tensor:
    _check_while_tracing(fmt, mode, overflow, x.dtype)
    return torch.empty_like(x)


@torch.library.custom_op("anynum::round_seeded", mutates_args=())
def round_seeded_op(
    x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int, seed: int
) -> torch.Tensor:
    """`x` rounded stochastically with the counter-based stream of `seed` (``quantize(..., seed=)``)."""
    f, m = _resolve(fmt, mode, overflow, x.dtype)
    return _unaliased(round_tensor(f, x.detach(), m, overflow, CounterRandom(seed), rand_bits or None), x)


@round_seeded_op.register_fake
def _(x: torch.Tensor, fmt: str, mode: str, overflow: str, rand_bits: int, seed: int) -> torch.Tensor:
    _check_while_tracing(fmt, mode, overflow, x.dtype)
    return torch.empty_like(x)


def _straight_through(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    return (grad, None, None, None, None, None)[: ctx.inputs]  # type: ignore[attr-defined]


def _remember_arity(ctx: object, inputs: tuple[object, ...], output: torch.Tensor) -> None:
    ctx.inputs = len(inputs)  # type: ignore[attr-defined]


# Rounding passes gradients straight through (STE), as `anynum.quantize` does in eager mode.
for _op in (round_op, round_stream_op, round_seeded_op):
    _op.register_autograd(_straight_through, setup_context=_remember_arity)


def _unaliased(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A custom op's output must not share the input's storage."""
    return y.clone() if y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else y


def register_stream(owner: object, draw: Callable[[torch.device], RandomSource]) -> int:
    """Register `draw` (a fresh `RandomSource` per call) for ``anynum::round_stream``; returns its id.

    The entry lives as long as `owner` does.
    """
    stream = next(_stream_ids)
    _streams[stream] = draw
    weakref.finalize(owner, _streams.pop, stream, None)
    return stream
