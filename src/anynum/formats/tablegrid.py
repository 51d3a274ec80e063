"""The numeric machinery under `Table`: validated value sets, exact midpoints between
neighbours, explicit boundaries, and the per-device lookup tensors.

Kept apart from the `Table` class so each file holds one idea: here, how a sorted set
of reals and its rounding boundaries are computed exactly; there, the format.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from anynum.errors import FormatError

__all__ = [
    "TableLookup",
    "check_boundaries",
    "exp2_fractions",
    "midpoint_floor",
    "normalise_values",
    "posit_boundaries",
]


def normalise_values(values: Any) -> np.ndarray:
    """Sorted, distinct, finite float64 (with -0.0 read as 0.0) or a FormatError."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().to(torch.float64).numpy()
    try:
        arr = np.asarray(values)
    except Exception as exc:  # ragged nested lists and the like
        raise FormatError(f"Table values must be a 1-D sequence of real numbers: {exc}") from None
    if arr.dtype == object or arr.dtype.kind not in "iuf":
        raise FormatError(
            f"Table values must be real numbers (int or float), got an array of dtype {arr.dtype}."
        )
    if arr.ndim != 1:
        raise FormatError(f"Table values must be a 1-D sequence, got an array of shape {arr.shape}.")
    if arr.size == 0:
        raise FormatError("Table needs at least one value, got an empty sequence.")
    original = arr
    arr = arr.astype(np.float64)
    if original.dtype.kind in "iu" and not np.all(arr.astype(original.dtype) == original):
        raise FormatError("Table integer values must be exactly representable in float64.")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise FormatError(
            f"Table values must be finite; got {float(arr[bad][0])!r} at index {int(np.argmax(bad))}. "
            "Saturation at the table's ends already covers ±inf inputs."
        )
    return np.unique(arr) + 0.0  # sorted, distinct; + 0.0 turns -0.0 into 0.0


def midpoint_floor(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact midpoints of lo < hi as (largest float64 <= midpoint, midpoint is that float)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing pairs are redone below
        s = lo + hi
        bb = s - lo
        err = (lo - (s - bb)) + (hi - bb)  # TwoSum: s + err == lo + hi exactly (no overflow)
        half_s, half_e = s * 0.5, err * 0.5
        ok = np.isfinite(s) & (half_s * 2 == s) & (half_e * 2 == err) & (np.abs(s) < 2.0**1020)
        floor = np.where(err < 0, np.nextafter(half_s, -np.inf), half_s)
        exact = err == 0
    for i in np.nonzero(~ok)[0]:  # huge or subnormal pairs: a handful at most, done exactly
        m = (Fraction(float(lo[i])) + Fraction(float(hi[i]))) / 2
        f = float(m)  # round to nearest
        if Fraction(f) > m:
            f = float(np.nextafter(f, -np.inf))
        floor[i] = f
        exact[i] = Fraction(f) == m
    return floor.astype(np.float64), exact.astype(bool)


@dataclass
class TableLookup:
    """The tensors a Table's kernel works with, on one device."""

    values: torch.Tensor  # float64, sorted
    bound: torch.Tensor  # float64, largest float <= boundary between entries i and i+1
    bound_exact: torch.Tensor  # bool, the boundary is exactly `bound`
    first_nonneg: int  # index of the first entry >= 0 (rank origin)
    zero_index: int  # index of 0.0, or -1
    # `values` padded with NaN to a power of two above its size, for a branch-free binary
    # search (NaN compares false), and whether any |value| exceeds 2**1000 (a difference of
    # two values may then overflow).
    padded: torch.Tensor = field(init=False)
    huge: bool = field(init=False)

    def __post_init__(self) -> None:
        size = self.values.numel()
        nan_pad = self.values.new_full(((1 << size.bit_length()) - size,), torch.nan)
        self.padded = torch.cat([self.values, nan_pad])
        self.huge = bool((torch.abs(self.values) > 2.0**1000).any())


def check_boundaries(boundaries: Any, vals: np.ndarray) -> np.ndarray:
    b = np.asarray(boundaries, dtype=np.float64)
    if b.ndim != 1 or len(b) != len(vals) - 1:
        raise FormatError(
            f"boundaries must hold one value between each pair of consecutive table values "
            f"({len(vals) - 1}), got shape {b.shape}."
        )
    if not (np.all(vals[:-1] < b) and np.all(b < vals[1:])):
        raise FormatError("each boundary must lie strictly between its two (sorted) table values.")
    return b


def posit_boundaries(fmt: Any) -> np.ndarray:
    """Between a posit's consecutive values (sorted): the values of the (n+1)-bit codes 2L+1."""
    from anynum.formats.posit import Posit

    try:
        wider = Posit(fmt.n + 1, fmt.es, scale_exp=fmt.scale_exp)
    except FormatError as exc:
        raise FormatError(f"Table.from_format cannot place the boundaries of {fmt!r}: {exc}") from None
    odd = torch.arange(1, 2 * fmt.maxpos_code, 2, dtype=torch.int64)  # 2L+1 for L = 0 .. maxpos-1
    pos = wider.decode_torch(odd).numpy()
    # Sorted values: -maxpos .. -minpos, 0, minpos .. maxpos; boundaries mirror around 0.
    return np.concatenate([-pos[::-1], pos])


@functools.lru_cache(maxsize=32)
def exp2_fractions(frac_bits: int) -> np.ndarray:
    """2**(r / 2**frac_bits) for r in [0, 2**frac_bits), each correctly rounded to float64."""
    steps = 1 << frac_bits
    out = np.empty(steps, dtype=np.float64)
    with localcontext() as ctx:
        ctx.prec = 40  # 2**t is transcendental: 40 digits decide the float64 rounding
        two = Decimal(2)
        for r in range(steps):
            out[r] = float(two ** (Decimal(r) / steps)) if r else 1.0
    return out
