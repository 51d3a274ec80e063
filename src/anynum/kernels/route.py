"""The one place that decides how a rounding runs: kernels register, the router picks.

Every way of rounding a tensor onto a format (the eager torch reference, the C
loops, torch.compile'd kernels, torch's own casts) is a `Kernel` registered here
with what it covers and a rank. For a `Call` (format, rounding mode, overflow
policy, rand_bits, tensor dtype and device, kind of random source) the router
lists the covering kernels by rank, once, in a `Plan`; each call then takes the
first of them that accepts its size (and does not decline at run time, e.g. a C
library that could not be built). The eager reference covers everything, so a
plan is never empty. Nothing else in the package tests "is this a float format
on a float32 CPU tensor": quantize, encode/decode, blocks, `Rounder` (QAT,
optimizers), emulation and the compat facades all ask the router.

Adding a backend (a GPU kernel, a new C loop) means one kernel module that calls
`register`, plus one import line in `anynum.kernels`.

>>> import torch, anynum as an
>>> from anynum.rounding import Rounding
>>> plan = plan_for(an.E4M3FN, Rounding.TOWARD_ZERO, "saturate", None, torch.float32, "cpu", None)
>>> plan.kernel_names()[-1]
'eager'
>>> plan.run(torch.tensor([0.3, -500.0]), None).tolist()
[0.28125, -448.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from anynum.formats.base import Format
from anynum.kernels.settings import compile_mode
from anynum.rounding import RandomSource, Rounding

__all__ = [
    "Call",
    "Kernel",
    "Plan",
    "can_write_while_reading",
    "decode_codes",
    "encode_values",
    "kernels",
    "plan_for",
    "random_kind",
    "register",
    "round_tensor",
]


@dataclass(frozen=True)
class Call:
    """What the router chooses by (everything but the tensor's size, which each call brings).

    ``random`` is None for deterministic modes, "counter" for counter-based random
    bits (`anynum.rounding.CounterRandom`: addressable by element index, so a fused
    loop can draw them itself) and "custom" for any other `RandomSource`.
    """

    fmt: Format
    mode: Rounding
    overflow: str
    rand_bits: int | None
    dtype: torch.dtype
    device: str
    random: str | None

    def __post_init__(self) -> None:
        # Kernels key their per-call state by the Call; hashing a format's fields anew on every
        # rounding call would cost more than a small tensor's rounding.
        fields = (self.fmt, self.mode, self.overflow, self.rand_bits, self.dtype, self.device, self.random)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]


def random_kind(rng: RandomSource | None) -> str | None:
    """The `Call.random` of a random source: None, "counter" or "custom"."""
    if rng is None:
        return None
    return "counter" if rng.stream_base(0) is not None else "custom"


#: `Kernel.direct`'s lean path: ``run(x, rng)`` -> the rounded tensor, or None to hand on.
Direct = Callable[[torch.Tensor, RandomSource | None], torch.Tensor | None]


class Kernel:
    """One way of rounding tensors. Subclasses say what they cover and run it.

    ``rank``: lower ranks are tried first. `covers` sees only the `Call` (so its
    answer is cached in the plan); `accepts` sees the size at each call. `round`
    returns the rounded tensor (x's dtype and shape, a new tensor or `out`), or
    None to decline at run time, which hands the call to the next kernel.
    """

    name: ClassVar[str] = "kernel"
    rank: ClassVar[int] = 50

    def covers(self, call: Call) -> bool:
        raise NotImplementedError

    def accepts(self, call: Call, numel: int) -> bool:
        return True

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Round `x` (detached, any float dtype) per `call`; write into `out` where it can."""
        raise NotImplementedError

    def direct(self, call: Call) -> Direct | None:
        """A lean form of `round` for the first kernel of a plan, or None: ``run(x, rng)`` rounds
        a contiguous `x` into a new tensor, or returns None, having changed nothing, to hand
        the call to the plan's full route (per-call overhead is most of a small call)."""
        return None

    def round_each(self, call: Call, xs: list[torch.Tensor], rng: RandomSource | None) -> bool:
        """Round the contiguous tensors `xs` in place as their concatenation would be rounded
        (element i of ``xs[k]`` at logical index ``sum of the earlier sizes + i``); False (and
        nothing written) where this kernel cannot."""
        return False

    def encode(self, fmt: Format, y: torch.Tensor) -> torch.Tensor | None:
        """int64 codes of `y` (values on the grid, any float dtype), or None to decline."""
        return None

    def decode(self, fmt: Format, codes: torch.Tensor) -> torch.Tensor | None:
        """float64 values of int64 `codes` (all valid), or None to decline."""
        return None

    def __repr__(self) -> str:
        return f"<kernel {self.name} rank={self.rank}>"


_registry: list[Kernel] = []
_BY_IDENTITY: dict[tuple[object, ...], tuple[Format, Plan]] = {}  # plan_for's cache (see there)


def register(kernel: Kernel) -> Kernel:
    """Add `kernel` to the router (kernels of equal rank keep their registration order)."""
    if any(k.name == kernel.name for k in _registry):
        raise ValueError(f"a kernel named {kernel.name!r} is registered already")
    _registry.append(kernel)
    _registry.sort(key=lambda k: k.rank)
    _plan.cache_clear()
    _BY_IDENTITY.clear()
    return kernel


def kernels() -> list[Kernel]:
    """Every registered kernel, in rank order."""
    return list(_registry)


def can_write_while_reading(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether an elementwise loop may store into `out` as it reads `x`.

    True when they share no storage, or when `out` is `x` element for element (in
    place). A shifted or differently strided view of the same storage would read
    elements already overwritten.
    """
    if out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
        return True
    return out.data_ptr() == x.data_ptr() and out.stride() == x.stride()


class Plan:
    """The kernels covering one `Call`, in rank order, resolved once (see `plan_for`).

    ``direct``: the first kernel's lean path (`Kernel.direct`), or None.
    """

    __slots__ = ("call", "direct", "kernels")

    def __init__(self, call: Call, covering: tuple[Kernel, ...]) -> None:
        self.call = call
        self.kernels = covering
        self.direct = covering[0].direct(call) if covering else None

    def kernel_names(self) -> list[str]:
        return [k.name for k in self.kernels]

    def choose(self, numel: int) -> Kernel:
        """The first kernel that accepts `numel` elements (before any run-time decline)."""
        return next(k for k in self.kernels if k.accepts(self.call, numel))

    def run(
        self, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Round `x` (detached, of the call's dtype and device); the result is `out` when given."""
        numel = x.numel()
        for kernel in self.kernels:
            if not kernel.accepts(self.call, numel):
                continue
            y = kernel.round(self.call, x, rng, out)
            if y is None:
                continue
            if out is not None and y is not out:
                out.copy_(y)
                return out
            return y
        raise AssertionError(f"no kernel ran {self.call}")  # pragma: no cover - eager covers all

    def round_each(self, xs: list[torch.Tensor], rng: RandomSource | None) -> bool:
        """Round `xs` (contiguous, of the call's dtype and device; under no_grad) in place in
        one call, as their concatenation would be; False where the kernel that takes their total
        size cannot (the caller then rounds the concatenation itself)."""
        first = self.kernels[0] if self.kernels else None
        if first is None or not first.accepts(self.call, sum([x.numel() for x in xs])):
            return False  # (a later kernel may take the concatenation: the caller's flat path)
        return first.round_each(self.call, xs, rng)


@functools.lru_cache(maxsize=4096)
def _plan(call: Call, settings: tuple[str, ...]) -> Plan:
    return Plan(call, tuple(k for k in _registry if k.covers(call)))


def _settings() -> tuple[str, ...]:
    # Kernels read these switches in `covers`; plans made under other values are other plans.
    return (compile_mode(),)


def plan_for(
    fmt: Format,
    mode: Rounding,
    overflow: str,
    rand_bits: int | None,
    dtype: torch.dtype,
    device: str,
    random: str | None,
) -> Plan:
    """The `Plan` for rounding `dtype` tensors on `device` onto `fmt` (cached per distinct call)."""
    settings = _settings()
    # Keyed by the format's identity: hashing a format's fields costs 1-2 us, a good part of a
    # 4k-element call. The entry holds the format itself (the plan may hold an equal, older
    # one), so the id cannot be reused while the entry lives.
    key = (id(fmt), mode, overflow, rand_bits, dtype, device, random, settings)
    entry = _BY_IDENTITY.get(key)
    if entry is None or entry[0] is not fmt:
        if len(_BY_IDENTITY) >= 4096:
            _BY_IDENTITY.clear()
        call = Call(fmt, mode, overflow, rand_bits, dtype, device, random)
        entry = _BY_IDENTITY[key] = (fmt, _plan(call, settings))
    return entry[1]


def round_tensor(
    fmt: Format,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round `x` (a detached float tensor) onto `fmt`: the values `anynum.quantize` returns.

    No argument checks (the front door does them); `out`, if given, has x's shape,
    dtype and device. NaN/inf/overflow follow `overflow` as documented in `anynum.quantize`.
    """
    plan = plan_for(fmt, mode, overflow, rand_bits, x.dtype, x.device.type, random_kind(rng))
    return plan.run(x, rng, out)


def encode_values(fmt: Format, y: torch.Tensor) -> torch.Tensor:
    """int64 codes of `y` (values already on `fmt`'s grid); NaN gives the NaN code."""
    call = Call(fmt, Rounding.NEAREST_EVEN, fmt.default_overflow, None, y.dtype, y.device.type, None)
    plan = _plan(call, _settings())
    numel = y.numel()
    for kernel in plan.kernels:
        if kernel.accepts(call, numel):
            codes = kernel.encode(fmt, y)
            if codes is not None:
                return codes
    raise AssertionError(f"no kernel encoded {fmt!r}")  # pragma: no cover - eager covers all


def decode_codes(fmt: Format, codes: torch.Tensor) -> torch.Tensor:
    """float64 values of int64 `codes` (every code valid for `fmt`)."""
    device = codes.device.type
    call = Call(fmt, Rounding.NEAREST_EVEN, fmt.default_overflow, None, torch.float64, device, None)
    plan = _plan(call, _settings())
    numel = codes.numel()
    for kernel in plan.kernels:
        if kernel.accepts(call, numel):
            values = kernel.decode(fmt, codes)
            if values is not None:
                return values
    raise AssertionError(f"no kernel decoded {fmt!r}")  # pragma: no cover - eager covers all
