"""an.ops reductions with accumulate=fmt2 | "quire", run on emulate's engine, against exact rationals.

Each expectation is built from fractions: every partial sum (and, without fma, every
product) rounded to fmt2 by the independent reference `round_ref`, then the result
rounded once to fmt; the quire is the exact rational sum rounded once.
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import anynum as an

sys.path.insert(0, str(Path(__file__).parent))  # the exact references beside this file
from reference import round_ref

from anynum.errors import AnynumError

pytestmark = pytest.mark.usefixtures("eager_only")
FMT = an.BF16
ACC = an.E5M2


def grid_values(shape, seed, fmt=FMT, lo=-6, hi=2):  # sums stay inside e5m2
    rng = np.random.default_rng(seed)
    x = rng.integers(-255, 256, shape) * np.exp2(rng.integers(lo, hi, shape).astype(float))
    return an.quantize(torch.from_numpy(x.astype(np.float64)), fmt)


def r(v: Fraction, fmt, mode: str) -> Fraction:
    return Fraction(round_ref(v, fmt, mode)) if v else Fraction(0)


def sequential(terms, mode, fmt2=ACC):
    acc = None
    for t in terms:
        acc = r(t, fmt2, mode) if acc is None else r(acc + t, fmt2, mode)
    return acc if acc is not None else Fraction(0)


def pairwise(terms, mode, fmt2=ACC):
    """A sum's terms enter exactly (a sum is a fused dot with ones); a lone last node is passed up."""
    level = list(terms)
    while len(level) > 1:
        nxt = [r(a + b, fmt2, mode) for a, b in zip(level[0::2], level[1::2])]
        level = nxt + ([level[-1]] if len(level) % 2 else [])
    return r(level[0], fmt2, mode) if len(terms) == 1 else level[0] if level else Fraction(0)


def blocked(terms, k, mode, fmt2=ACC):
    acc = None
    for i in range(0, len(terms), k):
        block = sum(terms[i : i + k], Fraction(0))
        acc = r(block, fmt2, mode) if acc is None else r(acc + block, fmt2, mode)
    return acc if acc is not None else Fraction(0)


def fr(t: torch.Tensor) -> list:
    return [Fraction(v) for v in t.tolist()]


@pytest.mark.parametrize("mode", ["nearest", "rz", "ru", "rd"])
@pytest.mark.parametrize("order", ["sequential", "pairwise", 4])
def test_sum_accumulates_in_the_format(mode, order):
    x = grid_values((3, 37), 1)
    got = an.ops.sum(x, FMT, mode, axis=1, accumulate=ACC, order=order)
    for row, g in zip(x, got.tolist()):
        terms = fr(row)
        acc = (sequential(terms, mode) if order == "sequential" else pairwise(terms, mode)
               if order == "pairwise" else blocked(terms, order, mode))
        assert g == round_ref(acc, FMT, mode) if acc else g == 0.0, (mode, order)


@pytest.mark.parametrize("mode", ["nearest", "ru"])
@pytest.mark.parametrize("fma", [False, True])
def test_dot_and_matmul_round_products_unless_fused(mode, fma):
    a, b = grid_values((2, 9), 2, lo=-6, hi=-2), grid_values((9, 3), 3, lo=-6, hi=-2)
    got = an.ops.matmul(a, b, FMT, mode, accumulate=ACC, fma=fma)
    for i in range(2):
        for j in range(3):
            prods = [Fraction(a[i, t].item()) * Fraction(b[t, j].item()) for t in range(9)]
            if not fma:
                prods = [r(p, ACC, mode) for p in prods]
            acc = None
            for p in prods:  # fma: one rounding per multiply-add, the product exact
                acc = r(p, ACC, mode) if acc is None else r(acc + p, ACC, mode)
            assert got[i, j].item() == (round_ref(acc, FMT, mode) if acc else 0.0)
    d = an.ops.dot(a[0], b[:, 0], FMT, mode, accumulate=ACC, fma=fma)
    assert d.item() == got[0, 0].item()


def test_cumsum_runs_the_prefix_sums_sequentially():
    x = grid_values((2, 11), 4)
    got = an.ops.cumsum(x, FMT, "rz", axis=1, accumulate=ACC)
    for row, g in zip(x, got.tolist()):
        terms = fr(row)
        want = [round_ref(sequential(terms[: i + 1], "rz"), FMT, "rz") for i in range(len(terms))]
        assert g == want


@pytest.mark.parametrize("mode", ["nearest", "ru", "rd", "rz"])
def test_the_quire_is_exact_where_float64_is_not(mode):
    """Cancellation: float64 loses 1 + 2**-80 against 2**60 - 2**60; the quire keeps it."""
    p = an.Posit(16, 2)
    big, tiny = 2.0**40, 2.0**-40
    x = torch.tensor([big, 1.0, tiny, -big, tiny], dtype=torch.float64)
    y = torch.tensor([big, 1.0, tiny, big, 2.0**-30], dtype=torch.float64)
    exact = sum((Fraction(u) * Fraction(v) for u, v in zip(x.tolist(), y.tolist())), Fraction(0))
    assert float(torch.dot(x, y)) != float(exact)  # float64 rounds 2**80 + 1 + ... to 2**80 first
    got = an.ops.dot(x, y, p, mode, accumulate="quire")
    assert got.item() == round_ref(exact, p, mode)
    s = an.ops.sum(torch.tensor([2.0**40, 1.0, 2.0**-40, -(2.0**40)], dtype=torch.float64),
                   p, mode, accumulate="quire")
    assert s.item() == round_ref(Fraction(1) + Fraction(2) ** -40, p, mode)


def test_quire_needs_a_posit_and_stochastic_calls_reproduce_by_seed():
    x = grid_values((4, 50), 7)
    with pytest.raises(AnynumError, match="posit"):
        an.ops.sum(x, FMT, accumulate="quire", axis=1)
    a = an.ops.sum(x, FMT, "sr", axis=1, accumulate=ACC, seed=3)
    b = an.ops.sum(x, FMT, "sr", axis=1, accumulate=ACC, seed=3)
    assert torch.equal(a, b)
    lo = an.ops.sum(x, FMT, "rd", axis=1, accumulate=ACC)
    hi = an.ops.sum(x, FMT, "ru", axis=1, accumulate=ACC)
    # every stochastic partial sum is one of its two neighbours, so the result lies between
    # the all-down and the all-up accumulations
    assert bool(((a >= lo) & (a <= hi)).all())
