"""The fast path: the reference kernels compiled into one fused loop by torch.compile (Inductor).

It runs *the same Python code* as the eager reference (`round_to_format`), so
the two agree bit for bit by construction; tests check it anyway. Random bits
come from the counter-based generator (`anynum.rounding.counter_bits`), which
is a pure function of (seed, element index), so the fused loop draws them
in-register and reproduces the eager bits exactly, whatever the thread count.

Exact stochastic rounding compares 53 random bits per element in the fused
loop; in the (probability 2**-53 per element) event that more bits are needed,
the call is redone on the eager path, which refines them.

On CPU the native C kernels (`anynum.kernels.ckernel`, a lower rank in the router)
take every call they cover, so this compiled path runs there only for calls they
decline (no C compiler, a format family they do not cover); it serves other devices.

Switch: ``ANYNUM_COMPILE=0`` forces the eager path, ``=1`` compiles for every
size, unset ("auto") compiles only for tensors of at least ``ANYNUM_COMPILE_MIN``
elements (default 262144), where the one-off compile pays for itself. Compiled
kernels are cached in memory per (format, mode, overflow, rand_bits, dtype) and
on disk by Inductor's own cache, so a later process starts warm.
"""

from __future__ import annotations

import functools
import threading
import types
import warnings
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

import torch

from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.kernels.nativelib import inductor_cache_unsafe
from anynum.kernels.route import Call, Kernel, can_write_while_reading, register
from anynum.kernels.settings import Setting, compile_min, compile_mode, compiles_at
from anynum.rounding import RandomSource, Rounding, counter_bits

__all__ = [
    "FusedKernel",
    "compile_min",
    "compile_mode",
    "fused_decode",
    "fused_encode",
    "fused_round",
    "own_code",
    "run_compiled",
    "static_ints",
    "use_fused",
]

_failed: set[Hashable] = set()  # compiled kernels that failed: their callers stay eager
_compile_lock = threading.RLock()  # see `run_compiled`


#: Why Inductor's cache directory is unsafe for this user (None: it is private), per its setting.
_INDUCTOR_CACHE_UNSAFE = Setting("TORCHINDUCTOR_CACHE_DIR", lambda _: inductor_cache_unsafe())


def use_fused(x: torch.Tensor, rng: RandomSource | None, mode: str | None = None) -> bool:
    """Whether `x` should take the compiled path (`mode`: `compile_mode()`, if already read)."""
    mode = compile_mode() if mode is None else mode
    if mode == "0" or (rng is not None and rng.stream_base(0) is None):
        return False
    if mode == "1":
        return True
    return x.numel() >= compile_min()


class _StreamZero(RandomSource):
    """Counter bits of stream 0 from a base held in a tensor (so it is a graph input, not a constant)."""

    def __init__(self, base: torch.Tensor):
        self.base = base
        self.excess: torch.Tensor | None = None

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        assert stream == 0, "the fused path draws only the first round of random bits"
        return counter_bits(self.base, index, nbits)

    def defer_undecided(self, excess: torch.Tensor) -> bool:
        self.excess = excess
        return True


def _kernel_body(
    fmt: Format, mode: Rounding, overflow: str, rand_bits: int | None, with_out: bool
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    # Resolved here, not traced: tracing singledispatch fills its cache and costs a recompile.
    kernel = round_to_format.dispatch(type(fmt))

    def body(
        x: torch.Tensor, base: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rng = _StreamZero(base)
        y = kernel(fmt, x, mode, overflow, rng, rand_bits)
        # A float sum, not a bool any(): bool masks of int64 comparisons are slow in Inductor's loop.
        pending = rng.excess.sum() > 0 if rng.excess is not None else torch.zeros((), dtype=torch.bool)
        if out is not None:  # written inside the graph, so the fused loop stores straight into it
            out.copy_(y)
            return out, pending
        return y, pending

    return body


@functools.lru_cache(maxsize=256)
def _compiled(
    fmt: Format,
    mode: Rounding,
    overflow: str,
    rand_bits: int | None,
    dtype: torch.dtype,
    with_out: bool = False,
) -> CompiledKernel:
    return CompiledKernel(own_code(_kernel_body(fmt, mode, overflow, rand_bits, with_out)))


class _Plan:
    """How to call one captured graph: where each of its inputs comes from, and when that is valid."""

    def __init__(self, graph: Callable[..., Any], sources: list[tuple[str, Any]], args: tuple[Any, ...]):
        # Dynamo wraps the graph so that it is never traced itself; called from eager code,
        # as here, the wrapper only costs time.
        self.graph = getattr(graph, "__wrapped__", graph)
        self.sources = sources
        self.signature = [(a.dtype, a.device, a.dim()) for a in args]
        self.threads = torch.get_num_threads()

    def call(self, args: tuple[torch.Tensor, ...]) -> Any:
        """The graph's outputs for `args`, or None where the captured graph may not apply."""
        if torch.get_num_threads() != self.threads or len(args) != len(self.signature):
            return None
        for a, (dtype, device, dim) in zip(args, self.signature):
            if a.dtype != dtype or a.device != device or a.dim() != dim or not a.is_contiguous():
                return None
        numel = args[0].numel()
        if numel < 2:  # dynamo specialises sizes 0 and 1
            return None
        inputs = [
            args[v] if kind == "arg" else numel if kind == "numel" else v for kind, v in self.sources
        ]
        return self.graph(*inputs)


def _plan(graph: Callable[..., Any], example_inputs: list[Any], args: tuple[Any, ...]) -> _Plan | None:
    """A `_Plan` for a graph compiled from a call with `args`, or None if its inputs are not understood.

    A backend's graph takes its inputs in the order of `example_inputs` (the torch.compile
    backend contract): our tensors, the dynamic size of the first one, and constants that
    dynamo lifted (format floats it wrapped as tensors), which stay as they were.
    """
    if any(not isinstance(a, torch.Tensor) or a.requires_grad for a in args) or args[0].dim() != 1:
        return None
    sources: list[tuple[str, Any]] = []
    for e in example_inputs:
        mine = [i for i, a in enumerate(args) if e is a]
        if mine:
            sources.append(("arg", mine[0]))
        elif isinstance(e, torch.SymInt) and getattr(e.node, "hint", None) == args[0].numel():
            sources.append(("numel", None))
        elif isinstance(e, torch.Tensor):
            sources.append(("const", e))
        else:  # a static size or anything else: leave this graph to dynamo
            return None
    if ("numel", None) not in sources:
        return None  # compiled for one size only
    return _Plan(graph, sources, args)


class CompiledKernel:
    """A kernel body compiled by torch.compile, then called straight through its compiled graph.

    Dynamo's work on each call (guard checks, frame set-up, config patching) costs about
    35 us, more than rounding a 16k-element tensor. The bodies here are pure functions of
    tensors, with every format constant baked into their own code, so once dynamo has
    compiled a graph for 1-D contiguous inputs of dynamic size, that graph serves every
    later call with inputs of the same dtypes, devices and thread count: it is called
    directly (a plan checks those conditions first; anything else goes through dynamo,
    which may compile again, and the new graph is captured). Calls run under no_grad
    (the kernels are not differentiated), so grad mode never triggers a second compile.
    """

    def __init__(self, body: Callable[..., Any]) -> None:
        self._guarded = static_ints(torch.compile(body, backend=self._backend, dynamic=None, fullgraph=True))
        self._captured: tuple[Callable[..., Any], list[Any]] | None = None
        self._plan: _Plan | None = None

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._inductor.compile_fx import compile_fx

        graph = cast(Callable[..., Any], compile_fx(gm, example_inputs))  # a callable for graphs
        self._captured = (graph, list(example_inputs))
        return graph

    def __call__(self, *args: torch.Tensor) -> Any:
        with torch.no_grad():
            if self._plan is not None:
                out = self._plan.call(args)
                if out is not None:
                    return out
            self._captured = None
            out = self._guarded(*args)
            if self._captured is not None:  # compiled during this call, from these very args
                self._plan = _plan(*self._captured, args)
                self._captured = None
            return out


def static_ints(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Call `compiled` with Python ints specialised (format constants must stay constants).

    Without this, dynamo's automatic-dynamic profile (kept per source location,
    even across processes) turns ints such as ``rand_bits`` into symbols after
    it has seen two values, and Inductor 2.13 then emits ``1 << n`` as a 32-bit
    C++ shift: wrong masks for n >= 32.
    """

    def call(*args: Any) -> Any:
        with torch._dynamo.config.patch(specialize_int=True, automatic_dynamic_local_pgo=False):
            return compiled(*args)

    return call


def own_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of closure `fn` with its own code object, hence its own dynamo cache.

    Dynamo caches compiled graphs per code object and guards on closure values;
    closures of one code object that differ in an int (man_bits, rand_bits, ...)
    would soon be recompiled with that int made symbolic, which is slower and
    has produced wrong shift masks. One code object per kernel keeps every
    format constant static; only tensor sizes become dynamic.
    """
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


T = TypeVar("T")


def run_compiled(key: Hashable, what: object, call: Callable[[], T]) -> T | None:
    """``call()`` (a compiled function), or None if compiling `key` fails, now or before.

    The first failure warns (naming `what`, formatted only then) and is remembered, so the caller's eager
    path takes over quietly from then on. Calls are serialised: dynamo is not
    thread-safe (Dask's threaded scheduler, user threads), and the kernels
    parallelise internally, so little is lost.
    """
    if key in _failed:
        return None
    unsafe = _INDUCTOR_CACHE_UNSAFE()
    if unsafe is not None:
        if "inductor-cache" not in _failed:
            _failed.add("inductor-cache")
            warnings.warn(
                f"anynum: not compiling kernels: torch.compile's cache could hold another user's code "
                f"({unsafe}); using the eager path. Fix: set TORCHINDUCTOR_CACHE_DIR to a directory "
                "only you can write (e.g. ~/.cache/torchinductor), or ANYNUM_COMPILE=0 to silence.",
                RuntimeWarning,
                stacklevel=4,
            )
        return None
    try:
        with _compile_lock:
            return call()
    except Exception as exc:  # no C++ compiler, unsupported platform, an Inductor bug, ...
        _failed.add(key)
        warnings.warn(
            f"anynum: torch.compile failed for {what} ({type(exc).__name__}: {exc}); "
            "using the eager path (set ANYNUM_COMPILE=0 to silence).",
            RuntimeWarning,
            stacklevel=4,
        )
        return None


@functools.cache
def _zero(device: torch.device) -> torch.Tensor:
    """The int64 zero passed as the (unused) stream base of deterministic kernels."""
    return torch.zeros((), dtype=torch.int64, device=device)


def fused_round(
    fmt: Format,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`round_to_format` through the compiled kernel, falling back to eager when needed.

    With `out` (any float dtype that holds the results exactly), the result is
    stored there directly and `out` is returned.
    """
    key = (fmt, mode, overflow, rand_bits, x.dtype, x.device.type, out is not None)
    base_value = rng.stream_base(0) if rng is not None else 0
    if base_value is not None:  # only counter-based bits can be fused
        base = torch.tensor(base_value, dtype=torch.int64, device=x.device) if base_value else _zero(x.device)
        args = (x, base) if out is None else (x, base, out)
        done = run_compiled(
            key, fmt, lambda: _compiled(fmt, mode, overflow, rand_bits, x.dtype, out is not None)(*args)
        )
        if done is not None and not bool(done[1]):  # done[1]: undecided stochastic elements
            return done[0]
    y = round_to_format(fmt, x, mode, overflow, rng, rand_bits)
    if out is not None:
        out.copy_(y)
        return out
    return y


# --- codes -----------------------------------------------------------------------------------


def _codec_body(fmt: Format, encode: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    if encode:

        def body(t: torch.Tensor) -> torch.Tensor:
            return fmt.encode_kernel(t.to(torch.float64))

    else:

        def body(t: torch.Tensor) -> torch.Tensor:
            return fmt.decode_torch(t)

    return body


@functools.lru_cache(maxsize=256)
def _compiled_codec(fmt: Format, encode: bool, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    body = own_code(_codec_body(fmt, encode))
    return static_ints(torch.compile(body, dynamic=None, fullgraph=True))


def _fused_codec(fmt: Format, encode: bool, t: torch.Tensor) -> torch.Tensor:
    what = "encode" if encode else "decode"
    key = (what, fmt, t.dtype, t.device.type)
    y = run_compiled(key, f"{what} of {fmt!r}", lambda: _compiled_codec(fmt, encode, t.dtype)(t))
    return _codec_body(fmt, encode)(t) if y is None else y


def fused_encode(fmt: Format, y: torch.Tensor) -> torch.Tensor:
    """``fmt.encode_kernel(y.to(float64))`` as one compiled loop (y on the grid, any float dtype)."""
    return _fused_codec(fmt, True, y)


def fused_decode(fmt: Format, codes: torch.Tensor) -> torch.Tensor:
    """``fmt.decode_torch(codes)`` (int64 codes) as one compiled loop."""
    return _fused_codec(fmt, False, codes)


# --- in the router -----------------------------------------------------------------------------


class FusedKernel(Kernel):
    """The reference kernel compiled by torch.compile into one fused loop (any format family).

    Its rank is above the native C kernels': on CPU it runs only for the calls they decline.
    It takes calls of at least ``ANYNUM_COMPILE_MIN`` elements (every call with
    ``ANYNUM_COMPILE=1``). Below that size, a call whose (format, mode, dtype,
    ...) has already sent that many elements through slower kernels in this
    process runs compiled too, flattened, so that one dynamic-size compile serves
    every shape: training rounds the same small tensors thousands of times.
    Block formats are left out of that rule (their rounding depends on shape).
    Custom random sources cannot be drawn inside the loop and are not covered.
    """

    name = "compiled"
    rank = 30

    def __init__(self) -> None:
        self._elements: dict[Call, int] = {}  # rounded by slower kernels so far, per call

    def covers(self, call: Call) -> bool:
        return compile_mode() != "0" and call.random != "custom"

    def accepts(self, call: Call, numel: int) -> bool:
        if compiles_at(numel):
            return True
        if isinstance(call.fmt, Block) or numel < 2:  # dynamo specialises sizes 0 and 1
            return False
        seen = self._elements.get(call, 0)
        if seen >= compile_min():
            return True
        self._elements[call] = seen + numel
        return False

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        fmt, mode, overflow, rand_bits = call.fmt, call.mode, call.overflow, call.rand_bits
        xw = x.to(working_dtype(fmt, x.dtype))
        if not compiles_at(x.numel()):  # a warm kernel on a small tensor: flattened, see the class
            flat = xw.reshape(-1).detach()  # detach: dynamo guards on a view's base strides
            torch._dynamo.maybe_mark_dynamic(flat, 0)  # compile for any size at once
            return fused_round(fmt, flat, mode, overflow, rng, rand_bits).view(x.shape).to(x.dtype)
        if out is not None and out.dtype == xw.dtype and _can_store_while_rounding(xw, out, call):
            return fused_round(fmt, xw, mode, overflow, rng, rand_bits, out)
        return fused_round(fmt, xw, mode, overflow, rng, rand_bits).to(x.dtype)

    def encode(self, fmt: Format, y: torch.Tensor) -> torch.Tensor | None:
        return fused_encode(fmt, y) if compiles_at(y.numel()) and not isinstance(fmt, Block) else None

    def decode(self, fmt: Format, codes: torch.Tensor) -> torch.Tensor | None:
        return fused_decode(fmt, codes) if compiles_at(codes.numel()) and not isinstance(fmt, Block) else None


def _can_store_while_rounding(x: torch.Tensor, out: torch.Tensor, call: Call) -> bool:
    """Whether the fused loop may store into `out` while it reads `x`.

    Not when they overlap other than element for element, nor in place under exact
    stochastic rounding, whose rare undecided elements are redone from the input.
    """
    if not can_write_while_reading(x, out):
        return False
    shared = out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return not (shared and call.mode is Rounding.STOCHASTIC and call.rand_bits is None)


register(FusedKernel())
