"""`convert` / `restore` / `post_quantize`: quantize an existing model in place, and undo it.

`convert` walks ``model.named_modules()``, picks the layers a `Policy`
selects, and either attaches quantization to them (parametrizations and hooks,
`anynum.nn.hooks`) or, where quantization must act inside the op (recurrent
layers, attention), swaps in the `anynum.nn.layers` equivalent that shares the
same Parameter objects. `restore` removes all of it; the original Parameter
objects come back untouched, so an unconverted model is bit for bit the original.
"""

from __future__ import annotations

import copy
import difflib
import fnmatch
from typing import Any

from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.nn.checks import check_flag, check_module
from anynum.nn.hooks import attach, detach, layer_state
from anynum.nn.layers import quantized_replacement
from anynum.nn.policy import Policy, ResolvedPolicy
from anynum.rounding import RoundingLike

__all__ = ["check_policy", "convert", "converted_layers", "post_quantize", "restore", "select_layers"]

_ORIGINAL_ATTR = "_anynum_original"
_WILDCARDS = set("*?[")


def _name_matches(pattern: str, name: str) -> bool:
    return name == pattern or (bool(_WILDCARDS & set(pattern)) and fnmatch.fnmatchcase(name, pattern))


def _matches(items: tuple[Any, ...], name: str, module: nn.Module) -> bool:
    for item in items:
        if isinstance(item, type):
            if isinstance(module, item):
                return True
        elif name and _name_matches(item, name):
            return True
    return False


def _check_names(policy: Policy, names: list[str]) -> None:
    """Every name or pattern a policy mentions must match a module: typos fail loudly."""
    mentioned = [(f, p) for f in ("include", "exclude") for p in getattr(policy, f) if isinstance(p, str)]
    mentioned += [("per_layer", k) for k in policy.per_layer if isinstance(k, str)]
    for field_name, pattern in mentioned:
        if not any(_name_matches(pattern, n) for n in names):
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise AnynumError(
                f"Policy {field_name} names {pattern!r}, but the model has no such layer; "
                f"its layers are {names[:12]}{' ...' if len(names) > 12 else ''}.{hint}"
            )
    for sub in policy.per_layer.values():
        if sub.per_layer:
            raise AnynumError("a per_layer Policy cannot have per_layer overrides of its own.")


def _override(policy: Policy, name: str, module: nn.Module) -> tuple[Policy | None, bool]:
    """The per-layer Policy for a module and whether it was chosen by name (which also selects it)."""
    items = list(policy.per_layer.items())
    for key, sub in items:
        if isinstance(key, str) and key == name:
            return sub, True
    for key, sub in items:
        if isinstance(key, str) and _name_matches(key, name) and name:
            return sub, True
    for key, sub in items:
        if isinstance(key, type) and isinstance(module, key):
            return sub, False
    return None, False


def check_policy(policy: Any, where: str) -> Policy:
    """`policy` if it is a Policy, else an AnynumError that says how to write one."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, (Format, str)):
        raise AnynumError(
            f"{where} needs an anynum.nn.Policy, got the format {policy!r}; write "
            f"Policy(weight={policy!r}, activation={policy!r}) or use anynum.nn.post_quantize."
        )
    raise AnynumError(
        f"{where} needs an anynum.nn.Policy, got {type(policy).__name__}; "
        "e.g. anynum.nn.Policy(weight='e4m3fn', activation='e4m3fn')."
    )


def select_layers(model: nn.Module, policy: Policy) -> dict[str, tuple[nn.Module, Policy]]:
    """The layers `policy` selects in `model`: ``{qualified name: (module, effective Policy)}``.

    Raises AnynumError when an include/exclude/per_layer name matches no layer.

    >>> import torch, anynum as an
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    >>> list(select_layers(m, an.nn.Policy(weight="bf16", exclude=("2",))))
    ['0']
    """
    check_module(model, "anynum.nn.select_layers")
    check_policy(policy, "anynum.nn.select_layers")
    names = [n for n, _ in model.named_modules() if n]
    _check_names(policy, names)
    selected: dict[str, tuple[nn.Module, Policy]] = {}
    inside: list[str] = []  # layers whose children the replacement layer handles itself
    for name, module in model.named_modules():
        if any(name.startswith(p + ".") for p in inside):
            continue
        sub, by_name = _override(policy, name, module)
        chosen = by_name or _matches(policy.include, name, module)
        if chosen and not _matches(policy.exclude, name, module):
            selected[name] = (module, sub if sub is not None else policy)
            if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
                inside.append(name)
    if policy.skip_first_last:
        weighted = [n for n, (m, _) in selected.items() if any(True for _ in m.parameters(recurse=False))]
        for n in {weighted[0], weighted[-1]} if weighted else set():
            del selected[n]
    return selected


def convert(model: nn.Module, policy: Policy) -> nn.Module:
    """Quantize `model` in place per `policy`, without touching its class definitions; returns it.

    Weights and biases are rounded on every access through
    `torch.nn.utils.parametrize` (the stored Parameter is the full-precision
    original, still the object an existing optimizer updates); activations
    and errors are rounded at each selected layer's inputs (and/or outputs)
    by hooks; RNN/LSTM/GRU and MultiheadAttention are swapped for
    `anynum.nn` layers that round inside the recurrence and the softmax
    (sharing the same Parameters). The converted model saves and loads with
    ``state_dict`` (keys of parametrized tensors become
    ``...parametrizations.weight.original``, as torch names them); whole-module
    pickling of parametrized modules is refused by torch itself, so
    `restore` first or save the state_dict.

    If `model` itself is a recurrent or attention layer, the returned object is
    the replacement: use the return value.

    Raises AnynumError for a policy naming layers that do not exist, for a
    model converted twice, and RepresentabilityError for a format that a
    parameter's dtype cannot hold. NaN/inf follow each category's format.

    >>> import torch, anynum as an
    >>> m = torch.nn.Sequential(torch.nn.Linear(3, 2))
    >>> _ = an.nn.convert(m, an.nn.Policy(weight="e2m1"))
    >>> bool(set(m[0].weight.flatten().tolist()) <= set(an.E2M1.values().tolist()))
    True
    >>> _ = an.nn.restore(m)
    """
    check_module(model, "anynum.nn.convert")
    check_policy(policy, "anynum.nn.convert")
    if converted_layers(model):
        raise AnynumError("this model is already converted; call anynum.nn.restore(model) first.")
    selected = select_layers(model, policy)
    resolved: dict[str, ResolvedPolicy] = {name: pol.resolve(name) for name, (_, pol) in selected.items()}
    root = model
    for name, (module, _) in selected.items():
        rp = resolved[name]
        new = quantized_replacement(module, rp)
        if new is None:
            attach(module, rp)
            continue
        new.__dict__[_ORIGINAL_ATTR] = module  # kept outside _modules: not in state_dict
        if name:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, new)
        else:
            root = new
    return root


def restore(model: nn.Module) -> nn.Module:
    """Undo `convert`: remove every parametrization and hook and put original layers back; returns the model.

    The Parameter objects are the ones the model had before `convert` (an
    optimizer keeps working across convert/restore). Their values are the
    full-precision originals, updated by any training in between.

    >>> import torch, anynum as an
    >>> m = torch.nn.Sequential(torch.nn.Linear(3, 2)); w = m[0].weight.clone()
    >>> m = an.nn.restore(an.nn.convert(m, an.nn.Policy(weight="e2m1")))
    >>> torch.equal(m[0].weight, w), type(m[0]).__name__
    (True, 'Linear')
    """
    check_module(model, "anynum.nn.restore")
    root = model
    for name, module in list(model.named_modules()):
        original = module.__dict__.get(_ORIGINAL_ATTR)
        detach(module)
        if original is None:
            continue
        del module.__dict__[_ORIGINAL_ATTR]
        if name:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, original)
        else:
            root = original
    return root


def converted_layers(model: nn.Module) -> dict[str, ResolvedPolicy]:
    """``{qualified name: resolved policy}`` of every layer `convert` touched in `model`."""
    check_module(model, "anynum.nn.converted_layers")
    out = {}
    for name, module in model.named_modules():
        state = layer_state(module)
        if state is not None:
            out[name] = state.policy
    return out


def post_quantize(
    model: nn.Module,
    fmt_or_policy: Format | str | Policy,
    rounding: RoundingLike = "nearest",
    *,
    activations: bool = True,
    copy_model: bool = False,
) -> nn.Module:
    """Post-training quantization in one call (Pychop `post_quantization`, Qtorch+ `prepare_model`).

    With a format, weights, biases and (if `activations`) the inputs of every
    default layer are rounded to it with `rounding`; a Policy gives full
    control. The model is converted in place (or a deep copy with
    ``copy_model=True``) and returned; `restore` undoes it. The model's
    train/eval mode is left as it is. NaN/inf follow the format's overflow default.

    >>> import torch, anynum as an
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 2))
    >>> q = an.nn.post_quantize(m, "e4m3fn", copy_model=True)
    >>> bool(torch.equal(q[0].weight, an.quantize(m[0].weight.detach(), "e4m3fn")))
    True
    """
    check_module(model, "anynum.nn.post_quantize")
    check_flag(activations, "activations", "anynum.nn.post_quantize")
    check_flag(copy_model, "copy_model", "anynum.nn.post_quantize")
    if isinstance(fmt_or_policy, Policy):
        policy = fmt_or_policy
    elif not isinstance(fmt_or_policy, (Format, str, tuple)):
        raise AnynumError(
            f"anynum.nn.post_quantize takes a format (or name) or an anynum.nn.Policy, got "
            f"{type(fmt_or_policy).__name__}; e.g. post_quantize(model, 'e4m3fn')."
        )
    else:
        policy = Policy(
            weight=fmt_or_policy, activation=fmt_or_policy if activations else None, rounding=rounding
        )
    if copy_model:
        model = copy.deepcopy(model)
    return convert(model, policy)
