"""Parameter structures of the native kernels: one `CallParams` per (format, mode, overflow,
rand_bits, dtype), resolved once and reused by every call.

Each family's structure mirrors its C twin in ``csrc/common.c`` field for field. Constants
are stored as float64 and converted to the working type inside the kernel exactly as torch
converts a Python scalar in an op on a tensor of that type (``static_cast<float>(double)``),
so a constant that float32 cannot hold behaves as it does in the eager reference.
`call_params` says None for anything the native kernels do not cover (then the router's
next kernel runs).

>>> import torch, anynum as an
>>> from anynum.rounding import Rounding
>>> p = call_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.float32)
>>> p is not None and p.struct.family == FAMILY_FLOAT and p.struct.wdt == 0
True
>>> call_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.int32) is None
True
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np
import torch

from anynum._bits import layout
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.formats.table import Table
from anynum.kernels.block import saturate_to_dtype_needed, underflow_is_harmless
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.kernels.positparams import PositParams, posit_params
from anynum.kernels.tablelut import neighbour_lut, result_lut
from anynum.rounding import Rounding

__all__ = [
    "DTYPE_CODES",
    "FAMILY_BLOCK",
    "FAMILY_FLOAT",
    "FAMILY_POSIT",
    "FAMILY_TABLE",
    "FAMILY_UNIFORM",
    "MODE_CODES",
    "OVERFLOW_CODES",
    "CallParams",
    "call_params",
    "mode_code",
]

FAMILY_FLOAT, FAMILY_UNIFORM, FAMILY_POSIT, FAMILY_TABLE, FAMILY_BLOCK = range(5)
DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
MODE_CODES = {
    Rounding.NEAREST_EVEN: 0,
    Rounding.NEAREST_AWAY: 1,
    Rounding.NEAREST_ZERO: 2,
    Rounding.TOWARD_ZERO: 3,
    Rounding.UP: 4,
    Rounding.DOWN: 5,
    Rounding.ODD: 6,
}
OVERFLOW_CODES = {"saturate": 0, "inf": 1, "nan": 2}
_TIES = {"smaller_magnitude": 0, "away": 1, "even": 2, "down": 3, "up": 4}
_RULES = {"floor": 0, "ceil": 1, "even": 2, "amax": 3}

#: Fewest elements worth a thread of their own, by family (cheap loops want longer runs).
_GRAIN = {FAMILY_FLOAT: 32768, FAMILY_UNIFORM: 32768, FAMILY_POSIT: 8192, FAMILY_TABLE: 16384}
_GRAIN_BLOCK = 16384
_GRAIN_RANDOM = 16384  # stochastic modes: the counter hash costs more than the rounding


def mode_code(mode: Rounding, rand_bits: int | None) -> int:
    """The C loop's mode number: 0..6 deterministic, 7 exact SR, 8 SR with rand_bits, 9 SR uniform.

    >>> mode_code(Rounding.TOWARD_ZERO, None), mode_code(Rounding.STOCHASTIC, 8)
    (3, 8)
    """
    if mode is Rounding.STOCHASTIC:
        return 7 if rand_bits is None else 8
    if mode is Rounding.STOCHASTIC_UNIFORM:
        return 9
    return MODE_CODES[mode]


class FloatParams(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_double) for name in ("step_scale", "step_min", "smallest_normal", "limit")),
        *(
            (name, ctypes.c_int32)
            for name in (
                "lift_tiny",
                "flush",
                "zero",
                "negative_zero",
                "is_signed",
                "overflow",
                "recip",
                "common",
                "on_bits",
                "pad",
            )
        ),
    ]


class UniformParams(ctypes.Structure):
    _fields_ = [
        *(
            (name, ctypes.c_double)
            for name in ("inv_step", "step", "tiny", "code_min", "code_max", "modulus", "inv_modulus", "span")
        ),
        ("step_pos", ctypes.c_int32),
        ("wrap", ctypes.c_int32),
    ]


class TableParams(ctypes.Structure):
    _fields_ = [
        ("values", ctypes.c_void_p),
        ("bound", ctypes.c_void_p),
        ("bound_exact", ctypes.c_void_p),
        ("bucket_lo", ctypes.c_void_p),
        ("bucket_hi", ctypes.c_void_p),
        *(
            (name, ctypes.c_int64)
            for name in ("size", "first_nonneg", "zero_index", "e_lo", "e_hi", "mbits", "ncodes", "top_step")
        ),
        ("lut", ctypes.c_void_p),
        *((name, ctypes.c_int64) for name in ("lut_shift", "lut_klo", "lut_khi", "lut_ntot")),
        *(
            (name, ctypes.c_int32)
            for name in (
                "ties", "underflow_saturate", "infinity_nan", "signed_zero", "negative_nan", "lut_pow2",
                "lut_float_lanes",  # the stochastic choice on float32 lanes (TableLut.float_lanes)
                "portable",  # 1: the portable loops where a vector path is built (tests)
            )
        ),
    ]


class BlockParams(ctypes.Structure):
    _fields_ = [
        ("ef", FloatParams),
        ("scale_fmt", FloatParams),
        ("tensor_fmt", FloatParams),
        ("eu", UniformParams),
        *((n, ctypes.c_double) for n in ("ceil_sig", "elem_max", "scale_min", "tensor_min", "tensor_den")),
        ("block_size", ctypes.c_int64),
        *(
            (name, ctypes.c_int32)
            for name in (
                "elem_family", "rule", "pow2", "kmin", "kmax", "elem_emax", "symmetric", "fix_tiny",
                "tensor_scale", "sat_dtype", "rcp", "nthr", "thr_incl", "thr_lo",
            )
        ),
        ("grid", ctypes.c_double * 16),
        ("thr", ctypes.c_double * 16),
    ]  # fmt: skip


class CallStruct(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int32) for name in ("family", "mode", "wdt", "tdt", "rand_bits", "pad")),
        ("grain", ctypes.c_int64),
        ("two_r", ctypes.c_double),
        ("f", FloatParams),
        ("u", UniformParams),
        ("p", PositParams),
        ("t", TableParams),
        ("b", BlockParams),
    ]


class CallParams:
    """A resolved call: the C structure, its address (passed on every call), the working dtype,
    and whatever the structure points into (kept alive here)."""

    __slots__ = ("address", "block", "keep", "struct", "wdtype")

    def __init__(self, struct: CallStruct, wdtype: torch.dtype, keep: tuple[Any, ...] = ()) -> None:
        self.struct = struct
        self.address = ctypes.addressof(struct)
        self.wdtype = wdtype
        self.keep = keep
        self.block = struct.family == FAMILY_BLOCK


def float_params(fmt: FloatFormat, wdtype: torch.dtype, overflow: str) -> FloatParams:
    """The C loop's view of `fmt` in working dtype `wdtype` (anynum.kernels.eager._round_float).

    >>> import anynum as an
    >>> p = float_params(an.E4M3FN, torch.float32, "saturate")
    >>> p.limit, p.step_scale, p.overflow
    (448.0, 0.125, 0)
    """
    lay = layout(wdtype)
    return FloatParams(
        step_scale=2.0**-fmt.man_bits,
        step_min=2.0 ** max(fmt.emin - fmt.man_bits, lay.quantum_min),
        smallest_normal=fmt.smallest_normal,
        limit=fmt.max,
        lift_tiny=int(fmt.emin < lay.emin),
        flush=int(not fmt.subnormals and fmt.emin >= lay.quantum_min),
        zero=int(fmt.zero),
        negative_zero=int(fmt.has_negative_zero),
        is_signed=int(fmt.signed),
        overflow=OVERFLOW_CODES[overflow],
        # Steps range over [step_min, 2**(emax - man_bits)] of the working type (and the smallest
        # normal when flushing): their reciprocals are exact if all are normal with normal inverses.
        recip=int(fmt.emin - fmt.man_bits >= lay.emin and fmt.man_bits >= 1 and fmt.emin >= lay.emin),
        common=int(fmt.zero and fmt.signed),
        on_bits=int(float_on_bits(fmt, wdtype)),
    )


def float_on_bits(fmt: FloatFormat, wdtype: torch.dtype) -> bool:
    """Whether the deterministic modes onto `fmt` may run on the working type's bits (scalar.c
    float_bits): `fmt` signed with a zero, narrower, its whole grid (subnormals kept) inside the
    working type's binades, so rounding a normal input's fraction bits is the format's rounding
    and its subnormals have one step, a power of two the working type holds.

    >>> import anynum as an
    >>> float_on_bits(an.E4M3FN, torch.float32), float_on_bits(an.FP32, torch.float32)
    (True, False)
    """
    lay = layout(wdtype)
    return (
        fmt.zero and fmt.signed and fmt.subnormals and lay.emin <= fmt.emin and fmt.emax <= lay.emax
        and 1 <= fmt.man_bits < lay.man_bits  # (with no fraction bits, ties go up: s = 1.5 -> 2)
        and fmt.emin - fmt.man_bits >= lay.quantum_min
        and 0 <= fmt.man_bits - fmt.emin <= 2 * lay.emax  # 1 / step: two factors, each finite
    )


def uniform_params(fmt: UniformFormat, wdtype: torch.dtype, overflow: str) -> UniformParams:
    """The C loop's view of a fixed-point or integer format (anynum.kernels.eager._round_uniform).

    >>> import anynum as an
    >>> p = uniform_params(an.FixedPoint(4, 8), torch.float32, "wrap")
    >>> p.step, p.code_min, p.code_max, p.wrap
    (0.00390625, -2048.0, 2047.0, 1)
    """
    return UniformParams(
        inv_step=2.0**-fmt.step_exp,
        step=2.0**fmt.step_exp,
        tiny=2.0 ** layout(wdtype).quantum_min,
        code_min=float(fmt.code_min),
        code_max=float(fmt.code_max),
        modulus=float(1 << fmt.bits),
        inv_modulus=2.0**-fmt.bits,
        span=float(1 << fmt.bits) * 2.0**fmt.step_exp,
        step_pos=int(fmt.step_exp > 0),
        wrap=int(overflow == "wrap"),
    )


def _table_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """A bucket index over sorted float64 `values`: the C search starts from the range of positions
    (j with values[j] <= x, -1 below) that the inputs of x's bucket can have.

    Buckets follow the order of x: sign, then the biased exponent clamped to [e_lo, e_hi] (the
    exponents of the smallest nonzero and of the largest finite |value|) with the top `mbits`
    fraction bits, code 0 below e_lo and ncodes - 1 above e_hi; negative x take bucket
    ncodes - 1 - code, positive ones ncodes + code. Each bucket's range comes from its smallest
    and largest input, so the search within it is exact whatever the values.
    """
    mags = np.abs(values[np.isfinite(values)])
    nonzero = mags[mags > 0]
    expo = lambda v: int(np.float64(v).view(np.uint64) >> np.uint64(52)) & 0x7FF  # noqa: E731
    e_lo = expo(nonzero.min()) if nonzero.size else 1023
    e_hi = max(expo(nonzero.max()), e_lo) if nonzero.size else 1023
    e_hi = min(e_hi, 2046)
    span = e_hi - e_lo + 1
    mbits = int(min(8, max(0, np.floor(np.log2(4096 / span)))))
    ncodes = 2 + (span << mbits)
    low = np.uint64((1 << (52 - mbits)) - 1)
    k = np.arange(span << mbits, dtype=np.uint64)
    first = ((k >> np.uint64(mbits)) + np.uint64(e_lo)) << np.uint64(52) | (
        k & np.uint64((1 << mbits) - 1)
    ) << np.uint64(52 - mbits)
    below_top = np.uint64((e_lo << 52) - 1) if e_lo > 0 else np.uint64(0)
    smallest = np.concatenate([[np.uint64(0)], first, [np.uint64((e_hi + 1) << 52)]]).view(np.float64)
    largest = np.concatenate([[below_top], first | low, [np.uint64(0x7FF0000000000000)]]).view(np.float64)

    def pos(v: np.ndarray) -> np.ndarray:
        return np.searchsorted(values, v, side="right").astype(np.int64) - 1

    lo = np.concatenate([pos(-largest)[::-1], pos(smallest)])
    hi = np.concatenate([pos(-smallest)[::-1], pos(largest)])
    widest = int((hi - lo).max())
    top_step = 1 << (widest.bit_length() - 1) if widest > 0 else 0
    meta = {"e_lo": e_lo, "e_hi": e_hi, "mbits": mbits, "ncodes": ncodes, "top_step": top_step}
    return np.ascontiguousarray(lo), np.ascontiguousarray(hi), meta


def _table_params(fmt: Table, mode: Rounding, key64: bool,
                  rand_bits: int | None) -> tuple[TableParams, tuple[Any, ...]]:
    lut = fmt.lookup(torch.device("cpu"))
    values = lut.values.contiguous()
    bound = lut.bound.to(torch.float64).contiguous()
    exact = lut.bound_exact.to(torch.int64).contiguous()
    blo, bhi, meta = _table_index(values.numpy())
    params = TableParams(
        bucket_lo=blo.ctypes.data,
        bucket_hi=bhi.ctypes.data,
        **meta,
        values=values.data_ptr(),
        bound=bound.data_ptr() if bound.numel() else values.data_ptr(),
        bound_exact=exact.data_ptr() if exact.numel() else values.data_ptr(),
        size=values.numel(),
        first_nonneg=lut.first_nonneg,
        zero_index=lut.zero_index,
        ties=_TIES[fmt.ties],
        underflow_saturate=int(fmt.underflow == "saturate"),
        infinity_nan=int(fmt.infinity == "nan"),
        signed_zero=int(fmt.signed_zero),
        negative_nan=int(fmt.negative == "nan"),
    )
    if values.numel() < 2:
        return params, (values, bound, exact, blo, bhi)
    # the bucket lookup of tablelut: one load settles most inputs (float32 keys for inputs
    # that widen to float32 exactly, float64 keys for float64 inputs)
    bucket = neighbour_lut(fmt, key64) if mode.is_stochastic else result_lut(fmt, mode, key64)
    params.lut = bucket.entries.ctypes.data
    params.lut_shift, params.lut_klo, params.lut_khi = bucket.shift, bucket.klo, bucket.khi
    params.lut_ntot, params.lut_pow2 = bucket.ntot, int(bucket.pow2)
    params.lut_float_lanes = int(not key64 and bucket.float_lanes(mode, rand_bits))
    return params, (values, bound, exact, blo, bhi, bucket.entries)


def _block_params(
    fmt: Block, mode: Rounding, overflow: str, wdtype: torch.dtype, dtype: torch.dtype
) -> BlockParams | None:
    element = fmt.element
    if fmt.scale_rule not in _RULES or not isinstance(fmt.scale, FloatFormat):
        return None  # "none": quantize has no scales (the reference raises)
    params = BlockParams(
        scale_fmt=float_params(fmt.scale, torch.float64, "saturate"),
        ceil_sig=element.max * 2.0**-element.emax,
        elem_max=element.max,
        scale_min=fmt.scale.smallest_subnormal,
        block_size=fmt.block_size or 0,
        rule=_RULES[fmt.scale_rule],
        pow2=int(fmt.power_of_two_scales),
        kmin=fmt.scale_exponent_range[0],
        kmax=fmt.scale_exponent_range[1],
        elem_emax=element.emax,
        symmetric=int(fmt.symmetric),
        # the reference repairs x / scale underflowing to 0 only on the power-of-two path
        fix_tiny=int(fmt.power_of_two_scales and not underflow_is_harmless(element, mode, wdtype)),
        sat_dtype=int(saturate_to_dtype_needed(fmt, overflow, dtype)),
        rcp=int(_rcp_ok(fmt, dtype)),
    )
    lo = int(mode in _THRESHOLD_LO_MODES and bool(params.rcp))  # grid points bound |x / S| (blockthr.c)
    thresholds = _thresholds(fmt, Rounding.TOWARD_ZERO if lo else mode, overflow, dtype)
    if thresholds is not None:
        grid, thr, params.thr_incl, params.thr_lo = (*thresholds, lo)
        params.nthr = len(thr)
        params.grid[: len(grid)] = grid
        params.thr[: len(thr)] = thr
    if isinstance(element, FloatFormat):
        params.elem_family, params.ef = FAMILY_FLOAT, float_params(element, wdtype, overflow)
    elif isinstance(element, UniformFormat):
        params.elem_family, params.eu = FAMILY_UNIFORM, uniform_params(element, wdtype, overflow)
    else:
        return None  # posit and table elements: the other kernels
    if fmt.tensor_scale is not None:
        if not isinstance(fmt.tensor_scale, FloatFormat):
            return None
        params.tensor_scale = 1
        params.tensor_fmt = float_params(fmt.tensor_scale, torch.float64, "saturate")
        params.tensor_min = fmt.tensor_scale.smallest_subnormal
        params.tensor_den = element.max * fmt.scale.max
    if not fmt.power_of_two_scales and wdtype != torch.float64:
        return None  # the reference works in float64 there
    return params


def _rcp_ok(fmt: Block, dtype: torch.dtype) -> bool:
    """Whether the C kernel may form the reference's ``fl(x / S)`` from ``fl(1 / S)`` and two FMAs
    (loops.c, ``rcp_div``): non-power-of-two scales S of at most 48 significant bits within
    ``2**±300``, and inputs of float32 or narrower (nonzero |x| >= 2**-149, so nothing underflows).

    >>> import anynum as an
    >>> [_rcp_ok(an.NVFP4, torch.float32), _rcp_ok(an.NVFP4, torch.float64)]
    [True, False]
    >>> _rcp_ok(an.MXFP4_E2M1, torch.float32)  # power-of-two scales multiply by 2**-k
    False
    """
    if fmt.power_of_two_scales or dtype == torch.float64:
        return False
    bits = fmt.scale.precision
    top, bottom = fmt.scale.max, fmt.scale.smallest_subnormal
    if fmt.tensor_scale is not None:
        bits += fmt.tensor_scale.precision
        top *= fmt.tensor_scale.max
        bottom *= fmt.tensor_scale.smallest_subnormal
    return bits <= 48 and 2.0**-300 <= bottom and top <= 2.0**300


_THRESHOLD_MODES = (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY, Rounding.NEAREST_ZERO, Rounding.TOWARD_ZERO)
_THRESHOLD_LO_MODES = (Rounding.UP, Rounding.DOWN, Rounding.STOCHASTIC, Rounding.STOCHASTIC_UNIFORM)


def _thresholds(
    fmt: Block, mode: Rounding, overflow: str, dtype: torch.dtype
) -> tuple[list[float], list[float], int] | None:
    """The element's magnitudes, the decision points between neighbours and which of them round up
    (a bit mask), for the C kernel's threshold path (blockthr.c, ``thresh_chunk``); None where it does
    not apply.

    It applies to float32 tensors, saturating float elements with zero and at most 8 magnitudes,
    mirrored for negatives (E2M1: NVFP4, MXFP4), in the modes whose rounding of ``|x / S|`` does not
    depend on the sign. The decision points are the midpoints (nearest modes) or the grid points
    (toward zero), and how each one and its float64 neighbours round is asked of the eager reference.

    >>> import anynum as an
    >>> grid, thr, incl = _thresholds(an.NVFP4, Rounding.NEAREST_EVEN, "saturate", torch.float32)
    >>> grid, thr, bin(incl)
    ([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], '0b101010')
    """
    element = fmt.element
    if dtype != torch.float32 or mode not in _THRESHOLD_MODES or overflow != "saturate" or fmt.symmetric:
        return None
    if not isinstance(element, FloatFormat) or not element.signed or not element.zero or element.bits > 8:
        return None
    values = np.asarray(element.values(), dtype=np.float64)
    grid = np.unique(np.abs(values))
    mirrored = np.array_equal(np.unique(-values[values < 0]), grid[1:])
    if not 2 <= grid.size <= 8 or grid[0] != 0.0 or not mirrored:
        return None
    thr = (grid[:-1] + grid[1:]) / 2 if mode is not Rounding.TOWARD_ZERO else grid[1:]
    probe = np.concatenate([thr, np.nextafter(thr, -np.inf), np.nextafter(thr, np.inf)])
    got = round_to_format(element, torch.from_numpy(probe), mode, "saturate", None, None).numpy()
    at, below, above = np.split(got, 3)
    up = at == grid[1:]
    sides = np.array_equal(below, grid[:-1]) and np.array_equal(above, grid[1:])
    if not (sides and np.all(up | (at == grid[:-1]))):
        return None
    return grid.tolist(), thr.tolist(), sum(1 << i for i, u in enumerate(up) if u)


@functools.lru_cache(maxsize=1024)
def call_params(
    fmt: Format, mode: Rounding, overflow: str, rand_bits: int | None, dtype: torch.dtype
) -> CallParams | None:
    """The resolved parameters for rounding `dtype` tensors onto `fmt`, or None where the native
    kernels do not cover the call (other families, policies or dtypes).

    >>> import anynum as an
    >>> call_params(an.Posit(16, 1), Rounding.STOCHASTIC, "saturate", None, torch.bfloat16).struct.family
    2
    >>> call_params(an.Block(an.Posit(8, 0), 32), Rounding.NEAREST_EVEN, "saturate", None, torch.float32)
    """
    if dtype not in DTYPE_CODES:
        return None
    wdtype = working_dtype(fmt, dtype)
    if wdtype not in (torch.float32, torch.float64):
        return None
    struct = CallStruct(
        mode=mode_code(mode, rand_bits),
        wdt=int(wdtype == torch.float64),
        tdt=DTYPE_CODES[dtype],
        rand_bits=rand_bits or 0,
        two_r=2.0 ** (rand_bits or 0),
    )
    keep: tuple[Any, ...] = ()
    if isinstance(fmt, FloatFormat) and overflow in OVERFLOW_CODES:
        struct.family, struct.f = FAMILY_FLOAT, float_params(fmt, wdtype, overflow)
    elif isinstance(fmt, UniformFormat) and overflow in ("saturate", "wrap"):
        struct.family, struct.u = FAMILY_UNIFORM, uniform_params(fmt, wdtype, overflow)
    elif isinstance(fmt, Posit):
        struct.family, struct.p = FAMILY_POSIT, posit_params(fmt, wdtype)
    elif isinstance(fmt, Table):
        if wdtype != torch.float64:
            return None
        struct.family = FAMILY_TABLE
        struct.t, keep = _table_params(fmt, mode, dtype == torch.float64, rand_bits)
        # the loops' arrays: float32 (with float32 keys) for inputs that widen to it exactly
        struct.wdt = int(dtype == torch.float64 or not struct.t.lut)
    elif isinstance(fmt, Block):
        block = _block_params(fmt, mode, overflow, wdtype, dtype)
        if block is None:
            return None
        struct.family, struct.b = FAMILY_BLOCK, block
    else:
        return None
    random = mode.is_stochastic
    struct.grain = (
        _GRAIN_BLOCK
        if struct.family == FAMILY_BLOCK
        else (min(_GRAIN[struct.family], _GRAIN_RANDOM) if random else _GRAIN[struct.family])
    )
    return CallParams(struct, wdtype, keep)
