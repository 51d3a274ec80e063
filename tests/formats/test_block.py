"""Block formats: API, errors, special values, relations to other formats, codes and statistics.

Exact agreement with a rational reference and with gfloat is in tests/oracles/test_block_exact.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import anynum as an
from anynum import quantize_block
from anynum.errors import AnynumError, RepresentabilityError
from anynum.formats.block import UE4M3, Block, BlockCodes

DETERMINISTIC = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]
MX = [an.MXFP8_E4M3, an.MXFP8_E5M2, an.MXFP6_E3M2, an.MXFP6_E2M3, an.MXFP4_E2M1, an.MXINT8]


def spread(n: int, seed: int, lo: int = -20, hi: int = 20) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    return (x * torch.exp2(torch.randint(lo, hi, (n,), generator=g).double())).float()


# --- presets, names, storage -----------------------------------------------------------------------


def test_presets_and_names() -> None:
    names = {
        "mxfp8_e4m3": an.MXFP8_E4M3,
        "mxfp8_e5m2": an.MXFP8_E5M2,
        "mxfp6_e3m2": an.MXFP6_E3M2,
        "mxfp6_e2m3": an.MXFP6_E2M3,
        "mxfp4_e2m1": an.MXFP4_E2M1,
        "mxfp4": an.MXFP4_E2M1,
        "MXINT8": an.MXINT8,
        "nvfp4": an.NVFP4,
    }
    for name, fmt in names.items():
        assert an.format(name) is fmt
    for fmt, element in zip(MX, [an.E4M3FN, an.E5M2, an.E3M2, an.E2M3, an.E2M1, an.FixedPoint(2, 6)]):
        assert (fmt.element, fmt.block_size, fmt.scale, fmt.scale_rule) == (element, 32, an.E8M0, "floor")
    assert (an.NVFP4.element, an.NVFP4.block_size, an.NVFP4.scale) == (an.E2M1, 16, UE4M3)
    assert an.NVFP4.tensor_scale == an.FP32
    assert an.format("block(e4m3fn,32)") == an.MXFP8_E4M3
    assert an.format("block(fixed(2,6), 16, e8m0, ceil)") == Block(an.FixedPoint(2, 6), 16, scale_rule="ceil")
    assert an.format("block(e2m1,none)") == Block(an.E2M1)
    assert "mxfp8_e4m3" in an.list_formats() and "nvfp4" in an.list_formats()


def test_storage_bits() -> None:
    assert an.MXFP8_E4M3.storage_bits_per_element == 8 + 8 / 32
    assert an.MXFP6_E2M3.storage_bits_per_element == 6.25
    assert an.MXFP4_E2M1.storage_bits_per_element == 4.25
    assert an.MXINT8.storage_bits_per_element == 8.25
    assert an.NVFP4.storage_bits_per_element == 4.5  # UE4M3 is stored in a byte
    assert Block(an.E2M1).storage_bits_per_element == 4.0
    # 3 rows of 40: 2 blocks of 32 per row (the second padded), 8-bit scales
    assert an.MXFP8_E4M3.storage_bits((3, 40)) == 3 * 40 * 8 + 6 * 8
    assert an.NVFP4.storage_bits((16,)) == 16 * 4 + 8 + 32
    assert an.MXFP4_E2M1.scale_shape((3, 40)) == (3, 2)
    assert Block(an.E2M1, 5, axis=0).scale_shape((11, 2)) == (3, 2)
    assert Block(an.E2M1, 4, axis=None).scale_shape((3, 3)) == (3,)


def test_info_describes_the_element_grid() -> None:
    fmt = an.MXFP8_E4M3
    assert (fmt.max, fmt.smallest_subnormal, fmt.bits, fmt.precision) == (448.0, 2.0**-9, 8, 4)
    assert fmt.abs_max == 448.0 * 2.0**127 and fmt.abs_min == 2.0**-9 * 2.0**-127
    assert fmt.default_overflow == "saturate" and an.MXFP8_E5M2.default_overflow == "saturate"


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, -32, 2.5, True, "32"])
def test_bad_block_size(size: object) -> None:
    with pytest.raises(AnynumError, match="block_size must be a positive integer"):
        Block(an.E2M1, size)  # type: ignore[arg-type]


def test_format_errors() -> None:
    with pytest.raises(AnynumError, match=r"scale must be an unsigned format.*UE4M3"):
        Block(an.E2M1, 16, scale=an.E4M3FN)
    with pytest.raises(AnynumError, match="unsigned FloatFormat"):
        Block(an.E2M1, 16, scale=an.IntFormat(8, signed=False))
    with pytest.raises(AnynumError, match="non-block Format"):
        Block(an.MXFP4_E2M1, 2)
    with pytest.raises(AnynumError, match="scale_rule must be one of"):
        Block(an.E2M1, 2, scale_rule="round")
    with pytest.raises(AnynumError, match="axis must be an integer or None"):
        Block(an.E2M1, 2, axis=1.0)  # type: ignore[arg-type]
    with pytest.raises(AnynumError, match="per-tensor scale needs scale_rule='amax'"):
        Block(an.E2M1, 2, tensor_scale=an.FP32)
    with pytest.raises(AnynumError, match="exceeds float64's 53"):
        Block(an.FP32, 2, scale=an.FloatFormat(8, 30, signed=False, specials="fn"), scale_rule="amax")


def test_input_errors() -> None:
    with pytest.raises(AnynumError, match="blocks axis 2, which is out of range for a 2-d tensor"):
        an.quantize(torch.ones(2, 3), Block(an.E2M1, 2, axis=2))
    with pytest.raises(AnynumError, match="integer"):
        an.quantize(torch.ones(4, dtype=torch.int32), an.MXFP4_E2M1)
    with pytest.raises(AnynumError, match="integer"):
        quantize_block(torch.ones(4, dtype=torch.int64), an.MXFP4_E2M1)
    none = Block(an.E2M1, 2, scale_rule="none")
    with pytest.raises(AnynumError, match=r"scale_rule='none'.*quantize_block"):
        an.quantize(torch.ones(4), none)
    with pytest.raises(AnynumError, match="pass scales="):
        quantize_block(torch.ones(4), none)
    with pytest.raises(AnynumError, match=r"shape \(2,\)"):
        quantize_block(torch.ones(4), none, scales=torch.ones(3))
    with pytest.raises(AnynumError, match=r"(?i)positive finite values of e8m0"):
        quantize_block(torch.ones(4), none, scales=torch.tensor([1.0, 3.0]))
    with pytest.raises(AnynumError, match="BlockCodes"):
        an.MXFP4_E2M1.decode(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(AnynumError, match="BlockCodes"):
        an.decode(torch.zeros(4, dtype=torch.int64), an.MXFP4_E2M1)
    with pytest.raises(AnynumError, match=r"BlockCodes"):
        an.MXFP4_E2M1.decode_torch(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(AnynumError, match="no fixed value set"):
        an.MXFP4_E2M1.values()
    with pytest.raises(AnynumError, match="overflow="):
        an.quantize(torch.ones(4), an.MXFP4_E2M1, overflow="inf")


# --- special values ---------------------------------------------------------------------------------------


def test_nan_and_inf_make_their_block_nan() -> None:
    x = torch.arange(1.0, 9.0)
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[1] = bad
        q = quantize_block(y, Block(an.E4M3FN, 4))
        assert torch.isnan(q.values[:4]).all() and torch.isnan(q.scales[0])
        assert torch.equal(q.values[4:], x[4:])  # the other block is untouched
        codes = Block(an.E4M3FN, 4).encode(y)
        assert codes.scales.tolist() == [255, 127 + 3 - 8] and codes.elements[:4].tolist() == [127] * 4
        codes = Block(an.E2M1, 4).encode(y)  # E2M1 has no NaN code: elements 0, the NaN scale decides
        assert codes.elements[:4].tolist() == [0] * 4 and codes.scales[0].item() == 255
        assert torch.isnan(Block(an.E2M1, 4).decode(codes)[:4]).all()


def test_all_zero_block_gets_the_smallest_scale() -> None:
    x = torch.tensor([0.0, -0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    q = quantize_block(x, Block(an.E4M3FN, 4))
    assert q.scales.tolist() == [2.0**-127, 2.0**-8]
    assert q.values.tolist() == x.tolist() and torch.signbit(q.values[1])  # -0 kept (E4M3FN has -0)
    assert Block(an.E4M3FN, 4).encode(x).scales.tolist() == [0, 119]


def test_subnormal_only_block() -> None:
    """amax = 2**-130 wants scale 2**-138, clamped to E8M0's 2**-127: elements lose precision."""
    x = torch.tensor([1.0, 0.75, 2.0**-7, 2.0**-10]) * 2.0**-130
    q = quantize_block(x, an.MXFP8_E4M3)
    assert q.scales.item() == 2.0**-127
    # x / 2**-127 = [2**-3, 1.5 * 2**-4, 2**-10, 2**-13]; E4M3FN's smallest step is 2**-9
    assert q.elements.tolist() == [0.125, 0.09375, 0.0, 0.0]  # 2**-10 is a tie: even is 0
    assert an.quantize(x, an.MXFP8_E4M3, "ru")[2:].tolist() == [2.0**-136, 2.0**-136]


def test_elements_far_below_the_block_maximum() -> None:
    """x / scale underflows float32 here; directed rounding must still see a nonzero value."""
    x = torch.tensor([2.0**100, 2.0**-140, -(2.0**-140), 0.0])
    assert an.quantize(x, an.MXFP8_E4M3, "ru").tolist() == [2.0**100, 2.0**83, 0.0, 0.0]
    assert an.quantize(x, an.MXFP8_E4M3, "rd").tolist() == [2.0**100, 0.0, -(2.0**83), 0.0]
    assert an.quantize(x, an.MXFP8_E4M3, "ro").tolist() == [2.0**100, 2.0**83, -(2.0**83), 0.0]


def test_overflow_policies_follow_the_element() -> None:
    x = torch.tensor([1.99 * 2.0**4, 1.0])  # amax / scale = 1.99 * 2**15 > E5M2 max 57344
    assert an.quantize(x, an.MXFP8_E5M2)[0].item() == 57344.0 * 2.0**-11
    assert an.quantize(x, an.MXFP8_E5M2, overflow="inf")[0].item() == math.inf


def test_mxint8_is_symmetric() -> None:
    """MXINT8 uses codes -127..127; Block(FixedPoint(2, 6), 32) keeps -128 (-2.0)."""
    x = torch.tensor([-127.5 / 64, 0.5])  # a tie between codes -127 and -128: even is -128
    assert an.quantize(x, an.MXINT8).tolist() == [-127 / 64, 0.5]
    assert an.MXINT8.encode(x).elements.tolist() == [256 - 127, 32]
    loose = Block(an.MXINT8.element, 32)
    assert an.quantize(x, loose).tolist() == [-2.0, 0.5]
    assert loose.encode(x).elements.tolist() == [128, 32]
    assert an.quantize(torch.tensor([1.999]), an.MXINT8).item() == 127 / 64  # saturates at the top
    assert an.quantize(torch.tensor([-1.999]), an.MXINT8, "rd").item() == -127 / 64
    with pytest.raises(RepresentabilityError):  # float16 near 65504 would give -65536
        an.quantize(torch.ones(4, dtype=torch.float16), loose)


@pytest.mark.parametrize(
    ("fmt", "shape"),
    [
        (an.MXFP4_E2M1, (3, 70)),
        (Block(an.E2M1, 5, axis=0), (13, 4)),
        (Block(an.E4M3FN, 8, axis=None), (3, 7)),
    ],
    ids=repr,
)
@pytest.mark.parametrize(("mode", "rand_bits"), [("sr", None), ("sr", 3), ("sr_uniform", None)])
def test_stochastic_bits_are_addressed_by_the_padded_block_layout(
    fmt: Block, shape: tuple[int, ...], mode: str, rand_bits: int | None
) -> None:
    """Element i of the row-major (..., blocks, block_size) layout (axis moved last, zero padded)
    draws the random bits of index i: the same as the element format's own quantize of that layout."""
    x = spread(math.prod(shape), seed=21).reshape(shape)
    q = quantize_block(x, fmt, mode, seed=3, rand_bits=rand_bits)
    size = fmt.block_size
    moved = x.reshape(1, -1) if fmt.axis is None else x.movedim(fmt.axis, -1)
    n = moved.shape[-1]
    blocks = -(-n // size)
    padded = torch.cat([moved, torch.zeros(*moved.shape[:-1], blocks * size - n)], dim=-1)
    scales = q.scales.reshape(1, -1) if fmt.axis is None else q.scales.movedim(fmt.axis, -1)
    quotient = padded.reshape(*moved.shape[:-1], blocks, size) / scales[..., None].float()
    want = an.quantize(quotient, fmt.element, mode, seed=3, rand_bits=rand_bits)
    want = want.reshape(*moved.shape[:-1], blocks * size)[..., :n].double()
    got = q.elements.reshape(1, -1) if fmt.axis is None else q.elements.movedim(fmt.axis, -1)
    assert torch.equal(got, want)


# --- relations ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("element", [an.E4M3FN, an.E5M2, an.E2M1, an.E3M2], ids=repr)
def test_block_of_one_with_ceil_is_a_float_with_unbounded_exponent(element: an.FloatFormat) -> None:
    """One element per block, ceil rule: every x keeps element.precision bits and never saturates.

    That is the element's precision with float32's exponent range (FloatFormat(8, m)); the
    element's own quantize differs only by its range (saturation, subnormals), which the scale replaces.
    """
    wide = an.FloatFormat(8, element.man_bits)
    x = spread(3000, seed=1, lo=-60, hi=60)
    fmt = Block(element, 1, scale_rule="ceil")
    for mode in [*DETERMINISTIC, "sr"]:
        kw = {"seed": 5} if mode == "sr" else {}
        assert torch.equal(an.quantize(x, fmt, mode, **kw), an.quantize(x, wide, mode, **kw)), mode
    # and inside the element's normal range, it is the element's own quantize
    inside = x[(x.abs() >= element.smallest_normal) & (x.abs() <= element.max)]
    assert torch.equal(an.quantize(inside, fmt), an.quantize(inside, element))


@pytest.mark.parametrize("frac_bits", [3, 6, 10])
def test_whole_tensor_fixed_point_block_is_fixed_point(frac_bits: int) -> None:
    """axis=None and amax in [1, 2): the floor rule picks scale 1, so the block is plain fixed point."""
    element = an.FixedPoint(2, frac_bits)
    g = torch.Generator().manual_seed(frac_bits)
    x = (torch.rand(5, 7, generator=g) * 3.0 - 1.5).float()
    x[2, 3] = -1.75
    fmt = Block(element, None, axis=None)
    for mode in [*DETERMINISTIC, "sr"]:
        kw = {"seed": 9} if mode == "sr" else {}
        assert torch.equal(an.quantize(x, fmt, mode, **kw), an.quantize(x, element, mode, **kw)), mode


@pytest.mark.parametrize("wl", [4, 8, 12])
def test_qtorch_block_quantize_rule(wl: int) -> None:
    """QPyTorch block_quantize(x, wl, dim): exponent e = floor(log2 max|x|), step 2**(e+2-wl), ties up.

    Reproduced by Block(FixedPoint(2, wl-2), None, axis=...) with rounding "rna" (equal to ties-up on
    the non-negative inputs used here; qtorch's negative ties go up, which no anynum mode does).
    dim=-1 (one block) is axis=None; dim=0 on a 2-d tensor (one exponent per row) is axis=1.
    """
    g = torch.Generator().manual_seed(wl)
    top = 1.25 * torch.exp2(torch.randint(-5, 5, (6, 1), generator=g).float())
    x = torch.rand(6, 9, generator=g) * top
    x[:, :1] = top  # the rounded maximum stays below 2**(e+1) (qtorch's clamp there is unspecified)

    def qtorch_rule(v: np.ndarray) -> np.ndarray:
        e = np.floor(np.log2(np.abs(v).max()))
        step = 2.0 ** (e + 2 - wl)
        return np.floor(v / step + 0.5) * step

    elem = an.FixedPoint(2, wl - 2)
    whole = an.quantize(x, Block(elem, None, axis=None), "rna").numpy()
    np.testing.assert_array_equal(whole, qtorch_rule(x.double().numpy()))
    rows = an.quantize(x, Block(elem, None, axis=1), "rna").numpy()
    np.testing.assert_array_equal(rows, np.stack([qtorch_rule(r) for r in x.double().numpy()]))


def test_amax_rule_with_power_of_two_scale_is_ceil() -> None:
    x = spread(4096, seed=3).reshape(32, 128)
    for element in (an.E4M3FN, an.E2M1, an.FixedPoint(2, 6)):
        a = an.quantize(x, Block(element, 32, scale_rule="amax"))
        c = an.quantize(x, Block(element, 32, scale_rule="ceil"))
        assert torch.equal(a, c)


def test_scale_rule_ranges() -> None:
    """Where amax lands on the element grid under each rule (docs/block.md)."""
    x = spread(32 * 400, seed=4, lo=-6, hi=6).reshape(400, 32)
    amax = x.abs().amax(dim=1).double()
    for element in (an.E4M3FN, an.E2M1, an.E2M3, an.FixedPoint(2, 6)):
        ratio = {
            rule: amax / quantize_block(x, Block(element, 32, scale_rule=rule)).scales.reshape(-1)
            for rule in ("floor", "ceil", "even")
        }
        emax = element.emax
        assert ((ratio["floor"] >= 2.0**emax) & (ratio["floor"] < 2.0 ** (emax + 1))).all()
        assert ((ratio["ceil"] > element.max / 2) & (ratio["ceil"] <= element.max)).all()
        assert ((ratio["even"] >= 2.0 ** (emax - 0.5)) & (ratio["even"] < 2.0 ** (emax + 0.5))).all()
        # amax rule: never saturates while the scale stays inside UE4M3's range [2**-9, 448]
        nv = quantize_block(x, Block(element, 32, scale=UE4M3, scale_rule="amax")).scales.reshape(-1)
        inside = (nv > 2.0**-6) & (nv < 448)  # the scale below S is normal: spacing <= 1/8
        assert inside.sum() > 50 and (amax[inside] / nv[inside] <= element.max).all()
        assert (amax[inside] / nv[inside] > element.max / 1.125).all()  # and the scale is the smallest


def test_nvfp4_scales() -> None:
    x = spread(64, seed=6).reshape(2, 32)
    q = quantize_block(x, an.NVFP4)
    amax = x.abs().max().double()
    ts = q.tensor_scale
    assert ts is not None and ts.item() >= amax.item() / (6 * 448)
    assert ts.item() == an.quantize(amax / (6 * 448), an.FP32, "ru").item()
    assert q.scales.max().item() == 448.0  # the block holding the tensor's amax uses UE4M3's top
    blocks = x.abs().reshape(2, 2, 16).amax(-1).double()
    assert (blocks <= 6 * q.scales * ts).all()


# --- codes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [*MX, an.NVFP4, Block(an.IntFormat(4), 5, axis=0)], ids=repr)
def test_encode_decode_round_trip(fmt: Block) -> None:
    x = spread(7 * 45, seed=8).reshape(7, 45).double()
    codes = fmt.encode(x)
    assert isinstance(codes, BlockCodes)
    assert codes.elements.shape == x.shape and tuple(codes.scales.shape) == fmt.scale_shape(x.shape)
    assert codes.elements.dtype == torch.int64
    assert torch.equal(fmt.decode(codes), an.quantize(x, fmt))
    assert (codes.elements >= 0).all() and (codes.elements < 2**fmt.element.bits).all()
    same = an.encode(x, fmt)  # the front door gives the same codes as the format's alias
    assert all(torch.equal(a, b) for a, b in zip(same[:2], codes[:2]))
    assert torch.equal(an.decode(same, fmt), fmt.decode(codes))


# --- dtypes, shapes, autograd -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("fmt", [an.MXFP8_E4M3, an.MXFP4_E2M1, an.MXINT8], ids=repr)
def test_other_dtypes_match_float32(fmt: Block, dtype: torch.dtype) -> None:
    x = spread(640, seed=2, lo=-8, hi=8).to(dtype)
    y = an.quantize(x, fmt)
    assert y.dtype == dtype
    assert torch.equal(y.float(), an.quantize(x.float(), fmt))


def test_nvfp4_needs_float32_or_wider() -> None:
    """NVFP4 values carry the fp32 tensor scale's 24 bits: bfloat16 cannot hold them (no double rounding)."""
    with pytest.raises(RepresentabilityError):
        an.quantize(torch.ones(16, dtype=torch.bfloat16), an.NVFP4)
    x = spread(64, seed=10).double()
    exact = an.quantize(x, an.NVFP4)
    assert torch.equal(an.quantize(x.float(), an.NVFP4), exact.float())  # one rounding to float32


def test_shapes_views_numpy_and_gradient() -> None:
    x = spread(6 * 50, seed=11).reshape(6, 50)
    fmt = Block(an.E2M1, 16, axis=0)
    assert torch.equal(an.quantize(x.t(), fmt), an.quantize(x.t().contiguous(), fmt))  # non-contiguous view
    assert torch.equal(
        an.quantize(x, Block(an.E2M1, 16, axis=1)), an.quantize(x.t().contiguous(), fmt).t()
    )
    np.testing.assert_array_equal(an.quantize(x.numpy(), fmt), an.quantize(x, fmt).numpy())
    assert an.quantize(torch.tensor(3.3), an.MXFP4_E2M1).item() == 3.0  # 0-d
    assert an.quantize(torch.empty(0, 5), an.MXFP4_E2M1).shape == (0, 5)
    assert an.quantize(torch.empty(4, 0), an.MXFP4_E2M1).shape == (4, 0)
    w = x.clone().requires_grad_()
    an.quantize(w, an.MXFP4_E2M1).sum().backward()
    assert w.grad is not None and torch.equal(w.grad, torch.ones_like(x))


def test_padding_never_leaks() -> None:
    """Values of a short last block depend only on that block: equal to quantizing it alone."""
    x = spread(45, seed=12)
    y = an.quantize(x, an.MXFP8_E4M3)
    assert torch.equal(y[32:], an.quantize(x[32:], an.MXFP8_E4M3))
    assert torch.equal(y[:32], an.quantize(x[:32], an.MXFP8_E4M3))


# --- stochastic rounding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [an.MXFP4_E2M1, an.NVFP4, an.MXINT8], ids=repr)
def test_stochastic_rounding_is_unbiased(fmt: Block) -> None:
    """E[SR(x)] = x: many copies of one block (each row draws its own bits); mean within 5 sigma."""
    block = spread(16, seed=13, lo=-3, hi=0).clamp(-4.5, 4.5).double()
    block[0] = 5.0  # fixes every row's scale (and keeps the other elements off the saturation edge)
    rows = 4000
    x = block.repeat(rows, 1)
    y = an.quantize(x, fmt, "sr", seed=0)
    lo = an.quantize(block, fmt, "rd")
    hi = an.quantize(block, fmt, "ru")
    assert ((y == lo) | (y == hi)).all()  # only the two neighbours occur
    exact = hi == lo
    assert (y[:, exact] == block[exact]).all()
    p = (block - lo)[~exact] / (hi - lo)[~exact]
    sigma = (hi - lo)[~exact] * torch.sqrt(p * (1 - p) / rows)
    err = (y.mean(0) - block)[~exact].abs()
    assert (err <= 5 * sigma).all()
