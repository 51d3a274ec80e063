"""`FaultInjector`: bit flips in a model's weights, biases, activations or gradients, at a rate.

Weights and biases are corrupted once, in place, when the injector is created
(stored values that went bad, as in memory faults); activations on every forward
and gradients on every backward (transient faults). Every flip goes through
`anynum.flip_bits` on the format's real encoding: the format is the one given, or
the converted layer's own (`anynum.nn.convert`). Only elements whose code was hit
change; the others keep their exact value. `remove()` (or leaving the ``with``
block) restores the weights and removes the hooks. Results depend only on `seed`
and the order of forward/backward calls.

A separate object rather than a Policy option: faults are a perturbation of a
model for an experiment, removable at any time, on converted and unconverted
models alike, with their own rate, field and schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

import anynum as an
from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.nn.convert import select_layers
from anynum.nn.hooks import layer_state, stored_parameter
from anynum.nn.policy import DEFAULT_LAYERS, Policy

__all__ = ["TARGETS", "FaultInjector", "inject"]

TARGETS = ("weight", "bias", "activation", "gradient")
_SCALES = (None, "tensor")


def _stable_hash(text: str) -> int:
    h = 0
    for ch in text:
        h = (h * 131 + ord(ch)) % (2**61 - 1)
    return h


def _popcount(m: torch.Tensor, width: int) -> int:
    return int(sum(int(((m >> b) & 1).sum()) for b in range(width)))


def inject(
    t: torch.Tensor,
    fmt: Format,
    *,
    p: float | None = None,
    count: int | None = None,
    field: str = "any",
    bits: Sequence[int] | None = None,
    scale: str | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, int]:
    """`t` with bit flips in the codes of its elements on `fmt`; returns (new tensor, bits flipped).

    Elements whose code (or block scale) was not hit keep their exact value; hit
    ones become the decoded flipped code (times the per-tensor scale with
    ``scale="tensor"``: ``amax / fmt.max`` in float64, as symmetric int8 uses).
    NaN/inf in `t` follow `flip_bits` (a format without a NaN code rejects NaN).

    >>> import anynum as an, torch
    >>> new, flips = inject(torch.tensor([1.0, 0.3]), an.E4M3FN, count=1, field="sign")
    >>> new.tolist(), flips
    ([-1.0, -0.3125], 2)
    """
    if scale not in _SCALES:
        raise InputError(f"scale must be None or 'tensor', got {scale!r}.")
    with torch.no_grad():
        x = t.detach().to(torch.float64)
        s = 1.0
        if scale == "tensor" and x.numel():
            amax = float(x.abs().max())
            s = amax / fmt.max if amax > 0 and math.isfinite(amax) else 1.0
        xs = x / s
        values, mask = an.flip_bits(xs, fmt, p=p, count=count, field=field, bits=bits, seed=seed)
        if isinstance(mask, tuple):  # Block: element and scale masks
            assert isinstance(fmt, Block)
            flips = _popcount(mask[0], fmt.element.bits) + _popcount(mask[1], fmt.scale.bits)
        else:
            flips = _popcount(mask, fmt.bits)
        plain = an.quantize(xs, fmt)
        hit = (values != plain) | (torch.signbit(values) != torch.signbit(plain))
        hit = hit & ~(torch.isnan(values) & torch.isnan(plain))
        out = torch.where(hit, values * s, x).to(t.dtype)
    return out, flips


class FaultInjector:
    """Bit flips in the weights, biases, activations or gradients of a model, reproducible and removable.

    Args:
        model: any `torch.nn.Module` (converted by `anynum.nn.convert` or not).
        fmt: the format whose codes are corrupted, or None for each converted
            layer's own (its weight/bias/activation format; gradients use the weight's).
        p: the probability that each eligible bit flips (the bit error rate), as in `anynum.flip_bits`.
        count: exactly this many bits flip per element instead (one of p and count).
        field: which bits may flip ("any", "sign", "exponent", "regime", ..., see `anynum.flip_bits`).
        bits: explicit bit positions instead of a field.
        target: "weight", "bias", "activation" (layer outputs, every forward),
            "gradient" (parameter gradients, every backward), or a tuple of them.
        include: module types and qualified-name patterns of the layers to corrupt,
            as in `anynum.nn.Policy` (default: `anynum.nn.DEFAULT_LAYERS`).
        exclude: module types and name patterns to leave alone.
        scale: None, or "tensor" for a per-tensor scale amax / fmt.max before
            encoding (symmetric integer formats, scaled FP8).
        seed: the random stream (each layer, target and call gets its own).

    `flips` counts the bits flipped per site (``"fc1.weight"``, ``"fc1:activation"``).

    >>> import torch, anynum as an
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> before = model[0].weight.detach().clone()
    >>> with an.nn.FaultInjector(model, an.E4M3FN, count=1, field="exponent", seed=0) as fi:
    ...     bool((model[0].weight != before).all()), fi.flips["0.weight"]
    (True, 16)
    >>> torch.equal(model[0].weight, before)   # removed: weights restored
    True
    """

    def __init__(
        self,
        model: nn.Module,
        fmt: Format | str | None = None,
        *,
        p: float | None = None,
        count: int | None = None,
        field: str = "any",
        bits: Sequence[int] | None = None,
        target: str | Sequence[str] = "weight",
        include: Any = DEFAULT_LAYERS,
        exclude: Any = (),
        scale: str | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InputError(f"FaultInjector needs a torch.nn.Module, got {type(model).__name__}.")
        targets = (target,) if isinstance(target, str) else tuple(target)
        bad = [t for t in targets if t not in TARGETS]
        if bad or not targets:
            raise InputError(f"target must be one or more of {TARGETS}, got {target!r}.")
        if scale not in _SCALES:
            raise InputError(f"scale must be None or 'tensor', got {scale!r}.")
        if (p is None) == (count is None):
            raise InputError(
                "FaultInjector needs exactly one of p= (bit error rate) or count= (bits per element)."
            )
        self.fmt = None if fmt is None else (an.format(fmt) if isinstance(fmt, str) else fmt)
        self.options: dict[str, Any] = dict(p=p, count=count, field=field, bits=bits, scale=scale)
        self.seed = int(seed)
        self.flips: dict[str, int] = {}
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._handles: list[Any] = []
        self._calls: dict[str, int] = {}
        layers = select_layers(model, Policy(include=include, exclude=exclude))
        try:
            for name, (module, _) in layers.items():
                self._attach(name, module, targets)
        except Exception:
            self.remove()
            raise

    # --- sites ----------------------------------------------------------------------------------
    def _format(self, module: nn.Module, name: str, category: str) -> Format:
        if self.fmt is not None:
            return self.fmt
        state = layer_state(module)
        rounder = getattr(state.policy, category, None) if state is not None else None
        if rounder is None:
            raise InputError(
                f"layer {name!r} has no {category} format to corrupt: convert it with an.nn.convert "
                "first, or pass fmt= to FaultInjector."
            )
        return rounder.fmt  # type: ignore[no-any-return]

    def _seed(self, site: str) -> int:
        call = self._calls.get(site, 0)
        self._calls[site] = call + 1
        return (self.seed * 1_000_003 + _stable_hash(site) * 7919 + call) % (2**62)

    def _corrupt(self, site: str, t: torch.Tensor, fmt: Format) -> torch.Tensor:
        new, flips = inject(t, fmt, seed=self._seed(site), **self.options)
        self.flips[site] = self.flips.get(site, 0) + flips
        return new

    def _params(self, module: nn.Module, kind: str) -> Iterator[tuple[str, torch.Tensor]]:
        names = [n for n, _ in module.named_parameters(recurse=False)]
        state = layer_state(module)
        names += [] if state is None else [n for n in state.params if n not in names]
        for n in names:
            if ("bias" in n) == (kind == "bias"):
                p = stored_parameter(module, n)
                if p.is_floating_point():
                    yield n, p

    def _attach(self, name: str, module: nn.Module, targets: tuple[str, ...]) -> None:
        for kind in ("weight", "bias"):
            if kind not in targets:
                continue
            for pname, param in self._params(module, kind):
                site = f"{name}.{pname}" if name else pname
                new = self._corrupt(site, param, self._format(module, name, kind))
                self._saved.append((param, param.detach().clone()))
                with torch.no_grad():
                    param.copy_(new)
        if "activation" in targets:
            fmt = self._format(module, name, "activation")
            site = f"{name}:activation"

            def hook(mod: nn.Module, args: Any, output: Any, site: str = site, fmt: Format = fmt) -> Any:
                return self._map(output, site, fmt)

            self._handles.append(module.register_forward_hook(hook))
        if "gradient" in targets:
            for pname, param in self._params(module, "weight"):
                fmt = self._format(module, name, "weight")
                site = f"{name}.{pname}:gradient"

                def ghook(grad: torch.Tensor, site: str = site, fmt: Format = fmt) -> torch.Tensor:
                    return self._corrupt(site, grad, fmt)

                self._handles.append(param.register_hook(ghook))

    def _map(self, value: Any, site: str, fmt: Format) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            new = self._corrupt(site, value, fmt)
            # Hit elements are constants; the others keep their gradient path.
            return torch.where(new != value.detach(), new, value) if value.requires_grad else new
        if isinstance(value, tuple):
            return tuple(self._map(v, site, fmt) for v in value)
        return value

    # --- lifetime ------------------------------------------------------------------------------
    def remove(self) -> None:
        """Restore the corrupted weights and remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        with torch.no_grad():
            for param, original in reversed(self._saved):
                param.copy_(original)
        self._saved.clear()

    def __enter__(self) -> FaultInjector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if v is not None and v != "any")
        total = sum(self.flips.values())
        return f"FaultInjector({self.fmt!r}, {opts}, sites={len(self.flips)}, flips={total})"
