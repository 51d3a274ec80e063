"""Scale/zero-point integer quantization: `quantize_int`, `dequantize_int` (Pychop Chopi, Qtorch ints)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.formats.fixed import IntFormat
from anynum.formats.registry import format as lookup_format
from anynum.quantize.checks import check_tensor
from anynum.rounding import RoundingLike, make_random_source, parse_rounding, round_scaled

__all__ = ["IntQuantized", "dequantize_int", "quantize_int"]


class IntQuantized(NamedTuple):
    """Integer codes with the scale and zero point that map them back: x ≈ (codes - zero_point) * scale."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor
    fmt: IntFormat
    axis: int | None


def quantize_int(
    x: torch.Tensor,
    fmt: IntFormat | str | int = 8,
    *,
    symmetric: bool = True,
    axis: int | None = None,
    rounding: RoundingLike = "nearest",
    generator: Any = None,
    seed: int | None = None,
) -> IntQuantized:
    """Scale/zero-point integer quantization, per tensor (`axis=None`) or per channel along `axis`.

    Symmetric: ``scale = amax / qmax`` and codes in [-qmax, qmax] (the code -2**(b-1)
    is unused so that the grid is sign-symmetric), zero point 0. Asymmetric: the
    range [min(x, 0), max(x, 0)] maps onto [qmin, qmax] with an integer zero point
    ``qmin - round(min / scale)``, so 0.0 is exactly representable. ``x / scale``
    is computed in float64 before rounding. An all-zero slice gets scale 1.
    NaN or inf in `x` raises (no scale can represent it). Differences from Pychop
    Chopi: Chopi's asymmetric range is [0, 2**(b-1)-1] and its zero point is not
    an integer; ours uses the whole code range and an integer zero point.

    >>> import torch, anynum as an
    >>> q = an.quantize_int(torch.tensor([-1.0, 0.5, 2.0]), 8)
    >>> q.codes.tolist(), round(float(q.scale) * 127, 6)
    ([-64, 32, 127], 2.0)
    >>> [round(v, 4) for v in an.dequantize_int(q).tolist()]
    [-1.0079, 0.5039, 2.0]
    """
    int_fmt: Format | int = fmt if not isinstance(fmt, str) else lookup_format(fmt)
    if isinstance(int_fmt, int) and not isinstance(int_fmt, bool):
        int_fmt = IntFormat(int_fmt)
    if not isinstance(int_fmt, IntFormat):
        raise InputError(f"quantize_int needs an IntFormat (or bit width), got {fmt!r}.")
    fmt = int_fmt
    if not isinstance(x, torch.Tensor):
        raise InputError(f"quantize_int needs a torch tensor, got {type(x).__name__}.")
    check_tensor(x, "quantize_int")
    mode = parse_rounding(rounding)
    if not isinstance(symmetric, bool):
        raise InputError(f"quantize_int(symmetric=...) must be True or False, got {symmetric!r}.")
    if symmetric and not fmt.signed:
        raise InputError("symmetric quantization needs a signed IntFormat; use symmetric=False for unsigned.")
    xd = x.detach().to(torch.float64)
    if not bool(torch.isfinite(xd).all()):
        raise InputError("quantize_int needs finite inputs; the tensor holds NaN or inf.")
    if axis is None:
        reduce_dims: list[int] = list(range(xd.dim()))
    else:
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise InputError(f"quantize_int(axis=...) must be an int or None, got {axis!r}.")
        if xd.dim() == 0:
            raise InputError("quantize_int(axis=...) needs a tensor with at least one dimension; "
                             "a 0-d tensor has no channels (use axis=None).")
        if not -xd.dim() <= axis < xd.dim():
            raise InputError(f"axis {axis} is out of range for a {xd.dim()}-d tensor.")
        axis = axis % xd.dim()
        reduce_dims = [d for d in range(xd.dim()) if d != axis]

    def _reduce(t: torch.Tensor, op: str) -> torch.Tensor:
        if t.numel() == 0:
            shape = [1 if d in reduce_dims else n for d, n in enumerate(t.shape)]
            return torch.zeros(shape, dtype=t.dtype)
        if not reduce_dims:
            return t
        if op == "amax":
            return t.amax(dim=reduce_dims, keepdim=True)
        return t.amin(dim=reduce_dims, keepdim=True)

    qmin, qmax = float(fmt.code_min), float(fmt.code_max)
    if symmetric:
        qmin = -qmax
        amax = _reduce(xd.abs(), "amax")
        scale = amax / qmax
        zero_point = torch.zeros_like(scale)
    else:
        hi = torch.clamp(_reduce(xd, "amax"), min=0.0)
        lo = torch.clamp(_reduce(xd, "amin"), max=0.0)
        scale = (hi - lo) / (qmax - qmin)
        zero_point = qmin - torch.round(lo / torch.where(scale > 0, scale, torch.ones_like(scale)))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    rng = make_random_source(generator, seed, x.device) if mode.is_stochastic else None
    codes = round_scaled(xd / scale, mode, rng) + zero_point
    codes = torch.clamp(codes, qmin, qmax).to(torch.int64)
    return IntQuantized(codes, scale.to(x.dtype), zero_point.to(torch.int64), fmt, axis)


def dequantize_int(q: IntQuantized, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values ``(codes - zero_point) * scale`` of an `IntQuantized` (in `dtype`, default the scale's).

    >>> import torch, anynum as an
    >>> [round(v, 4) for v in an.dequantize_int(an.quantize_int(torch.tensor([-1.0, 2.0]), 8)).tolist()]
    [-1.0079, 2.0]
    """
    if not isinstance(q, IntQuantized):
        raise InputError(
            f"dequantize_int needs the IntQuantized that quantize_int returns, got {type(q).__name__}."
        )
    dtype = dtype or q.scale.dtype
    return ((q.codes - q.zero_point).to(torch.float64) * q.scale.to(torch.float64)).to(dtype)
