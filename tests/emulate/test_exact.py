"""The exact machinery: limb sums, Ozaki dot products, pair rounding, exact stochastic decisions."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch
from emulate_reference import round_exact
from hypothesis import given
from hypothesis import strategies as st

import anynum as an
from anynum.emulate.exact import exact_dot, exact_sum
from anynum.emulate.grid import Grid

pytestmark = pytest.mark.usefixtures("one_thread")

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)


def _exact(y, e) -> Fraction:
    return Fraction(float(y)) + Fraction(float(e))


@given(st.lists(finite, min_size=1, max_size=12))
def test_exact_sum_matches_fractions(terms):
    t = torch.tensor([terms], dtype=torch.float64)
    y, e = exact_sum(t)
    want = sum((Fraction(v) for v in terms), Fraction(0))
    got = _exact(y[0], e[0])
    if want == 0:
        assert float(y[0]) == 0.0 and float(e[0]) == 0.0
        return
    # y is the float64 nearest the sum within an ulp, e carries the rest with its exact sign
    assert abs(got - want) <= abs(want) * Fraction(2) ** -100
    rest = want - Fraction(float(y[0]))
    assert (rest > 0) == (float(e[0]) > 0) and (rest < 0) == (float(e[0]) < 0)


def test_exact_sum_cancellation_and_specials():
    t = torch.tensor(
        [
            [1e300, 1.0, -1e300, 2.0**-1000],
            [1.0, float("inf"), 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [-1.0, -(2.0**-80), 1.0, 0.0],
        ],
        dtype=torch.float64,
    )
    y, e = exact_sum(t)
    assert float(y[0]) == 1.0 and 0 < float(e[0]) < 2.0**-100  # the far tail: its sign, not its size
    assert math.isinf(float(y[1])) and float(e[1]) == 0
    assert float(y[2]) == 0 and float(e[2]) == 0
    assert float(y[3]) == -(2.0**-80) and float(e[3]) == 0


@given(st.integers(1, 6), st.integers(1, 20), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_exact_dot_matches_fractions(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 60, (m, k), generator=g)
    )
    b = torch.randn(k, n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 60, (k, n), generator=g)
    )
    y, e = exact_dot(a, b)
    for i in range(m):
        for j in range(n):
            want = sum((Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k)), Fraction(0))
            got = _exact(y[i, j], e[i, j])
            assert abs(got - want) <= abs(want) * Fraction(2) ** -100
            assert (want - Fraction(float(y[i, j]))) * Fraction(float(e[i, j])) >= 0


@pytest.mark.parametrize("seed", range(4))
def test_exact_dot_of_few_bits_in_one_slice(seed):
    """Operands of a short grid (posit8: the one-matmul path) and lines that hold a tiny value
    beside values near 1 (which one slice cannot hold: the general path)."""
    g = torch.Generator().manual_seed(seed)
    a = an.quantize(torch.randn(4, 30, generator=g, dtype=torch.float64), "posit(8,0)")
    b = an.quantize(torch.randn(30, 3, generator=g, dtype=torch.float64), "posit(8,0)")
    if seed % 2:
        a[1, 3], b[3, 2] = 2.0**-900, 2.0**800  # 2**-100 next to products near 1
    y, e = exact_dot(a, b)
    for i in range(4):
        for j in range(3):
            want = sum((Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(30)), Fraction(0))
            got = _exact(y[i, j], e[i, j])
            if seed % 2:  # the slices and exact_sum: the remainder good to 2**-100 with its exact sign
                assert abs(got - want) <= abs(want) * Fraction(2) ** -100
                assert (want - Fraction(float(y[i, j]))) * Fraction(float(e[i, j])) >= 0
            else:  # one exact matmul of integers
                assert got == want and float(e[i, j]) == 0


def test_round_pair_directed_uses_the_error_term():
    g = Grid(an.BF16, "ru")
    one = torch.tensor([1.0], dtype=torch.float64)
    tiny = torch.tensor([2.0**-100], dtype=torch.float64)
    assert g.round_pair(one, tiny).item() == 1 + 2**-7  # fl64(1 + 2**-100) == 1 would give 1
    assert Grid(an.BF16, "rd").round_pair(one, -tiny).item() == 1 - 2**-8
    assert Grid(an.BF16, "rz").round_pair(one, -tiny).item() == 1 - 2**-8
    assert Grid(an.BF16, "ro").round_pair(one, tiny).item() == 1 + 2**-7
    assert Grid(an.BF16).round_pair(one, tiny).item() == 1.0


@pytest.mark.parametrize("mode", ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"])
@pytest.mark.parametrize("fmt", ["bf16", "posit(8,1)", "e4m3fn"])
def test_round_pair_at_every_boundary(mode, fmt):
    """Values a hair above/below each grid point and midpoint, held as (boundary, +-tiny)."""
    f = an.format(fmt)
    vals = torch.tensor(f.values(), dtype=torch.float64)
    vals = vals[(vals.abs() < f.max / 2) & (vals.abs() > f.smallest_normal * 2)]
    mids = (vals[1:] + vals[:-1]) / 2
    if isinstance(f, an.Posit):  # the bit-pattern boundaries
        from emulate_reference import boundary

        mids = torch.tensor(
            [
                float(boundary(f, Fraction(float(lo)), Fraction(float(hi))))
                for lo, hi in itertools.pairwise(vals.tolist())
            ],
            dtype=torch.float64,
        )
    pts = torch.cat([vals, mids])
    tiny = pts.abs() * 2.0**-70
    g = Grid(f, mode)
    for sign in (1.0, -1.0):
        got = g.round_pair(pts, sign * tiny, force=True)
        for p, t, r in zip(pts.tolist(), (sign * tiny).tolist(), got.tolist()):
            assert Fraction(r) == round_exact(Fraction(p) + Fraction(t), f, mode), (p, t, r)


def test_stochastic_pairs_are_unbiased_and_reproducible():
    g = Grid(an.BF16, "sr", seed=5)
    y = torch.full((40000,), 1.0, dtype=torch.float64)
    e = torch.full((40000,), 2.0**-9, dtype=torch.float64)  # not a float64 issue, but a pair
    r = g.round_pair(y, e, force=True)
    p_up = float((r > 1).double().mean())
    assert abs(p_up - 0.25) < 0.015  # 2**-9 / 2**-7
    g2 = Grid(an.BF16, "sr", seed=5)
    assert torch.equal(g2.round_pair(y, e, force=True), r)
    state = g.state_dict()
    a = g.round(y + 2.0**-9)
    g.load_state_dict(state)
    assert torch.equal(g.round(y + 2.0**-9), a)


wide = st.floats(
    allow_nan=False, allow_infinity=False, min_value=-1e150, max_value=1e150, allow_subnormal=True
)
tiny = st.one_of(
    wide,
    st.integers(-1074, -1000).map(lambda k: math.ldexp(1.0, k)),
    st.integers(1, 2**52 - 1).map(lambda m: m * 5e-324),  # subnormals
)


def _close(got: Fraction, want: Fraction) -> bool:
    """Within 2**-100 relative, or, for sums below float64's range, 2**-1074 absolute."""
    return abs(got - want) <= max(abs(want) * Fraction(2) ** -100, Fraction(2) ** -1074)


@given(
    st.lists(st.lists(tiny, min_size=3, max_size=3), min_size=2, max_size=2),
    st.lists(tiny, min_size=3, max_size=3),
)
def test_exact_dot_over_the_whole_float64_range(rows, col):
    """Subnormals beside normals, and products below float64's range: no NaN, and the
    remainder keeps its exact sign (it was NaN when a slice's scale underflowed)."""
    a = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(col, dtype=torch.float64).unsqueeze(1)
    for extra in (None, torch.tensor([[[2.0**-1074]], [[-3.0]]], dtype=torch.float64)):
        y, e = exact_dot(a, b, extra)
        for i in range(2):
            want = sum((Fraction(a[i, t].item()) * Fraction(b[t, 0].item()) for t in range(3)), Fraction(0))
            if extra is not None:
                want += Fraction(extra[i, 0, 0].item())
            got = _exact(y[i, 0], e[i, 0])
            assert _close(got, want), (rows[i], col, float(y[i, 0]), float(e[i, 0]))
            rest = want - Fraction(y[i, 0].item())
            assert (rest > 0) == (e[i, 0].item() > 0) and (rest < 0) == (e[i, 0].item() < 0)


def test_exact_dot_subnormal_beside_one():
    a = torch.tensor([[5e-324, 1.0], [2.0**-600, 0.0]], dtype=torch.float64)
    b = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    b2 = torch.tensor([[2.0**-600], [1.0]], dtype=torch.float64)
    y, e = exact_dot(a, b)
    assert y[0, 0].item() == 1.0 and e[0, 0].item() > 0  # was NaN
    y, e = exact_dot(a, b2)  # 2**-1200: no float64 holds it, its sign survives in e
    assert y[1, 0].item() == 0.0 and e[1, 0].item() == 5e-324
    t = torch.tensor([[5e-324, 5e-324, 2.0**-1074]], dtype=torch.float64)
    y, e = exact_sum(t)
    assert y.item() == 3 * 5e-324 and e.item() == 0.0  # was 0: a limb unit underflowed
