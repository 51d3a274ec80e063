"""The native CPU kernel family in the router: every format family, every mode, one C pass.

`NativeKernel` rounds CPU tensors (float16, bfloat16, float32, float64) onto float formats
in all nine rounding modes and every overflow policy, fixed point and integers (saturate or
wrap), posits of any (n, es), tables, and blocks with float or fixed-point elements (MX,
NVFP4, block floating point), through the C library of `anynum.kernels.clib`. Each element
is rounded as the eager reference (`anynum.kernels.round_to_format`) rounds it in the working
dtype (`anynum.kernels.working_dtype`), operation for operation, and converted back to the
input dtype: the results are the reference's, bit for bit (tests/kernels/test_ckernel*.py).

Random bits are the counter bits of `anynum.rounding.CounterRandom` (SplitMix64 of the element's
row-major logical index and the stream base), computed inside the loop, so results do not
depend on the thread count or the layout. Exact stochastic rounding decides on 53 random bits;
an element whose fraction ties its own first 53 bits (probability 2**-53) is handed back and
refined by the eager reference with the same random source, as the compiled kernel does.

Layouts: row-major and any other dense layout (channels-last, transposed) are walked in
memory order without a copy, and the result keeps the input's strides; other views are made
contiguous first. ``out=`` of the input's strides is written directly, ``out=x`` in place.
Block formats work on the blocked axis made last and contiguous (a copy unless it already is).

It covers CPU calls while ``ANYNUM_COMPILE`` is not "0", with counter-based random sources;
where the library cannot be built (no C compiler) it declines at run time, with nativelib's
one-time warning, and the router's next kernel runs. While the library's first build on a
machine runs in the background (`anynum.kernels.clib.library_soon`), it runs the eager
reference itself, on one thread fewer than torch's (`beside_the_compiler`), so no call waits
for a compiler.

>>> import torch, anynum as an
>>> an.quantize(torch.tensor([0.3, -500.0, 3.0]), an.E4M3FN, "rz").tolist()
[0.28125, -448.0, 3.0]
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import functools
from collections.abc import Iterator

import torch

from anynum.formats.block import Block
from anynum.kernels.clib import building_library, library, library_soon
from anynum.kernels.cparams import CallParams, call_params
from anynum.kernels.eager import round_reference, round_to_format
from anynum.kernels.route import Call, Direct, Kernel, can_write_while_reading, register
from anynum.kernels.settings import compile_mode
from anynum.rounding import RandomSource, Rounding

__all__ = [
    "NativeKernel",
    "beside_the_compiler",
    "native_kernel",
    "native_round",
    "native_round_each",
    "refine_undecided",
]

_MASK64 = (1 << 64) - 1
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@contextlib.contextmanager
def beside_the_compiler() -> Iterator[None]:
    """torch's intra-op threads one fewer for the block's duration (at least one): room for the
    compiler of a background build, which holds one core.

    Without it, a torch op whose threads outnumber the free cores waits at its end for the
    thread the compiler displaced, a scheduler time slice per op: the reference's first
    calls at 4M elements took 6-11 s each on 2 cores during the build, and 0.03-0.2 s with it.
    The compiler keeps its core and its priority, so the build is not slowed by the calls
    (beside a busy loop of calls, a niced compiler took 302 s, this one 90 s; 40 s idle).

    >>> threads = torch.get_num_threads()
    >>> with beside_the_compiler():
    ...     torch.get_num_threads() == max(1, threads - 1)
    True
    >>> torch.get_num_threads() == threads
    True
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=256)
def _walk(
    shape: tuple[int, ...], strides: tuple[int, ...]
) -> tuple[ctypes.Array[ctypes.c_int64] | None, bool]:
    """(how to walk a dense layout's memory with logical indices, dense) for a non-contiguous tensor.

    The walk is ``{d, sizes[d], logical strides[d]}``: the dimensions in memory order
    (outermost first, size-1 dimensions dropped, neighbours that are also logical neighbours
    merged), the last one contiguous. ``dense`` is False for views with gaps or overlaps.
    """
    logical = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        logical[d] = logical[d + 1] * shape[d + 1]
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: -strides[d])
    expected = 1
    for d in reversed(dims):
        if strides[d] != expected:
            return None, False
        expected *= shape[d]
    sizes: list[int] = []
    lstrides: list[int] = []
    for d in dims:  # outermost first
        if sizes and lstrides[-1] == logical[d] * shape[d]:
            sizes[-1] *= shape[d]  # this dimension continues the previous one, logically too
            lstrides[-1] = logical[d]
        else:
            sizes.append(shape[d])
            lstrides.append(logical[d])
    if not sizes:
        sizes, lstrides = [1], [1]
    return (ctypes.c_int64 * (1 + 2 * len(sizes)))(len(sizes), *sizes, *lstrides), True


def native_round(
    params: CallParams,
    call: Call,
    x: torch.Tensor,
    rng: RandomSource | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Round CPU tensor `x` per `call` with the native library (into `out` if given and written in
    step with `x`); None if the library cannot be had or the call is handed on.

    >>> import anynum as an
    >>> call = Call(an.E5M2, Rounding.TOWARD_ZERO, "inf", None, torch.float32, "cpu", None)
    >>> p = call_params(call.fmt, call.mode, call.overflow, None, torch.float32)
    >>> y = native_round(p, call, torch.tensor([1000.0, -0.3]), None)
    >>> y is None or y.tolist() == [896.0, -0.25]
    True
    """
    lib = library()
    if lib is None:
        return None
    base = rng.stream_base(0) if rng is not None else 0
    if base is None:
        return None  # not counter-based: the loop cannot draw its bits
    if params.block:
        return _round_blocks(lib, params, call, x, rng, out, base & _MASK64)
    walk = None
    if not x.is_contiguous():
        walk, dense = _walk(tuple(x.shape), x.stride())
        if not dense:
            x, walk = x.contiguous(), None
        elif rng is None:
            walk = None  # no random bits: memory order serves as well as any
    y = out if out is not None and out.stride() == x.stride() and can_write_while_reading(x, out) else None
    if y is None:
        y = torch.empty_like(x)
    undecided = lib.anynum_round(
        x.data_ptr(), y.data_ptr(), x.numel(), params.address, base & _MASK64, torch.get_num_threads(), walk
    )
    if undecided < 0:
        return None
    if undecided:
        refine_undecided(params, call, y, rng)
    return y


def refine_undecided(params: CallParams, call: Call, y: torch.Tensor, rng: RandomSource | None) -> None:
    """Finish, in place, a result the library left with undecided exact-SR elements.

    `y` holds each undecided element's input and every other element's rounded value: the
    eager reference keeps values on the grid and refines the others from the same stream.
    """
    w = y.to(params.wdtype)
    y.copy_(round_to_format(call.fmt, w, call.mode, call.overflow, rng, call.rand_bits))


def native_round_each(
    params: CallParams, call: Call, xs: list[torch.Tensor], rng: RandomSource | None
) -> bool:
    """Round the contiguous CPU tensors `xs` in place as `native_round` rounds their concatenation
    (one C call, no staging copies); False, with nothing written, where it cannot.

    >>> import anynum as an
    >>> call = Call(an.E5M2, Rounding.TOWARD_ZERO, "inf", None, torch.float32, "cpu", None)
    >>> p = call_params(call.fmt, call.mode, call.overflow, None, torch.float32)
    >>> a, b = torch.tensor([1000.0]), torch.tensor([-0.3, 3.0])
    >>> native_round_each(p, call, [a, b], None) is False or (a.tolist(), b.tolist())
    ([896.0], [-0.25, 3.0])
    """
    lib = library_soon()
    if lib is None or params.block:
        return False
    # (array.array: a third of the cost of ctypes arrays, for a call the size of a layer)
    ptrs, offs, total = array.array("Q"), array.array("q", (0,)), 0
    for x in xs:
        if not (x.is_cpu and x.is_contiguous()):
            return False
        ptrs.append(x.data_ptr())
        total += x.numel()
        offs.append(total)
    base = rng.stream_base(0) if rng is not None else 0
    if base is None:
        return False
    address = ptrs.buffer_info()[0]
    undecided = lib.anynum_round_each(
        address, address, offs.buffer_info()[0], len(xs), params.address, base & _MASK64,
        torch.get_num_threads(),
    )
    if undecided < 0:
        return False
    if undecided:
        # as in native_round: elements on the grid stay, the undecided ones are refined from
        # the same stream, over the concatenation
        flat = torch.cat([x.reshape(-1) for x in xs]).to(params.wdtype)
        flat = round_to_format(call.fmt, flat, call.mode, call.overflow, rng, call.rand_bits)
        for x, part in zip(xs, flat.split([x.numel() for x in xs])):
            x.copy_(part.view_as(x))
    return True


def _round_blocks(
    lib: ctypes.CDLL,
    params: CallParams,
    call: Call,
    x: torch.Tensor,
    rng: RandomSource | None,
    out: torch.Tensor | None,
    base: int,
) -> torch.Tensor | None:
    fmt = call.fmt
    assert isinstance(fmt, Block)
    axis = None if fmt.axis is None or x.dim() == 0 else fmt.resolve_axis(x.dim())
    ax = x.dim() - 1 if axis is None else axis
    moved = ax != x.dim() - 1
    xm = x.movedim(ax, -1) if moved else x
    if not xm.is_contiguous():
        xm = xm.contiguous()
    length = xm.shape[-1] if axis is not None else xm.numel()
    if xm.numel() == 0:
        return torch.empty_like(x)
    exact_sr = call.mode is Rounding.STOCHASTIC and call.rand_bits is None
    direct = (
        out is not None
        and not moved
        and out.is_contiguous()
        and can_write_while_reading(xm, out)
        # exact SR's rare undecided elements, and results past the dtype's max (which the reference
        # saturates within the dtype), hand the call on: the input must survive
        and not (
            (exact_sr or params.struct.b.sat_dtype)
            and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        )
    )
    y = out if direct else torch.empty_like(xm)
    assert y is not None
    undecided = lib.anynum_round_blocks(
        xm.data_ptr(),
        y.data_ptr(),
        xm.numel() // length,
        length,
        params.address,
        base,
        torch.get_num_threads(),
    )
    if undecided != 0:
        return None  # the next kernel redoes the call from x
    return y.movedim(-1, ax) if moved else y


class NativeKernel(Kernel):
    """The C kernel family: CPU tensors, every format family and mode, the first kernel tried.

    >>> import anynum as an
    >>> call = Call(an.Posit(8, 0), Rounding.STOCHASTIC, "saturate", None, torch.float32, "cpu", "counter")
    >>> native = NativeKernel.__new__(NativeKernel); native._params = {}
    >>> native.params(call) is not None
    True
    """

    name = "native"
    rank = 10  # the slot of the C loop it replaced: before torch's casts (20) and compiled kernels (30)

    def __init__(self) -> None:
        self._params: dict[int, tuple[Call, CallParams | None]] = {}  # by id of the plan's Call

    def params(self, call: Call) -> CallParams | None:
        """The resolved parameters of `call` (looked up by identity: a plan passes the same Call)."""
        entry = self._params.get(id(call))
        if entry is None or entry[0] is not call:
            entry = (call, call_params(call.fmt, call.mode, call.overflow, call.rand_bits, call.dtype))
            self._params[id(call)] = entry
        return entry[1]

    def covers(self, call: Call) -> bool:
        return (
            call.device == "cpu"
            and compile_mode() != "0"
            and call.random != "custom"
            and call.dtype in _FLOATS
            and self.params(call) is not None
        )

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        params = self.params(call)
        assert params is not None
        if library_soon() is None and building_library():
            # the first build on this machine runs in the background: the reference meanwhile
            # (the same bits), rather than the compiled route, whose own compile would stall
            with beside_the_compiler():
                return round_reference(call, x, rng)
        return native_round(params, call, x, rng, out)

    def direct(self, call: Call) -> Direct | None:
        params = self.params(call)
        if params is None or params.block:
            return None
        address = params.address

        def run(x: torch.Tensor, rng: RandomSource | None) -> torch.Tensor | None:
            # native_round's common case, minus its choices: contiguous x, a new result, every
            # element decided, the library loaded (else the full route does it all again)
            lib = library_soon()
            if lib is None or not x.is_contiguous():
                return None
            base = 0 if rng is None else rng.stream_base(0)
            if base is None:
                return None
            y = torch.empty_like(x)
            n, threads = x.numel(), torch.get_num_threads()
            if lib.anynum_round(x.data_ptr(), y.data_ptr(), n, address, base & _MASK64, threads, None):
                return None
            return y

        run.params = params  # type: ignore[attr-defined]  # keeps the structure `address` points to
        return run

    def round_each(self, call: Call, xs: list[torch.Tensor], rng: RandomSource | None) -> bool:
        params = self.params(call)
        return params is not None and native_round_each(params, call, xs, rng)


_NATIVE = register(NativeKernel())


def native_kernel() -> NativeKernel:
    """The registered `NativeKernel` (a plan whose first kernel is this one rounds in the C library)."""
    assert isinstance(_NATIVE, NativeKernel)
    return _NATIVE
