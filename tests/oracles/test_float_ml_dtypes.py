"""Round-to-nearest-even agrees bit for bit with ml_dtypes casts (and NumPy's float16 cast).

Oracle facts (checked here, see PEERS.md): ml_dtypes only rounds to nearest even,
and casts from float64 round twice (through float32), so the oracle is fed
float32 values (and float16/bfloat16 tensors). Known, intended differences are
masked out here and tested against exact arithmetic in test_float_exact.py:

* overflow: ml_dtypes gives NaN for e4m3fn and the fnuz types (our
  ``overflow="nan"``), inf for IEEE-like types (our default), and clamps float6/4
  (our default "saturate");
* float6/float4 have no NaN: ml_dtypes turns NaN into ∓0, we pass NaN through;
* E8M0: ml_dtypes maps ±0, ±inf and overflowing ties to NaN and every input in
  [2**-127, 2**-126) to 2**-126; we saturate and round to the nearest value.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import anynum as an

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

F4, F6, F8 = 4, 6, 8

# (ml_dtypes type, our format, overflow policy matching ml_dtypes, NaN handled like ml_dtypes)
CASES = [
    (ml_dtypes.float8_e5m2, an.E5M2, "inf", True),
    (ml_dtypes.float8_e4m3, an.E4M3, "inf", True),
    (ml_dtypes.float8_e3m4, an.E3M4, "inf", True),
    (ml_dtypes.float8_e4m3fn, an.E4M3FN, "nan", True),
    (ml_dtypes.float8_e4m3fnuz, an.E4M3FNUZ, "nan", True),
    (ml_dtypes.float8_e5m2fnuz, an.E5M2FNUZ, "nan", True),
    (ml_dtypes.float8_e4m3b11fnuz, an.FloatFormat(4, 3, bias=11, specials="fnuz"), "nan", True),
    (ml_dtypes.float6_e3m2fn, an.E3M2, "saturate", False),
    (ml_dtypes.float6_e2m3fn, an.E2M3, "saturate", False),
    (ml_dtypes.float4_e2m1fn, an.E2M1, "saturate", False),
    (ml_dtypes.float8_e8m0fnu, an.E8M0, "saturate", True),
    (ml_dtypes.bfloat16, an.BF16, "inf", True),
    (np.float16, an.FP16, "inf", True),
]
IDS = [np.dtype(c[0]).name for c in CASES]

# Same-format aliases of the presets: Pychop's q43/q52 are the IEEE-like e4m3/e5m2.
ALIASES = [(ml_dtypes.float8_e4m3, an.format("q43")), (ml_dtypes.float8_e5m2, an.format("q52"))]


def _ml_grid(mltype) -> tuple[np.ndarray, float]:
    """Finite values of an ml_dtypes type (by enumerating codes) and its top-binade step."""
    nbits = 16 if np.dtype(mltype).itemsize == 2 else 8
    codes = np.arange(1 << nbits, dtype=np.uint16 if nbits == 16 else np.uint8)
    vals = codes.view(mltype).astype(np.float64)
    if nbits == 8:  # sub-byte types: only the low bits are meaningful codes
        width = {"float6": F6, "float4": F4}.get(np.dtype(mltype).name[:6], F8)
        vals = vals[: 1 << width]
    vals = np.unique(vals[np.isfinite(vals)])
    fi = ml_dtypes.finfo(mltype)
    vmax = float(fi.max)
    top_step = 2.0 ** (math.floor(math.log2(vmax)) - int(fi.nmant))
    return vals, top_step


def _all_16bit(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype)


def _inputs(mltype, probe_points, random_values) -> np.ndarray:
    grid, top = _ml_grid(mltype)
    parts = [
        probe_points(grid, top_step=top)["float32"],
        _all_16bit(torch.float16).float().numpy(),
        _all_16bit(torch.bfloat16).float().numpy(),
        random_values(20000, np.float32, seed=1),
        random_values(5000, np.float32, seed=2, lo_exp=-20, hi_exp=20),
    ]
    return np.concatenate(parts).astype(np.float32)


def _mask(fmt, x: np.ndarray, nan_like_ml: bool) -> np.ndarray:
    """Inputs where ml_dtypes is meant to agree with us (see the module docstring)."""
    keep = np.ones(x.shape, dtype=bool)
    if not nan_like_ml:
        keep &= ~np.isnan(x)
    if fmt == an.E8M0:
        a = np.abs(x.astype(np.float64))
        keep &= (x > 0) & (a < 2.0**128) & ~((a >= 2.0**-127) & (a < 2.0**-126))
        keep &= a < 1.5 * 2.0**127  # ties at the top overflow to NaN in ml_dtypes
    return keep


def _ml_round(x32: np.ndarray, mltype) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x32.astype(mltype).astype(np.float64)


@pytest.mark.parametrize(("mltype", "fmt", "overflow", "nan_like_ml"), CASES, ids=IDS)
def test_rne_matches_ml_dtypes_float32(mltype, fmt, overflow, nan_like_ml, probe_points,
                                       random_values, same_values):
    x = _inputs(mltype, probe_points, random_values)
    keep = _mask(fmt, x, nan_like_ml)
    x = x[keep]
    want = _ml_round(x, mltype)
    got = an.quantize(torch.from_numpy(x), fmt, "nearest", overflow=overflow)
    assert got.dtype == torch.float32
    same_values(got.numpy(), want, x, what=f"{fmt} on float32 tensors")
    # the NumPy front door gives the same bits
    got_np = an.quantize(x, fmt, "rne", overflow=overflow)
    assert isinstance(got_np, np.ndarray) and got_np.dtype == np.float32
    same_values(got_np, want, x, what=f"{fmt} on float32 arrays")
    # float64 tensors holding the same (float32) values
    got64 = an.quantize(torch.from_numpy(x.astype(np.float64)), fmt, overflow=overflow)
    same_values(got64.numpy(), want, x, what=f"{fmt} on float64 tensors")


@pytest.mark.parametrize(("mltype", "fmt"), ALIASES, ids=["q43", "q52"])
def test_pychop_aliases_match_ml_dtypes(mltype, fmt, probe_points, same_values):
    x = probe_points(_ml_grid(mltype)[0], top_step=_ml_grid(mltype)[1])["float32"]
    same_values(an.quantize(x, fmt).astype(np.float64), _ml_round(x, mltype), x, what=str(fmt))


@pytest.mark.parametrize(("mltype", "fmt", "overflow", "nan_like_ml"), CASES, ids=IDS)
def test_encode_matches_ml_dtypes_codes(mltype, fmt, overflow, nan_like_ml, probe_points):
    """encode() gives the bit pattern ml_dtypes stores (NaN: any NaN code of the format)."""
    grid, top = _ml_grid(mltype)
    x = probe_points(grid, top_step=top)["float32"]
    x = x[_mask(fmt, x, nan_like_ml) & ~np.isnan(x)]
    with np.errstate(over="ignore", invalid="ignore"):
        ml = x.astype(mltype)
    want = ml.view(np.uint16 if ml.itemsize == 2 else np.uint8).astype(np.int64)
    got = an.encode(x, fmt, overflow=overflow)
    isnan = np.isnan(ml.astype(np.float64))
    bad = (got != want) & ~isnan
    assert not bad.any(), list(zip(x[bad][:5], want[bad][:5], got[bad][:5], strict=True))
    # NaN results must carry a NaN code
    assert np.isnan(an.decode(got[isnan], fmt)).all()


SMALL = [c for c in CASES if c[1].bits <= 8]


@pytest.mark.parametrize("tdtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize(("mltype", "fmt", "overflow", "nan_like_ml"), SMALL,
                         ids=[np.dtype(c[0]).name for c in SMALL])
def test_every_16bit_pattern_in_native_dtype(tdtype, mltype, fmt, overflow, nan_like_ml,
                                             same_values):
    """Every float16/bfloat16 bit pattern, quantized in its own dtype, vs ml_dtypes."""
    x = _all_16bit(tdtype)
    x32 = x.float().numpy()
    if fmt == an.E8M0 and tdtype == torch.float16:
        # E8M0's 2**-127 (the result for 0) and 2**16 are no float16 values: refusing is the contract
        with pytest.raises(an.AnynumError, match="cannot hold exactly"):
            an.quantize(x, fmt, overflow=overflow)
        return
    want = _ml_round(x32, mltype)
    got = an.quantize(x, fmt, overflow=overflow)
    assert got.dtype == tdtype
    keep = _mask(fmt, x32, nan_like_ml)
    same_values(got.float().numpy()[keep], want[keep], x32[keep], what=f"{fmt} on {tdtype}")


def test_fp16_float64_inputs_match_numpy_direct_cast(random_values, probe_points, same_values):
    """NumPy's float64 -> float16 cast rounds once (unlike ml_dtypes): a float64 RNE oracle."""
    grid = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    x = np.concatenate([
        probe_points(grid[np.isfinite(grid)], top_step=32.0)["float64"],
        random_values(20000, np.float64, seed=3, lo_exp=-30, hi_exp=20),
    ])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float64)
    same_values(an.quantize(x, an.FP16), want, x, what="FP16 on float64")
    same_values(an.quantize(torch.from_numpy(x), "fp16").numpy(), want, x, what="FP16 tensors")
