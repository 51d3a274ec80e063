"""The native C kernels equal the eager reference bit for bit, for every family, mode and dtype.

The oracle is `round_to_format` in the working dtype (itself checked against ml_dtypes,
gfloat, SoftPosit and exact rationals in tests/oracles), converted back to the input dtype.
Inputs: every float16 and bfloat16 bit pattern (as those dtypes, and widened to float32),
random float32 and float64 bit patterns, values spread over the whole range with subnormals,
the specials, and for formats of at most 12 bits every grid point, midpoint and the float
neighbours of each midpoint. Layouts, threads and the rare exact-SR refinement are in
test_ckernel_layouts.py, blocks in test_ckernel_blocks.py, routing in test_ckernel_routing.py.

These tests call the kernels directly, whatever ``ANYNUM_COMPILE`` says; they need a C
compiler (there is no skip: a machine that runs the suite builds the library, and a None
from the kernel fails them).
"""

from __future__ import annotations

import math

import pytest
import torch

import anynum as an
from anynum.kernels.cparams import call_params
from anynum.quantize.checks import check_representable
from anynum.rounding import CounterRandom, Rounding


@pytest.fixture(scope="module")
def inputs(float32_probe: torch.Tensor) -> dict[torch.dtype, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    all16 = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16)
    raw64 = torch.randint(-(2**62), 2**62, (60_000,), generator=g, dtype=torch.int64) * 2
    raw64 = raw64 + torch.randint(0, 2, (60_000,), generator=g, dtype=torch.int64)
    spread = torch.randn(60_000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-1074, 1024, (60_000,), generator=g).double()
    )
    special = torch.tensor(
        [
            0.0,
            -0.0,
            math.inf,
            -math.inf,
            math.nan,
            2.0**-1074,
            -(2.0**-1074),
            2.0**-1022,
            1.7976931348623157e308,
            1 + 2.0**-52,
            2.0**-149 * 1.5,
        ],
        dtype=torch.float64,
    )
    return {
        torch.float16: all16.view(torch.float16),
        torch.bfloat16: all16.view(torch.bfloat16),
        torch.float32: float32_probe,
        torch.float64: torch.cat([float32_probe[::3].double(), raw64.view(torch.float64), spread, special]),
    }


FLOATS = [
    an.E4M3FN, an.E5M2, an.BF16, an.FP16, an.TF32, an.FP32, an.E2M1, an.E3M2, an.E2M3, an.E3M4, an.E4M3,
    an.E8M0,  # unsigned, no zero
    an.E4M3FNUZ, an.E5M2FNUZ, an.format("p3109(8,4)"), an.format("p3109(8,3)"),
    an.FloatFormat(6, 9), an.FloatFormat(4, 3, subnormals=False, specials="fn"),
    an.FloatFormat(5, 2, subnormals=False), an.FloatFormat(8, 1), an.FloatFormat(11, 20),
    an.FloatFormat(9, 30),
]  # fmt: skip


@pytest.mark.parametrize("fmt", FLOATS, ids=lambda f: f.display_name())
def test_float_formats_every_mode_and_policy_on_float32(
    fmt: an.FloatFormat, inputs, probe_points, cn
) -> None:  # type: ignore[no-untyped-def]
    """float32 inputs; formats wider than float32 (quantize refuses those there) on float64."""
    try:
        check_representable(fmt, torch.float32)
        dtype = torch.float32
    except an.AnynumError:
        dtype = torch.float64
    x = torch.cat([inputs[dtype], cn.grid_inputs(fmt, dtype, probe_points)])
    cn.check(fmt, x)


OTHERS = [
    an.FixedPoint(4, 8), an.FixedPoint(6, 3, overflow="wrap"), an.FixedPoint(1, 7), an.IntFormat(8),
    an.IntFormat(8, signed=False), an.IntFormat(4, signed=False), an.FixedPoint(10, -2),  # step 4
    an.FixedPoint(30, 10), an.FixedPoint(20, 4, overflow="wrap"),  # float64 working type
    an.Posit(8, 0), an.Posit(8, 2), an.Posit(16, 1), an.Posit(16, 2), an.Posit(32, 2), an.Posit(2, 0),
    an.Posit(3, 1), an.Posit(6, 6), an.Posit(17, 3, underflow="zero"), an.Posit(12, 2, scale_exp=5),
    an.Posit(10, 1, scale_exp=-3, underflow="zero"), an.Posit(3, 9), an.Posit(32, 5),
    an.Posit(20, 0, scale_exp=40),
    an.Table([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]), an.Table([1.5]), an.Table([-1.0, 1.0], ties="even"),
    an.Table([0.1, 0.2, 0.7], ties="away", underflow="saturate", infinity="nan"),
    an.Table([-3.0, -1.0, 1.0, 2.0, 4.0], ties="up"), an.Table([-3.0, -1.0, 1.0, 2.0, 4.0], ties="down"),
    an.Table([-5.0, 0.0, 1e-300, 2.0**1020, 1.7976931348623157e308]),  # huge gaps, a tiny step
    an.Table([-(2.0**-1074), 2.0**-1070, 2.0**-1022, 0.75, 1.0, 1.0 + 2.0**-52, 3.0]),  # subnormal values
    an.Table.from_format(an.E2M1), an.Table.from_format(an.Posit(8, 0)), an.Table.log(2, 1),
    an.Table([0.0, 0.5, 1.0, 3.0], negative="nan", signed_zero=True),
    an.Table([-4.0, -1.0, 0.5, 2.0, 3.0] + [float(v) for v in range(5, 30)], signed_zero=True),  # searched
]  # fmt: skip


@pytest.mark.parametrize("fmt", OTHERS, ids=repr)
def test_fixed_point_posits_and_tables_on_float32_and_float64(
    fmt: an.Format, inputs, probe_points, cn
) -> None:  # type: ignore[no-untyped-def]
    for dtype in (torch.float32, torch.float64):
        try:
            check_representable(fmt, dtype)
        except an.AnynumError:
            continue  # quantize refuses it: values this dtype cannot hold
        x = torch.cat([inputs[dtype], cn.grid_inputs(fmt, dtype, probe_points)])
        cn.check(fmt, x)


def test_fixed_point_sr_on_31_bits_at_its_own_draw(cn) -> None:  # type: ignore[no-untyped-def]
    """Exact SR onto fixed point decides a float run on the draw's top 31 bits where every input
    scales to at least 2**-8 steps (loops.c uniform_sr_clamp): f * 2**31 is an integer there.
    Fractions equal to their element's own 31-bit draw, and one unit either side: up only above
    it. And inputs just below 2**-8 steps, f = (2 d31 + 1) * 2**-32 for the element's draw d31:
    the 53-bit draw goes up where its bit 21 is clear, which a 31-bit decision cannot see, so
    their runs must draw 53 bits. Random inputs meet neither with probability above 2**-31."""
    fmt, n, step = an.FixedPoint(4, 8), 1 << 16, 2.0**-8
    d53 = CounterRandom(7).bits_at(torch.arange(n), 53, 0)
    d31 = d53 >> 22
    x = torch.full((n,), 0.75, dtype=torch.float64)  # a whole number of steps: f = 0
    first = torch.arange(n) < n // 2  # (the two kinds apart: runs with a `below` input draw 53 bits)
    at = (first & (d31 > 1 << 23) & (d31 < (1 << 24) - 1)).nonzero().reshape(-1)[:90]
    below = (~first & (d31 < 1 << 23) & (d31 > 0)).nonzero().reshape(-1)[:40]
    assert at.numel() == 90 and below.numel() == 40
    for off, part in zip((-1, 0, 1), at.tensor_split(3)):
        x[part] = (d31[part] + off).double() * 2.0**-31 * step  # f = (d31 + off) / 2**31
    x[below] = (2 * d31[below] + 1).double() * 2.0**-32 * step
    x = x.float()  # (exact: at most 24 significant bits)
    want = cn.reference(fmt, Rounding.STOCHASTIC, "saturate", None, x)
    up = want > x
    assert [int(up[p].sum()) for p in at.tensor_split(3)] == [0, 0, 30]  # up only above the draw
    assert 0 < int(up[below].sum()) < below.numel()  # the bit below 2**-31 decides both ways
    cn.assert_same(cn.native(fmt, Rounding.STOCHASTIC, "saturate", None, x), want, x, "SR at the draw")


EVERY_FAMILY = [
    an.E4M3FN, an.E5M2, an.BF16, an.FP16, an.E2M1, an.FixedPoint(4, 8), an.FixedPoint(6, 3, overflow="wrap"),
    an.IntFormat(8), an.Posit(8, 2), an.Posit(16, 1), an.Table.from_format(an.E2M1),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", EVERY_FAMILY, ids=repr)
def test_every_family_on_the_other_dtypes(
    fmt: an.Format, dtype: torch.dtype, inputs, probe_points, cn
) -> None:  # type: ignore[no-untyped-def]
    """float16/bfloat16: every bit pattern; float64: random bit patterns and values over its range."""
    try:
        check_representable(fmt, dtype)
    except an.AnynumError:
        # refused, rightly: some value of the format changes when stored in dtype
        vals = torch.from_numpy(fmt.values())
        assert bool((vals.to(dtype).double() != vals).any()), f"{fmt!r} refused on {dtype}"
        return
    x = inputs[dtype]
    if dtype == torch.float64:
        x = torch.cat([x, cn.grid_inputs(fmt, dtype, probe_points)])
    cn.check(fmt, x)


def test_what_the_native_kernels_do_not_cover() -> None:
    assert call_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.int32) is None
    posit_blocks = an.Block(an.Posit(8, 0), 32)
    assert call_params(posit_blocks, Rounding.NEAREST_EVEN, "saturate", None, torch.float32) is None
    no_scales = an.Block(an.E2M1, 32, scale_rule="none")
    assert call_params(no_scales, Rounding.NEAREST_EVEN, "saturate", None, torch.float32) is None
    for fmt in (an.E4M3FN, an.Posit(8, 2), an.Table([0.0, 1.0]), an.MXFP8_E4M3, an.FixedPoint(4, 4)):
        assert call_params(fmt, Rounding.STOCHASTIC, fmt.default_overflow, 7, torch.float16) is not None
