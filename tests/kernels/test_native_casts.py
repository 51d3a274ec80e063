"""The native-cast shortcut equals the reference kernel bit for bit wherever it is used."""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.kernels import round_to_format
from anynum.kernels.native import native_cast_dtype
from anynum.rounding import Rounding


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))
    return bool(same.all())


_PAIRS = [
    (an.FP16, "inf", "float16"),
    (an.BF16, "inf", "bfloat16"),
    (an.FP16, "saturate", "float16"),
    (an.BF16, "nan", "bfloat16"),
    (an.E4M3FN, "saturate", "float8_e4m3fn"),
    (an.E4M3FN, "nan", "float8_e4m3fn"),
    (an.E5M2, "inf", "float8_e5m2"),
    (an.E5M2, "saturate", "float8_e5m2"),
    (an.E4M3FNUZ, "nan", "float8_e4m3fnuz"),
    (an.E4M3FNUZ, "saturate", "float8_e4m3fnuz"),
    (an.E5M2FNUZ, "nan", "float8_e5m2fnuz"),
]


@pytest.mark.parametrize(("fmt", "overflow", "name"), _PAIRS, ids=repr)
def test_shortcut_used_exactly_where_the_cast_is_the_rounding(
    fmt: an.Format, overflow: str, name: str, float32_probe: torch.Tensor
) -> None:
    """The runtime probe's decision equals the truth on the larger test probe (random bits included).

    What torch's float8 casts do with overflow changed between versions (2.11 sends e4m3fn
    overflow to NaN, 2.13 saturates), so which pairs take the shortcut is not fixed here.
    """
    native = getattr(torch, name, None)
    if native is None:
        pytest.skip(f"torch has no {name}")
    x = float32_probe
    ref = round_to_format(fmt, x, Rounding.NEAREST_EVEN, overflow, None, None)
    cast_is_rounding = _bits_equal(x.to(native).float(), ref)
    assert (native_cast_dtype(fmt, Rounding.NEAREST_EVEN, overflow, x) == native) == cast_is_rounding
    assert _bits_equal(an.quantize(x, fmt, overflow=overflow), ref)
    assert _bits_equal(an.quantize(x[:100], fmt, overflow=overflow), ref[:100])  # below compiled sizes


@pytest.mark.parametrize("fmt", [an.FP16, an.BF16], ids=repr)
def test_ieee_half_casts_take_the_shortcut(fmt: an.Format) -> None:
    """torch's float16/bfloat16 casts are IEEE round-to-nearest-even with overflow to inf."""
    assert native_cast_dtype(fmt, Rounding.NEAREST_EVEN, "inf", torch.ones(2)) is not None


def test_shortcut_not_used_where_it_would_differ() -> None:
    x32 = torch.ones(3)
    assert native_cast_dtype(an.FP16, Rounding.NEAREST_EVEN, "saturate", x32) is None
    assert native_cast_dtype(an.BF16, Rounding.TOWARD_ZERO, "inf", x32) is None
    # torch casts float64 through float32: double rounding, so no shortcut
    assert native_cast_dtype(an.FP16, Rounding.NEAREST_EVEN, "inf", x32.double()) is None
    assert an.quantize(torch.tensor([1e6]), an.FP16, overflow="saturate").item() == 65504.0
    x = torch.tensor([1 + 2.0**-11 + 2.0**-40], dtype=torch.float64)
    assert an.quantize(x, an.FP16).item() == 1 + 2.0**-10


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"])
def test_float8_fast_widening_equals_torch(name: str, float32_probe: torch.Tensor) -> None:
    from anynum.kernels.native import _FAST_WIDEN_MIN, native_round_trip

    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"torch has no {name}")
    every_code = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
    probe = float32_probe

    def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:  # NaN payloads included
        return torch.equal(a.view(torch.int32), b.view(torch.int32))

    # torch's own element-by-element widening is the oracle, on both sides of the size switch
    for x in (probe, torch.cat([every_code] * 9), every_code, probe[: _FAST_WIDEN_MIN - 1]):
        want = x.to(dtype).to(torch.float32)
        assert same_bits(native_round_trip(x, dtype), want)
        out = torch.empty_like(x)
        assert native_round_trip(x, dtype, out) is out and same_bits(out, want)
        strided = torch.empty(x.numel(), 2)[:, 0]
        native_round_trip(x, dtype, strided)
        assert same_bits(strided.contiguous(), want)
    assert every_code.numel() * 9 >= _FAST_WIDEN_MIN
