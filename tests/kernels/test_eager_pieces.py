"""The eager reference rounds a large CPU tensor in pieces (`anynum.kernels.eager.EAGER_PIECE`),
each piece drawing the whole tensor's random bits for its elements. Oracle: `round_to_format` on
the whole tensor at once, the reference as written, for every elementwise family, mode, input
dtype and exact SR's refinement of an element that ties its own draw."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import anynum as an
from anynum.formats.block import UE4M3
from anynum.kernels import eager
from anynum.kernels.eager import EagerKernel, round_to_format, working_dtype
from anynum.kernels.route import Call
from anynum.rounding import CounterRandom, RandomSource, Rounding

FORMATS = [
    an.E4M3FN,
    an.E5M2,
    an.BF16,
    an.FixedPoint(4, 8),
    an.Posit(8, 0),
    an.Posit(16, 1),
    an.Table.from_format(an.E2M1),
]
N = 3_500  # three pieces of 1,000 and a short one


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(eager, "EAGER_PIECE", 1_000)
    return 1_000


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, cn: Any) -> list[int]:
    """The sizes of the tensors the reference rounds (one per piece), in order."""
    sizes: list[int] = cn.count_pieces(monkeypatch)
    return sizes


def whole(
    fmt: an.Format, mode: Rounding, x: torch.Tensor, rng: RandomSource | None, rand_bits: int | None
) -> torch.Tensor:
    y = round_to_format(
        fmt, x.to(working_dtype(fmt, x.dtype)), mode, fmt.overflow_policies[0], rng, rand_bits
    )
    return y.to(x.dtype)


def in_pieces(
    fmt: an.Format, mode: Rounding, x: torch.Tensor, rng: RandomSource | None, rand_bits: int | None
) -> torch.Tensor:
    random = "counter" if rng is not None else None
    call = Call(fmt, mode, fmt.overflow_policies[0], rand_bits, x.dtype, "cpu", random)
    return EagerKernel().round(call, x, rng, None)


def inputs(fmt: an.Format, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    span = min(float(fmt.max), 1e4)
    x = (torch.rand(N, generator=g, dtype=torch.float64) * 2 - 1) * 1.2 * span
    x[::7] = torch.randn(len(x[::7]), generator=g, dtype=torch.float64) * fmt.smallest_subnormal * 4
    x[5], x[1500], x[2999] = float("nan"), float("inf"), -0.0
    return x.to(dtype)


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_mode_in_pieces_is_the_whole_reference(
    fmt: an.Format, dtype: torch.dtype, small_pieces: int, cn: Any
) -> None:
    x = inputs(fmt, dtype)
    for mode in Rounding:
        for rand_bits in (None, 3) if mode is Rounding.STOCHASTIC else (None,):
            rng = CounterRandom(11) if mode.is_stochastic else None
            want = whole(fmt, mode, x, rng, rand_bits)
            got = in_pieces(fmt, mode, x, rng, rand_bits)
            cn.assert_same(got, want, x, (fmt, mode.name, rand_bits, dtype))


def test_a_tie_refined_in_a_later_piece(small_pieces: int, cn: Any) -> None:
    seed = next(s for s in range(5, 100) if cn.self_tie(N, s)[1] >= small_pieces)  # not in piece 0
    x, i = cn.self_tie(N, seed)
    rng = CounterRandom(seed)
    want = whole(an.FP16, Rounding.STOCHASTIC, x, rng, None)
    got = in_pieces(an.FP16, Rounding.STOCHASTIC, x, rng, None)
    cn.assert_same(got, want, x, "tie")
    # the piece holding the tie draws its refinement from the whole tensor's stream: a piece
    # rounded as a tensor of its own (indices from 0) draws other bits for every element
    start = i - i % small_pieces
    alone = whole(an.FP16, Rounding.STOCHASTIC, x[start : start + small_pieces], rng, None)
    assert not torch.equal(alone, want[start : start + small_pieces])


def test_pieces_are_used_and_the_whole_path_stays_where_it_must(small_pieces: int, calls: list[int]) -> None:
    x = torch.randn(N)
    in_pieces(an.E4M3FN, Rounding.STOCHASTIC, x, CounterRandom(1), None)
    assert calls == [1_000, 1_000, 1_000, 500]

    class Injected(RandomSource):  # bits by position, not a function of the index alone
        def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
            return torch.zeros_like(index)

    for x_, rng in ((torch.randn(N), Injected()), (torch.randn(N, 2).t(), CounterRandom(1))):
        calls.clear()
        in_pieces(an.E4M3FN, Rounding.STOCHASTIC, x_, rng, None)
        assert calls == [x_.numel()]  # one call: the whole tensor


def test_the_default_piece_and_a_large_call() -> None:
    """The module's own piece size on a tensor of several pieces, through the whole kernel."""
    x = torch.randn(3 * eager.EAGER_PIECE + 17)
    rng = CounterRandom(9)
    want = whole(an.E5M2, Rounding.STOCHASTIC, x, rng, None)
    assert torch.equal(in_pieces(an.E5M2, Rounding.STOCHASTIC, x, rng, None), want)


#: Block formats cut into whole blocks: the MX presets (axis -1), a positive axis, a flattened
#: one, "amax" scales in E4M3 (NVFP4's rule without its tensor scale), and NVFP4 with its tensor
#: scale, along rows and flattened.
BLOCKS = [
    an.MXFP8_E4M3,
    an.MXFP4_E2M1,
    an.MXINT8,
    an.Block(an.E2M1, 16, axis=1),
    an.Block(an.FixedPoint(4, 3), 8, axis=None),
    an.Block(an.E2M1, 16, scale=UE4M3, scale_rule="amax"),
    an.NVFP4,
    an.Block(an.E2M1, 16, scale=UE4M3, scale_rule="amax", tensor_scale=an.FP32, axis=None),
]
ROWS, COLS = 6, 640  # 3,840 elements: pieces of 992 (31 blocks of 32) or 992 (62 of 16)


def block_inputs(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, COLS, generator=g, dtype=torch.float64) * 3
    x[:, ::9] *= 1e-3  # blocks with a wide range: elements far below the block's largest
    x[0, 5], x[2, 100], x[4, 639] = float("nan"), float("inf"), -0.0
    x[5, 32:64] = 0.0  # an all-zero block
    return x.to(dtype)


@pytest.mark.parametrize("fmt", BLOCKS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_block_formats_in_whole_blocks_are_the_whole_reference(
    fmt: an.Block, dtype: torch.dtype, small_pieces: int, cn: Any, calls: list[int]
) -> None:
    x = block_inputs(dtype)
    for mode in Rounding:
        for rand_bits in (None, 3) if mode is Rounding.STOCHASTIC else (None,):
            rng = CounterRandom(7) if mode.is_stochastic else None
            want = whole(fmt, mode, x, rng, rand_bits)
            calls.clear()
            got = in_pieces(fmt, mode, x, rng, rand_bits)
            assert len(calls) == 4 and sum(calls) == x.numel(), calls  # cut, at block boundaries
            cn.assert_same(got, want, x, (fmt, mode.name, rand_bits, dtype))


def test_block_formats_stay_whole_where_a_cut_would_change_them(small_pieces: int, calls: list[int]) -> None:
    cases = [
        (an.MXFP8_E4M3, torch.randn(ROWS, 650)),  # each row's last block padded
        (an.Block(an.E2M1, 16, axis=0), torch.randn(640, ROWS)),  # blocks across rows
        (an.Block(an.E2M1, None), torch.randn(ROWS, COLS)),  # one block per row
    ]
    for fmt, x in cases:
        calls.clear()
        in_pieces(fmt, Rounding.STOCHASTIC, x, CounterRandom(1), None)
        assert calls == [x.numel()], fmt


@pytest.mark.parametrize("where", [(0, 3), (5, 600)], ids=["first piece", "last piece"])
def test_nvfp4_pieces_take_the_whole_tensors_scale(
    where: tuple[int, int], small_pieces: int, cn: Any, calls: list[int]
) -> None:
    """The tensor's largest element sits in one piece: every other piece must still be rounded
    with the scale it sets (a piece's own amax gives another scale, and other values)."""
    x = block_inputs(torch.float32)
    x[where] = 5e3
    for mode in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
        rng = CounterRandom(3) if mode.is_stochastic else None
        want = whole(an.NVFP4, mode, x, rng, None)
        calls.clear()
        got = in_pieces(an.NVFP4, mode, x, rng, None)
        assert len(calls) == 4, calls
        cn.assert_same(got, want, x, mode.name)
    # the check has teeth: a piece without that element, rounded on its own, comes out otherwise
    far = slice(992, 1984) if where[0] == 0 else slice(0, 992)
    alone = whole(an.NVFP4, Rounding.NEAREST_EVEN, x.view(-1)[far].view(-1, 16), None, None).view(-1)
    assert not torch.equal(alone, whole(an.NVFP4, Rounding.NEAREST_EVEN, x, None, None).view(-1)[far])
