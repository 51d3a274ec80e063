"""Rounding onto an arbitrary `Table` of values: one binary search per element, all nine modes.

``torch.searchsorted`` finds the neighbours lo <= x < hi (O(log size)); the
boundary between them is stored as the largest float64 at or below the exact
boundary plus an "exact" flag, so comparing a float64 x with it is exact:
x is above the boundary iff x > floor, and a tie iff the flag is set and
x == floor. See `anynum.formats.table` for the semantics.
"""

from __future__ import annotations

import torch

from anynum.formats.table import Table
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import RandomSource, Rounding, round_scaled

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


def _probability(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """(x - lo) / (hi - lo) in float64, without overflow, clamped to [0, 1)."""
    big = (torch.abs(lo) > 2.0**1000) | (torch.abs(hi) > 2.0**1000)
    scale = torch.where(big, 0.5, 1.0).to(x.dtype)
    num = x * scale - lo * scale
    den = hi * scale - lo * scale
    p = num / torch.where(den > 0, den, torch.ones_like(den))
    return torch.clamp(p, 0.0, _ONE_MINUS_ULP)


@round_to_format.register
def _round_table(
    fmt: Table,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    x = x.to(torch.float64)
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
        return _finish(fmt, y, xs, nan)

    j = torch.searchsorted(vals, xs, right=True) - 1  # vals[j] <= x < vals[j + 1]
    below = j < 0
    jj = torch.clamp(j, 0, size - 2)  # interval jj: between entries jj and jj + 1
    lo = vals[jj]
    hi = vals[jj + 1]
    exact = (~below) & (vals[torch.clamp(j, 0, size - 1)] == xs)
    above = xs > vals[size - 1]
    hi_rank_even = ((jj + 1 - lut.first_nonneg) & 1) == 0

    if mode.is_nearest or mode is Rounding.TOWARD_ZERO:
        floor_b = lut.bound[jj]
        tie = lut.bound_exact[jj] & (xs == floor_b)
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
            p_away = torch.where(negative, _probability(-xs, -hi, -lo), _probability(xs, lo, hi))
            away = round_scaled(p_away, mode, rng, rand_bits) > 0
        else:  # STOCHASTIC_UNIFORM: a fair coin
            away = round_scaled(torch.full_like(xs, 0.5), mode, rng) > 0
        up = away ^ negative

    idx = jj + up.to(torch.int64)
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
    return _finish(fmt, vals[idx], xs, nan)


def _finish(fmt: Table, y: torch.Tensor, xs: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """NaN where due; with ``signed_zero`` a zero result takes the input's sign (-0.1 -> -0.0)."""
    if fmt.signed_zero:
        y = torch.where(y == 0, torch.copysign(y, xs), y)
    return torch.where(nan, torch.full_like(y, torch.nan), y)
