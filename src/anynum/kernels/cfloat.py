"""Float-format rounding of float32 CPU tensors as one C loop, for tensors too small to compile.

Quantization-aware training rounds thousands of tensors of a few thousand to a
few hundred thousand elements per second. The eager reference kernel makes a
dozen passes over each, torch's float8 casts convert one element at a time, and
a compiled (Inductor) kernel costs tens of microseconds of Python per call. This
module compiles, once per machine, a C transliteration of the reference kernel
(`anynum.kernels.eager._round_float` with `round_scaled`, operation for
operation in float32, the working dtype) and calls it through ctypes: one pass,
vectorised by the C compiler, about 3 us per call.

It covers FloatFormat in the deterministic modes for float32 inputs whose
working dtype is float32, except round-to-nearest onto fp16 and bf16, where
torch's vectorised casts are faster; `cfloat_params` says None otherwise. Results equal
the reference bit for bit (tests/kernels/test_cfloat.py compares them on every
float16 and bfloat16 pattern, random float32 bit patterns and special values,
for every deterministic mode, overflow policy and many formats).

The library is built and loaded by `anynum.kernels.nativelib`: the system C
compiler, once per user and machine, into a private, verified cache (see
docs/security.md). No compiler, or a failed build, warns once and leaves the
callers on their other paths; ``ANYNUM_COMPILE=0`` keeps them off this path too.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from anynum.formats.base import Format
from anynum.formats.floating import FloatFormat
from anynum.kernels.eager import working_dtype
from anynum.kernels.native import float32_cast_dtype
from anynum.kernels.nativelib import NativeSource, load
from anynum.kernels.route import Call, Kernel, can_write_while_reading, register
from anynum.kernels.settings import compile_mode, compiles_at
from anynum.rounding import RandomSource, Rounding

__all__ = ["CFloatKernel", "CFloatParams", "cfloat_params", "cfloat_round"]

# One loop per rounding mode (a switch inside the loop would stop vectorisation); the
# format's flags are loop-invariant selects. Every line mirrors a torch op of the
# reference kernel, in float32, with the same IEEE semantics (no fast-math).
_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int32_t lift_tiny;     /* format binades go below float32's normal range */
    int32_t flush;         /* no subnormals: below the smallest normal, one step of that size */
    int32_t zero;          /* the format has a zero */
    int32_t negative_zero; /* the format has -0 */
    int32_t is_signed;
    int32_t overflow;      /* 0 saturate, 1 inf, 2 nan */
    int32_t recip;         /* every grid step of a finite input is a normal power of two <= 2**126 */
    float step_scale;      /* 2**-man_bits */
    float step_min;        /* 2**max(emin - man_bits, -149) */
    float smallest_normal;
    float limit;           /* the format's max */
} anynum_params;

static inline float binade_of(float a) {
    uint32_t b;
    memcpy(&b, &a, 4);
    b &= 0x7F800000u;
    float r;
    memcpy(&r, &b, 4);
    return r;
}

/* 1/step from the bits of a normal power of two in [2**-126, 2**126]: exact, and a multiply
   by it rounds like the division (both round the same exact quotient). */
static inline float reciprocal(float step) {
    uint32_t b;
    memcpy(&b, &step, 4);
    b = 0x7F000000u - b;
    float r;
    memcpy(&r, &b, 4);
    return r;
}

static inline float grid_step(float a, const anynum_params *p) {
    const float lift = 33554432.0f; /* 2**25: lifts float32 subnormals to read their exponent */
    float binade = binade_of(a);
    float tiny_binade = binade_of(a * lift) / lift;
    binade = (p->lift_tiny && a < 1.17549435e-38f) ? tiny_binade : binade;
    float step = binade * p->step_scale;
    step = step < p->step_min ? p->step_min : step;
    return (p->flush && a < p->smallest_normal) ? p->smallest_normal : step;
}

/* Selects, not branches, on the format's flags. `common` (a constant in each loop) says the
   format is signed and has a zero: GCC vectorises that loop, not the one with every select. */
static inline float finish(float x, float r, float step, int beyond, const anynum_params *p, int common) {
    float y = fabsf(x) == INFINITY ? x : r * step;
    y = copysignf(y, x);
    if (!common) y = (!p->zero && y == 0.0f) ? copysignf(p->smallest_normal, x) : y;
    float a = fabsf(y);
    float far = p->overflow == 2 ? NAN : INFINITY;
    a = a > p->limit ? ((p->overflow != 0 && beyond) ? far : p->limit) : a;
    y = copysignf(a, y);
    y = (!p->negative_zero && y == 0.0f) ? 0.0f : y;
    if (!common) y = !p->is_signed ? (x < 0.0f ? NAN : fabsf(y)) : y;
    return y;
}

/* the magnitude rule of round_scaled: lo = floor(|s|), f = |s| - lo, then away or not */
#define MAGNITUDE(AWAY)                                  \
    float m = fabsf(s);                                  \
    float lo = floorf(m);                                \
    float f = m - lo;                                    \
    float r = copysignf(lo + ((AWAY) ? 1.0f : 0.0f), s);

/* q: a local copy of the parameters, so that stores to ys cannot alias them */
#define LOOP(NAME, ROUND, BEYOND, COMMON, RECIP)                                           \
    static void NAME(const float *xs, float *ys, int64_t n,                              \
                     const anynum_params *params) {                                      \
        const anynum_params q = *params;                                                  \
        const anynum_params *p = &q;                                                      \
        for (int64_t i = 0; i < n; i++) {                                                 \
            float x = xs[i];                                                              \
            float step = grid_step(fabsf(x), p);                                          \
            float s = RECIP ? x * reciprocal(step) : x / step;                            \
            ROUND                                                                         \
            int x_inf = fabsf(x) == INFINITY;                                             \
            (void)x_inf;                                                                  \
            ys[i] = finish(x, r, step, (BEYOND), p, COMMON);                              \
        }                                                                                 \
    }

#define MODE(NAME, ROUND, BEYOND)                  \
    LOOP(NAME##_common, ROUND, BEYOND, 1, 0)       \
    LOOP(NAME##_common_recip, ROUND, BEYOND, 1, 1) \
    LOOP(NAME##_any, ROUND, BEYOND, 0, 0)

MODE(round_even, float r = rintf(s);, 1)
MODE(round_zero, float r = truncf(s);, x_inf)
MODE(round_up, float r = ceilf(s);, x_inf || x > 0.0f)
MODE(round_down, float r = floorf(s);, x_inf || x < 0.0f)
MODE(round_away, MAGNITUDE(f >= 0.5f), 1)
MODE(round_nearest_zero, MAGNITUDE(f > 0.5f), 1)
MODE(round_odd, MAGNITUDE(f > 0.0f && lo * 0.5f == floorf(lo * 0.5f)), x_inf)

#define DISPATCH(NAME)                                  \
    if (!common) NAME##_any(xs, ys, n, p);              \
    else if (p->recip) NAME##_common_recip(xs, ys, n, p); \
    else NAME##_common(xs, ys, n, p);                   \
    break;

void anynum_round_float32(const float *xs, float *ys, int64_t n, int32_t mode, const anynum_params *p) {
    int common = p->zero && p->is_signed;
    switch (mode) {
    case 0: DISPATCH(round_even)
    case 1: DISPATCH(round_away)
    case 2: DISPATCH(round_nearest_zero)
    case 3: DISPATCH(round_zero)
    case 4: DISPATCH(round_up)
    case 5: DISPATCH(round_down)
    case 6: DISPATCH(round_odd)
    }
}
"""

#: Mode numbers of the C entry point.
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


class _Params(ctypes.Structure):
    _fields_ = [
        ("lift_tiny", ctypes.c_int32),
        ("flush", ctypes.c_int32),
        ("zero", ctypes.c_int32),
        ("negative_zero", ctypes.c_int32),
        ("is_signed", ctypes.c_int32),
        ("overflow", ctypes.c_int32),
        ("recip", ctypes.c_int32),
        ("step_scale", ctypes.c_float),
        ("step_min", ctypes.c_float),
        ("smallest_normal", ctypes.c_float),
        ("limit", ctypes.c_float),
    ]


class CFloatParams:
    """A format, mode and overflow policy resolved for the C loop (see `cfloat_params`)."""

    def __init__(self, fmt: FloatFormat, mode: Rounding, overflow: str) -> None:
        self.mode = _MODES[mode]
        self.struct = _Params(
            lift_tiny=int(fmt.emin < -126),
            flush=int(not fmt.subnormals and fmt.emin >= -149),
            zero=int(fmt.zero),
            negative_zero=int(fmt.has_negative_zero),
            is_signed=int(fmt.signed),
            overflow=_OVERFLOW[overflow],
            # steps range over [2**max(emin - man_bits, -149), 2**(127 - man_bits)] (and the
            # smallest normal when flushing); their reciprocals are exact if all are normal and <= 2**126
            recip=int(fmt.emin - fmt.man_bits >= -126 and fmt.man_bits >= 1 and fmt.emin >= -126),
            step_scale=2.0**-fmt.man_bits,
            step_min=2.0 ** max(fmt.emin - fmt.man_bits, -149),
            smallest_normal=fmt.smallest_normal,
            limit=fmt.max,
        )


@functools.lru_cache(maxsize=256)
def cfloat_params(fmt: Format, mode: Rounding, overflow: str, dtype: torch.dtype) -> CFloatParams | None:
    """The C loop's parameters for rounding `dtype` tensors onto `fmt`, or None where it does not apply.

    >>> import anynum as an
    >>> cfloat_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", torch.float32) is not None
    True
    >>> cfloat_params(an.E4M3FN, Rounding.STOCHASTIC, "saturate", torch.float32) is None
    True
    """
    if (
        not isinstance(fmt, FloatFormat)
        or dtype != torch.float32
        or working_dtype(fmt, dtype) != torch.float32
        or mode not in _MODES
        or overflow not in _OVERFLOW
        # torch's fp16/bf16 casts are vectorised and faster than this loop (its float8 casts are not)
        or float32_cast_dtype(fmt, mode, overflow) in (torch.float16, torch.bfloat16)
    ):
        return None
    return CFloatParams(fmt, mode, overflow)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its storage span in some order the loop may walk (row-major or
    channels-last): an elementwise loop over that span, with an output of the same strides, is right."""
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)


def cfloat_round(
    x: torch.Tensor, params: CFloatParams, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Round float32 CPU `x` with the C loop (into `out`, if given).

    The result keeps a row-major or channels-last layout of `x` (other layouts are made
    row-major first). `out` may be `x` itself or a tensor not overlapping it. Returns None
    when the library cannot be had (no compiler): use another path. NaN stays NaN; ±inf
    and overflow follow the overflow policy exactly as `anynum.quantize` does.

    >>> import anynum as an
    >>> p = cfloat_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", torch.float32)
    >>> y = cfloat_round(torch.tensor([0.3, -500.0, float("inf")]), p)
    >>> y is None or y.tolist() == [0.3125, -448.0, 448.0]
    True
    """
    lib = _library()
    if lib is None:
        return None
    if not _dense(x):
        x = x.contiguous()
    if out is not None and out.stride() != x.stride():  # a layout the loop cannot write in step
        y = cfloat_round(x, params)
        return None if y is None else out.copy_(y)
    y = torch.empty_like(x) if out is None else out
    lib.anynum_round_float32(x.data_ptr(), y.data_ptr(), x.numel(), params.mode, params.struct)
    return y


class CFloatKernel(Kernel):
    """The C loop in the router: float32 CPU tensors onto float formats, deterministic modes, below
    the compiled kernels' size, while ``ANYNUM_COMPILE`` is "auto"."""

    name = "c-float"
    rank = 10

    def __init__(self) -> None:
        self._params: dict[Call, CFloatParams] = {}

    def covers(self, call: Call) -> bool:
        return (
            call.device == "cpu"
            and compile_mode() == "auto"
            and cfloat_params(call.fmt, call.mode, call.overflow, call.dtype) is not None
        )

    def accepts(self, call: Call, numel: int) -> bool:
        return not compiles_at(numel)

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor | None:
        params = self._params.get(call)
        if params is None:
            params = cfloat_params(call.fmt, call.mode, call.overflow, call.dtype)
            assert params is not None
            self._params[call] = params
        into = out if out is not None and can_write_while_reading(x, out) else None
        return cfloat_round(x, params, into)  # None without a C compiler: the next kernel runs


_NATIVE = NativeSource("cfloat", _SOURCE)


@functools.cache
def _library() -> ctypes.CDLL | None:
    lib = load(_NATIVE)
    if lib is None:
        return None
    fn = lib.anynum_round_float32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.POINTER(_Params)]
    fn.restype = None
    return lib


register(CFloatKernel())
