"""Bucket lookups of the C table kernels: most inputs rounded onto a `Table` by one lookup.

The C loops (``csrc/tablelut.c``) key each input on the bits of its magnitude in a *key type*
(float32 for float16, bfloat16 and float32 inputs, which all widen to float32 exactly; float64
for float64 inputs): the exponent and top fraction bits (``a >> shift``), plus whether any lower
bit is set. So each bucket of ``2**shift`` consecutive floats has two entries, its first member
and the rest, and a breakpoint of the rounding (a table value, a boundary) that falls on a
bucket's first member splits nothing. Magnitudes below the first bucket (``tiny``), above the
last (``top``, with ±inf) and zero get an entry each; negative inputs have their own half.

For a deterministic mode an entry holds the rounded value itself, found by running the eager
reference (`anynum.kernels.round_to_format`) on the entry's first and last member: rounding onto
a table is monotone in x (each interval between neighbours rounds into its two ends, and the
choice moves up with x), so equal results at both ends mean the whole entry rounds to that
value. For the stochastic modes an entry holds the two neighbours of its inputs when their search
position j (``values[j] <= x < values[j+1]``, ``torch.searchsorted(values, x, right=True) - 1``,
as the reference computes it) is the same at both ends; the C draws between them as the
reference does. Entries that are not constant hold a sentinel, and the C searches their inputs.
The bucket width is the widest that puts every table value and boundary on a bucket's first
member (two fraction bits for E2M1, six for posit(8,0)), within `CAP` buckets per sign; tables
whose values are not short binary fractions get the finest buckets the cap allows, and only the
inputs of the few buckets that hold a value or boundary are searched.

>>> import anynum as an, torch
>>> lut = result_lut(an.Table.from_format(an.E2M1), Rounding.NEAREST_EVEN, key64=False)
>>> lut.shift, int((lut.entries == 0xFFFFFFFF).sum())   # 2 fraction bits; every input keyed exactly
(21, 0)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from anynum.formats.table import Table
from anynum.kernels import table as _table_kernel  # noqa: F401  (registers the reference)
from anynum.kernels.eager import round_to_format
from anynum.rounding import Rounding

__all__ = ["CAP", "TableLut", "neighbour_lut", "result_lut"]

#: Most buckets per sign (each two entries): 2 * 2048 entries of 4 or 8 bytes, within L1/L2.
CAP = 2048


@dataclass(frozen=True)
class _KeyType:
    man: int  # fraction bits
    uint: type  # numpy unsigned type of the bits
    flt: type  # numpy float type
    max_finite: int  # bits of the largest finite value
    qnan: int  # the canonical NaN result
    sentinel: int  # a result entry whose inputs the C must search


_F32 = _KeyType(23, np.uint32, np.float32, 0x7F7FFFFF, 0x7FC00000, 0xFFFFFFFF)
_F64 = _KeyType(52, np.uint64, np.float64, 0x7FEFFFFFFFFFFFFF, 0x7FF8000000000000, 0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class TableLut:
    """One lookup: its entries (negative half after the positive one) and the key map of the C.

    ``klo``/``khi``: the first and last in-range key (``2 * (a >> shift) + (a has low bits)``);
    entry 0 is zero, 1 tiny magnitudes, ``2 + key - klo`` the range, ``ntot - 1`` the top.
    """

    entries: np.ndarray
    shift: int
    klo: int
    khi: int
    ntot: int
    pow2: bool = False  # neighbour lookups: every hi - lo a power of two (the C multiplies by 1 / den)
    den_exps: tuple[int, int] = (0, 0)  # then the least and greatest k of those hi - lo = 2**k

    def float_lanes(self, mode: Rounding, rand_bits: int | None) -> bool:
        """Whether this neighbour lookup's stochastic choice for float arrays may run on float32
        lanes (csrc/tablegather.c, table_sr_fast_f32): SR uniform always; exact SR and SR with
        1-30 random bits where every spacing is 2**k with 2**k and 2**(B - k) normal float32
        numbers, for the B draw bits compared (21 for exact SR, else rand_bits).

        >>> import anynum as an
        >>> lut = neighbour_lut(an.Table.from_format(an.E2M1), key64=False)
        >>> lut.float_lanes(Rounding.STOCHASTIC, None), lut.float_lanes(Rounding.STOCHASTIC, 31)
        (True, False)
        """
        if mode is Rounding.STOCHASTIC_UNIFORM:
            return True
        if mode is not Rounding.STOCHASTIC or not self.pow2:
            return False
        b = 21 if rand_bits is None else rand_bits
        k_min, k_max = self.den_exps
        return 1 <= b <= 30 and k_min >= b - 127 and k_max <= 127


def _key_map(fmt: Table, kt: _KeyType) -> tuple[int, int, int]:
    """(shift, lo, hi): the bucket width and the first and last bucket of the range."""
    lut = fmt.lookup(torch.device("cpu"))
    pts = np.abs(np.concatenate([lut.values.numpy(), lut.bound.numpy()]))
    pts = pts[pts > 0]
    if kt is _F32:  # where a point is not a float32, the first float32 above it starts a bucket
        f = pts.astype(np.float32)
        f = np.where(f.astype(np.float64) < pts, np.nextafter(f, np.float32(np.inf)), f)
        f = np.minimum(f, np.float32(np.finfo(np.float32).max))
        bits = f.view(np.uint32).astype(np.uint64)
    else:
        bits = pts.view(np.uint64)
    pmin, pmax = int(bits.min()), int(bits.max())
    chosen = (kt.man, 1, 1)
    for shift in range(kt.man, -1, -1):  # one binade per bucket (at most 2046 of them), then finer
        lo, hi = max(1, pmin >> shift), max(1, pmax >> shift)
        if hi - lo + 1 > CAP and shift < kt.man:
            break
        chosen = (shift, lo, hi)
        if not np.any(bits & np.uint64((1 << shift) - 1)):
            break  # every breakpoint starts a bucket
    return chosen


def _probes(shift: int, lo: int, hi: int, kt: _KeyType) -> tuple[np.ndarray, np.ndarray, int]:
    """The first and last member (magnitude bits) of each entry of one sign, and ntot."""
    low = (1 << shift) - 1
    c = np.arange(lo, hi + 1, dtype=np.uint64) << np.uint64(shift)
    rest_first = c + np.uint64(1 if shift else 0)
    rest_last = c + np.uint64(low)
    ranged_first = np.stack([c, rest_first], axis=1).reshape(-1)
    ranged_last = np.stack([c, rest_last], axis=1).reshape(-1)
    tiny_last = max(1, (lo << shift) - 1)
    top_first = min((hi + 1) << shift, kt.max_finite)
    u64 = functools.partial(np.array, dtype=np.uint64)  # (mixed with Python ints, uint64 turns float64)
    first = np.concatenate([u64([0, 1]), ranged_first, u64([top_first])])
    last = np.concatenate([u64([0, tiny_last]), ranged_last, u64([kt.max_finite])])
    return first, last, len(first)


def _values(bits: np.ndarray, kt: _KeyType) -> np.ndarray:
    """float64 values of magnitude bits of the key type, then their negatives."""
    v = bits.astype(kt.uint).view(kt.flt).astype(np.float64)
    return np.concatenate([v, -v])


@functools.lru_cache(maxsize=256)
def _shape(fmt: Table, key64: bool) -> tuple[int, int, int, np.ndarray, np.ndarray, int]:
    kt = _F64 if key64 else _F32
    shift, lo, hi = _key_map(fmt, kt)
    first, last, ntot = _probes(shift, lo, hi, kt)
    return shift, lo, hi, _values(first, kt), _values(last, kt), ntot


def _lut(
    fmt: Table, key64: bool, entries: np.ndarray, pow2: bool = False, den_exps: tuple[int, int] = (0, 0)
) -> TableLut:
    shift, lo, hi, _, _, ntot = _shape(fmt, key64)
    return TableLut(np.ascontiguousarray(entries), shift, 2 * lo, 2 * hi + 1, ntot, pow2, den_exps)


def _den_exponents(lo: np.ndarray, hi: np.ndarray) -> tuple[int, int]:
    """The least and greatest k of the spacings hi - lo = 2**k (lo < hi) of a power-of-two lookup;
    the float lanes of csrc/tablegather.c (table_sr_fast_f32) run where 2**k and their scales
    are normal float32 numbers (float32 keys: the values are float32 numbers, so no spacing
    overflows here). (0, 0) where no entry has lo < hi.

    >>> _den_exponents(np.array([0.0, 0.5, 3.0]), np.array([0.5, 1.0, 3.0]))
    (-1, -1)
    """
    den = (hi - lo)[hi > lo]
    if den.size == 0:
        return 0, 0
    expo = np.frexp(den)[1] - 1
    return int(expo.min()), int(expo.max())


def _powers_of_two(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether every denominator of table_probability (csrc/table.c, table_sr_den) is a power of
    two with a normal reciprocal."""
    big = (np.abs(lo) > 2.0**1000) | (np.abs(hi) > 2.0**1000)
    scale = np.where(big, 0.5, 1.0)
    den = hi * scale - lo * scale
    den = np.where(den > 0, den, 1.0)
    bits = den.view(np.uint64)
    expo = bits >> np.uint64(52)
    ok = ((bits & np.uint64(0x000FFFFFFFFFFFFF)) == 0) & (expo >= 1) & (expo <= 2045)
    return bool(ok.all())


@functools.lru_cache(maxsize=256)
def result_lut(fmt: Table, mode: Rounding, key64: bool) -> TableLut:
    """The rounded value of each entry for deterministic `mode`, as key-type bits (sentinel where
    the entry's inputs round to different values).

    >>> import anynum as an
    >>> lut = result_lut(an.Table.from_format(an.E2M1), Rounding.NEAREST_EVEN, key64=False)
    >>> lut.entries.dtype, lut.ntot, bool((lut.entries == 0xFFFFFFFF).any())
    (dtype('uint32'), 41, False)
    """
    if mode.is_stochastic:
        raise ValueError(f"result_lut is for the deterministic modes, got {mode}")
    kt = _F64 if key64 else _F32
    _, _, _, first, last, ntot = _shape(fmt, key64)
    x = torch.from_numpy(np.concatenate([first, last, [np.inf, -np.inf]]))
    y: np.ndarray = round_to_format(fmt, x, mode, "saturate", None, None).numpy().astype(kt.flt)
    bits: np.ndarray = y.view(kt.uint).copy()
    bits[np.isnan(y)] = kt.qnan
    m = len(first)
    at_first, at_last, inf_pos, inf_neg = bits[:m], bits[m : 2 * m], bits[2 * m], bits[2 * m + 1]
    ok = at_first == at_last
    # ±inf share the top entry: under infinity="saturate" they must round as the largest finite
    # values do (they do: both are beyond the table); under "nan" the C makes them NaN itself
    if fmt.infinity == "saturate":
        ok[ntot - 1] &= inf_pos == at_last[ntot - 1]
        ok[2 * ntot - 1] &= inf_neg == at_last[2 * ntot - 1]
    entries: np.ndarray = np.where(ok, at_last, kt.sentinel).astype(kt.uint)
    return _lut(fmt, key64, np.append(entries, kt.uint(kt.qnan)))  # the entry of NaN inputs


@functools.lru_cache(maxsize=256)
def neighbour_lut(fmt: Table, key64: bool) -> TableLut:
    """The neighbours lo, hi of each entry's inputs for the stochastic modes, where every input of
    the entry has the same search position j (``values[j] <= x < values[j + 1]``); NaN for lo where
    they do not. lo = values[j], hi = values[j + 1], except where the result does not depend on the
    draw: below the table lo = hi = the first value, from the top value on lo = hi = the top value,
    and under ``underflow="saturate"`` between zero and its neighbour, both are the neighbour
    (csrc/tablelut.c, table_sr_choose). float32 keys: lo's float32 bits in the low half of a uint64
    and hi's in the high half (the values are float32 numbers there); float64 keys: lo and hi side
    by side, two float64 per entry.

    >>> import anynum as an
    >>> lut = neighbour_lut(an.Table.from_format(an.E2M1), key64=True)
    >>> lut.entries.reshape(-1, 2)[[0, 1, 2, 3, 40]].tolist()  # zero, tiny, 0.25, (0.25, 0.3125), top
    [[0.0, 0.5], [0.0, 0.5], [0.0, 0.5], [0.0, 0.5], [6.0, 6.0]]
    """
    _, _, _, first, last, ntot = _shape(fmt, key64)
    lut = fmt.lookup(torch.device("cpu"))
    values = lut.values.numpy()
    size = len(values)
    jf = np.searchsorted(values, first, side="right") - 1
    jl = np.searchsorted(values, last, side="right") - 1
    jj = np.clip(jl, 0, size - 2)
    lo, hi = values[jj], values[jj + 1]
    ends = np.where(jl < 0, values[0], values[-1])
    lo = np.where((jl < 0) | (jl >= size - 1), ends, lo)
    hi = np.where((jl < 0) | (jl >= size - 1), ends, hi)
    if fmt.underflow == "saturate" and lut.zero_index >= 0:
        positive = np.arange(2 * ntot) < ntot
        nonzero = np.arange(2 * ntot) % ntot != 0  # entry 0 of each half holds x = +-0 alone
        lo = np.where(positive & nonzero & (lo == 0), hi, lo)
        hi = np.where(~positive & nonzero & (hi == 0), lo, hi)
    pow2 = _powers_of_two(lo[jf == jl], hi[jf == jl])
    den_exps = _den_exponents(lo[jf == jl], hi[jf == jl]) if pow2 and not key64 else (0, 0)
    lo = np.where(jf == jl, lo, np.nan)
    if key64:
        entries = np.stack([lo, hi], axis=1).reshape(-1)
    else:
        lo32, hi32 = lo.astype(np.float32).view(np.uint32), hi.astype(np.float32).view(np.uint32)
        entries = lo32.astype(np.uint64) | (hi32.astype(np.uint64) << np.uint64(32))
    return _lut(fmt, key64, entries, pow2, den_exps)
