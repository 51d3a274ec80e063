"""The double-word (nc = 2) algorithms as C loops, built and loaded by `anynum.kernels.nativelib`.

Each loop is a transliteration, operation for operation, of one formula of `anynum.mc.arith`
(Joldes, Muller, Popescu, ACM TOMS 44(2), 2017), for float and double: IEEE operations in the
component dtype, compiled with ``-ffp-contract=off`` (no contraction of ``a*b + c`` into an
FMA, which would make the error terms vanish) and without fast-math, and C99 ``fma`` where the
formula uses ``torch.addcmul`` (a verified FMA: these loops are only used where
`anynum.mc.eft.fma_available` holds, so both paths run the same algorithm).  The results are
therefore bit for bit those of the formulas, which tests/mc/test_kernels.py checks on random,
cancelling, spread/subnormal/near-overflow and non-finite inputs.

One pass over memory instead of the 10-27 passes of the eager kernels: an MC addition or
multiplication costs about what a float64 one costs.  Large tensors are cut into one chunk per
intra-op thread (``torch.get_num_threads()``), each run by a C call that releases the GIL.

No compiler, or a failed build, warns once (from `anynum.kernels.nativelib`) and leaves the
callers on the eager kernels; ``ANYNUM_COMPILE=0`` (eager only) and ``=1`` (torch.compile)
keep them off this path.
"""

from __future__ import annotations

import ctypes
import functools
from concurrent.futures import ThreadPoolExecutor

import torch

from anynum.kernels.fused import compile_mode
from anynum.kernels.nativelib import NativeSource, load
from anynum.mc._core import Comps

__all__ = ["KERNELS", "available", "run"]

# name -> number of inputs; every kernel writes (zh, zl)
KERNELS = {"dw_plus_dw": 4, "dw_plus_fp": 3, "dw_times_dw_fma": 4, "dw_times_fp_fma": 3,
           "dw_div_dw_fma": 4, "dw_div_fp_fma": 3}

_SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* TwoSum and Fast2Sum exactly as anynum.mc.eft.raw_two_sum / raw_fast_two_sum */
#define TWO_SUM(T, a, b, s, e) do { T s_ = (a) + (b); T bb_ = s_ - (a); \
    (e) = ((a) - (s_ - bb_)) + ((b) - bb_); (s) = s_; } while (0)
#define FAST_TWO_SUM(T, a, b, s, e) do { T s_ = (a) + (b); (e) = (b) - (s_ - (a)); (s) = s_; } while (0)

#define KERNELS(T, SFX, FMA)                                                                    \
void anynum_mc_dw_plus_dw_##SFX(const T *xh, const T *xl, const T *yh, const T *yl,           \
                                T *zh, T *zl, int64_t n) {                                      \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T sh, sl, th, tl, vh, vl, c, w, h, l;                                                   \
        TWO_SUM(T, xh[i], yh[i], sh, sl);                                                       \
        TWO_SUM(T, xl[i], yl[i], th, tl);                                                       \
        c = sl + th;                                                                            \
        FAST_TWO_SUM(T, sh, c, vh, vl);                                                         \
        w = tl + vl;                                                                            \
        FAST_TWO_SUM(T, vh, w, h, l);                                                           \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}                                                                                               \
void anynum_mc_dw_plus_fp_##SFX(const T *xh, const T *xl, const T *y, T *zh, T *zl, int64_t n) {\
    for (int64_t i = 0; i < n; i++) {                                                           \
        T sh, sl, v, h, l;                                                                      \
        TWO_SUM(T, xh[i], y[i], sh, sl);                                                        \
        v = xl[i] + sl;                                                                         \
        FAST_TWO_SUM(T, sh, v, h, l);                                                           \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}                                                                                               \
/* DWTimesDW3 (Alg. 12) */                                                                      \
void anynum_mc_dw_times_dw_fma_##SFX(const T *xh, const T *xl, const T *yh, const T *yl,      \
                                     T *zh, T *zl, int64_t n) {                                 \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T ch = xh[i] * yh[i];                                                                   \
        T cl1 = FMA(xh[i], yh[i], -ch);                                                         \
        T tl0 = xl[i] * yl[i];                                                                  \
        T tl1 = FMA(xh[i], yl[i], tl0);                                                         \
        T cl2 = FMA(xl[i], yh[i], tl1);                                                         \
        T cl3 = cl1 + cl2, h, l;                                                                \
        FAST_TWO_SUM(T, ch, cl3, h, l);                                                         \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}                                                                                               \
/* DWTimesFP3 (Alg. 9) */                                                                       \
void anynum_mc_dw_times_fp_fma_##SFX(const T *xh, const T *xl, const T *y, T *zh, T *zl,      \
                                     int64_t n) {                                               \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T ch = xh[i] * y[i];                                                                    \
        T cl1 = FMA(xh[i], y[i], -ch);                                                          \
        T cl3 = FMA(xl[i], y[i], cl1), h, l;                                                    \
        FAST_TWO_SUM(T, ch, cl3, h, l);                                                         \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}                                                                                               \
/* DWDivDW2 (Alg. 17, with DWTimesFP1 and an FMA two_prod) */                                   \
void anynum_mc_dw_div_dw_fma_##SFX(const T *xh, const T *xl, const T *yh, const T *yl,        \
                                   T *zh, T *zl, int64_t n) {                                   \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T th = xh[i] / yh[i];                                                                   \
        T ch = yh[i] * th;                                                                      \
        T cl1 = FMA(yh[i], th, -ch);                                                            \
        T cl2 = yl[i] * th;                                                                     \
        T th2, tl1, rh, rl, ph, pl, h, l;                                                       \
        FAST_TWO_SUM(T, ch, cl2, th2, tl1);                                                     \
        T tl2 = tl1 + cl1;                                                                      \
        FAST_TWO_SUM(T, th2, tl2, rh, rl);                                                      \
        TWO_SUM(T, xh[i], -rh, ph, pl);                                                         \
        T dh = xl[i] - rl;                                                                      \
        T dl = pl + dh;                                                                         \
        T d = ph + dl;                                                                          \
        T tl = d / yh[i];                                                                       \
        FAST_TWO_SUM(T, th, tl, h, l);                                                          \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}                                                                                               \
/* DWDivFP3 (Alg. 15, FMA two_prod) */                                                          \
void anynum_mc_dw_div_fp_fma_##SFX(const T *xh, const T *xl, const T *y, T *zh, T *zl,        \
                                   int64_t n) {                                                 \
    for (int64_t i = 0; i < n; i++) {                                                           \
        T th = xh[i] / y[i];                                                                    \
        T ph = th * y[i];                                                                       \
        T pl = FMA(th, y[i], -ph);                                                              \
        T dh = xh[i] - ph;                                                                      \
        T dt = dh - pl;                                                                         \
        T d = dt + xl[i];                                                                       \
        T tl = d / y[i], h, l;                                                                  \
        FAST_TWO_SUM(T, th, tl, h, l);                                                          \
        zh[i] = h; zl[i] = l;                                                                   \
    }                                                                                           \
}

KERNELS(float, f32, fmaf)
KERNELS(double, f64, fma)
"""

_NATIVE = NativeSource("mc_dw", _SOURCE, flags=("-ffp-contract=off", "-fno-fast-math"))
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CHUNK_MIN = 1 << 16  # elements per thread below which one call is cheaper than a thread hand-off


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = load(_NATIVE)
    if lib is None:
        return None
    for name, nin in KERNELS.items():
        for sfx in _SUFFIX.values():
            fn = getattr(lib, f"anynum_mc_{name}_{sfx}")
            fn.argtypes = [ctypes.c_void_p] * (nin + 2) + [ctypes.c_int64]
            fn.restype = None
    return lib


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="anynum-mc")


def available(*ins: torch.Tensor) -> bool:
    """Whether the C loops apply: ``ANYNUM_COMPILE`` "auto", same-shape contiguous float32 or
    float64 CPU tensors, and the library builds here.

    >>> import torch
    >>> from anynum.mc import cloops
    >>> cloops.available(torch.ones(3, dtype=torch.float16))
    False
    """
    x0 = ins[0]
    if x0.device.type != "cpu" or x0.dtype not in _SUFFIX or compile_mode() != "auto":
        return False
    shape = x0.shape
    if not all(t.shape == shape and t.dtype == x0.dtype and t.is_contiguous() for t in ins):
        return False
    return _library() is not None


def run(name: str, *ins: torch.Tensor) -> Comps:
    """Run C kernel `name` on inputs for which :func:`available` holds; returns (zh, zl).

    Both components come from one ``(2, *shape)`` allocation (two independent contiguous
    views).  NaN/inf propagate as in the formulas (the callers patch them).

    >>> import torch
    >>> from anynum.mc import cloops
    >>> x = torch.ones(4)
    >>> if cloops.available(x, x, x):
    ...     zh, zl = cloops.run("dw_plus_fp", x, x * 0, x * 2.0**-30)
    ... else:
    ...     zh, zl = torch.ones(4), torch.full((4,), 2.0**-30)
    >>> zh[0].item(), zl[0].item() == 2.0**-30
    (1.0, True)
    """
    lib = _library()
    assert lib is not None
    x0 = ins[0]
    out = torch.empty((2, *x0.shape), dtype=x0.dtype)
    zh, zl = out.unbind(0)
    fn = getattr(lib, f"anynum_mc_{name}_{_SUFFIX[x0.dtype]}")
    n = x0.numel()
    threads = min(torch.get_num_threads(), n // _CHUNK_MIN)
    ptrs = [t.data_ptr() for t in (*ins, zh, zl)]
    if threads <= 1:
        fn(*ptrs, n)
        return zh, zl
    size = x0.element_size()
    step = -(-n // threads)
    jobs = [
        _pool(threads).submit(fn, *(p + i * size for p in ptrs), min(step, n - i))
        for i in range(0, n, step)
    ]
    for j in jobs:
        j.result()
    return zh, zl
