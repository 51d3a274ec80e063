"""Block formats against an exact rational reference, gfloat's OCP MX code, and the OCP MX rule.

The reference below is written from the definitions in docs/block.md with
`fractions.Fraction`, one block at a time (Python loops, no padding: the
last block is simply shorter), so it shares no code with the vectorised
kernel. The element grids come from `Format.values()`, which the float/fixed
oracles verify bit-exactly against ml_dtypes and gfloat elsewhere.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction as Fr

import numpy as np
import pytest
import torch
from gfloat import RoundMode, compute_scale_amax
from gfloat import formats as gff
from gfloat import quantize_block as gf_quantize_block

import anynum as an
from anynum import quantize_block
from anynum.formats.block import UE4M3, Block

DETERMINISTIC = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]


# --- the exact reference ----------------------------------------------------------------------


class Grid:
    """A format's finite values as sorted Fractions, with the parity of each value's code."""

    def __init__(self, fmt: an.Format, symmetric: bool = False):
        vals = sorted({Fr(float(v)) for v in fmt.values() if not symmetric or abs(v) <= fmt.max})
        self.values = vals
        self.fmt = fmt
        mags = sorted({abs(v) for v in vals})
        self._index = {m: i for i, m in enumerate(mags)}

    def odd(self, v: Fr) -> bool:
        if isinstance(self.fmt, an.FixedPoint):
            return (v / Fr(self.fmt.step)).numerator % 2 == 1
        return self._index[abs(v)] % 2 == 1

    def round(self, v: Fr, mode: str) -> Fr:
        """Exact rounding with saturation (OCP MX elements saturate)."""
        g = self.values
        if v >= g[-1]:
            return g[-1]
        if v <= g[0]:
            return g[0]
        i = bisect.bisect_left(g, v)
        if g[i] == v:
            return v
        lo, hi = g[i - 1], g[i]
        toward_zero, away = (lo, hi) if v > 0 else (hi, lo)
        if mode == "rz":
            return toward_zero
        if mode == "ru":
            return hi
        if mode == "rd":
            return lo
        if mode == "ro":
            return lo if self.odd(lo) else hi
        d_lo, d_hi = v - lo, hi - v
        if d_lo != d_hi:
            return lo if d_lo < d_hi else hi
        if mode == "rna":
            return away
        if mode == "rnz":
            return toward_zero
        return hi if self.odd(lo) else lo  # ties to even


def flog2(a: Fr) -> int:
    n = a.numerator.bit_length() - a.denominator.bit_length()
    return n - 1 if Fr(2) ** n > a else n


def round_up_fp32(q: Fr) -> Fr:
    """The smallest float32 >= q (q > 0, in range), exactly."""
    c = np.float32(float(q))
    while Fr(float(c)) < q:
        c = np.nextafter(c, np.float32(np.inf))
    while True:
        below = np.nextafter(c, np.float32(0))
        if below > 0 and Fr(float(below)) >= q:
            c = below
        else:
            return Fr(float(c))


def ref_scale(fmt: Block, amax: Fr, element_max: Fr, scale_grid: list[Fr] | None, ts: Fr) -> Fr:
    """The block scale of the rules in docs/block.md, by exact arithmetic."""
    kmin, kmax = fmt.scale_exponent_range
    if fmt.scale_rule == "amax":
        assert scale_grid is not None
        if amax == 0:
            return scale_grid[0]
        target = amax / (element_max * ts)
        above = [s for s in scale_grid if s >= target]
        return above[0] if above else scale_grid[-1]
    if amax == 0:
        return Fr(2) ** kmin
    emax = fmt.element.emax
    e = flog2(amax)
    if fmt.scale_rule == "floor":
        k = e - emax
    elif fmt.scale_rule == "ceil":
        k = e - emax - 1
        while amax > element_max * Fr(2) ** k:
            k += 1
    else:  # "even": the integer nearest log2(amax); amax / 2**e >= sqrt(2) rounds up
        m = amax / Fr(2) ** e
        k = e + (1 if m * m >= 2 else 0) - emax
    return Fr(2) ** min(max(k, kmin), kmax)


def reference(x: np.ndarray, fmt: Block, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64, element values) of quantizing float64 array `x` onto `fmt`."""
    grid = Grid(fmt.element, fmt.symmetric)
    element_max = Fr(fmt.element.max)
    scale_grid = sorted(Fr(float(v)) for v in fmt.scale.values() if v > 0) if fmt.scale.bits <= 16 else None
    ts = Fr(1)
    flat_finite = [Fr(float(v)) for v in x.reshape(-1) if math.isfinite(v)]
    if fmt.tensor_scale is not None:
        amax_t = max((abs(v) for v in flat_finite), default=Fr(0))
        if amax_t > 0:
            ts = round_up_fp32(amax_t / (element_max * Fr(fmt.scale.max)))
    if fmt.axis is None:
        moved = x.reshape(1, -1)
    else:
        moved = np.moveaxis(x if x.ndim else x.reshape(1), fmt.axis, -1)
    out = np.empty(moved.shape)
    elems = np.empty(moved.shape)
    n = moved.shape[-1]
    size = fmt.block_size or max(n, 1)
    for idx in np.ndindex(*moved.shape[:-1]):
        row = moved[idx]
        for start in range(0, n, size):
            block = row[start : start + size]
            sl = (*idx, slice(start, start + size))
            if not np.all(np.isfinite(block)):
                out[sl] = np.nan
                elems[sl] = np.nan if fmt.element.has_nan else 0.0
                continue
            fr = [Fr(float(v)) for v in block]
            scale = ref_scale(fmt, max(abs(v) for v in fr), element_max, scale_grid, ts) * ts
            rs = [grid.round(v / scale, mode) for v in fr]
            out[sl] = [float(r * scale) for r in rs]  # exact: at most 53 significant bits
            elems[sl] = [float(r) for r in rs]
            if not fmt.element.signed:  # negative inputs have no value on an unsigned grid
                neg = np.asarray(block) < 0
                out[sl] = np.where(neg, np.nan, out[sl])
                elems[sl] = np.where(neg, np.nan, elems[sl])
    if fmt.axis is None:
        return out.reshape(x.shape), elems.reshape(x.shape)
    return np.moveaxis(out, -1, fmt.axis).reshape(x.shape), np.moveaxis(elems, -1, fmt.axis).reshape(x.shape)


# --- inputs -------------------------------------------------------------------------------------------


def random_input(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Gaussian values over many binades, with exact zeros and a few rows of tiny values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-12, 12, shape, generator=g).to(torch.float64))
    x = torch.where(torch.rand(shape, generator=g) < 0.05, torch.zeros_like(x), x)
    return x.to(dtype)


CONFIGS = [
    # (format, shape) pairs: axes, block sizes that do not divide the axis, whole-axis and whole-tensor blocks
    (an.MXFP8_E4M3, (3, 70)),
    (an.MXFP8_E5M2, (2, 45)),
    (an.MXFP6_E3M2, (40, 3)),
    (an.MXFP6_E2M3, (5, 33)),
    (an.MXFP4_E2M1, (2, 3, 37)),
    (an.MXINT8, (4, 40)),
    (Block(an.E2M1, 5, axis=0), (13, 4)),
    (Block(an.E4M3FN, 7, axis=1), (3, 10, 2)),
    (Block(an.E2M3, None, axis=0), (9, 5)),
    (Block(an.FixedPoint(3, 4), 6, axis=None), (5, 7)),
    (Block(an.IntFormat(4), 3), (4, 11)),
    (Block(an.E4M3FN, 8, scale_rule="ceil"), (3, 30)),
    (Block(an.E2M1, 8, scale_rule="even"), (3, 30)),
    (Block(an.FixedPoint(2, 3), 4, scale_rule="even", axis=0), (10, 3)),
    (Block(an.E2M1, 4, scale=UE4M3, scale_rule="amax"), (3, 22)),
    (Block(an.E2M1, 16, scale=an.E8M0, scale_rule="amax"), (2, 40)),
    (an.NVFP4, (3, 40)),
    (Block(an.E4M3FN, 16, scale=UE4M3, scale_rule="amax", tensor_scale=an.FP32, axis=0), (35, 2)),
]


@pytest.mark.parametrize("case", range(len(CONFIGS)), ids=lambda i: repr(CONFIGS[i][0]))
def test_matches_exact_reference(case: int) -> None:
    fmt, shape = CONFIGS[case]
    x = random_input(shape, seed=case)
    for mode in DETERMINISTIC:
        q = quantize_block(x, fmt, mode)
        want, want_elems = reference(x.double().numpy(), fmt, mode)
        np.testing.assert_array_equal(q.elements.numpy(), want_elems, err_msg=f"{fmt!r} {mode}")
        # float32 output: the exact value rounded once to nearest (exact for power-of-two scales)
        np.testing.assert_array_equal(q.values.numpy(), want.astype(np.float32), err_msg=f"{fmt!r} {mode}")
        np.testing.assert_array_equal(an.quantize(x, fmt, mode).numpy(), q.values.numpy())


def extreme_input(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Magnitudes over the dtype's whole range, subnormals included, so that most blocks hold
    elements far below their maximum (``x / scale`` underflows the working dtype) and some blocks
    are all subnormal; short significands (many exact ties), zeros of both signs, one NaN and one inf.
    """
    g = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    lo, hi = math.floor(math.log2(info.smallest_normal * info.eps)), math.floor(math.log2(info.max))
    e = torch.randint(lo, hi, shape, generator=g).double()
    m = 1 + torch.randint(0, 1 << 6, shape, generator=g).double() / 64
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    x = (sign * m * torch.exp2(e)).to(dtype).reshape(-1)
    x[torch.rand(x.shape, generator=g) < 0.05] = 0.0
    x[3], x[4] = -0.0, info.smallest_normal * info.eps
    x[40:60] = x[40:60] * 2.0**-60  # a run of subnormal / tiny values
    x[65:96] = x[65:96] * 2.0**-100
    x[64] = 448.0 * 2.0**42  # block maximum with E4M3FN's significand: ceil keeps the scale 2**42
    tiny = torch.exp2(-torch.randint(8, 20, (32,), generator=g).double()) * info.smallest_normal
    x[96:128] = (m.reshape(-1)[96:128] * tiny).to(dtype)  # a block of subnormals only
    x[-7], x[-20] = math.nan, -math.inf
    return x.reshape(shape)


#: Every path of the kernel: exponents from the bits of amax or via floor_log2 (ceil with emax 0,
#: a scale reaching below 2**(-127 - emax)), scale reciprocals from the bits, through ldexp (MXINT8)
#: or none at all (division: 2**140 is no float32), the underflow repair skipped (nearest modes,
#: signed grids) or kept (directed modes; an unsigned grid, where -tiny and -0 differ), scales
#: computed by the "amax" rule on E8M0, axes that the block divides and axes padded.
WIDE_SCALE = an.FloatFormat(8, 0, bias=140, subnormals=False, zero=False, signed=False, specials="fn")
UNSIGNED_E4M3 = an.FloatFormat(4, 3, specials="fn", signed=False)
EXTREME_CONFIGS = [
    (an.MXFP8_E4M3, (6, 64)),
    (an.MXFP4_E2M1, (5, 45)),
    (an.MXINT8, (4, 64)),
    (Block(an.E4M3FN, 32, scale_rule="ceil"), (4, 64)),
    (Block(an.E2M1, 32, scale_rule="even", axis=0), (64, 3)),
    (Block(an.FixedPoint(2, 6), 32, scale_rule="ceil"), (4, 70)),
    (Block(an.E2M1, 32, scale=WIDE_SCALE), (4, 64)),
    (Block(an.E2M1, 16, scale=an.E8M0, scale_rule="amax"), (4, 40)),
    (Block(UNSIGNED_E4M3, 8), (4, 40)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", range(len(EXTREME_CONFIGS)), ids=lambda i: repr(EXTREME_CONFIGS[i][0]))
def test_extreme_ranges_match_exact_reference(case: int, dtype: torch.dtype) -> None:
    fmt, shape = EXTREME_CONFIGS[case]
    x = extreme_input(shape, seed=100 + case, dtype=dtype)
    for mode in DETERMINISTIC:
        q = quantize_block(x, fmt, mode)
        want, want_elems = reference(x.double().numpy(), fmt, mode)
        np.testing.assert_array_equal(q.elements.numpy(), want_elems, err_msg=f"{fmt!r} {mode}")
        np.testing.assert_array_equal(q.values.double().numpy(), want, err_msg=f"{fmt!r} {mode}")
        # zeros carry x's sign where the element has -0 (Fractions have no signed zero)
        zero = want == 0
        want_sign = np.signbit(x.double().numpy()) & fmt.element.has_negative_zero
        assert (np.signbit(q.values.double().numpy()) == want_sign)[zero].all(), f"{fmt!r} {mode}"
        np.testing.assert_array_equal(an.quantize(x, fmt, mode).numpy(), q.values.numpy())


@pytest.mark.parametrize("fmt", [an.NVFP4, Block(an.E2M1, 4, scale=UE4M3, scale_rule="amax")], ids=repr)
def test_non_power_of_two_scale_no_double_rounding(fmt: Block) -> None:
    """float64 inputs one ulp off every element grid point and midpoint times the scale.

    fl64(x / S) lands on the grid point or midpoint for many of these; the
    kernel must still round as the exact quotient does (docs/block.md).
    """
    element = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    points = np.union1d(element, (element[1:] + element[:-1]) / 2)
    points = np.concatenate([-points[::-1], points])
    n = len(points)
    pad = -n % 4
    base = np.concatenate([points, np.zeros(pad)])
    # Anchor every block with 6 * scale so its scale is a fixed odd-looking UE4M3 value.
    xs = []
    for s_code in (9, 37, 61):  # UE4M3 scales 1.125 * 2**-6, 1.625 * 2**-3, 1.625 * 2**0
        s = float(UE4M3.decode(s_code))
        blocks = base.reshape(-1, 4).copy()
        blocks[:, 0] = 6.0
        x = blocks.reshape(-1) * s
        for direction in (-np.inf, np.inf):
            xs.append(np.nextafter(x, direction))
        xs.append(x)
    x = torch.tensor(np.concatenate(xs)).reshape(len(xs), -1)
    if fmt.block_size == 16:
        x = x[:, : x.shape[1] // 16 * 16]
    for mode in DETERMINISTIC:
        got = quantize_block(x, fmt, mode)
        want, want_elems = reference(x.numpy(), fmt, mode)
        np.testing.assert_array_equal(got.elements.numpy(), want_elems, err_msg=mode)
        np.testing.assert_array_equal(got.values.numpy(), want, err_msg=mode)


# --- gfloat: OCP MX -------------------------------------------------------------------------------------


GFLOAT_FORMATS = [
    (an.MXFP8_E4M3, gff.format_info_mxfp8_e4m3),
    (an.MXFP8_E5M2, gff.format_info_mxfp8_e5m2),
    (an.MXFP6_E3M2, gff.format_info_mxfp6_e3m2),
    (an.MXFP6_E2M3, gff.format_info_mxfp6_e2m3),
    (an.MXFP4_E2M1, gff.format_info_mxfp4_e2m1),
    (Block(an.MXINT8.element, 32), gff.format_info_mxint8),  # gfloat keeps -2.0; MXINT8 is symmetric
]
GFLOAT_MODES = {
    "nearest": RoundMode.TiesToEven,
    "rna": RoundMode.TiesToAway,
    "rz": RoundMode.TowardZero,
    "ru": RoundMode.TowardPositive,
    "rd": RoundMode.TowardNegative,
}


@pytest.mark.parametrize(("fmt", "fi"), GFLOAT_FORMATS, ids=lambda v: getattr(v, "name", repr(v)))
def test_matches_gfloat_quantize_block(fmt: Block, fi: object) -> None:
    x = random_input((24, 32), seed=7).numpy().astype(np.float64)
    x[0] = 0.0  # all-zero block: both give the smallest scale, 2**-127, and zeros
    x[1, :] = np.ldexp(x[1, :], -135)  # a block whose amax is below 2**(-127 + emax): clamped scale
    x[2, :] = np.ldexp(x[2, :], 120)  # a block whose scale clamps at 2**127 (in float64)
    for mode, gmode in GFLOAT_MODES.items():
        ours = an.quantize(torch.tensor(x), fmt, mode).numpy()
        theirs = np.stack([gf_quantize_block(fi, row, compute_scale_amax, gmode) for row in x])
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{fmt!r} {mode}")


def test_mxint8_differs_from_gfloat_only_on_minus_two() -> None:
    x = random_input((64, 32), seed=8).numpy().astype(np.float64)
    top = np.exp2(np.arange(64) - 32)
    x = x / np.abs(x).max(axis=1, keepdims=True) * top[:, None]
    x[:, 0] = -1.996 * top  # the block maximum; gfloat rounds it to -2.0 * scale
    theirs = np.stack([gf_quantize_block(gff.format_info_mxint8, r, compute_scale_amax) for r in x])
    ours = quantize_block(torch.tensor(x), an.MXINT8)
    scale = np.repeat(ours.scales.numpy(), 32, axis=1)
    minus_two = theirs == -2.0 * scale
    assert minus_two[:, 0].all()
    np.testing.assert_array_equal(ours.values.numpy()[~minus_two], theirs[~minus_two])
    np.testing.assert_array_equal(ours.values.numpy()[minus_two], -127 / 64 * scale[minus_two])


def test_gfloat_compute_scale_amax_matches_floor_rule() -> None:
    rng = np.random.default_rng(3)
    amax = np.abs(rng.standard_normal(2000))
    amax = np.concatenate([amax * np.exp2(rng.integers(-140, 130, 2000)), [0.0, 2.0**-140, 2.0**140]])
    for fmt in (an.MXFP8_E4M3, an.MXFP4_E2M1, an.MXINT8):
        x = torch.tensor(amax).reshape(-1, 1)
        ours = quantize_block(x, Block(fmt.element, 1)).scales.reshape(-1).numpy()
        theirs = np.array([compute_scale_amax(fmt.element.emax, np.array([a])) for a in amax])
        np.testing.assert_array_equal(ours, theirs)


def test_gfloat_difference_log2_rounding() -> None:
    """gfloat computes floor(np.log2(amax)) in float64, which rounds up just below large powers of two.

    amax = 2**10 * (1 - 2**-53) has floor(log2) = 9; np.log2 returns exactly 10.0.
    The exact rule (and the E8M0 code that OCP defines from the exponent bits) gives 9 - emax.
    """
    amax = np.nextafter(1024.0, 0.0)
    theirs = compute_scale_amax(an.E2M1.emax, np.array([amax]))
    ours = quantize_block(torch.tensor([amax]), Block(an.E2M1, 1)).scales.item()
    assert ours == 2.0 ** (9 - 2)
    assert theirs == 2.0 ** (10 - 2)  # gfloat's float64 log2 rounding


def test_gfloat_difference_inf_in_block() -> None:
    """A block holding ±inf: gfloat clamps the scale to 2**127 and saturates; ours is a NaN block."""
    x = np.array([np.inf, 1.0, -2.0, 0.5])
    theirs = gf_quantize_block(gff.format_info_mxfp8_e4m3, x, compute_scale_amax, RoundMode.TiesToEven)
    assert theirs[0] == 448.0 * 2.0**127 and np.all(theirs[1:] == 0)
    ours = an.quantize(torch.tensor(x), an.MXFP8_E4M3).numpy()
    assert np.isnan(ours).all()
    # NaN in a block: both give a NaN scale and an all-NaN block.
    x[0] = np.nan
    theirs = gf_quantize_block(gff.format_info_mxfp8_e4m3, x, compute_scale_amax, RoundMode.TiesToEven)
    assert np.isnan(theirs).all() and np.isnan(an.quantize(torch.tensor(x), an.MXFP8_E4M3).numpy()).all()


# --- OCP MX published behaviour --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "emax"),
    [(an.MXFP8_E4M3, 8), (an.MXFP8_E5M2, 15), (an.MXFP6_E3M2, 4), (an.MXFP6_E2M3, 2), (an.MXFP4_E2M1, 2),
     (an.MXINT8, 0)],
    ids=repr,
)
def test_ocp_shared_exponent_and_saturation(fmt: Block, emax: int) -> None:
    """OCP MX v1.0 §6.3: X = 2**(floor(log2 amax) - emax_elem) (emax_elem from the spec's table 1).

    The block's largest element becomes amax / X in [2**emax, 2**(emax+1)); above
    the element's max it saturates to the max (the spec clamps normal numbers).
    """
    assert fmt.element.emax == emax and fmt.block_size == 32 and fmt.scale == an.E8M0
    for e in (-20, 0, 7):
        top = 1.99 * 2.0**e  # its significand 1.99 exceeds every element max significand
        x = torch.full((32,), 2.0**e / 4)
        x[5] = -top
        q = quantize_block(x, fmt)
        assert q.scales.item() == 2.0 ** (e - emax)
        assert q.values[5].item() == -fmt.element.max * 2.0 ** (e - emax)
        assert q.values[0].item() == 2.0**e / 4
    # E8M0 encodes the scale's exponent + 127
    assert fmt.encode(torch.tensor([1.0])).scales.item() == 127 - emax
