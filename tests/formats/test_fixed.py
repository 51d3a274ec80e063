"""FixedPoint and IntFormat against hand-written float64 references, and scale/zero-point
integer quantization (quantize_int / dequantize_int) per tensor and per channel.

QPyTorch's ``fixed_point_quantize(x, wl, fl, clamp=True)`` is our ``FixedPoint(wl - fl, fl)``:
x * 2**fl rounded (to nearest even on CPU), clamped to [-2**(wl-1), 2**(wl-1) - 1] steps.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import anynum as an

pytestmark = pytest.mark.usefixtures("eager_only")

ROUND = {  # float64 references on the scaled value t = x * 2**F (exact for these inputs)
    "nearest": np.round,  # half to even
    "rz": np.trunc,
    "ru": np.ceil,
    "rd": np.floor,
    "rna": lambda t: np.sign(t) * np.floor(np.abs(t) + 0.5),
    "rnz": lambda t: np.sign(t) * np.ceil(np.abs(t) - 0.5),
    "ro": lambda t: np.where(t == np.floor(t), t,
                             np.where(np.floor(t) % 2 == 1, np.floor(t), np.floor(t) + 1)),
}


def qtorch_fixed(x: np.ndarray, wl: int, fl: int, mode: str = "nearest") -> np.ndarray:
    """QPyTorch fixed_point_quantize(clamp=True) semantics, CPU (ties to even), in float64."""
    t = ROUND[mode](x * 2.0**fl)
    t = np.clip(t, -(2.0 ** (wl - 1)), 2.0 ** (wl - 1) - 1)
    return t * 2.0**-fl


def _x(seed=0, n=4000, scale=20.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, scale, n)
    grid = np.arange(-300, 300) / 16
    return np.concatenate([x, grid, grid + 1 / 32, grid + 1 / 64, [0.0, -0.0, 1e9, -1e9]])


@pytest.mark.parametrize(("wl", "fl"), [(8, 4), (8, 0), (4, 3), (16, 8), (12, 12), (6, -2)])
@pytest.mark.parametrize("mode", list(ROUND))
def test_fixed_point_matches_qtorch_semantics(wl, fl, mode):
    fmt = an.FixedPoint(wl - fl, fl)
    x = _x()
    got = an.quantize(x, fmt, mode)
    want = qtorch_fixed(x, wl, fl, mode)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[got == 0]).any()  # two's complement has no -0


@pytest.mark.parametrize(("I", "F", "signed"), [(4, 3, True), (8, 4, True), (1, 7, True),
                                                (4, 4, False), (8, 0, False), (3, -1, True)])
def test_fixed_point_properties(I, F, signed):
    fmt = an.FixedPoint(I, F, signed=signed)
    step = 2.0**-F
    lo = -(2.0 ** (I - 1)) if signed else 0.0
    hi = (2.0 ** (I - 1) if signed else 2.0**I) - step
    assert fmt.bits == I + F and fmt.step == step and fmt.eps == step
    assert fmt.max == hi and fmt.min == lo and fmt.smallest_subnormal == step
    v = fmt.values()
    np.testing.assert_array_equal(v, np.arange(round(lo / step), round(hi / step) + 1) * step)


@pytest.mark.parametrize("signed", [True, False])
def test_fixed_point_wrap_is_twos_complement(signed):
    fmt = an.FixedPoint(4, 2, signed=signed, overflow="wrap")
    x = np.arange(-2000, 2000) / 16.0
    got = an.quantize(x, fmt, "rd")
    codes = np.floor(x * 4).astype(np.int64) % 64  # 6-bit code
    if signed:
        codes = np.where(codes >= 32, codes - 64, codes)
    np.testing.assert_array_equal(got, codes / 4.0)
    # the per-call policy overrides the format's default
    sat = an.quantize(x, fmt, "rd", overflow="saturate")
    np.testing.assert_array_equal(sat, np.clip(np.floor(x * 4), fmt.min * 4, fmt.max * 4) / 4)


def test_fixed_point_specials():
    fmt = an.FixedPoint(4, 3)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    y = an.quantize(x, fmt)
    assert math.isnan(y[0]) and y[1:3].tolist() == [fmt.max, fmt.min] and y[3].item() == 0.0
    assert not torch.signbit(y[3])
    w = an.quantize(x, fmt, overflow="wrap")
    assert torch.isnan(w[:3]).all()
    with pytest.raises(an.AnynumError, match="NaN"):
        fmt.encode(torch.tensor([float("nan")]))


@pytest.mark.parametrize("fmt", [an.FixedPoint(4, 3), an.FixedPoint(8, 8, signed=False),
                                 an.IntFormat(8), an.IntFormat(4, signed=False),
                                 an.FixedPoint(12, 4)], ids=str)
def test_fixed_encode_decode(fmt):
    v = fmt.values()
    c = an.encode(v, fmt)
    step_codes = np.round(v / fmt.step).astype(np.int64) % (1 << fmt.bits)
    np.testing.assert_array_equal(c, step_codes)
    np.testing.assert_array_equal(an.decode(c, fmt), v)
    assert np.unique(c).size == v.size == 1 << fmt.bits


@pytest.mark.parametrize(("bits", "signed"), [(8, True), (4, True), (8, False), (2, True)])
@pytest.mark.parametrize("mode", ["nearest", "rz", "ru", "rd", "rna"])
def test_int_format(bits, signed, mode):
    fmt = an.IntFormat(bits, signed=signed)
    x = _x(scale=100.0)
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    assert (fmt.min, fmt.max, fmt.bits) == (lo, hi, bits)
    np.testing.assert_array_equal(an.quantize(x, fmt, mode), np.clip(ROUND[mode](x), lo, hi))


@given(st.lists(st.floats(-1e4, 1e4, allow_subnormal=True), min_size=1, max_size=50),
       st.sampled_from(list(ROUND)))
def test_fixed_point_exact_against_fractions(xs, mode):
    """Fixed point from Fraction arithmetic: the result is k * 2**-F with k the rounded x * 2**F."""
    fmt = an.FixedPoint(6, 5)
    got = an.quantize(np.array(xs), fmt, mode)
    for x, g in zip(xs, got.tolist(), strict=True):
        t = Fraction(x) * 32
        fl = math.floor(t)
        frac = t - fl
        if frac == 0:
            k = fl
        elif mode == "rz":
            k = math.trunc(t)
        elif mode == "ru":
            k = fl + 1
        elif mode == "rd":
            k = fl
        elif mode == "ro":
            k = fl if fl % 2 else fl + 1
        else:
            up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and {
                "nearest": fl % 2 == 1, "rna": t > 0, "rnz": t < 0}[mode])
            k = fl + up
        k = min(max(k, -(2**10)), 2**10 - 1)
        assert g == k / 32, (x, mode, g, k / 32)


# --- scale / zero-point integer quantization -----------------------------------------------------


def ref_quantize_int(x: np.ndarray, bits: int, symmetric: bool, axis, signed=True):
    """Hand-written float64 reference of the documented rules."""
    x = x.astype(np.float64)
    if signed:
        qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    else:
        qmin, qmax = 0, 2**bits - 1
    red = None if axis is None else tuple(d for d in range(x.ndim) if d != axis % x.ndim)
    kw = {"axis": red, "keepdims": True}
    if symmetric:
        qmin = -qmax
        scale = np.abs(x).max(**kw) / qmax
        zp = np.zeros_like(scale)
    else:
        hi = np.maximum(x.max(**kw), 0.0)
        lo = np.minimum(x.min(**kw), 0.0)
        scale = (hi - lo) / (qmax - qmin)
        zp = qmin - np.round(lo / np.where(scale > 0, scale, 1.0))
    scale = np.where(scale > 0, scale, 1.0)
    codes = np.clip(np.round(x / scale) + zp, qmin, qmax)
    return codes.astype(np.int64), scale, zp.astype(np.int64)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantize_int_matches_reference(symmetric, axis, bits):
    rng = np.random.default_rng(bits)
    x = rng.normal(0.3, 2.0, (6, 7, 5))
    x[2] = 0.0  # an all-zero channel along axis 0
    x[:, 3] = np.abs(x[:, 3])  # a positive-only slice (asymmetric: the zero point moves)
    q = an.quantize_int(torch.from_numpy(x), bits, symmetric=symmetric, axis=axis)
    codes, scale, zp = ref_quantize_int(x, bits, symmetric, axis)
    np.testing.assert_array_equal(q.codes.numpy(), codes)
    np.testing.assert_array_equal(np.broadcast_to(q.scale.numpy(), scale.shape), scale)
    np.testing.assert_array_equal(np.broadcast_to(q.zero_point.numpy(), zp.shape), zp)
    assert q.codes.dtype == torch.int64
    deq = an.dequantize_int(q)
    assert deq.dtype == torch.float64
    np.testing.assert_array_equal(deq.numpy(), (codes - zp) * scale)
    # error bound: half a step, except where clamped (never: the range covers x)
    assert (np.abs(deq.numpy() - x) <= scale / 2 * (1 + 1e-12)).all()
    if symmetric:
        assert (q.codes.abs() <= 2 ** (bits - 1) - 1).all()
    else:
        # 0.0 is exactly representable
        zero = an.dequantize_int(q._replace(codes=q.zero_point.expand_as(q.codes).contiguous()))
        assert (zero == 0).all()


def test_quantize_int_float32_and_unsigned():
    x = torch.tensor([[-1.0, 0.5, 2.0], [0.0, 3.0, 6.0]])
    q = an.quantize_int(x, an.IntFormat(8, signed=False), symmetric=False, axis=0)
    codes, scale, _ = ref_quantize_int(x.double().numpy(), 8, False, 0, signed=False)
    np.testing.assert_array_equal(q.codes.numpy(), codes)
    assert q.scale.dtype == torch.float32
    np.testing.assert_array_equal(q.scale.numpy(), scale.astype(np.float32))
    assert q.codes.min() >= 0 and q.codes.max() <= 255
    assert an.dequantize_int(q).dtype == torch.float32


def test_quantize_int_examples_by_hand():
    q = an.quantize_int(torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64), 8)
    assert float(q.scale) == 2.0 / 127
    assert q.codes.tolist() == [round(-127 / 2), round(0.5 * 127 / 2), 127]
    q = an.quantize_int(torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64), 8, symmetric=False)
    assert float(q.scale) == 3.0 / 255 and int(q.zero_point) == -128
    assert q.codes.tolist() == [-128, -128 + 85, 127]


def test_quantize_int_errors():
    with pytest.raises(an.AnynumError, match="finite"):
        an.quantize_int(torch.tensor([1.0, float("nan")]), 8)
    with pytest.raises(an.AnynumError, match="signed"):
        an.quantize_int(torch.tensor([1.0]), an.IntFormat(8, signed=False), symmetric=True)
    with pytest.raises(an.AnynumError, match="axis"):
        an.quantize_int(torch.ones(2, 3), 8, axis=2)
    with pytest.raises(an.AnynumError, match="IntFormat"):
        an.quantize_int(torch.ones(2), an.E4M3FN)
