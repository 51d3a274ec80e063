"""`Rounder`: one number category (format, rounding, overflow, random stream) resolved once.

Training loops round the same small tensors thousands of times per second; a
Rounder validates its arguments once and keeps the router's `Plan` per input
dtype and device, so each call is one plan lookup and one kernel call.
Quantizers, QAT layers, the quantized optimizer, the DDP hook, emulation and
the compat facades all round through Rounders.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.kernels.customop import register_stream
from anynum.kernels.pairop import each_op, pair_op, side
from anynum.kernels.route import Plan, plan_for
from anynum.kernels.settings import compile_mode
from anynum.quantize.checks import TORCH_FLOATS, check_overflow_fits, check_rand_bits, check_representable
from anynum.rounding import (
    CounterRandom,
    RandomSource,
    Rounding,
    RoundingLike,
    make_random_source,
    parse_rounding,
)

__all__ = ["Rounder", "pair_plan", "round_each_native", "round_pair"]

#: Tensor attribute holding the `_grid_tag` of the last `Rounder.mark_on_grid`.
_ON_GRID_ATTR = "_anynum_on_grid"


def _grid_tag(t: torch.Tensor, rounder: Rounder) -> tuple[Any, ...]:
    """What `Rounder.mark_on_grid` records: the grid, and the tensor's state as autograd tracks it.

    The version counter moves with every in-place write; the storage address and dtype move
    when the tensor is given new data (``p.data = ...``, ``module.half()``), which keeps the
    version.
    """
    return (rounder.fmt, rounder.overflow, t._version, t.data_ptr(), t.dtype)


class Rounder:
    """One number category, resolved once: format, rounding mode, overflow and random stream.

    Calling it rounds a tensor onto the grid without autograd (the result is a
    new tensor of the input's dtype). Stochastic modes draw from a private
    `torch.Generator` per device, seeded from `seed` (or, when neither seed nor
    generator is given, from torch's global generator at construction, so
    `torch.manual_seed` makes training reproducible); the stream advances on
    every call, so successive calls are independent.

    Results equal `anynum.quantize` with the same arguments bit for bit (the
    call skips its argument checks, done once here). Special values: NaN stays
    NaN, ±inf and overflow follow `overflow` (the format's default when None:
    inf if it has infinities, else saturate).

    >>> import torch, anynum as an
    >>> r = Rounder(an.E4M3FN)
    >>> r(torch.tensor([0.1, 500.0, float("inf")])).tolist()
    [0.1015625, 448.0, 448.0]
    """

    def __init__(
        self,
        fmt: Format | str,
        rounding: RoundingLike = "nearest",
        overflow: str | None = None,
        *,
        rand_bits: int | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        self.fmt = lookup_format(fmt)
        self.mode = parse_rounding(rounding)
        self.overflow = self.fmt.check_overflow(overflow)
        check_rand_bits(rand_bits, self.mode)
        self.rand_bits = rand_bits
        if generator is not None and seed is not None:
            raise AnynumError("pass either generator= or seed=, not both.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise AnynumError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        if self.mode.is_stochastic and generator is None and seed is None:
            seed = int(torch.randint(0, 2**62, (1,)))
        self.seed = seed
        self._stochastic = self.mode.is_stochastic
        self._generators: dict[torch.device, torch.Generator] = {}
        if generator is not None:
            self._generators[generator.device] = generator
        self._checked: set[torch.dtype] = set()
        self.spec = self.fmt.canonical_name  # how a traced graph names the format
        self._stream: int | None = None  # the random stream's id for compiled graphs
        self._register_stream()
        self._plans: dict[tuple[torch.dtype, str, str], Plan] = {}  # by (dtype, device type, switch)
        self._sides: dict[tuple[torch.dtype, str], list[int] | None] = {}  # native node's, by (dtype, switch)

    def __repr__(self) -> str:
        return f"Rounder({self.fmt.display_name()}, {self.mode.name}, overflow={self.overflow!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rounder) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self.fmt, self.mode, self.overflow, self.rand_bits, self.seed)

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator that feeds stochastic rounding on `device` (created on first use)."""
        g = self._generators.get(device)
        if g is None:
            if self.seed is None:
                raise AnynumError(
                    f"this Rounder was built with a generator on another device; got a tensor on {device}."
                )
            g = torch.Generator(device=device)
            g.manual_seed(self.seed + len(self._generators))
            self._generators[device] = g
        return g

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise a clear AnynumError when tensors of `dtype` cannot hold this format's values."""
        if dtype in self._checked:
            return
        if dtype not in TORCH_FLOATS:
            raise AnynumError(
                f"{self.fmt.display_name()} quantizes float16/bfloat16/float32/float64 tensors, "
                f"got {dtype}; convert it first (x.float())."
            )
        with torch.device("cpu"):  # callers may be building modules under torch.device("meta")
            check_representable(self.fmt, dtype)
            check_overflow_fits(self.fmt, self.overflow, dtype)
        self._checked.add(dtype)

    def plan(self, dtype: torch.dtype, device: str) -> Plan:
        """The router's `Plan` for this category on `dtype` tensors on `device` (resolved once)."""
        key = (dtype, device, compile_mode())  # the switch changes which kernels cover a call
        plan = self._plans.get(key)
        if plan is None:
            self.check_dtype(dtype)
            random = "counter" if self.mode.is_stochastic else None
            plan = plan_for(self.fmt, self.mode, self.overflow, self.rand_bits, dtype, device, random)
            self._plans[key] = plan
        return plan

    def _rng(self, device: torch.device) -> RandomSource | None:
        # The generator hands out one fresh seed per call, so successive calls are independent.
        if not self._stochastic:
            return None
        return make_random_source(self.generator(device), None, device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # What `quantize` does, minus the argument checks this object did once at construction.
        if torch.compiler.is_compiling():
            return self._as_custom_op(x)
        if not isinstance(x, torch.Tensor):
            raise AnynumError(
                f"a Rounder rounds torch tensors, got {type(x).__name__}; use an.quantize for NumPy, "
                "JAX and Dask arrays."
            )
        device = x.device
        plan = self.plan(x.dtype, device.type)
        # Kernels build no autograd graph from a tensor that does not require grad.
        xd = x.detach() if x.requires_grad else x
        rng = self._rng(device)
        direct = plan.direct
        if direct is not None:
            y = direct(xd, rng)
            if y is not None:
                return y
        return plan.run(xd, rng)

    def _as_custom_op(self, x: torch.Tensor) -> torch.Tensor:
        """The same rounding as one opaque ``anynum::`` op, for torch.compile and torch.export."""
        rand_bits = self.rand_bits or 0
        if not self.mode.is_stochastic:
            return torch.ops.anynum.round(x, self.spec, self.mode.value, self.overflow, rand_bits)
        assert self._stream is not None
        stream = self._stream
        return torch.ops.anynum.round_stream(x, self.spec, self.mode.value, self.overflow, rand_bits, stream)

    def round_into(self, x: torch.Tensor) -> None:
        """Round `x` in place (the values of ``self(x)``, written without a second buffer where the
        kernel can).

        >>> import torch, anynum as an
        >>> x = torch.tensor([0.3, 1000.0]); Rounder(an.E4M3FN).round_into(x); x.tolist()
        [0.3125, 448.0]
        """
        plan = self.plan(x.dtype, x.device.type)
        with torch.no_grad():
            plan.run(x.detach(), self._rng(x.device), x.detach())

    def round_each_into(
        self,
        tensors: list[torch.Tensor],
        stage: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]] | None = None,
    ) -> None:
        """Round the tensors of one dtype and device in place, as rounding their row-major
        concatenation would (for stochastic modes: one stream position for all of them).

        Where the kernel can, one call writes every tensor; elsewhere the concatenation is
        rounded in a flat buffer: ``stage()`` gives one (and views of it shaped like
        `tensors`) for callers that round the same tensors often, else a new one is made.
        NaN/inf as `__call__`.

        >>> import torch, anynum as an
        >>> a, b = torch.tensor([0.3]), torch.tensor([1000.0, 2.0])
        >>> Rounder(an.E4M3FN).round_each_into([a, b]); a.tolist(), b.tolist()
        ([0.3125], [448.0, 2.0])
        """
        if not tensors or round_each_native(tensors, self):
            return
        x0 = tensors[0]
        dtype, where = x0.dtype, x0.get_device()  # (get_device: an int, cheaper than .device)
        if any(t.dtype != dtype or t.get_device() != where for t in tensors):
            raise AnynumError(
                "round_each_into rounds tensors of one dtype and device together, got "
                f"{sorted({(str(t.dtype), str(t.device)) for t in tensors})}; group them first."
            )
        plan = self.plan(dtype, x0.device.type)
        rng = self._rng(x0.device)
        with torch.no_grad():
            if plan.round_each(tensors, rng):  # (the kernel reads addresses: no detach needed)
                return
            xs = [t.detach() for t in tensors]
            if stage is not None:
                flat, views = stage()
                torch._foreach_copy_(views, xs)
            else:
                flat = torch.cat([x.reshape(-1) for x in xs])
                views = list(flat.split([x.numel() for x in xs]))
            plan.run(flat, rng, flat)
            torch._foreach_copy_(xs, [v.view_as(x) for v, x in zip(views, xs)])

    # --- tensors known to be on the grid -----------------------------------------------------
    # Rounding a value of the grid gives it back, so a tensor that this grid's rounder has just
    # written needs no second rounding until it changes. "Changes" is read from the tensor's
    # version counter, the one autograd uses to detect in-place modification; like autograd it
    # cannot see writes through ``.data``.
    def mark_on_grid(self, *tensors: torch.Tensor) -> None:
        """Record that each tensor, as it is now, holds only values this rounder can produce.

        Call it right after writing this rounder's result into them. Only elementwise
        formats are recorded (re-rounding a block format can pick another scale).
        """
        if not isinstance(self.fmt, Block):
            for t in tensors:
                setattr(t, _ON_GRID_ATTR, _grid_tag(t, self))

    def is_identity_on(self, t: torch.Tensor) -> bool:
        """Whether rounding `t` now would return it unchanged because it is marked on this grid.

        True only for deterministic modes (a stochastic call would also advance the stream),
        the same format and overflow as the marking rounder, and an unmodified tensor.

        >>> import torch, anynum as an
        >>> r, w = Rounder(an.BF16), torch.tensor([1.0, 2.0])
        >>> r.mark_on_grid(w); r.is_identity_on(w)
        True
        >>> _ = w.add_(1e-3); r.is_identity_on(w)
        False
        """
        tag = getattr(t, _ON_GRID_ATTR, None)
        return tag is not None and not self._stochastic and tag == _grid_tag(t, self)

    def on_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Boolean mask: True where `x` is a value of the format (NaN counts if the format has NaN)."""
        self.check_dtype(x.dtype)
        xd = x.detach()
        device = xd.device.type
        nearest = plan_for(self.fmt, Rounding.NEAREST_EVEN, self.overflow, None, xd.dtype, device, None)
        with torch.no_grad():
            ok: torch.Tensor = nearest.run(xd, None) == xd
        if self.fmt.has_nan:
            ok |= torch.isnan(xd)
        return ok

    # Generators are plain state; pickling/deepcopy keep the stream position. Plans and the
    # compiled graphs' stream registration belong to this object in this process.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plans": {}, "_sides": {}, "_stream": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sides = {}  # (also for Rounders pickled before the native pair node existed)
        self._register_stream()

    def _register_stream(self) -> None:
        # Registered up front: a compiled graph cannot trace the registration itself.
        if self.mode.is_stochastic:
            self._stream = register_stream(self, _StreamOf(self))

    def state_dict(self) -> dict[str, Any]:
        return {str(d): g.get_state() for d, g in self._generators.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the generators `state_dict` saved; AnynumError for a device this machine lacks
        (torch makes a generator for cuda:7 on a one-GPU machine without a word)."""
        for d, s in state.items():
            device = torch.device(d)
            count = getattr(getattr(torch, device.type, None), "device_count", None)
            have = count() if device.index is not None and count is not None else None
            if have is not None and device.index >= have:
                here = f"{device.type}:0 to {device.type}:{have - 1}" if have else f"no {device.type} device"
                raise AnynumError(
                    f"a random-stream state for device {device}: expected a device this machine has "
                    f"({here}), got {device}; fix: load it on a machine with that device, or drop "
                    "the entry to start that stream afresh."
                )
            self.generator(device).set_state(s)


def _side(rounder: Rounder | None, dtype: torch.dtype) -> list[int] | None:
    """`rounder`'s side of the native pair node for CPU tensors of `dtype` ([] for none), else None."""
    if rounder is None:
        return []
    if type(rounder) is not Rounder:
        return None  # a subclass may round its own way (fault injection, benchmarks' stand-ins)
    key = (dtype, compile_mode())
    if key not in rounder._sides:
        rounder._sides[key] = side(rounder.plan(dtype, "cpu"))
    return rounder._sides[key]


def round_pair(x: torch.Tensor, fwd: Rounder | None, bwd: Rounder | None) -> torch.Tensor | None:
    """`x` rounded by `fwd`, its gradient rounded by `bwd` on the way back, in one native autograd
    node (`anynum.kernels.pairop`); None where that node cannot take the call (not a plain CPU
    tensor, the C library not first for either rounder, the node not built, torch.compile
    tracing): the caller's Python autograd Function gives the same bits then.

    A None rounder passes its direction unchanged. Random draws happen when the Python
    Function would make them (the forward's now, the backward's in the backward), so the
    streams are the same on either path. NaN/inf follow each rounder's format.

    >>> import torch, anynum as an
    >>> x = torch.tensor([0.3, 3.3], requires_grad=True)
    >>> y = round_pair(x, Rounder(an.E4M3FN), Rounder(an.E5M2))
    >>> y is None or y.detach().tolist() == [0.3125, 3.25]
    True
    """
    if type(x) is not torch.Tensor or not x.is_cpu or torch.compiler.is_compiling():
        return None
    dtype = x.dtype
    fwd_side, bwd_side = _side(fwd, dtype), _side(bwd, dtype)
    if fwd_side is None or bwd_side is None:
        return None
    op = pair_op()
    if op is None:
        return None
    seed = 0
    if fwd is not None and fwd._stochastic:
        rng = fwd._rng(x.device)
        assert isinstance(rng, CounterRandom)
        seed = rng.seed
    generator = bwd.generator(x.device) if bwd is not None and bwd._stochastic else None
    y: torch.Tensor = op(x, fwd_side, bwd_side, seed, generator)
    return y


def pair_plan(fwd: Rounder | None, bwd: Rounder | None, dtype: torch.dtype) -> tuple[Any, ...] | None:
    """``(op, fwd side, bwd side, compile mode)``: what `round_pair` calls for a plain CPU tensor
    of `dtype`, planned once for a pair that draws no random bits (a `fwd`, neither stochastic);
    None for any other pair, or where `round_pair` would decline.

    The plan holds while the compile mode is the one it names: ``op(x, fwd side, bwd side (or []
    outside autograd), 0, None)`` is then ``round_pair(x, fwd, bwd)`` (or ``round_pair(x, fwd,
    None)``) for such an `x`, without its checks, which an activation point in a training step
    pays for at every call.

    >>> import torch, anynum as an
    >>> plan = pair_plan(Rounder(an.E4M3FN), Rounder(an.E5M2), torch.float32)
    >>> plan is None or plan[0](torch.tensor([0.3]), plan[1], [], 0, None).tolist() == [0.3125]
    True
    """
    if fwd is None or torch.compiler.is_compiling():
        return None
    fwd_side, bwd_side = _side(fwd, dtype), _side(bwd, dtype)  # (None for what is not a Rounder)
    if fwd_side is None or bwd_side is None or fwd._stochastic or (bwd is not None and bwd._stochastic):
        return None
    op = pair_op()
    return None if op is None else (op, fwd_side, bwd_side, compile_mode())


#: What the native group rounding takes as it is (Parameters: the optimizer's weights).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def round_each_native(tensors: list[torch.Tensor], rounder: Rounder) -> bool:
    """Round `tensors` in place as `Rounder.round_each_into` rounds them, in one native call whose
    checks run in C++ (`anynum.kernels.pairop.each_op`); False, with nothing written and nothing
    drawn, where that call cannot take them (not all contiguous plain CPU tensors of one dtype,
    the C library not first for `rounder`, the node not built, torch.compile tracing).

    An optimizer's group of small tensors costs more in per-tensor Python checks than in
    rounding; this is the path without them. NaN/inf as `Rounder.__call__`.

    >>> import torch, anynum as an
    >>> a, b = torch.tensor([0.3]), torch.tensor([1000.0, 2.0])
    >>> r = Rounder(an.E4M3FN)
    >>> if not round_each_native([a, b], r):  # declined: nothing written, the Python path then
    ...     r.round_each_into([a, b])
    >>> a.tolist(), b.tolist()
    ([0.3125], [448.0, 2.0])
    """
    x0 = tensors[0]
    if not x0.is_cpu or torch.compiler.is_compiling():
        return False
    group_side = _side(rounder, x0.dtype)
    if not group_side:  # None: not the C library's call; []: no rounder
        return False
    op = each_op()
    if op is None:
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS:  # a subclass may dispatch this op its own way
            return False
    generator = rounder.generator(x0.device) if rounder._stochastic else None
    undecided: int = op(tensors, group_side, generator)
    return undecided >= 0


class _StreamOf:
    """The random stream of a Rounder for ``anynum::round_stream``, without keeping the Rounder alive."""

    def __init__(self, rounder: Rounder) -> None:
        self.rounder = weakref.ref(rounder)

    def __call__(self, device: torch.device) -> RandomSource:
        rounder = self.rounder()
        if rounder is None:
            raise RuntimeError("anynum: the Rounder of this random stream no longer exists")
        rng = rounder._rng(device)
        assert rng is not None
        return rng
