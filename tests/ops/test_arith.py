"""+, -, x, /, sqrt, fma and friends: correctly rounded in every mode, against exact rationals.

The reference (tests/ops/reference.py) rounds the exact rational result with its
own arithmetic. Inputs are grid values of each format (checked on the grid by the
reference), drawn over the whole exponent range plus structured pairs whose exact
result needs far more than 53 bits (1 + 2**-100 and friends), so the error term
decides directed, odd and tie cases (DESIGN.md Resolution 6).
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import anynum as an

sys.path.insert(0, str(Path(__file__).parent))  # the exact references beside this file
from reference import DETERMINISTIC, isqrt_proxy, round_ref

pytestmark = pytest.mark.usefixtures("eager_only")

FORMATS = [
    an.BF16,
    an.FP16,
    an.E4M3FN,
    an.E5M2,
    an.Posit(8, 2),
    an.Posit(16, 1),
    an.FixedPoint(6, 6),
    an.FP32,
]


def grid_values(fmt, n: int, seed: int) -> np.ndarray:
    """n values on fmt's grid (float64), spread over its range, with special structure mixed in."""
    rng = np.random.default_rng(seed)
    lo = math.log2(fmt.smallest_subnormal)
    hi = math.log2(fmt.max)
    e = rng.uniform(lo - 1, hi + 0.5, n)
    x = np.ldexp(1.0 + rng.random(n), np.floor(e).astype(int)) * rng.choice([-1.0, 1.0], n)
    x = np.concatenate([x, [1.0, -1.0, 0.5, 2.0, 3.0, 0.0, fmt.max, -fmt.max, fmt.smallest_subnormal]])
    q = an.quantize(torch.from_numpy(x), fmt, overflow="saturate").numpy()
    on_grid = np.array([round_ref(Fraction(v), fmt, "nearest", "saturate") == v for v in q.tolist()])
    assert on_grid.all(), "quantize left the grid"  # the reference agrees these are grid values
    return q


def structured_pairs(fmt) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) whose exact sums/products need many bits: tiny y against x = ±1, ±max, midpoints."""
    tiny = [2.0**-k for k in (3, 7, 8, 9, 12, 24, 25, 30, 53, 60, 100)]
    xs, ys = [], []
    for x in (1.0, -1.0, 1.5, 3.0, fmt.max / 2):
        for t in tiny:
            for s in (1.0, -1.0):
                xs.append(x)
                ys.append(s * t * (1 + 2.0**-3))
    x = an.quantize(torch.tensor(xs, dtype=torch.float64), fmt, overflow="saturate").numpy()
    y = an.quantize(torch.tensor(ys, dtype=torch.float64), fmt, overflow="saturate").numpy()
    return x, y


EXACT = {
    "add": (2, lambda a, b: a + b),
    "subtract": (2, lambda a, b: a - b),
    "multiply": (2, lambda a, b: a * b),
    "divide": (2, lambda a, b: a / b if b != 0 else None),
    "mod": (2, lambda a, b: a - b * math.floor(a / b) if b != 0 else None),
    "fmod": (2, lambda a, b: a - b * math.trunc(a / b) if b != 0 else None),
    "square": (1, lambda a: a * a),
    "reciprocal": (1, lambda a: 1 / a if a != 0 else None),
    "sqrt": (1, lambda a: isqrt_proxy(a) if a >= 0 else None),
}


def _check(fmt, name: str, args: list[np.ndarray], mode: str, want_fn) -> None:
    got = getattr(an.ops, name)(*[torch.from_numpy(a) for a in args], fmt, mode, domain="ignore").numpy()
    bad = []
    for i in range(got.size):
        vals = [a.reshape(-1)[i] if a.size > 1 else a.reshape(-1)[0] for a in args]
        if not all(math.isfinite(v) for v in vals):
            continue
        exact = want_fn(*[Fraction(v) for v in vals])
        if exact is None:
            continue
        want = round_ref(exact, fmt, mode)
        g = got.reshape(-1)[i]
        if not (g == want or (math.isnan(g) and math.isnan(want))):
            bad.append((vals, want, g))
    assert not bad, f"{name} {fmt!r} {mode}: {len(bad)} wrong, e.g. {bad[:5]}"


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_ops_every_deterministic_mode(fmt, name):
    arity, fn = EXACT[name]
    x = grid_values(fmt, 150, 1)
    y = grid_values(fmt, 150, 2)[: x.size]
    sx, sy = structured_pairs(fmt)
    if arity == 2:
        args = [np.concatenate([x, sx, sy]), np.concatenate([y, sy, sx])]
    else:
        args = [np.concatenate([x, sx, sy])]
    for mode in DETERMINISTIC:
        _check(fmt, name, args, mode, fn)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_fma_every_deterministic_mode(fmt):
    a = grid_values(fmt, 120, 3)
    b = grid_values(fmt, 120, 4)[: a.size]
    c = grid_values(fmt, 120, 5)[: a.size]
    # c cancelling most of a*b, so the exact result needs all of the product's bits.
    c2 = an.quantize(torch.from_numpy(-(a * b)), fmt, "rz", overflow="saturate").numpy()
    args = [np.concatenate([a, a]), np.concatenate([b, b]), np.concatenate([c, c2])]
    for mode in DETERMINISTIC:
        _check(fmt, "fma", args, mode, lambda p, q, r: p * q + r)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_ldexp_and_diff(fmt):
    x = grid_values(fmt, 100, 6)
    n = np.random.default_rng(7).integers(-40, 40, x.size)
    for mode in DETERMINISTIC:
        got = an.ops.ldexp(torch.from_numpy(x), torch.from_numpy(n), fmt, mode).numpy()
        want = [round_ref(Fraction(v) * Fraction(2) ** int(k), fmt, mode)
                for v, k in zip(x.tolist(), n.tolist())]
        assert np.array_equal(got, np.array(want), equal_nan=True), (fmt, mode)
        d = an.ops.diff(torch.from_numpy(x), fmt, mode).numpy()
        want_d = [round_ref(Fraction(b) - Fraction(a), fmt, mode)
                  for a, b in zip(x[:-1].tolist(), x[1:].tolist())]
        assert np.array_equal(d, np.array(want_d), equal_nan=True), (fmt, mode)


@pytest.mark.parametrize("mode", ["ru", "rd", "rz", "ro", "nearest"])
def test_resolution6_examples(mode):
    one, tiny = torch.tensor([1.0, -1.0]), torch.tensor([2.0**-100, 2.0**-100])
    got = an.ops.add(one, tiny, "bf16", mode).tolist()
    want = {"ru": [1 + 2**-7, -1 + 2**-8], "rd": [1.0, -1.0], "rz": [1.0, -1 + 2**-8],
            "ro": [1 + 2**-7, -1 + 2**-8], "nearest": [1.0, -1.0]}[mode]
    assert got == want


def test_fp64_directed_modes_use_the_error_term():
    """For the float64 grid itself the result is float64's neighbour on the error's side."""
    one = torch.tensor([1.0], dtype=torch.float64)
    tiny = torch.tensor([2.0**-100], dtype=torch.float64)
    assert an.ops.add(one, tiny, an.FP64, "ru").item() == 1 + 2**-52
    assert an.ops.add(one, tiny, an.FP64, "rd").item() == 1.0
    assert an.ops.add(one, -tiny, an.FP64, "rz").item() == 1 - 2**-53
    assert an.ops.add(one, -tiny, an.FP64, "nearest").item() == 1.0
    third = an.ops.divide(one, torch.tensor([3.0], dtype=torch.float64), an.FP64, "ru").item()
    assert Fraction(third) > Fraction(1, 3) > Fraction(np.nextafter(third, 0))


@pytest.mark.parametrize("mode", ["nearest", "rd", "ru", "rz"])
def test_signed_zero_of_exact_cancellation(mode):
    """IEEE 754: x + (-x) is +0, except -0 under round-down; (-0) + (-0) is -0."""
    x = torch.tensor([1.5, 0.0, -0.0, 0.0], dtype=torch.float64)
    y = torch.tensor([-1.5, -0.0, -0.0, 0.0], dtype=torch.float64)
    got = an.ops.add(x, y, "bf16", mode)
    signs = torch.signbit(got).tolist()
    want = [mode == "rd", mode == "rd", True, False]
    assert signs == want
    assert torch.signbit(an.ops.subtract(x[:1], x[:1], "bf16", mode)).item() == (mode == "rd")
    f = an.ops.fma(torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([-6.0]), "bf16", mode)
    assert torch.signbit(f).item() == (mode == "rd")


def test_exact_results_have_no_error_term_artifacts():
    """Exact results stay exact in every mode, including odd rounding."""
    x = torch.tensor([1.0, 3.0, 0.5, -2.0])
    for mode in DETERMINISTIC:
        assert an.ops.add(x, x, "bf16", mode).tolist() == [2.0, 6.0, 1.0, -4.0]
        assert an.ops.sqrt(torch.tensor([4.0, 0.25]), "bf16", mode).tolist() == [2.0, 0.5]
        assert an.ops.divide(x, torch.tensor([2.0]), "bf16", mode).tolist() == [0.5, 1.5, 0.25, -1.0]
