"""What the differential fuzzer found, kept as regression examples.

K1-K6 were fixed in the core (formats, kernels, quantize); their examples stay here as plain
tests. A finding whose fix belongs to code another engineer owns is ``xfail(strict=True)`` with
the reason: it starts passing, and then fails loudly, the day the fix lands, so the marker gets
removed. `fuzzlib.known_k7` lets the fuzzer step over exactly that case meanwhile, so that it
keeps looking for new ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import AnynumError, FormatError, RepresentabilityError


@pytest.mark.parametrize(
    "fmt,dtype,mode",
    [
        (an.FloatFormat(9, 0), torch.float16, "nearest"),
        (an.FloatFormat(9, 0), torch.bfloat16, "nearest"),
        (an.FloatFormat(9, 23), torch.float32, "sr"),  # the C loop does not do SR: eager runs
    ],
)
def test_k1_wide_format_on_narrower_input(fmt, dtype, mode):
    """K1: a format whose max exceeds float32's raised RuntimeError ('value cannot be converted to
    type float without overflow') on half-precision inputs, and on float32 off the C loop."""
    try:
        y = an.quantize(torch.tensor([1.0, -3.0], dtype=dtype), fmt, mode, seed=0)
    except RepresentabilityError:
        assert dtype != torch.float32  # half precision cannot hold such a format's values: refused
        return
    assert y.tolist() == [1.0, -3.0]


@pytest.mark.parametrize(
    "fmt,dtype,overflow,x",
    [
        (an.FP64, torch.float32, "saturate", [float("inf"), -float("inf")]),
        (an.format("uint16"), torch.float16, "saturate", [float("inf")]),
        (an.format("uint16"), torch.float16, "wrap", [-1.0]),  # wrapped to 65535: float16 inf
    ],
)
def test_k2_results_beyond_the_input_dtype_are_refused(fmt, dtype, overflow, x):
    """K2: saturate (±inf -> ±max) and wrap gave ±inf where fmt.max exceeds the input dtype."""
    with pytest.raises(RepresentabilityError, match="cannot hold"):
        an.quantize(torch.tensor(x, dtype=dtype), fmt, overflow=overflow)


def test_k2_overflow_nan_of_inf_is_nan():
    fmt = an.FloatFormat(8, 23, subnormals=False, specials="fn", signed=False, zero=False)
    assert torch.isnan(an.quantize(torch.tensor([float("inf")]), fmt, overflow="nan")).all()


def test_k3_fp64_codes_round_trip():
    """K3: encode gave negative int64 codes for negative fp64 values, which decode refused."""
    x = torch.tensor([-0.0, -1.5, 2.0], dtype=torch.float64)
    back = an.decode(an.encode(x, an.FP64), an.FP64)
    assert torch.equal(back, x) and bool(torch.signbit(back[0]))


@pytest.mark.parametrize(
    "params",
    [
        {
            "exp_bits": 1,
            "man_bits": 0,
            "bias": 0,
            "subnormals": False,
            "zero": False,
            "signed": False,
            "specials": "p3109",
        },  # K4: codes +inf and NaN only
        {
            "exp_bits": 1,
            "man_bits": 0,
            "bias": 1,
            "subnormals": False,
            "specials": "fnuz",
            "zero": False,
        },  # K6
        {"exp_bits": 2, "man_bits": 1, "subnormals": False, "specials": "fnuz", "zero": False},  # K6
    ],
)
def test_k4_k6_formats_that_lose_values_are_refused(params):
    """K4: a format without finite values was accepted (max 0.5, results off its empty grid).
    K6: fnuz without zero put NaN on -smallest's code, yet quantize returned -smallest."""
    with pytest.raises(FormatError):
        an.FloatFormat(**params)


def test_k5_fnuz_without_subnormals_decodes_no_negative_zero():
    """K5: negative flushed subnormals of a format without -0 decoded to -0.0."""
    fmt = an.FloatFormat(1, 1, subnormals=False, specials="fnuz")
    values = an.decode(torch.arange(8), fmt)
    zeros = values[values == 0]
    assert zeros.numel() and not bool(torch.signbit(zeros).any()), values.tolist()


def test_table_rz_across_a_gap_that_straddles_zero_is_monotone():
    """Found by the fuzzer (seed 4007): a table without 0 rounded -1.0 under "rz" to the positive
    neighbour and 0.0 to the negative one (the nearer), so RZ was not monotone and flipped signs.
    Fixed in the table kernel: across that gap RZ keeps x's sign, as float formats without zero do."""
    tab = an.Table(np.linspace(-601.0, 11924.0, 4096))
    x = torch.tensor([-1.0, -0.0, 0.0, 1.0], dtype=torch.float64)
    y = an.quantize(x, tab, "rz")
    assert torch.equal(torch.signbit(y), torch.signbit(x)) and bool((y[1:] >= y[:-1]).all()), y.tolist()
    zeroless = an.FloatFormat(3, 2, subnormals=False, zero=False, specials="none")
    assert torch.equal(an.quantize(x, an.Table(zeroless.values()), "rz"), an.quantize(x, zeroless, "rz"))


@pytest.mark.xfail(
    strict=True,
    reason="K7: overflow='wrap' of fixed point and integers is wrong for large inputs: IntFormat(8) "
    "wraps 2**60, 2**100 and 1e300 (float64) to -128 instead of 0, and FixedPoint/IntFormat inputs "
    "whose x / step overflows the float32 working dtype (3e38) give NaN; the exact wrap is "
    "(round(x / step) mod 2**bits) in two's complement; on float32 inputs already from |x| / step "
    ">= 2**24 (IntFormat(2) wraps 16777215 to -2, not -1) (src/anynum/kernels/eager.py, uniform rounding)",
)
@pytest.mark.parametrize(
    "fmt,x,dtype",
    [
        (an.IntFormat(8), 2.0**60, torch.float64),
        (an.IntFormat(8), 1e300, torch.float64),
        (an.FixedPoint(8, 4), 3e38, torch.float32),
        (an.FixedPoint(0, 1, signed=False), 3.4028234663852886e38, torch.float32),
        (an.IntFormat(2), 16777215.0, torch.float32),  # 2**24 - 1: wraps to -1
    ],
)
def test_k7_wrap_of_large_values(fmt, x, dtype):
    try:
        y = an.quantize(torch.tensor([x], dtype=dtype), fmt, overflow="wrap")
    except AnynumError:
        return  # refusing inputs beyond the exact range is a fix too
    assert y.item() == (-1.0 if x == 16777215.0 else 0.0)  # the others are multiples of 2**bits * step
