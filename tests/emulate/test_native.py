"""The C kernel (seqdot.c) against the torch reference, bit for bit."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from emulate_reference import round_exact

import anynum as an
from anynum.emulate import native
from anynum.emulate.grid import Grid

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not native.available(), reason="no C compiler or private cache on this machine"),
]

MODES = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]


def _probes(fmt: an.Format) -> tuple[torch.Tensor, torch.Tensor]:
    """Every value and midpoint, their float64 neighbours, each with error terms of both signs."""
    v = torch.tensor(fmt.values(), dtype=torch.float64)
    mids = (v[1:] + v[:-1]) / 2
    pts = torch.cat([v, mids])
    up = torch.nextafter(pts, torch.full_like(pts, float("inf")))
    down = torch.nextafter(pts, torch.full_like(pts, -float("inf")))
    y = torch.cat([pts, up, down, pts, up, down])
    tiny = y.abs().clamp(min=1e-300) * 2.0**-60
    e = torch.cat([tiny[: 3 * len(pts)], -tiny[3 * len(pts) :]])
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 30, (4000,), generator=g)
    )
    y = torch.cat(
        [y, r, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e300, -1e-300])]
    )
    e = torch.cat([e, r * 2.0**-70, torch.zeros(7, dtype=torch.float64)])
    return y, e


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "fmt", ["posit(8,0)", "posit(8,2)", "posit(16,1)", "bf16", "fp16", "e4m3fn", "e5m2", "e2m1"]
)
def test_c_rounding_equals_torch_on_every_code(fmt, mode):
    g = Grid(fmt, mode)
    y, e = _probes(g.fmt)
    want = g.round_pair(y, e, force=True)
    got = native.round_pairs(y, e, g)
    same = (want == got) | (torch.isnan(want) & torch.isnan(got))
    assert bool(same.all()) and torch.equal(
        torch.signbit(want[~torch.isnan(want)]), torch.signbit(got[~torch.isnan(got)])
    )


@pytest.mark.parametrize("mode", ["nearest", "rz", "ru", "ro"])
def test_pairs_one_ulp_off_a_grid_point(mode):
    """y one float64 step inside a grid gap with the remainder pointing back: the case the
    nudge must not overshoot (fractions decide)."""
    f = an.BF16
    v = torch.tensor(f.values(), dtype=torch.float64)
    v = v[(v.abs() > 1e-30) & (v.abs() < 1e30)]
    y = torch.nextafter(v, torch.zeros_like(v))  # one step toward zero from a grid point
    ulp = (v - y).abs()
    e = torch.where(v > 0, 1.0, -1.0).to(torch.float64) * ulp * 0.25  # back toward v, short of it
    g = Grid(f, mode)
    want = [round_exact(Fraction(float(a)) + Fraction(float(b)), f, mode) for a, b in zip(y, e)]
    torch_res = g.round_pair(y, e, force=True)
    c_res = native.round_pairs(y, e, g)
    assert [Fraction(float(t)) for t in torch_res] == want
    assert torch.equal(torch_res, c_res)


def _torch_loop(a: torch.Tensor, b: torch.Tensor, g: Grid) -> torch.Tensor:
    """The reference: accumulate.py's torch loop along K (one rounding per product and per sum)."""
    from anynum.emulate import accumulate as acc_mod
    from anynum.emulate.accumulate import Accumulation, Accumulator

    acc = Accumulator(Accumulation.resolve(g.fmt), g)
    saved = acc_mod.native_sequential[0]
    try:
        acc_mod.native_sequential[0] = None
        return acc.dot(a, b, g)
    finally:
        acc_mod.native_sequential[0] = saved


def _spread(shape: tuple[int, ...], gen: torch.Generator, lo: int, hi: int) -> torch.Tensor:
    """Random float64s over binades 2**lo .. 2**hi, with zeros, -0 and sign changes sprinkled in."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(lo, hi + 1, shape, generator=gen).to(torch.float64)
    )
    x[torch.rand(*shape, generator=gen) < 0.1] = 0.0
    x[torch.rand(*shape, generator=gen) < 0.05] = -0.0
    return x


@pytest.mark.parametrize(
    "fmt",
    ["posit(16,2)", "posit(16,1)", "posit(8,0)", "posit(32,2)", "posit(12,3)", "bf16", "fp16", "e4m3fn",
     "e5m2fnuz", "fp32"],
)
def test_simd_sequential_matches_the_torch_loop(fmt):
    """The SIMD lanes of the nearest-even loop (rows of a tile at a time, fallback to the scalar
    rounding for any step with a lane outside the fast rule) against the torch loop, bit for bit
    and sign of zero included: shapes that are not multiples of the lane or row blocks, tiles wider
    than one block of columns, zeros of both signs; magnitudes well inside the binades the lanes
    round (most steps in SIMD) and far outside them (minpos/maxpos, overflow, float64 subnormals:
    most steps on the scalar fallback)."""
    g = Grid(fmt)
    gen = torch.Generator().manual_seed(hash(fmt) % 2**31)
    kept = native._kept_bits(g.fmt)
    fast = [e - 1023 for e in range(1, 2047) if kept[e] > 0 and kept[e + 1] > 0]
    inside = (fast[0] // 4, fast[-1] // 4 - 2)  # products and short sums stay in the fast binades
    outside = (fast[0] - 20, fast[-1] + 20)
    for m, k, n, spread in [(1, 1, 1, inside), (5, 7, 19, inside), (9, 33, 300, inside),
                            (4, 64, 520, inside), (6, 25, 37, outside), (3, 17, 11, (-1070, -1020))]:
        a = g.round(_spread((m, k), gen, *spread))
        b = g.round(_spread((k, n), gen, *spread))
        got = native.sequential_dot(a, b, g, False, True)
        want = _torch_loop(a, b, g)
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
        assert bool(same.all()), (fmt, m, k, n)
        assert torch.equal(torch.signbit(got[~torch.isnan(got)]), torch.signbit(want[~torch.isnan(want)]))


@pytest.mark.parametrize("fmt", ["posit(16,2)", "bf16"])
def test_simd_sequential_on_values_off_the_grid(fmt):
    """Operands that are not on the grid (the C loop rounds whatever it is given, as the torch
    loop does): products and sums that land anywhere in float64, subnormals and infinities too."""
    g = Grid(fmt)
    gen = torch.Generator().manual_seed(3)
    a = _spread((6, 40), gen, -4, 4)
    b = _spread((40, 70), gen, -4, 4)
    a[0, 3], a[1, 5], b[7, 2] = 5e-324, float("inf"), -1e308
    got = native.sequential_dot(a, b, g, False, True)
    want = _torch_loop(a, b, g)
    assert bool(((got == want) | (torch.isnan(got) & torch.isnan(want))).all())


def test_sequential_results_do_not_depend_on_the_thread_count():
    g = Grid("posit(16,2)")
    gen = torch.Generator().manual_seed(4)
    a = g.round(_spread((2, 7, 90), gen, -8, 8))
    b = g.round(_spread((2, 90, 600), gen, -8, 8))
    one = native.sequential_dot(a, b, g, False, True)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = native.sequential_dot(a, b, g, False, True)
        torch.set_num_threads(3)
        three = native.sequential_dot(a, b, g, False, True)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(one, two) and torch.equal(one, three)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["posit(16,2)", "posit(8,0)", "bf16", "fp16", "e4m3fn", "e5m2fnuz"])
def test_add_round_equals_the_torch_pair_rounding(fmt, mode):
    """`native.add_round(x, y)`: TwoSum and one rounding in C, the same as the torch pair rounding,
    on sums whose exact value float64 cannot hold (a grid value plus a product of three)."""
    from anynum.mc import two_sum

    g = Grid(fmt, mode)
    gen = torch.Generator().manual_seed(hash((fmt, mode)) % 2**31)
    x = g.round(_spread((3000,), gen, -20, 20))
    y = g.round(_spread((3000,), gen, -20, 20)) * g.round(_spread((3000,), gen, -8, 8)) * 2.0**-30
    x = torch.cat([x, torch.tensor([1.0, -1.0, float("inf"), float("nan"), 0.0, -0.0], dtype=torch.float64)])
    y = torch.cat([y, torch.tensor([2.0**-60, -(2.0**-60), 1.0, 1.0, -0.0, -0.0], dtype=torch.float64)])
    want = g.round_pair(*two_sum(x, y), force=True)
    got = native.add_round(x, y, g)
    assert bool(((got == want) | (torch.isnan(got) & torch.isnan(want))).all())
    assert torch.equal(torch.signbit(got[~torch.isnan(got)]), torch.signbit(want[~torch.isnan(want)]))
