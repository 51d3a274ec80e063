"""What the differential fuzzer found, kept as regression examples.

Fixed findings are plain tests. Findings whose fix belongs to code another engineer is rewriting
(quantize.py, kernels/, formats/) are ``xfail(strict=True)`` with the reason: they start passing,
and then fail loudly, the day the fix lands, so the marker gets removed. `fuzzlib.KNOWN` lets the
fuzzer step over exactly these cases meanwhile, so that it keeps looking for new ones.
"""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.errors import AnynumError


@pytest.mark.xfail(
    strict=True,
    raises=RuntimeError,
    reason="K1: the eager kernel (apply_overflow) and check_representable convert fmt.max to the "
    "float32 working dtype; a format whose max exceeds float32's (exp_bits >= 9) raises "
    "RuntimeError 'value cannot be converted to type float without overflow' instead of an "
    "AnynumError or a result: on float16/bfloat16 inputs always, on float32 inputs whenever the "
    "C loop does not take the call (ANYNUM_COMPILE=0, stochastic modes, ...) "
    "(src/anynum/kernels/eager.py, src/anynum/quantize/checks.py)",
)
@pytest.mark.parametrize(
    "fmt,dtype,mode",
    [
        (an.FloatFormat(9, 0), torch.float16, "nearest"),
        (an.FloatFormat(9, 0), torch.bfloat16, "nearest"),
        (an.FloatFormat(9, 23), torch.float32, "sr"),  # the C loop does not do SR: eager runs
    ],
)
def test_k1_wide_format_on_narrower_input(fmt, dtype, mode):
    try:
        y = an.quantize(torch.tensor([1.0, -3.0], dtype=dtype), fmt, mode, seed=0)
    except AnynumError:
        return  # a clear refusal is an acceptable fix too
    assert y.tolist() == [1.0, -3.0 if fmt.man_bits else -4.0]


@pytest.mark.xfail(
    strict=True,
    reason="K2: overflow='saturate' maps ±inf to ±fmt.max (and 'wrap' sends values anywhere in the "
    "format's range); when fmt.max exceeds the input dtype's range (fp64 on float32, uint16 on "
    "float16) the result is cast back to ±inf: neither a value of the format nor an error; "
    "check_representable looks at saturating directed roundings of finite inputs only "
    "(src/anynum/kernels/eager.py apply_overflow, src/anynum/quantize/checks.py)",
)
@pytest.mark.parametrize(
    "fmt,dtype,overflow,x",
    [
        (an.FP64, torch.float32, "saturate", [float("inf"), -float("inf")]),
        (an.format("uint16"), torch.float16, "saturate", [float("inf")]),
        (an.format("uint16"), torch.float16, "wrap", [-1.0]),  # wraps to 65535: float16 inf
    ],
)
def test_k2_saturate_of_inf_into_a_wider_format(fmt, dtype, overflow, x):
    """Also: encode then turns that ±inf into a wrong code (0 for uint16) instead of raising."""
    x = torch.tensor(x, dtype=dtype)
    try:
        y = an.quantize(x, fmt, overflow=overflow)
    except AnynumError:
        return  # refusing is a fix too
    assert bool(torch.isfinite(y).all()), y  # e.g. the largest fp64 value held by float32 is its max


@pytest.mark.xfail(
    strict=True,
    raises=AnynumError,
    reason="K3: 64-bit formats' codes do not fit int64: encode returns the bit pattern of a negative "
    "value as a negative int64, which decode then refuses ('codes ... lie in [0, 2**64)'); "
    "decode(encode(x)) fails for every negative fp64 value and -0.0 "
    "(src/anynum/formats/floating.py, src/anynum/quantize/codes.py decode)",
)
def test_k3_fp64_codes_round_trip():
    x = torch.tensor([-0.0, -1.5, 2.0], dtype=torch.float64)
    back = an.decode(an.encode(x, an.FP64), an.FP64)
    assert torch.equal(back, x) and bool(torch.signbit(back[0]))


@pytest.mark.xfail(
    strict=True,
    reason="K4: FloatFormat(1, 0, bias=0, subnormals=False, zero=False, signed=False, specials='p3109') "
    "is accepted though its two codes are +inf and NaN: it has no finite value, yet reports "
    "max=0.5 and quantize returns 0.5, off its (empty) grid. Such a format should raise "
    "FormatError at construction (src/anynum/formats/floating.py)",
)
def test_k4_a_float_format_without_finite_values_is_refused():
    with pytest.raises(AnynumError):
        fmt = an.FloatFormat(1, 0, bias=0, subnormals=False, zero=False, signed=False, specials="p3109")
        assert fmt.values().size > 0  # or, at least, its results are its values


@pytest.mark.xfail(
    strict=True,
    reason="K5: a format without negative zero (fnuz) but with flushed subnormals decodes the codes "
    "of negative subnormals to -0.0, a value it does not have (quantize(-0.0) is +0.0): "
    "decode(encode(decode(c))) keeps the value but not the sign (src/anynum/formats/floating.py)",
)
def test_k5_fnuz_without_subnormals_decodes_no_negative_zero():
    fmt = an.FloatFormat(1, 1, subnormals=False, specials="fnuz")
    values = an.decode(torch.arange(8), fmt)
    zeros = values[values == 0]
    assert not bool(torch.signbit(zeros).any()), values.tolist()


@pytest.mark.xfail(
    strict=True,
    reason="K6: fnuz/P3109 formats without zero put NaN on the code of -smallest (sign 1, all zero), "
    "so -smallest is not a value (values() leaves it out); quantize still returns it, and encode "
    "maps it to the NaN code (src/anynum/kernels/eager.py float rounding, formats/floating.py)",
)
@pytest.mark.parametrize(
    "fmt",
    [
        an.FloatFormat(1, 0, bias=1, subnormals=False, specials="fnuz", zero=False),
        an.FloatFormat(2, 1, subnormals=False, specials="fnuz", zero=False),
    ],
)
def test_k6_no_zero_fnuz_rounds_onto_its_nan_code(fmt):
    smallest = float(fmt.values()[fmt.values() > 0].min())
    y = an.quantize(torch.tensor([-smallest, -smallest * 1.1], dtype=torch.float64), fmt)
    assert bool(torch.isin(y, torch.from_numpy(fmt.values())).all()), y.tolist()


@pytest.mark.xfail(
    strict=True,
    reason="K7: overflow='wrap' of fixed point and integers is wrong for large inputs: IntFormat(8) "
    "wraps 2**60, 2**100 and 1e300 (float64) to -128 instead of 0, and FixedPoint/IntFormat inputs "
    "whose x / step overflows the float32 working dtype (3e38) give NaN; the exact wrap is "
    "(round(x / step) mod 2**bits) in two's complement (src/anynum/kernels/eager.py, uniform rounding)",
)
@pytest.mark.parametrize(
    "fmt,x,dtype",
    [
        (an.IntFormat(8), 2.0**60, torch.float64),
        (an.IntFormat(8), 1e300, torch.float64),
        (an.FixedPoint(8, 4), 3e38, torch.float32),
        (an.FixedPoint(0, 1, signed=False), 3.4028234663852886e38, torch.float32),
    ],
)
def test_k7_wrap_of_large_values(fmt, x, dtype):
    y = an.quantize(torch.tensor([x], dtype=dtype), fmt, overflow="wrap")
    assert y.item() == 0.0  # every x here is a multiple of 2**bits * step
