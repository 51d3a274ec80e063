"""Attach quantization to one module without changing its class definition, and detach it again.

Weights and biases go through `torch.nn.utils.parametrize` (the stored
Parameter object stays the same, so optimizers built earlier keep working and
`state_dict` round-trips); activations and errors through forward
(pre-)hooks that call the `Quantizer` autograd function; buffers through a
forward hook. Every hook is an instance of a module-level class, so converted
models deep-copy and their hooks can be found and removed by type.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module_hooks
from torch.nn.utils import parametrize

from anynum.nn.policy import ResolvedPolicy
from anynum.nn.quantizer import Rounder, apply_pair, round_weight
from anynum.nn.streams import register_stream_hooks

__all__ = ["LayerState", "attach", "detach", "layer_state", "layer_streams"]

_STATE_ATTR = "_anynum_state"


class LayerState:
    """What `attach` did to a module: its resolved policy, the parameters it parametrized and
    the handles of its random-stream checkpoint hooks."""

    def __init__(self, policy: ResolvedPolicy, params: list[str], handles: tuple[Any, ...] = ()) -> None:
        self.policy = policy
        self.params = params
        self.handles = handles


def layer_state(module: nn.Module) -> LayerState | None:
    """The `LayerState` of a converted module, else None."""
    return module.__dict__.get(_STATE_ATTR)


def layer_streams(module: nn.Module) -> dict[str, Rounder | None]:
    """The random streams a converted module owns, by category (what its state_dict saves)."""
    state = layer_state(module)
    if state is None:
        return {}
    p = state.policy
    return {
        "weight": p.weight, "bias": p.bias, "activation": p.activation, "error": p.error, "buffer": p.buffer
    }


def _map_tensors(value: Any, fwd: Rounder | None, bwd: Rounder | None) -> Any:
    if isinstance(value, torch.Tensor):
        return apply_pair(value, fwd, bwd) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, fwd, bwd) for v in value)
    if isinstance(value, list):
        return [_map_tensors(v, fwd, bwd) for v in value]
    return value


class InputHook:
    """Forward pre-hook: rounds every floating tensor argument (activation) and its gradient (error)."""

    def __init__(self, fwd: Rounder | None, bwd: Rounder | None) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(args) == 1 and type(args[0]) is torch.Tensor and args[0].is_floating_point():
            return (apply_pair(args[0], self.fwd, self.bwd),)  # the common case, without the walk
        return _map_tensors(args, self.fwd, self.bwd)


class OutputHook:
    """Forward hook: rounds the floating tensors of the output and their gradients."""

    def __init__(self, fwd: Rounder | None, bwd: Rounder | None) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        return _map_tensors(output, self.fwd, self.bwd)


class BufferHook:
    """Forward hook: re-rounds floating buffers updated by a training-mode forward (BN statistics)."""

    def __init__(self, rounder: Rounder) -> None:
        self.rounder = rounder

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not module.training:
            return
        with torch.no_grad():
            for buf in module.buffers(recurse=False):
                if buf.is_floating_point():
                    # Through .data: batch_norm saved these for backward, and rounding the
                    # statistics must not bump their version counter (autograd would refuse).
                    buf.data.copy_(self.rounder(buf))


class WeightQuantization(nn.Module):
    """Parametrization: the layer sees its weight rounded (straight-through gradient)."""

    def __init__(self, rounder: Rounder) -> None:
        super().__init__()
        self.rounder = rounder

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return round_weight(w, self.rounder)

    def extra_repr(self) -> str:
        return repr(self.rounder)


_HOOK_TYPES = (InputHook, OutputHook, BufferHook)


def _fast_access(module: nn.Module, name: str) -> None:
    """Let ``module.<name>`` read its rounded weight without torch's two module calls.

    torch's parametrized attribute calls the ParametrizationList module, which calls
    `WeightQuantization` (two nn.Module calls, about 8 us per access, twice per layer and step).
    While the list holds only our parametrization, with no hooks and no
    ``parametrize.cached()`` in force (and no global module hooks), the attribute computes the
    same value directly; in every other case it hands over to torch's own getter. The property
    lives on the class torch made for this module alone, and torch removes it with the
    parametrization.
    """
    cls = type(module)
    torch_property = cls.__dict__.get(name)
    if not isinstance(torch_property, property) or torch_property.fget is None:
        return  # not the shape this torch version builds: keep its getter
    torch_get = torch_property.fget

    def get(self: nn.Module) -> torch.Tensor:
        plist: Any = self._modules["parametrizations"]._modules[name]  # type: ignore[union-attr]
        quant = plist._modules.get("0")
        if (
            len(plist._modules) == 1
            and type(quant) is WeightQuantization
            and not (parametrize._cache_enabled or plist._forward_hooks or plist._forward_pre_hooks)
            and not (quant._forward_hooks or quant._forward_pre_hooks)
            and not (_module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks)
        ):
            w: torch.Tensor = plist._parameters["original"]
            return round_weight(w, quant.rounder)
        value: torch.Tensor = torch_get(self)
        return value

    setattr(cls, name, property(get, torch_property.fset))


def attach(module: nn.Module, policy: ResolvedPolicy, *, params: bool = True) -> nn.Module:
    """Quantize `module`'s own parameters, inputs/outputs and buffers per `policy` (in place).

    With ``params=False`` parameters are left alone (layers that round their
    weights inside their own forward, such as the recurrent ones).
    """
    # Representability is checked here, once, so a bad format fails at convert time.
    done: list[str] = []
    if params:
        for name, p in list(module.named_parameters(recurse=False)):
            rounder = policy.for_param(name)
            if rounder is None:
                continue
            rounder.check_dtype(p.dtype)
            parametrize.register_parametrization(module, name, WeightQuantization(rounder))
            _fast_access(module, name)
            done.append(name)
    else:
        for name, p in module.named_parameters(recurse=False):
            rounder = policy.for_param(name)
            if rounder is not None:
                rounder.check_dtype(p.dtype)
    if policy.quantizes_inputs:
        module.register_forward_pre_hook(InputHook(policy.activation, policy.error))
    if policy.quantizes_outputs:
        module.register_forward_hook(OutputHook(policy.activation, policy.error))
    if policy.buffer is not None and any(b.is_floating_point() for b in module.buffers(recurse=False)):
        for b in module.buffers(recurse=False):
            if b.is_floating_point():
                policy.buffer.check_dtype(b.dtype)
        module.register_forward_hook(BufferHook(policy.buffer))
    # The streams of stochastic categories travel with the module's state_dict (anynum.nn.streams).
    handles = register_stream_hooks(module, layer_streams)
    module.__dict__[_STATE_ATTR] = LayerState(policy, done, handles)
    return module


def detach(module: nn.Module) -> None:
    """Undo `attach`: the module's original parameters (same objects) and no anynum hooks."""
    state = layer_state(module)
    if state is None:
        return
    for hooks in (module._forward_pre_hooks, module._forward_hooks):
        for key in [k for k, h in hooks.items() if isinstance(h, _HOOK_TYPES)]:
            del hooks[key]
    for handle in state.handles:
        handle.remove()
    for name in state.params:
        if parametrize.is_parametrized(module, name):
            parametrize.remove_parametrizations(module, name, leave_parametrized=False)
    del module.__dict__[_STATE_ATTR]


def stored_parameter(module: nn.Module, name: str) -> torch.Tensor:
    """The tensor an optimizer updates for parameter `name` (the original under a parametrization)."""
    if parametrize.is_parametrized(module, name):
        return getattr(module.parametrizations, name).original
    return getattr(module, name)
