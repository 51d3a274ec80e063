"""`audit`: find every stored tensor that is not on the grid it was declared to live on.

This is the "high precision leaked into training" check QPyTorch warns
about: a parameter updated without re-rounding, an optimizer state that
escaped quantization, a master copy in the wrong format.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.nn.checks import check_module
from anynum.nn.convert import check_policy, converted_layers, select_layers
from anynum.nn.hooks import stored_parameter
from anynum.nn.policy import Policy, ResolvedPolicy
from anynum.nn.quantizer import Rounder

__all__ = ["Leak", "audit"]


@dataclass(frozen=True)
class Leak:
    """One tensor with `count` of its `total` values off the grid of `fmt`; `example` is one of them."""

    name: str
    kind: str  # "parameter", "buffer", "optimizer state", "master weight"
    fmt: str
    count: int
    total: int
    example: float

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.name}: {self.count} of {self.total} values are not {self.fmt} values "
            f"(e.g. {self.example!r})"
        )


def _check(name: str, kind: str, tensor: torch.Tensor, rounder: Rounder) -> Leak | None:
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    ok = rounder.on_grid(tensor)
    bad = int((~ok).sum())
    if bad == 0:
        return None
    example = float(tensor.detach()[~ok].flatten()[0])
    return Leak(name, kind, rounder.fmt.display_name(), bad, tensor.numel(), example)


def _layer_tensors(
    model: nn.Module, layers: dict[str, ResolvedPolicy]
) -> Iterable[tuple[str, str, torch.Tensor, Rounder]]:
    for lname, rp in layers.items():
        module = model.get_submodule(lname)
        inside = isinstance(module, (nn.RNNBase, nn.MultiheadAttention))
        prefix = f"{lname}." if lname else ""
        names = [n for n, _ in module.named_parameters(recurse=inside, remove_duplicate=False)]
        for pname in names:
            if ".parametrizations." in f".{pname}" or pname.startswith("parametrizations."):
                continue
            owner_name, _, leaf = pname.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            rounder = rp.for_param(leaf)
            if rounder is not None:
                yield f"{prefix}{pname}", "parameter", stored_parameter(owner, leaf), rounder
        # parametrized tensors are listed under their own names, not "parametrizations.*"
        for leaf in getattr(module, "parametrizations", {}):
            rounder = rp.for_param(leaf)
            if rounder is not None:
                yield f"{prefix}{leaf}", "parameter", stored_parameter(module, leaf), rounder
        if rp.buffer is not None:
            for bname, buf in module.named_buffers(recurse=False):
                yield f"{prefix}{bname}", "buffer", buf, rp.buffer


def audit(model: nn.Module, policy: Policy | None = None, optimizer: Any = None) -> list[Leak]:
    """Every parameter, buffer and optimizer-state tensor not on its declared grid (empty list: none).

    The declared grids come from `policy` (resolved against `model` as
    `convert` would) or, when None, from the policies `convert` attached.
    For parametrized weights the *stored* tensor (the one the optimizer
    updates) is checked, so training without re-rounding the weights shows
    up here. With an `anynum.optim.QuantizedOptimizer`, its state tensors,
    master weights and weight format are checked too.

    NaN counts as on the grid when the format has a NaN; ±inf when it has
    infinities; anything beyond the format's range is a leak.

    >>> import torch, anynum as an
    >>> m = an.nn.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), an.nn.Policy(weight="bf16", bias=None))
    >>> with torch.no_grad():
    ...     _ = m[0].parametrizations.weight.original.fill_(0.1)
    >>> [leak.name for leak in an.nn.audit(m)]
    ['0.weight']
    """
    check_module(model, "anynum.nn.audit")
    if policy is not None:
        check_policy(policy, "anynum.nn.audit")
    if optimizer is not None and not (
        hasattr(optimizer, "grid_checks") or isinstance(optimizer, torch.optim.Optimizer)
    ):
        raise AnynumError(
            f"anynum.nn.audit: optimizer= takes an anynum.optim.QuantizedOptimizer (or a torch "
            f"optimizer, which declares no grids), got {type(optimizer).__name__}."
        )
    if policy is None:
        layers = converted_layers(model)
    else:
        layers = {name: pol.resolve(name) for name, (_, pol) in select_layers(model, policy).items()}
    leaks = []
    for name, kind, tensor, rounder in _layer_tensors(model, layers):
        leak = _check(name, kind, tensor, rounder)
        if leak is not None:
            leaks.append(leak)
    if optimizer is not None and hasattr(optimizer, "grid_checks"):
        for name, kind, tensor, rounder in optimizer.grid_checks():
            leak = _check(name, kind, tensor, rounder)
            if leak is not None:
                leaks.append(leak)
    return leaks
