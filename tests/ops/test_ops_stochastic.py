"""Stochastic rounding in an.ops: the exact result's error term feeds the probability.

Exact decisions are checked with injected random bits (a RandomSource that returns
chosen 53-bit chunks per refinement level); frequencies with binomial tests at a
fixed seed, each with a false-alarm rate below 1e-6 (|z| < 5).
"""

from __future__ import annotations

import math

import pytest
import torch

import anynum as an
from anynum.rounding import RandomSource

pytestmark = pytest.mark.usefixtures("eager_only")

N = 20000
Z = 5.0  # two-sided false-alarm rate 5.7e-7 per check


class Injected(RandomSource):
    """Bits by refinement level (stream mod 2**20): level 0 -> first, level 1 -> second, ..."""

    def __init__(self, *levels: int) -> None:
        self.levels = levels

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        level = stream % (1 << 20)
        value = self.levels[min(level, len(self.levels) - 1)]
        return torch.full_like(index, value >> (53 - nbits) if nbits < 53 else value)


def assert_binomial(hits: int, n: int, p: float) -> None:
    sd = math.sqrt(n * p * (1 - p))
    assert abs(hits - n * p) < Z * sd, (hits, n, p)


def test_error_term_decides_with_exact_bits():
    """bf16 'sr' of 1 + 2**-100 goes up with probability 2**-93 exactly.

    With uniform u = 0 it goes up (u < 2**-93); with u = 2**-93 (first chunk 0, second
    chunk 8192 = 2**13 at scale 2**-106) it stays (u is not below p); with 8191 it goes up.
    """
    one, tiny = torch.tensor([1.0, -1.0]), torch.tensor([2.0**-100, -(2.0**-100)])
    up = an.ops.add(one, tiny, "bf16", "sr", generator=Injected(0, 0)).tolist()
    assert up == [1 + 2**-7, -1 - 2**-7]
    assert an.ops.add(one, tiny, "bf16", "sr", generator=Injected(0, 8192)).tolist() == [1.0, -1.0]
    up = an.ops.add(one, tiny, "bf16", "sr", generator=Injected(0, 8191)).tolist()
    assert up == [1 + 2**-7, -1 - 2**-7]
    # Without the error term the result would be 1 whatever the bits.
    assert an.quantize(torch.tensor([1.0]), "bf16", "sr", generator=Injected(0, 0)).tolist() == [1.0]


def test_error_term_below_a_grid_point():
    """1 + 2**-7 - 2**-100 (just below a bf16 value) comes down with probability 2**-93."""
    x, y = torch.tensor([1 + 2**-7]), torch.tensor([-(2.0**-100)])
    assert an.ops.add(x, y, "bf16", "sr", generator=Injected(0, 0)).tolist() == [1.0]
    assert an.ops.add(x, y, "bf16", "sr", generator=Injected(0, 8192)).tolist() == [1 + 2**-7]


@pytest.mark.parametrize(("fmt", "x", "y", "p"), [
    ("bf16", 1.0, 2.0**-9, 0.25),                 # s inside the gap, e = 0
    ("bf16", 1.0, 3 * 2.0**-10, 0.375),
    ("e4m3fn", 1.0, 2.0**-5, 0.25),
    (an.FP64, 1.0, 2.0**-54, 0.25),               # float64's own grid: P = |e| / ulp
])
def test_sr_frequency(fmt, x, y, p):
    xs = torch.full((N,), x, dtype=torch.float64)
    ys = torch.full((N,), y, dtype=torch.float64)
    out = an.ops.add(xs, ys, fmt, "sr", seed=11)
    hits = int((out > x).sum())
    assert_binomial(hits, N, p)


def test_divide_is_unbiased():
    """E[SR(1/3)] = 1/3: the up-frequency matches (1/3 - lo) / (hi - lo) on bf16."""
    ones, threes = torch.ones(N), torch.full((N,), 3.0)
    out = an.ops.divide(ones, threes, "bf16", "sr", seed=5)
    lo, hi = 0.33203125, 0.333984375
    assert set(out.unique().tolist()) == {lo, hi}
    assert_binomial(int((out == hi).sum()), N, (1 / 3 - lo) / (hi - lo))


def test_hardware_sr_sees_the_error_term():
    """rand_bits=4: 1 + 2**-7 - 2**-100 truncates down with probability 1/16 (frac is just below 1)."""
    x = torch.full((N,), 1 + 2**-7)
    y = torch.full((N,), -(2.0**-100))
    out = an.ops.add(x, y, "bf16", "sr", rand_bits=4, seed=3)
    assert_binomial(int((out == 1.0).sum()), N, 1 / 16)


def test_sr_uniform_on_inexact_results():
    x, y = torch.ones(N), torch.full((N,), 2.0**-100)
    out = an.ops.add(x, y, "bf16", "sr_uniform", seed=9)
    assert_binomial(int((out > 1).sum()), N, 0.5)
    exact = an.ops.add(x, x, "bf16", "sr_uniform", seed=9)
    assert bool((exact == 2).all())


def test_inputs_and_output_draw_independent_bits():
    """Inputs and the result are rounded with different streams, and a seed reproduces the call."""
    x = torch.full((N,), 1 + 2**-9)  # not on the bf16 grid: rounded up w.p. 1/4
    a = an.ops.multiply(x, torch.ones(N), "bf16", "sr", seed=2)
    b = an.ops.multiply(x, torch.ones(N), "bf16", "sr", seed=2)
    assert torch.equal(a, b)
    assert_binomial(int((a > 1).sum()), N, 0.25)
    # y = x rounded separately: the two inputs' roundings agree only as often as independence says.
    sq = an.ops.multiply(x, x, "bf16", "sr", seed=4)
    both = (sq > 1.01).sum().item()  # both inputs rounded up: (1 + 2**-7)**2 rounds above 1.01
    assert_binomial(int(both), N, 1 / 16)
