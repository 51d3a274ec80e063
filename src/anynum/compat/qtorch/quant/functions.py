"""QPyTorch's quantization functions on anynum's kernels: float, fixed point, block floating point.

Same names, signatures and defaults as ``qtorch.quant``; results are
anynum's correct roundings (see docs/compat.md for every difference):
ties to even, IEEE overflow and specials for floats, one rounding of
subnormals, signed zeros kept. Stochastic rounding draws one seed per call from
torch's default generator, so ``torch.manual_seed`` makes it reproducible.
Inputs may be float16/bfloat16/float32/float64 torch tensors (QPyTorch takes
float32 only); the result has the input's dtype and passes gradients straight
through.
"""

from __future__ import annotations

import torch

import anynum as an
from anynum.compat.qtorch.number import BlockFloatingPoint, FixedPoint, FloatingPoint
from anynum.compat.qtorch.quant.common import PRECISION, as_tensor, draw_seed
from anynum.compat.straight import straight_through
from anynum.errors import InputError

__all__ = ["block_quantize", "fixed_point_quantize", "float_quantize"]


def float_quantize(x: torch.Tensor, exp: int, man: int, rounding: str = "stochastic") -> torch.Tensor:
    """Round `x` to the float with `exp` exponent and `man` fraction bits (IEEE-like).

    Nearest is ties-to-even; overflow gives ±inf under "nearest" and follows
    anynum's rules for other modes; NaN stays NaN; subnormals are rounded once;
    -0 stays -0. ``man=23, exp=8`` is the identity on float32.

    >>> x = torch.tensor([1.0 + 2**-11, 70000.0, -1e-9, float("nan")])
    >>> float_quantize(x, 5, 10, "nearest").tolist()
    [1.0, inf, -0.0, nan]
    """
    x = as_tensor(x, "float_quantize")
    return an.quantize(x, FloatingPoint(exp, man).format, rounding, seed=draw_seed(rounding))


def fixed_point_quantize(
    x: torch.Tensor,
    wl: int,
    fl: int,
    clamp: bool = True,
    symmetric: bool = False,
    rounding: str = "stochastic",
) -> torch.Tensor:
    """Round `x` to fixed point with word length `wl` (sign bit included) and `fl` fraction bits.

    ``clamp=True`` saturates to ``[-2**(wl-fl-1), 2**(wl-fl-1) - 2**-fl]`` (±inf
    too); ``symmetric=True`` also drops the most negative value; ``clamp=False``
    rounds to multiples of ``2**-fl`` without a range (±inf stays ±inf). NaN stays
    NaN and -0 stays -0.

    >>> x = torch.tensor([0.3, 100.0, -100.0, 2.5 / 16])
    >>> fixed_point_quantize(x, 8, 4, rounding="nearest").tolist()
    [0.3125, 7.9375, -8.0, 0.125]
    >>> fixed_point_quantize(x, 8, 4, symmetric=True, rounding="nearest")[2].item()
    -7.9375
    """
    x = as_tensor(x, "fixed_point_quantize")
    number = FixedPoint(wl, fl, clamp, symmetric)
    seed = draw_seed(rounding)
    with torch.no_grad():
        xd = x.detach()
        if clamp:
            fmt = number.format
            y = an.quantize(xd, fmt, rounding, seed=seed)
            if symmetric:
                y = torch.clamp(y, min=-fmt.max)
        else:
            # No range: round magnitudes on an unsigned grid wide enough for every value that is
            # not already a multiple of 2**-fl (|x| < 2**(p - fl) in a p-bit significand); larger
            # magnitudes and ±inf pass unchanged. Nearest and stochastic rounding are
            # sign-symmetric in anynum, so restoring the sign gives the rounding of x itself.
            p = PRECISION.get(x.dtype, 53)
            a = xd.abs()
            q = an.quantize(a, an.FixedPoint(p - fl, fl, signed=False), rounding, seed=seed)
            y = torch.where(a < 2.0 ** (p - fl), q, a)
        # Two's complement has one zero; the float carrying it keeps x's sign (QPyTorch does too).
        y = torch.copysign(y, xd)
    return straight_through(x, y)


def block_quantize(x: torch.Tensor, wl: int, dim: int = -1, rounding: str = "stochastic") -> torch.Tensor:
    """Block floating point: `wl`-bit elements sharing ``floor(log2 max|x|)`` per block.

    ``dim=-1`` is one block for the whole tensor; ``dim=d`` one block per index
    along dimension d. The step is ``2**(e + 2 - wl)``; ties go to even; a block
    holding NaN or ±inf becomes NaN; zeros keep their sign.

    >>> block_quantize(torch.tensor([1.0, 0.3, -0.01]), 4, rounding="nearest").tolist()
    [1.0, 0.25, -0.0]
    >>> block_quantize(torch.tensor([[1.0, 0.3], [0.01, 0.003]]), 4, dim=0, rounding="nearest").tolist()
    [[1.0, 0.25], [0.009765625, 0.00390625]]
    """
    x = as_tensor(x, "block_quantize")
    number = BlockFloatingPoint(wl, dim)
    seed = draw_seed(rounding)
    if not dim < max(x.dim(), 1):
        raise InputError(f"block_quantize dim={dim} is out of range for a {x.dim()}-d tensor.")
    with torch.no_grad():
        xd = x.detach()
        if dim == -1:
            y = an.quantize(xd, number.format, rounding, seed=seed)
        else:
            # One exponent per index along `dim`: that index's slice, flattened, is one row of blocks.
            moved = xd.movedim(dim, 0) if xd.dim() else xd.reshape(1)
            rows = moved.reshape(moved.shape[0], -1)
            y = an.quantize(rows, number.format, rounding, seed=seed).reshape(moved.shape)
            y = y.movedim(0, dim) if xd.dim() else y.reshape(())
        y = torch.copysign(y, xd)  # zeros keep x's sign (QPyTorch's block loses it)
    return straight_through(x, y)
