"""The native library of `anynum.mc`: C source, build and load through `anynum.kernels.nativelib`.

One library holds the double-word loops (`anynum.mc.cloops`) and the float engine's slicing
kernels and fused last step (`anynum.mc.cslices`), for float and double.  Every function
transliterates, operation for operation, the torch code it replaces (IEEE operations in the
component dtype, C99 ``fma`` where torch uses ``addcmul``, ``nearbyint`` where it uses
``torch.round``), compiled with
``-ffp-contract=off`` (no contraction of ``a*b + c`` into an FMA, which would make error
terms vanish) and without fast-math, so the results are the torch paths' bits (tested).
It is built once per user and machine into nativelib's private, verified cache; no compiler,
or a failed build, warns once there and leaves the callers on their torch paths.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from anynum.kernels.nativelib import NativeSource, load

__all__ = ["DW_KERNELS", "library", "run_parallel"]

# double-word kernels: name -> number of inputs; each writes (zh, zl) and takes a length n
DW_KERNELS = {"dw_plus_dw": 4, "dw_plus_fp": 3, "dw_times_dw_fma": 4, "dw_times_fp_fma": 3,
              "dw_div_dw_fma": 4, "dw_div_fp_fma": 3}

DW_SOURCE = r"""

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

SLICE_SOURCE = r"""
/* The float engine's slicing.  Per row: the exponent e of the largest |value| (frexp), then
   x = value * 2**ex exactly as anynum.mc.ozaki_float._scaled (one multiplication when 2**ex
   is a normal double, else by 2**floor(ex/2) and then 2**(ex - floor(ex/2))), and per slice
   x <- x 2**beta (s > 0), q = nearbyint(x), x <- x - q.  Rows are processed in blocks of
   SB columns held in a small buffer, so every inner loop is a plain vectorisable loop (a row
   of at most SB columns is read from memory once: the exponent pass leaves it in the buffer). */
#define SB 512

static void load_f32(const float *p0, const float *p1, int64_t cs, int64_t n, double *restrict x) {
    if (cs == 1 && p1) { for (int64_t j = 0; j < n; j++) x[j] = (double)p0[j] + (double)p1[j]; }
    else if (cs == 1)  { for (int64_t j = 0; j < n; j++) x[j] = (double)p0[j]; }
    else if (p1) { for (int64_t j = 0; j < n; j++) x[j] = (double)p0[j * cs] + (double)p1[j * cs]; }
    else         { for (int64_t j = 0; j < n; j++) x[j] = (double)p0[j * cs]; }
}

static void load_f64(const double *p0, const double *p1, int64_t cs, int64_t n, double *restrict x) {
    (void)p1;  /* one float64 component */
    if (cs == 1) { for (int64_t j = 0; j < n; j++) x[j] = p0[j]; }
    else         { for (int64_t j = 0; j < n; j++) x[j] = p0[j * cs]; }
}

static double max_abs(const double *x, int64_t n, double m) {
    /* max(m, |x[j]|): the magnitudes' bit patterns order like their values (NaN's above
       inf's), so an unsigned integer maximum, which vectorises, finds it; a NaN falls back to
       the comparisons, which skip NaNs */
    uint64_t mb = 0;
    for (int64_t j = 0; j < n; j++) {
        uint64_t b;
        memcpy(&b, x + j, 8);
        b &= 0x7fffffffffffffffULL;
        mb = b > mb ? b : mb;
    }
    if (mb > 0x7ff0000000000000ULL) {
        for (int64_t j = 0; j < n; j++) { double a = fabs(x[j]); m = a > m ? a : m; }
        return m;
    }
    double a;
    memcpy(&a, &mb, 8);
    return a > m ? a : m;
}

/* acc[l] += x[j] y[j] over j = l mod 8: eight independent sums (any order is covered) */
static void dot8(double *restrict acc, const double *restrict x, const double *restrict y, int64_t n) {
    double a[8];  /* local: kept in registers */
    for (int l = 0; l < 8; l++) a[l] = acc[l];
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) a[l] += x[j + l] * y[j + l];
    for (; j < n; j++) a[0] += x[j] * y[j];
    for (int l = 0; l < 8; l++) acc[l] = a[l];
}

/* x <- x 2**ex (one multiplication where 2**ex is normal, else two); also into t0 if given */
static void scale(double *restrict x, double *restrict t0, int64_t n, int64_t ex) {
    if (ex >= -1022 && ex <= 1023) {
        double f = ldexp(1.0, (int)ex);
        for (int64_t j = 0; j < n; j++) x[j] = x[j] * f;
    } else {
        int64_t e1 = ex >= 0 ? ex / 2 : -((-ex + 1) / 2);
        double f1 = ldexp(1.0, (int)e1), f2 = ldexp(1.0, (int)(ex - e1));
        for (int64_t j = 0; j < n; j++) x[j] = (x[j] * f1) * f2;
    }
    if (t0) for (int64_t j = 0; j < n; j++) t0[j] = x[j];
}

/* one slice: x <- x step (s > 0), q = nearbyint(x), x <- x - q; the remainder also into t,
   and only there for the last slice (`last`; storing x back too doubled the time of the pass) */
static void slice_step(double *restrict x, double *restrict q, double *restrict t, int64_t n,
                       double step, int last) {
    if (step != 1.0) for (int64_t j = 0; j < n; j++) x[j] = x[j] * step;
    if (t && last) {
        for (int64_t j = 0; j < n; j++) { double qq = nearbyint(x[j]); q[j] = qq; t[j] = x[j] - qq; }
    } else if (t) {
        for (int64_t j = 0; j < n; j++) {
            double qq = nearbyint(x[j]), r = x[j] - qq;
            q[j] = qq; x[j] = r; t[j] = r;
        }
    } else {
        for (int64_t j = 0; j < n; j++) { double qq = nearbyint(x[j]); q[j] = qq; x[j] = x[j] - qq; }
    }
}

#define SLICE_KERNELS(T, SFX)                                                                    \
static int row_exponent_##SFX(const T *p0, const T *p1, int64_t k, int64_t cs, double *xs) {   \
    double m = 0.0;                                                                             \
    for (int64_t j0 = 0; j0 < k; j0 += SB) {                                                    \
        int64_t nb = k - j0 < SB ? k - j0 : SB;                                                 \
        load_##SFX(p0 + j0 * cs, p1 ? p1 + j0 * cs : 0, cs, nb, xs);                            \
        m = max_abs(xs, nb, m);                                                                 \
    }                                                                                           \
    int e = 0;                                                                                  \
    if (m != 0.0) frexp(m, &e);                                                                 \
    return e;                                                                                   \
}                                                                                               \
void anynum_mc_slice_##SFX(const T *a0, const T *a1, int64_t R, int64_t k, int64_t rs,          \
                           int64_t cs, int64_t S, int64_t beta, double *q, int64_t q_row,       \
                           int64_t q_plane, double *t, int64_t t_row, int64_t t_plane,          \
                           int64_t tmask, int64_t *e_out) {                                     \
    const double step = ldexp(1.0, (int)beta);                                                  \
    double xs[SB] __attribute__((aligned(64)));  /* whole cache lines: AVX-512 */        \
    for (int64_t r = 0; r < R; r++) {                                                           \
        const T *p0 = a0 + r * rs, *p1 = a1 ? a1 + r * rs : 0;                                  \
        int e = row_exponent_##SFX(p0, p1, k, cs, xs);                                          \
        e_out[r] = e;                                                                           \
        for (int64_t j0 = 0; j0 < k; j0 += SB) {                                                \
            int64_t nb = k - j0 < SB ? k - j0 : SB;                                             \
            if (k > SB) load_##SFX(p0 + j0 * cs, p1 ? p1 + j0 * cs : 0, cs, nb, xs);            \
            double *tr = t + r * t_row + j0;                                                    \
            scale(xs, (tmask & 1) ? tr : 0, nb, (S ? beta : 0) - e);                            \
            for (int64_t s = 0; s < S; s++)                                                     \
                slice_step(xs, q + s * q_plane + r * q_row + j0,                                \
                           ((tmask >> (s + 1)) & 1) ? tr + (s + 1) * t_plane : 0, nb,           \
                           s ? step : 1.0, s == S - 1);                                         \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
void anynum_mc_mv_##SFX(const T *a0, const T *a1, int64_t R, int64_t k, int64_t rs, int64_t cs, \
                        int64_t S, int64_t beta, const double *bq, const double *bt,            \
                        double *lev, int64_t lev_stride, double *tail, int64_t *e_out) {        \
    const double step = ldexp(1.0, (int)beta);                                                  \
    double xs[SB] __attribute__((aligned(64))), qs[SB] __attribute__((aligned(64)));            \
    for (int64_t r = 0; r < R; r++) {                                                           \
        const T *p0 = a0 + r * rs, *p1 = a1 ? a1 + r * rs : 0;                                  \
        int e = row_exponent_##SFX(p0, p1, k, cs, xs);                                          \
        e_out[r] = e;                                                                           \
        double lv[8][8] = {{0}}, tl[8] = {0};                                                   \
        for (int64_t j0 = 0; j0 < k; j0 += SB) {                                                \
            int64_t nb = k - j0 < SB ? k - j0 : SB;                                             \
            if (k > SB) load_##SFX(p0 + j0 * cs, p1 ? p1 + j0 * cs : 0, cs, nb, xs);            \
            scale(xs, 0, nb, (S ? beta : 0) - e);                                               \
            for (int64_t s = 0; s < S; s++) {                                                   \
                slice_step(xs, qs, 0, nb, s ? step : 1.0, 0);                                   \
                for (int64_t u = 0; u + s < S; u++) dot8(lv[s + u], qs, bq + u * k + j0, nb);   \
                dot8(tl, qs, bt + s * k + j0, nb);                                              \
            }                                                                                   \
            dot8(tl, xs, bt + S * k + j0, nb);                                                  \
        }                                                                                       \
        double ts = 0.0;                                                                        \
        for (int l = 0; l < 8; l++) ts += tl[l];                                                \
        tail[r] = ts;                                                                           \
        for (int64_t d = 0; d < S; d++) {                                                       \
            double ds = 0.0;                                                                    \
            for (int l = 0; l < 8; l++) ds += lv[d][l];                                         \
            lev[d * lev_stride + r] = ds;                                                                \
        }                                                                                       \
    }                                                                                           \
}

SLICE_KERNELS(float, f32)
SLICE_KERNELS(double, f64)
"""

EPILOGUE_SOURCE = r"""
/* The float engine's last step for float32 components and nc = 2 (anynum.mc.ozaki_float):
   per output, the S + 1 raw slice products (tail, then level sums S-1 .. 0) scaled exactly
   as _Scale does, (x * 2**e_r) * 2**(f_c - c), summed as sum_terms does (h = first term,
   l = +0, then DWPlusFP per term), and narrowed to two floats as convert._dw_narrow does
   (TwoSum, round, exact remainder where finite, round): the same IEEE operations in the same
   order, so the same bits, in one pass over the products instead of about twenty.  Each row
   is done in segments of EB columns held in small buffers, so every inner loop vectorises. */
#define EB 256
#define EPI_MAX_S 32

static double pow2_normal(int64_t ex) { return ldexp(1.0, (int)ex); }  /* -1022 <= ex <= 1023 */

void anynum_mc_mm_narrow_f32(const double *tail, int64_t t_row, const double *lev,
                             int64_t l_row, int64_t l_plane, int64_t S, int64_t beta,
                             int64_t m, int64_t n, const int64_t *e, const int64_t *f,
                             float *c0, float *c1, int64_t o_row) {
    double pf[EPI_MAX_S + 1][EB], h[EB], l[EB];
    for (int64_t j0 = 0; j0 < n; j0 += EB) {
        int64_t nb = n - j0 < EB ? n - j0 : EB;
        for (int64_t d = 0; d <= S; d++)  /* term d < S: level d, weight (d + 2) beta; d = S: tail */
            for (int64_t j = 0; j < nb; j++)
                pf[d][j] = pow2_normal(f[j0 + j] - (d < S ? d + 2 : S + 1) * beta);
        for (int64_t r = 0; r < m; r++) {
            const double pe = pow2_normal(e[r]);
            const double *tr = tail + r * t_row + j0;
            const double *ps = pf[S];
            for (int64_t j = 0; j < nb; j++) { h[j] = (tr[j] * pe) * ps[j]; l[j] = 0.0; }
            for (int64_t d = S - 1; d >= 0; d--) {
                const double *lr = lev + d * l_plane + r * l_row + j0, *pd = pf[d];
                for (int64_t j = 0; j < nb; j++) {
                    double y = (lr[j] * pe) * pd[j], sh, sl, v, hh, ll;
                    TWO_SUM(double, h[j], y, sh, sl);
                    v = l[j] + sl;
                    FAST_TWO_SUM(double, sh, v, hh, ll);
                    h[j] = hh; l[j] = ll;
                }
            }
            float *o0 = c0 + r * o_row + j0, *o1 = c1 + r * o_row + j0;
            for (int64_t j = 0; j < nb; j++) {
                double s, er;
                TWO_SUM(double, h[j], l[j], s, er);
                float a = (float)s;
                /* where a is finite, (s - a) + er; else +0 = RN(0 + 0): the arithmetic first,
                   then a mask of the bits (no branch, so the loop vectorises) */
                double lo = (s - (double)a) + er;
                uint32_t ab;
                uint64_t lb;
                memcpy(&ab, &a, 4);
                memcpy(&lb, &lo, 8);
                lb &= (ab & 0x7fffffffu) < 0x7f800000u ? ~(uint64_t)0 : 0;
                memcpy(&lo, &lb, 8);
                o0[j] = a;
                o1[j] = (float)lo;
            }
        }
    }
}
"""

_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES = {
    **{f"anynum_mc_{name}_{sfx}": [_P] * (nin + 2) + [_I]
       for name, nin in DW_KERNELS.items() for sfx in ("f32", "f64")},
    **{f"anynum_mc_slice_{sfx}": [_P, _P, _I, _I, _I, _I, _I, _I, _P, _I, _I, _P, _I, _I, _I, _P]
       for sfx in ("f32", "f64")},
    **{f"anynum_mc_mv_{sfx}": [_P, _P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _I, _P, _P]
       for sfx in ("f32", "f64")},
    "anynum_mc_mm_narrow_f32": [_P, _I, _P, _I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _I],
}
_NATIVE = NativeSource("mc", "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n"
                       + DW_SOURCE + SLICE_SOURCE + EPILOGUE_SOURCE,
                       flags=("-ffp-contract=off", "-fno-fast-math"))


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library with its functions' argument types declared, or None.

    None where nativelib builds nothing (no compiler, failed build), and where the loaded
    library lacks the functions (another library loaded in its place): one warning, and the
    torch paths run.

    >>> from anynum.mc import native
    >>> lib = native.library()
    >>> lib is None or hasattr(lib, "anynum_mc_dw_plus_dw_f32")
    True
    """
    lib = load(_NATIVE)
    if lib is None:
        return None
    try:
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = None
    except AttributeError as exc:
        warnings.warn(
            f"anynum: the native mc kernels did not load as built ({exc}); using the torch paths.",
            RuntimeWarning, stacklevel=2)
        return None
    return lib


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="anynum-mc")


def run_parallel(fn: Callable[..., object], calls: Sequence[Sequence[object]]) -> None:
    """``fn(*args)`` for every argument list, on up to ``torch.get_num_threads()`` threads.

    The library's functions release the GIL (ctypes), so the calls, which must write disjoint
    outputs, run in parallel; one call runs inline.

    >>> from anynum.mc import native
    >>> out = []
    >>> native.run_parallel(out.append, [[1], [2]]); sorted(out)
    [1, 2]
    """
    if len(calls) == 1:
        fn(*calls[0])
        return
    pool = _pool(max(1, min(torch.get_num_threads(), len(calls))))
    jobs = [pool.submit(fn, *args) for args in calls]
    for j in jobs:
        j.result()
