"""The Block kernel: pad and reshape the blocked axis, one amax reduction, then the element kernel.

No Python loop over blocks: the input becomes a ``(..., blocks, block_size)``
view, the scales are computed for every block at once, and the element
format's own `round_to_format` rounds ``x / scale`` (so every element format
and rounding mode works, with that format's overflow rules).

Speed (the fused path compiles this same code; docs/block.md has figures).
Power-of-two scales come from the exponent bits of amax and are applied as
a multiply by ``2**-k`` (exact, so the same bits as the divide); the element
work runs on the flat row-major tensor with per-element copies of the block
values, which makes Inductor emit a reduction loop and then a flat element
loop instead of one loop nest where each block waits on its own reduction.

Exactness. Power-of-two scales: ``x / 2**k`` and ``element * 2**k`` are exact
in the working dtype (`working_dtype` picks float64 whenever float32 could
underflow or lack range). Other scales S (rule "amax", NVFP4): everything is
float64 and ``q = fl(x / S)`` is rounded, yet the element rounding of q equals
that of the exact quotient for every deterministic mode. Proof: the rounding
decision only changes at decision points t (grid points and midpoints, at most
element.precision + 1 bits), and t * S is a float64 because Block requires
element.precision + 1 + the scale precisions <= 53. If x != t * S, both are
float64 numbers, so |x - t*S| >= one ulp of the smaller binade, i.e. a relative
2**-52 / sig(t*S) > 2**-53 / sig(t) = half an ulp of t: fl(x / S) cannot equal
t, and by monotonicity stays on the exact quotient's side of t. (Gradual
underflow of float64, below 2**-1000, is the only exception.) The same argument
makes the "amax" rule's ``RU(fl(amax / (element.max * tensor_scale)))`` exact,
and ``element * S`` is exact by the same width bound.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from anynum._bits import floor_log2, layout, ldexp, pow2
from anynum.errors import FormatError, InputError
from anynum.formats.base import Format
from anynum.formats.block import Block, BlockCodes
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.kernels.eager import PieceRounder, piece_rounder, round_to_format, working_dtype
from anynum.kernels.route import decode_codes
from anynum.rounding import RandomSource, Rounding

__all__ = ["BlockResult", "block_round", "decode_blocks", "saturate_to_dtype_needed", "underflow_is_harmless"]


def _tiny(dtype: torch.dtype) -> float:
    """The smallest positive subnormal of `dtype`."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps


class BlockResult(NamedTuple):
    """Values (working dtype, input shape), element values (float64, input shape), scales (float64)."""

    values: torch.Tensor
    elements: torch.Tensor | None
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None


@working_dtype.register
def _(fmt: Block, dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64 or not fmt.power_of_two_scales:
        return torch.float64
    if working_dtype(fmt.element, dtype) == torch.float64:
        return torch.float64
    kmin, kmax = fmt.scale_exponent_range
    elem_quantum = floor_log2(torch.tensor(fmt.element.smallest_subnormal, dtype=torch.float64))
    # float32 must hold every scale and every element * scale exactly.
    if kmin < -126 - 23 or kmax > 127 or kmin + int(elem_quantum) < -149:
        return torch.float64
    return torch.float32


# --- blocked views -------------------------------------------------------------------------------


def _to_blocks(fmt: Block, x: torch.Tensor) -> torch.Tensor:
    """``(..., blocks, block_size)`` view of `x` with the blocked axis last, zero-padded."""
    if x.dim() == 0:
        x = x.reshape(1)
    t = x.reshape(-1) if fmt.axis is None else x.movedim(fmt.resolve_axis(x.dim()), -1)
    n = t.shape[-1]
    size = fmt.block_size or max(n, 1)
    blocks = fmt.block_count(n)
    pad = blocks * size - n
    if pad:
        t = F.pad(t, (0, pad))
    return t.reshape(*t.shape[:-1], blocks, size)


def _from_blocks(fmt: Block, tb: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of `_to_blocks`: drop the padding and restore `shape`."""
    t = tb.reshape(*tb.shape[:-2], tb.shape[-2] * tb.shape[-1])
    if fmt.axis is None:
        return t[: max(1, _numel(shape))].reshape(shape)
    ndim = max(len(shape), 1)
    axis = fmt.resolve_axis(ndim)
    n = shape[axis] if shape else 1
    return t[..., :n].movedim(-1, axis).reshape(shape)


def _numel(shape: torch.Size) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _scales_out(fmt: Block, sb: torch.Tensor, ndim: int) -> torch.Tensor:
    """Per-block scales ``(..., blocks)`` in the layout of `Block.scale_shape`."""
    if fmt.axis is None:
        return sb.reshape(-1)
    return sb.movedim(-1, fmt.resolve_axis(ndim))


def _scales_in(fmt: Block, scales: torch.Tensor, ndim: int) -> torch.Tensor:
    if fmt.axis is None:
        return scales.reshape(-1)
    return scales.movedim(fmt.resolve_axis(ndim), -1)


# --- scale rules -----------------------------------------------------------------------------------


def _pow2_exponents(fmt: Block, amax: torch.Tensor) -> torch.Tensor:
    """Shared exponent k (int32) of every block for the rules "floor", "ceil" and "even".

    Blocks holding NaN/inf get some k in the scale range (their values become NaN anyway).
    """
    kmin, kmax = fmt.scale_exponent_range
    element = fmt.element
    lay = layout(amax.dtype)
    bump = 0 if fmt.scale_rule == "floor" else 1  # ceil and even add at most one
    fast = -lay.bias - element.emax + bump <= kmin and 1 - lay.bias <= element.emax <= lay.bias
    if fast:
        # Integer work on amax's bits only. Few ops matter: Inductor inlines this chain into
        # every node that reads it and stores any node whose inlined chain grows past ~50 ops.
        # The exponent field reads floor(log2 amax) for normal amax and -bias for zero and
        # subnormals, whose true k (<= -bias - emax + bump) clamps to kmin either way.
        bits = amax.view(lay.int_dtype)
        e = ((bits >> lay.man_bits) & ((1 << lay.exp_bits) - 1)).to(torch.int32) - lay.bias
        sig = ((bits & ((1 << lay.man_bits) - 1)) | (lay.bias << lay.man_bits)).view(amax.dtype)
    else:
        positive = amax > 0
        safe = torch.where(positive & (amax < torch.inf), amax, 1.0)  # NaN fails both tests
        e = floor_log2(safe)
        sig = ldexp(safe, -e)
    # amax = sig * 2**e with sig in [1, 2), exactly; the rules on top of floor(log2 amax):
    k = e - element.emax
    if fmt.scale_rule == "ceil":  # one step up if amax / 2**k exceeds element.max
        k = k + (sig > element.max * 2.0**-element.emax).to(torch.int32)
    elif fmt.scale_rule == "even":  # round(log2 amax) = e + [sig >= sqrt(2)]
        m = sig.to(torch.float64)
        k = k + (m * m >= 2.0).to(torch.int32)
    k = torch.clamp(k, kmin, kmax)
    return k if fast else torch.where(positive, k, kmin)


def _round_up_quotient(num: torch.Tensor, den: float | torch.Tensor, sfmt: Format) -> torch.Tensor:
    """Smallest value S of `sfmt` with num <= S * den (saturating at sfmt.max), float64.

    ``num / den`` is rounded in float64, which cannot move it onto a value of
    `sfmt` that it is not equal to (module docstring: S * den is a float64).
    """
    q = num / den
    s = round_to_format(sfmt, q, Rounding.UP, "saturate", None, None)
    return torch.where(q > 0, s, sfmt.smallest_subnormal)


def _symmetric(fmt: Block, r: torch.Tensor) -> torch.Tensor:
    """Clamp to [-max, max] for symmetric blocks: the same as saturating on the symmetric grid."""
    return torch.clamp(r, -fmt.element.max, fmt.element.max) if fmt.symmetric else r


def _exp2(n: torch.Tensor, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Exactly 2**n in `dtype` for integer n with values in [lo, hi]; None if `dtype` cannot hold them all.

    Built from the exponent bits (`pow2`, a few integer ops, so Inductor's
    per-block chain stays short); results below the normal range are built one
    binade or more up and scaled down by an exact constant.
    """
    lay = layout(dtype)
    if lo < lay.quantum_min or hi > lay.emax:
        return None
    lift = max(0, lay.emin - lo)  # <= man_bits, so 2**-lift is a normal number
    if hi + lift > lay.emax:
        return ldexp(torch.ones_like(n, dtype=dtype), n)
    return pow2(n + lift, dtype) * 2.0**-lift if lift else pow2(n, dtype)


def _pow2_pair(
    fmt: Block, k: torch.Tensor, dtype: torch.dtype, from_rule: bool
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(``2**-k`` or None, ``2**k``) in `dtype` for block exponents k (int32), both exact.

    The reciprocal is given where `dtype` holds it for every k a finite block
    can reach; then ``x * 2**-k`` replaces ``x / 2**k``: both are the correctly
    rounded value of the same real number, so the bits are the same, and a
    multiply is several times cheaper than a divide. `from_rule`: k comes from
    `_pow2_exponents`, so only NaN/inf blocks (whose values become NaN anyway)
    exceed ``layout.emax - element.emax + 1``.
    """
    kmin, kmax = fmt.scale_exponent_range
    if from_rule:
        bump = 0 if fmt.scale_rule == "floor" else 1
        kmax = min(kmax, layout(dtype).emax - int(fmt.element.emax) + bump)
    scale = _exp2(k, kmin, kmax, dtype)
    assert scale is not None  # working_dtype holds every scale
    return _exp2(-k, -kmax, -kmin, dtype), scale


_TO_ZERO_MODES = (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY, Rounding.NEAREST_ZERO, Rounding.TOWARD_ZERO)


def underflow_is_harmless(element: Format, mode: Rounding, dtype: torch.dtype) -> bool:
    """Whether `element` rounds ±tiny (dtype's smallest subnormal) exactly as it rounds ±0 in `mode`.

    Then ``x / scale`` underflowing to zero needs no repair. True for the modes
    that send |v| <= step / 4 to zero, on signed float grids and on fixed-point
    grids whose smallest step is at least 4 * tiny (an unsigned float grid
    gives NaN for -tiny but 0 for -0; posits never round to zero).
    """
    if mode not in _TO_ZERO_MODES:
        return False
    tiny = _tiny(dtype)
    if isinstance(element, FloatFormat):
        return element.signed and element.smallest_subnormal >= 4 * tiny
    return isinstance(element, UniformFormat) and element.step >= 4 * tiny


def _per_element(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Block values `t` (shape ``shape[:-1]``) repeated over their block, flattened like ``xb.reshape(-1)``.

    The element work runs on flat tensors with these per-element copies (a
    copy in eager, an index ``i // block_size`` under Inductor). Written on the
    ``(..., blocks, block_size)`` view, Inductor fuses it into the amax
    reduction's loop nest, where each block's rounding waits on its own
    reduction: measured 1.6x slower than a reduction loop followed by a flat
    element loop (torch 2.13, CPU).
    """
    return t[..., None].expand(shape).reshape(-1)


# --- the kernel --------------------------------------------------------------------------------------


def _tensor_scale(fmt: Block, x: torch.Tensor) -> torch.Tensor:
    """The second scale of the "amax" rule (NVFP4's): the largest finite magnitude of all of `x`
    over element.max * scale.max, rounded up into the tensor-scale format; 1 where no element is
    finite and nonzero. Any float dtype of x gives the same float64 scale."""
    assert fmt.tensor_scale is not None
    f64 = torch.float64
    a = x.abs()
    finite = torch.where(a < torch.inf, a, 0.0)
    amax_t = finite.amax().to(f64) if finite.numel() else torch.zeros((), dtype=f64, device=x.device)
    tensor_scale = _round_up_quotient(amax_t, fmt.element.max * fmt.scale.max, fmt.tensor_scale)
    return torch.where(amax_t > 0, tensor_scale, 1.0)


def block_round(
    fmt: Block,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    scales: torch.Tensor | None = None,
    tensor_scale: torch.Tensor | None = None,
    with_elements: bool = True,
) -> BlockResult:
    """Quantize `x` (working dtype) onto `fmt`; `scales`/`tensor_scale` (float64) override the rule.

    ``with_elements=False`` skips the element values (None), which `quantize` does not need.
    """
    if scales is None and fmt.scale_rule == "none":
        raise FormatError(
            f"{fmt.display_name()} has scale_rule='none', so quantize() has no scales; call "
            "anynum.formats.block.quantize_block(x, fmt, scales=...) instead."
        )
    shape = x.shape
    ndim = x.dim()
    xb = _to_blocks(fmt, x)
    f64 = torch.float64
    element = fmt.element
    k: torch.Tensor | None = None  # the block exponents, for power-of-two scales

    if scales is not None:
        bad = None
        sb = _scales_in(fmt, scales.to(device=x.device, dtype=f64), ndim)
    else:
        amax = xb.abs().amax(dim=-1) if xb.shape[-1] else torch.zeros(xb.shape[:-1], dtype=x.dtype)
        bad = ~(amax < torch.inf)  # NaN or inf inside the block
        if fmt.scale_rule in ("floor", "ceil", "even"):
            k = _pow2_exponents(fmt, amax)
            sb = ldexp(torch.ones_like(amax, dtype=f64), k)
        else:  # "amax": amax / (element.max * tensor scale), rounded up into the scale format
            if fmt.tensor_scale is not None and tensor_scale is None:
                tensor_scale = _tensor_scale(fmt, xb)
            den = element.max * (tensor_scale if tensor_scale is not None else 1.0)
            safe = torch.where(bad, 0.0, amax).to(f64)
            sb = _round_up_quotient(safe, den, fmt.scale)
    if fmt.tensor_scale is not None and tensor_scale is None:
        tensor_scale = torch.ones((), dtype=f64, device=x.device)

    xf = xb.reshape(-1)  # row-major, so element_index (the random-bit address) is unchanged
    if fmt.power_of_two_scales:
        from_rule = k is not None
        if k is None:  # given scales, or the "amax" rule on a power-of-two scale format
            k = floor_log2(sb)
        inv, s_w = _pow2_pair(fmt, k, x.dtype, from_rule)  # exact: working_dtype holds every scale
        if inv is not None:
            q = xf * _per_element(inv, xb.shape)
        else:
            q = xf / _per_element(s_w, xb.shape)
        if not underflow_is_harmless(element, mode, q.dtype):
            # Underflow to zero (float32 path, far below the element grid) must keep x's sign and
            # non-zeroness so that directed and odd rounding still see a nonzero value.
            # (where, not copysign: Inductor emits copysign as a Sleef call, not inline code)
            tiny = torch.full_like(q, _tiny(q.dtype))
            q = torch.where((q == 0) & (xf != 0), torch.where(xf > 0, tiny, -tiny), q)
        r = _symmetric(fmt, round_to_format(element, q, mode, overflow, rng, rand_bits))
        step = _per_element(s_w, xb.shape)
    else:
        step = _per_element(sb * tensor_scale if tensor_scale is not None else sb, xb.shape)
        q = xf.to(f64) / step  # rounded, but never onto a decision point it differs from (docstring)
        r = _symmetric(fmt, round_to_format(element, q, mode, overflow, rng, rand_bits))
    yf = r * step
    if saturate_to_dtype_needed(fmt, overflow, x.dtype):
        r, yf = _saturate_to_dtype(element, xf, q, r, step, yf, x.dtype)

    if bad is not None:
        badf = _per_element(bad, xb.shape)
        yf = torch.where(badf, torch.nan, yf)
        if with_elements:
            r = torch.where(badf, torch.nan if element.has_nan else 0.0, r)
        sb = torch.where(bad, torch.nan, sb)
    yb = yf.view(xb.shape)
    values = _from_blocks(fmt, yb.to(x.dtype), shape)
    elements = _from_blocks(fmt, r.to(f64).view(xb.shape), shape) if with_elements else None
    return BlockResult(values, elements, _scales_out(fmt, sb, ndim), tensor_scale)


@piece_rounder.register
def _block_pieces(fmt: Block, x: torch.Tensor) -> PieceRounder | None:
    """Pieces of NVFP4-like blocks (an "amax" rule with a tensor scale) round with all of x's
    tensor scale (`round_reference`). The tensor scale is the only part of a block rule that reads
    more than a block: `Block` refuses it with the floor/ceil/even rules, and "none" takes given
    scales. A rule that read the whole tensor otherwise would need its part computed here too."""
    if fmt.tensor_scale is None or fmt.scale_rule != "amax":
        return None
    scale = _tensor_scale(fmt, x)

    def rounder(
        _: Format, piece: torch.Tensor, mode: Rounding, overflow: str, rng: RandomSource | None, r: int | None
    ) -> torch.Tensor:
        rounded = block_round(fmt, piece, mode, overflow, rng, r, tensor_scale=scale, with_elements=False)
        return rounded.values

    return rounder


def saturate_to_dtype_needed(fmt: Block, overflow: str, dtype: torch.dtype) -> bool:
    """Whether a block result may exceed `dtype`'s largest float (so `_saturate_to_dtype` applies)."""
    return overflow == "saturate" and fmt.abs_max > torch.finfo(dtype).max


def _saturate_to_dtype(
    element: Format,
    xf: torch.Tensor,
    q: torch.Tensor,
    r: torch.Tensor,
    step: torch.Tensor,
    yf: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Saturation within the output dtype: where the element nearest x / scale times the scale
    lies beyond `dtype`'s largest float (x near float32's max under a scale rule that rounds the
    scale up), the result is the largest block value the dtype holds below it: the element
    rounded toward zero, whose product with the scale is at most |x|."""
    over = torch.isinf(yf.to(dtype)) & torch.isfinite(xf)
    if not torch.compiler.is_compiling() and not bool(over.any()):
        return r, yf
    rz = round_to_format(element, q, Rounding.TOWARD_ZERO, "saturate", None, None)
    return torch.where(over, rz, r), torch.where(over, rz * step, yf)


@round_to_format.register
def _round_block(
    fmt: Block,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    return block_round(fmt, x, mode, overflow, rng, rand_bits, with_elements=False).values


def decode_blocks(fmt: Block, codes: BlockCodes) -> torch.Tensor:
    """float64 values of `BlockCodes` (int64 codes, each valid for its format): element values times
    their block's scale (times the tensor scale)."""
    elements = codes.elements
    expected = fmt.scale_shape(elements.shape)
    if tuple(codes.scales.shape) != expected:
        raise InputError(
            f"scale codes must have shape {expected} for element codes of shape "
            f"{tuple(elements.shape)}, got {tuple(codes.scales.shape)}."
        )
    if (codes.tensor_scale is None) != (fmt.tensor_scale is None):
        need = "needs" if fmt.tensor_scale is not None else "has no"
        raise InputError(f"{fmt.display_name()} {need} a tensor-scale code (BlockCodes.tensor_scale).")
    values = decode_codes(fmt.element, elements)
    scales = decode_codes(fmt.scale, codes.scales)
    if codes.tensor_scale is not None:
        assert fmt.tensor_scale is not None
        scales = scales * decode_codes(fmt.tensor_scale, codes.tensor_scale)
    ndim = elements.dim()
    yb = _to_blocks(fmt, values) * _scales_in(fmt, scales, ndim)[..., None]
    return _from_blocks(fmt, yb, elements.shape)
