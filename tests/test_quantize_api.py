"""The `quantize` front door: containers, dtypes, shapes, strides, out=, autograd, specials.

Expected values come from the format definitions (by hand) or from native casts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import anynum as an

pytestmark = pytest.mark.usefixtures("eager_only")


TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_dtype_is_kept(dtype):
    x = torch.tensor([0.1, -3.3, 100.0, 1e-3], dtype=dtype)
    y = an.quantize(x, an.E4M3FN)
    assert type(y) is torch.Tensor and y.dtype == dtype and y.shape == x.shape
    want = x.float().to(torch.float8_e4m3fn).float()  # torch's saturating e4m3fn cast
    assert torch.equal(y.float(), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_dtype_is_kept(dtype):
    x = np.array([[0.1, -3.3], [100.0, 1e-3]], dtype=dtype)
    y = an.quantize(x, "e4m3fn")
    assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == x.shape
    want = torch.from_numpy(x.astype(np.float32)).to(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(y.astype(np.float32), want)



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_scalar_gives_a_scalar(dtype):
    s = an.quantize(dtype(0.1), an.E4M3FN)
    assert np.ndim(s) == 0 and float(s) == 0.1015625


def test_zero_d_and_empty():
    for dt in TORCH_DTYPES:
        x = torch.tensor(1.3, dtype=dt)
        y = an.quantize(x, an.E2M1)
        assert y.shape == () and y.dtype == dt and y.item() == 1.5
        e = torch.empty(0, 3, dtype=dt)
        ye = an.quantize(e, an.E2M1, "sr", seed=0)
        assert ye.shape == (0, 3) and ye.dtype == dt
    assert an.quantize(np.empty((2, 0)), an.BF16).shape == (2, 0)


def test_zero_d_numpy_keeps_its_shape():
    y = an.quantize(np.array(1.3), an.E2M1)
    assert isinstance(y, np.ndarray) and y.shape == () and float(y) == 1.5
    assert an.encode(np.array(1.5), an.E2M1).shape == ()


def test_non_contiguous_and_channels_last():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, 5, 3, generator=g) * 10
    want = base.to(torch.float8_e4m3fn).float()
    views = [base.transpose(0, 2), base[:, ::2], base[..., 1], base.contiguous(
        memory_format=torch.channels_last)]
    wants = [want.transpose(0, 2), want[:, ::2], want[..., 1], want]
    for v, w in zip(views, wants, strict=True):
        y = an.quantize(v, an.E4M3FN)
        assert torch.equal(y, w)
    # stochastic rounding: same seed, same values whatever the layout of the same logical tensor
    a = an.quantize(base.contiguous(memory_format=torch.channels_last), an.E4M3FN, "sr", seed=1)
    b = an.quantize(base, an.E4M3FN, "sr", seed=1)
    assert torch.equal(a, b)
    # the input is never modified
    before = base.clone()
    an.quantize(base, an.E2M1)
    assert torch.equal(base, before)


def test_out_argument():
    x = torch.tensor([0.3, 7.0, -100.0])
    out = torch.empty(3)
    r = an.quantize(x, an.E2M1, out=out)
    assert r is out and out.tolist() == [0.5, 6.0, -6.0]
    nx = np.array([0.3, 7.0])
    nout = np.empty(2)
    assert an.quantize(nx, an.E2M1, out=nout) is nout and nout.tolist() == [0.5, 6.0]
    # quantizing in place through out=x
    y = torch.tensor([0.3, 0.8])
    an.quantize(y, an.E2M1, out=y)
    assert y.tolist() == [0.5, 1.0]
    with pytest.raises(an.AnynumError, match="out="):
        an.quantize(x, an.E2M1, out=torch.empty(4))
    with pytest.raises(an.AnynumError, match="out="):
        an.quantize(x, an.E2M1, out=torch.empty(3, dtype=torch.float64))
    with pytest.raises(an.AnynumError, match="out="):
        an.quantize(nx, an.E2M1, out=np.empty(2, dtype=np.float32))


@pytest.mark.parametrize("fmt", [an.BF16, an.FP16, an.E4M3FN, an.POSIT16], ids=repr)
def test_out_every_route_matches_the_returned_result(fmt):
    """out= (torch, NumPy, in place, non-contiguous NumPy) writes what quantize returns, whichever
    route (native cast, kernel) the format takes."""
    rng = np.random.default_rng(0)
    xn = (rng.standard_normal(1000) * np.exp2(rng.integers(-20, 20, 1000))).astype(np.float32)
    xn[:4] = [np.inf, -np.inf, np.nan, -0.0]
    if fmt is an.POSIT16:
        xn[:4] = [1e30, -1e-30, np.nan, -0.0]
    want = an.quantize(torch.from_numpy(xn.copy()), fmt).numpy()

    def same(got):
        np.testing.assert_array_equal(np.asarray(got).view(np.int32), want.view(np.int32))

    out = torch.empty(1000)
    same(an.quantize(torch.from_numpy(xn), fmt, out=out).numpy())
    nout = np.empty_like(xn)
    assert an.quantize(xn, fmt, out=nout) is nout
    same(nout)
    inplace = xn.copy()
    an.quantize(inplace, fmt, out=inplace)
    same(inplace)
    strided = np.empty((1000, 2), dtype=np.float32)[:, 0]
    an.quantize(xn, fmt, out=strided)
    same(strided)


@pytest.mark.parametrize("mode", ["nearest", "rz", "sr"])
def test_straight_through_gradient(mode):
    x = torch.tensor([0.3, 7.0, -100.0, 2.2], requires_grad=True)
    y = an.quantize(x, an.E2M1, mode, seed=0)
    assert y.requires_grad
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (y * w).sum().backward()
    assert torch.equal(x.grad, w)  # identity, even where the value saturated
    with torch.no_grad():
        assert not an.quantize(x, an.E2M1).requires_grad


def test_representability_errors():
    # BF16 results (2**16 for 65504) do not fit float16; FP16 results are not bfloat16 values
    with pytest.raises(an.RepresentabilityError if hasattr(an, "RepresentabilityError")
                       else an.AnynumError, match="cannot hold exactly"):
        an.quantize(torch.tensor([65504.0], dtype=torch.float16), an.BF16)
    with pytest.raises(an.AnynumError, match="cannot hold exactly"):
        an.quantize(torch.tensor([1.0], dtype=torch.bfloat16), an.FP16)
    # FP32-precision grid with a range beyond float16 on float16 tensors
    with pytest.raises(an.AnynumError, match="float16"):
        an.quantize(torch.ones(2, dtype=torch.float16), an.FloatFormat(6, 9))
    # a float32 tensor and a grid that reaches past float32's largest value
    with pytest.raises(an.AnynumError, match="float32"):
        an.quantize(torch.ones(2), an.FloatFormat(9, 10))
    # ... but formats whose every result fits are accepted
    assert an.quantize(torch.tensor([3.0], dtype=torch.float16), an.E5M2).item() == 3.0
    assert an.quantize(torch.tensor([3.0], dtype=torch.bfloat16), an.E8M0).item() == 4.0
    assert an.quantize(torch.tensor([3.0]), an.FloatFormat(8, 30)).item() == 3.0
    # wide formats on float64 inputs are exact
    assert an.quantize(torch.tensor([1 + 2.0**-40], dtype=torch.float64),
                       an.FloatFormat(11, 45)).item() == 1 + 2.0**-40


def _x(dtype):
    return torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30, -1e-30],
                        dtype=dtype)


MODES = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro", "sr", "sr_uniform"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_specials_per_format_and_mode(mode, dtype):
    """NaN -> NaN; ±inf -> ±inf / ±max / NaN by policy; -0 kept where the format has -0; tiny -> ±0
    (or the smallest step for UP/DOWN on their side, or the smallest value where there is no zero)."""
    x = _x(dtype)
    cases = [
        (an.FP16, None, [math.inf, -math.inf], True),
        (an.E5M2, "saturate", [57344.0, -57344.0], True),
        (an.E4M3FN, None, [448.0, -448.0], True),  # "fn" default saturates
        (an.E4M3FN, "nan", [math.nan, math.nan], True),
        (an.E4M3FNUZ, None, [240.0, -240.0], False),
        (an.E2M1, None, [6.0, -6.0], True),
        (an.formats.p3109(8, 3), None, [math.inf, -math.inf], False),
    ]
    for fmt, overflow, inf_out, has_nz in cases:
        y = an.quantize(x, fmt, mode, overflow=overflow, seed=0)
        assert y.dtype == dtype
        assert math.isnan(y[0])
        for got, want in zip(y[1:3].tolist(), inf_out, strict=True):
            assert (math.isnan(got) and math.isnan(want)) or got == want, (fmt, mode, got, want)
        assert y[3].item() == 0 and not torch.signbit(y[3])
        assert y[4].item() == 0 and bool(torch.signbit(y[4])) == has_nz, (fmt, mode)
        tiny = y[5:].tolist()
        sub = fmt.smallest_subnormal
        up_pos = {"ru": sub, "ro": sub}.get(mode, 0.0)
        down_neg = {"rd": -sub, "ro": -sub}.get(mode, 0.0)
        if mode.startswith("sr"):
            assert tiny[0] in (0.0, sub) and tiny[1] in (0.0, -sub)
        else:
            assert tiny == [up_pos, down_neg], (fmt, mode, tiny)
        if has_nz and tiny[1] == 0:
            assert torch.signbit(y[6]), (fmt, mode)
    # unsigned, no zero: E8M0 (below 2**-127 everything gives 2**-127; negatives NaN)
    xe = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45], dtype=dtype)
    e = an.quantize(xe, an.E8M0, mode, seed=0)
    assert math.isnan(e[0]) and e[1].item() == 2.0**127 and math.isnan(e[2])
    assert e[3].item() == e[4].item() == e[5].item() == 2.0**-127 and math.isnan(e[6])


def test_names_strings_and_members_agree():
    x = torch.linspace(-5, 5, 101)
    for alias, member in [("rne", an.Rounding.NEAREST_EVEN), ("floor", an.Rounding.DOWN),
                          ("ceil", an.Rounding.UP), ("truncate", an.Rounding.TOWARD_ZERO),
                          ("ro", an.Rounding.ODD), ("rna", an.Rounding.NEAREST_AWAY),
                          ("rnz", an.Rounding.NEAREST_ZERO)]:
        assert torch.equal(an.quantize(x, "e2m1", alias), an.quantize(x, an.E2M1, member))
    assert len(an.Rounding) == 9


def test_overflow_defaults():
    assert an.FP16.info.default_overflow == "inf"
    assert an.E4M3FN.info.default_overflow == "saturate"
    assert an.E2M1.info.default_overflow == "saturate"
    assert an.E8M0.info.default_overflow == "saturate"
    assert an.quantize(torch.tensor([1e6]), an.FP16).item() == math.inf
    assert an.quantize(torch.tensor([1e6]), an.FP16, overflow="saturate").item() == 65504.0
    assert math.isnan(an.quantize(torch.tensor([1e6]), an.FP16, overflow="nan").item())
