"""Reductions against exact rationals: sum, mean, prod, var, std, cumsum, cumprod, dot, matmul, norm.

Inputs are grid values with few significant bits over a narrow exponent range, so
float64 accumulation is exact and ``accumulate=None`` (float64, rounded once) must
equal the exact result rounded once, in every mode. Where float64 is not exact (a
long sum, var, norms) the result must be the float64 result rounded once, and we
check it against the exact value with the near-boundary exemption of Resolution 3.
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import anynum as an

sys.path.insert(0, str(Path(__file__).parent))  # the exact references beside this file
from reference import DETERMINISTIC, isqrt_proxy, near_boundary, round_ref

from anynum.errors import InputError

pytestmark = pytest.mark.usefixtures("eager_only")
FMT = an.BF16


def small_grid(shape, seed, lo=-6, hi=6):
    rng = np.random.default_rng(seed)
    x = rng.integers(-255, 256, shape) * np.exp2(rng.integers(lo, hi, shape).astype(float))
    return an.quantize(torch.from_numpy(x.astype(np.float64)), FMT).numpy()


def fr(a):
    return np.vectorize(Fraction, otypes=[object])(a)


def ref(values, mode, fmt=FMT):
    flat = [round_ref(v, fmt, mode) for v in np.asarray(values, dtype=object).reshape(-1).tolist()]
    return np.array(flat, dtype=np.float64).reshape(np.shape(values))


@pytest.mark.parametrize("mode", DETERMINISTIC)
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2), -1])
def test_sum_mean_prod_exact(mode, axis):
    x = small_grid((4, 5, 3), 1)
    X = fr(x)
    for name, fn in (("sum", np.sum), ("mean", None), ("prod", np.prod)):
        got = getattr(an.ops, name)(x, FMT, mode, axis=axis)
        if name == "mean":
            n = x.size if axis is None else np.prod([x.shape[a] for a in np.atleast_1d(axis)])
            want = ref(np.sum(X, axis=axis) / int(n), mode)
        else:
            want = ref(fn(X, axis=axis), mode)
        assert np.shape(got) == np.shape(want) and np.array_equal(got, want), (name, mode, axis)
    kept = an.ops.sum(x, FMT, mode, axis=axis, keepdims=True)
    assert kept.shape == np.sum(x, axis=axis, keepdims=True).shape


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_cumulative_dot_matmul_exact(mode):
    x = small_grid((3, 6), 2, -3, 3)
    y = small_grid((6, 4), 3, -3, 3)
    X, Y = fr(x), fr(y)
    assert np.array_equal(an.ops.cumsum(x, FMT, mode, axis=1), ref(np.cumsum(X, axis=1), mode))
    assert np.array_equal(an.ops.cumsum(x, FMT, mode), ref(np.cumsum(X.reshape(-1)), mode))
    want = ref(np.cumprod(X[:, :3], axis=0), mode)
    assert np.array_equal(an.ops.cumprod(x[:, :3], FMT, mode, axis=0), want)
    assert np.array_equal(an.ops.matmul(x, y, FMT, mode), ref(X.dot(Y), mode))
    assert np.array_equal(an.ops.dot(x[0], y[:, 0], FMT, mode), ref(X[0].dot(Y[:, 0]), mode))
    assert np.array_equal(an.ops.dot(x, 2.5, FMT, mode), ref(X * Fraction(5, 2), mode))


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_inexact_float64_reductions_round_once(mode):
    """var, std, norm and a long sum: float64's result, rounded once (exempt near boundaries)."""
    rng = np.random.default_rng(4)
    x = an.quantize(torch.from_numpy(rng.standard_normal((50, 40)) * 10), FMT).numpy()
    X = fr(x)
    mean = np.sum(X, axis=1) / 40
    var = np.array([sum((v - m) ** 2 for v in row) / 40 for row, m in zip(X, mean)], dtype=object)
    cases = [
        ("var", an.ops.var(x, FMT, mode, axis=1), var),
        ("std", an.ops.std(x, FMT, mode, axis=1), np.array([isqrt_proxy(v) for v in var], dtype=object)),
        ("norm", an.ops.norm(x, FMT, mode, axis=1),
         np.array([isqrt_proxy(sum(v * v for v in row)) for row in X], dtype=object)),
        ("norm1", an.ops.norm(x, FMT, mode, ord=1, axis=1), np.array([sum(abs(v) for v in row) for row in X],
                                                                     dtype=object)),
        ("norminf", an.ops.norm(x, FMT, mode, ord=float("inf"), axis=1),
         np.array([max(abs(v) for v in row) for row in X], dtype=object)),
    ]
    for name, got, exact in cases:
        want = ref(exact, mode)
        for g, w, e in zip(got.tolist(), want.tolist(), exact.tolist()):
            assert g == w or near_boundary(e, FMT, mode, 2.0**-45), (name, mode, g, w)


def test_ddof_and_empty():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert an.ops.var(x, "fp32").item() == 1.25
    assert an.ops.var(x, "fp32", ddof=1).item() == float(np.float32(5 / 3))
    with pytest.warns(RuntimeWarning):
        assert np.isnan(an.ops.mean(np.zeros(0), "bf16"))
    assert an.ops.sum(np.zeros(0), "bf16") == 0.0 and an.ops.prod(np.zeros(0), "bf16") == 1.0


def test_axis_arguments_and_errors():
    x = torch.arange(24.0).reshape(2, 3, 4)
    assert torch.equal(an.ops.sum(x, "fp32", dim=1), x.sum(1))
    assert torch.equal(an.ops.sum(x, "fp32", dim=(0, 2), keepdims=True), x.sum((0, 2), keepdim=True))
    with pytest.raises(InputError, match="axis= or its torch alias dim="):
        an.ops.sum(x, "fp32", axis=0, dim=0)
    with pytest.raises(InputError, match="out of range"):
        an.ops.sum(x, "fp32", axis=3)
    with pytest.raises(InputError, match="order must be"):
        an.ops.sum(x, "fp32", accumulate="bf16", order="random")
    with pytest.raises(InputError, match="fma must be"):
        an.ops.dot(x[0, 0], x[0, 0], "fp32", fma=1)
    with pytest.raises(InputError, match="at least one dimension"):
        an.ops.matmul(torch.tensor(2.0), x, "fp32")


def seq_sum_reference(terms, fmt2, mode):
    acc = Fraction(0)
    for t in terms:
        acc = Fraction(round_ref(acc + t, fmt2, mode))
    return acc


def test_accumulate_in_a_format_uses_the_emulation_engine():
    """accumulate=fmt2 runs on an.matmul (anynum.emulate's engine); without it, a clear error."""
    x = small_grid((3, 64), 5)
    if getattr(an, "matmul", None) is None:
        for call in (lambda: an.ops.sum(x, FMT, accumulate="e5m2", axis=1),
                     lambda: an.ops.dot(x[0], x[1], FMT, accumulate="quire"),
                     lambda: an.ops.cumsum(x, FMT, accumulate="fp16", axis=1)):
            with pytest.raises(InputError, match=r"accumulation engine of anynum\.emulate"):
                call()
        return
    got = an.ops.sum(x, FMT, "nearest", axis=1, accumulate=an.E5M2)
    want = [round_ref(seq_sum_reference(fr(row), an.E5M2, "nearest"), FMT, "nearest") for row in x]
    assert got.tolist() == want


@pytest.mark.parametrize("mode", ["nearest", "rz", "ru"])
@pytest.mark.parametrize("order", ["sequential", "pairwise"])
def test_prod_accumulate_rounds_every_partial_product(mode, order):
    x = small_grid((5, 7), 6, -2, 2)
    got = an.ops.prod(x, FMT, mode, axis=1, accumulate=an.E4M3FN, order=order)
    for row, g in zip(fr(x), got.tolist()):
        if order == "sequential":
            acc = row[0]
            acc = Fraction(round_ref(acc, an.E4M3FN, mode)) if acc else acc
            for t in row[1:]:
                acc = Fraction(round_ref(acc * t, an.E4M3FN, mode)) if acc * t else acc * t
        else:
            level = list(row)
            while len(level) > 1:
                nxt = [Fraction(round_ref(a * b, an.E4M3FN, mode)) if a * b else a * b
                       for a, b in zip(level[0::2], level[1::2])]
                level = nxt + ([level[-1]] if len(level) % 2 else [])
            acc = level[0]
        assert g == (round_ref(acc, FMT, mode) if acc else 0.0), (mode, order)
