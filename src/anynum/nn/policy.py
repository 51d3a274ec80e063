"""`Policy`: which numbers of which layers are quantized, and to what.

The number categories follow QPyTorch: weight, bias, activation (layer inputs
and/or outputs), error (the gradient of an activation), plus buffers (e.g.
BatchNorm running statistics). Layer selection is by module type or by
qualified-name pattern (`fnmatch` syntax), with per-layer overrides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from anynum.errors import AnynumError
from anynum.nn.checks import check_flag
from anynum.nn.quantizer import NumberLike, Rounder, resolve_number
from anynum.rounding import RoundingLike

__all__ = ["DEFAULT_LAYERS", "Policy", "ResolvedPolicy"]

#: Module types a Policy quantizes unless `include` says otherwise.
DEFAULT_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.RNN,
    nn.LSTM,
    nn.GRU,
    nn.MultiheadAttention,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.Embedding,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
)

_SAME = "same as weight"
_SIDES = ("input", "output", "both")


@dataclass(frozen=True, eq=False)
class Policy:
    """What to quantize in a model: formats per number category and which layers.

    Each category is a Format or name, ``(fmt, rounding)`` or ``(fmt, rounding,
    overflow)``, or None (left in full precision). `bias` defaults to the weight's
    number. `rounding` is the default mode of every category; stochastic
    categories draw from streams seeded by `seed` (each layer and category gets
    its own stream).

    Args:
        weight: the weight parameters (through `torch.nn.utils.parametrize`; the
            stored tensor stays the full-precision "original").
        bias: the bias parameters, likewise (default: the weight's number).
        activation: layer inputs (`activation_at="input"`, Qtorch+ style), outputs,
            or both; also every gate/softmax inside RNN and attention layers.
        error: gradients flowing back through the activation points.
        buffer: floating buffers (BatchNorm running statistics), re-rounded after
            every training-mode forward.
        include: module types and/or qualified-name patterns to quantize
            (default `DEFAULT_LAYERS`). `exclude` removes matches.
        per_layer: ``{name_or_pattern_or_type: Policy}`` overrides; a name also
            selects that layer.
        skip_first_last: leave the first and the last selected layer with weights
            in full precision (the Qtorch+ "P6+D" setting); order is definition
            order (`model.named_modules()`).

    NaN/inf/overflow: each category follows `anynum.quantize` with its
    format's default overflow (inf where the format has infinities, else
    saturation) unless the tuple form names one.

    >>> import anynum as an, torch
    >>> p = an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error=("e5m2", "sr"), seed=0)
    >>> m = an.nn.convert(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), p)
    >>> sorted(an.nn.converted_layers(m))
    ['0']
    """

    weight: NumberLike = None
    bias: Any = _SAME
    activation: NumberLike = None
    error: NumberLike = None
    buffer: NumberLike = None
    rounding: RoundingLike = "nearest"
    activation_at: str = "input"
    include: tuple[Any, ...] = DEFAULT_LAYERS
    exclude: tuple[Any, ...] = ()
    per_layer: Mapping[Any, Policy] = field(default_factory=dict)
    skip_first_last: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.activation_at, str) or self.activation_at not in _SIDES:
            raise AnynumError(f"activation_at must be one of {_SIDES}, got {self.activation_at!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise AnynumError(f"Policy seed must be an int or None, got {self.seed!r}; e.g. seed=0.")
        check_flag(self.skip_first_last, "skip_first_last", "anynum.nn.Policy")
        for name in ("include", "exclude"):
            value = getattr(self, name)
            if isinstance(value, (str, type)):
                object.__setattr__(self, name, (value,))
            elif not isinstance(value, (tuple, list, set, frozenset)):
                raise AnynumError(
                    f"Policy {name}= takes a module type, a name pattern or a tuple of them, "
                    f"got {type(value).__name__} ({value!r})."
                )
            for item in getattr(self, name):
                if not isinstance(item, (str, type)):
                    raise AnynumError(f"Policy {name}= takes module types and name patterns, got {item!r}.")
        if not isinstance(self.per_layer, Mapping):
            raise AnynumError(
                f"Policy per_layer= takes a dict {{name_or_pattern_or_type: Policy}}, got "
                f"{type(self.per_layer).__name__}."
            )
        for key, sub in self.per_layer.items():
            if not isinstance(sub, Policy):
                raise AnynumError(f"per_layer[{key!r}] must be a Policy, got {type(sub).__name__}.")
        # Fail at construction, not in the middle of a forward pass.
        self.resolve("<check>")

    def replace(self, **changes: Any) -> Policy:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def resolve(self, layer: str) -> ResolvedPolicy:
        """The `Rounder` of every category for the layer named `layer`."""

        def seed_for(category: str) -> int | None:
            if self.seed is None:
                return None
            # A stable per-layer, per-category stream (hash() of str is salted per process).
            h = 0
            for ch in f"{layer}/{category}":
                h = (h * 131 + ord(ch)) % (2**61 - 1)
            return (self.seed * 1_000_003 + h) % (2**62)

        weight = resolve_number(self.weight, self.rounding, seed_for("weight"))
        bias = weight if self.bias is _SAME else resolve_number(self.bias, self.rounding, seed_for("bias"))
        return ResolvedPolicy(
            weight=weight,
            bias=bias,
            activation=resolve_number(self.activation, self.rounding, seed_for("activation")),
            error=resolve_number(self.error, self.rounding, seed_for("error")),
            buffer=resolve_number(self.buffer, self.rounding, seed_for("buffer")),
            activation_at=self.activation_at,
        )


@dataclass
class ResolvedPolicy:
    """A Policy applied to one layer: one `Rounder` (or None) per category."""

    weight: Rounder | None
    bias: Rounder | None
    activation: Rounder | None
    error: Rounder | None
    buffer: Rounder | None
    activation_at: str = "input"

    def for_param(self, name: str) -> Rounder | None:
        """The rounder of a parameter: names containing "bias" are biases, the rest weights."""
        return self.bias if "bias" in name else self.weight

    @property
    def quantizes_inputs(self) -> bool:
        return self.activation_at in ("input", "both") and (self.activation or self.error) is not None

    @property
    def quantizes_outputs(self) -> bool:
        return self.activation_at in ("output", "both") and (self.activation or self.error) is not None
