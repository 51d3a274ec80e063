"""The argument checks every entry point shares: tensors, rand_bits, out=, and representability.

One implementation each, used by `quantize`, `quantize_block`, `Rounder` and the
layers above (emulation, compat facades); each raises an `AnynumError` subclass
that names what was expected, what was received and the fix.

>>> import torch, anynum as an
>>> try:
...     check_tensor(torch.ones(2, dtype=torch.int64))
... except an.AnynumError as e:
...     print(str(e)[:60])
quantize needs a float16, bfloat16, float32 or float64 tenso
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from anynum.errors import InputError
from anynum.kernels.representable import check_overflow_fits, check_representable
from anynum.rounding import Rounding

__all__ = [
    "NUMPY_FLOATS",
    "TORCH_FLOATS",
    "check_out",
    "check_overflow_fits",
    "check_rand_bits",
    "check_representable",
    "check_tensor",
]

TORCH_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def check_rand_bits(rand_bits: Any, mode: Rounding) -> None:
    """`rand_bits` is None, or an int in 1..52 given with rounding="stochastic"."""
    if rand_bits is None:
        return
    if isinstance(rand_bits, bool) or not isinstance(rand_bits, (int, np.integer)):
        raise InputError(f"rand_bits must be an integer in 1..52 or None, got {rand_bits!r}.")
    if not 1 <= rand_bits <= 52:
        raise InputError(
            f"rand_bits must be in 1..52 (random bits added below the last kept bit), got {rand_bits}."
        )
    if mode is not Rounding.STOCHASTIC:
        raise InputError(
            f"rand_bits applies to rounding='stochastic' only, not {mode.name}; drop rand_bits."
        )


def check_tensor(x: torch.Tensor, what: str = "quantize") -> None:
    """`x` is a float16/bfloat16/float32/float64 tensor (`what` names the caller in the message)."""
    if x.dtype not in TORCH_FLOATS:
        kind = "complex" if x.is_complex() else "integer/bool" if not x.is_floating_point() else "unsupported"
        article = "an" if kind[0] in "aeiou" else "a"
        raise InputError(
            f"{what} needs a float16, bfloat16, float32 or float64 tensor, got {article} {kind} tensor of "
            f"dtype {x.dtype}; convert it first, e.g. x.float()."
        )


def check_out(out: Any, x: torch.Tensor) -> None:
    """`out` (when given) is a tensor of x's shape, dtype and device."""
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != x.shape
        or out.dtype != x.dtype
        or out.device != x.device
    ):
        raise InputError(
            "out= must be a tensor of the input's shape, dtype and device; got "
            f"{getattr(out, 'shape', None)}/{getattr(out, 'dtype', None)}/{getattr(out, 'device', None)} "
            f"for input {tuple(x.shape)}/{x.dtype}/{x.device}."
        )
