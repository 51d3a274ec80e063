"""Round-to-nearest-even agrees bit for bit with native torch casts.

Oracle facts (checked here): every torch cast from float64 to a narrower float
(float16, bfloat16 and the float8 types) rounds twice, through float32, so the
oracle is fed float32 values only (float64 inputs are checked against NumPy's
float16 cast and gfloat). In torch 2.13 the eager
e4m3fn cast saturates (even inf -> 448), e5m2 overflows to inf, the fnuz casts
give NaN; those match our overflow policies "saturate", "inf", "nan". The
float8_e8m0fnu cast drops the sign of negative inputs, sends inf and
overflowing ties to NaN and rounds float32 subnormals in (2**-127, 2**-126) up
to 2**-126: those inputs are masked here and tested exactly in test_float_exact.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

F8_CASES = [
    (torch.float8_e5m2, an.E5M2, "inf"),
    (torch.float8_e4m3fn, an.E4M3FN, "saturate"),
    (torch.float8_e4m3fnuz, an.E4M3FNUZ, "nan"),
    (torch.float8_e5m2fnuz, an.E5M2FNUZ, "nan"),
    (torch.float8_e8m0fnu, an.E8M0, "saturate"),
]
WIDE_CASES = [(torch.float16, an.FP16, "inf"), (torch.bfloat16, an.BF16, "inf")]


def _torch_grid(tdtype: torch.dtype) -> np.ndarray:
    n = 16 if tdtype in (torch.float16, torch.bfloat16) else 8
    codes = torch.arange(1 << n, dtype=torch.int64)
    codes = codes.to(torch.int16 if n == 16 else torch.uint8)
    vals = codes.view(tdtype).double().numpy()
    return np.unique(vals[np.isfinite(vals)])


def _top_step(grid: np.ndarray, fmt) -> float:
    return 2.0 ** (np.floor(np.log2(grid[-1])) - fmt.man_bits)


def _all_16bit(dtype: torch.dtype) -> np.ndarray:
    return torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype).double().numpy()


def _e8m0_keep(x: np.ndarray) -> np.ndarray:
    a = np.abs(x.astype(np.float64))
    return (x >= 0) & (a < 1.5 * 2.0**127) & ~((a > 2.0**-127) & (a < 2.0**-126))


@pytest.mark.parametrize(("tdtype", "fmt", "overflow"), F8_CASES, ids=[str(c[1]) for c in F8_CASES])
def test_float8_casts(tdtype, fmt, overflow, probe_points, random_values, same_values):
    grid = _torch_grid(tdtype)
    x = np.concatenate([
        probe_points(grid, top_step=_top_step(grid, fmt))["float32"],
        _all_16bit(torch.float16).astype(np.float32),
        _all_16bit(torch.bfloat16).astype(np.float32),
        random_values(20000, np.float32, seed=11),
    ]).astype(np.float32)
    if fmt == an.E8M0:
        x = x[_e8m0_keep(x)]
    xt = torch.from_numpy(x)
    want = xt.to(tdtype).double().numpy()
    got = an.quantize(xt, fmt, overflow=overflow).double().numpy()
    same_values(got, want, x, what=f"{fmt} vs torch {tdtype}")


@pytest.mark.parametrize(("tdtype", "fmt", "overflow"), WIDE_CASES, ids=["fp16", "bf16"])
def test_half_casts(tdtype, fmt, overflow, probe_points, random_values, same_values):
    grid = _torch_grid(tdtype)
    npdt, xdtype = np.float32, torch.float32
    x = np.concatenate([
        probe_points(grid, top_step=_top_step(grid, fmt))[np.dtype(npdt).name],
        _all_16bit(torch.float16).astype(npdt),
        _all_16bit(torch.bfloat16).astype(npdt),
        random_values(20000, npdt, seed=12),
        random_values(20000, npdt, seed=13, lo_exp=-30, hi_exp=20),
    ]).astype(npdt)
    xt = torch.from_numpy(x)
    want = xt.to(tdtype).double().numpy()
    got = an.quantize(xt, fmt, overflow=overflow)
    assert got.dtype == xdtype
    same_values(got.double().numpy(), want, x, what=f"{fmt} vs torch cast from {xdtype}")


def test_bf16_on_every_float16_pattern_is_refused_or_exact():
    """float16 tensors cannot hold bf16 results such as 2**16: an error, not a double rounding."""
    x = torch.from_numpy(_all_16bit(torch.float16)).half()
    with pytest.raises(an.AnynumError, match="cannot hold exactly"):
        an.quantize(x, an.BF16)


@pytest.mark.parametrize(("tdtype", "fmt"), [(torch.float16, an.FP16), (torch.bfloat16, an.BF16)],
                         ids=["fp16", "bf16"])
def test_identity_on_own_dtype(tdtype, fmt, same_values):
    """Quantizing a tensor onto its own format changes nothing, for all 65536 patterns and modes."""
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(tdtype)
    for mode in ("nearest", "rna", "rnz", "rz", "ru", "rd", "ro"):
        got = an.quantize(x, fmt, mode)
        assert torch.equal(got.view(torch.int16)[~x.isnan()], x.view(torch.int16)[~x.isnan()]), mode
        assert bool(got.isnan().eq(x.isnan()).all())
    got = an.quantize(x, fmt, "sr", seed=0)
    same_values(got.double().numpy(), x.double().numpy(), what="sr identity")


@pytest.mark.parametrize(
    ("fmt", "x", "want"),
    [
        (an.BF16, 1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-7),
        (an.FP16, 1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-10),
        (an.FP16, 2.0**-25 * (1 + 2.0**-40), 2.0**-24),
        (an.E4M3FN, 1 + 2.0**-4 + 2.0**-40, 1.125),
        (an.E5M2, -(1 + 2.0**-3 + 2.0**-45), -1.25),
    ],
)
def test_float64_inputs_round_once(fmt, x, want):
    """Just above a midpoint: one rounding goes up; torch's float64 casts (via float32) tie to even."""
    got = an.quantize(torch.tensor([x], dtype=torch.float64), fmt)
    assert got.item() == want
