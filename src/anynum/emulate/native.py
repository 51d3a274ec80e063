"""The C kernel of sequential accumulation (seqdot.c), built and loaded through `anynum.kernels.nativelib`.

``order="sequential"`` adds one product at a time with two roundings each: in
torch that is a Python loop over the reduction axis, far too slow for a
training step. The C loop keeps the order and the roundings, runs vectorised
across the outputs of a row, and splits rows over ``torch.get_num_threads()``
threads (ctypes releases the GIL).

It covers signed float formats with a zero and posits with ``scale_exp=0`` and
``underflow="minpos"``, in the deterministic rounding modes, on CPU; everything
else (stochastic modes, fixed point, tables) runs the torch reference loop,
which the tests hold it equal to bit for bit. ``ANYNUM_EMULATE_NATIVE=0`` turns
it off.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from anynum.emulate.accumulate import native_sequential
from anynum.emulate.grid import Grid
from anynum.formats.base import Format
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.kernels.nativelib import NativeSource, load
from anynum.rounding import Rounding

__all__ = ["available", "round_pairs", "sequential_dot"]

_MODES = {
    Rounding.NEAREST_EVEN: 0,
    Rounding.NEAREST_AWAY: 1,
    Rounding.NEAREST_ZERO: 2,
    Rounding.TOWARD_ZERO: 3,
    Rounding.UP: 4,
    Rounding.DOWN: 5,
    Rounding.ODD: 6,
}
_OVERFLOW = {"saturate": 0, "inf": 1, "nan": 2}

_SOURCE = NativeSource("emulate_seqdot", (Path(__file__).with_name("seqdot.c")).read_text())


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
def _library() -> ctypes.CDLL | None:
    if os.environ.get("ANYNUM_EMULATE_NATIVE", "1") == "0":
        return None
    # nativelib loads the verified file as /proc/self/fd/N and closes N; glibc's dlopen
    # recognises libraries by that name, so a second library opened under a reused N comes
    # back as the first one. Until nativelib keeps its descriptors, hold a few low numbers
    # while loading so this library gets a name no earlier load used. (Reported to the lead.)
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(16)]
    try:
        lib = load(_SOURCE)
    finally:
        for fd in held:
            os.close(fd)
    if lib is None or not hasattr(lib, "anynum_seq_dot"):
        return None
    p = ctypes.POINTER(_Params)
    d = ctypes.c_void_p
    lib.anynum_emu_round.argtypes = [d, d, d, ctypes.c_int64, p]
    lib.anynum_emu_round.restype = None
    lib.anynum_seq_dot.argtypes = [d, d, d, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_int32, ctypes.c_int32, p]
    lib.anynum_seq_dot.restype = None
    return lib


def available() -> bool:
    """Whether the C kernel is built and loaded (a C compiler and a private cache are needed)."""
    return _library() is not None


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
    """The ctypes parameters of one grid (kept alive with their table)."""

    def __init__(self, grid: Grid) -> None:
        fmt = grid.fmt
        table = _kept_bits(fmt)
        self.table = (ctypes.c_int16 * len(table))(*table)
        p = _Params()
        p.mode = _MODES[grid.mode]
        p.pair_ok = int(grid.precision <= 50)
        p.needs_pair = int(grid.needs_pair)
        p.fast = self.table if grid.mode is Rounding.NEAREST_EVEN else ctypes.POINTER(ctypes.c_int16)()
        if isinstance(fmt, FloatFormat):
            p.kind = 0
            p.man_bits = fmt.man_bits
            p.emin = fmt.emin
            p.subnormals = int(fmt.subnormals)
            p.overflow = _OVERFLOW[grid.overflow]
            p.neg_zero = int(fmt.has_negative_zero)
            p.max = fmt.max
            p.smallest_normal = fmt.smallest_normal
        else:
            assert isinstance(fmt, Posit)
            p.kind = 1
            p.n, p.es = fmt.n, fmt.es
            p.minpos, p.maxpos = fmt.minpos, fmt.maxpos
        self.params = p


@functools.lru_cache(maxsize=64)
def _compiled_for(fmt: Format, mode: Rounding, overflow: str) -> _Compiled:
    return _Compiled(Grid(fmt, mode, overflow=overflow))


def _supported(grid: Grid) -> bool:
    fmt = grid.fmt
    if grid.mode not in _MODES:
        return False
    if isinstance(fmt, FloatFormat):
        return fmt.signed and fmt.zero and fmt.man_bits <= 51
    return isinstance(fmt, Posit) and fmt.scale_exp == 0 and fmt.underflow == "minpos"


def round_pairs(y: torch.Tensor, e: torch.Tensor | None, grid: Grid) -> torch.Tensor | None:
    """The C rounding of pairs ``(y, e)`` (float64) onto `grid`, or None where the kernel does not apply.

    Exposed so tests can hold the C rounding to the torch kernels on every code.
    """
    lib = _library()
    if lib is None or not _supported(grid):
        return None
    c = _compiled_for(grid.fmt, grid.mode, grid.overflow)
    y = y.detach().to(torch.float64).contiguous()
    e = None if e is None else e.detach().to(torch.float64).contiguous()
    out = torch.empty_like(y)
    lib.anynum_emu_round(y.data_ptr(), None if e is None else e.data_ptr(), out.data_ptr(), y.numel(),
                         ctypes.byref(c.params))
    return out


_POOL: list[ThreadPoolExecutor] = []


def sequential_dot(a: torch.Tensor, b: torch.Tensor, grid: Grid, fma: bool, exact: bool) -> torch.Tensor | None:
    """``a @ b`` ([..., M, K] x [..., K, N], float64 on CPU) accumulated sequentially onto `grid`, or None.

    Products are exact in float64 or carried with their fma error; each product
    (unless `fma`) and each partial sum is rounded, exactly as the torch loop does.
    """
    lib = _library()
    if lib is None or not _supported(grid) or a.device.type != "cpu" or b.device.type != "cpu":
        return None
    c = _compiled_for(grid.fmt, grid.mode, grid.overflow)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = a.expand(*batch, m, k).reshape(-1, m, k).to(torch.float64).contiguous()
    b3 = b.expand(*batch, k, n).reshape(-1, k, n).to(torch.float64).contiguous()
    out = torch.empty(a3.shape[0], m, n, dtype=torch.float64)
    threads = max(1, torch.get_num_threads())
    jobs = []
    for i in range(a3.shape[0]):
        pa, pb, pc = a3[i].data_ptr(), b3[i].data_ptr(), out[i].data_ptr()
        step = max(1, math.ceil(m / threads))
        for r0 in range(0, m, step):
            jobs.append((pa, pb, pc, r0, min(m, r0 + step)))
    params = ctypes.byref(c.params)

    def run(job: tuple[int, int, int, int, int]) -> None:
        pa, pb, pc, r0, r1 = job
        lib.anynum_seq_dot(pa, pb, pc, r0, r1, k, n, int(fma), int(exact), params)

    if threads > 1 and len(jobs) > 1:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=threads))
        list(_POOL[0].map(run, jobs))
    else:
        for job in jobs:
            run(job)
    return out.reshape(*batch, m, n)


def install() -> None:
    """Make the accumulator use the C kernel for sequential orders where it applies."""
    native_sequential[0] = sequential_dot
