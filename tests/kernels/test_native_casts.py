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


@pytest.mark.parametrize(
    ("fmt", "overflow"),
    [
        (an.FP16, "inf"),
        (an.BF16, "inf"),
        (an.E4M3FN, "saturate"),
        (an.E5M2, "inf"),
        (an.E4M3FNUZ, "nan"),
        (an.E5M2FNUZ, "nan"),
    ],
    ids=repr,
)
def test_native_cast_equals_reference_kernel(
    fmt: an.Format, overflow: str, float32_probe: torch.Tensor
) -> None:
    x = float32_probe
    native = native_cast_dtype(fmt, Rounding.NEAREST_EVEN, overflow, x)
    assert native is not None
    ref = round_to_format(fmt, x, Rounding.NEAREST_EVEN, overflow, None, None)
    assert _bits_equal(x.to(native).float(), ref)
    assert _bits_equal(an.quantize(x, fmt, overflow=overflow), ref)


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
