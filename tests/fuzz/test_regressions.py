"""What the differential fuzzer found, kept as regression examples.

K1-K9 were fixed in the core (formats, kernels, quantize); their examples stay here as plain
tests, each with the finding's description.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import FormatError, RepresentabilityError


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
        {
            "exp_bits": 1,
            "man_bits": 1,
            "bias": 1,
            "subnormals": False,
            "specials": "p3109",
            "signed": False,
        },  # K8: finite codes 0 and 1 only, both in exponent field 0 (zero without subnormals)
    ],
)
def test_k4_k6_formats_that_lose_values_are_refused(params):
    """K4: a format without finite values was accepted (max 0.5, results off its empty grid).
    K6: fnuz without zero put NaN on -smallest's code, yet quantize returned -smallest.
    K8: a format whose finite codes all lie in exponent field 0 without subnormals (so all are
    zero) reported max 0.5 and rounded every input to 0.5, off its grid {0}."""
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
    """K7: overflow='wrap' of fixed point and integers was wrong for large inputs: IntFormat(8)
    wrapped 2**60 and 1e300 (float64) to -128 instead of 0 (`r - code_min` lost the low digits),
    inputs whose x / step overflowed the float32 working dtype gave NaN, and on float32 inputs
    from |x| / step >= 2**24 (IntFormat(2) wrapped 16777215 to -2, not -1). The exact wrap is
    round(x / step) mod 2**bits in two's complement."""
    y = an.quantize(torch.tensor([x], dtype=dtype), fmt, overflow="wrap")
    assert y.item() == (-1.0 if x == 16777215.0 else 0.0)  # the others are multiples of 2**bits * step


@pytest.mark.parametrize("mode", ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k7_wrap_equals_exact_modular_arithmetic(mode, dtype):
    """Huge, tiny and tie inputs of every binade, against round(x / step) mod 2**bits in fractions."""
    from fuzzlib import exact_wrap

    from anynum.rounding import parse_rounding

    g = torch.Generator().manual_seed(7)
    mant = torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1
    top = 127 if dtype == torch.float32 else 1000
    x = (mant * torch.exp2(torch.randint(-8, top, (4000,), generator=g).double())).to(dtype)
    x = torch.cat([x, torch.tensor([2.5, -2.5, 3.5, 127.5, -128.5, 255.5], dtype=dtype)])
    for fmt in (an.IntFormat(8), an.IntFormat(2), an.FixedPoint(8, 4), an.FixedPoint(3, 5, signed=False)):
        y = an.quantize(x, fmt, mode, overflow="wrap")
        want = [exact_wrap(fmt, parse_rounding(mode), v) for v in x.tolist()]
        assert y.tolist() == want, fmt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # float16 cannot hold its scales: refused
def test_k9_block_saturation_stays_within_the_dtype(dtype):
    """K9: Block(E2M1, scale_rule='ceil') rounded float32's largest value to inf under
    overflow='saturate': the scale 2**126 (amax / 6 rounded up) times the nearest element, 4,
    is 2**128, beyond float32. Saturation now keeps the largest block value the dtype holds
    below x (the element rounded toward zero), which is on the block's grid."""
    fmt = an.Block(an.E2M1, block_size=None, scale_rule="ceil")
    big = torch.finfo(dtype).max
    x = torch.tensor([big, 1.0, -big], dtype=dtype)
    y = an.quantize(x, fmt)
    assert bool(torch.isfinite(y).all()), y.tolist()
    codes = an.encode(x, fmt)
    assert torch.equal(an.decode(codes, fmt).to(dtype), y)  # on the grid: a code decodes to it
    # the largest grid value of that block below |x|: element 3 (toward zero from 3.99..)
    scale = float(an.decode(codes, fmt)[0]) / 3.0
    assert y[0].item() == 3.0 * scale <= big and y[2].item() == -y[0].item()
    # float64 holds 4 * 2**126 (float32's max rounds up to it): nearest, as before
    assert an.quantize(x.double(), fmt)[0].item() == 4.0 * scale
