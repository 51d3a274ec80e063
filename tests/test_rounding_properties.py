"""Hypothesis properties of rounding onto float formats.

On the grid, idempotent, monotone, directed modes on their side of x, and
sign symmetry (x -> -x) for the symmetric modes, with UP and DOWN mirroring
each other. Arrays are drawn whole (one quantize call per example) so the
properties cover many values per example.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import anynum as an

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

FORMATS = [
    an.E5M2, an.E4M3FN, an.E4M3FNUZ, an.E5M2FNUZ, an.E4M3, an.E3M4, an.E3M2, an.E2M3, an.E2M1,
    an.E8M0, an.FP16, an.BF16, an.FloatFormat(3, 0), an.FloatFormat(4, 3, subnormals=False),
    an.FloatFormat(5, 2, bias=10), an.FloatFormat(4, 2, signed=False, specials="fn"),
    an.formats.p3109(8, 3), an.formats.p3109(8, 1), an.formats.p3109(8, 4, signed=False),
    an.formats.p3109(6, 3, domain="finite"),
]
DET = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]
SYMMETRIC = ["nearest", "rna", "rnz", "rz", "ro"]

fmts = st.sampled_from(FORMATS)


@functools.cache
def grid(fmt) -> np.ndarray:
    return fmt.values()

modes = st.sampled_from(DET)
dtypes = st.sampled_from([np.float32, np.float64])


def _arrays(dtype, min_size=1):
    return hnp.arrays(dtype, st.integers(min_size, 64),
                      elements=hnp.from_dtype(np.dtype(dtype), allow_subnormal=True))


@st.composite
def cases(draw, modes=modes):
    fmt = draw(fmts)
    dt = draw(dtypes)
    x = draw(_arrays(dt))
    # mix in values near the format's grid, where rounding decisions are made
    vals = grid(fmt)
    near = draw(hnp.arrays(np.float64, st.integers(0, 32),
                           elements=st.sampled_from(vals.tolist())))
    wiggle = draw(hnp.arrays(np.float64, near.shape, elements=st.floats(-1.0, 1.0)))
    step = np.maximum(np.abs(near), fmt.smallest_subnormal) * 2.0**-fmt.man_bits
    near = (near + wiggle * step).astype(dt)
    return fmt, draw(modes), np.concatenate([x, near]).astype(dt)


def _policy(fmt):
    return "inf" if fmt.has_inf else "nan" if fmt.has_nan else "saturate"


def q(x, fmt, mode, overflow=None):
    return an.quantize(torch.from_numpy(np.ascontiguousarray(x)), fmt, mode,
                       overflow=overflow, seed=0).numpy()


@given(cases(modes=st.sampled_from([*DET, "sr", "sr_uniform"])))
def test_results_are_on_the_grid(case):
    fmt, mode, x = case
    for overflow in {"saturate", _policy(fmt)}:
        y = q(x, fmt, mode, overflow).astype(np.float64)
        finite = np.isfinite(y)
        on = np.isin(y[finite], grid(fmt))
        assert on.all(), (fmt, mode, x[finite][~on])
        if not fmt.has_inf:
            assert not np.isinf(y).any()
        if not fmt.has_nan:
            assert not np.isnan(y[~np.isnan(x)]).any()


@given(cases(modes=st.sampled_from([*DET, "sr", "sr_uniform"])))
def test_idempotent(case):
    fmt, mode, x = case
    y = q(x, fmt, mode)
    for mode2 in (mode, "nearest", "rz", "ru", "sr"):
        z = q(y, fmt, mode2)
        np.testing.assert_array_equal(z, y, err_msg=f"{fmt} {mode} then {mode2}")


@given(cases())
def test_monotone(case):
    fmt, mode, x = case
    xs = np.sort(x[~np.isnan(x)])
    if not fmt.signed:
        xs = xs[xs >= 0]
    for overflow in {"saturate", _policy(fmt)}:
        y = q(xs, fmt, mode, overflow).astype(np.float64)
        ok = ~np.isnan(y)
        yo = y[ok]
        assert (yo[1:] >= yo[:-1]).all(), (fmt, mode, overflow, xs[ok], yo)


@given(cases(modes=st.sampled_from(["ru", "rd", "rz"])))
def test_directed_modes_stay_on_their_side(case):
    fmt, mode, x = case
    x = x[~np.isnan(x)]
    if not fmt.signed:
        x = x[x >= 0]
    if not fmt.zero:  # below the smallest value everything saturates to it (documented)
        x = x[np.abs(x) >= fmt.smallest_normal]
    overflow = _policy(fmt)
    if overflow == "saturate":  # no infinity to go to: stay in range
        x = x[np.abs(x) <= fmt.max]
    y = q(x, fmt, mode, overflow).astype(np.float64)
    xd = x.astype(np.float64)
    ok = ~np.isnan(y)  # "nan" overflow
    if mode == "ru":
        assert (y[ok] >= xd[ok]).all()
    elif mode == "rd":
        assert (y[ok] <= xd[ok]).all()
    else:
        assert (np.abs(y[ok]) <= np.abs(xd[ok])).all()
    # the result is the nearest grid value on that side: no value lies strictly between
    v = grid(fmt)
    fin = ok & np.isfinite(y) & np.isfinite(xd)
    lo, hi = np.minimum(y[fin], xd[fin]), np.maximum(y[fin], xd[fin])
    between = np.searchsorted(v, hi, "left") - np.searchsorted(v, lo, "right")
    assert (between <= 0).all(), (fmt, mode, xd[fin][between > 0])


@given(cases(modes=st.sampled_from(SYMMETRIC)))
def test_sign_symmetric_modes(case):
    fmt, mode, x = case
    if not fmt.signed:
        return
    for overflow in {"saturate", _policy(fmt)}:
        a = q(x, fmt, mode, overflow)
        b = q(-x, fmt, mode, overflow)
        np.testing.assert_array_equal(-b, a, err_msg=f"{fmt} {mode}")  # 0 == -0 here
        if fmt.has_negative_zero:
            zero = a == 0
            assert (np.signbit(a[zero]) == np.signbit(x[zero])).all()


@given(cases(modes=st.just("ru")))
def test_up_and_down_mirror(case):
    fmt, _, x = case
    if not fmt.signed:
        return
    for overflow in {"saturate", _policy(fmt)}:
        np.testing.assert_array_equal(q(-x, fmt, "ru", overflow), -q(x, fmt, "rd", overflow))


@given(cases(modes=st.sampled_from(["nearest", "rna", "rnz"])))
def test_nearest_modes_pick_a_nearest_value(case):
    fmt, mode, x = case
    x = x[np.isfinite(x)].astype(np.float64)
    if not fmt.signed:
        x = x[x >= 0]
    x = x[np.abs(x) <= fmt.max]
    if not fmt.zero:
        x = x[np.abs(x) >= fmt.smallest_normal]
    y = q(x, fmt, mode, "saturate").astype(np.float64)
    v = grid(fmt)
    j = np.clip(np.searchsorted(v, x), 1, v.size - 1)
    dist = np.minimum(np.abs(v[j - 1] - x), np.abs(v[j] - x))
    np.testing.assert_array_equal(np.abs(y - x), dist)
