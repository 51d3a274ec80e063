"""Every bad input of DESIGN.md §5 raises an AnynumError that names what was expected,
what was received, and (where there is one) the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an


def _raises(match: str):
    return pytest.raises(an.AnynumError, match=match)


def test_error_is_value_and_type_error():
    assert issubclass(an.AnynumError, ValueError) and issubclass(an.AnynumError, TypeError)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_tensor(dtype):
    with _raises(r"float16, bfloat16, float32 or float64 tensor.*integer.*x\.float\(\)"):
        an.quantize(torch.zeros(3, dtype=dtype), an.FP16)


def test_complex_tensor():
    with _raises(r"complex tensor of dtype torch\.complex64"):
        an.quantize(torch.zeros(3, dtype=torch.complex64), an.FP16)


def test_integer_and_complex_numpy():
    with _raises(r"float16/float32/float64 NumPy array, got dtype int64.*astype"):
        an.quantize(np.arange(3), an.FP16)
    with _raises(r"got dtype complex128"):
        an.quantize(np.zeros(2, dtype=np.complex128), an.FP16)


def test_unsupported_container():
    with _raises(r"torch tensors and NumPy arrays, got builtins\.list"):
        an.quantize([1.0, 2.0], an.FP16)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"exp_bits": 0, "man_bits": 3}, r"exp_bits must be an integer in 1\.\.11, got 0"),
    ({"exp_bits": 12, "man_bits": 3}, r"exp_bits must be an integer in 1\.\.11, got 12"),
    ({"exp_bits": 4, "man_bits": 60}, r"man_bits must be an integer in 0\.\.52, got 60"),
    ({"exp_bits": 4, "man_bits": -1}, r"man_bits must be an integer in 0\.\.52, got -1"),
    ({"exp_bits": 4.0, "man_bits": 3}, r"exp_bits must be an integer"),
    ({"exp_bits": 4, "man_bits": 3, "specials": "ocp"}, r"specials must be one of .*'ocp'"),
    ({"exp_bits": 4, "man_bits": 3, "specials": "fnuz", "signed": False}, r"fnuz.*signed"),
    ({"exp_bits": 1, "man_bits": 3, "specials": "ieee"}, r"ieee.*exp_bits >= 2"),
    ({"exp_bits": 4, "man_bits": 3, "zero": False}, r"zero=False needs subnormals=False"),
    ({"exp_bits": 11, "man_bits": 52, "bias": 900}, r"float64"),
    ({"exp_bits": 4, "man_bits": 3, "bias": 1.5}, r"bias must be an integer"),
])
def test_bad_float_format_parameters(kwargs, match):
    with _raises(match):
        an.FloatFormat(**kwargs)


def test_bad_fixed_and_int_parameters():
    with _raises(r"1\.\.53 bits"):
        an.FixedPoint(40, 20)
    with _raises(r"integer int_bits and frac_bits"):
        an.FixedPoint(4.5, 3)
    with _raises(r"overflow must be one of \('saturate', 'wrap'\), got 'inf'"):
        an.FixedPoint(4, 3, overflow="inf")
    with _raises(r"1\.\.53 bits"):
        an.IntFormat(0)
    with _raises(r"bits must be an integer"):
        an.IntFormat(True)


def test_bad_p3109():
    with _raises(r"P3109 needs integers k >= 2 and 1 <= p < k"):
        an.formats.p3109(8, 8)
    with _raises(r"domain must be 'extended' or 'finite', got 'infinite'"):
        an.formats.p3109(8, 3, domain="infinite")


def test_unknown_rounding_name():
    with _raises(r"unknown rounding mode 'nearst'.*Did you mean 'nearest'"):
        an.quantize(torch.ones(2), an.FP16, "nearst")
    with _raises(r"unknown rounding mode 'banana'"):
        an.Rounding.parse("banana")
    with _raises(r"unknown rounding mode 3"):
        an.quantize(torch.ones(2), an.FP16, 3)


@pytest.mark.parametrize("bad", [0, 53, -1])
def test_rand_bits_out_of_range(bad):
    with _raises(rf"rand_bits must be in 1\.\.52.*got {bad}"):
        an.quantize(torch.ones(2), an.E4M3FN, "sr", rand_bits=bad, seed=0)


def test_rand_bits_wrong_type_or_mode():
    with _raises(r"rand_bits must be an integer in 1\.\.52 or None, got 2\.5"):
        an.quantize(torch.ones(2), an.E4M3FN, "sr", rand_bits=2.5, seed=0)
    with _raises(r"rand_bits applies to rounding='stochastic' only, not NEAREST_EVEN"):
        an.quantize(torch.ones(2), an.E4M3FN, "nearest", rand_bits=4)


def test_unknown_format_name_suggests():
    with _raises(r"unknown format 'e4m3fm'\. Did you mean 'e4m3fn'"):
        an.format("e4m3fm")
    with _raises(r"unknown format 'bfloat61'.*Did you mean 'bfloat16'"):
        an.quantize(torch.ones(2), "bfloat61")
    with _raises(r"a format name must be a string or Format, got int"):
        an.format(8)


def test_generator_on_another_device_type():
    x = torch.empty(3, device="meta")
    with _raises(r"generator is on cpu but the tensor is on meta.*torch\.Generator\(device='meta'\)"):
        an.quantize(x, an.E4M3FN, "sr", generator=torch.Generator())


def test_generator_and_seed_together():
    with _raises(r"either generator= or seed=, not both"):
        an.quantize(torch.ones(2), an.E4M3FN, "sr", generator=torch.Generator(), seed=1)


def test_bad_generator_or_seed():
    with _raises(r"generator must be a torch\.Generator or numpy\.random\.Generator, got int"):
        an.quantize(torch.ones(2), an.E4M3FN, "sr", generator=5)
    with _raises(r"seed must be an int, got 'a'"):
        an.quantize(torch.ones(2), an.E4M3FN, "sr", seed="a")


@pytest.mark.parametrize(("fmt", "overflow", "match"), [
    (an.E4M3FN, "inf", r"overflow='inf' needs a format with infinities.*saturate"),
    (an.E2M1, "nan", r"overflow='nan' needs a format with a NaN code.*saturate"),
    (an.E2M1, "inf", r"overflow='inf' needs a format with infinities"),
    (an.FP16, "wrap", r"overflow='wrap' is not a policy of FP16.*\('saturate', 'inf', 'nan'\)"),
    (an.FP16, "clamp", r"overflow='clamp' is not a policy"),
    (an.IntFormat(8), "inf", r"overflow='inf' is not a policy of IntFormat\(8\).*\('saturate', 'wrap'\)"),
])
def test_bad_overflow_policy_for_the_format(fmt, overflow, match):
    with _raises(match):
        an.quantize(torch.ones(2), fmt, overflow=overflow)


def test_decode_bad_codes():
    with _raises(r"codes of e4m3fn lie in \[0, 2\*\*8\)"):
        an.decode(torch.tensor([256]), an.E4M3FN)
    with _raises(r"codes of e4m3fn lie in \[0, 2\*\*8\)"):
        an.decode(np.array([-1]), an.E4M3FN)
    with _raises(r"decode needs integer codes, got dtype float64"):
        an.decode(np.array([1.0]), an.E4M3FN)
    with _raises(r"decode needs integer codes, got dtype torch\.float32"):
        an.decode(torch.tensor([1.0]), an.E4M3FN)


def test_encode_nan_without_nan_code():
    with _raises(r"no NaN code"):
        an.encode(torch.tensor([float("nan")]), an.IntFormat(8))


def test_values_of_wide_format():
    with _raises(r"values\(\) enumerates formats of at most 16 bits.*32"):
        an.FP32.values()


def test_out_mismatch():
    with _raises(r"out= must be a tensor of the input's shape, dtype and device"):
        an.quantize(torch.ones(2), an.FP16, out=torch.ones(3))


def test_representability():
    with _raises(r"cannot hold exactly.*x\.float\(\)"):
        an.quantize(torch.ones(2, dtype=torch.float16), an.BF16)
