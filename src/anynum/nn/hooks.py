"""Attach quantization to one module without changing its class definition, and detach it again.

Weights and biases go through `torch.nn.utils.parametrize` (the stored
Parameter object stays the same, so optimizers built earlier keep working and
`state_dict` round-trips); activations and errors, and buffers after a training-mode
forward, through the module's own ``forward``: the module's class gains a ``forward`` that
runs the `LayerState`'s hooks around the original one (`_round_in_forward`). That keeps torch's
module call on its fast path, which it leaves for any module with forward hooks (about 10 us a
layer and step). The hooks are instances of module-level classes kept in the `LayerState`, so
converted models deep-copy and pickle, and observers find the hooks there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module_hooks
from torch.nn.utils import parametrize

from anynum.nn.policy import ResolvedPolicy
from anynum.nn.quantizer import PairPoint, Rounder, round_weight
from anynum.nn.streams import register_stream_hooks

__all__ = ["LayerState", "attach", "detach", "layer_state", "layer_streams"]

_STATE_ATTR = "_anynum_state"


class LayerState:
    """What `attach` did to a module: its resolved policy, the parameters it parametrized, the
    handles of its random-stream checkpoint hooks, and the hooks its forward runs: `inputs`
    before the original forward, `after` (outputs, then buffers) on its result."""

    def __init__(
        self,
        policy: ResolvedPolicy,
        params: list[str],
        handles: tuple[Any, ...] = (),
        inputs: InputHook | None = None,
        after: tuple[OutputHook | BufferHook, ...] = (),
    ) -> None:
        self.policy = policy
        self.params = params
        self.handles = handles
        self.inputs = inputs
        self.after = after

    @property
    def hooks(self) -> tuple[InputHook | OutputHook | BufferHook, ...]:
        """Every hook the module's forward runs, in the order it runs them."""
        return self.after if self.inputs is None else (self.inputs, *self.after)


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


def _map_tensors(value: Any, point: PairPoint) -> Any:
    if isinstance(value, torch.Tensor):
        return point.round(value) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, point) for v in value)
    if isinstance(value, list):
        return [_map_tensors(v, point) for v in value]
    return value


class InputHook(PairPoint):
    """Rounds every floating tensor argument (activation) and its gradient (error)."""

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(args) == 1 and type(args[0]) is torch.Tensor and args[0].is_floating_point():
            return (self.round(args[0]),)  # the common case, without the walk
        result: tuple[Any, ...] = _map_tensors(args, self)
        return result


class OutputHook(PairPoint):
    """Rounds the floating tensors of the output and their gradients."""

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        return _map_tensors(output, self)


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


_BASE_ATTR = "_anynum_base"


def _round_in_forward(holder: type[nn.Module]) -> Callable[..., Any]:
    """``holder``'s ``forward``: the original forward with the instance's `LayerState` hooks around it.

    An instance without a state (after `detach`, where the class outlives it) runs the
    original forward alone. Positional arguments are rounded, as torch's forward pre-hooks see
    them; keyword arguments pass unchanged.
    """

    parent: Any = holder.__mro__[1]  # (its forward read at each call, as super() would)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = self.__dict__.get(_STATE_ATTR)
        if state is None:
            return parent.forward(self, *args, **kwargs)
        inputs = state.inputs
        if inputs is not None:
            args = inputs(self, args)
        out = parent.forward(self, *args, **kwargs)
        for hook in state.after:
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    return forward


_FORWARD_CODE = _round_in_forward(nn.Module).__code__


def _reswap(base: type[nn.Module]) -> nn.Module:
    """An empty instance of a fresh rounding subclass of `base` (what unpickling one rebuilds)."""
    module: nn.Module = base.__new__(base)
    module.__class__ = _rounding_subclass(base)
    return module


def _rounding_subclass(base: type[nn.Module]) -> type[nn.Module]:
    """A subclass of `base` whose forward rounds, named as `base` (so the model's repr reads the
    same) and pickled as `base` plus the swap."""

    def reduce(self: nn.Module, protocol: Any) -> tuple[Any, ...]:
        return _reswap, (base,), dict(self.__dict__)

    sub: type[nn.Module] = type(base.__name__, (base,), {_BASE_ATTR: base, "__reduce_ex__": reduce})
    sub.__qualname__ = base.__qualname__
    sub.forward = _round_in_forward(sub)  # type: ignore[method-assign]
    return sub


def _round_in_class(module: nn.Module) -> None:
    """Give `module` a class whose forward runs its hooks.

    A parametrized module already has a class of its own (torch made it for this instance, and
    removes it with the last parametrization): the forward goes there, as `_fast_access`'s
    weight getters do. Any other module gets a subclass made for it alone, undone by `detach`.
    """
    cls = type(module)
    own = cls.__dict__.get("forward")
    if getattr(own, "__code__", None) is _FORWARD_CODE:
        return  # a class this module shares with its deep copies, already ours
    if parametrize.is_parametrized(module) and own is None:
        cls.forward = _round_in_forward(cls)  # type: ignore[method-assign]
    else:
        module.__class__ = _rounding_subclass(cls)


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
    inputs = InputHook(policy.activation, policy.error) if policy.quantizes_inputs else None
    after: list[OutputHook | BufferHook] = []
    if policy.quantizes_outputs:
        after.append(OutputHook(policy.activation, policy.error))
    if policy.buffer is not None and any(b.is_floating_point() for b in module.buffers(recurse=False)):
        for b in module.buffers(recurse=False):
            if b.is_floating_point():
                policy.buffer.check_dtype(b.dtype)
        after.append(BufferHook(policy.buffer))
    # The streams of stochastic categories travel with the module's state_dict (anynum.nn.streams).
    handles = register_stream_hooks(module, layer_streams)
    module.__dict__[_STATE_ATTR] = LayerState(policy, done, handles, inputs, tuple(after))
    if inputs is not None or after:
        _round_in_class(module)
    return module


def detach(module: nn.Module) -> None:
    """Undo `attach`: the module's original parameters (same objects) and no anynum hooks."""
    state = layer_state(module)
    if state is None:
        return
    base = type(module).__dict__.get(_BASE_ATTR)
    if base is not None:
        module.__class__ = base  # (before the parametrizations go: torch restores the class under ours)
    for handle in state.handles:
        handle.remove()
    if state.params:
        _own_class(module)
    for name in state.params:
        if parametrize.is_parametrized(module, name):
            parametrize.remove_parametrizations(module, name, leave_parametrized=False)
    del module.__dict__[_STATE_ATTR]


def _own_class(module: nn.Module) -> None:
    """Give a parametrized module a copy of its class for itself alone.

    torch's parametrized class is shared with the module's deep copies, and removing a
    parametrization deletes the parameter's getter from that class: restoring a copy would
    leave the original without its weights. On a copy of the class, only this module loses them.
    """
    cls = type(module)
    own = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    module.__class__ = type(cls.__name__, cls.__bases__, own)


def stored_parameter(module: nn.Module, name: str) -> torch.Tensor:
    """The tensor an optimizer updates for parameter `name` (the original under a parametrization)."""
    if parametrize.is_parametrized(module, name):
        return getattr(module.parametrizations, name).original
    return getattr(module, name)
