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
    reason="K1: check_representable/apply_overflow convert fmt.max to float32 for float16/bfloat16 "
    "inputs; a format whose max exceeds float32's (exp_bits >= 9) raises RuntimeError "
    "'value cannot be converted to type float without overflow' instead of an AnynumError "
    "or a result (src/anynum/quantize.py, src/anynum/kernels/eager.py)",
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_k1_wide_format_on_half_precision_input(dtype):
    fmt = an.FloatFormat(9, 0)  # max 2**255
    try:
        y = an.quantize(torch.tensor([1.0, -3.0], dtype=dtype), fmt)
    except AnynumError:
        return  # a clear refusal is an acceptable fix too
    assert y.tolist() == [1.0, -4.0]


@pytest.mark.xfail(
    strict=True,
    reason="K2: overflow='saturate' maps ±inf to ±fmt.max, and when fmt.max exceeds the input "
    "dtype's range (fp64 on float32, e.g.) the result is cast back to ±inf: neither the "
    "documented ±max nor an error (src/anynum/kernels/eager.py apply_overflow, quantize.py)",
)
@pytest.mark.parametrize("fmt,dtype", [(an.FP64, torch.float32), (an.format("uint16"), torch.float16)])
def test_k2_saturate_of_inf_into_a_wider_format(fmt, dtype):
    """Also: encode then turns that ±inf into a wrong code (0 for uint16) instead of raising."""
    x = torch.tensor([float("inf"), -float("inf")], dtype=dtype)
    try:
        y = an.quantize(x, fmt, overflow="saturate")
    except AnynumError:
        return  # refusing is a fix too
    assert bool(torch.isfinite(y).all()), y  # e.g. the largest fp64 value held by float32 is its max


@pytest.mark.xfail(
    strict=True,
    raises=AnynumError,
    reason="K3: 64-bit formats' codes do not fit int64: encode returns the bit pattern of a negative "
    "value as a negative int64, which decode then refuses ('codes ... lie in [0, 2**64)'); "
    "decode(encode(x)) fails for every negative fp64 value and -0.0 "
    "(src/anynum/formats/floating.py, src/anynum/quantize.py decode)",
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
