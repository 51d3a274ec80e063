"""One pass of C over a tensor and its rounded values: the counts, sums, maximum and histogram of `Stats`.

`anynum.nn.stats` holds the reference: readable torch code that runs on any device and
reads each tensor some thirty times. This loop computes the same quantities in one read,
for float32/float64 CPU tensors, so that watching a model costs little more than running
it. It is built and loaded through `anynum.kernels.nativelib` (a private, verified cache);
without a C compiler the reference runs. Counts, histogram and maximum equal the
reference's exactly; the float64 sums add in another order and may differ in their last
bits (tests/nn/test_stats_native.py compares the two on special and random values).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from anynum.kernels.nativelib import NativeSource, load

__all__ = ["SLOTS", "fold"]

#: How many leading entries of the running-sum vector the loop fills (count, nonzero, NaN,
#: overflow, underflow, subnormal, signal, noise, relative-error sum, its count).
SLOTS = 10

_SOURCE = r"""
#include <stdint.h>
#include <math.h>

/* floor(log2(a)) for a finite a > 0, from the bits (subnormals included). */
static inline int floor_log2(double a) {
    union { double d; uint64_t u; } v;
    v.d = a;
    int e = (int)((v.u >> 52) & 0x7ff);
    if (e) return e - 1023;
    uint64_t m = v.u & ((1ULL << 52) - 1);
    return (63 - __builtin_clzll(m)) - 1074;
}

/* The definitions are those of anynum/nn/stats.py; sn < 0 means "no subnormal count". */
#define LOOP(T)                                                                              \
    double nz = 0, nan = 0, over = 0, under = 0, sub = 0, sig = 0, noise = 0, rel = 0, reln = 0; \
    double top = *maxabs;                                                                    \
    for (int64_t i = 0; i < n; i++) {                                                        \
        double xv = (double)x[i], yv = (double)y[i];                                         \
        if (xv != xv) { nan += 1; continue; }                                                \
        double ax = fabs(xv);                                                                \
        if (ax > top) top = ax;                                                              \
        if (ax == 0) continue;                                                               \
        nz += 1;                                                                             \
        if (ax > fmax) over += 1;                                                            \
        double ay = fabs(yv);                                                                \
        if (yv == 0) under += 1;                                                             \
        else if (ay < sn) sub += 1;                                                          \
        if (ax < INFINITY) {                                                                 \
            double e = ay < INFINITY ? yv - xv : INFINITY;                                   \
            sig += xv * xv;                                                                  \
            noise += e * e;                                                                  \
            rel += fabs(e) / ax;                                                             \
            reln += 1;                                                                       \
            hist[floor_log2(ax) + offset] += 1;                                              \
        }                                                                                    \
    }                                                                                        \
    acc[0] += (double)n; acc[1] += nz; acc[2] += nan; acc[3] += over; acc[4] += under;       \
    acc[5] += sub; acc[6] += sig; acc[7] += noise; acc[8] += rel; acc[9] += reln;            \
    *maxabs = top;

void anynum_stats_f32(const float* x, const float* y, int64_t n, double fmax, double sn,
                      int64_t offset, double* acc, int64_t* hist, double* maxabs) { LOOP(float) }

void anynum_stats_f64(const double* x, const double* y, int64_t n, double fmax, double sn,
                      int64_t offset, double* acc, int64_t* hist, double* maxabs) { LOOP(double) }
"""

_NATIVE = NativeSource("diagnose_stats", _SOURCE)


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = load(_NATIVE)
    if lib is None:
        return None
    for name in ("anynum_stats_f32", "anynum_stats_f64"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
        fn.restype = None
    return lib


def fold(
    x: torch.Tensor,
    y: torch.Tensor,
    fmax: float,
    smallest_normal: float | None,
    offset: int,
    sums: torch.Tensor,
    hist: torch.Tensor,
    max_abs: torch.Tensor,
) -> bool:
    """Add the statistics of (x, y) into `sums[:SLOTS]`, `hist` and `max_abs` in place.

    Returns False (and does nothing) where the loop does not apply: not a float32/float64
    CPU tensor, accumulators elsewhere than the CPU, or no C compiler.

    >>> s, h = torch.zeros(13, dtype=torch.float64), torch.zeros(8, dtype=torch.int64)
    >>> m = torch.zeros((), dtype=torch.float64)
    >>> x = torch.tensor([0.0, 3.0, float("nan")]); y = torch.tensor([0.0, 2.0, float("nan")])
    >>> fold(x, y, 6.0, 1.0, 4, s, h, m) is False or (s[:3].tolist(), h.tolist(), float(m))
    ([3.0, 1.0, 1.0], [0, 0, 0, 0, 0, 1, 0, 0], 3.0)
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) or sums.device.type != "cpu":
        return False
    lib = _library()
    if lib is None:
        return False
    x = x.detach().contiguous()
    y = y.detach().to(x.dtype).contiguous()
    fn = lib.anynum_stats_f32 if x.dtype == torch.float32 else lib.anynum_stats_f64
    sn = -1.0 if smallest_normal is None else smallest_normal
    fn(x.data_ptr(), y.data_ptr(), x.numel(), fmax, sn, offset, sums.data_ptr(), hist.data_ptr(),
       max_abs.data_ptr())  # fmt: skip
    return True
