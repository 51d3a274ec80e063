"""Elementwise functions whose float64 result is exact: NumPy on the rounded inputs, rounded exactly.

The oracle applies NumPy's function to the inputs rounded onto the format (checked
on the grid by the exact reference), which is exact for these functions, and rounds
the rational result with the reference. Specials (NaN, ±inf, -0) follow NumPy.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import anynum as an

sys.path.insert(0, str(Path(__file__).parent))  # the exact references beside this file
from reference import DETERMINISTIC, round_ref

pytestmark = pytest.mark.usefixtures("eager_only")
FORMATS = [an.BF16, an.E4M3FN, an.Posit(8, 0), an.FixedPoint(6, 4), an.FP16]


def grid(fmt, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp2(rng.integers(-6, 8, n))
    x = an.quantize(torch.from_numpy(x), fmt, overflow="saturate").numpy()
    assert all(round_ref(Fraction(v), fmt, "nearest", "saturate") == v for v in x.tolist())
    return x


UNARY = {
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "abs": np.abs,
    "negative": np.negative, "sign": np.sign, "real": np.real, "conj": np.conj,
    "imag": lambda a: np.zeros_like(a),
}
BINARY = {
    "maximum": np.maximum, "minimum": np.minimum, "fmax": np.fmax, "fmin": np.fmin,
    "copysign": np.copysign, "floor_divide": np.floor_divide, "fmod": np.fmod, "mod": np.mod,
}


def check(fmt, got, exact, what):
    for mode, g in got.items():
        want = np.array([round_ref(Fraction(v), fmt, mode) if math.isfinite(v) else round_ref(v, fmt, mode)
                         for v in exact.tolist()])
        same = (g == want) | (np.isnan(g) & np.isnan(want))
        assert same.all(), (what, fmt, mode, exact[~same][:5], g[~same][:5], want[~same][:5])


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_exact_unary(fmt, name):
    x = grid(fmt, 200, 1)
    with np.errstate(all="ignore"):
        exact = UNARY[name](x).astype(np.float64)
    got = {m: getattr(an.ops, name)(x, fmt, m) for m in DETERMINISTIC}
    check(fmt, got, exact, name)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_exact_binary(fmt, name):
    x, y = grid(fmt, 200, 2), grid(fmt, 200, 3)
    keep = y != 0
    x, y = x[keep], y[keep]
    with np.errstate(all="ignore"):
        exact = BINARY[name](x, y)
    got = {m: getattr(an.ops, name)(x, y, fmt, m) for m in DETERMINISTIC}
    if name in ("mod", "floor_divide"):
        # NumPy's float64 mod and floor_divide round where the exact result needs more bits;
        # compare with the exact rationals instead (floor of the exact quotient / exact mod).
        fx, fy = [Fraction(v) for v in x.tolist()], [Fraction(v) for v in y.tolist()]
        if name == "mod":
            ex = [a - b * math.floor(a / b) for a, b in zip(fx, fy)]
        else:
            ex = [Fraction(math.floor(a / b)) for a, b in zip(fx, fy)]
        for mode, g in got.items():
            want = np.array([round_ref(v, fmt, mode) for v in ex])
            assert np.array_equal(g, want), (name, fmt, mode)
        return
    check(fmt, got, exact, name)


def test_rounded_inputs_first():
    """Inputs are rounded to the format before the function: clip bounds too (Pychop's rule)."""
    x = torch.tensor([-3.0, 0.3, 3.0])
    assert an.ops.clip(x, -1.0, 1.1, "e4m3fn").tolist() == [-1.0, 0.3125, 1.125]
    assert an.ops.clip(x, None, 1.1, "e4m3fn").tolist() == [-3.0, 0.3125, 1.125]
    assert an.ops.floor(torch.tensor([2.99]), "e4m3fn").tolist() == [3.0]  # 2.99 rounds to 3 first


def test_frexp_modf_round():
    m, e = an.ops.frexp(np.array([12.0, -0.3, 0.0, np.inf]), "bf16")
    assert m.tolist()[:3] == [0.75, -0.6015625, 0.0] and e.dtype == np.int32 and e.tolist()[:3] == [4, -1, 0]
    f, i = an.ops.modf(np.array([-2.75, 3.5, -np.inf, -0.0]), "bf16")
    assert f.tolist()[:2] == [-0.75, 0.5] and i.tolist() == [-2.0, 3.0, -np.inf, -0.0]
    assert np.signbit(f[2]) and f[2] == 0 and np.signbit(f[3])
    assert an.ops.round(np.array([2.5, 3.5, -0.5]), "bf16").tolist() == [2.0, 4.0, -0.0]
    assert an.ops.round(np.array([1234.0]), "bf16", decimals=-2).tolist() == [1200.0]


def test_bitwise_and_angle():
    x, y = np.array([6.0, -6.0, 5.7]), np.array([3.0, 3.0, 1.0])
    assert an.ops.bitwise_and(x, y, "bf16").tolist() == [2.0, 2.0, 1.0]  # -6 & 3 = 2; 5.7 -> 5
    assert an.ops.bitwise_or(x, y, "bf16").tolist() == [7.0, -5.0, 5.0]
    assert an.ops.bitwise_xor(x, y, "bf16").tolist() == [5.0, -7.0, 4.0]
    a = an.ops.angle(np.array([2.0, -2.0, -0.0, 0.0]), "bf16")
    assert a.tolist() == [0.0, 3.140625, 3.140625, 0.0]


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_specials_follow_numpy(mode):
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])
    with np.errstate(all="ignore"):
        for name in ("floor", "abs", "sign", "negative", "sqrt", "exp", "sin", "tanh", "log1p", "cbrt"):
            got = getattr(an.ops, name)(x, "bf16", mode, domain="ignore")
            want = getattr(np, name)(x)
            assert np.array_equal(np.isnan(got), np.isnan(want)), name
            fin = ~np.isnan(want)
            assert np.array_equal(got[fin], want[fin]) and np.array_equal(np.signbit(got[fin]),
                                                                          np.signbit(want[fin])), name


def test_overflow_policy_and_saturating_formats():
    big = torch.tensor([1e30])
    assert an.ops.exp(torch.tensor([100.0]), "bf16").tolist() == [float("inf")]
    assert an.ops.exp(torch.tensor([100.0]), "bf16", overflow="saturate").tolist() == [an.BF16.max]
    assert an.ops.exp(torch.tensor([100.0]), "e4m3fn").tolist() == [448.0]
    assert an.ops.multiply(big, big, "posit(16,1)").tolist() == [2.0**28]
    # float64 overflow inside the function does not leak: rz of cosh(2000) is the format's max.
    assert an.ops.cosh(torch.tensor([2000.0], dtype=torch.float64), "bf16", "rz").tolist() == [an.BF16.max]
    assert an.ops.cosh(torch.tensor([2000.0], dtype=torch.float64), "posit(16,1)").tolist() == [2.0**28]
    # float64 underflow inside does not either: exp(-2000) is positive, so 'ru' gives the smallest value.
    assert an.ops.exp(torch.tensor([-2000.0], dtype=torch.float64), "bf16", "ru").tolist() == [
        an.BF16.smallest_subnormal]
    assert an.ops.exp(torch.tensor([-2000.0], dtype=torch.float64), "bf16").tolist() == [0.0]
