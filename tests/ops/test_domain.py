"""Out-of-domain inputs: NumPy's NaN/±inf and RuntimeWarning by default, an error or silence on request."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import InputError

pytestmark = pytest.mark.usefixtures("eager_only")

CASES = [
    # name, args, NumPy function giving the same specials
    ("log", ([1.0, 0.0, -1.0],), np.log),
    ("log2", ([0.0, -2.0],), np.log2),
    ("log10", ([0.0, -2.0],), np.log10),
    ("log1p", ([-1.0, -2.0],), np.log1p),
    ("sqrt", ([-1.0, 4.0],), np.sqrt),
    ("arcsin", ([2.0],), np.arcsin),
    ("arccos", ([-2.0],), np.arccos),
    ("arccosh", ([0.5],), np.arccosh),
    ("arctanh", ([1.0, -1.0, 2.0],), np.arctanh),
    ("reciprocal", ([0.0, -0.0],), np.reciprocal),
    ("divide", ([1.0, 0.0, -1.0], [0.0, 0.0, 0.0]), np.divide),
    ("floor_divide", ([1.0, 0.0], [0.0, 0.0]), np.floor_divide),
    ("mod", ([1.0, np.inf], [0.0, 2.0]), np.mod),
    ("fmod", ([1.0, np.inf], [0.0, 2.0]), np.fmod),
    ("power", ([0.0, -8.0], [-1.0, 0.5]), np.power),
    ("subtract", ([np.inf], [np.inf]), np.subtract),
    ("multiply", ([0.0], [np.inf]), np.multiply),
]


@pytest.mark.parametrize(("name", "args", "npfn"), CASES, ids=[c[0] for c in CASES])
def test_numpy_behaviour_and_errors(name, args, npfn):
    arrays = [np.array(a) for a in args]
    with np.errstate(all="ignore"):
        want = npfn(*arrays)
    with pytest.warns(RuntimeWarning, match=f"an.ops.{name}"):
        got = getattr(an.ops, name)(*arrays, "bf16")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin], want[fin]), (got, want)
    with pytest.raises(InputError, match=f"an.ops.{name}: .* outside its domain"):
        getattr(an.ops, name)(*arrays, "bf16", domain="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(an.ops, name)(*arrays, "bf16", domain="ignore")


def test_nan_inputs_and_valid_inputs_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(an.ops.log(np.array([np.nan]), "bf16")[0])
        an.ops.log(np.array([1.0, 2.0]), "bf16", domain="raise")
        an.ops.sum(np.array([1.0, np.nan]), "bf16")


def test_poles_give_infinities_of_numpy_sign():
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        assert an.ops.log(torch.tensor([0.0, -0.0]), "bf16").tolist() == [-np.inf, -np.inf]
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        assert an.ops.gamma(torch.tensor([0.0, -0.0]), "bf16").tolist() == [np.inf, -np.inf]
    with pytest.warns(RuntimeWarning, match="invalid value"):
        assert np.isnan(an.ops.gamma(torch.tensor([-2.0]), "bf16").item())
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        assert an.ops.lgamma(torch.tensor([-2.0]), "bf16").tolist() == [np.inf]


def test_reductions_warn_on_inf_minus_inf():
    with pytest.warns(RuntimeWarning, match="an.ops.sum"):
        assert np.isnan(an.ops.sum(np.array([np.inf, -np.inf]), "bf16"))
    with pytest.raises(InputError, match="reduction at flat index 1"):
        an.ops.sum(np.array([[1.0, 2.0], [np.inf, -np.inf]]), "bf16", axis=1, domain="raise")


def test_pychop_difference_is_documented():
    """Pychop raises ValueError for any out-of-domain element; an.ops follows NumPy unless asked."""
    assert "Pychop raises ValueError" in an.ops.__doc__
