"""QPyTorch's ``OptimLP``: a torch optimizer whose gradients, states and weights pass through quantizers.

The quantizers are functions (``quantizer(...)`` from the facade, or any
tensor -> tensor callable), as in QPyTorch. Differences: every torch optimizer
works (QPyTorch accepts SGD and Adam only), the momentum quantizer rounds every
first- and second-moment state anynum knows (`anynum.optim.MOMENTUM_STATES`,
`anynum.optim.SECOND_MOMENT_STATES`), and ``state_dict`` saves the wrapped
optimizer's state and the accumulator copies (QPyTorch's saves neither).
``grad_scaling`` keeps QPyTorch's meaning: gradients are multiplied by it
before they are quantized and stay multiplied (use
`anynum.optim.QuantizedOptimizer` with ``grad_scale=`` for loss scaling that unscales).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import anynum as an
from anynum.errors import InputError

__all__ = ["OptimLP"]

QuantFn = Callable[[torch.Tensor], torch.Tensor] | None


class OptimLP(torch.optim.Optimizer):
    """Wrap `optim` so that each step quantizes gradients, accumulators, weights and momenta.

    Step order (as QPyTorch): ``grad = grad_quant(grad * grad_scaling)``; with an
    `acc_quant`, the full-precision accumulators replace the weights; the wrapped
    optimizer steps; ``acc = acc_quant(weight)``; ``weight = weight_quant(acc)``;
    every momentum state ``= momentum_quant(state)``. NaN/inf follow the quantizers.

    >>> from anynum.compat.qtorch import FloatingPoint
    >>> from anynum.compat.qtorch.quant import quantizer
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> bf16 = quantizer(FloatingPoint(8, 7), forward_rounding="nearest")
    >>> opt = OptimLP(torch.optim.SGD([w], lr=0.1), weight_quant=bf16)
    >>> w.grad = torch.tensor([0.3, -0.3]); opt.step()
    >>> w.tolist()
    [0.96875, 2.03125]
    """

    def __init__(
        self,
        optim: torch.optim.Optimizer,
        weight_quant: QuantFn = None,
        grad_scaling: float = 1.0,
        grad_quant: QuantFn = None,
        momentum_quant: QuantFn = None,
        acc_quant: QuantFn = None,
    ) -> None:
        if not isinstance(optim, torch.optim.Optimizer):
            raise InputError(f"OptimLP wraps a torch.optim.Optimizer, got {type(optim).__name__}.")
        if (
            isinstance(grad_scaling, bool)
            or not isinstance(grad_scaling, (int, float))
            or not grad_scaling > 0
        ):
            raise InputError(f"grad_scaling must be a positive number, got {grad_scaling!r}.")
        for name, fn in (
            ("weight_quant", weight_quant),
            ("grad_quant", grad_quant),
            ("momentum_quant", momentum_quant),
            ("acc_quant", acc_quant),
        ):
            if fn is not None and not callable(fn):
                raise InputError(
                    f"{name} must be a function tensor -> tensor (e.g. quantizer(...)), got {fn!r}."
                )
        super().__init__(optim.param_groups, optim.defaults)
        self.param_groups = optim.param_groups  # shared: LR schedulers on either object act on both
        self.state = optim.state
        self.optim = optim
        self.grad_scaling = grad_scaling
        self.weight_quant = weight_quant
        self.grad_quant = grad_quant
        self.momentum_quant = momentum_quant
        self.acc_quant = acc_quant
        self.momentum_keys = an.optim.MOMENTUM_STATES | an.optim.SECOND_MOMENT_STATES
        self.weight_acc: dict[torch.Tensor, torch.Tensor] = {}
        if acc_quant is not None:
            for p in self._params():
                self.weight_acc[p] = p.detach().clone()

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One quantized step of the wrapped optimizer (returns what its step returns)."""
        params = self._params()
        if self.grad_quant is not None:
            for p in params:
                if p.grad is not None:
                    p.grad.data = self.grad_quant(p.grad.data * self.grad_scaling)
        if self.acc_quant is not None:
            for p in params:
                p.data = self.weight_acc[p].data
        loss = self.optim.step(closure) if closure is not None else self.optim.step()
        if self.acc_quant is not None:
            for p in params:
                p.data = self.weight_acc[p].data = self.acc_quant(p.data).data
        if self.weight_quant is not None:
            for p in params:
                p.data = self.weight_quant(p.data).data
        if self.momentum_quant is not None:
            for p in params:
                state = self.optim.state.get(p, {})
                for key in self.momentum_keys & state.keys():
                    if isinstance(state[key], torch.Tensor) and state[key].is_floating_point():
                        state[key] = self.momentum_quant(state[key])
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state_dict plus the accumulator copies (in parameter order)."""
        sd = self.optim.state_dict()
        if self.acc_quant is not None:
            sd["weight_acc"] = [self.weight_acc[p] for p in self._params()]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        acc = state_dict.pop("weight_acc", None)
        self.optim.load_state_dict(state_dict)
        self.state = self.optim.state
        if acc is not None and self.acc_quant is not None:
            for p, a in zip(self._params(), acc):
                self.weight_acc[p] = a.detach().clone().to(p.device)

    def __repr__(self) -> str:
        return f"LP Optimizer: {self.optim!r}"
