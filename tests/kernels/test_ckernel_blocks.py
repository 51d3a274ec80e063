"""The native kernels on block formats (MX, NVFP4, block floating point) equal the eager reference.

Blocks run per block: the amax (as integer bits of |x|), the scale rule, then the element
format's own rounding of x / scale. Inputs mix ordinary values with the float32 probe's
specials, so blocks holding NaN, inf, zeros only and subnormals all occur; shapes leave short
last blocks (whose padding shifts the random index); axes other than the last are moved.
"""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.quantize.checks import check_representable
from anynum.rounding import Rounding

BLOCKS = [
    an.MXFP8_E4M3, an.MXFP8_E5M2, an.MXFP6_E3M2, an.MXFP6_E2M3, an.MXFP4_E2M1, an.MXINT8, an.NVFP4,
    an.Block(an.E2M1, 8, scale_rule="ceil"), an.Block(an.E2M1, 8, scale_rule="even"),
    an.Block(an.E5M2, 6, scale_rule="amax"),  # power-of-two scales from the amax rule (E8M0)
    an.Block(an.E4M3FN, 16, axis=0), an.Block(an.FixedPoint(4, 4), None, axis=None),
    an.Block(an.IntFormat(8), None), an.Block(an.FixedPoint(3, 3, overflow="wrap"), 4),
    an.Block(an.FP16, 32),  # element exact in float32 only with float64 working
]  # fmt: skip


def _mixed(shape: tuple[int, ...], probe: torch.Tensor, seed: int) -> torch.Tensor:
    """Mostly ordinary values, some drawn from the probe (specials, subnormals, huge and tiny)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    picked = probe[torch.randint(0, probe.numel(), (n,), generator=g)].reshape(shape)
    plain = torch.randn(shape, generator=g) * 3
    x = torch.where(torch.rand(shape, generator=g) < 0.85, plain, picked)
    x[0] = 0.0  # an all-zero row
    return x


@pytest.mark.parametrize("fmt", BLOCKS, ids=repr)
def test_blocks_every_mode_and_dtype(fmt: an.Block, float32_probe: torch.Tensor, cn) -> None:  # type: ignore[no-untyped-def]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        try:
            check_representable(fmt, dtype)
        except an.AnynumError:
            continue
        for shape in ((9, 70), (3, 5, 33)):
            x = _mixed(shape, float32_probe, seed=len(shape)).to(dtype)
            cn.check(fmt, x)


def test_one_long_block_splits_across_threads(float32_probe: torch.Tensor, cn) -> None:  # type: ignore[no-untyped-def]
    """A whole-tensor block (QPyTorch's block floating point) and NVFP4's tensor scale on two threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = _mixed((600, 500), float32_probe, seed=3)
        x[0, 0] = 1e6  # one block's amax far above the rest
        for fmt in (an.Block(an.FixedPoint(4, 4), None, axis=None), an.NVFP4, an.MXFP8_E4M3):
            for mode in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
                got = cn.native(fmt, mode, fmt.default_overflow, None, x)
                torch.set_num_threads(1)
                one = cn.native(fmt, mode, fmt.default_overflow, None, x)
                torch.set_num_threads(2)
                cn.assert_same(got, one, x, (fmt, mode.name, "threads"))
                cn.assert_same(
                    got, cn.reference(fmt, mode, fmt.default_overflow, None, x), x, (fmt, mode.name)
                )
    finally:
        torch.set_num_threads(before)


def test_blocks_write_out_and_in_place(float32_probe: torch.Tensor, cn) -> None:  # type: ignore[no-untyped-def]
    x = _mixed((16, 64), float32_probe, seed=4)
    for fmt in (an.MXFP4_E2M1, an.Block(an.E4M3FN, 16, axis=0)):
        for mode in (Rounding.TOWARD_ZERO, Rounding.STOCHASTIC):
            want = cn.reference(fmt, mode, fmt.default_overflow, None, x)
            out = torch.empty_like(x)
            got = cn.native(fmt, mode, fmt.default_overflow, None, x, out=out)
            cn.assert_same(got, want, x, (fmt, mode.name, "out="))
            inplace = x.clone()
            got = cn.native(fmt, mode, fmt.default_overflow, None, inplace, out=inplace)
            cn.assert_same(got, want, x, (fmt, mode.name, "in place"))
    cl = x.view(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)  # blocked axis not contiguous
    got = cn.native(an.MXFP4_E2M1, Rounding.STOCHASTIC, "saturate", None, cl)
    cn.assert_same(
        got, cn.reference(an.MXFP4_E2M1, Rounding.STOCHASTIC, "saturate", None, cl), cl, "channels-last"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_past_the_dtype_max_go_to_the_reference(dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """A scale rounded up can carry the nearest element past the dtype's max; the reference then
    saturates within the dtype (K9). The C kernel hands such calls on, also when rounding in place."""
    from anynum.kernels.ckernel import native_round
    from anynum.kernels.cparams import call_params
    from anynum.kernels.route import Call

    fmt = an.Block(an.E2M1, block_size=None, scale_rule="ceil")
    big = torch.finfo(dtype).max
    x = torch.tensor([big, 1.0, -big, 3.0], dtype=dtype)
    mode = Rounding.NEAREST_EVEN
    params = call_params(fmt, mode, "saturate", None, dtype)
    assert params is not None
    assert native_round(params, Call(fmt, mode, "saturate", None, dtype, "cpu", None), x, None) is None
    want = cn.reference(fmt, mode, "saturate", None, x)
    assert bool(torch.isfinite(want).all())
    cn.assert_same(an.quantize(x, fmt), want, x, "routed")
    inplace = x.clone()
    an.quantize(inplace, fmt, out=inplace)
    cn.assert_same(inplace, want, x, "in place")
    small = torch.tensor([1.0, -2.5, 0.3, 3.0], dtype=dtype)  # no overflow: the C kernel answers
    got = native_round(params, Call(fmt, mode, "saturate", None, dtype, "cpu", None), small, None)
    assert got is not None
    cn.assert_same(got, cn.reference(fmt, mode, "saturate", None, small), small, "small")
