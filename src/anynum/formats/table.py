"""Arbitrary finite value sets (Qtorch+ "arbitrary number sets"), rounded by binary search.

A `Table` holds sorted, distinct, finite float64 values; its code for a value
is the value's index. Rounding finds the two neighbours of x by binary search
(O(log size) per element) and chooses between them:

* nearest modes compare x with the boundary between the neighbours: their
  arithmetic midpoint, computed exactly (or explicit ``boundaries=``, which
  `Table.from_format` uses for posits, whose boundaries are geometric where
  exponent bits are cut). At an exact tie ``"nearest"`` follows the table's
  ``ties`` policy, ``"rna"`` takes the larger magnitude and ``"rnz"`` the smaller;
* directed modes follow the value order ("rz" takes the neighbour on the side
  of zero: the lower one for x > 0, the upper one for x < 0; across a gap that
  straddles zero, the one of x's sign);
* ODD takes the neighbour of odd *rank* (see below);
* STOCHASTIC goes to hi with probability (x - lo) / (hi - lo), linear in the
  value, so E[SR(x)] = x (the ratio is computed in float64, within 2**-53, then
  drawn exactly); the draw is taken on the magnitude (away from zero or not), so
  SR(-x) = -SR(x) with the same random bits on a symmetric table; with
  ``rand_bits=r`` the probability of moving away from zero is truncated to r
  bits, as hardware does;
* inputs beyond the ends saturate to the first/last value in every mode
  (±inf too); NaN stays NaN.

*Rank* is the index counted from the first non-negative entry (rank 0, so
zero, when present, has rank 0 and the largest negative entry rank -1).
Ties-to-even and round-to-odd use the rank's parity, not the plain index's:
for a table built from a format's values it is the parity of the format's code
(sign-magnitude floats, two's-complement fixed point and posits alike), so
``ties="even"`` reproduces those formats' ties-to-even rule whatever the
number of negative entries. See docs/posits.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from anynum.errors import FormatError, RepresentabilityError
from anynum.formats.base import Format, hook
from anynum.formats.tablegrid import (
    TableLookup,
    check_boundaries,
    exp2_fractions,
    midpoint_floor,
    normalise_values,
    posit_boundaries,
)

__all__ = ["TIE_POLICIES", "Table", "TableLookup"]

#: Tie policies of ``rounding="nearest"``; "even_index" is accepted as an alias of "even".
TIE_POLICIES = ("smaller_magnitude", "away", "even", "down", "up")
_TIE_ALIASES = {"even_index": "even", "larger_magnitude": "away", "toward_zero": "smaller_magnitude"}
_UNDERFLOW = ("zero", "saturate")


@dataclass(frozen=True, eq=True)
class Table(Format):
    """A format whose values are an arbitrary finite set of reals.

    Args:
        values: any 1-D sequence of finite reals (list, NumPy array, tensor).
            Normalised: sorted ascending, duplicates removed, -0.0 read as 0.0.
            Empty input, non-finite entries, non-real or multi-dimensional
            arrays raise `FormatError`.
        ties: which neighbour ``rounding="nearest"`` picks at an exact tie:
            "smaller_magnitude" (default: towards zero, so rounding never
            increases a magnitude at a tie), "away" (larger magnitude), "even"
            (even rank, alias "even_index"; reproduces ties-to-even of a
            format's codes), "down" (smaller value), "up" (larger value).
            Between -v and v (x = ±0 without 0 in the table) the magnitude
            policies take the neighbour with x's sign.
        underflow: "zero" (default: 0, if present, is an ordinary entry) or
            "saturate" (a nonzero input never rounds to 0: it gets the
            smallest-magnitude entry of its own sign, as posits do).
        infinity: "saturate" (default: ±inf rounds to the last/first value,
            like any input beyond the ends) or "nan" (±inf gives NaN, as
            posits turn it into NaR).
        signed_zero: False (default: a zero result is +0.0) or True (a zero
            result takes the sign of the input, as IEEE-style floats round
            -0.1 to -0.0). The table has one zero and one code for it, which
            decodes to +0.0.
        negative: "saturate" (default: negative inputs below the first value
            round to it, like any input beyond the ends) or "nan" (every
            input < 0 gives NaN, as unsigned float formats do; -0.0 is zero;
            for tables without negative values).
        boundaries: optional nearest-rounding boundaries, one between each pair
            of consecutive (normalised) values, strictly between them; default
            the arithmetic midpoints.

    Codes are indices into the sorted values (``bits = ceil(log2(size))``, at
    least 1); unused codes decode to NaN. There is no NaN code, so `encode`
    rejects NaN. A zero result is +0.0 unless ``signed_zero=True``.

    >>> import anynum as an, torch
    >>> t = an.Table([3.0, -1.0, 0.5, 1.0, 1.0])
    >>> t.values().tolist(), t.bits
    ([-1.0, 0.5, 1.0, 3.0], 2)
    >>> an.quantize(torch.tensor([0.75, 2.0, 2.1, 100.0, -7.0]), t).tolist()
    [0.5, 1.0, 3.0, 3.0, -1.0]
    >>> an.encode(torch.tensor([0.9, 2.9]), t).tolist()
    [2, 3]
    """

    table: tuple[float, ...] = field(default=(), repr=False)
    ties: str = field(default="smaller_magnitude", kw_only=True)
    underflow: str = field(default="zero", kw_only=True)
    infinity: str = field(default="saturate", kw_only=True)
    signed_zero: bool = field(default=False, kw_only=True)
    negative: str = field(default="saturate", kw_only=True)
    boundaries: tuple[float, ...] | None = field(default=None, kw_only=True, repr=False)

    overflow_policies: ClassVar[tuple[str, ...]] = ("saturate",)
    spec_parameters: ClassVar[dict[str, str]] = {"table": "values"}

    def __init__(
        self,
        values: Any,
        *,
        ties: str = "smaller_magnitude",
        underflow: str = "zero",
        infinity: str = "saturate",
        signed_zero: bool = False,
        negative: str = "saturate",
        boundaries: Any = None,
        name: str | None = None,
    ) -> None:
        vals = normalise_values(values)
        if not isinstance(ties, str):
            raise FormatError(f"ties must be a string, one of {TIE_POLICIES}; got {ties!r}.")
        ties = _TIE_ALIASES.get(ties, ties)
        if ties not in TIE_POLICIES:
            raise FormatError(f"ties must be one of {TIE_POLICIES} (or 'even_index'), got {ties!r}.")
        if underflow not in _UNDERFLOW:
            raise FormatError(f"Table underflow must be one of {_UNDERFLOW}, got {underflow!r}.")
        if infinity not in ("saturate", "nan"):
            raise FormatError(f"Table infinity must be 'saturate' or 'nan', got {infinity!r}.")
        if not isinstance(signed_zero, bool):
            raise FormatError(f"Table signed_zero must be True or False, got {signed_zero!r}.")
        if negative not in ("saturate", "nan"):
            raise FormatError(f"Table negative must be 'saturate' or 'nan', got {negative!r}.")
        if negative == "nan" and vals[0] < 0:
            raise FormatError(
                f"negative='nan' makes every negative input NaN, so it needs a table without negative "
                f"values; this one starts at {float(vals[0])!r}. Drop negative= or the negative values."
            )
        bounds: tuple[float, ...] | None = None
        if boundaries is not None:
            b = check_boundaries(boundaries, vals)
            mids, exact = midpoint_floor(vals[:-1], vals[1:])
            is_mid = bool(np.all(exact & (mids == b)))
            bounds = None if is_mid else tuple(float(v) for v in b)
        object.__setattr__(self, "table", tuple(float(v) for v in vals))
        object.__setattr__(self, "ties", ties)
        object.__setattr__(self, "underflow", underflow)
        object.__setattr__(self, "infinity", infinity)
        object.__setattr__(self, "signed_zero", signed_zero)
        object.__setattr__(self, "negative", negative)
        object.__setattr__(self, "boundaries", bounds)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_array", vals)
        object.__setattr__(self, "_cache", {})
        self._cache["cpu"] = self._build_lookup()  # type: ignore[attr-defined]
        object.__setattr__(
            self, "_hash", hash((self.table, ties, underflow, infinity, signed_zero, negative, bounds))
        )

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __reduce__(self) -> Any:
        return (
            _rebuild,
            (
                self.table, self.ties, self.underflow, self.infinity, self.boundaries, self.name,
                self.signed_zero, self.negative,
            ),
        )

    # --- constructors ---------------------------------------------------------------------
    @classmethod
    def from_format(cls, fmt: Format | str, *, ties: str | None = None) -> Table:
        """The table of every finite value of a format of at most 16 bits, rounding exactly like it.

        With the default ``ties=None`` the table reproduces the format (`quantize`
        with ``overflow="saturate"``) at every input in every mode, the stochastic
        ones bit for bit with the same random bits (docs/posits.md lists the
        exceptions: posits with ``rand_bits``, and the formats refused below):

        * nearest-mode boundaries are the format's: arithmetic midpoints, or for
          posits the values of the (n+1)-bit codes 2L+1 (geometric where
          exponent bits are cut), passed as ``boundaries=``;
        * ties go to the even *rank* (``ties="even"``) and ODD to the odd rank;
          the rank counted from zero has the parity of the format's code for
          sign-magnitude floats with subnormals, two's-complement fixed point
          and integers, and posits (a plain index would not: E2M1 and posit(8,0)
          have an odd number of negative values);
        * a posit's "never round to zero" rule becomes ``underflow="saturate"``
          and its ±inf -> NaR rule ``infinity="nan"``;
        * a format that rounds -0.1 to -0.0 gets ``signed_zero=True`` (IEEE-style
          floats; not fnuz, fixed point or posits), one whose negative inputs give
          NaN (unsigned floats) ``negative="nan"``.

        The construction checks the format's own choice at every tie and in every
        interval under ODD against the table's and raises `FormatError` where no
        table tie policy expresses it (formats whose ties follow the significand
        rather than the code: flushed subnormals, no fraction bits, as in E8M0);
        pass an explicit ``ties=`` to build such a table anyway, unchecked. The
        table has one zero: the format's -0.0 is its +0.0 code (`encode`), and
        decodes to +0.0.

        >>> import anynum as an
        >>> t = an.Table.from_format(an.E2M1)
        >>> t.values().tolist()[7:], t.ties
        ([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], 'even')
        """
        from anynum.formats.posit import Posit
        from anynum.formats.registry import format as lookup

        fmt = lookup(fmt)
        vals = fmt.values()
        boundaries = None
        underflow = "zero"
        infinity = "saturate"
        signed_zero, negative = _zero_and_negative_rules(fmt, vals)
        if isinstance(fmt, Posit):
            boundaries = posit_boundaries(fmt)
            underflow = "saturate" if fmt.underflow == "minpos" else "zero"
            infinity = "nan"  # ±inf -> NaR
        table = cls(
            vals,
            ties="even" if ties is None else ties,
            underflow=underflow,
            infinity=infinity,
            signed_zero=signed_zero,
            negative=negative,
            boundaries=boundaries,
            name=f"table({fmt.display_name()})",
        )
        if ties is None:
            _check_parity_rule(table, fmt)
        return table

    @classmethod
    def log(
        cls,
        int_bits: int,
        frac_bits: int,
        *,
        zero: bool = False,
        ties: str = "smaller_magnitude",
    ) -> Table:
        """Qtorch+'s logarithmic format (section 6.4): the values ±2**t for every t of fixed point I.F.

        t runs over the signed fixed-point numbers with ``int_bits`` integer bits
        (sign included) and ``frac_bits`` fraction bits, so there are
        ``2**(int_bits + frac_bits + 1)`` values (one more with ``zero=True``),
        each 2**t correctly rounded to float64. Rounding is to the nearest value
        (arithmetic midpoints), like Qtorch+'s table quantizer.

        >>> import anynum as an
        >>> t = an.Table.log(2, 1)   # t in {-2, -1.5, ..., 1.5}: 16 values, 4 bits
        >>> t.bits, t.max, t.values()[8:].round(4).tolist()
        (4, 2.8284271247461903, [0.25, 0.3536, 0.5, 0.7071, 1.0, 1.4142, 2.0, 2.8284])
        """
        for label, v in (("int_bits", int_bits), ("frac_bits", frac_bits)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise FormatError(f"Table.log {label} must be an integer, got {v!r}.")
        if not 1 <= int_bits <= 10:
            raise FormatError(
                f"Table.log int_bits must be in 1..10 (exponents within ±512 keep 2**t a finite "
                f"float64), got {int_bits}."
            )
        if not 0 <= frac_bits or int_bits + frac_bits > 16:
            raise FormatError(
                f"Table.log needs frac_bits >= 0 and int_bits + frac_bits <= 16 (at most 2**17 "
                f"values), got int_bits={int_bits}, frac_bits={frac_bits}."
            )
        fracs = exp2_fractions(frac_bits)  # 2**(r / 2**F) for r in [0, 2**F)
        lo = -(1 << (int_bits - 1))
        ints = np.arange(lo, -lo, dtype=np.int64)
        mags = np.ldexp(np.tile(fracs, len(ints)), np.repeat(ints, len(fracs)))
        vals = np.concatenate([-mags, mags, [0.0] if zero else []])
        name = f"log({int_bits},{frac_bits})" + ("+zero" if zero else "")
        return cls(vals, ties=ties, name=name)

    # --- properties -----------------------------------------------------------------------
    def values(self) -> np.ndarray:
        """The table, sorted ascending (a copy)."""
        return self._array.copy()  # type: ignore[attr-defined,no-any-return]

    @property
    def size(self) -> int:
        return len(self.table)

    def __len__(self) -> int:
        return len(self.table)

    @property
    def bits(self) -> int:
        return max(1, math.ceil(math.log2(len(self.table))))

    @property
    def max(self) -> float:
        """The largest value."""
        return self.table[-1]

    @property
    def min(self) -> float:
        """The smallest (most negative) value."""
        return self.table[0]

    def _smallest_magnitude(self) -> float:
        mags = [abs(v) for v in self.table if v != 0]
        return min(mags) if mags else 0.0

    @property
    def smallest_normal(self) -> float:
        """The smallest nonzero magnitude (0.0 for the table {0})."""
        return self._smallest_magnitude()

    @property
    def smallest_subnormal(self) -> float:
        return self._smallest_magnitude()

    @property
    def emin(self) -> int:
        tiny = self._smallest_magnitude()
        return math.floor(math.log2(tiny)) if tiny > 0 else 0

    @property
    def emax(self) -> int:
        big = max(abs(self.table[0]), abs(self.table[-1]))
        return math.floor(math.log2(big)) if big > 0 else 0

    @property
    def eps(self) -> float:
        """Gap from 1.0 to the next larger value; NaN unless 1.0 and a larger value are in the table."""
        i = int(np.searchsorted(self._array, 1.0))  # type: ignore[attr-defined]
        if i + 1 < len(self.table) and self.table[i] == 1.0:
            return self.table[i + 1] - 1.0
        return math.nan

    @property
    def precision(self) -> int:
        """Bits needed to index the table (a table has no significand)."""
        return self.bits

    @property
    def signed(self) -> bool:
        return self.table[0] < 0

    @property
    def default_overflow(self) -> str:
        return "saturate"

    # --- codes ------------------------------------------------------------------------------
    def _build_lookup(self) -> TableLookup:
        vals = self._array  # type: ignore[attr-defined]
        if len(vals) < 2:
            bound, exact = np.zeros(0), np.zeros(0, dtype=bool)
        elif self.boundaries is None:
            bound, exact = midpoint_floor(vals[:-1], vals[1:])
        else:
            bound = np.asarray(self.boundaries, dtype=np.float64)
            exact = np.ones(len(bound), dtype=bool)
        zero = int(np.searchsorted(vals, 0.0))
        zero_index = zero if zero < len(vals) and vals[zero] == 0.0 else -1
        return TableLookup(
            torch.from_numpy(vals.copy()),
            torch.from_numpy(bound.copy()),
            torch.from_numpy(exact.copy()),
            zero,
            zero_index,
        )

    def lookup(self, device: torch.device) -> TableLookup:
        """The lookup tensors on `device` (built once per device; CPU ones at construction)."""
        cache: dict[str, Any] = self._cache  # type: ignore[attr-defined]
        key = str(device)
        if key not in cache:
            cpu: TableLookup = cache["cpu"]
            cache[key] = TableLookup(
                cpu.values.to(device),
                cpu.bound.to(device),
                cpu.bound_exact.to(device),
                cpu.first_nonneg,
                cpu.zero_index,
            )
        return cache[key]  # type: ignore[no-any-return]

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise RepresentabilityError unless every value is exactly a `dtype` number."""
        cache: dict[str, Any] = self._cache  # type: ignore[attr-defined]
        key = f"dtype:{dtype}"
        if key not in cache:
            t = torch.from_numpy(self._array)  # type: ignore[attr-defined]
            back = t.to(dtype).to(torch.float64)
            bad = back != t
            cache[key] = float(t[bad][0]) if bool(bad.any()) else None
        example = cache[key]
        if example is not None:
            raise RepresentabilityError(
                f"{self.display_name()} holds values such as {example!r} that {dtype} cannot hold "
                "exactly; quantize a float64 tensor instead (x.double()) to avoid double rounding."
            )

    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        lut = self.lookup(codes.device)
        n = lut.values.numel()
        codes = codes.to(torch.int64)
        valid = (codes >= 0) & (codes < n)
        v = lut.values[torch.clamp(codes, 0, n - 1)]
        return torch.where(valid, v, torch.full_like(v, torch.nan))

    def encode_kernel(self, y: torch.Tensor) -> torch.Tensor:
        lut = self.lookup(y.device)
        idx = torch.searchsorted(lut.values, y.to(torch.float64).contiguous())
        return torch.where(y != y, -1, torch.clamp(idx, 0, lut.values.numel() - 1))  # -1: NaN has no code

    def __repr__(self) -> str:
        if self.name:
            return self.name
        n = len(self.table)
        shown = ", ".join(repr(v) for v in self.table) if n <= 8 else (
            f"{self.table[0]!r}, {self.table[1]!r}, ..., {self.table[-1]!r}"
        )
        extra = "" if self.ties == "smaller_magnitude" else f", ties={self.ties!r}"
        extra += "" if self.underflow == "zero" else f", underflow={self.underflow!r}"
        extra += "" if self.infinity == "saturate" else f", infinity={self.infinity!r}"
        extra += "" if not self.signed_zero else ", signed_zero=True"
        extra += "" if self.negative == "saturate" else f", negative={self.negative!r}"
        extra += "" if self.boundaries is None else ", boundaries=..."
        return f"Table([{shown}]{extra})" if n <= 8 else f"Table(<{n} values: {shown}>{extra})"


def _rebuild(
    table: tuple[float, ...],
    ties: str,
    underflow: str,
    infinity: str,
    boundaries: tuple[float, ...] | None,
    name: str | None,
    signed_zero: bool = False,
    negative: str = "saturate",
) -> Table:
    return Table(
        table, ties=ties, underflow=underflow, infinity=infinity, boundaries=boundaries, name=name,
        signed_zero=signed_zero, negative=negative,
    )


def _zero_and_negative_rules(fmt: Format, vals: np.ndarray) -> tuple[bool, str]:
    """(signed_zero, negative) of `fmt`: whether -0.0 rounds to -0.0, and whether a negative
    input beyond its values gives NaN (unsigned float formats) rather than saturating."""
    quantize = hook("quantize")  # the front door, installed by anynum.quantize
    big = float(np.max(np.abs(vals))) if vals.size else 1.0
    y = quantize(torch.tensor([-0.0, -2.0 * big - 1.0], dtype=torch.float64), fmt, overflow="saturate")
    signed_zero = bool(y[0] == 0) and bool(torch.signbit(y[0]))
    return signed_zero, "nan" if bool(torch.isnan(y[1])) else "saturate"


def _check_parity_rule(table: Table, fmt: Format) -> None:
    """Raise FormatError unless `table` breaks ties and rounds to odd exactly like `fmt`."""
    quantize = hook("quantize")  # the front door, installed by anynum.quantize (formats import nothing above)
    lut = table.lookup(torch.device("cpu"))
    if lut.values.numel() < 2:
        return
    ties = lut.bound[lut.bound_exact]
    lo, hi = lut.values[:-1], lut.values[1:]
    inside = torch.nextafter(lo, hi)
    inside = inside[inside < hi]
    for x, mode in ((ties, "nearest"), (inside, "ro")):
        want = quantize(x, fmt, mode, overflow="saturate")
        got = quantize(x, table, mode)
        bad = (want != got) & ~(torch.isnan(want) & torch.isnan(got))
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise FormatError(
                f"{fmt.display_name()} rounds {float(x[i])!r} under {mode!r} to {float(want[i])!r}, "
                f"which no table tie policy reproduces (its ties follow the significand, not the code); "
                "pass ties= explicitly to build an approximating table."
            )
