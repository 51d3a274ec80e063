"""Quantization-aware training and post-training quantization for any PyTorch model.

`Quantizer` rounds activations forward and errors backward; `Policy` says which
numbers of which layers use which format; `convert`/`restore` attach and
remove quantization in place; `post_quantize` is the one-call PTQ; the layer
classes are drop-in quantized torch layers; `audit` finds high-precision leaks;
`diagnose` says per layer and number category why a format fails (`observe` is its
probe, usable in your own loop); `search` picks a format per layer under an accuracy
tolerance; `FaultInjector` flips bits in weights, activations or gradients.
"""

from anynum.nn.audit import Leak, audit
from anynum.nn.convert import convert, converted_layers, post_quantize, restore, select_layers
from anynum.nn.diagnose import diagnose
from anynum.nn.faults import FaultInjector
from anynum.nn.layers import (
    GRU,
    LSTM,
    RNN,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Conv1d,
    Conv2d,
    Conv3d,
    LayerNorm,
    Linear,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MultiheadAttention,
)
from anynum.nn.observe import Observation, observe
from anynum.nn.policy import DEFAULT_LAYERS, Policy
from anynum.nn.quantizer import Quantizer, Rounder, quantizer
from anynum.nn.report import DiagnoseReport, Suggestion
from anynum.nn.search import SearchResult, search

__all__ = [
    "DEFAULT_LAYERS",
    "GRU",
    "LSTM",
    "RNN",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "DiagnoseReport",
    "FaultInjector",
    "LayerNorm",
    "Leak",
    "Linear",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MultiheadAttention",
    "Observation",
    "Policy",
    "Quantizer",
    "Rounder",
    "SearchResult",
    "Suggestion",
    "audit",
    "convert",
    "converted_layers",
    "diagnose",
    "observe",
    "post_quantize",
    "quantizer",
    "restore",
    "search",
    "select_layers",
]
