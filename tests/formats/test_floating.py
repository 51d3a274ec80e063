"""FloatFormat properties, values(), encode/decode, against first principles, ml_dtypes, gfloat and torch.

Expected numbers come from closed-form formulas (IEEE 754 layout rules), from
ml_dtypes.finfo / gfloat.FormatInfo, or from enumerating another library's
codes, never from anynum itself.
"""

from __future__ import annotations

import math

import gfloat
import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat.formats import format_info_p3109

import anynum as an

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

# format -> (bits, max, smallest_normal, smallest_subnormal, eps, emin, emax, precision), by hand
HAND = {
    an.FP32: (32, (2 - 2.0**-23) * 2.0**127, 2.0**-126, 2.0**-149, 2.0**-23, -126, 127, 24),
    an.TF32: (19, (2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136, 2.0**-10, -126, 127, 11),
    an.FP16: (16, 65504.0, 2.0**-14, 2.0**-24, 2.0**-10, -14, 15, 11),
    an.BF16: (16, (2 - 2.0**-7) * 2.0**127, 2.0**-126, 2.0**-133, 2.0**-7, -126, 127, 8),
    an.E5M2: (8, 57344.0, 2.0**-14, 2.0**-16, 0.25, -14, 15, 3),
    an.E4M3FN: (8, 448.0, 2.0**-6, 2.0**-9, 0.125, -6, 8, 4),
    an.E4M3FNUZ: (8, 240.0, 2.0**-7, 2.0**-10, 0.125, -7, 7, 4),
    an.E5M2FNUZ: (8, 57344.0, 2.0**-15, 2.0**-17, 0.25, -15, 15, 3),
    an.E4M3: (8, 240.0, 2.0**-6, 2.0**-9, 0.125, -6, 7, 4),
    an.E3M4: (8, 15.5, 0.25, 2.0**-6, 2.0**-4, -2, 3, 5),
    an.E3M2: (6, 28.0, 0.25, 0.0625, 0.25, -2, 4, 3),
    an.E2M3: (6, 7.5, 1.0, 0.125, 0.125, 0, 2, 4),
    an.E2M1: (4, 6.0, 1.0, 0.5, 0.5, 0, 2, 2),
    an.E8M0: (8, 2.0**127, 2.0**-127, 2.0**-127, 1.0, -127, 127, 1),
    an.format("q43"): (8, 240.0, 2.0**-6, 2.0**-9, 0.125, -6, 7, 4),
    an.format("q52"): (8, 57344.0, 2.0**-14, 2.0**-16, 0.25, -14, 15, 3),
    an.FloatFormat(6, 9): (16, (2 - 2.0**-9) * 2.0**31, 2.0**-30, 2.0**-39, 2.0**-9, -30, 31, 10),
    an.FloatFormat(3, 0): (4, 8.0, 0.25, 0.25, 1.0, -2, 3, 1),
    an.FloatFormat(4, 3, subnormals=False): (8, 240.0, 2.0**-6, 2.0**-6, 0.125, -6, 7, 4),
    an.FloatFormat(5, 2, bias=10): (8, 1.75 * 2.0**20, 2.0**-9, 2.0**-11, 0.25, -9, 20, 3),
    an.formats.p3109(8, 4): (8, 224.0, 2.0**-7, 2.0**-10, 0.125, -7, 7, 4),
    an.formats.p3109(8, 3): (8, 49152.0, 2.0**-15, 2.0**-17, 0.25, -15, 15, 3),
    an.formats.p3109(8, 1): (8, 2.0**62, 2.0**-63, 2.0**-63, 1.0, -63, 62, 1),
    an.formats.p3109(8, 4, domain="finite"): (8, 240.0, 2.0**-7, 2.0**-10, 0.125, -7, 7, 4),
}


@pytest.mark.parametrize("fmt", list(HAND), ids=str)
def test_properties_by_hand(fmt):
    bits, mx, sn, ss, eps, emin, emax, prec = HAND[fmt]
    info = fmt.info
    assert (fmt.bits, fmt.max, fmt.smallest_normal, fmt.smallest_subnormal) == (bits, mx, sn, ss)
    assert (fmt.eps, fmt.emin, fmt.emax, fmt.precision) == (eps, emin, emax, prec)
    assert (info.bits, info.max, info.eps, info.emin, info.emax, info.precision) == (
        bits, mx, eps, emin, emax, prec)
    assert fmt.emax == math.floor(math.log2(fmt.max))


ML = {
    an.E5M2: ml_dtypes.float8_e5m2, an.E4M3FN: ml_dtypes.float8_e4m3fn,
    an.E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, an.E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    an.E4M3: ml_dtypes.float8_e4m3, an.E3M4: ml_dtypes.float8_e3m4,
    an.E3M2: ml_dtypes.float6_e3m2fn, an.E2M3: ml_dtypes.float6_e2m3fn,
    an.E2M1: ml_dtypes.float4_e2m1fn, an.E8M0: ml_dtypes.float8_e8m0fnu,
    an.BF16: ml_dtypes.bfloat16, an.FP16: np.float16, an.FP32: np.float32,
    an.FloatFormat(4, 3, bias=11, specials="fnuz"): ml_dtypes.float8_e4m3b11fnuz,
}


@pytest.mark.parametrize("fmt", list(ML), ids=str)
def test_properties_match_ml_dtypes_finfo(fmt):
    fi = ml_dtypes.finfo(ML[fmt])
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.smallest_normal == float(fi.smallest_normal)
    assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.emin == fi.minexp and fmt.emax == fi.maxexp - 1
    assert fmt.precision == fi.nmant + 1
    if fmt.has_nan and ML[fmt] is not ml_dtypes.float8_e8m0fnu:
        assert np.isnan(np.array(np.nan, dtype=ML[fmt]).astype(np.float64))


def _ml_codes(fmt) -> np.ndarray:
    return np.arange(1 << fmt.bits, dtype=np.uint16 if fmt.bits > 8 else np.uint8)


@pytest.mark.parametrize("fmt", [f for f in ML if f.bits <= 16], ids=str)
def test_decode_and_values_match_ml_dtypes(fmt, same_values):
    codes = _ml_codes(fmt)
    want = codes.view(ML[fmt]).astype(np.float64)
    got = an.decode(codes.astype(np.int64), fmt)
    same_values(got, want, codes, what=f"decode {fmt}")
    finite = np.unique(want[np.isfinite(want)] + 0.0)
    np.testing.assert_array_equal(fmt.values(), finite)
    # torch codes too
    same_values(fmt.decode(torch.from_numpy(codes.astype(np.int64))).numpy(), want, codes,
                what="decode torch")


@pytest.mark.parametrize("fmt", [f for f in ML if f.bits <= 16], ids=str)
def test_encode_matches_ml_dtypes_bit_patterns(fmt):
    """Every finite value (and ±inf where it exists) encodes to ml_dtypes' code; decode inverts it."""
    codes = _ml_codes(fmt)
    vals = codes.view(ML[fmt]).astype(np.float64)
    keep = ~np.isnan(vals)
    got = an.encode(vals[keep], fmt)
    np.testing.assert_array_equal(got, codes[keep].astype(np.int64))
    back = an.decode(got, fmt)
    np.testing.assert_array_equal(back, vals[keep])
    # NaN encodes to a NaN code; a format without one refuses it
    if fmt.has_nan:
        assert np.isnan(an.decode(an.encode(np.array([np.nan]), fmt), fmt)).all()
    else:
        with pytest.raises(an.AnynumError, match="has no NaN code"):
            an.encode(np.array([np.nan]), fmt)


@pytest.mark.parametrize(("fmt", "tdtype"), [(an.FP16, torch.float16), (an.BF16, torch.bfloat16)],
                         ids=["fp16", "bf16"])
def test_encode_matches_torch_int16_view(fmt, tdtype):
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(tdtype)
    keep = ~torch.isnan(x)
    want = x.view(torch.int16).to(torch.int64) & 0xFFFF
    got = an.encode(x.float(), fmt)
    assert torch.equal(got[keep], want[keep])
    got_native = an.encode(x, fmt)
    assert torch.equal(got_native[keep], want[keep])
    assert torch.isnan(an.decode(got[~keep], fmt)).all()
    assert torch.equal(an.decode(want[keep], fmt), x[keep].double())


@pytest.mark.parametrize(("fmt", "tdtype"), [
    (an.E5M2, torch.float8_e5m2), (an.E4M3FN, torch.float8_e4m3fn),
    (an.E4M3FNUZ, torch.float8_e4m3fnuz), (an.E5M2FNUZ, torch.float8_e5m2fnuz),
    (an.E8M0, torch.float8_e8m0fnu)], ids=str)
def test_decode_matches_torch_float8_view(fmt, tdtype, same_values):
    codes = torch.arange(256, dtype=torch.int64)
    want = codes.to(torch.uint8).view(tdtype).double()
    same_values(an.decode(codes, fmt).numpy(), want.numpy(), codes.numpy(), what=str(fmt))


def _gfloat_info(fmt):
    if fmt.specials == "p3109":
        s = gfloat.Signedness.Signed if fmt.signed else gfloat.Signedness.Unsigned
        return format_info_p3109(fmt.bits, fmt.precision, s, gfloat.Domain.Extended)
    if fmt.name and fmt.name.startswith("p3109"):
        s = gfloat.Signedness.Signed if fmt.signed else gfloat.Signedness.Unsigned
        return format_info_p3109(fmt.bits, fmt.precision, s, gfloat.Domain.Finite)
    raise AssertionError(fmt)


P3109 = [an.formats.p3109(k, p, signed=s, domain=d)
         for k, p in [(8, 1), (8, 3), (8, 4), (8, 7), (6, 3), (3, 2)]
         for s in (True, False) for d in ("extended", "finite")
         if p < k or not s]


@pytest.mark.parametrize("fmt", P3109, ids=str)
def test_p3109_matches_gfloat(fmt, same_values):
    fi = _gfloat_info(fmt)
    assert (fmt.bits, fmt.precision, fmt.bias) == (fi.k, fi.precision, fi.bias)
    assert fmt.max == fi.max
    assert fmt.smallest_subnormal == fi.smallest
    assert fmt.has_inf == (fi.num_infs > 0) and fmt.has_nan == (fi.num_nans > 0)
    codes = np.arange(1 << fmt.bits, dtype=np.int64)
    want = gfloat.decode_ndarray(fi, codes)
    same_values(an.decode(codes, fmt), want, codes, what=f"decode {fmt}")
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(an.encode(want[keep], fmt), codes[keep])




@pytest.mark.parametrize("fmt", [
    an.FloatFormat(6, 9), an.FloatFormat(3, 0),
    an.FloatFormat(4, 3, subnormals=False),
    an.FloatFormat(5, 2, bias=10), an.FloatFormat(4, 2, signed=False, specials="fn"),
    an.FloatFormat(3, 2, specials="none", subnormals=False), an.E8M0, an.TF32,
    an.FloatFormat(11, 4), an.FloatFormat(2, 10, specials="fnuz"),
], ids=str)
def test_encode_decode_round_trip(fmt, random_values):
    """decode(encode(v)) == v for every value (or a sample of codes for wide formats);
    codes are in range and, for distinct values, distinct."""
    if fmt.bits <= 16:
        v = fmt.values()
    else:
        codes = np.random.default_rng(0).integers(0, 1 << fmt.bits, 20000)
        v = an.decode(codes, fmt)
        v = v[np.isfinite(v)]
    c = an.encode(v, fmt)
    assert c.dtype == np.int64 and (c >= 0).all() and (c < (1 << fmt.bits)).all()
    np.testing.assert_array_equal(an.decode(c, fmt), v)
    assert np.unique(c).size == np.unique(v).size
    if fmt.has_inf:
        ci = an.encode(np.array([np.inf]), fmt)
        assert an.decode(ci, fmt)[0] == np.inf
    if fmt.has_nan:
        cn = an.encode(np.array([np.nan]), fmt)
        assert np.isnan(an.decode(cn, fmt)).all(), f"NaN encodes to {cn} which decodes to a number"
    if fmt.has_negative_zero:
        cz = an.encode(np.array([-0.0]), fmt)
        assert cz[0] == 1 << (fmt.bits - 1) and np.signbit(an.decode(cz, fmt)[0])
    # rounding then encoding: codes of random inputs decode to the rounded values
    x = random_values(2000, np.float64, seed=1, lo_exp=fmt.emin - 3, hi_exp=min(fmt.emax, 60))
    if not fmt.signed:
        x = np.abs(x)
    np.testing.assert_array_equal(an.decode(an.encode(x, fmt, "rz"), fmt), an.quantize(x, fmt, "rz"))


def test_values_are_sorted_distinct_finite_and_counted():
    """Number of finite values from the layout: 2**bits codes minus specials, -0 merged with 0."""
    count = {
        an.E5M2: 256 - 8 - 1, an.E4M3FN: 256 - 2 - 1, an.E4M3FNUZ: 256 - 1, an.E2M1: 16 - 1,
        an.E3M2: 64 - 1, an.E8M0: 255, an.FP16: 65536 - 2048 - 1, an.formats.p3109(8, 3): 256 - 3,
        an.FloatFormat(4, 3, subnormals=False): 1 + 2 * 14 * 8,
    }
    for fmt, n in count.items():
        v = fmt.values()
        assert v.dtype == np.float64 and v.size == n, (fmt, v.size, n)
        assert (np.diff(v) > 0).all() and np.isfinite(v).all()
    with pytest.raises(an.AnynumError, match="16"):
        an.FP32.values()


@pytest.mark.parametrize("name", [n for n in an.list_formats()])
def test_every_listed_name_parses_and_round_trips(name):
    fmt = an.format(name)
    assert an.format(name.upper()) == fmt
    assert hash(fmt) == hash(an.format(name))
    assert isinstance(repr(fmt), str) and repr(fmt)


@pytest.mark.parametrize(("name", "want"), [
    ("fp16", an.FP16), ("half", an.FP16), ("bf16", an.BF16), ("e4m3fn", an.E4M3FN),
    ("fp8_e5m2", an.E5M2), ("float8_e4m3fnuz", an.E4M3FNUZ), ("e5m2fnuz", an.E5M2FNUZ),
    ("e8m0", an.E8M0), ("q43", an.FloatFormat(4, 3)), ("q52", an.FloatFormat(5, 2)),
    ("e6m9", an.FloatFormat(6, 9)), ("e4m3fn", an.FloatFormat(4, 3, specials="fn")),
    ("E5M2FNUZ", an.FloatFormat(5, 2, specials="fnuz")), ("p3109(8,4)", an.formats.p3109(8, 4)),
    ("tf32", an.FloatFormat(8, 10)), ("fp32", an.FloatFormat(8, 23)),
    ("fixed(8,4)", an.FixedPoint(8, 4)), ("int8", an.IntFormat(8)),
])
def test_names(name, want):
    assert an.format(name) == want


def test_formats_are_frozen_hashable_values():
    a, b = an.FloatFormat(4, 3, specials="fn"), an.E4M3FN
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert an.FloatFormat(4, 3) != an.E4M3FN
    with pytest.raises(AttributeError):
        a.exp_bits = 5
    assert "exp_bits=5" in repr(an.FloatFormat(5, 7, bias=3)) and "bias=3" in repr(
        an.FloatFormat(5, 7, bias=3))
