"""Packed storage of format codes: what an `EmulatedTensor` holds, and how formats are recorded by name.

==================  ==========================================================
element bits        storage
==================  ==========================================================
1 .. 4              uint8, two codes per byte (low nibble first), flat
5 .. 8              uint8, one code per element, the tensor's shape
9 .. 16             int16 (the code's bit pattern), the tensor's shape
17 .. 32            int32 (the code's bit pattern), the tensor's shape
==================  ==========================================================

Block formats store their element codes the same way plus one scale code per
block (uint8 for E8M0/UE4M3 scales) and, for NVFP4, the per-tensor FP32 scale
code (int32). `storage_bytes` counts everything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.block import Block, BlockCodes
from anynum.quantize import decode, encode

__all__ = ["Packed", "pack", "storage_dtype", "unpack_values"]


def storage_dtype(bits: int) -> torch.dtype:
    """The container of one code of `bits` bits (uint8 also for 4-bit pairs)."""
    if bits <= 8:
        return torch.uint8
    if bits <= 16:
        return torch.int16
    if bits <= 32:
        return torch.int32
    raise AnynumError(
        f"EmulatedTensor stores codes of at most 32 bits, received a {bits}-bit format. "
        "Fix: keep such values in a float64 tensor (an.emulate(fmt) computes in them without packing)."
    )


def _pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    dtype = storage_dtype(bits)
    if bits <= 4:
        flat = codes.reshape(-1).to(torch.uint8)
        if flat.numel() % 2:
            flat = torch.cat([flat, flat.new_zeros(1)])
        return flat[0::2] | (flat[1::2] << 4)
    if dtype == torch.uint8:
        return codes.to(torch.uint8)
    # int16/int32 hold the bit pattern: codes >= 2**(w-1) wrap to negatives
    width = 16 if dtype == torch.int16 else 32
    return torch.where(codes >= 1 << (width - 1), codes - (1 << width), codes).to(dtype)


def _unpack_codes(stored: torch.Tensor, bits: int, shape: torch.Size) -> torch.Tensor:
    if bits <= 4:
        flat = torch.stack([stored & 0xF, stored >> 4], dim=-1).reshape(-1)
        return flat[: math.prod(shape)].reshape(shape).to(torch.int64)
    c = stored.to(torch.int64)
    if stored.dtype in (torch.int16, torch.int32):
        c = c & ((1 << (16 if stored.dtype == torch.int16 else 32)) - 1)
    return c


@dataclass
class Packed:
    """A tensor's codes as stored: element codes, and for Block formats the scales."""

    codes: torch.Tensor
    scales: torch.Tensor | None
    tensor_scale: torch.Tensor | None

    def nbytes(self) -> int:
        """Bytes held: element codes, block scales and the per-tensor scale."""
        total = self.codes.numel() * self.codes.element_size()
        for t in (self.scales, self.tensor_scale):
            if t is not None:
                total += t.numel() * t.element_size()
        return total


def pack(values: torch.Tensor, fmt: Format) -> Packed:
    """Codes of `values` (already on `fmt`'s grid; rounding to nearest is the identity there)."""
    if isinstance(fmt, Block):
        c = fmt.encode(values.detach())
        ts = None
        if c.tensor_scale is not None:
            assert fmt.tensor_scale is not None
            ts = _pack_codes(c.tensor_scale, fmt.tensor_scale.bits)
        return Packed(_pack_codes(c.elements, fmt.element.bits), _pack_codes(c.scales, fmt.scale.bits), ts)
    storage_dtype(fmt.bits)
    return Packed(_pack_codes(encode(values.detach(), fmt), fmt.bits), None, None)


def unpack_values(p: Packed, fmt: Format, shape: torch.Size) -> torch.Tensor:
    """float64 values of packed codes of a tensor of `shape`."""
    if isinstance(fmt, Block):
        elements = _unpack_codes(p.codes, fmt.element.bits, shape)
        assert p.scales is not None
        scales = _unpack_codes(p.scales, fmt.scale.bits, torch.Size(fmt.scale_shape(shape)))
        ts = None
        if p.tensor_scale is not None:
            assert fmt.tensor_scale is not None
            ts = _unpack_codes(p.tensor_scale, fmt.tensor_scale.bits, torch.Size([]))
        return fmt.decode(BlockCodes(elements, scales, ts)).reshape(shape)
    codes = _unpack_codes(p.codes, fmt.bits, shape)
    return decode(codes, fmt).reshape(shape)  # type: ignore[no-any-return]
