"""Pychop's quantized optimizers: the torch optimizer with ``chop=``, its states rounded after each step.

``QuantizedSGD``, ``QuantizedAdam``, ``QuantizedAdamW``, ``QuantizedRMSprop``,
``QuantizedAdagrad``, ``QuantizedAdadelta`` (and ``IQuantized*`` for integer
choppers) take the torch optimizer's arguments plus ``chop=``; after every step
each first- and second-moment state (`anynum.optim.MOMENTUM_STATES`,
`anynum.optim.SECOND_MOMENT_STATES`) is replaced by ``chop(state)``. Weights are
left to the layers, as in Pychop. For weights, gradients and master weights on
chosen formats use `anynum.optim.QuantizedOptimizer`.

>>> from anynum.compat.pychop import Chop
>>> w = torch.nn.Parameter(torch.ones(2))
>>> opt = QuantizedSGD([w], lr=0.1, momentum=0.9, chop=Chop(5, 2))
>>> w.grad = torch.tensor([0.3, 0.3]); opt.step()
>>> opt.state[w]["momentum_buffer"].tolist()
[0.3125, 0.3125]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import anynum as an
from anynum.compat.pychop.layers import CHOPPERS

__all__ = [
    "IQuantizedAdadelta",
    "IQuantizedAdagrad",
    "IQuantizedAdam",
    "IQuantizedAdamW",
    "IQuantizedRMSprop",
    "IQuantizedSGD",
    "QuantizedAdadelta",
    "QuantizedAdagrad",
    "QuantizedAdam",
    "QuantizedAdamW",
    "QuantizedRMSprop",
    "QuantizedSGD",
]

_STATES = an.optim.MOMENTUM_STATES | an.optim.SECOND_MOMENT_STATES


def _optimizer(name: str, base: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    def __init__(
        self: torch.optim.Optimizer, params: Any, *args: Any, chop: Any = None, **kwargs: Any
    ) -> None:
        if chop is None and args and isinstance(args[-1], CHOPPERS):
            args, chop = args[:-1], args[-1]
        base.__init__(self, params, *args, **kwargs)
        self.chop = chop  # type: ignore[attr-defined]

    @torch.no_grad()
    def step(self: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
        loss = base.step(self, closure)
        chop = self.chop  # type: ignore[attr-defined]
        if chop is not None:
            for group in self.param_groups:
                for p in group["params"]:
                    state = self.state.get(p, {})
                    for key in _STATES & state.keys():
                        if isinstance(state[key], torch.Tensor) and state[key].is_floating_point():
                            state[key] = chop(state[key])
        return loss

    doc = (
        f"`torch.optim.{base.__name__}` whose moment states are rounded by ``chop`` after each step "
        f"(Pychop ``{name}``); same arguments plus ``chop=``."
    )
    return type(name, (base,), {"__init__": __init__, "step": step, "__doc__": doc, "__module__": __name__})


QuantizedSGD = _optimizer("QuantizedSGD", torch.optim.SGD)
QuantizedAdam = _optimizer("QuantizedAdam", torch.optim.Adam)
QuantizedAdamW = _optimizer("QuantizedAdamW", torch.optim.AdamW)
QuantizedRMSprop = _optimizer("QuantizedRMSprop", torch.optim.RMSprop)
QuantizedAdagrad = _optimizer("QuantizedAdagrad", torch.optim.Adagrad)
QuantizedAdadelta = _optimizer("QuantizedAdadelta", torch.optim.Adadelta)
IQuantizedSGD = _optimizer("IQuantizedSGD", torch.optim.SGD)
IQuantizedAdam = _optimizer("IQuantizedAdam", torch.optim.Adam)
IQuantizedAdamW = _optimizer("IQuantizedAdamW", torch.optim.AdamW)
IQuantizedRMSprop = _optimizer("IQuantizedRMSprop", torch.optim.RMSprop)
IQuantizedAdagrad = _optimizer("IQuantizedAdagrad", torch.optim.Adagrad)
IQuantizedAdadelta = _optimizer("IQuantizedAdadelta", torch.optim.Adadelta)
