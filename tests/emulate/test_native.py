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
