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
from anynum.formats.block import UE4M3
from anynum.quantize.checks import check_representable
from anynum.rounding import Rounding

BLOCKS = [
    an.MXFP8_E4M3, an.MXFP8_E5M2, an.MXFP6_E3M2, an.MXFP6_E2M3, an.MXFP4_E2M1, an.MXINT8, an.NVFP4,
    an.Block(an.E2M1, 8, scale_rule="ceil"), an.Block(an.E2M1, 8, scale_rule="even"),
    an.Block(an.E5M2, 6, scale_rule="amax"),  # power-of-two scales from the amax rule (E8M0)
    an.Block(an.E4M3FN, 16, axis=0), an.Block(an.FixedPoint(4, 4), None, axis=None),
    an.Block(an.IntFormat(8), None), an.Block(an.FixedPoint(3, 3, overflow="wrap"), 4),
    an.Block(an.FP16, 32),  # element exact in float32 only with float64 working
    an.Block(an.E2M1, None),  # one block per row: the threshold path with a single scale
    an.Block(an.E2M1, 48, scale=UE4M3, scale_rule="amax"),  # non-power-of-two scales, no tensor scale
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


def _on_decision_points(fmt: an.Block, tensor_max: float, seed: int) -> torch.Tensor:
    """float32 rows of blocks whose first element (the largest) fixes the block's scale S, the others
    sitting on the element's decision points times S (grid points and midpoints, rounded to float32)
    and one float32 step either side: exact ties where t * S fits float32, near-ties elsewhere.
    `tensor_max` (above 320) is the largest element of all (NVFP4's tensor scale comes from it)."""
    g = torch.Generator().manual_seed(seed)
    bs = fmt.block_size
    assert bs is not None
    rows = 64
    x = torch.randn(rows, bs, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-20, 5, (rows, 1), generator=g))
    x[:, 0] = x.abs().amax(dim=1) * (1 + torch.rand(rows, generator=g, dtype=torch.float64))  # the block max
    x[0, 0] = tensor_max
    x = x.float()
    res = an.quantize_block(x, fmt)
    scale = res.scales.double() * (res.tensor_scale.double() if res.tensor_scale is not None else 1.0)
    grid = torch.from_numpy(fmt.element.values()).double()
    grid = torch.unique(grid[grid >= 0])
    points = torch.cat([grid[1:], (grid[:-1] + grid[1:]) / 2])
    for r in range(rows):
        s = float(scale[r, 0])
        amax = float(x[r].abs().max())
        ok = points[points * s < amax * (1 - 2**-20)]  # below the block max: the scales stay
        if ok.numel() == 0:
            continue
        pick = ok[torch.randint(0, ok.numel(), (bs - 1,), generator=g)] * s
        sign = torch.where(torch.rand(bs - 1, generator=g) < 0.5, -1.0, 1.0).double()
        v = (pick * sign).float()
        step = torch.randint(-1, 2, (bs - 1,), generator=g)  # one float32 step down, none, or up
        v = torch.where(step < 0, torch.nextafter(v, torch.tensor(0.0)), v)
        v = torch.where(step > 0, torch.nextafter(v, torch.tensor(float("inf")) * v.sign()), v)
        x[r, 1:] = v
    after = an.quantize_block(x, fmt)
    assert torch.equal(after.scales, res.scales)  # the construction kept every block's scale
    return x


@pytest.mark.parametrize("fmt", [an.NVFP4, an.MXFP4_E2M1, an.MXFP8_E4M3], ids=repr)
def test_blocks_on_decision_points(fmt: an.Block, cn) -> None:  # type: ignore[no-untyped-def]
    """Inputs on and next to every rounding boundary of the element grid, in every mode: the threshold
    path (float32, nearest and toward-zero modes on E2M1) compares |x| with exact boundaries and the
    reciprocal path (NVFP4's other modes) rebuilds the reference's quotient, so ties must tie as the
    reference ties. NVFP4 with a tensor scale of few bits (3360 / 2688 = 1.25: exact ties) and of many."""
    for tensor_max, seed in ((3360.0, 0), (3361.7, 1), (1e30, 2)):
        x = _on_decision_points(fmt, tensor_max, seed)
        cn.check(fmt, x)
        cn.check(fmt, x.double())


def test_block_quotients_from_the_reciprocal_are_the_divisions() -> None:
    """BK_RCP forms fl(x / S) (float32 x, NVFP4-like S = UE4M3 value * FP32 value) from fl(1 / S) and
    two FMAs: bit for bit float64's division, also for x next to x / S = a midpoint between doubles
    (where a faithful quotient would differ)."""
    import ctypes

    from anynum.kernels.clib import library

    lib = library()
    if lib is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(5)
    n = 1 << 20
    sb = torch.from_numpy(UE4M3.values()).double()
    sb = sb[(sb > 0) & torch.isfinite(sb)]
    ts = torch.randint(1, 0x7F7FFFFF, (n,), generator=g, dtype=torch.int64)
    ts = ts.to(torch.int32).view(torch.float32)  # every positive finite float32
    s = sb[torch.randint(0, sb.numel(), (n,), generator=g)] * ts.double()
    q = torch.rand(n, generator=g, dtype=torch.float64) + 1
    q = q * torch.exp2(torch.randint(-30, 10, (n,), generator=g)).double()
    mid = q + torch.exp2(torch.floor(torch.log2(q)) - 53)  # halfway between q and the next double
    x = torch.where(torch.rand(n, generator=g) < 0.5, (mid * s).float(), ts)
    x = torch.where(torch.isfinite(x) & (x != 0), x, torch.ones(()))
    x = torch.where(torch.rand(n, generator=g) < 0.5, -x, x)
    got = torch.empty(n, dtype=torch.float64)
    lib.anynum_block_quotients(
        ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(s.data_ptr()), n, ctypes.c_void_p(got.data_ptr())
    )
    want = x.double() / s
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))


def _many_blocks(fmt: an.Block, tensor_max: float, cols: int, seed: int) -> torch.Tensor:
    """float32 rows of `cols` elements, enough blocks for the threshold path's per-call table (more
    than four per scale value): the decision-point rows above, plus blocks of zeros, with NaN, inf
    and -inf, blocks small enough for subnormal UE4M3 scales (and below the smallest), blocks whose
    amax is a power of two or an exact scale value times the divisor (so amax / divisor is a value of
    the scale format), and blocks past the scale format's max (saturating where no tensor scale
    bounds it)."""
    g = torch.Generator().manual_seed(seed)
    bs = fmt.block_size
    assert bs is not None
    parts = [_on_decision_points(fmt, tensor_max, seed + k).reshape(-1, cols) for k in range(4)]
    rows = 400
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-40, 12, (rows, 1), generator=g))
    x[0] = 0.0
    x[1, 3] = float("nan")
    x[2, bs + 1] = float("inf")
    x[3, cols - 1] = -float("inf")
    x[4:40] *= 2.0**-30 / x[4:40].abs().amax(dim=1, keepdim=True)  # subnormal and tiny scales
    x[40:80] /= x[40:80].abs().amax(dim=1, keepdim=True)  # amax 1 exactly, then powers of two
    x[40:80] *= torch.exp2(torch.randint(-20, 11, (40, 1), generator=g)).float()
    svals = torch.from_numpy(fmt.scale.values()).double()
    svals = svals[torch.isfinite(svals) & (svals > 0)]
    den = fmt.element.max * (tensor_max / (fmt.element.max * fmt.scale.max) if fmt.tensor_scale else 1.0)
    pick = svals[torch.randint(0, svals.numel(), (40,), generator=g)] * den
    x[80:120] *= (pick / x[80:120].abs().amax(dim=1).double()).float()[:, None]  # amax ~ value * divisor
    x[80:120, 0] = pick.float()
    x[120:130] *= 1e4  # past the scale format's max without a tensor scale
    x = torch.cat([*parts, x])
    x[0, 0] = tensor_max
    return x


@pytest.mark.parametrize(
    "fmt",
    [
        an.NVFP4,
        an.Block(an.E2M1, 16, scale=UE4M3, scale_rule="amax"),
        an.Block(an.E2M1, 32, scale=UE4M3, scale_rule="amax"),
        an.MXFP4_E2M1,  # power-of-two scales: a row per E8M0 exponent
        an.Block(an.E2M1, 16, scale_rule="ceil"),
    ],
    ids=repr,
)
def test_threshold_table_matches_reference(fmt: an.Block, cn) -> None:  # type: ignore[no-untyped-def]
    """FP4 blocks over many blocks take the threshold path's per-call table (blockthr.c): every
    block's edge case, every mode, float32 and the other dtypes, out= and in place, two threads, rows
    not a multiple of the block size, strided and transposed inputs."""
    before = torch.get_num_threads()
    try:
        for tensor_max, seed in ((3360.0, 0), (3361.7, 1), (1e30, 2)):
            x = _many_blocks(fmt, tensor_max, 64, seed)
            blocks = x.shape[0] * -(-40 // fmt.block_size)  # in the 40-column rows, the fewest
            assert blocks >= 4 * (255 if fmt.power_of_two_scales else 143)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                cn.check(fmt, x)
            cn.check(fmt, x[:, :40].contiguous())  # a short last block in every row
            for dtype in (torch.float64, torch.float16, torch.bfloat16):
                try:
                    check_representable(fmt, dtype)
                except an.AnynumError:
                    continue
                cn.check(fmt, x.to(dtype), modes=[Rounding.NEAREST_EVEN, Rounding.STOCHASTIC])
        for mode in (Rounding.NEAREST_EVEN, Rounding.TOWARD_ZERO, Rounding.NEAREST_AWAY):
            want = cn.reference(fmt, mode, "saturate", None, x)
            out = torch.empty_like(x)
            cn.assert_same(cn.native(fmt, mode, "saturate", None, x, out=out), want, x, (mode, "out="))
            inplace = x.clone()
            cn.assert_same(
                cn.native(fmt, mode, "saturate", None, inplace, out=inplace), want, x, (mode, "in place")
            )
            wide = torch.zeros(x.shape[0], 2 * x.shape[1])
            wide[:, ::2] = x
            view = wide[:, ::2]  # strided
            cn.assert_same(an.quantize(view, fmt, mode), want, x, (mode, "strided"))
            xt = x.t().contiguous().t()  # column-major
            cn.assert_same(an.quantize(xt, fmt, mode), want, x, (mode, "transposed"))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_nvfp4_tensor_amax_from_the_block_pass(dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """NVFP4's tensor amax comes from the per-block amax pass (blocks holding inf or NaN read again
    for their finite values): the largest finite value inside a block with NaN, then with inf, then
    a tensor of only non-finite values (tensor scale 1); one and two threads."""
    before = torch.get_num_threads()
    try:
        g = torch.Generator().manual_seed(11)
        for special in (float("nan"), float("inf"), -float("inf")):
            x = torch.randn(257, 48, generator=g)
            x[100, 17] = 5000.0 if dtype != torch.float16 else 600.0  # the tensor's finite amax ...
            x[100, 20] = special  # ... shares its block with a NaN or an infinity
            x = x.to(dtype)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                cn.check(fmt=an.NVFP4, x=x, modes=[Rounding.NEAREST_EVEN, Rounding.UP, Rounding.STOCHASTIC])
        x = torch.full((64, 32), float("nan"), dtype=dtype)
        x[::2, ::3] = float("inf")
        cn.check(an.NVFP4, x, modes=[Rounding.NEAREST_EVEN, Rounding.STOCHASTIC])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "fmt", [an.MXFP8_E4M3, an.MXFP8_E5M2, an.MXFP6_E3M2, an.Block(an.E4M3FN, 48)], ids=repr
)
def test_float_elements_on_the_bits_in_both_kinds_of_chunk(fmt: an.Block, cn) -> None:  # type: ignore[no-untyped-def]
    """Float elements round on the bits (float_bits): a chunk whose quotients are all normal for the
    element, or zero, takes the normal branch and decides exact SR on short draws; a chunk holding a
    tiny quotient takes both branches on 53 bits. Plain data makes the first kind (zeros included;
    MXFP6_E3M2's grid is short enough that every chunk holds a tiny quotient); one tiny value in one
    block makes its chunk the second, while the other chunks stay the first. Rows of 390 leave a
    short last block, whose last elements go one by one, on 53 bits."""
    g = torch.Generator().manual_seed(11)
    plain = torch.randn(64, 390, generator=g) * 3
    plain[5, :40] = 0.0  # zeros keep a chunk normal
    tiny = plain.clone()
    tiny[40, 7] = 2.0**-30  # far below the element's smallest normal times its block's scale
    tiny[41, 100] = -(2.0**-140)  # a float32 subnormal: its quotient underflows (the repair)
    for x in (plain, tiny, plain.to(torch.bfloat16), tiny.to(torch.float64)):
        cn.check(fmt, x)


@pytest.mark.parametrize(
    "fmt",
    [an.MXFP8_E4M3, an.MXFP8_E5M2, an.MXFP4_E2M1, an.NVFP4, an.MXINT8, an.Block(an.E4M3FN, 16)],
    ids=repr,
)
def test_scans_of_sixteen_blocks_at_once(fmt: an.Block, cn) -> None:  # type: ignore[no-untyped-def]
    """Rows long enough for the scan that reduces 16 blocks together (float32, blocks of 16 and 32)
    and for the per-block least magnitudes that decide whether a chunk is all normal.

    Each block's largest magnitude sits at a lane of its own and a binade of its own (a lane
    mixed up between blocks changes a scale); blocks of zeros, NaN and inf occur; one block
    holds, beside 256 (scale 1 for the float elements), 3 * 2**-10, tiny for E4M3 (whose
    subnormal step is 2**-9), which the normal branch would keep; rows of 1072 leave three blocks
    past the first chunk of 1024 to the element-wise scan."""
    g = torch.Generator().manual_seed(5)
    bs = fmt.block_size
    x = torch.randn(4, 1072, generator=g) * 3
    blocks = x[:, : 1024].view(4, 1024 // bs, bs)
    nb = blocks.shape[1]
    blocks[3] = torch.rand(nb, bs, generator=g) * 2.0 ** torch.arange(-nb // 2, nb - nb // 2).unsqueeze(1)
    blocks[3, torch.arange(nb), torch.arange(nb) % bs] = 1.5 * 2.0 ** torch.arange(-nb // 2, nb - nb // 2)
    blocks[0, 3] = 0.0
    blocks[0, 5, :-1] = 0.0
    blocks[1, 7] = torch.rand(bs, generator=g) + 1.0
    blocks[1, 7, 0] = 256.0
    blocks[1, 7, 13] = 3 * 2.0**-10
    blocks[2, 2, bs - 1] = float("nan")
    blocks[2, nb - 1, 0] = float("inf")
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        try:
            check_representable(fmt, dtype)
        except an.AnynumError:
            continue
        cn.check(fmt, x.to(dtype))
