"""`an.matmul`: one matrix product with a chosen operand format and accumulation.

The functional form of the rules `an.emulate` applies to dot products
(`anynum.emulate.accumulate`), with gradients computed by the same rules.
"""

from __future__ import annotations

from typing import Any

import torch

from anynum.emulate.accumulate import Accumulation, Accumulator
from anynum.emulate.grid import Grid, elementwise_format
from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.rounding import RoundingLike, parse_rounding

__all__ = ["matmul"]

_F64 = torch.float64


class _MatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, plan: _MatmulPlan) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, b)
        ctx.plan = plan
        return plan.run(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        plan: _MatmulPlan = ctx.plan
        ga = plan.run(grad, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        gb = plan.run(a.transpose(-1, -2), grad) if ctx.needs_input_grad[1] else None
        if ga is not None and ga.shape != a.shape:
            ga = ga.sum_to_size(a.shape)
        if gb is not None and gb.shape != b.shape:
            gb = gb.sum_to_size(b.shape)
        return ga, gb, None


class _MatmulPlan:
    def __init__(self, fmt: Format | None, acc: Accumulation, rounding: RoundingLike, seed: int | None):
        self.fmt = fmt
        grid_fmt = elementwise_format(fmt) if fmt is not None else None
        mode = parse_rounding(rounding)
        self.out = Grid(grid_fmt if grid_fmt is not None else lookup_format("fp64"), mode, seed=seed)
        self.block = fmt if isinstance(fmt, Block) else None
        self.acc = Accumulator(acc, self.out)

    def run(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = torch.result_type(a, b)
        a64, b64 = a.detach().to(_F64), b.detach().to(_F64)
        if self.fmt is not None:
            a64, b64 = self.out.round(a64), self.out.round(b64)
        if self.block is not None:
            a64 = self.out.round_blocks(a64, self.block, -1)
            b64 = self.out.round_blocks(b64, self.block, -2)
        vec_a, vec_b = a64.dim() == 1, b64.dim() == 1
        if vec_a:
            a64 = a64.unsqueeze(0)
        if vec_b:
            b64 = b64.unsqueeze(-1)
        y = self.acc.dot(a64, b64, self.out)
        if vec_a:
            y = y.squeeze(-2)
        if vec_b:
            y = y.squeeze(-1)
        return self.out.round_to(y, dtype)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    fmt: Format | str | None = None,
    accumulate: Format | str | None = None,
    order: str | int = "sequential",
    fma: bool = False,
    rounding: RoundingLike = "nearest",
    seed: int | None = None,
) -> torch.Tensor:
    """``a @ b`` with chosen operand format and accumulation (torch.matmul shapes and broadcasting).

    `fmt` rounds both operands and the result (a Block format quantizes the
    operands in blocks along the reduction axis and rounds the result to FP32);
    None leaves the operands as given and rounds the result to float64 before
    casting to the operands' dtype. `accumulate`, `order` and `fma` are those of
    `Accumulation` (``"quire"`` needs a Posit `fmt`). Gradients flow, computed
    by the same rules. NaN/inf propagate as in float arithmetic (NaR for posits);
    overflow follows the format's default policy.

    >>> import torch, anynum as an
    >>> a = torch.tensor([[1.0, 2.0**-12, 2.0**-12, 2.0**-12, 2.0**-12]])
    >>> b = torch.ones(5, 1)
    >>> an.matmul(a, b, fmt="posit(16,2)", accumulate="posit(16,2)").item()   # each 2**-12 lost
    1.0
    >>> an.matmul(a, b, fmt="posit(16,2)", accumulate="quire").item()         # exact, rounded once
    1.0009765625
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise AnynumError(
            f"an.matmul expected two torch tensors, received {type(a).__name__} and {type(b).__name__}. "
            "Fix: torch.as_tensor(...) first."
        )
    for name, t in (("a", a), ("b", b)):
        if not t.is_floating_point():
            raise AnynumError(
                f"an.matmul expected floating tensors, received {name} of dtype {t.dtype}. "
                f"Fix: {name}.float()."
            )
    if a.dim() == 0 or b.dim() == 0:
        raise AnynumError("an.matmul expected tensors of at least one dimension, received a 0-d tensor.")
    resolved = lookup_format(fmt) if fmt is not None else None
    acc = Accumulation.resolve(accumulate, order, fma, result_format=resolved)
    if acc.kind == "quire" and resolved is None:
        raise AnynumError(
            "accumulate='quire' expected a Posit fmt= (the quire rounds once onto it), received fmt=None. "
            "Fix: an.matmul(a, b, fmt='posit(16,2)', accumulate='quire')."
        )
    plan = _MatmulPlan(resolved, acc, rounding, seed)
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        out: torch.Tensor = _MatmulFn.apply(a, b, plan)
        return out
    return plan.run(a, b)
