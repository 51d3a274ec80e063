"""anynum: run PyTorch models and array code in any number format, bit-exact.

Importing anynum imports torch and numpy, never jax, dask or matplotlib; the
heavier subpackages (``mc``, ``nn``, ``optim``, ``experiments``, ``compat``)
load on first attribute access.

>>> import anynum as an
>>> import torch
>>> an.quantize(torch.tensor([0.1, 300.0]), an.E4M3FN).tolist()
[0.1015625, 288.0]
"""

from __future__ import annotations

import importlib
from typing import Any

from anynum.errors import AnynumError
from anynum.formats import (
    BF16,
    E2M1,
    E2M3,
    E3M2,
    E3M4,
    E4M3,
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    E8M0,
    FP16,
    FP32,
    FP64,
    MXFP4_E2M1,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    POSIT8,
    POSIT16,
    POSIT32,
    TF32,
    Block,
    FixedPoint,
    FloatFormat,
    Format,
    FormatInfo,
    IntFormat,
    Posit,
    Table,
    format,
    list_formats,
)
from anynum.quantize import decode, dequantize_int, encode, quantize, quantize_block, quantize_int
from anynum.rounding import Rounding

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("mc", "nn", "ops", "optim", "experiments", "compat", "kernels", "formats")
#: Public names that live above the face, with their modules (loaded on first use).
_LAZY_NAMES = {"Quantizer": "anynum.nn.quantizer", "flip_bits": "anynum.faults"}

__all__ = [
    "BF16",
    "E2M1",
    "E2M3",
    "E3M2",
    "E3M4",
    "E4M3",
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "E5M2FNUZ",
    "E8M0",
    "FP16",
    "FP32",
    "FP64",
    "MXFP4_E2M1",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXINT8",
    "NVFP4",
    "POSIT8",
    "POSIT16",
    "POSIT32",
    "TF32",
    "AnynumError",
    "Block",
    "FixedPoint",
    "FloatFormat",
    "Format",
    "FormatInfo",
    "IntFormat",
    "Posit",
    "Quantizer",
    "Rounding",
    "Table",
    "__version__",
    "decode",
    "dequantize_int",
    "encode",
    "flip_bits",
    "format",
    "list_formats",
    "quantize",
    "quantize_block",
    "quantize_int",
]


def __getattr__(name: str) -> Any:
    # The face names a few things of the upper layers; they load on first use, so that
    # `import anynum` stays light and no lower module is tied to them.
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _LAZY_SUBMODULES:
        value = importlib.import_module(f"anynum.{name}")
    else:
        raise AttributeError(f"module 'anynum' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(_LAZY_SUBMODULES))
