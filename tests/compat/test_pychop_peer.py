"""The Pychop facade equals Pychop (0.6) wherever Pychop is correct.

Skipped only when ``pychop`` is not installed (it is in the ``test`` extra).
The comparisons mask exactly Pychop's measured defects (PEERS.md and
docs/compat.md): results outside the normal range (its overflow to inf in
every direction, [65536, 131072) -> 0, underflow, -0 -> +0), rmode 7/8 on
negative numbers and within 1e-6 of a tie (it treats those as ties), and
rmode 9 on exactly representable values; everywhere else the results must be
identical, on NumPy and torch inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anynum.compat import pychop as F


@pytest.fixture(scope="module")
def P():
    return pytest.importorskip("pychop")


def _data(n: int = 50_000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)


@pytest.mark.parametrize("exp_bits,sig_bits", [(5, 10), (8, 7), (4, 3), (5, 2)])
@pytest.mark.parametrize("rmode", [1, 2, 3, 4, 7, 8, 9])
def test_chop_equals_pychop_where_pychop_is_correct(P, exp_bits, sig_bits, rmode):
    x = _data(seed=rmode)
    fmt = F.Chop(exp_bits, sig_bits).fmt
    keep = (np.abs(x) >= fmt.smallest_normal) & (np.abs(x) <= fmt.max)
    scaled = np.abs(x) / 2.0 ** (np.floor(np.log2(np.abs(x))) - sig_bits)
    frac = scaled - np.floor(scaled)
    if rmode in (7, 8):
        keep &= (x > 0) & (np.abs(frac - 0.5) > 1e-5)
    if rmode == 9:
        keep &= frac != 0
    for arr in (x, torch.from_numpy(x)):
        a = np.asarray(P.Chop(exp_bits, sig_bits, rmode=rmode)(arr))
        b = np.asarray(F.Chop(exp_bits, sig_bits, rmode=rmode)(arr))
        assert np.array_equal(a[keep], b[keep])
    assert keep.sum() > 5_000


@pytest.mark.parametrize("prec", ["h", "b", "q43", "q52", "s"])
@pytest.mark.parametrize("rmode", [1, 2, 3, 4])
def test_faultchop_equals_pychop_in_the_normal_range(P, prec, rmode):
    x = _data(20_000, 1)
    fmt = F.FaultChop(prec).fmt
    keep = (np.abs(x) >= fmt.smallest_normal) & (np.abs(x) <= fmt.max)
    a = P.FaultChop(prec, rmode=rmode)(x.copy())
    assert np.array_equal(a[keep], F.FaultChop(prec, rmode=rmode)(x)[keep])


@pytest.mark.parametrize("rmode", [1, 2, 3, 4])
def test_chopf_equals_pychop(P, rmode):
    x = np.concatenate([np.linspace(-9, 9, 4001), [100.0, -100.0]])
    a = P.Chopf(4, 4, rmode=rmode)(x)
    b = F.Chopf(4, 4, rmode=rmode)(x)
    same = (a == b) | ((a == 0) & (b == 0))  # Pychop's zeros lose the sign
    assert same.all()


def test_float_params_equal_pychop(P):
    for prec in ("q43", "q52", "h", "b", "t", "s", "d"):
        assert tuple(P.float_params(prec)) == F.float_params(prec), prec
