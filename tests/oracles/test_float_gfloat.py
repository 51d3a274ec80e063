"""Every deterministic rounding mode gfloat implements agrees with gfloat's round_ndarray.

gfloat 0.5.2 modes: TowardZero, TowardNegative, TowardPositive, TiesToEven,
TiesToAway (stochastic variants: see test_stochastic.py). Its ``sat=True`` is our
``overflow="saturate"``; ``sat=False`` is our "inf" (formats with infinities) or
"nan" (formats with NaN but no infinity), both following IEEE 754's direction
rules. Known gaps of gfloat, tested against exact arithmetic instead
(test_float_exact.py): formats without zero (E8M0), ``subnormals=False`` (gfloat
does not flush), negative inputs to unsigned formats (passed through), and ties
in precision-1 formats (gfloat ties to the even *code*, we to the even
significand, i.e. up).
"""

from __future__ import annotations

import gfloat
import numpy as np
import pytest
import torch
from gfloat.formats import format_info_p3109

import anynum as an

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

MODES = {
    gfloat.RoundMode.TowardZero: "rz",
    gfloat.RoundMode.TowardNegative: "rd",
    gfloat.RoundMode.TowardPositive: "ru",
    gfloat.RoundMode.TiesToEven: "nearest",
    gfloat.RoundMode.TiesToAway: "rna",
}


def gfloat_info(fmt: an.FloatFormat) -> gfloat.FormatInfo:
    """gfloat's description of a FloatFormat, from the layout rules of each `specials` kind."""
    if fmt.specials == "p3109":
        sign = gfloat.Signedness.Signed if fmt.signed else gfloat.Signedness.Unsigned
        fi = format_info_p3109(fmt.bits, fmt.man_bits + 1, sign, gfloat.Domain.Extended)
        assert fi.bias == fmt.bias
        return fi
    high_nans, domain, nz = {
        "ieee": ((1 << fmt.man_bits) - 1, gfloat.Domain.Extended, True),
        "fn": (1, gfloat.Domain.Finite, True),
        "fnuz": (0, gfloat.Domain.Finite, False),
        "none": (0, gfloat.Domain.Finite, True),
    }[fmt.specials]
    return gfloat.FormatInfo(
        repr(fmt),
        k=fmt.bits,
        precision=fmt.man_bits + 1,
        bias=fmt.bias,
        is_signed=fmt.signed,
        domain=domain,
        has_nz=nz and fmt.signed,
        num_high_nans=high_nans,
        has_subnormals=fmt.subnormals,
        is_twos_complement=False,
    )


SMALL = {
    "fp16": an.FP16,
    "bf16": an.BF16,
    "e5m2": an.E5M2,
    "e4m3fn": an.E4M3FN,
    "e4m3fnuz": an.E4M3FNUZ,
    "e5m2fnuz": an.E5M2FNUZ,
    "e4m3": an.E4M3,
    "e3m4": an.E3M4,
    "e3m2": an.E3M2,
    "e2m3": an.E2M3,
    "e2m1": an.E2M1,
    "q43": an.format("q43"),
    "q52": an.format("q52"),
    "e6m9": an.FloatFormat(6, 9),
    "e3m0": an.FloatFormat(3, 0),
    "e5m2_bias10": an.FloatFormat(5, 2, bias=10),
    "e4m3b11fnuz": an.FloatFormat(4, 3, bias=11, specials="fnuz"),
    "e5m4fn": an.FloatFormat(5, 4, specials="fn"),
    "e3m1_bias0_none": an.FloatFormat(3, 1, bias=0, specials="none"),
    "e2m2_bias-1": an.FloatFormat(2, 2, bias=-1),
    **{f"p3109({k},{p})": an.formats.p3109(k, p) for k, p in
       [(8, 1), (8, 2), (8, 3), (8, 4), (8, 5), (8, 7), (6, 3), (4, 2)]},
    **{f"p3109({k},{p})f": an.formats.p3109(k, p, domain="finite") for k, p in [(8, 3), (8, 7)]},
    **{f"p3109({k},{p})u": an.formats.p3109(k, p, signed=False) for k, p in [(8, 3), (8, 4)]},
    "p3109(8,4)uf": an.formats.p3109(8, 4, signed=False, domain="finite"),
}
LARGE = {"fp32": an.FP32, "tf32": an.TF32, "e8m12": an.FloatFormat(8, 12),
         "e11m20": an.FloatFormat(11, 20), "e9m14fn": an.FloatFormat(9, 14, specials="fn")}




def _bugged(names):
    """Parameters, with the known-bug xfail on signed formats (e11m20's lowest interval lies in
    float64's subnormals, where the probe points have too few bits to trigger it)."""
    return list(names)


def _gfloat_grid(fi: gfloat.FormatInfo) -> np.ndarray:
    vals = gfloat.decode_ndarray(fi, np.arange(1 << fi.k, dtype=np.int64))
    return np.unique(vals[np.isfinite(vals)])


def _top_step(fi: gfloat.FormatInfo) -> float:
    return 2.0 ** (np.floor(np.log2(fi.max)) - (fi.precision - 1))


def _large_points(fi: gfloat.FormatInfo, seed: int) -> np.ndarray:
    """Random values of a wide format, the midpoints to their successors and the float64 neighbours."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, fi.code_of_max, 20000)
    codes = np.concatenate([codes, np.arange(0, 300), np.arange(fi.code_of_max - 300, fi.code_of_max)])
    lo = gfloat.decode_ndarray(fi, codes)
    hi = gfloat.decode_ndarray(fi, codes + 1)
    mid = lo + (hi - lo) / 2
    pts = np.concatenate([lo, mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    return np.concatenate([pts, -pts])


def _inputs(fmt, fi, probe_points, random_values):
    if fmt.bits <= 16:
        pr = probe_points(_gfloat_grid(fi), top_step=_top_step(fi))
        x32, x64 = pr["float32"], pr["float64"]
    else:
        x64 = _large_points(fi, seed=fmt.bits)
        x32 = x64.astype(np.float32)
        x32 = x32[x32 == x64]
        x64 = np.concatenate([x64, [np.nan, np.inf, -np.inf, 0.0, -0.0]])
    x32 = np.concatenate([x32, random_values(4000, np.float32, seed=21)]).astype(np.float32)
    x64 = np.concatenate([x64, random_values(4000, np.float64, seed=22, lo_exp=-300, hi_exp=300)])
    if not fmt.signed:  # gfloat passes negative inputs through unsigned formats
        x32, x64 = x32[~np.signbit(x32)], x64[~np.signbit(x64)]
    return x32, x64


def _policies(fmt):
    yield True, "saturate"
    if fmt.has_inf:
        yield False, "inf"
    elif fmt.has_nan:
        yield False, "nan"


def _check(fmt, x_list, probe_points, random_values, same_values):
    fi = gfloat_info(fmt)
    checked = 0
    for x in x_list:
        xt = torch.from_numpy(x)
        x64 = x.astype(np.float64)
        for grnd, mode in MODES.items():
            if grnd is gfloat.RoundMode.TiesToEven and fmt.man_bits == 0:
                continue  # gfloat ties to the even code (see module docstring)
            for sat, overflow in _policies(fmt):
                want = gfloat.round_ndarray(fi, x64, grnd, sat)
                got = an.quantize(xt, fmt, mode, overflow=overflow)
                assert got.dtype == xt.dtype
                same_values(got.double().numpy(), want, x64,
                            what=f"{fmt} {mode} overflow={overflow} on {x.dtype}")
                checked += x.size
    return checked


@pytest.mark.parametrize("name", _bugged(SMALL))
def test_gfloat_small_formats(name, probe_points, random_values, same_values):
    fmt = SMALL[name]
    x32, x64 = _inputs(fmt, gfloat_info(fmt), probe_points, random_values)
    inputs = [x64]
    if fmt.min_quantum_exponent() >= -149 and fmt.emax <= 127:
        inputs.append(x32)  # the format's values and midpoints fit float32
    assert _check(fmt, inputs, probe_points, random_values, same_values) > 0


@pytest.mark.parametrize("name", _bugged(LARGE))
def test_gfloat_large_formats(name, probe_points, random_values, same_values):
    fmt = LARGE[name]
    x32, x64 = _inputs(fmt, gfloat_info(fmt), probe_points, random_values)
    inputs = [x64] + ([x32] if fmt.emax <= 127 and fmt.min_quantum_exponent() >= -149 else [])
    assert _check(fmt, inputs, probe_points, random_values, same_values) > 0


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "bf16", "p3109(8,3)"])
def test_gfloat_native_16bit_inputs(name, same_values):
    """Every bfloat16 pattern, quantized in a bfloat16 tensor, under every gfloat mode."""
    fmt = SMALL[name]
    fi = gfloat_info(fmt)
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(torch.bfloat16)
    x64 = x.double().numpy()
    for grnd, mode in MODES.items():
        for sat, overflow in _policies(fmt):
            want = gfloat.round_ndarray(fi, x64, grnd, sat)
            got = an.quantize(x, fmt, mode, overflow=overflow)
            assert got.dtype == torch.bfloat16
            same_values(got.double().numpy(), want, x64, what=f"{fmt} {mode} {overflow}")


def test_gfloat_info_matches_format_properties():
    """The mapping above describes the same formats: max and smallest values agree with gfloat."""
    for fmt in [*SMALL.values(), *LARGE.values()]:
        fi = gfloat_info(fmt)
        assert fmt.max == fi.max, fmt
        assert fmt.smallest_subnormal == fi.smallest_subnormal, fmt
        assert fmt.bits == fi.k and fmt.precision == fi.precision, fmt
        assert fmt.has_inf == (fi.num_infs > 0) and fmt.has_nan == (fi.num_nans > 0), fmt
