"""Tables of any size and spacing against plain oracles, in the eager reference.

The reference finds each input's neighbours with a binary search over the values padded to a
power of two, so the sizes that matter are those at and beside powers of two; the values
drawn here run from subnormal to near float64's largest (where the stochastic probability
is computed on halved values). Oracles: the directed modes pick the largest value <= x and
the smallest >= x (by Python's own comparisons); nearest compares the two distances exactly
in `fractions.Fraction`; stochastic rounding, with random bits injected that are all zeros
or all ones, must move away from zero or towards it. Its probability is computed in float64
(within 2**-53 of the exact ratio), so an element whose exact probability lies within 2**-52
of the threshold the injected bits set may go either way.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anynum as an
from anynum.rounding import RandomSource

pytestmark = pytest.mark.usefixtures("eager_only", "one_thread")

SIZES = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
SLACK = Fraction(2) ** -52


class Constant(RandomSource):
    """Random bits that are all zeros (the draw says "away") or all ones ("towards zero")."""

    def __init__(self, ones: bool) -> None:
        self.ones = ones

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        return torch.full_like(index, (1 << nbits) - 1 if self.ones else 0)


def _values(size: int, seed: int) -> np.ndarray:
    """`size` distinct finite float64 values over many binades, both signs, sometimes 0."""
    rng = np.random.default_rng(seed)
    out: set[float] = set()
    while len(out) < size:
        e = int(rng.choice([rng.integers(-1074, -1000), rng.integers(-30, 30), rng.integers(1000, 1023)]))
        v = float(np.ldexp(rng.uniform(1.0, 2.0), e)) * (1.0 if rng.random() < 0.6 else -1.0)
        out.add(0.0 if rng.random() < 0.05 else v)
    return np.array(sorted(out), dtype=np.float64)


def _inputs(vals: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    lo, hi = vals[0], vals[-1]
    mids = vals[:-1] / 2 + vals[1:] / 2
    pts = [
        vals, np.nextafter(vals, np.inf), np.nextafter(vals, -np.inf), mids,
        np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
        rng.uniform(lo, hi, 200) if hi > lo else np.zeros(0),
        rng.choice(vals, 200) * rng.uniform(0.5, 1.5, 200),
        [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1.7e308, -1.7e308],
    ]
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in pts])


def _neighbours(vals: list[float], x: float) -> tuple[float, float]:
    """The table's values at or below and at or above x, saturating at the ends."""
    below = [v for v in vals if v <= x]
    above = [v for v in vals if v >= x]
    return (below[-1] if below else vals[0]), (above[0] if above else vals[-1])


def _nearest(vals: list[float], x: float) -> float:
    lo, hi = _neighbours(vals, x)
    if lo == hi:  # x is a value, or beyond an end
        return lo
    d_lo, d_hi = Fraction(x) - Fraction(lo), Fraction(hi) - Fraction(x)
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    if abs(lo) != abs(hi):  # ties="smaller_magnitude", the default
        return lo if abs(lo) < abs(hi) else hi
    return hi if math.copysign(1.0, x) > 0 else lo  # between -v and v: x's sign


def _stochastic_allowed(vals: list[float], x: float, ones: bool, rand_bits: int | None) -> set[float]:
    """The results the injected bits allow: away from zero, towards it, or either near the threshold."""
    lo, hi = _neighbours(vals, x)
    if lo == hi:
        return {lo}
    away, near = (lo, hi) if hi <= 0 else (hi, lo)  # an interval across zero: away = hi
    p = abs(Fraction(x) - Fraction(near)) / (Fraction(hi) - Fraction(lo))
    if rand_bits is None:  # exact SR: away iff u < p; zeros: u = 0, ones: u -> 1
        if ones:
            return {near}
        return {away} if p >= SLACK else {away, near}
    if not ones:  # floor(p * 2**r) + 0 >= 2**r never holds
        return {near}
    t = Fraction(1, 2**rand_bits)  # away iff floor(p * 2**r) >= 1, i.e. p >= 2**-r
    if abs(p - t) < SLACK:
        return {away, near}
    return {away} if p >= t else {near}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.sampled_from(SIZES), seed=st.integers(0, 2**32 - 1))
def test_directed_and_nearest_modes_on_any_table(size: int, seed: int) -> None:
    vals = _values(size, seed)
    table, listed = an.Table(vals), vals.tolist()
    x = _inputs(vals, seed)
    xt = torch.from_numpy(x)
    got = {m: an.quantize(xt, table, m).tolist() for m in ("down", "up", "nearest")}
    for i, xi in enumerate(x.tolist()):
        if math.isnan(xi):
            assert all(math.isnan(got[m][i]) for m in got), (size, seed, xi)
            continue
        lo, hi = _neighbours(listed, xi)
        assert got["down"][i] == lo and got["up"][i] == hi, (size, seed, xi, got["down"][i], got["up"][i])
        assert got["nearest"][i] == _nearest(listed, xi), (size, seed, xi, got["nearest"][i])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.sampled_from([s for s in SIZES if s > 1]),
    seed=st.integers(0, 2**32 - 1),
    ones=st.booleans(),
    rand_bits=st.sampled_from([None, 1, 4]),
)
def test_stochastic_moves_away_or_towards_zero_on_any_table(
    size: int, seed: int, ones: bool, rand_bits: int | None
) -> None:
    vals = _values(size, seed)
    table, listed = an.Table(vals), vals.tolist()
    x = _inputs(vals, seed)
    x = x[~np.isnan(x)]
    got = an.quantize(torch.from_numpy(x), table, "sr", generator=Constant(ones), rand_bits=rand_bits)
    for xi, yi in zip(x.tolist(), got.tolist(), strict=True):
        allowed = _stochastic_allowed(listed, xi, ones, rand_bits)
        assert yi in allowed, (size, seed, ones, rand_bits, xi, yi, allowed)


@pytest.mark.parametrize("ones", [False, True])
@pytest.mark.parametrize(
    "vals",
    [[-1.5e308, 1.5e308], [-1.7e308, -1.0, 2.0**-1074, 1.7e308], [-(2.0**1023), 2.0**1023]],
    ids=["straddle", "ends", "powers-of-two"],
)
def test_stochastic_where_a_gap_exceeds_float64(vals: list[float], ones: bool) -> None:
    """hi - lo overflows float64 in these gaps: the probability is taken on halved values."""
    spread = np.linspace(vals[0] / 2, vals[-1] / 2, 101) * 2  # halved: the span itself overflows
    x = np.concatenate([spread, [0.0, -0.0, 1.0, -1.0, 1e300, -1e300]])
    got = an.quantize(torch.from_numpy(x), an.Table(vals), "sr", generator=Constant(ones))
    for xi, yi in zip(x.tolist(), got.tolist(), strict=True):
        allowed = _stochastic_allowed(vals, xi, ones, None)
        assert yi in allowed, (vals, ones, xi, yi, allowed)
