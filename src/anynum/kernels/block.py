"""The Block kernel: pad and reshape the blocked axis, one amax reduction, then the element kernel.

No Python loop over blocks: the input becomes a ``(..., blocks, block_size)``
view, the scales are computed for every block at once, and the element
format's own `round_to_format` rounds ``x / scale`` (so every element format
and rounding mode works, with that format's overflow rules).

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

from anynum._bits import floor_log2, ldexp
from anynum.errors import FormatError, InputError
from anynum.formats.base import Format
from anynum.formats.block import Block, BlockCodes
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import RandomSource, Rounding

__all__ = ["BlockResult", "block_round", "decode_blocks"]



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
    blocks = fmt._blocks(n)
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
    """Shared exponent k (int64) of every block for the rules "floor", "ceil" and "even"."""
    kmin, kmax = fmt.scale_exponent_range
    element = fmt.element
    positive = amax > 0
    safe = torch.where(positive & torch.isfinite(amax), amax, torch.ones_like(amax))
    e = floor_log2(safe).to(torch.int64)
    k = e - element.emax
    if fmt.scale_rule == "ceil":
        # amax / 2**k lies in [2**emax, 2**(emax+1)); one step up if it exceeds element.max.
        k = k + (ldexp(safe, -k) > element.max).to(torch.int64)
    elif fmt.scale_rule == "even":
        m = ldexp(safe, -e).to(torch.float64)  # significand in [1, 2), exact
        k = k + (m * m >= 2.0).to(torch.int64)  # round(log2 amax) = e + [m >= sqrt(2)]
    k = torch.clamp(k, kmin, kmax)
    return torch.where(positive, k, torch.full_like(k, kmin))


def _round_up_quotient(num: torch.Tensor, den: float | torch.Tensor, sfmt: Format) -> torch.Tensor:
    """Smallest value S of `sfmt` with num <= S * den (saturating at sfmt.max), float64.

    ``num / den`` is rounded in float64, which cannot move it onto a value of
    `sfmt` that it is not equal to (module docstring: S * den is a float64).
    """
    q = num / den
    s = round_to_format(sfmt, q, Rounding.UP, "saturate", None, None)
    return torch.where(q > 0, s, torch.full_like(s, sfmt.smallest_subnormal))


def _symmetric(fmt: Block, r: torch.Tensor) -> torch.Tensor:
    """Clamp to [-max, max] for symmetric blocks: the same as saturating on the symmetric grid."""
    return torch.clamp(r, -fmt.element.max, fmt.element.max) if fmt.symmetric else r


# --- the kernel --------------------------------------------------------------------------------------


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

    if scales is not None:
        bad = torch.zeros(xb.shape[:-1], dtype=torch.bool, device=x.device)
        sb = _scales_in(fmt, scales.to(device=x.device, dtype=f64), ndim)
    else:
        amax = xb.abs().amax(dim=-1) if xb.shape[-1] else torch.zeros(xb.shape[:-1], dtype=x.dtype)
        bad = ~torch.isfinite(amax)  # NaN or inf inside the block
        if fmt.scale_rule in ("floor", "ceil", "even"):
            sb = ldexp(torch.ones_like(amax, dtype=f64), _pow2_exponents(fmt, amax))
        else:  # "amax": amax / (element.max * tensor scale), rounded up into the scale format
            if fmt.tensor_scale is not None and tensor_scale is None:
                finite = torch.where(torch.isfinite(xb), xb.abs(), torch.zeros_like(xb))
                amax_t = finite.amax().to(f64) if finite.numel() else torch.zeros((), dtype=f64)
                tensor_scale = _round_up_quotient(amax_t, element.max * fmt.scale.max, fmt.tensor_scale)
                tensor_scale = torch.where(amax_t > 0, tensor_scale, torch.ones_like(tensor_scale))
            den = element.max * (tensor_scale if tensor_scale is not None else 1.0)
            safe = torch.where(bad, torch.zeros_like(amax), amax).to(f64)
            sb = _round_up_quotient(safe, den, fmt.scale)
    if fmt.tensor_scale is not None and tensor_scale is None:
        tensor_scale = torch.ones((), dtype=f64, device=x.device)

    if fmt.power_of_two_scales:
        s_w = sb.to(x.dtype)[..., None]  # exact: working_dtype holds every scale
        q = xb / s_w
        # Underflow to zero (float32 path, far below the element grid) must keep x's sign and
        # non-zeroness so that directed and odd rounding still see a nonzero value.
        q = torch.where((q == 0) & (xb != 0), torch.copysign(torch.full_like(q, _tiny(q.dtype)), xb), q)
        r = _symmetric(fmt, round_to_format(element, q, mode, overflow, rng, rand_bits))
        yb = r * s_w
    else:
        total = sb * tensor_scale if tensor_scale is not None else sb
        total = total[..., None]
        q = xb.to(f64) / total  # rounded, but never onto a decision point it differs from (docstring)
        r = _symmetric(fmt, round_to_format(element, q, mode, overflow, rng, rand_bits))
        yb = r * total

    if scales is None:  # unconditional (no data-dependent branch, so torch.compile keeps one graph)
        badx = bad[..., None]
        yb = torch.where(badx, torch.full_like(yb, torch.nan), yb)
        filler = torch.nan if element.has_nan else 0.0
        r = torch.where(badx, torch.full_like(r, filler), r)
        sb = torch.where(bad, torch.full_like(sb, torch.nan), sb)
    values = _from_blocks(fmt, yb.to(x.dtype), shape)
    elements = _from_blocks(fmt, r.to(f64), shape) if with_elements else None
    return BlockResult(values, elements, _scales_out(fmt, sb, ndim), tensor_scale)


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
    """float64 values of `BlockCodes`: element values times their block's scale (times the tensor scale)."""
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
    from anynum.quantize import decode

    values = decode(elements, fmt.element)
    scales = decode(codes.scales, fmt.scale)
    if codes.tensor_scale is not None:
        assert fmt.tensor_scale is not None
        scales = scales * decode(codes.tensor_scale, fmt.tensor_scale)
    ndim = elements.dim()
    yb = _to_blocks(fmt, values) * _scales_in(fmt, scales, ndim)[..., None]
    return _from_blocks(fmt, yb, elements.shape)
