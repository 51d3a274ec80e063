"""Pychop-style quantized optimizers: ``QuantizedAdam(params, lr=..., fmt="bf16", rounding="sr")``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.nn.quantizer import NumberLike
from anynum.optim.optimizer import QuantizedOptimizer
from anynum.optim.scaling import LossScale
from anynum.rounding import RoundingLike

__all__ = [
    "QuantizedAdadelta",
    "QuantizedAdagrad",
    "QuantizedAdam",
    "QuantizedAdamW",
    "QuantizedRMSprop",
    "QuantizedSGD",
]

_CATEGORIES = ("weight", "grad", "momentum", "second_moment", "accumulator")


def _make(base: type[torch.optim.Optimizer]) -> type[QuantizedOptimizer]:
    def __init__(
        self: QuantizedOptimizer,
        params: Any,
        *args: Any,
        fmt: NumberLike = None,
        rounding: RoundingLike = "nearest",
        formats: Mapping[str, NumberLike] | None = None,
        state: Mapping[str, NumberLike] | None = None,
        master_weights: bool | None = None,
        grad_scale: float | str | LossScale = 1.0,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        cats: dict[str, Any] = {c: fmt for c in _CATEGORIES if c != "accumulator"}
        if formats is not None and not isinstance(formats, Mapping):
            raise AnynumError(f"formats= takes a dict {{category: format}}, got {type(formats).__name__}.")
        for key, value in (formats or {}).items():
            if key not in _CATEGORIES:
                raise AnynumError(f"formats= takes the categories {_CATEGORIES}, got {key!r}.")
            cats[key] = value
        try:
            inner = base(params, *args, **kwargs)
        except TypeError as exc:  # params that are not an iterable of tensors or dicts, bad options
            raise AnynumError(
                f"{name}: torch.optim.{base.__name__} refused its arguments, got params of type "
                f"{type(params).__name__} ({exc}); pass model.parameters() (or a list of parameter "
                f"groups) and {base.__name__}'s options."
            ) from None
        QuantizedOptimizer.__init__(
            self,
            inner,
            **cats,
            state=state,
            rounding=rounding,
            master_weights=master_weights,
            grad_scale=grad_scale,
            seed=seed,
        )

    name = f"Quantized{base.__name__}"
    doc = (
        f"`torch.optim.{base.__name__}` inside a `QuantizedOptimizer` (Pychop's {name}).\n\n"
        f"Takes {base.__name__}'s arguments, plus ``fmt=`` (one format for weights, gradients and "
        "every state), ``rounding=``, ``formats={category: fmt}`` overrides (weight, grad, "
        "momentum, second_moment, accumulator), ``state=``, ``master_weights=``, "
        "``grad_scale=`` and ``seed=`` as in `QuantizedOptimizer`. NaN/inf follow the formats.\n\n"
        ">>> import torch, anynum as an\n"
        ">>> w = torch.nn.Parameter(torch.ones(3))\n"
        f">>> opt = an.optim.{name}([w], lr=0.01, fmt='bf16')\n"
        ">>> w.grad = torch.full((3,), 0.1); opt.step()\n"
        ">>> bool((w.bfloat16().float() == w).all())\nTrue\n"
    )
    return type(name, (QuantizedOptimizer,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


QuantizedSGD = _make(torch.optim.SGD)
QuantizedAdam = _make(torch.optim.Adam)
QuantizedAdamW = _make(torch.optim.AdamW)
QuantizedRMSprop = _make(torch.optim.RMSprop)
QuantizedAdagrad = _make(torch.optim.Adagrad)
QuantizedAdadelta = _make(torch.optim.Adadelta)
