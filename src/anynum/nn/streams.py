"""Checkpoints of stochastic rounding's random streams: the one convention every owner follows.

A run resumed from a checkpoint is bit-identical to the uninterrupted run only if the
random streams of stochastic rounding are saved and restored with the weights. So every
object that owns a stream saves it in its own ``state_dict``, as flat tensor entries:

* a module (converted layer, `anynum.nn` layer, `Quantizer`) at
  ``<prefix>_anynum_rng.<category>.<field>`` (`register_stream_hooks` adds the hooks);
* an optimizer (`QuantizedOptimizer`) at ``state_dict()["rng"]["<category>.<field>"]``.

The fields of a stream (`stream_state`):

* ``seed``: int64 0-d tensor, the seed that generators for devices not used yet derive
  from (stored mod 2**64, as ``torch.Generator.manual_seed`` reads it);
* ``state.<device>``: uint8 tensor, ``torch.Generator.get_state()`` of the stream on
  that device (``state.cpu``, ``state.cuda:0``);
* ``calls``: int64 0-d tensor, the position of a counter-based `CounterStream`.

Only tensors: a checkpoint loads with ``torch.load(weights_only=True)`` and a model's
``state_dict`` still saves with safetensors. Only streams of stochastic rounders are
written (deterministic modes draw nothing).

Loading (`load_stream_state`) restores seeds, per-device states and positions. An entry
for a category that is not stochastic in the object being loaded is ignored (nothing
draws from it); a device this machine lacks is skipped with a `StreamWarning`. A
checkpoint written before streams were saved (no ``_anynum_rng`` / ``rng`` entries)
still loads, strict or not: the streams then continue from their state in the new
object (the seed of its policy), so the resumed run is reproducible but not
bit-identical to the uninterrupted one. See docs/semantics.md ("Checkpoints").

>>> import torch, anynum as an
>>> q = an.Quantizer(forward="bf16", forward_rounding="sr", seed=3)
>>> _ = q(torch.ones(4) / 3)
>>> sorted(q.state_dict())
['_anynum_rng.forward.seed', '_anynum_rng.forward.state.cpu']
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from anynum.errors import AnynumError

if TYPE_CHECKING:
    from anynum.quantize.rounder import Rounder

__all__ = [
    "STREAM_KEY",
    "CounterStream",
    "StreamWarning",
    "load_stream_state",
    "register_stream_hooks",
    "stream_state",
]

#: The state_dict key component under which modules keep their streams.
STREAM_KEY = "_anynum_rng"

_MASK64 = (1 << 64) - 1


class StreamWarning(UserWarning):
    """A saved random stream could not be restored exactly (e.g. its device is absent here)."""


class CounterStream:
    """A counter-based stream: its seeds are hashes of (seed, position, parts); its state is
    (seed, position), two integers.

    Every process that advances it the same number of times is at the same position, so
    one saved position restores them all (the DDP hook's streams: rank 0 saves, every
    rank resumes).

    >>> s = CounterStream(7)
    >>> a = s.derive("send", 0); s.advance()
    >>> a != s.derive("send", 0), s.calls
    (True, 1)
    """

    def __init__(self, seed: int, calls: int = 0) -> None:
        self.seed = int(seed)
        self.calls = int(calls)

    def derive(self, *parts: object) -> int:
        """A 62-bit seed for this position and `parts` (independent streams for different parts)."""
        text = "/".join(map(str, (self.seed, self.calls, *parts)))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2

    def advance(self) -> None:
        """Move to the next position."""
        self.calls += 1


Stream = Union["Rounder", CounterStream]
StreamsOf = Callable[[nn.Module], Mapping[str, Stream | None]]


def _int64(v: int) -> torch.Tensor:
    v &= _MASK64
    return torch.tensor(v - (1 << 64) if v >> 63 else v, dtype=torch.int64)


def _stochastic(stream: Stream | None) -> Stream | None:
    """`stream` if it draws random bits (a counter stream, or a stochastic rounder), else None."""
    if isinstance(stream, CounterStream) or (stream is not None and stream.mode.is_stochastic):
        return stream
    return None


def stream_state(streams: Mapping[str, Stream | None]) -> dict[str, torch.Tensor]:
    """The flat entries ``{"<category>.<field>": tensor}`` of every stream that draws random bits.

    >>> import anynum as an
    >>> sorted(stream_state({"grad": an.nn.Rounder("e5m2", "sr", seed=1), "weight": an.nn.Rounder("bf16")}))
    ['grad.seed']
    """
    out: dict[str, torch.Tensor] = {}
    for name, maybe in streams.items():
        stream = _stochastic(maybe)
        if stream is None:
            continue
        if isinstance(stream, CounterStream):
            out[f"{name}.seed"] = _int64(stream.seed)
            out[f"{name}.calls"] = torch.tensor(stream.calls, dtype=torch.int64)
            continue
        if stream.seed is not None:
            out[f"{name}.seed"] = _int64(stream.seed)
        for device, state in stream.state_dict().items():
            out[f"{name}.state.{device}"] = state.detach().cpu().clone()
    return out


def _group(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"a.seed": s, "a.state.cpu": t}`` to ``{"a": {"seed": s, "state.cpu": t}}``.

    Category names may hold dots (``state.exp_avg``): the field is what follows the
    last ``.seed`` / ``.calls`` / ``.state.``.
    """
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        for marker in (".seed", ".calls", ".state."):
            cut = len(key) - len(marker) if key.endswith(marker) else key.rfind(marker)
            if cut > 0 and (marker == ".state." or key.endswith(marker)):
                grouped.setdefault(key[:cut], {})[key[cut + 1 :]] = value
                break
        else:
            raise AnynumError(
                f"cannot read the random-stream entry {key!r}: expected '<category>.seed', "
                "'<category>.calls' or '<category>.state.<device>' (written by anynum's state_dict)."
            )
    return grouped


def _as_int(value: Any, key: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise AnynumError(f"random-stream entry {key!r} must be an integer tensor, got {value!r}.")


def _load_rounder(rounder: Rounder, name: str, fields: Mapping[str, Any], where: str) -> None:
    if "seed" in fields and rounder.seed is not None:
        rounder.seed = _as_int(fields["seed"], f"{name}.seed")
    for field, value in fields.items():
        if not field.startswith("state."):
            continue
        device = field[len("state.") :]
        if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
            raise AnynumError(
                f"random-stream entry {name}.{field} must be a uint8 tensor "
                f"(torch.Generator.get_state()), got {type(value).__name__}."
            )
        try:
            rounder.load_state_dict({device: value.cpu()})
        except (RuntimeError, AnynumError) as exc:  # no such device here, or another generator's state
            warnings.warn(
                f"{where}: the stream '{name}' saved for device {device} cannot be restored here "
                f"({exc}); stochastic rounding on {device} will not repeat the saved run.",
                StreamWarning,
                stacklevel=4,
            )


def load_stream_state(
    streams: Mapping[str, Stream | None], state: Mapping[str, Any], where: str = "load_state_dict"
) -> None:
    """Restore what `stream_state` wrote into the matching `streams` (see the module docstring).

    Also reads the older optimizer layout ``{category: {device: state}}``.

    >>> import torch, anynum as an
    >>> a, b = an.nn.Rounder("e5m2", "sr", seed=1), an.nn.Rounder("e5m2", "sr", seed=2)
    >>> _ = a(torch.ones(3) / 3); saved = stream_state({"g": a}); x = torch.rand(100)
    >>> load_stream_state({"g": b}, saved); torch.equal(a(x), b(x))
    True
    """
    old = {k: v for k, v in state.items() if isinstance(v, Mapping)}
    grouped = _group({k: v for k, v in state.items() if k not in old})
    for name, devices in old.items():  # {category: {device: ByteTensor}} (anynum <= 0.1 optimizers)
        grouped.setdefault(name, {}).update({f"state.{d}": s for d, s in devices.items()})
    for name, fields in grouped.items():
        stream = _stochastic(streams.get(name))
        if stream is None:
            continue  # nothing here draws from that stream
        if isinstance(stream, CounterStream):
            if "seed" in fields:
                stream.seed = _as_int(fields["seed"], f"{name}.seed")
            if "calls" in fields:
                stream.calls = _as_int(fields["calls"], f"{name}.calls")
        else:
            _load_rounder(stream, name, fields, where)


class _SaveStreams:
    """state_dict post-hook: writes the module's streams at ``<prefix>_anynum_rng.*``."""

    def __init__(self, streams_of: StreamsOf) -> None:
        self.streams_of = streams_of

    def __call__(self, module: nn.Module, state_dict: dict[str, Any], prefix: str, meta: Any) -> None:
        for key, value in stream_state(self.streams_of(module)).items():
            state_dict[f"{prefix}{STREAM_KEY}.{key}"] = value


class _LoadStreams:
    """load_state_dict pre-hook: takes the ``<prefix>_anynum_rng.*`` entries out and restores them."""

    def __init__(self, streams_of: StreamsOf) -> None:
        self.streams_of = streams_of

    def __call__(self, module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        start = f"{prefix}{STREAM_KEY}."
        mine = {k[len(start) :]: state_dict.pop(k) for k in [k for k in state_dict if k.startswith(start)]}
        if mine:
            load_stream_state(self.streams_of(module), mine, f"load_state_dict of {prefix or 'the model'}")


def register_stream_hooks(module: nn.Module, streams_of: StreamsOf) -> tuple[RemovableHandle, ...]:
    """Make `module`'s ``state_dict`` save, and ``load_state_dict`` restore, ``streams_of(module)``.

    `streams_of` must be a module-level function (hooks are deep-copied and pickled with
    the module) returning ``{category: Rounder | CounterStream | None}``. Returns the hook
    handles (``handle.remove()`` undoes it).

    >>> import torch
    >>> def streams_of(module):
    ...     return {"noise": module.stream}
    >>> m = torch.nn.Identity(); m.stream = CounterStream(5, calls=3)
    >>> handles = register_stream_hooks(m, streams_of)
    >>> {k: int(v) for k, v in m.state_dict().items()}
    {'_anynum_rng.noise.seed': 5, '_anynum_rng.noise.calls': 3}
    """
    return (
        module.register_state_dict_post_hook(_SaveStreams(streams_of)),
        module.register_load_state_dict_pre_hook(_LoadStreams(streams_of)),
    )
