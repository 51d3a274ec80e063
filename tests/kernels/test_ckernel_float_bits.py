"""The deterministic modes on the working type's bits (scalar.c float_bits, cparams.float_on_bits)
against the eager reference: for each binade of float32 and float64, the fraction patterns at
and beside every kind of rounding boundary (ties to even and odd, one unit either side, carries
into the next binade and into overflow), the format's subnormals and the specials, in every
deterministic mode, exact SR and SR with rand_bits, and every overflow policy; below the format's
smallest normal (the kernel's own branch), every multiple of the step, its quarter and half points
and their neighbours, inputs far below the step, and SR at the element's own draw."""

from __future__ import annotations

import itertools

import pytest
import torch

import anynum as an
from anynum.kernels.clib import library
from anynum.kernels.cparams import call_params, float_on_bits
from anynum.rounding import CounterRandom, Rounding

DETERMINISTIC = [m for m in Rounding if not m.is_stochastic]
# (mode, rand_bits): the deterministic modes, exact SR, and SR with fewer and more random bits
# than the format drops (bf16 drops 16 float32 bits, e4m3fn 20)
ON_BITS_MODES = [(m, None) for m in DETERMINISTIC] + [
    (Rounding.STOCHASTIC, rb) for rb in (None, 3, 8, 18, 30)
]
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
    for (mode, rb), overflow in itertools.product(ON_BITS_MODES, fmt.overflow_policies):
        want = cn.reference(fmt, mode, overflow, rb, x)
        got = cn.native(fmt, mode, overflow, rb, x)
        cn.assert_same(got, want, x, (fmt.display_name(), mode.name, rb, overflow, dtype))
        zeros = want == 0  # and the zeros' signs, which same() compares bit for bit
        assert torch.equal(got[zeros].signbit(), want[zeros].signbit())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", ON_BITS, ids=lambda f: f.display_name())
def test_zeros_among_normals_stay_on_the_normal_branch(fmt: an.FloatFormat, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """Runs whose only inputs below the format's smallest normal are zeros of either sign (ReLU
    outputs, sparse gradients): the loop keeps them on its normal branch, which must give each
    zero and each normal exactly what the reference gives, in every mode and overflow policy."""
    g = torch.Generator().manual_seed(fmt.man_bits)
    n = 4 * 256 + 37  # whole runs of the loop and a short one
    smallest = 2.0**fmt.emin
    normal = smallest * 2.0 ** (torch.rand(n, generator=g, dtype=torch.float64) * (fmt.emax - fmt.emin))
    normal = (normal * (1 + torch.rand(n, generator=g, dtype=torch.float64))).to(dtype)
    x = torch.where(torch.rand(n, generator=g) < 0.5, -normal, normal)
    kind = torch.randint(0, 3, (n,), generator=g)  # a third each: +0, -0, a normal
    zero = torch.zeros((), dtype=dtype)
    x = torch.where(kind == 0, zero, torch.where(kind == 1, -zero, x))
    assert bool((x.abs() >= smallest).logical_or(x == 0).all())
    for (mode, rb), overflow in itertools.product(ON_BITS_MODES, fmt.overflow_policies):
        want = cn.reference(fmt, mode, overflow, rb, x)
        got = cn.native(fmt, mode, overflow, rb, x)
        cn.assert_same(got, want, x, (fmt.display_name(), mode.name, rb, overflow, dtype))


#: Where a tiny input (nonzero, below the format's smallest normal) sits in the kernel's runs of
#: 256 elements (loops.c BITS_RUN), among normal inputs: each end of a run and inside one; the
#: third run's only tiny input is its last element, the fourth's its first (40 more fall in the
#: first two runs and the short last one).
_TINY_AT = [0, 1, 31, 32, 63, 200, 255, 256, 511, 767, 768]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E5M2, an.BF16, an.E2M1, an.E4M3FNUZ], ids=repr)
def test_tiny_inputs_among_normals(fmt: an.FloatFormat, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """Runs holding a few tiny inputs among normal ones (which go by groups in the SR modes, or take
    both of the loop's branches) and runs of normal inputs and zeros alone round every element as
    the reference does, one and two threads, in place too."""
    g = torch.Generator().manual_seed(fmt.man_bits + 1)
    n = 4 * 256 + 37  # whole runs and a short one
    smallest = 2.0**fmt.emin
    mag = smallest * 2.0 ** (torch.rand(n, generator=g, dtype=torch.float64) * (fmt.emax - fmt.emin))
    x = mag * (1 + torch.rand(n, generator=g, dtype=torch.float64))
    tiny = smallest * torch.rand(len(_TINY_AT) + 40, generator=g, dtype=torch.float64)
    more = torch.randint(0, 512 + 37, (40,), generator=g)
    where = torch.tensor(_TINY_AT + torch.where(more < 512, more, more - 512 + 1024).tolist())
    x[where] = tiny
    x[300:310] = 0.0  # zeros stay on the normal branch
    x = torch.where(torch.rand(n, generator=g) < 0.5, -x, x).to(dtype)
    assert bool(((x.abs() < smallest) & (x != 0)).sum() >= 40)
    before = torch.get_num_threads()
    try:
        for (mode, rb), threads in itertools.product(ON_BITS_MODES, (1, 2)):
            torch.set_num_threads(threads)
            overflow = fmt.default_overflow
            want = cn.reference(fmt, mode, overflow, rb, x)
            cn.assert_same(cn.native(fmt, mode, overflow, rb, x), want, x, (mode.name, rb, threads))
            inplace = x.clone()
            cn.native(fmt, mode, overflow, rb, inplace, out=inplace)
            cn.assert_same(inplace, want, x, (mode.name, rb, threads, "in place"))
    finally:
        torch.set_num_threads(before)


def test_undecided_tiny_inputs_among_normals_are_handed_back(cn) -> None:  # type: ignore[no-untyped-def]
    """Exact SR's undecided elements (a tiny input whose fraction ties its own 53-bit draw and has
    one more bit) in runs of normal inputs: handed back untouched and counted, and the finished
    result is the reference's."""
    fmt, n = an.FP16, 1 << 12
    step = 2.0 ** (fmt.emin - fmt.man_bits)
    k = CounterRandom(7).bits_at(torch.arange(n), 53, 0)
    x = 1.5 + torch.rand(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    tie = (torch.arange(n) % 97 == 5) & (k < (1 << 52))  # t = k + 1/2: undecided
    x[tie] = (k[tie].double() + 0.5) * 2.0**-53 * step
    x[1::2] = -x[1::2]
    params = call_params(fmt, Rounding.STOCHASTIC, fmt.default_overflow, None, torch.float64)
    lib = library()
    assert params is not None and params.struct.f.on_bits == 1 and lib is not None
    y = torch.empty_like(x)
    base = CounterRandom(7).stream_base(0) & ((1 << 64) - 1)
    und = lib.anynum_round(x.data_ptr(), y.data_ptr(), n, params.address, base, 1, None)
    assert und == int(tie.sum()) > 15
    assert torch.equal(y[tie], x[tie])
    sr, overflow = Rounding.STOCHASTIC, fmt.default_overflow
    want = cn.reference(fmt, sr, overflow, None, x, seed=7)
    cn.assert_same(cn.native(fmt, sr, overflow, None, x, seed=7), want, x, "ties")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_bits_path_on_half_inputs_every_pattern(dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype)
    for fmt, (mode, rb) in itertools.product((an.E4M3FN, an.E5M2, an.E2M1, an.E4M3FNUZ), ON_BITS_MODES):
        want = cn.reference(fmt, mode, fmt.default_overflow, rb, x)
        cn.assert_same(cn.native(fmt, mode, fmt.default_overflow, rb, x), want, x, (fmt, mode.name, rb))


def test_which_formats_take_the_bits_path() -> None:
    for fmt in ON_BITS:
        assert float_on_bits(fmt, torch.float32) and float_on_bits(fmt, torch.float64), fmt
    for fmt in NOT_ON_BITS:
        assert not float_on_bits(fmt, torch.float32), fmt
    assert float_on_bits(an.FloatFormat(9, 5), torch.float64)  # fits float64's binades


def test_stochastic_decisions_at_their_exact_boundaries(cn) -> None:  # type: ignore[no-untyped-def]
    """Inputs whose fraction meets the element's own draw exactly (a draw is a function of the
    element's index), and one unit either side: exact SR compares 53 bits, SR with r bits adds
    the fraction's top r bits to an r-bit draw. Random inputs meet these with probability 2**-53."""
    n = 1 << 16
    draws53 = CounterRandom(7).bits_at(torch.arange(n), 53, 0)
    # TF32 in float64 drops 42 bits: a draw with its low 11 bits clear is a dropped pattern
    idx = (draws53 % (1 << 11) == 0).nonzero().reshape(-1)
    assert idx.numel() >= 8
    x = torch.full((n,), 1.5, dtype=torch.float64)
    for off, part in zip((-1, 0, 1), idx.tensor_split(3)):
        d = (draws53[part] >> 11) + off
        x[part] = 1.0 + d.double() * 2.0**-52  # dropped bits d: the fraction is d / 2**42
    want = cn.reference(an.TF32, Rounding.STOCHASTIC, "inf", None, x)
    cn.assert_same(cn.native(an.TF32, Rounding.STOCHASTIC, "inf", None, x), want, x, "exact SR ties")
    # E5M2 in float64 drops 50 bits; with 8 random bits the top 8 of them plus the draw reach 256
    draws8 = CounterRandom(7).bits_at(torch.arange(n), 8, 0)
    for off in (-1, 0, 1):
        top = (256 - draws8 + off).clamp(0, 255)
        y = 1.0 + top.double() * 2.0**-10  # the 8 bits below e5m2's last kept bit
        want = cn.reference(an.E5M2, Rounding.STOCHASTIC, "inf", 8, y)
        cn.assert_same(cn.native(an.E5M2, Rounding.STOCHASTIC, "inf", 8, y), want, y, ("rand_bits", off))


def _subnormal_inputs(fmt: an.FloatFormat, dtype: torch.dtype) -> torch.Tensor:
    """Below `fmt`'s smallest normal: each multiple of the step, the points a quarter, half and
    three quarters on, one `dtype` unit either side of each, and inputs far below the step (every
    binade of `dtype` down to its smallest subnormal), both signs."""
    step = 2.0 ** (fmt.emin - fmt.man_bits)
    q = torch.arange(0, (1 << fmt.man_bits) + 1, dtype=torch.float64)  # up to the smallest normal
    grid = (torch.cat([q, q + 0.25, q + 0.5, q + 0.75]) * step).to(dtype)  # exact
    lay_min = -149 if dtype == torch.float32 else -1074
    exps = torch.arange(lay_min, fmt.emin - fmt.man_bits, dtype=torch.float64)
    g = torch.Generator().manual_seed(fmt.man_bits)
    frac = torch.rand(exps.numel(), generator=g, dtype=torch.float64)
    far = torch.cat([2.0**exps, (1 + frac) * 2.0**exps]).to(dtype)  # the second rounds in dtype
    x = torch.cat([grid, far])
    x = torch.cat([x, torch.nextafter(x, torch.tensor(0.0, dtype=dtype)), torch.nextafter(x, x + 1)])
    return torch.cat([x, -x])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", ON_BITS, ids=lambda f: f.display_name())
def test_bits_path_below_the_smallest_normal(fmt: an.FloatFormat, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    x = _subnormal_inputs(fmt, dtype)
    for mode, rb in ON_BITS_MODES:
        want = cn.reference(fmt, mode, fmt.default_overflow, rb, x)
        got = cn.native(fmt, mode, fmt.default_overflow, rb, x)
        cn.assert_same(got, want, x, (fmt.display_name(), mode.name, rb, dtype))


SUB_SR = [an.E4M3FN, an.E5M2, an.FP16, an.BF16, an.E2M1]


@pytest.mark.parametrize("fmt", SUB_SR, ids=lambda f: f.display_name())
def test_exact_sr_below_the_smallest_normal_at_its_draw(fmt: an.FloatFormat, cn) -> None:  # type: ignore[no-untyped-def]
    """Subnormal float64 inputs whose fraction of a step meets the element's own 53 random bits:
    t = f * 2**53 equal to the draw, one either side, and t = draw + 1/2 (more bits than 53 below
    the step: undecided, handed back with the input and refined by the reference)."""
    n = 1 << 12
    step = 2.0 ** (fmt.emin - fmt.man_bits)
    k = CounterRandom(7).bits_at(torch.arange(n), 53, 0)
    q = torch.randint(0, 1 << fmt.man_bits, (n,), generator=torch.Generator().manual_seed(3))
    part = torch.arange(n) % 6
    x = torch.empty(n, dtype=torch.float64)
    for off in (-1, 0, 1):  # q = 0: the whole draw as the fraction (t an integer: never undecided)
        sel = part == off + 1
        x[sel] = (k[sel] + off).clamp(min=0).double() * 2.0**-53 * step
    # q > 0: the fraction's top 53 - man bits against the draw's (t's low man bits clear)
    top = (k >> fmt.man_bits) + (part == 4).long()
    sel = part >= 3
    x[sel] = (q[sel].double() + top[sel].double() * 2.0 ** -(53 - fmt.man_bits)) * step
    tie = (part == 0) & (k < (1 << 52))  # t = k + 1/2: 54 bits, float64 holds them for k < 2**52
    x[tie] = (k[tie].double() + 0.5) * 2.0**-53 * step
    x[1::2] = -x[1::2]
    overflow = fmt.default_overflow
    want = cn.reference(fmt, Rounding.STOCHASTIC, overflow, None, x)
    cn.assert_same(cn.native(fmt, Rounding.STOCHASTIC, overflow, None, x), want, x, "exact SR")
    params = call_params(fmt, Rounding.STOCHASTIC, overflow, None, torch.float64)
    assert params is not None and params.struct.f.on_bits == 1
    lib = library()
    assert lib is not None
    y = torch.empty_like(x)
    base = CounterRandom(7).stream_base(0) & ((1 << 64) - 1)
    und = lib.anynum_round(x.data_ptr(), y.data_ptr(), n, params.address, base, 1, None)
    assert und == int(tie.sum()) > 100
    assert torch.equal(y[tie], x[tie])  # handed back untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E5M2, an.E2M3], ids=lambda f: f.display_name())
def test_sr_rand_bits_below_the_smallest_normal_at_its_draw(
    fmt: an.FloatFormat, dtype: torch.dtype, cn
) -> None:  # type: ignore[no-untyped-def]
    """floor(f * 2**r) + draw against 2**r at equality, one either side, and just below equality."""
    n = 1 << 12
    step = 2.0 ** (fmt.emin - fmt.man_bits)
    q = torch.randint(0, 1 << fmt.man_bits, (n,), generator=torch.Generator().manual_seed(4)).double()
    for r in (3, 8):
        d = CounterRandom(7).bits_at(torch.arange(n), r, 0)
        for off, below in ((-1, 0.0), (0, 0.0), (1, 0.0), (0, 2.0**-9)):
            top = (2**r - d + off).clamp(0, 2**r - 1).double()
            x = ((q + (top - below) * 2.0**-r) * step).to(dtype)  # exact: at most 3 + 8 + 9 bits
            x[1::2] = -x[1::2]
            want = cn.reference(fmt, Rounding.STOCHASTIC, fmt.default_overflow, r, x)
            got = cn.native(fmt, Rounding.STOCHASTIC, fmt.default_overflow, r, x)
            cn.assert_same(got, want, x, (r, off, below, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E5M2, an.E2M1], ids=lambda f: f.display_name())
def test_runs_holding_a_tiny_input_by_groups(fmt: an.FloatFormat, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """A run of 256 holding an input below the format's smallest normal goes by groups of 16 where
    the library is built for AVX-512: a group without one takes the normal branch (exact SR on the
    top bits of the run's 53-bit draws), the others both. Scattered tiny inputs (and zeros, which
    are not tiny) put both kinds of group in most runs, and a length off a multiple of 16 leaves
    each call a last part that goes element by element."""
    g = torch.Generator().manual_seed(5)
    n = 20_000 + 7
    x = torch.randn(n, generator=g, dtype=torch.float64) * 4
    tiny = torch.rand(n, generator=g) < 0.01
    x = torch.where(tiny, x * fmt.smallest_normal / 16, x)
    x[torch.rand(n, generator=g) < 0.01] = 0.0
    cn.check(fmt, x.to(dtype), rand_bits=(None, 3, 8))
