"""The native kernels on strided, channels-last and transposed inputs, with out= and in place, on
one and two threads, and the rare exact-SR elements they hand back for refinement.

Random bits are addressed by each element's row-major *logical* index, so a channels-last
tensor rounded in memory order must give the eager reference's bits; results must not depend
on the number of threads (the library splits calls into parts from 2 threads on).
"""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.kernels.ckernel import native_round
from anynum.kernels.clib import library
from anynum.kernels.cparams import call_params
from anynum.kernels.route import Call
from anynum.rounding import CounterRandom, Rounding

SR, SRU = Rounding.STOCHASTIC, Rounding.STOCHASTIC_UNIFORM
FAMILIES = [an.E5M2, an.BF16, an.FixedPoint(4, 8), an.Posit(16, 1), an.Table.from_format(an.E2M1)]


@pytest.fixture
def two_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _values(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-12, 12, shape, generator=g)
    )
    return x.to(dtype)


@pytest.mark.parametrize("fmt", FAMILIES, ids=repr)
@pytest.mark.parametrize("mode", [Rounding.NEAREST_EVEN, Rounding.UP, SR, SRU], ids=lambda m: m.name)
def test_channels_last_transposed_and_strided_inputs(fmt: an.Format, mode: Rounding, cn) -> None:  # type: ignore[no-untyped-def]
    nchw = _values((3, 5, 7, 11))
    cl = nchw.contiguous(memory_format=torch.channels_last)
    overflow = fmt.default_overflow
    for x, keeps_strides in (
        (cl, True),  # dense, walked in memory order without a copy
        (nchw.transpose(1, 3), True),  # dense and permuted
        (nchw[:, ::2], False),  # gaps: made contiguous first
        (nchw[0, 0, 0], True),  # one row
    ):
        want = cn.reference(fmt, mode, overflow, None, x)
        got = cn.native(fmt, mode, overflow, None, x)
        cn.assert_same(got, want, x, (fmt, mode.name, x.stride()))
        if keeps_strides:
            assert got.stride() == x.stride()
    scalar = torch.tensor(0.3)
    cn.assert_same(
        cn.native(fmt, mode, overflow, None, scalar),
        cn.reference(fmt, mode, overflow, None, scalar),
        scalar,
        "0-d",
    )
    empty = torch.empty(0, 4)
    assert cn.native(fmt, mode, overflow, None, empty).shape == (0, 4)


@pytest.mark.parametrize("mode", [Rounding.TOWARD_ZERO, SR], ids=lambda m: m.name)
def test_out_and_in_place(mode: Rounding, cn) -> None:  # type: ignore[no-untyped-def]
    fmt = an.E4M3FN
    x = _values((64, 33), seed=3)
    want = cn.reference(fmt, mode, "saturate", None, x)
    out = torch.empty_like(x)
    assert cn.native(fmt, mode, "saturate", None, x, out=out) is out and bool(torch.equal(out, want))
    inplace = x.clone()
    assert cn.native(fmt, mode, "saturate", None, inplace, out=inplace) is inplace
    cn.assert_same(inplace, want, x, "in place")
    cl = x.view(4, 16, 3, 11).contiguous(memory_format=torch.channels_last)
    out_cl = torch.empty_like(cl)
    assert cn.native(fmt, mode, "saturate", None, cl, out=out_cl) is out_cl
    cn.assert_same(out_cl, cn.reference(fmt, mode, "saturate", None, cl), cl, "channels-last out=")
    other = torch.empty(4, 16, 3, 11)  # strides differ from the input's: a new tensor, not written
    y = cn.native(fmt, mode, "saturate", None, cl, out=other)
    assert y is not other and y.stride() == cl.stride()


def test_the_front_door_writes_out_in_step_or_through_a_temporary(
    monkeypatch: pytest.MonkeyPatch, cn
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    x = _values((4000,), seed=4)
    want = cn.reference(an.E5M2, SR, "inf", None, x, seed=9)
    buf = torch.cat([x, torch.zeros(1)])
    an.quantize(buf[:-1], an.E5M2, "sr", seed=9, out=buf[1:])  # overlapping, shifted
    cn.assert_same(buf[1:], want, x, "shifted out=")
    nchw = x.view(10, 4, 10, 10)
    out = torch.empty(10, 4, 10, 10).contiguous(memory_format=torch.channels_last)
    assert an.quantize(nchw, an.E5M2, "sr", seed=9, out=out) is out
    cn.assert_same(out.contiguous(), want.view(10, 4, 10, 10), x, "out= of other strides")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", FAMILIES, ids=repr)
def test_two_threads_give_the_one_thread_bits(fmt: an.Format, dtype: torch.dtype, two_threads, cn) -> None:  # type: ignore[no-untyped-def]
    """Sizes well above every family's grain, so that two parts really run."""
    try:
        an.quantize(torch.zeros(1, dtype=dtype), fmt)
    except an.AnynumError:
        # refused, rightly: some value of the format changes when stored in dtype
        vals = torch.from_numpy(fmt.values())
        assert bool((vals.to(dtype).double() != vals).any()), f"{fmt!r} refused on {dtype}"
        return
    x = _values((300_007,), dtype, seed=5)
    cl = _values((8, 37, 23, 41), dtype, seed=6).contiguous(memory_format=torch.channels_last)
    for mode in (Rounding.NEAREST_EVEN, Rounding.ODD, SR, SRU):
        for t in (x, cl):
            two = cn.native(fmt, mode, fmt.default_overflow, None, t)
            torch.set_num_threads(1)
            one = cn.native(fmt, mode, fmt.default_overflow, None, t)
            torch.set_num_threads(2)
            cn.assert_same(two, one, t, (fmt, mode.name, "threads"))
            cn.assert_same(two, cn.reference(fmt, mode, fmt.default_overflow, None, t), t, (fmt, mode.name))
    two = cn.native(fmt, SR, fmt.default_overflow, 5, x)
    cn.assert_same(two, cn.reference(fmt, SR, fmt.default_overflow, 5, x), x, (fmt, "rand_bits"))
    lib = library()
    assert lib is not None
    assert lib.anynum_torch_team() or lib.anynum_pool_workers() >= 1  # two parts ran side by side


def test_undecided_exact_sr_elements_are_refined_like_the_reference(cn) -> None:  # type: ignore[no-untyped-def]
    x, i = cn.self_tie(4096, seed=5)
    params = call_params(an.FP16, SR, "inf", None, torch.float64)
    assert params is not None
    lib = library()
    assert lib is not None
    y = torch.empty_like(x)
    base = CounterRandom(5).stream_base(0) & ((1 << 64) - 1)
    assert lib.anynum_round(x.data_ptr(), y.data_ptr(), x.numel(), params.address, base, 1, None) == 1
    assert float(y[i]) == float(x[i])  # handed back untouched
    want = cn.reference(an.FP16, SR, "inf", None, x, seed=5)
    cn.assert_same(cn.native(an.FP16, SR, "inf", None, x, seed=5), want, x, "refined")
    inplace = x.clone()
    cn.native(an.FP16, SR, "inf", None, inplace, seed=5, out=inplace)
    cn.assert_same(inplace, want, x, "refined in place")


def test_undecided_elements_of_a_block_format_hand_the_call_on(monkeypatch: pytest.MonkeyPatch, cn) -> None:  # type: ignore[no-untyped-def]
    """Blocks cannot refine on their output (re-rounding could pick other scales): the kernel
    declines the call and the router's next kernel redoes it from the input."""
    x, i = cn.self_tie(4096, seed=5)
    x[i + 1] = 2.0**15  # amax: the block's scale is 2**(15 - FP16.emax) = 1, so x / scale = x
    fmt = an.Block(an.FP16, None, axis=None)  # one block: the random index is the flat index
    params = call_params(fmt, SR, "inf", None, torch.float64)
    assert params is not None
    call = Call(fmt, SR, "inf", None, torch.float64, "cpu", "counter")
    assert native_round(params, call, x, CounterRandom(5)) is None
    want = cn.reference(fmt, SR, "inf", None, x, seed=5)
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    cn.assert_same(an.quantize(x, fmt, "sr", seed=5), want, x, "block, through the router")
    inplace = x.clone()
    an.quantize(inplace, fmt, "sr", seed=5, out=inplace)
    cn.assert_same(inplace, want, x, "block, in place")
