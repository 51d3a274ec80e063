"""`encode` and `decode`: a format's real bit codes, for every family (Block codes included)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.formats.block import Block, BlockCodes
from anynum.formats.registry import format as lookup_format
from anynum.kernels.arrays import is_dask_array, is_jax_array
from anynum.kernels.block import decode_blocks
from anynum.kernels.route import decode_codes, encode_values
from anynum.quantize.block import quantize_block
from anynum.quantize.core import quantize
from anynum.rounding import RoundingLike

__all__ = ["decode", "encode"]


def _codes_of(fmt: Format, values: torch.Tensor) -> torch.Tensor:
    """int64 codes of values on `fmt`'s grid; `FormatError` for NaN where the format has no NaN code."""
    return fmt.check_codes(encode_values(fmt, values))


def encode(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", **kwargs: Any) -> Any:
    """Round `x` onto `fmt` and return the integer codes (int64) of its real bit layout.

    Keyword arguments are those of `anynum.quantize` (and, for Block formats, of
    `anynum.quantize_block`). NaN maps to the format's NaN code; a format without
    one raises `FormatError`. Block formats return `BlockCodes` (element codes, the
    scale codes of every block, and the per-tensor scale code); a NaN block has the
    scale format's NaN code and, where the element has none, element codes 0.
    Codes of 64-bit formats (FP64) are their bit patterns held in int64: negative
    where the top (sign) bit is set, as ``x.view(torch.int64)`` gives them.

    >>> import anynum as an, torch
    >>> an.encode(torch.tensor([1.0, -2.0, 448.0]), an.E4M3FN).tolist()
    [56, 192, 126]
    >>> c = an.encode(torch.tensor([1.0, -6.0, 0.5]), an.MXFP4_E2M1)
    >>> c.elements.tolist(), c.scales.tolist()
    ([2, 15, 1], [127])
    """
    fmt = lookup_format(fmt)
    if is_jax_array(x) or is_dask_array(x):
        raise InputError(
            "encode takes torch tensors and NumPy arrays; convert first "
            "(np.asarray(x), torch.from_dlpack(x) or x.compute())."
        )
    if isinstance(fmt, Block):
        q = quantize_block(x, fmt, rounding, **kwargs)
        ts = None
        if q.tensor_scale is not None:
            assert fmt.tensor_scale is not None
            ts = _codes_of(fmt.tensor_scale, q.tensor_scale)
        return BlockCodes(_codes_of(fmt.element, q.elements), _codes_of(fmt.scale, q.scales), ts)
    y = quantize(x, fmt, rounding, **kwargs)
    t = y.detach() if isinstance(y, torch.Tensor) else torch.from_numpy(np.asarray(y))
    codes = _codes_of(fmt, t)
    if isinstance(y, torch.Tensor):
        return codes
    return codes.numpy() if isinstance(y, np.ndarray) else int(codes.item())


def _valid_codes(codes: Any, fmt: Format) -> torch.Tensor:
    """`codes` as an int64 tensor, checked to be integers in [0, 2**fmt.bits)."""
    if isinstance(codes, torch.Tensor):
        t = codes
    else:
        arr = np.asarray(codes)
        if arr.dtype.kind not in "iu":
            raise InputError(f"decode needs integer codes, got dtype {arr.dtype}.")
        t = torch.from_numpy(arr.astype(np.int64))
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise InputError(f"decode needs integer codes, got dtype {t.dtype}.")
    t = t.to(torch.int64)
    if fmt.bits >= 64:  # every int64 is a 64-bit pattern (see `encode`)
        return t
    if t.numel() and not 0 <= int((mm := torch.aminmax(t)).min) <= int(mm.max) < (1 << fmt.bits):
        raise InputError(f"codes of {fmt.display_name()} lie in [0, 2**{fmt.bits}); got values outside.")
    return t


def decode(codes: Any, fmt: Format | str) -> Any:
    """float64 values of integer `codes` (torch, NumPy or int); NaN codes give NaN.

    Block formats take the `BlockCodes` that `encode` returns; a NaN scale code gives a NaN block.

    >>> import anynum as an, torch
    >>> an.decode(torch.tensor([56, 192, 127]), an.E4M3FN).tolist()
    [1.0, -2.0, nan]
    >>> an.decode(an.encode(torch.tensor([1.0, -6.0, 0.5]), an.MXFP4_E2M1), an.MXFP4_E2M1).tolist()
    [1.0, -6.0, 0.5]
    """
    fmt = lookup_format(fmt)
    if isinstance(fmt, Block):
        if not isinstance(codes, BlockCodes):
            raise InputError(
                f"{fmt.display_name()} codes are element codes plus scale codes: pass the BlockCodes "
                f"that an.encode(x, fmt) returns, got {type(codes).__name__}."
            )
        ts = codes.tensor_scale
        if ts is not None and fmt.tensor_scale is not None:
            ts = _valid_codes(ts, fmt.tensor_scale)
        elements = _valid_codes(codes.elements, fmt.element)
        return decode_blocks(fmt, BlockCodes(elements, _valid_codes(codes.scales, fmt.scale), ts))
    values = decode_codes(fmt, _valid_codes(codes, fmt))
    if isinstance(codes, torch.Tensor):
        return values
    return float(values.item()) if np.isscalar(codes) else values.numpy()
