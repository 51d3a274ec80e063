"""The deterministic modes on the working type's bits (scalar.c float_bits, cparams.float_on_bits)
against the eager reference: for each binade of float32 and float64, the fraction patterns at
and beside every kind of rounding boundary (ties to even and odd, one unit either side, carries
into the next binade and into overflow), the format's subnormals and the specials, in every
deterministic mode and overflow policy."""

from __future__ import annotations

import itertools

import pytest
import torch

import anynum as an
from anynum.kernels.cparams import call_params, float_on_bits
from anynum.rounding import Rounding

DETERMINISTIC = [m for m in Rounding if not m.is_stochastic]
ON_BITS = [
    an.E4M3FN, an.E5M2, an.BF16, an.FP16, an.TF32, an.E2M1, an.E3M2, an.E2M3, an.E4M3,
    an.E4M3FNUZ, an.E5M2FNUZ,  # no negative zero: -0 results become +0
    an.format("p3109(8,4)"), an.FloatFormat(8, 1), an.FloatFormat(6, 9),
]  # fmt: skip
NOT_ON_BITS = [
    an.FP32,  # as wide as float32: nothing to drop
    an.E8M0,  # unsigned, no zero
    an.FloatFormat(5, 2, subnormals=False),  # flushes
    an.FloatFormat(9, 5),  # binades beyond float32
    an.FloatFormat(4, 0),  # no fraction bits (kept out: ties there go up, not to an even exponent)
]


def _boundaries(dtype: torch.dtype, man: int) -> torch.Tensor:
    """Every binade of `dtype`, fraction patterns around ties and grid points for `man` kept bits."""
    wman, ebits, it = (23, 8, torch.int32) if dtype == torch.float32 else (52, 11, torch.int64)
    drop = wman - man
    unit, half = 1 << drop, 1 << (drop - 1)
    g = torch.Generator().manual_seed(man)
    kept = [*torch.randint(0, 1 << min(man, 20), (6,), generator=g).tolist(), 0, 1, (1 << man) - 1]
    fracs = set()
    for k in kept:
        for off in (0, 1, half - 1, half, half + 1, unit - 1):
            fracs.add((k * unit + off) % (1 << wman))
    frac = torch.tensor(sorted(fracs), dtype=torch.int64)
    exps = torch.arange(0, (1 << ebits), dtype=torch.int64)  # zero/subnormal field ... inf/NaN field
    bits = (exps[:, None] << wman | frac[None, :]).reshape(-1)  # positive patterns fit `it`
    x = bits.to(it).view(dtype)
    return torch.cat([x, -x])  # negation flips the sign bit alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", ON_BITS, ids=lambda f: f.display_name())
def test_bits_path_equals_the_reference_at_every_boundary(
    fmt: an.FloatFormat, dtype: torch.dtype, cn
) -> None:  # type: ignore[no-untyped-def]
    params = call_params(fmt, Rounding.NEAREST_EVEN, fmt.default_overflow, None, dtype)
    assert params is not None and params.struct.f.on_bits == 1  # this test covers the bits path
    x = _boundaries(dtype, fmt.man_bits)
    for mode, overflow in itertools.product(DETERMINISTIC, fmt.overflow_policies):
        want = cn.reference(fmt, mode, overflow, None, x)
        got = cn.native(fmt, mode, overflow, None, x)
        cn.assert_same(got, want, x, (fmt.display_name(), mode.name, overflow, dtype))
        zeros = want == 0  # and the zeros' signs, which same() compares bit for bit
        assert torch.equal(got[zeros].signbit(), want[zeros].signbit())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_bits_path_on_half_inputs_every_pattern(dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype)
    for fmt, mode in itertools.product((an.E4M3FN, an.E5M2, an.E2M1, an.E4M3FNUZ), DETERMINISTIC):
        want = cn.reference(fmt, mode, fmt.default_overflow, None, x)
        cn.assert_same(cn.native(fmt, mode, fmt.default_overflow, None, x), want, x, (fmt, mode.name))


def test_which_formats_take_the_bits_path() -> None:
    for fmt in ON_BITS:
        assert float_on_bits(fmt, torch.float32) and float_on_bits(fmt, torch.float64), fmt
    for fmt in NOT_ON_BITS:
        assert not float_on_bits(fmt, torch.float32), fmt
    assert float_on_bits(an.FloatFormat(9, 5), torch.float64)  # fits float64's binades
