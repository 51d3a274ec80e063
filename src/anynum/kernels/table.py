"""Rounding onto an arbitrary `Table` of values: one binary search per element, all nine modes.

A binary search without branches finds the neighbours lo <= x < hi (O(log size)); the
boundary between them is stored as the largest float64 at or below the exact
boundary plus an "exact" flag, so comparing a float64 x with it is exact:
x is above the boundary iff x > floor, and a tie iff the flag is set and
x == floor. See `anynum.formats.table` for the semantics.
"""

from __future__ import annotations

import torch

from anynum.errors import AnynumError
from anynum.formats.table import Table
from anynum.formats.tablegrid import TableLookup
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import RandomSource, Rounding, round_scaled, stochastic_away

__all__: list[str] = []

_ONE_MINUS_ULP = 1.0 - 2.0**-53


@working_dtype.register
def _(fmt: Table, dtype: torch.dtype) -> torch.dtype:
    if dtype != torch.float64:
        fmt.check_dtype(dtype)  # refuse silent double rounding of table values
    return torch.float64


def _tie_up(
    policy: str, lo: torch.Tensor, hi: torch.Tensor, x: torch.Tensor, hi_rank_even: torch.Tensor
) -> torch.Tensor:
    """Whether a tie between lo < hi goes to hi under `policy`."""
    if policy == "up":
        return torch.ones_like(x, dtype=torch.bool)
    if policy == "down":
        return torch.zeros_like(x, dtype=torch.bool)
    if policy == "even":
        return hi_rank_even
    alo, ahi = torch.abs(lo), torch.abs(hi)
    same = alo == ahi  # lo == -hi: x is ±0 and 0 is not in the table; follow x's sign
    positive = ~torch.signbit(x)
    if policy == "smaller_magnitude":
        return torch.where(same, positive, ahi < alo)
    return torch.where(same, positive, ahi > alo)  # "away"


def _count_at_or_below(padded: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """How many table values are <= each of the 1-D `xs`, none of them NaN
    (``torch.searchsorted(values, xs, right=True)``), int32: a binary search without branches
    over `padded` (the values padded with NaN to a power of two above their size,
    `TableLookup.padded`). A NaN would count 0.

    Each step probes one value per element and moves on by the probe's comparison, so
    the time does not depend on the data; torch's searchsorted branches per element and
    took twice as long on random inputs.
    """
    step = padded.numel() // 2  # <= size: the first probe is a real value, the same for all
    pos = (xs >= padded[step - 1]).to(torch.int32).mul_(step)
    step //= 2
    while step:
        pos.add_(padded.index_select(0, pos + (step - 1)) <= xs, alpha=step)  # NaN padding: False
        step //= 2
    return pos


def _away_probability(
    lut: TableLookup, xs: torch.Tensor, jj: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
    negative: torch.Tensor,
) -> torch.Tensor:
    """P(away from zero) of x in [lo, hi] in float64, clamped to [0, 1): (x - lo) / (hi - lo),
    and (hi - x) / (hi - lo) where the interval is negative, without overflow.

    The negative case is the positive one's quotient with numerator and denominator
    negated, which IEEE arithmetic gives exactly: one division for both. hi - lo > 0
    (the values are finite and distinct; only with denormals flushed can two subnormal
    neighbours differ by 0, and the inputs between them are then on a value, below or above
    the table, whose results the caller replaces); values above 2**1000 are halved first.
    """
    near = lut.values.index_select(0, jj + negative.to(jj.dtype))  # hi on a negative interval
    if lut.huge:
        big = (torch.abs(lo) > 2.0**1000) | (torch.abs(hi) > 2.0**1000)
        scale = torch.where(big, 0.5, 1.0).to(xs.dtype)
        num, den = xs * scale - near * scale, hi * scale - lo * scale
    else:
        num, den = xs - near, hi - lo
    sign = negative.to(xs.dtype).mul_(-2.0).add_(1.0)
    return torch.clamp(num / den.mul_(sign), 0.0, _ONE_MINUS_ULP)


@round_to_format.register
def _round_table(
    fmt: Table,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    shape = x.shape  # worked on flat: index_select takes 1-D indices
    x = x.to(torch.float64).reshape(-1)
    lut = fmt.lookup(x.device)
    vals = lut.values
    size = vals.numel()
    nan = torch.isnan(x)
    xs = torch.where(nan, torch.zeros_like(x), x).contiguous()
    if fmt.infinity == "nan":
        nan = nan | (torch.abs(x) == torch.inf)
    if fmt.negative == "nan":
        nan = nan | (xs < 0)
    if size == 1:
        y = vals[0].expand(x.shape).clone()
        return _finish(fmt, y, xs, nan).view(shape)

    j = _count_at_or_below(lut.padded, xs) - 1  # vals[j] <= x < vals[j + 1]
    below = j < 0
    jj = torch.clamp(j, 0, size - 2)  # interval jj: between entries jj and jj + 1
    lo = vals.index_select(0, jj)
    hi = vals.index_select(0, jj + 1)
    # x equals a value: lo (j = jj), or hi where j = size - 1 was clamped to size - 2 (a hi
    # equal to x elsewhere would have made j larger; a lo below x never equals it).
    exact = (lo == xs) | (hi == xs)
    above = xs > vals[size - 1]
    hi_rank_even = ((jj + 1 - lut.first_nonneg) & 1) == 0

    if mode.is_nearest or mode is Rounding.TOWARD_ZERO:
        floor_b = lut.bound.index_select(0, jj)
        tie = lut.bound_exact.index_select(0, jj) & (xs == floor_b)
        policy = {
            Rounding.NEAREST_EVEN: fmt.ties,
            Rounding.NEAREST_AWAY: "away",
            Rounding.NEAREST_ZERO: "smaller_magnitude",
            Rounding.TOWARD_ZERO: "smaller_magnitude",
        }[mode]
        up_nearest = ((xs > floor_b) & ~tie) | (tie & _tie_up(policy, lo, hi, xs, hi_rank_even))
        if mode is Rounding.TOWARD_ZERO:
            # The neighbour on the side of zero. Across a gap that straddles zero (0 not in the
            # table) neither is: keep x's sign (the smaller magnitude of that sign), so that RZ
            # stays monotone and never flips a sign, as float formats without zero do.
            straddle = (lo < 0) & (hi > 0)
            up = torch.where(straddle, ~torch.signbit(xs), xs < 0)
        else:
            up = up_nearest
    elif mode is Rounding.UP:
        up = torch.ones_like(xs, dtype=torch.bool)
    elif mode is Rounding.DOWN:
        up = torch.zeros_like(xs, dtype=torch.bool)
    elif mode is Rounding.ODD:
        up = ~hi_rank_even
    else:
        # Decided on the magnitude, like every other format: the draw says "away from zero"
        # (towards hi where hi > 0, towards lo where the interval is negative), so for a
        # symmetric table SR(-x) = -SR(x) with the same random bits. An interval that
        # straddles zero uses the value order (away = towards hi).
        negative = hi <= 0
        if mode is Rounding.STOCHASTIC:
            if rng is None:
                raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
            away = stochastic_away(_away_probability(lut, xs, jj, lo, hi, negative), rng, rand_bits)
        else:  # STOCHASTIC_UNIFORM: a fair coin
            away = round_scaled(torch.full_like(xs, 0.5), mode, rng) > 0
        up = away ^ negative

    idx = jj + up.to(jj.dtype)
    idx = torch.where(exact, j, idx)
    idx = torch.where(below, torch.zeros_like(idx), idx)
    idx = torch.where(above, torch.full_like(idx, size - 1), idx)
    if fmt.underflow == "saturate" and lut.zero_index >= 0:
        z = lut.zero_index
        to_zero = idx == z
        if z + 1 < size:
            idx = torch.where(to_zero & (xs > 0), torch.full_like(idx, z + 1), idx)
        if z >= 1:
            idx = torch.where(to_zero & (xs < 0), torch.full_like(idx, z - 1), idx)
    return _finish(fmt, vals.index_select(0, idx), xs, nan).view(shape)


def _finish(fmt: Table, y: torch.Tensor, xs: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """NaN where due; with ``signed_zero`` a zero result takes the input's sign (-0.1 -> -0.0)."""
    if fmt.signed_zero:
        y = torch.where(y == 0, torch.copysign(y, xs), y)
    return torch.where(nan, torch.full_like(y, torch.nan), y)
