"""What values exist: one module per family, plus the name registry.

>>> import anynum as an
>>> an.formats.p3109(8, 3).max
49152.0
"""

from anynum.formats.base import Format, FormatInfo
from anynum.formats.block import (
    MXFP4_E2M1,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    Block,
)
from anynum.formats.fixed import FixedPoint, IntFormat, UniformFormat
from anynum.formats.floating import (
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
    Q43,
    Q52,
    TF32,
    FloatFormat,
    p3109,
)
from anynum.formats.posit import POSIT8, POSIT16, POSIT32, Posit
from anynum.formats.registry import format, list_formats, register_family, register_name
from anynum.formats.table import Table

q43 = Q43
q52 = Q52

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
    "Q43",
    "Q52",
    "TF32",
    "Block",
    "FixedPoint",
    "FloatFormat",
    "Format",
    "FormatInfo",
    "IntFormat",
    "Posit",
    "Table",
    "UniformFormat",
    "format",
    "list_formats",
    "p3109",
    "q43",
    "q52",
    "register_family",
    "register_name",
]
