"""The native rounding library: its C source, assembled from ``csrc/``, built and loaded once.

The source is plain C99/C11 (files in ``anynum/kernels/csrc``), compiled by the system C
compiler through `anynum.kernels.nativelib` (private verified cache, one build per user and
machine, ``-O3 -march=native``). The per-family kernels are written once as templates over
the working type and pasted twice here, for float and for double. Flags: ISO C11 (no GNU
extensions that change floating point), ``-ffp-contract=off`` (no fused multiply-adds: every
operation rounds as the eager reference's torch op does), ``-pthread`` (the library's own
thread pool; no -fopenmp, whose runtime torch already has in the process: where torch's
threads spin, the pool hands its jobs to torch's own OpenMP team instead, `torch_threads_spin`).
GCC and Clang both vectorise every element loop (one loop per mode, branch-free selects inside).

`library` returns the loaded library, or None (with nativelib's one-time warning) where it
cannot be built; the kernels then decline and the router's other kernels run. The router
asks `library_soon`, which does not wait for a first build: on a machine without the
library in its cache, calls run the eager reference (the same bits) while a detached process
compiles it (`anynum.kernels.nativesoon`; about 40 s of GCC), then switch to it.

>>> lib = library()
>>> lib is None or lib.anynum_call_size() > 0
True
"""

from __future__ import annotations

import ctypes
import functools
import os
import warnings
from pathlib import Path

import torch

from anynum.kernels.cparams import CallStruct
from anynum.kernels.nativelib import NativeSource, load
from anynum.kernels.nativesoon import building, load_soon

__all__ = ["SOURCE", "building_library", "library", "library_soon", "source_text", "torch_threads_spin"]

_DIR = Path(__file__).with_name("csrc")

#: The working types: (suffix, macro definitions) for each instantiation of the templates.
_TYPES = {
    "f64": {
        "W": "double", "WI": "int64_t", "WU": "uint64_t", "W_MAN": "52", "W_BIAS": "1023",
        "W_EXPMASK": "0x7FF0000000000000ull", "W_MANMASK": "0x000FFFFFFFFFFFFFull",
        "W_EMIN_VAL": "0x1p-1022", "W_TINY": "0x1p-1074", "W_QMIN": "(-1074)", "W_LIFT": "0x1p54",
        "W_LIFT_BITS": "54", "W_RECIP_MAGIC": "0x7FE0000000000000ull", "FLOORW": "floor",
        "CEILW": "ceil", "TRUNCW": "trunc", "RINTW": "rint", "FABSW": "fabs", "COPYSIGNW": "copysign",
    },
    "f32": {
        "W": "float", "WI": "int32_t", "WU": "uint32_t", "W_MAN": "23", "W_BIAS": "127",
        "W_EXPMASK": "0x7F800000u", "W_MANMASK": "0x007FFFFFu",
        "W_EMIN_VAL": "0x1p-126f", "W_TINY": "0x1p-149f", "W_QMIN": "(-149)", "W_LIFT": "0x1p25f",
        "W_LIFT_BITS": "25", "W_RECIP_MAGIC": "0x7F000000u", "FLOORW": "floorf",
        "CEILW": "ceilf", "TRUNCW": "truncf", "RINTW": "rintf", "FABSW": "fabsf", "COPYSIGNW": "copysignf",
    },
}  # fmt: skip
_TEMPLATES = ("scalar.c", "posit.c", "loops.c", "tablelut.c")


def source_text() -> str:
    """The library's C source: common parts, the templates once per working type, the drivers.

    >>> text = source_text()
    >>> "#define W float" in text and "#define W double" in text
    True
    """

    def read(name: str) -> str:
        return f"/* ---- {name} ---- */\n" + (_DIR / name).read_text(encoding="utf-8")

    parts = [read("common.c"), read("pool.c"), read("table.c"), read("tablegather.c")]
    for suffix, macros in _TYPES.items():
        defines = "".join(f"#define {k} {v}\n" for k, v in macros.items())
        defines += f"#define SFX(n) CAT(n, _{suffix})\n"
        undefs = "".join(f"#undef {k}\n" for k in (*macros, "SFX"))
        parts += [defines, *(read(t) for t in _TEMPLATES), undefs]
    parts += [read("blockscan.c"), read("blockthr.c"), read("block.c"), read("drive.c")]
    return "\n".join(parts)


#: ``vect-epilogues-nomask=0``: no second, narrower vectorisation of each loop's remainder (at most
#: 15 elements), which halves the build time (GCC; Clang ignores it with a warning).
_FLAGS = ("-std=c11", "-ffp-contract=off", "-pthread", "--param=vect-epilogues-nomask=0")
SOURCE = NativeSource("anynum_round", source_text(), flags=_FLAGS)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library with its entry points typed, or None where it cannot be built.

    >>> lib = library()
    >>> lib is None or lib.anynum_pool_workers() >= 0
    True
    """
    lib = _typed(load(SOURCE))
    if lib is not None and not _resolved:
        lib.anynum_use_torch_team(int(torch_threads_spin()))
    _resolved.append(lib)
    return lib


def torch_threads_spin() -> bool:
    """Whether torch's intra-op threads spin between its parallel regions: an OpenMP build under
    OpenMP's default wait policy (``OMP_WAIT_POLICY`` unset or ACTIVE; PASSIVE makes them sleep).

    Where they do, the library runs the parts of its calls on torch's OpenMP team
    (``anynum_use_torch_team``, pool.c) instead of on a pool of its own, whose worker would
    compete with the spinning ones for the cores: a QAT step on 2 cores measured 1.28-1.29x the
    fp32 step on the library's pool and 1.21-1.24x on torch's team (stochastic rounding:
    1.42-1.44x against 1.34x). Where they sleep, the library's pool stays (it spins between close
    calls, so a loop of calls keeps its second core awake): 1.24x against 1.25x with PASSIVE, and
    1.32x for both with stochastic rounding. OpenMP reads the variable when it starts, and so
    this is read once a process, when the library loads.

    >>> isinstance(torch_threads_spin(), bool)
    True
    """
    openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    return openmp and os.environ.get("OMP_WAIT_POLICY", "").strip().lower() != "passive"


_resolved: list[ctypes.CDLL | None] = []  # what `library` returned, once it has


def _typed(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    """`lib` with its entry points typed, or None (also where the two structure mirrors disagree)."""
    if lib is None:
        return None
    vp, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    u64 = ctypes.c_uint64
    lib.anynum_round.argtypes = [vp, vp, i64, vp, u64, i32, vp]
    lib.anynum_round.restype = i64
    lib.anynum_round_each.argtypes = [vp, vp, vp, i32, vp, u64, i32]
    lib.anynum_round_each.restype = i64
    lib.anynum_round_blocks.argtypes = [vp, vp, i64, i64, vp, u64, i32]
    lib.anynum_round_blocks.restype = i64
    lib.anynum_block_tensor_scale.argtypes = [vp, i64, vp, i32]
    lib.anynum_block_tensor_scale.restype = ctypes.c_double
    lib.anynum_block_quotients.argtypes = [vp, vp, i64, vp]
    lib.anynum_block_quotients.restype = None
    lib.anynum_stream_base.argtypes = [u64, u64]
    lib.anynum_stream_base.restype = u64
    lib.anynum_counter_draws.argtypes = [vp, u64, u64, u64, i64, i32]
    lib.anynum_counter_draws.restype = None
    lib.anynum_use_torch_team.argtypes = [i32]
    lib.anynum_use_torch_team.restype = i32
    lib.anynum_torch_team.argtypes = []
    lib.anynum_torch_team.restype = i32
    lib.anynum_run_parts.argtypes = [vp, vp, i32]
    lib.anynum_run_parts.restype = None
    lib.anynum_pool_workers.argtypes = []
    lib.anynum_pool_workers.restype = i32
    lib.anynum_call_size.argtypes = []
    lib.anynum_call_size.restype = i64
    if lib.anynum_call_size() != ctypes.sizeof(CallStruct):  # the two mirrors disagree: never guess
        warnings.warn(
            "anynum: the native kernel's parameter structure does not match anynum.kernels.cparams; "
            "not using it (the other kernels run). Please report this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return lib


def library_soon() -> ctypes.CDLL | None:
    """`library` where no build has to be waited for; None at once while one runs in the background
    (`building_library`), or where the library cannot be had.

    >>> lib = library_soon() or library()
    >>> lib is None or lib.anynum_pool_workers() >= 0
    True
    """
    if _resolved:  # loaded, or known not to build (the per-call path: a list read)
        return _resolved[0]
    return None if load_soon(SOURCE) is None else library()


def building_library() -> bool:
    """Whether the library is being built in the background (started by `library_soon`)."""
    return building(SOURCE)
