"""`native_round_each` / `Rounder.round_each_into`: many tensors in one call, rounded exactly as
their concatenation (the optimizer's path), against the eager reference on the concatenation."""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.errors import AnynumError
from anynum.kernels.ckernel import native_round_each
from anynum.kernels.cparams import call_params
from anynum.kernels.route import Call
from anynum.optim.optimizer import round_in_place
from anynum.quantize.rounder import Rounder
from anynum.rounding import CounterRandom, Rounding

SR, SRU = Rounding.STOCHASTIC, Rounding.STOCHASTIC_UNIFORM
FAMILIES = [
    an.E4M3FN,
    an.E5M2,
    an.BF16,
    an.FixedPoint(4, 8),
    an.Posit(8, 0),
    an.Posit(16, 1),
    an.Table.from_format(an.E2M1),
]
SHAPES = [(3, 5), (7,), (), (0,), (2, 3, 4), (40000,), (1,)]  # one spans a 2-thread part boundary


def _tensors(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in SHAPES:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(
            torch.randint(-10, 10, shape, generator=g)
        )
        out.append(x.to(dtype))
    out[0].view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    return out


def _each(fmt: an.Format, mode: Rounding, xs: list[torch.Tensor], rand_bits: int | None = None) -> bool:
    params = call_params(fmt, mode, fmt.default_overflow, rand_bits, xs[0].dtype)
    assert params is not None
    rng = CounterRandom(7) if mode.is_stochastic else None
    call = Call(fmt, mode, fmt.default_overflow, rand_bits, xs[0].dtype, "cpu", "counter" if rng else None)
    return native_round_each(params, call, xs, rng)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", FAMILIES, ids=repr)
def test_each_tensor_gets_the_concatenations_values(
    fmt: an.Format, dtype: torch.dtype, threads: int, cn
) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for mode in [Rounding.NEAREST_EVEN, Rounding.UP, Rounding.ODD, SR, SRU]:
            for rb in (None, 4) if mode is SR else (None,):
                xs = _tensors(dtype)
                flat = torch.cat([x.reshape(-1) for x in xs])
                want = cn.reference(fmt, mode, fmt.default_overflow, rb, flat).split([x.numel() for x in xs])
                assert _each(fmt, mode, xs, rb), "the native library did not build"
                for k, (x, w) in enumerate(zip(xs, want)):
                    cn.assert_same(x.reshape(-1), w, flat, (fmt, mode.name, rb, dtype, threads, k))
    finally:
        torch.set_num_threads(before)


def test_undecided_exact_sr_elements_are_refined_over_the_concatenation(cn) -> None:  # type: ignore[no-untyped-def]
    flat, i = cn.self_tie(4096, seed=7)  # element i ties its own first 53 random bits
    want = cn.reference(an.FP16, SR, "inf", None, flat)
    cut = max(1, i // 2)
    xs = [flat[:cut].clone(), flat[cut:].clone()]
    assert _each(an.FP16, SR, xs)
    cn.assert_same(torch.cat(xs), want, flat, "refined")


def test_it_declines_what_it_cannot_do_and_writes_nothing() -> None:
    xs = [torch.randn(4, 6)[:, ::2], torch.randn(3)]  # a strided view
    before = [x.clone() for x in xs]
    assert not _each(an.E4M3FN, Rounding.NEAREST_EVEN, xs)
    assert all(torch.equal(a, b) for a, b in zip(xs, before))
    block = [torch.randn(32), torch.randn(32)]
    assert not _each(an.MXFP8_E4M3, Rounding.NEAREST_EVEN, block)


@pytest.mark.parametrize("fmt", [an.E4M3FN, an.MXFP8_E4M3, an.Posit(8, 0)], ids=repr)
@pytest.mark.parametrize("rounding", ["nearest", "sr"])
def test_round_in_place_agrees_with_rounding_the_concatenation(fmt: an.Format, rounding: str) -> None:
    xs = [t.float() for t in _tensors(torch.float32, seed=3)]
    xs.append(torch.randn(8, 4)[:, ::2])  # not contiguous: the flat buffer path
    flat = torch.cat([x.reshape(-1) for x in xs])
    want = Rounder(fmt, rounding, seed=11)(flat).split([x.numel() for x in xs])
    staging: dict = {}
    round_in_place(xs, Rounder(fmt, rounding, seed=11), staging)
    for x, w in zip(xs, want):
        assert torch.equal(x.reshape(-1).nan_to_num(7.0), w.nan_to_num(7.0))
    ys = [t.float() for t in _tensors(torch.float32, seed=3)]  # all contiguous: one native call
    flat = torch.cat([y.reshape(-1) for y in ys])
    want = Rounder(fmt, rounding, seed=11)(flat).split([y.numel() for y in ys])
    round_in_place(ys, Rounder(fmt, rounding, seed=11), staging)
    for y, w in zip(ys, want):
        assert torch.equal(y.reshape(-1).nan_to_num(7.0), w.nan_to_num(7.0))


def test_round_each_into_refuses_mixed_dtypes() -> None:
    with pytest.raises(AnynumError, match="one dtype and device"):
        Rounder(an.BF16).round_each_into([torch.ones(2), torch.ones(2, dtype=torch.float64)])
