"""Pychop's chopped math on the facade: methods, free functions, array types, domains, and Pychop itself.

The facade delegates to `anynum.ops` (tested there against exact oracles);
here: the facade's functions are `anynum.ops` with the chopper's format, mode
and stream, on every array kind, with Pychop's argument orders, Pychop's
ValueError on out-of-domain inputs, and Pychop's own values wherever its
chopping is right (inputs and results inside the normal range).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.compat import pychop as F
from anynum.compat.pychop.math import BINARY, REDUCTIONS, UNARY

CH = F.Chop(5, 10)
X = np.random.default_rng(0).uniform(0.1, 0.9, 200)
Y = np.random.default_rng(1).uniform(0.1, 0.9, 200)


@pytest.mark.parametrize("name", [n for n in UNARY if n not in ("frexp", "modf")])
def test_unary_methods_are_anynum_ops(name):
    x = X + 1 if name == "arccosh" else X  # inside every domain
    got = getattr(CH, name)(x)
    assert np.array_equal(got, getattr(an.ops, name)(x, CH.fmt), equal_nan=True)
    if hasattr(F, name):
        assert np.array_equal(getattr(F, name)(x, CH), got, equal_nan=True)  # the free function


@pytest.mark.parametrize("name", [n for n in BINARY if n not in ("ldexp", "matmul", "dot")])
def test_binary_methods(name):
    x, y = ((X * 8).round(), (Y * 8).round() + 1) if name.startswith("bitwise") else (X, Y)
    got = getattr(CH, name)(x, y)
    assert np.array_equal(got, getattr(an.ops, name)(x, y, CH.fmt), equal_nan=True)
    if hasattr(F, name):
        assert np.array_equal(getattr(F, name)(x, y, CH), got, equal_nan=True)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions(name):
    m = X.reshape(20, 10)
    for axis in (None, 0, 1):
        got = getattr(CH, name)(m, axis=axis)
        assert np.array_equal(got, getattr(an.ops, name)(m, CH.fmt, axis=axis))
        assert np.array_equal(getattr(F, name)(m, CH, axis=axis), got)


def test_other_signatures():
    assert np.array_equal(CH.ldexp(X, np.arange(200) % 5), an.ops.ldexp(X, np.arange(200) % 5, CH.fmt))
    assert CH.round(np.array([2.5, 3.7])).tolist() == [2.0, 4.0] and F.round(
        np.array([0.6]), CH
    ).tolist() == [1.0]
    assert CH.clip(np.array([0.3, 5.0]), 0.0, 1.0).tolist() == [0.300048828125, 1.0]
    assert CH.diff(np.array([1.0, 4.0, 9.0]), n=2).tolist() == [2.0]
    mant, exp = CH.frexp(np.array([12.0]))
    assert mant.tolist() == [0.75] and exp.tolist() == [4]
    m = X.reshape(20, 10)
    assert np.array_equal(F.matmul(m, m.T, CH), an.ops.matmul(m, m.T, CH.fmt))
    assert np.array_equal(F.dot(X, Y, CH), an.ops.dot(X, Y, CH.fmt))


def test_array_kinds_and_modes():
    jnp = pytest.importorskip("jax.numpy")
    t = CH.sin(torch.tensor(X, dtype=torch.float32))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    j = CH.sin(jnp.asarray(X, dtype=jnp.float32))
    assert type(j).__module__.startswith("jax") and np.array_equal(np.asarray(j), t.numpy())
    assert np.array_equal(F.Chop(5, 10, rmode=3).exp(X), an.ops.exp(X, CH.fmt, "rd"))
    a = F.Chop(5, 10, rmode=5, random_state=7).sin(np.full(500, 0.1))
    b = F.Chop(5, 10, rmode=5, random_state=7).sin(np.full(500, 0.1))
    assert np.array_equal(a, b) and len(np.unique(a)) > 1  # inputs and results rounded stochastically
    assert np.array_equal(F.Chopf(4, 4).sqrt(np.array([2.0])), np.array([1.4375]))


def test_out_of_domain_raises_value_error_like_pychop():
    for fn, x in [(CH.log, -1.0), (CH.sqrt, -4.0), (CH.arcsin, 2.0), (CH.arccosh, 0.5)]:
        with pytest.raises(ValueError):
            fn(np.array([x]))
    with pytest.raises(an.AnynumError):
        F.Chop(5, 10, rmode=0).sin(X)  # no chopped math for ties-to-odd
    with pytest.raises(an.AnynumError):
        F.sin(X, F.Chopi(8))


def test_free_functions_equal_pychop(P=None):
    pychop = pytest.importorskip("pychop")
    pc = pychop.Chop(5, 10, rmode=1)
    for name in ("sin", "cos", "exp", "log", "sqrt", "tanh", "arctan", "square", "log1p"):
        assert np.array_equal(getattr(pychop, name)(X, pc), getattr(F, name)(X, CH)), name
    for name in ("add", "multiply", "divide", "power", "subtract"):
        assert np.array_equal(getattr(pychop, name)(X, Y, pc), getattr(F, name)(X, Y, CH)), name
