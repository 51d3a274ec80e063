"""Pychop's post-training quantization: weights once, activations by forward hooks, on a copy.

``post_quantization`` rounds every parameter and buffer whose name contains
"weight" or "bias"; ``dynamic_post_quantization`` also rounds the output of
every Conv1d/2d/3d, Linear, ReLU, GELU and SiLU layer at each forward;
``static_post_quantization`` first runs `calibration_data` through the model,
records each such layer's output range, and then clamps outputs to it before
rounding ("minmax", or "percentile" trimming of the range as Pychop);
``mixed_post_quantization`` takes separate weight and activation choppers.
The original model is never changed. Differences from Pychop: the hooks are
instances of module-level classes, so quantized models pickle and deepcopy;
the "kl_divergence" and "mse" calibrations are not provided (an error says so).
A ``Chopi`` chopper fake-quantizes (quantize, then dequantize).
For anynum's own PTQ, with reversible conversion, see `anynum.nn.post_quantize`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from anynum.errors import InputError

__all__ = [
    "dynamic_post_quantization",
    "fuse_conv_bn",
    "mixed_post_quantization",
    "post_quantization",
    "static_post_quantization",
]

#: The layers whose outputs PTQ rounds (Pychop's torch PTQ target layers).
TARGET_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.ReLU, nn.GELU, nn.SiLU)
_METHODS = ("minmax", "percentile")


def _quantize_weights(model: nn.Module, chop: Any, verbose: bool, tag: str) -> None:
    with torch.no_grad():
        state = model.state_dict()
        for key, t in state.items():
            if ("weight" in key or "bias" in key) and t.is_floating_point():
                state[key] = chop(t)
                if verbose:
                    print(f"[{tag}] quantized {key}: {tuple(t.shape)}")
        model.load_state_dict(state)


class _ActivationHook:
    """Forward hook: the layer's output clamped to [low, high] (if given), then rounded by the chopper."""

    def __init__(self, chop: Any, low: float | None = None, high: float | None = None) -> None:
        self.chop, self.low, self.high = chop, low, high

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        if not isinstance(output, torch.Tensor):
            return output
        if self.low is not None:
            output = torch.clamp(output, self.low, self.high)
        return self.chop(output)


class _RangeHook:
    """Forward hook recording the running min and max of a layer's output."""

    def __init__(self) -> None:
        self.low = float("inf")
        self.high = float("-inf")

    def __call__(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.numel():
            lo, hi = torch.aminmax(output.detach())
            self.low, self.high = min(self.low, float(lo)), max(self.high, float(hi))


def _copy(model: nn.Module, eval_mode: bool) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise InputError(f"post-training quantization takes a torch.nn.Module, got {type(model).__name__}.")
    q = copy.deepcopy(model)
    if eval_mode:
        q.eval()
    return q


def fuse_conv_bn(model: nn.Module, verbose: bool = False) -> nn.Module:
    """Fold each BatchNorm that directly follows a Conv in a ``Sequential`` into the conv (eval mode).

    >>> m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
    >>> type(fuse_conv_bn(m)[1]).__name__
    'Identity'
    """
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    for parent in model.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        names = list(parent._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = parent._modules[a], parent._modules[b]
            if isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and isinstance(
                bn, nn.modules.batchnorm._BatchNorm
            ):
                parent._modules[a] = fuse_conv_bn_eval(conv.eval(), bn.eval())
                parent._modules[b] = nn.Identity()
                if verbose:
                    print(f"[Fusion] {a} + {b}")
    return model


def post_quantization(
    model: nn.Module, chop: Any, eval_mode: bool = True, verbose: bool = False
) -> nn.Module:
    """A copy of `model` with its weights and biases rounded by `chop` (weight-only PTQ).

    >>> from anynum.compat.pychop import Chop
    >>> m = nn.Linear(4, 2)
    >>> q = post_quantization(m, Chop(5, 2))
    >>> bool((q.weight == Chop(5, 2)(m.weight.detach())).all())
    True
    """
    q = _copy(model, eval_mode)
    _quantize_weights(q, chop, verbose, "PTQ")
    return q


def dynamic_post_quantization(
    model: nn.Module, chop: Any, eval_mode: bool = True, verbose: bool = False
) -> nn.Module:
    """`post_quantization` plus rounding of every target layer's output at each forward."""
    q = post_quantization(model, chop, eval_mode, verbose)
    _hook_outputs(q, chop, None, verbose)
    return q


def _hook_outputs(
    q: nn.Module, chop: Any, ranges: dict[str, tuple[float, float]] | None, verbose: bool
) -> None:
    for name, module in q.named_modules():
        if not isinstance(module, TARGET_LAYERS):
            continue
        if ranges is None:
            module.register_forward_hook(_ActivationHook(chop))
        elif name in ranges:
            module.register_forward_hook(_ActivationHook(chop, *ranges[name]))
        if verbose:
            print(f"[PTQ] activation hook on {name} ({type(module).__name__})")


def _calibrate(
    q: nn.Module, data: Iterable[Any], method: str, percentile: float
) -> dict[str, tuple[float, float]]:
    if method not in _METHODS:
        raise InputError(
            f"calibration_method={method!r} is not provided by the facade; use one of {_METHODS}."
        )
    hooks = {name: _RangeHook() for name, m in q.named_modules() if isinstance(m, TARGET_LAYERS)}
    handles = [dict(q.named_modules())[n].register_forward_hook(h) for n, h in hooks.items()]
    try:
        with torch.no_grad():
            for batch in data:
                q(batch[0] if isinstance(batch, (tuple, list)) else batch)
    finally:
        for h in handles:
            h.remove()
    ranges = {n: (h.low, h.high) for n, h in hooks.items() if h.low <= h.high}
    if method == "percentile":  # Pychop's rule: trim (100 - p)% of the range, half at each end
        cut = (100 - percentile) / 100 / 2
        ranges = {n: (lo + (hi - lo) * cut, hi - (hi - lo) * cut) for n, (lo, hi) in ranges.items()}
    return ranges


def static_post_quantization(
    model: nn.Module,
    chop: Any,
    calibration_data: Iterable[Any],
    calibration_method: str = "minmax",
    percentile: float = 99.99,
    fuse_bn: bool = True,
    eval_mode: bool = True,
    verbose: bool = False,
    model_apply_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """Weights rounded, then activations clamped to their calibrated range and rounded.

    ``model_apply_fn`` (JAX models in Pychop) is accepted and ignored.

    >>> from anynum.compat.pychop import Chop
    >>> m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> q = static_post_quantization(m, Chop(5, 2), [torch.randn(8, 2)])
    >>> y = q(torch.randn(4, 2)); bool((y == Chop(5, 2)(y)).all())
    True
    """
    q = _copy(model, eval_mode)
    if fuse_bn:
        fuse_conv_bn(q, verbose)
    _quantize_weights(q, chop, verbose, "Static PTQ")
    _hook_outputs(q, chop, _calibrate(q, calibration_data, calibration_method, percentile), verbose)
    return q


def mixed_post_quantization(
    model: nn.Module,
    weight_chop: Any,
    activation_chop: Any,
    calibration_data: Iterable[Any] | None = None,
    calibration_method: str = "minmax",
    percentile: float = 99.99,
    dynamic: bool = True,
    eval_mode: bool = True,
    verbose: bool = False,
    model_apply_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """Separate weight and activation choppers (W8A8, W4A16, ...); either may be None (full precision).

    ``dynamic=False`` calibrates activation ranges on `calibration_data` first.
    """
    q = _copy(model, eval_mode)
    if weight_chop is not None:
        _quantize_weights(q, weight_chop, verbose, "Mixed PTQ")
    if activation_chop is None:
        return q
    if dynamic:
        _hook_outputs(q, activation_chop, None, verbose)
        return q
    if calibration_data is None:
        raise InputError("mixed_post_quantization(dynamic=False) needs calibration_data.")
    _hook_outputs(
        q, activation_chop, _calibrate(q, calibration_data, calibration_method, percentile), verbose
    )
    return q
