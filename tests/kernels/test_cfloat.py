"""The C loop for float formats equals the eager reference kernel bit for bit.

The oracle is `round_to_format` (itself checked against ml_dtypes, gfloat and exact
rationals in tests/oracles): every float16 and bfloat16 bit pattern widened to
float32, random float32 bit patterns, values spread over the whole float32 range
and the special values, for every deterministic mode and overflow policy.
"""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.kernels.cfloat import CFloatParams, cfloat_params, cfloat_round
from anynum.kernels.eager import round_to_format
from anynum.rounding import Rounding

# No skip without a compiler: a machine that runs these tests builds the loop (Inductor needs the
# same compiler); there `cfloat_round` returning None fails them.
DETERMINISTIC = [m for m in Rounding if not m.is_stochastic]
NEAREST = Rounding.NEAREST_EVEN
FORMATS = [
    an.E4M3FN,
    an.E5M2,
    an.BF16,
    an.FP16,
    an.TF32,
    an.FP32,
    an.E2M1,
    an.E3M2,
    an.E2M3,
    an.E3M4,
    an.E4M3,
    an.E8M0,  # unsigned, no zero
    an.E4M3FNUZ,
    an.E5M2FNUZ,
    an.format("p3109(8,4)"),
    an.FloatFormat(6, 9),
    an.FloatFormat(4, 3, subnormals=False, specials="fn"),
    an.FloatFormat(5, 2, subnormals=False),
    an.FloatFormat(8, 1),
]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits (so equal zero signs), or NaN on both sides."""
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.display_name())
def test_c_loop_equals_the_reference_in_every_deterministic_mode(
    fmt: an.FloatFormat, float32_probe: torch.Tensor
) -> None:
    x = float32_probe
    for mode in DETERMINISTIC:
        for overflow in ("saturate", "inf", "nan"):
            try:
                overflow = fmt.check_overflow(overflow)
            except an.AnynumError:
                continue  # a policy this format does not take
            params = cfloat_params(fmt, mode, overflow, torch.float32)
            if params is None:  # left to torch's vectorised cast, which test_native_casts checks
                assert (fmt, mode, overflow) in ((an.FP16, NEAREST, "inf"), (an.BF16, NEAREST, "inf"))
                params = CFloatParams(fmt, mode, overflow)  # the loop must be right all the same
            got = cfloat_round(x, params)
            assert got is not None
            assert _same(got, round_to_format(fmt, x, mode, overflow, None, None)), (mode, overflow)


def test_c_loop_writes_into_out_and_in_place(float32_probe: torch.Tensor) -> None:
    x = float32_probe
    params = cfloat_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", torch.float32)
    assert params is not None
    want = round_to_format(an.E4M3FN, x, Rounding.NEAREST_EVEN, "saturate", None, None)
    out = torch.empty_like(x)
    assert cfloat_round(x, params, out) is out and _same(out, want)
    inplace = x.clone()
    cfloat_round(inplace, params, inplace)
    assert _same(inplace, want)
    assert cfloat_round(torch.empty(0), params) is not None
    # Layouts: channels-last is walked as it lies and kept; a transposed view is made row-major;
    # an out= of other strides is written through a temporary.
    n = x.numel() // 96 * 96
    nchw = x[:n].view(-1, 4, 4, 6)
    want4 = want[:n].view(-1, 4, 4, 6)
    cl = nchw.contiguous(memory_format=torch.channels_last)
    y = cfloat_round(cl, params)
    assert y is not None and y.stride() == cl.stride() and _same(y.contiguous(), want4)
    y = cfloat_round(nchw.transpose(1, 3), params)
    assert y is not None and y.is_contiguous() and _same(y, want4.transpose(1, 3).contiguous())
    out_cl = torch.empty_like(cl)
    assert cfloat_round(nchw, params, out_cl) is out_cl and _same(out_cl.contiguous(), want4)


def test_what_the_c_loop_does_not_cover() -> None:
    assert cfloat_params(an.E4M3FN, Rounding.STOCHASTIC, "saturate", torch.float32) is None
    assert cfloat_params(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", torch.float64) is None
    assert cfloat_params(an.FP64, Rounding.NEAREST_EVEN, "inf", torch.float32) is None
    assert cfloat_params(an.Posit(8, 2), Rounding.NEAREST_EVEN, "saturate", torch.float32) is None
    assert cfloat_params(an.BF16, Rounding.NEAREST_EVEN, "inf", torch.float32) is None  # torch's cast
    assert cfloat_params(an.BF16, Rounding.TOWARD_ZERO, "inf", torch.float32) is not None


def test_quantize_and_rounders_take_the_c_loop_in_auto_mode(
    monkeypatch: pytest.MonkeyPatch, float32_probe: torch.Tensor
) -> None:
    """Routing: in "auto" mode float32 CPU tensors below the compile size go through the C loop
    (same bits as the reference, non-contiguous inputs included); ANYNUM_COMPILE=0 keeps them off it."""
    from anynum.kernels import cfloat

    calls: list[int] = []
    real = cfloat.cfloat_round

    def counting(x: torch.Tensor, params: object, out: torch.Tensor | None = None) -> torch.Tensor | None:
        calls.append(x.numel())
        return real(x, params, out)  # type: ignore[arg-type]

    monkeypatch.setattr(cfloat, "cfloat_round", counting)
    monkeypatch.delenv("ANYNUM_COMPILE", raising=False)
    x = float32_probe[-4000:].reshape(40, 100).t()  # non-contiguous: spread values and specials
    want = round_to_format(an.E5M2, x.contiguous(), Rounding.TOWARD_ZERO, "inf", None, None)
    assert _same(an.quantize(x, an.E5M2, "rz"), want)
    rounder = an.nn.Rounder(an.E5M2, "rz")
    assert _same(rounder(x), want)
    inplace = x.contiguous()
    rounder.round_into(inplace)
    assert _same(inplace, want)
    assert calls == [4000, 4000, 4000]
    out = torch.empty(100, 40)
    assert an.quantize(x, an.E5M2, "rz", out=out) is out and _same(out, want)  # written by the loop
    buf = torch.cat([x.reshape(-1), torch.zeros(1)])
    an.quantize(buf[:-1], an.E5M2, "rz", out=buf[1:])  # overlapping shifted: through a temporary
    assert _same(buf[1:], want.reshape(-1))
    an.quantize(buf[1:], an.E5M2, "rz", out=buf[1:])  # in place
    assert _same(buf[1:], want.reshape(-1))
    assert len(calls) == 6
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    assert _same(an.quantize(x, an.E5M2, "rz"), want)
    assert _same(rounder(x), want)
    assert len(calls) == 6
