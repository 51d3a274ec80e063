"""The Pychop facade's choppers against independent oracles (no Pychop needed).

Every rmode code is checked against its definition (compat_oracle.ieee_round, exact
arithmetic) on every grid point, midpoint and midpoint neighbour of small
formats; stochastic codes statistically; fixed point and integer quantization
against NumPy formulas; FaultChop's flips and Bitchop's fields against the IEEE
bit layout written out here.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from compat_oracle import ieee

from anynum.compat import pychop
from anynum.compat.pychop import Bitchop, Chop, Chopf, Chopi, Customs, FaultChop, float_params
from anynum.errors import AnynumError

RMODES = {0: "rto", 1: "rne", 2: "ru", 3: "rd", 4: "rz", 7: "rnz", 8: "rna", 9: "ro"}
SMALL = [(4, 3), (5, 2), (3, 2), (2, 1)]


@pytest.mark.parametrize("exp_bits,sig_bits", SMALL)
@pytest.mark.parametrize("rmode", sorted(RMODES))
@pytest.mark.parametrize("subnormal", [True, False])
def test_rmode_codes_follow_their_definitions(
    exp_bits, sig_bits, rmode, subnormal, probe_points, same_values
):
    grid, _ = ieee.grid(exp_bits, sig_bits, subnormal)
    x = probe_points(grid[:-1], top_step=grid[-2] - grid[-3])["float64"]
    got = Chop(exp_bits, sig_bits, rmode=rmode, subnormal=subnormal)(x)
    want = ieee.round(x, exp_bits, sig_bits, RMODES[rmode], subnormal)
    same_values(got, want, x, what=f"Chop({exp_bits},{sig_bits}) rmode {rmode} subnormal={subnormal}")


def test_rmode_names_and_rounding_members_are_accepted():
    x = np.array([2.5, -2.5, 0.3])
    for code, name in [(2, "plus_inf"), (3, "minus_infinity"), (4, "toward_zero"), (8, "nearest_away")]:
        assert np.array_equal(Chop(4, 3, rmode=name)(x), Chop(4, 3, rmode=code)(x))
    with pytest.raises(AnynumError):
        Chop(4, 3, rmode=11)


@pytest.mark.parametrize("prec,e,m", [("q43", 4, 3), ("q52", 5, 2), ("h", 5, 10), ("b", 8, 7), ("t", 8, 10)])
def test_prec_names(prec, e, m, random_values, same_values):
    x = random_values(3000, np.float64, seed=e + m, lo_exp=-30, hi_exp=20)
    sub = prec != "b"  # MATLAB chop's bfloat16 has no subnormals by default
    same_values(Chop(prec=prec)(x), ieee.round(x, e, m, "rne", sub), x, what=prec)
    same_values(FaultChop(prec)(x), ieee.round(x, e, m, "rne", sub), x, what=f"FaultChop {prec}")


def test_customs_both_ways_and_float_params():
    x = np.linspace(-70000, 70000, 1001)
    a = FaultChop(customs=Customs(exp_bits=5, sig_bits=10), rmode=3)(x)
    b = FaultChop(customs=Customs(emax=15, t=11), rmode=3)(x)
    assert np.array_equal(a, b) and np.array_equal(a, Chop(5, 10, rmode=3)(x))
    with pytest.raises(AnynumError):
        Customs and FaultChop(customs=Customs(emax=10, t=5))(x)
    u, xmins, xmin, xmax, p, emins, emin, emax = float_params("q43")
    assert (u, xmins, xmin, xmax, p, emins, emin, emax) == (2**-4, 2**-9, 2**-6, 240.0, 4, -9, -6, 7)
    assert float_params()["fp16"][3] == 65504.0


def test_explim_false_keeps_precision_and_the_dtype_range(random_values, same_values):
    x = random_values(3000, np.float32, seed=7, lo_exp=-140, hi_exp=120)
    got = Chop(5, 2, explim=False)(x)
    same_values(got, ieee.round(x.astype(np.float64), 8, 2, "rne"), x, what="explim=False float32")
    assert got.dtype == np.float32


def test_specials_and_signed_zeros():
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-30, 1e6, -1e6])
    for rmode in (1, 2, 3, 4, 9):
        y = Chop(5, 10, rmode=rmode)(x)
        assert np.isnan(y[0]) and y[1] == np.inf and y[2] == -np.inf
        assert np.signbit(y[3]) and not np.signbit(y[4]) and np.signbit(y[5])
    assert Chop(5, 10, rmode=4)(x)[6:].tolist() == [65504.0, -65504.0]  # toward zero saturates
    assert Chop(5, 10, rmode=2)(x)[6:].tolist() == [math.inf, -65504.0]
    assert Chop(5, 10, rmode=2)(np.array([1e-30]))[0] == 2.0**-24  # round-up of tiny values


@pytest.mark.parametrize("rmode", [5, 6, 10, "stoc_prop", "cadna"])
def test_stochastic_codes(rmode):
    x = np.full(40_000, 1.0 + 0.125 / 4)  # a quarter of the way from 1 to the next e4m3 value
    y = Chop(4, 3, rmode=rmode, random_state=1)(x)
    up = (y == 1.125).mean()
    p = 0.25 if rmode in (5, "stoc_prop") else 0.5
    assert set(np.unique(y)) == {1.0, 1.125}
    assert abs(up - p) < 5 * math.sqrt(p * (1 - p) / x.size)
    exact = np.array([1.0, 1.125, -3.0, 0.0])
    assert np.array_equal(Chop(4, 3, rmode=rmode)(exact), exact)  # exact values never move


def test_random_state_semantics():
    x = np.full(1000, 0.3)
    a, b = Chop(4, 3, rmode=5, random_state=3), Chop(4, 3, rmode=5, random_state=3)
    first = a(x)
    assert np.array_equal(first, b(x))  # two instances with one seed agree
    assert not np.array_equal(first, a(x))  # successive calls of one instance differ
    assert not np.array_equal(first, Chop(4, 3, rmode=5, random_state=4)(x))


def test_array_types_come_back():
    jnp = pytest.importorskip("jax.numpy")
    da = pytest.importorskip("dask.array")
    ch = Chop(5, 2)
    assert (
        isinstance(ch(np.ones(3, np.float32)), np.ndarray) and ch(np.ones(3, np.float32)).dtype == np.float32
    )
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        y = ch(torch.full((3,), 0.3, dtype=dtype))
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.tolist() == [0.3125] * 3
    y = ch(jnp.array([0.3, 3.3]))
    assert type(y).__module__.startswith("jax") and y.tolist() == [0.3125, 3.5]
    y = ch(da.from_array(np.array([0.3, 3.3]), chunks=1))
    assert type(y).__module__.startswith("dask") and y.compute().tolist() == [0.3125, 3.5]
    assert ch([0.3, 1]).tolist() == [0.3125, 1.0] and float(ch(0.3)) == 0.3125
    z = ch(np.array([0.3 + 3.3j]))
    assert z.tolist() == [0.3125 + 3.5j]


def test_gradients_pass_straight_through():
    x = torch.tensor([0.3, 3.3], requires_grad=True)
    (Chop(5, 2)(x) * torch.tensor([1.0, 2.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0]  # Pychop's plain Chop gives zeros
    jax = pytest.importorskip("jax")
    g = jax.grad(lambda v: (Chop(5, 2)(v) * 3.0).sum())(jax.numpy.array([0.3, 3.3]))
    assert g.tolist() == [3.0, 3.0]


def _fields(codes: np.ndarray, e: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (codes >> (e + m)) & 1, (codes >> m) & ((1 << e) - 1), codes & ((1 << m) - 1)


def test_faultchop_flips_one_significand_bit_with_probability_p():
    x = np.random.default_rng(0).standard_normal(20_000)
    base = Chop(prec="h")(x)
    assert np.array_equal(FaultChop("h", flip=True, p=0.0)(x), base)
    y = FaultChop("h", flip=True, p=0.3, random_state=5)(x)
    bc = Bitchop(5, 10)
    bc(base)
    s0, e0, f0 = bc.sign.copy(), bc.exponent.copy(), bc.significand.copy()
    bc(y)
    assert np.array_equal(bc.sign, s0) and np.array_equal(bc.exponent, e0)  # only the significand changes
    flipped = f0 != bc.significand
    popcount = np.array([bin(int(v)).count("1") for v in (f0 ^ bc.significand)])
    assert set(popcount[flipped]) == {1}  # exactly one bit where anything changed
    assert abs(flipped.mean() - 0.3) < 5 * math.sqrt(0.3 * 0.7 / x.size)  # p is honoured
    assert np.array_equal(FaultChop("h", flip=True, p=0.3, random_state=5)(x), y)
    special = FaultChop("h", flip=True, p=1.0)(np.array([np.nan, np.inf, -np.inf]))
    assert np.isnan(special[0]) and special[1:].tolist() == [math.inf, -math.inf]


def test_bitchop_fields_rebuild_the_values():
    x = np.array([1.5, -0.25, 3e-6, -65504.0, 0.0])
    bc = Bitchop(5, 10)
    y = bc(x)
    s, e, f = bc.sign.astype(float), bc.exponent.astype(float), bc.significand.astype(float)
    rebuilt = (-1) ** s * np.where(e > 0, (1 + f / 1024) * 2.0 ** (e - 15), f / 1024 * 2.0**-14)
    assert np.array_equal(rebuilt, y) and bc.is_denormal.tolist() == [False, False, True, False, False]


@pytest.mark.parametrize("rmode,fn", [(1, np.round), (2, np.ceil), (3, np.floor), (4, np.trunc)])
def test_chopf_against_numpy(rmode, fn, same_values):
    x = np.concatenate([np.linspace(-9, 9, 2001), [np.inf, -np.inf, np.nan, -0.0, -0.01]])
    for xs in (x, x.astype(np.float32)):
        with np.errstate(invalid="ignore"):
            want = np.copysign(np.clip(fn(xs * 16) / 16, -8.0, 7.9375), xs)
        same_values(Chopf(4, 4, rmode=rmode)(xs), want, xs, what=f"Chopf rmode {rmode}")
        t = Chopf(4, 4, rmode=rmode)(torch.from_numpy(xs))
        same_values(t.numpy(), want, xs, what="Chopf torch")
    assert Chopf(4, 4).get_format_info() == {
        "format": "Q4.4",
        "total_bits": 8,
        "range": (-8.0, 7.9375),
        "resolution": 0.0625,
    }


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
def test_chopi_codes_and_types(symmetric, per_channel):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)) * np.array([[1.0], [5.0], [0.1], [2.0]])
    ch = Chopi(8, symmetric=symmetric, per_channel=per_channel, axis=0)
    q = ch.quantize(x)
    red = (1,) if per_channel else None
    if symmetric:
        scale = np.abs(x).max(axis=red, keepdims=True) / 127
        want = np.clip(np.round(x / scale), -127, 127)
    else:
        hi, lo = np.maximum(x.max(axis=red, keepdims=True), 0), np.minimum(x.min(axis=red, keepdims=True), 0)
        scale = (hi - lo) / 255
        zp = -128 - np.round(lo / scale)
        want = np.clip(np.round(x / scale) + zp, -128, 127)
    assert q.dtype == np.int8 and np.array_equal(q, want)
    assert np.allclose(ch.dequantize(q), x, atol=scale.max())
    t = ch.quantize(torch.from_numpy(x))
    assert t.dtype == torch.int8 and np.array_equal(t.numpy(), q)  # the same codes on every array kind
    xt = torch.from_numpy(x).requires_grad_()
    ch(xt).sum().backward()
    assert torch.equal(xt.grad, torch.ones_like(xt))


def test_backend_is_accepted_and_ignored():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        pychop.backend("torch")
        pychop.backend("numpy")
    assert len(w) <= 1 and pychop.get_backend() == "auto"
    assert isinstance(Chop(5, 2)(np.ones(2)), np.ndarray)  # still by input type
    with pytest.raises(AnynumError):
        pychop.backend("cupy")
