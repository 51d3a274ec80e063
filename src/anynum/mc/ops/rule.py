"""The generic rule every MC op follows: promote the operands to components, run the MC
algorithm without recording a graph inside one autograd Function, patch NaN/inf.

* Promotion (:func:`mc_args`): MC with MC of different nc promotes to the larger nc;
  different component dtypes or devices raise `AnynumError`; plain tensors and Python
  numbers are converted to the MC dtype, exactly when they fit in nc components (a tensor
  of the component dtype stays one component, so the cheaper MC-with-float algorithms run).
* Autograd (:func:`apply`): the forward runs the MC algorithm under ``no_grad``; the backward
  differentiates the *native* operation on the leading components, and every component of an
  input receives that gradient (the derivative with respect to the value).
* NaN/inf (:func:`fix`): where the MC result is not finite, or an input is outside the
  function's domain, the result is the native result of the leading components with zero
  lower components, so IEEE semantics carry over.

These names are package-internal (used by the modules of `anynum.mc.ops`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc import arith
from anynum.mc._core import Comps, scalar_comps
from anynum.mc.convert import as_float_tensor, from_tensor
from anynum.mc.tensor import MCTensor, wrap

__all__ = ["apply", "comps_list", "fix", "is_mc", "mc_args", "operand_comps", "positive", "promote",
           "unary"]


class _MCFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fwd: Callable[..., Comps], native: Callable[..., torch.Tensor],
                sizes: tuple[int, ...], *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        groups = _regroup(flat, sizes)
        out = fwd(*groups)
        ids = {id(f) for f in flat}
        out = tuple(o.clone() if id(o) in ids else o for o in out)
        ctx.native = native
        ctx.sizes = sizes
        ctx.save_for_backward(*[g[0] for g in groups])
        return out

    @staticmethod
    def backward(ctx: Any, *gouts: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        g = gouts[0]
        leads = ctx.saved_tensors
        sizes = ctx.sizes
        needs = []
        pos = 3
        for s in sizes:
            needs.append(any(ctx.needs_input_grad[pos : pos + s]))
            pos += s
        with torch.enable_grad():
            vals = [v.detach().requires_grad_(n) for v, n in zip(leads, needs)]
            y = ctx.native(*vals)
            if g is None:
                g = torch.zeros_like(y)
            wanted = [v for v, n in zip(vals, needs) if n]
            grads = torch.autograd.grad(y, wanted, g.to(y.dtype), allow_unused=True)
        res: list[torch.Tensor | None] = [None, None, None]
        it = iter(grads)
        for s, n, v in zip(sizes, needs, vals):
            gi = next(it) if n else None
            if gi is None and n:
                gi = torch.zeros_like(v)
            res.extend([gi] * s)
        return tuple(res)


def _regroup(flat: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[Comps]:
    out, pos = [], 0
    for s in sizes:
        out.append(tuple(flat[pos : pos + s]))
        pos += s
    return out


def fix(res: Comps, native: Callable[[], torch.Tensor], bad: torch.Tensor | None = None) -> Comps:
    """Replace entries whose MC result is not finite (or flagged `bad`) by the native result.

    >>> import torch
    >>> from anynum.mc.ops.rule import fix
    >>> r = fix((torch.tensor([float("inf"), 1.0]), torch.tensor([0.5, 0.0])),
    ...         lambda: torch.tensor([float("inf"), 1.0]))
    >>> r[1].tolist()
    [0.0, 0.0]
    """
    if bad is None:
        if bool(torch.isfinite(res[0].sum())):
            return res
        badm = ~torch.isfinite(res[0])
    else:
        badm = bad | ~torch.isfinite(res[0])
        if not bool(badm.any()):
            return res
    nat = native().to(res[0].dtype)
    badm = badm | ~torch.isfinite(nat)
    first = torch.where(badm, nat, res[0])
    return (first, *(torch.where(badm, torch.zeros_like(c), c) for c in res[1:]))


def apply(fwd: Callable[..., Comps], native: Callable[..., torch.Tensor], *ops: Comps) -> MCTensor:
    """Run ``fwd(*ops)`` (component tuples) as one differentiable op whose backward is `native`'s.

    >>> import torch
    >>> from anynum.mc.ops.rule import apply
    >>> apply(lambda p: tuple(-c for c in p), torch.neg, (torch.tensor([2.0]),)).item()
    -2.0
    """
    flat = [c for op in ops for c in op]
    if torch.is_grad_enabled() and any(c.requires_grad for c in flat):
        out = _MCFunction.apply(fwd, native, tuple(len(o) for o in ops), *flat)
    else:
        with torch.no_grad():
            out = fwd(*ops)
    return wrap(tuple(out))


# ----------------------------------------------------------------- operand promotion
def is_mc(x: Any) -> bool:
    """Whether `x` is an MCTensor."""
    return isinstance(x, MCTensor)


def operand_comps(v: Any, dtype: torch.dtype, nc: int, device: torch.device) -> Comps:
    """An operand as components of `dtype`: one component when it fits exactly, else up to nc.

    >>> import torch
    >>> from anynum.mc.ops.rule import operand_comps
    >>> len(operand_comps(0.5, torch.float32, 2, torch.device("cpu")))
    1
    >>> len(operand_comps(0.1, torch.float32, 2, torch.device("cpu")))
    2
    """
    if isinstance(v, MCTensor):
        return v.components()
    if isinstance(v, torch.Tensor):
        if v.device != device:
            raise AnynumError(
                f"operands are on different devices ({device} and {v.device}); move one with .to()"
            )
        t = as_float_tensor(v)
        if t.dtype == dtype:
            return (t,)
        c = from_tensor(t, dtype, nc)
        if len(c) == 1:
            return c
        return c if bool(torch.stack([x != 0 for x in c[1:]]).any()) else (c[0],)
    if isinstance(v, (bool, int, float)):
        t = torch.tensor(float(v), dtype=dtype, device=device)
        if float(t.item()) == v or v != v:
            return (t,)
        return scalar_comps(v, dtype, nc, device)
    raise AnynumError(
        f"cannot combine an MCTensor with {type(v).__name__}; expected an MCTensor, a torch.Tensor "
        "or a Python number"
    )


def promote(*args: Any) -> tuple[list[Comps], int, torch.dtype]:
    """Components of every operand, the common nc and the component dtype (see module doc)."""
    mcs = [a for a in args if is_mc(a)]
    if not mcs:
        raise AnynumError("internal: no MCTensor operand")  # pragma: no cover
    dtype = mcs[0].dtype
    device = mcs[0].device
    for m in mcs[1:]:
        if m.dtype != dtype:
            raise AnynumError(
                f"MCTensor component dtypes differ ({dtype} and {m.dtype}); anynum does not "
                "promote between component dtypes. Convert one with x.to(dtype) first."
            )
        if m.device != device:
            raise AnynumError(
                f"MCTensors are on different devices ({device} and {m.device}); use .to(device)"
            )
    nc = max(m.nc for m in mcs)
    out = []
    for a in args:
        c = operand_comps(a, dtype, nc, device)
        if 1 < len(c) < nc:
            c = arith.pad(c, nc)
        out.append(c)
    return out, nc, dtype


def mc_args(*args: Any) -> tuple[list[Comps], int, torch.dtype]:
    """:func:`promote`, after checking that at least one operand is an MCTensor."""
    if not any(is_mc(a) for a in args):
        raise AnynumError("expected at least one MCTensor operand")
    return promote(*args)


def comps_list(seq: Sequence[Any]) -> tuple[list[Comps], int]:
    """Promoted, padded components of a sequence of operands (for cat/stack)."""
    mcs = [s for s in seq if is_mc(s)]
    comps, nc, _ = promote(*seq) if mcs else ([], 1, None)
    return [arith.pad(c, nc) for c in comps], nc


# ----------------------------------------------------------------- unary functions
def unary(x: MCTensor, algo: Callable[[Comps, int], Comps], native: Callable[..., torch.Tensor],
          domain: Callable[[torch.Tensor], torch.Tensor] | None = None) -> MCTensor:
    """An elementwise function: `algo` on components, `native` outside `domain` and for NaN/inf."""
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        res = algo(p, nc) if nc > 1 else (native(p[0]),)
        bad = None if domain is None else ~domain(p[0])
        return fix(arith.pad(res, nc), lambda: native(p[0]), bad)

    return apply(fwd, native, x.components())


def positive(v: torch.Tensor) -> torch.Tensor:
    """Finite and > 0 (the domain of log, sqrt and pow's base)."""
    return (v > 0) & torch.isfinite(v)
