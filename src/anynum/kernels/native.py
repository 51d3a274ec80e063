"""The shortcut where a native torch cast *is* the rounding: float32 -> (fp16, bf16, float8) -> float32.

For these (format, overflow) pairs, round-to-nearest-even on CPU float32
inputs, torch's cast round trip equals the reference kernel bit for bit
(tests/kernels/test_native_casts.py checks every float16/bfloat16 pattern,
random values and all special values). It is restricted to float32 CPU
inputs: torch casts float64 through float32 (double rounding), and CUDA
float8 casts treat overflow differently.
"""

from __future__ import annotations

import functools

import torch

from anynum.formats import floating as fl
from anynum.formats.base import Format
from anynum.rounding import Rounding

__all__ = ["native_cast_dtype"]


@functools.cache
def _table() -> dict[tuple[Format, str], torch.dtype]:
    table: dict[tuple[Format, str], torch.dtype] = {
        (fl.FP16, "inf"): torch.float16,
        (fl.BF16, "inf"): torch.bfloat16,
    }
    for name, fmt, overflow in (
        ("float8_e4m3fn", fl.E4M3FN, "saturate"),
        ("float8_e5m2", fl.E5M2, "inf"),
        ("float8_e4m3fnuz", fl.E4M3FNUZ, "nan"),
        ("float8_e5m2fnuz", fl.E5M2FNUZ, "nan"),
    ):
        dtype = getattr(torch, name, None)
        if dtype is not None:
            table[(fmt, overflow)] = dtype
    return table


def native_cast_dtype(fmt: Format, mode: Rounding, overflow: str, x: torch.Tensor) -> torch.dtype | None:
    """The torch dtype whose cast round trip of `x` equals rounding onto `fmt`, or None.

    >>> import anynum as an
    >>> native_cast_dtype(an.BF16, Rounding.NEAREST_EVEN, "inf", torch.ones(2))
    torch.bfloat16
    """
    if mode is not Rounding.NEAREST_EVEN or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    return _table().get((fmt, overflow))
