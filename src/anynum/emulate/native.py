"""The C kernel of emulation (seqdot.c): ``order="sequential"`` accumulation, loaded through
`anynum.kernels.nativelib`.

In torch, sequential accumulation is a Python loop over the reduction axis, far too slow for
a training step; the C loop keeps the order and the roundings (every product unless
``fma=True``, every partial sum), runs across the outputs of a row, and splits the outputs
over ``torch.get_num_threads()`` threads (ctypes releases the GIL). Round to nearest even on
a grid of at most 25 bits (posit16, bf16, fp16 ...) runs in SIMD lanes (see seqdot.c). Its
rounding functions exist for exact sums only, this loop's and `add_round`'s (one step of it:
an elementwise ``x + y`` rounded once, for the engine's exact + - and addcmul), and are held
bit for bit to the torch kernels by the tests (`round_pairs` exports them for that); every
other rounding in emulation goes through `anynum.quantize` and the kernel router.

It covers signed float formats with a zero and posits with ``scale_exp=0`` and
``underflow="minpos"``, in the deterministic rounding modes, on CPU; everything else
(stochastic modes, fixed point, tables) takes the torch loop. ``ANYNUM_EMULATE_NATIVE=0``
turns the C kernel off.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from anynum.formats.base import Format
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.kernels.cparams import MODE_CODES, OVERFLOW_CODES
from anynum.kernels.nativelib import NativeSource, load
from anynum.ops.core import odd_rounding_applies
from anynum.rounding import Rounding

__all__ = ["add_round", "available", "round_pairs", "sequential_dot", "supported"]

# the C codes of modes and overflow policies: the kernels' own (seqdot.c uses the same numbers)
_MODES, _OVERFLOW = MODE_CODES, OVERFLOW_CODES

_SOURCE = NativeSource(
    "emulate_seqdot", (Path(__file__).with_name("seqdot.c")).read_text(), flags=("-ffp-contract=off",)
)


class _Params(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("mode", ctypes.c_int32),
        ("man_bits", ctypes.c_int32),
        ("emin", ctypes.c_int32),
        ("subnormals", ctypes.c_int32),
        ("overflow", ctypes.c_int32),
        ("neg_zero", ctypes.c_int32),
        ("max", ctypes.c_double),
        ("smallest_normal", ctypes.c_double),
        ("n", ctypes.c_int32),
        ("es", ctypes.c_int32),
        ("minpos", ctypes.c_double),
        ("maxpos", ctypes.c_double),
        ("pair_ok", ctypes.c_int32),
        ("needs_pair", ctypes.c_int32),
        ("fast", ctypes.POINTER(ctypes.c_int16)),
    ]


@functools.cache
def _library() -> Any:
    if os.environ.get("ANYNUM_EMULATE_NATIVE", "1") == "0":
        return None
    lib = load(_SOURCE)
    if lib is None or not hasattr(lib, "anynum_seq_dot"):
        return None
    p = ctypes.POINTER(_Params)
    d = ctypes.c_void_p
    i64, i32 = ctypes.c_int64, ctypes.c_int32
    lib.anynum_emu_round.argtypes = [d, d, d, i64, p]
    lib.anynum_emu_round.restype = None
    lib.anynum_seq_dot.argtypes = [d, d, d, i64, i64, i64, i64, i64, i64, i32, i32, p]
    lib.anynum_seq_dot.restype = None
    lib.anynum_emu_add_round.argtypes = [d, d, d, i64, p]
    lib.anynum_emu_add_round.restype = None
    return lib


def available() -> bool:
    """Whether the C kernels are built and loaded (a C compiler and a private cache are needed)."""
    return _library() is not None


def supported(fmt: Format, mode: Rounding) -> bool:
    """Whether the C kernel accumulates onto `fmt` in `mode` (when `available`)."""
    if mode not in _MODES:
        return False
    if isinstance(fmt, FloatFormat):
        return fmt.signed and fmt.zero and fmt.man_bits <= 51
    return isinstance(fmt, Posit) and fmt.scale_exp == 0 and fmt.underflow == "minpos"


def _kept_bits(fmt: Format) -> list[int]:
    """Fraction bits the grid keeps in each float64 binade (index: biased exponent), 0: use the full rule.

    Only binades where every value keeps at least one fraction bit and the exponent is
    fully kept qualify; there, round-to-nearest-even on the grid is the same on the bits.
    """
    table = [0] * 2049
    for biased in range(1, 2047):
        e = biased - 1023
        kept = 0
        if isinstance(fmt, FloatFormat):
            if fmt.emin <= e <= fmt.emax:
                kept = fmt.man_bits
            elif e < fmt.emin and fmt.subnormals:
                kept = fmt.man_bits - (fmt.emin - e)
        else:
            assert isinstance(fmt, Posit)
            if fmt.emin <= e < fmt.emax:
                k = e // (1 << fmt.es)
                rl = k + 2 if k >= 0 else -k + 1
                kept = fmt.n - 1 - rl - fmt.es
        table[biased] = max(kept, 0) if kept < 52 else 0
    return table


class _Compiled:
    """The ctypes parameters of one (format, mode, overflow) (kept alive with their table)."""

    def __init__(self, fmt: Format, mode: Rounding, overflow: str, pair_ok: bool, needs_pair: bool) -> None:
        table = _kept_bits(fmt)
        self.table = (ctypes.c_int16 * len(table))(*table)
        p = _Params()
        p.mode = _MODES[mode]
        p.pair_ok = int(pair_ok)
        p.needs_pair = int(needs_pair)
        p.fast = self.table if mode is Rounding.NEAREST_EVEN else ctypes.POINTER(ctypes.c_int16)()
        if isinstance(fmt, FloatFormat):
            p.kind = 0
            p.man_bits = fmt.man_bits
            p.emin = fmt.emin
            p.subnormals = int(fmt.subnormals)
            p.overflow = _OVERFLOW[overflow]
            p.neg_zero = int(fmt.has_negative_zero)
            p.max = fmt.max
            p.smallest_normal = fmt.smallest_normal
        else:
            assert isinstance(fmt, Posit)
            p.kind = 1
            p.n, p.es = fmt.n, fmt.es
            p.minpos, p.maxpos = fmt.minpos, fmt.maxpos
        self.params = p


@functools.lru_cache(maxsize=128)
def _compiled(fmt: Format, mode: Rounding, overflow: str, pair_ok: bool, needs_pair: bool) -> _Compiled:
    return _Compiled(fmt, mode, overflow, pair_ok, needs_pair)


def _for_grid(grid: Any) -> _Compiled | None:
    """The compiled parameters of a `Grid`, or None where the C kernels do not apply."""
    if _library() is None or not supported(grid.fmt, grid.mode):
        return None
    return _compiled(grid.fmt, grid.mode, grid.overflow, odd_rounding_applies(grid.fmt), grid.needs_pair)


_POOL: list[ThreadPoolExecutor] = []
#: Products below this many multiply-adds run on the calling thread (a pool hand-off costs more).
_SPLIT_MACS = 1 << 16


def _parallel(jobs: list[Callable[[], None]]) -> None:
    threads = torch.get_num_threads()
    if threads > 1 and len(jobs) > 1:
        if not _POOL or _POOL[0]._max_workers != threads:
            _POOL[:] = [ThreadPoolExecutor(max_workers=threads)]
        for f in [_POOL[0].submit(j) for j in jobs]:
            f.result()
    else:
        for j in jobs:
            j()


def round_pairs(y: torch.Tensor, e: torch.Tensor | None, grid: Any) -> torch.Tensor | None:
    """The C rounding of pairs ``(y, e)`` (float64) onto `grid`, or None where it does not apply.

    Exposed so tests can hold the C rounding to the torch kernels on every code.
    """
    c = _for_grid(grid)
    if c is None:
        return None
    y = y.detach().to(torch.float64).contiguous()
    e = None if e is None else e.detach().to(torch.float64).contiguous()
    out = torch.empty_like(y)
    _library().anynum_emu_round(
        y.data_ptr(), None if e is None else e.data_ptr(), out.data_ptr(), y.numel(), ctypes.byref(c.params)
    )
    return out


def add_round(x: torch.Tensor, y: torch.Tensor, grid: Any) -> torch.Tensor | None:
    """``x + y`` (float64, CPU, broadcast) rounded once onto `grid`, exactly (the TwoSum error term
    decides what float64 drops), or None where the C kernel does not apply.

    The same rounding as ``grid.round_pair(*two_sum(x, y), force=True)``, in one pass.
    """
    c = _for_grid(grid)
    if c is None or x.device.type != "cpu" or y.device.type != "cpu":
        return None
    xb, yb = torch.broadcast_tensors(x.detach().to(torch.float64), y.detach().to(torch.float64))
    xb, yb = xb.contiguous(), yb.contiguous()
    out = torch.empty_like(xb)
    if out.numel():
        _library().anynum_emu_add_round(
            xb.data_ptr(), yb.data_ptr(), out.data_ptr(), out.numel(), ctypes.byref(c.params)
        )
    return out


def sequential_dot(
    a: torch.Tensor, b: torch.Tensor, grid: Any, fma: bool, exact: bool
) -> torch.Tensor | None:
    """``a @ b`` ([..., M, K] x [..., K, N], float64, CPU) accumulated left to right onto `grid`, or None.

    Each product (unless `fma`) and each partial sum is rounded, exactly as the torch loop
    of `anynum.emulate.accumulate` does; `exact` says every product is exact in float64.
    """
    c = _for_grid(grid)
    if c is None or a.device.type != "cpu" or b.device.type != "cpu":
        return None
    lib = _library()
    batch = a.shape[:-2]
    if b.shape[:-2] != batch:
        batch = torch.broadcast_shapes(batch, b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if a.shape[:-2] != batch:
        a = a.expand(*batch, m, k)
    if b.shape[:-2] != batch:
        b = b.expand(*batch, k, n)
    a3 = a.reshape(-1, m, k).to(torch.float64).contiguous()
    b3 = b.reshape(-1, k, n).to(torch.float64).contiguous()
    out = torch.empty(a3.shape[0], m, n, dtype=torch.float64)
    # split the outputs over threads where there is work enough (any split keeps each output's
    # order along k, so the results do not depend on it): by columns when there are enough of
    # them, else by rows
    threads = max(1, torch.get_num_threads()) if m * k * n >= _SPLIT_MACS else 1
    by_cols = n >= 256 * threads
    parts = threads if by_cols else min(threads, m)
    step = max(1, math.ceil((n if by_cols else m) / max(parts, 1)))
    params = ctypes.byref(c.params)
    fma_i, exact_i = int(fma), int(exact)
    pa0, pb0, pc0 = a3.data_ptr(), b3.data_ptr(), out.data_ptr()
    jobs: list[Callable[[], None]] = []
    for i in range(a3.shape[0]):
        pa, pb, pc = pa0 + 8 * i * m * k, pb0 + 8 * i * k * n, pc0 + 8 * i * m * n
        for lo in range(0, n if by_cols else m, step):
            hi = min(n if by_cols else m, lo + step)
            r0, r1, c0, c1 = (0, m, lo, hi) if by_cols else (lo, hi, 0, n)
            rows_cols = (r0, r1, k, n, c0, c1)
            jobs.append(functools.partial(lib.anynum_seq_dot, pa, pb, pc, *rows_cols, fma_i, exact_i, params))
    _parallel(jobs)
    return out.reshape(*batch, m, n)
