"""``qtorch.quant`` / ``qtorch_plus.quant`` on anynum: quantization functions and the Quantizer module.

>>> import torch
>>> from anynum.compat.qtorch.quant import float_quantize
>>> float_quantize(torch.tensor([3.14159]), 5, 2, "nearest").tolist()
[3.0]
"""

from anynum.compat.qtorch.quant.functions import block_quantize, fixed_point_quantize, float_quantize
from anynum.compat.qtorch.quant.module import Quantizer, quantize_number, quantizer
from anynum.compat.qtorch.quant.plus import (
    act_format_quantize,
    configurable_table_quantize,
    configurable_table_quantize_geomean,
    configurable_table_quantize_rounding_hint,
    new_format_quantize,
    posit_quantize,
    posit_sigmoid,
    posit_tanh,
    posit_tanh_enhanced,
)

__all__ = [
    "Quantizer",
    "act_format_quantize",
    "block_quantize",
    "configurable_table_quantize",
    "configurable_table_quantize_geomean",
    "configurable_table_quantize_rounding_hint",
    "fixed_point_quantize",
    "float_quantize",
    "new_format_quantize",
    "posit_quantize",
    "posit_sigmoid",
    "posit_tanh",
    "posit_tanh_enhanced",
    "quantize_number",
    "quantizer",
]
