"""Matrix products on MCTensor: matmul, mm, mv, bmm, dot, addmm, F.linear, F.embedding
(Ozaki schemes in `anynum.mc.linalg`).  Registered in the op table.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from anynum.errors import AnynumError
from anynum.mc import engine as engines
from anynum.mc import linalg
from anynum.mc._core import Comps
from anynum.mc.ops.arithmetic import add, mul
from anynum.mc.ops.rule import apply, fix, is_mc, mc_args
from anynum.mc.optable import implements
from anynum.mc.tensor import MCTensor, wrap

__all__ = ["addmm", "bmm", "dot", "embedding", "linear", "matmul", "mm", "mv"]


@implements(torch.matmul, torch.Tensor.matmul)
def matmul(x: Any, y: Any, *, engine: str | None = None) -> MCTensor:
    """``x @ y`` (torch.matmul semantics) for MC x tensor, tensor x MC and MC x MC, with
    Ozaki error-free slicing into exact GEMMs (see `anynum.mc.linalg`).  `engine`
    ``"int8"`` (exact int8 GEMMs, default), ``"native"`` (component dtype GEMMs) or
    ``"wide"``.  NaN/inf anywhere in a row/column give the native result of the leading components there.

    >>> import torch
    >>> from anynum import mc
    >>> a = mc.MCTensor(torch.tensor([[1.0, 2.0**-30]]))
    >>> b = torch.tensor([[1.0], [1.0]])
    >>> (a @ b).item() == 1.0 + 2.0**-30
    True
    """
    if engine is not None and engine not in engines.ENGINES:
        raise AnynumError(
            f"mc.matmul(engine=...) must be one of {', '.join(engines.ENGINES)}; got {engine!r}. "
            "Leave it out to use the engine chosen for this machine."
        )
    (a, b), nc, _ = mc_args(x, y)
    if a[0].dim() == 0 or b[0].dim() == 0:
        raise AnynumError("matmul needs operands with at least one dimension")
    sa, sb = a[0].shape, b[0].shape
    inner_b = sb[-2] if len(sb) > 1 else sb[0]
    if sa[-1] != inner_b:
        raise AnynumError(
            f"mc.matmul: the inner dimensions differ: x is {tuple(sa)} and y is {tuple(sb)}, so x's "
            f"last dimension ({sa[-1]}) must equal y's {'second-to-last' if len(sb) > 1 else 'only'} "
            f"dimension ({inner_b}); transpose or reshape one of them (torch.matmul's rules)."
        )
    try:
        torch.broadcast_shapes(sa[:-2], sb[:-2])
    except RuntimeError:
        raise AnynumError(
            f"mc.matmul: the batch dimensions of x {tuple(sa)} and y {tuple(sb)} do not broadcast "
            f"({tuple(sa[:-2])} against {tuple(sb[:-2])}); make them equal or 1 (torch.matmul's rules)."
        ) from None

    def fwd(p: Comps, q: Comps) -> Comps:
        if nc == 1:
            return (torch.matmul(p[0], q[0]),)
        # finite sums prove every entry finite (one cheap pass each); else check entrywise
        if math.isfinite(p[0].sum().item()) and math.isfinite(q[0].sum().item()):
            return linalg.matmul(p, q, nc, engine)
        fa = torch.isfinite(p[0])
        fb = torch.isfinite(q[0])
        p2 = tuple(torch.where(fa, c, torch.zeros_like(c)) for c in p)
        q2 = tuple(torch.where(fb, c, torch.zeros_like(c)) for c in q)
        res = linalg.matmul(p2, q2, nc, engine)
        nat = torch.matmul(p[0], q[0])
        bad = ~torch.isfinite(nat)
        return fix(res, lambda: nat, bad)

    return apply(fwd, torch.matmul, a, b)


@implements(torch.mm, torch.Tensor.mm)
def mm(x: Any, y: Any) -> MCTensor:
    """2-D matrix product (see :func:`matmul`)."""
    if len(x.shape) != 2 or len(y.shape) != 2:
        raise AnynumError("mm expects two 2-D operands")
    return matmul(x, y)


@implements(torch.mv, torch.Tensor.mv)
def mv(x: Any, y: Any) -> MCTensor:
    """Matrix-vector product (see :func:`matmul`)."""
    if len(x.shape) != 2 or len(y.shape) != 1:
        raise AnynumError("mv expects a 2-D matrix and a 1-D vector")
    return matmul(x, y)


@implements(torch.bmm, torch.Tensor.bmm)
def bmm(x: Any, y: Any) -> MCTensor:
    """Batched matrix product of 3-D operands (see :func:`matmul`)."""
    if len(x.shape) != 3 or len(y.shape) != 3:
        raise AnynumError("bmm expects two 3-D operands")
    return matmul(x, y)


@implements(torch.dot, torch.inner, torch.Tensor.dot)
def dot(x: Any, y: Any) -> MCTensor:
    """Dot product of 1-D operands in MC precision (not a plain float sum).

    >>> import torch
    >>> from anynum import mc
    >>> a = mc.MCTensor(torch.tensor([1.0, 1e-9, -1.0]))
    >>> mc.dot(a, torch.ones(3)).item() == float(torch.tensor(1e-9))
    True
    """
    if len(x.shape) != 1 or len(y.shape) != 1:
        raise AnynumError("dot expects two 1-D operands")
    return matmul(x, y)


@implements(torch.addmm, torch.Tensor.addmm)
def addmm(inp: Any, x: Any, y: Any, *, beta: Any = 1, alpha: Any = 1) -> MCTensor:
    """``beta * inp + alpha * (x @ y)`` in MC arithmetic (see :func:`matmul`)."""
    prod = matmul(x, y) if is_mc(x) or is_mc(y) else MCTensor(torch.mm(x, y))
    if alpha != 1:
        prod = mul(prod, alpha)
    if beta == 0:
        return prod
    if beta != 1:
        inp = mul(inp, beta) if is_mc(inp) else inp * beta
    return add(prod, inp)


@implements(F.linear)
def linear(inp: Any, weight: Any, bias: Any = None) -> MCTensor:
    """``inp @ weight.T + bias`` with MC weights and/or input (see :func:`matmul`).

    >>> import torch
    >>> from anynum import mc
    >>> w = mc.MCTensor(torch.ones(3, 2))
    >>> torch.nn.functional.linear(torch.ones(1, 2), w).tolist()
    [[2.0, 2.0, 2.0]]
    """
    in_features, w_shape = inp.shape[-1] if inp.dim() else None, tuple(weight.shape)
    if weight.dim() not in (1, 2) or in_features != w_shape[-1]:
        raise AnynumError(
            f"F.linear: the weight must be (out_features, in_features) or (in_features,), with "
            f"in_features equal to the input's last dimension; got input {tuple(inp.shape)} and "
            f"weight {w_shape}; pass a weight of shape (out_features, {in_features}) "
            "(torch.nn.functional.linear's rule)."
        )
    if weight.dim() == 1:
        wt = weight
    else:
        wt = weight.mT if is_mc(weight) else weight.transpose(-1, -2)
    out = matmul(inp, wt)
    if bias is not None:
        out = add(out, bias)
    return out


@implements(F.embedding)
def embedding(inp: torch.Tensor, weight: MCTensor, *args: Any, **kwargs: Any) -> MCTensor:
    """Row lookup in an MC weight table (exact; per-component ``F.embedding``)."""
    if not is_mc(weight):
        raise AnynumError("mc embedding expects an MCTensor weight")
    return wrap(tuple(F.embedding(inp, c, *args, **kwargs) for c in weight.components()))
