"""The fused (torch.compile) path gives the eager reference's results bit for bit.

Both paths run the same kernel code, and stochastic modes draw the same
counter-based bits, so any difference is a compiler or dispatch bug.
"""

from __future__ import annotations

import math

import pytest
import torch

import anynum as an
from anynum.kernels import fused_round, round_to_format
from anynum.kernels.fused import own_code, static_ints
from anynum.rounding import CounterRandom, Rounding

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    # a compile failure falls back to eager, which would make these comparisons vacuous
    pytest.mark.filterwarnings("error:anynum. torch.compile failed:RuntimeWarning"),
]


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    """Random values over many binades plus every special case, as a non-contiguous view."""
    g = torch.Generator().manual_seed(0)
    n = 1 << 14
    mags = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-40, 40, (n,), generator=g).to(torch.float64)
    )
    tiny = torch.finfo(dtype).smallest_normal
    specials = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, 1.5, 2.5, 448.0, 464.0, 480.0,
         65504.0, 65520.0, 1e38, -1e38, tiny, tiny * 2**-5, -tiny * 2**-20],
        dtype=torch.float64,
    )
    x = torch.cat([mags, specials]).to(dtype)
    both = torch.stack([x, -x], dim=1)
    return both.t()[0]  # stride-2 view of x: exercises non-contiguous inputs


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN, and equal signs of zeros (NaN signs carry no meaning)."""
    both_nan = a.isnan() & b.isnan()
    return bool(((a == b) | both_nan).all()) and bool(((a.signbit() == b.signbit()) | both_nan).all())


ALL_MODES = list(Rounding)


@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_every_mode_e4m3fn_float32(mode: Rounding) -> None:
    x = _inputs(torch.float32)
    rng = CounterRandom(7) if mode.is_stochastic else None
    ref = round_to_format(an.E4M3FN, x, mode, "saturate", rng, None)
    fast = fused_round(an.E4M3FN, x, mode, "saturate", rng, None)
    assert _same(ref, fast)


CASES = [
    (an.E5M2, "inf"),
    (an.BF16, "inf"),
    (an.FP16, "inf"),
    (an.FloatFormat(6, 9), "inf"),
    (an.E2M1, "saturate"),
    (an.E8M0, "saturate"),
    (an.FloatFormat(4, 3, subnormals=False, specials="fn"), "nan"),
    (an.FixedPoint(4, 8), "saturate"),
    (an.FixedPoint(6, 3, overflow="wrap"), "wrap"),
    (an.IntFormat(8), "saturate"),
    (an.MXFP8_E4M3, "saturate"),
    (an.NVFP4, "saturate"),
    (an.Posit(8, 2), "saturate"),
    (an.Posit(16, 1), "saturate"),
    (an.Posit(32, 2), "saturate"),
    (an.Posit(17, 3, underflow="zero"), "saturate"),  # lifts float32 subnormal inputs
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt,overflow", CASES, ids=lambda v: repr(v))
@pytest.mark.parametrize("mode", [Rounding.NEAREST_EVEN, Rounding.STOCHASTIC], ids=lambda m: m.name)
def test_formats_and_dtypes(fmt: an.Format, overflow: str, dtype: torch.dtype, mode: Rounding) -> None:
    x = _inputs(dtype)
    rng = CounterRandom(11) if mode.is_stochastic else None
    ref = round_to_format(fmt, x, mode, overflow, rng, None)
    fast = fused_round(fmt, x, mode, overflow, rng, None)
    assert _same(ref, fast)


def test_hardware_stochastic_rand_bits() -> None:
    x = _inputs(torch.float32)
    rng = CounterRandom(3)
    ref = round_to_format(an.E5M2, x, Rounding.STOCHASTIC, "inf", rng, 6)
    fast = fused_round(an.E5M2, x, Rounding.STOCHASTIC, "inf", rng, 6)
    assert _same(ref, fast)


def test_out_is_written_in_place() -> None:
    x = _inputs(torch.float32).contiguous()
    out = torch.empty_like(x)
    res = fused_round(an.FP16, x, Rounding.NEAREST_EVEN, "inf", None, None, out)
    assert res.data_ptr() == out.data_ptr()
    assert _same(out, round_to_format(an.FP16, x, Rounding.NEAREST_EVEN, "inf", None, None))


def test_quantize_uses_fused_path_when_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _inputs(torch.float32)
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    ref = an.quantize(x, an.E4M3FN, "sr", seed=5)
    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    fast = an.quantize(x, an.E4M3FN, "sr", seed=5)
    assert _same(ref, fast)


def test_undecided_stochastic_falls_back_to_exact_refinement() -> None:
    # x far below the grid step: its fraction has more than 53 bits, and a source whose
    # first 53 bits tie with it forces refinement; fused and eager must still agree.
    class TieFirst(CounterRandom):
        def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
            if stream == 0:
                return torch.zeros_like(index)
            return CounterRandom(self.seed).bits_at(index, nbits, stream)

        def stream_base(self, stream: int) -> int | None:
            return None  # not counter-based: the fused path must not be used

    x = torch.full((64,), 2.0**-140, dtype=torch.float64)
    rng = TieFirst(1)
    ref = round_to_format(an.FP16, x, Rounding.STOCHASTIC, "inf", rng, None)
    fast = fused_round(an.FP16, x, Rounding.STOCHASTIC, "inf", rng, None)
    assert _same(ref, fast)


def test_fused_kernel_reports_an_undecided_element_and_falls_back() -> None:
    """An input built to tie with its own first 53 random bits: the compiled kernel flags it,
    and `fused_round` then gives the eager path's refined result."""
    from anynum.kernels.fused import _compiled

    rng = CounterRandom(5)
    base = rng.stream_base(0)
    bits = rng.bits_at(torch.arange(4096), 53, 0)
    i = int(torch.argmin(bits))  # a small draw: k < 2**(53 - spare)
    k = int(bits[i])
    spare = 53 - k.bit_length()
    assert spare >= 6
    # f = k * 2**-53 + 2**-(53 + spare) has k.bit_length() + spare = 53 significant bits: a float64,
    # whose first 53 fraction bits equal k and which has one more bit below them.
    f = k * 2.0**-53 + 2.0 ** -(53 + spare)
    x = torch.full((4096,), 0.75 * 2.0**-24, dtype=torch.float64)
    x[i] = f * 2.0**-24  # the FP16 grid step below 2**-14 is 2**-24, so s = x / step = f
    kernel = _compiled(an.FP16, Rounding.STOCHASTIC, "inf", None, torch.float64)
    _, pending = kernel(x, torch.tensor(base, dtype=torch.int64))
    assert bool(pending)
    ref = round_to_format(an.FP16, x, Rounding.STOCHASTIC, "inf", rng, None)
    fast = fused_round(an.FP16, x, Rounding.STOCHASTIC, "inf", rng, None)
    assert _same(ref, fast)


@pytest.mark.parametrize("n", [1, 37, 100, 16404])
@pytest.mark.parametrize("nbits", [1, 8, 53])
def test_counter_bits_compiled_match_eager_at_awkward_sizes(n: int, nbits: int) -> None:
    # Regression: `index * constant` let Inductor fold int64 overflow into loop
    # arithmetic (undefined behaviour) and the vector tail got different bits.
    from anynum.rounding import counter_bits, element_index

    base = torch.tensor(CounterRandom(7).stream_base(0))

    def bits(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return counter_bits(b, element_index(x), nbits)

    x = torch.zeros(n)
    assert torch.equal(static_ints(torch.compile(own_code(bits), fullgraph=True))(x, base), bits(x, base))


CODEC_FORMATS = [
    an.E4M3FN,
    an.E5M2,
    an.E2M1,
    an.FloatFormat(4, 3, subnormals=False, specials="fn"),
    an.FixedPoint(4, 8),
    an.IntFormat(8),
    an.Posit(16, 1),
    an.Posit(32, 2),
    an.Table([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]),
]


@pytest.mark.parametrize("fmt", CODEC_FORMATS, ids=repr)
def test_encode_and_decode_compiled_match_eager(fmt: an.Format) -> None:
    from anynum.kernels.fused import fused_decode, fused_encode

    x = _inputs(torch.float32)
    x = x[~x.isnan()] if not fmt.has_nan else x
    y = an.quantize(x, fmt)
    codes = fmt.encode_kernel(y.to(torch.float64))
    assert torch.equal(fused_encode(fmt, y), codes)
    assert torch.equal(fused_encode(fmt, y.double()), codes)
    assert _same(fused_decode(fmt, codes), fmt.decode_torch(codes))


def test_encode_nan_without_a_code_raises_on_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    with pytest.raises(an.AnynumError, match="no NaN code"):
        an.encode(torch.tensor([1.0, math.nan]), an.E2M1)
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    with pytest.raises(an.AnynumError, match="no NaN code"):
        an.encode(torch.tensor([1.0, math.nan]), an.E2M1)


def test_out_overlapping_the_input_is_not_written_while_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shifted view as out= (NumPy or torch) and in-place exact SR take the safe route."""
    import numpy as np

    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    base = _inputs(torch.float32).contiguous()[:4000].clone()
    want = an.quantize(base.clone(), an.E5M2)
    buf = torch.cat([base, torch.zeros(1)])
    an.quantize(buf[:-1], an.E5M2, out=buf[1:])
    assert _same(buf[1:], want)
    nbuf = np.concatenate([base.numpy(), np.zeros(1, dtype=np.float32)])
    an.quantize(nbuf[:-1], an.E5M2, out=nbuf[1:])
    assert _same(torch.from_numpy(nbuf[1:]), want)
    inplace = base.clone()
    an.quantize(inplace, an.E5M2, "sr", seed=4, out=inplace)
    assert _same(inplace, an.quantize(base, an.E5M2, "sr", seed=4))


def test_a_failed_compile_warns_once_and_quantize_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from anynum.kernels import ckernel, fused

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(fused, "_failed", set())
    monkeypatch.setattr(fused, "_compiled", broken)
    monkeypatch.setattr(ckernel, "library", lambda: None)  # CPU calls reach the compiled kernel
    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    x = _inputs(torch.float32)
    ref = round_to_format(an.E2M1, x, Rounding.NEAREST_EVEN, "saturate", None, None)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert _same(an.quantize(x, an.E2M1), ref)
    with warnings.catch_warnings():  # remembered: no second warning
        warnings.simplefilter("error")
        assert _same(an.quantize(x, an.E2M1), ref)


def test_a_warm_kernel_skips_dynamo_and_still_equals_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once compiled for a dynamic size, a kernel calls its graph directly for any 1-D contiguous
    input of the compiled dtype; everything else is refused by the plan and goes back to dynamo."""
    from anynum.kernels.fused import _compiled

    kernel = _compiled(an.E5M2, Rounding.STOCHASTIC, "inf", None, torch.float32)
    first = _inputs(torch.float32).contiguous()[:1000]
    torch._dynamo.maybe_mark_dynamic(first, 0)
    kernel(first, torch.tensor(CounterRandom(3).stream_base(0)))
    assert kernel._plan is not None

    def no_dynamo(*args: object) -> object:
        raise AssertionError("went through dynamo")

    monkeypatch.setattr(kernel, "_guarded", no_dynamo)
    values = _inputs(torch.float32).contiguous()
    for n, seed in ((2, 1), (3, 2), (17, 3), (4099, 4), (values.numel(), 5)):
        x = values[:n].clone()
        rng = CounterRandom(seed)
        y, pending = kernel(x, torch.tensor(rng.stream_base(0)))
        assert not bool(pending)
        assert _same(y, round_to_format(an.E5M2, x, Rounding.STOCHASTIC, "inf", CounterRandom(seed), None))
    plan, base = kernel._plan, torch.tensor(0)
    x = values[:64].clone()
    assert plan.call((x, base)) is not None
    assert plan.call((values[:128:2], base)) is None  # not contiguous
    assert plan.call((x.double(), base)) is None
    assert plan.call((x[:1], base)) is None  # sizes 0 and 1 are specialised by dynamo
    assert plan.call((x.view(8, 8), base)) is None
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert plan.call((x, base)) is None
    finally:
        torch.set_num_threads(threads)
