"""Pychop's quantized layers (``QuantizedLinear(..., chop=ch)``, ``IQuantized*``) and STE choppers.

Each layer is the torch layer with a ``chop`` attribute: in every forward its
parameters are seen rounded by the chopper, activation layers (ReLU, Sigmoid,
Softmax, Dropout, ...) also round their input, and the output is rounded
(the first output of recurrent and attention layers), as in Pychop.
Differences from Pychop: parameters are rounded for the forward pass only,
never re-wrapped, so the optimizer built before training updates the real
parameters (Pychop's LSTM, GRU, attention and norm layers replace them with
new Parameter objects on every forward, and training updates nothing); every
chopper passes gradients straight through (Pychop's plain ``Chop`` gives zero
gradients); ``state_dict`` keys are the torch layer's. ``chop=None`` is the
plain torch layer. The chopper may also be passed as the last positional argument.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anynum.compat.pychop.chop import Chop
from anynum.compat.pychop.fixed import Chopf
from anynum.compat.pychop.integer import Chopi

__all__ = ["CHOPPERS", "ChopSTE", "ChopfSTE", "ChopiSTE"]


class ChopSTE(Chop):
    """`Chop` for quantization-aware training (every facade chopper passes gradients straight through).

    >>> x = torch.tensor([0.3], requires_grad=True)
    >>> ChopSTE(5, 2)(x).sum().backward(); x.grad.tolist()
    [1.0]
    """


class ChopfSTE(Chopf):
    """`Chopf` for quantization-aware training (straight-through gradients)."""


class ChopiSTE(Chopi):
    """`Chopi` for quantization-aware training: calling it fake-quantizes with a straight-through gradient."""


#: The facade's chopper types (a trailing positional argument of one of these is the ``chop``).
CHOPPERS = (Chop, Chopf, Chopi)


def _split_chop(args: tuple[Any, ...], chop: Any) -> tuple[tuple[Any, ...], Any]:
    if chop is None and args and isinstance(args[-1], CHOPPERS):
        return args[:-1], args[-1]
    return args, chop


class _RoundedParameters:
    """Context: the module's floating parameters seen through the chopper, then restored.

    The Parameter objects are put back untouched, so optimizers keep updating them;
    gradients reach them through the chopper's straight-through estimator.
    """

    def __init__(self, module: nn.Module, chop: Any) -> None:
        self.module, self.chop = module, chop
        self.saved: list[tuple[nn.Module, str, Any]] = []

    def __enter__(self) -> None:
        try:
            for owner in self.module.modules():
                for name, p in list(owner._parameters.items()):
                    if p is not None and p.is_floating_point():
                        rounded = self.chop(p)
                        self.saved.append((owner, name, p))
                        owner._parameters[name] = rounded  # a plain tensor for this forward only
        except BaseException:
            self.__exit__()  # a chopper that fails leaves the Parameters in place
            raise
        self._refresh()

    def __exit__(self, *exc: Any) -> None:
        for owner, name, p in self.saved:
            owner._parameters[name] = p
        self._refresh()

    def _refresh(self) -> None:
        if isinstance(self.module, nn.RNNBase):  # recurrent layers cache their weight list
            self.module._init_flat_weights()


def _round_output(out: Any, chop: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return chop(out)
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return (chop(out[0]), *out[1:])
    return out


def _layer(name: str, base: type[nn.Module], round_input: bool) -> type[nn.Module]:
    def __init__(self: nn.Module, *args: Any, chop: Any = None, **kwargs: Any) -> None:
        args, chop = _split_chop(args, chop)
        base.__init__(self, *args, **kwargs)
        self.chop = chop

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        chop: Any = self.chop
        if chop is None:
            return base.forward(self, *args, **kwargs)
        if round_input and args and isinstance(args[0], torch.Tensor):
            args = (chop(args[0]), *args[1:])
        with _RoundedParameters(self, chop):
            out = base.forward(self, *args, **kwargs)
        return _round_output(out, chop)

    kind = "input, parameters and output" if round_input else "parameters and output"
    doc = (
        f"`torch.nn.{base.__name__}` whose {kind} are rounded by ``chop`` (Pychop ``{name}``); "
        "same arguments plus ``chop=``. NaN/inf follow the chopper."
    )
    return type(
        name, (base,), {"__init__": __init__, "forward": forward, "__doc__": doc, "__module__": __name__}
    )


_PLAIN = (
    "Linear",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "RNN",
    "LSTM",
    "GRU",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "LayerNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "GroupNorm",
    "MultiheadAttention",
    "Embedding",
)
_ACTIVATIONS = ("ReLU", "Sigmoid", "Tanh", "LeakyReLU", "Softmax", "GELU", "ELU", "PReLU", "SiLU", "Dropout")

for _prefix in ("Quantized", "IQuantized"):
    for _base in _PLAIN + _ACTIVATIONS:
        _cls = _layer(_prefix + _base, getattr(nn, _base), _base in _ACTIVATIONS)
        globals()[_cls.__name__] = _cls
        __all__.append(_cls.__name__)
    globals()[_prefix + "Attention"] = globals()[_prefix + "MultiheadAttention"]
    globals()[_prefix + "AvgPool"] = globals()[_prefix + "AvgPool2d"]
    __all__ += [_prefix + "Attention", _prefix + "AvgPool"]


def __getattr__(name: str) -> Any:  # for type checkers: the classes above are made in a loop
    raise AttributeError(f"module 'anynum.compat.pychop.layers' has no attribute {name!r}")
