"""QPyTorch's ``auto_low``: quantize the outputs of chosen layer types without editing the model.

`lower` attaches, in place, a forward hook that rounds each selected layer's
output (and its gradient) with a facade `Quantizer`; `sequential_lower`
returns a copy in which each selected layer ``m`` becomes
``nn.Sequential(m, quantizer)``, as QPyTorch does (so ``state_dict`` keys gain
a ``.0``). Layers match by exact type, as in QPyTorch. Unlike QPyTorch's,
the results pickle, deepcopy and save with ``torch.save``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from anynum.compat.qtorch.number import Number
from anynum.compat.qtorch.quant.module import Quantizer
from anynum.errors import InputError

__all__ = ["LAYERS_TYPES", "lower", "sequential_lower"]

_CONV = [
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Unfold,
    nn.Fold,
]
_POOL = [
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.MaxUnpool1d,
    nn.MaxUnpool2d,
    nn.MaxUnpool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.FractionalMaxPool2d,
    nn.LPPool1d,
    nn.LPPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
]
_PAD = [
    nn.ReflectionPad1d,
    nn.ReflectionPad2d,
    nn.ReplicationPad1d,
    nn.ReplicationPad2d,
    nn.ZeroPad2d,
    nn.ConstantPad1d,
    nn.ConstantPad2d,
    nn.ConstantPad3d,
]
_ACTIVATION = [
    nn.ELU,
    nn.Hardshrink,
    nn.Hardtanh,
    nn.LeakyReLU,
    nn.LogSigmoid,
    nn.PReLU,
    nn.ReLU,
    nn.ReLU6,
    nn.RReLU,
    nn.SELU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Softshrink,
    nn.Softsign,
    nn.Tanh,
    nn.Tanhshrink,
    nn.Threshold,
    nn.Softmin,
    nn.Softmax,
    nn.Softmax2d,
    nn.LogSoftmax,
]
_NORM = [
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.LayerNorm,
    nn.LocalResponseNorm,
]
_LOSS = [
    nn.L1Loss,
    nn.MSELoss,
    nn.CrossEntropyLoss,
    nn.NLLLoss,
    nn.PoissonNLLLoss,
    nn.KLDivLoss,
    nn.BCELoss,
    nn.BCEWithLogitsLoss,
    nn.MarginRankingLoss,
    nn.HingeEmbeddingLoss,
    nn.MultiLabelMarginLoss,
    nn.SmoothL1Loss,
    nn.SoftMarginLoss,
    nn.MultiLabelSoftMarginLoss,
    nn.MultiMarginLoss,
    nn.TripletMarginLoss,
]

#: The layer families QPyTorch's ``layer_types`` names select.
LAYERS_TYPES: dict[str, list[type[nn.Module]]] = {
    "conv": _CONV,
    "linear": [nn.Linear, nn.Bilinear],
    "pool": _POOL,
    "pad": _PAD,
    "activation": _ACTIVATION,
    "normalization": _NORM,
    "dropout": [nn.Dropout, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout],
    "loss": _LOSS,
}


def _selected(layer_types: Any) -> tuple[type[nn.Module], ...]:
    if isinstance(layer_types, str):
        layer_types = [layer_types]
    types: list[type[nn.Module]] = []
    for name in layer_types:
        if name not in LAYERS_TYPES:
            raise InputError(f"unknown layer type {name!r}; choose from {sorted(LAYERS_TYPES)}.")
        types += LAYERS_TYPES[name]
    return tuple(types)


class _OutputHook:
    """A forward hook rounding a layer's tensor output (a class, so that models stay picklable)."""

    def __init__(self, quant: Quantizer) -> None:
        self.quant = quant

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        return self.quant(output) if isinstance(output, torch.Tensor) else output


def lower(
    model: nn.Module,
    layer_types: Any = (),
    forward_number: Number | None = None,
    backward_number: Number | None = None,
    forward_rounding: str = "stochastic",
    backward_rounding: str = "stochastic",
) -> nn.Module:
    """In place: round the output of every layer of the named types (``["conv", "linear", ...]``).

    Returns the model (QPyTorch returns None).

    >>> from anynum.compat.qtorch import FloatingPoint
    >>> m = lower(nn.Sequential(nn.Linear(2, 2)), ["linear"], FloatingPoint(5, 2), None, "nearest")
    >>> y = m(torch.ones(1, 2)).detach()
    >>> bool((y == y.to(torch.float8_e5m2).float()).all())   # every output is an e5m2 value
    True
    """
    types = _selected(layer_types)
    hook = _OutputHook(Quantizer(forward_number, backward_number, forward_rounding, backward_rounding))
    for module in model.modules():
        if type(module) in types:
            module.register_forward_hook(hook)
    return model


def sequential_lower(
    model: nn.Module,
    layer_types: Any = (),
    forward_number: Number | None = None,
    backward_number: Number | None = None,
    forward_rounding: str = "stochastic",
    backward_rounding: str = "stochastic",
) -> nn.Module:
    """A copy of `model` with each selected layer ``m`` replaced by ``nn.Sequential(m, quantizer)``.

    The original model is not touched.

    >>> from anynum.compat.qtorch import FixedPoint
    >>> low = sequential_lower(nn.Sequential(nn.Linear(2, 2)), ["linear"], FixedPoint(8, 4))
    >>> type(low[0]).__name__, type(low[0][1]).__name__
    ('Sequential', 'Quantizer')
    """
    types = _selected(layer_types)
    quant = Quantizer(forward_number, backward_number, forward_rounding, backward_rounding)

    def rebuild(module: nn.Module) -> nn.Module:
        if type(module) in types and not list(module.children()):
            return nn.Sequential(module, quant)
        for name, child in list(module.named_children()):
            setattr(module, name, rebuild(child))
        return module

    return rebuild(copy.deepcopy(model))
