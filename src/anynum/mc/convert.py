"""Conversions and printing: tensor -> components, between component dtypes, the correctly
rounded sum of the components (``MCTensor.to_tensor``, differentiable), exact values
(``MCTensor.to_mpmath``) and the text form (``repr``).
"""

from __future__ import annotations

from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc._core import Comps, info
from anynum.mc.eft import raw_two_sum
from anynum.mc.expansion import distill, pad, renormalize, sort_by_magnitude, vecsum

# dtype -> dtypes whose every value it represents exactly
_CONTAINS = {
    torch.float64: {torch.float64, torch.float32, torch.float16, torch.bfloat16},
    torch.float32: {torch.float32, torch.float16, torch.bfloat16},
    torch.float16: {torch.float16},
    torch.bfloat16: {torch.bfloat16},
}


def _common_work(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    for w in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        if a in _CONTAINS[w] and b in _CONTAINS[w]:
            return w
    return torch.float64  # pragma: no cover


def as_float_tensor(t: torch.Tensor) -> torch.Tensor:
    """Accept float tensors as they are; integer/bool tensors go through float64."""
    if t.is_complex():
        raise AnynumError(
            f"MCTensor holds real numbers; got a complex tensor ({t.dtype}). "
            "Split it into real and imaginary parts first."
        )
    if t.dtype in _CONTAINS:
        return t
    if t.is_floating_point():
        return t.to(torch.float64)
    return t.to(torch.float64)


def convert_comps(x: Comps, dtype: torch.dtype, nc: int) -> Comps:
    """Re-express an expansion with `nc` components of `dtype` (nearest, greedy)."""
    info(dtype)
    src = x[0].dtype
    if len(x) == 2 and nc == 2 and src == torch.float64 and dtype != src:
        return _dw_narrow(x[0], x[1], dtype)
    if src == dtype:
        if len(x) == nc:
            return tuple(x)
        if len(x) < nc:
            return pad(tuple(x), nc)
        return renormalize(list(x), nc)
    if src in _CONTAINS[dtype]:
        comps = [c.to(dtype) for c in x]
        if len(comps) == 1:
            return pad((comps[0],), nc)
        return renormalize(comps, nc)
    work = _common_work(src, dtype)
    terms = [c.to(work) for c in x]
    if len(terms) > 1:
        terms = vecsum(sort_by_magnitude(terms))
    out: list[torch.Tensor] = []
    for i in range(nc):
        c = terms[0].to(dtype)
        fin = torch.isfinite(c)
        out.append(c)
        if i + 1 == nc:
            break
        rem = torch.where(fin, terms[0] - c.to(work), torch.zeros_like(terms[0]))
        rest = [torch.where(fin, r, torch.zeros_like(r)) for r in terms[1:]]
        terms = vecsum(sort_by_magnitude([rem, *rest])) if rest else [rem]
    return tuple(out)


def _dw_narrow(h: torch.Tensor, l: torch.Tensor, dtype: torch.dtype) -> Comps:
    """A float64 double word as two components of a narrower dtype, with the operations of the
    general path of `convert_comps` (TwoSum, round, exact remainder, round) in fewer passes."""
    s, e = raw_two_sum(h, l)
    c0 = s.to(dtype)
    fin = torch.isfinite(c0)
    rem = torch.where(fin, s - c0.to(torch.float64), 0.0)
    c1 = (rem + torch.where(fin, e, 0.0)).to(dtype)
    return c0, c1


def from_tensor(t: torch.Tensor, dtype: torch.dtype, nc: int) -> Comps:
    t = as_float_tensor(t)
    if t.dtype == dtype or t.dtype in _CONTAINS[dtype]:
        return pad((t.to(dtype),), nc)
    return convert_comps((t,), dtype, nc)


def _odd(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int64) & 1) == 1


def round_sum(x: Comps, dtype: torch.dtype) -> torch.Tensor:
    """The sum of the components, correctly rounded (to nearest, ties to even) to `dtype`."""
    info(dtype)
    src = x[0].dtype
    if len(x) == 1:
        return x[0].to(dtype)
    if len(x) == 2 and src == dtype:
        return x[0] + x[1]
    if len(x) == 2 and src in _CONTAINS[dtype]:
        return x[0].to(dtype) + x[1].to(dtype)
    terms = [c.to(torch.float64) for c in x]
    finite = torch.ones_like(terms[0], dtype=torch.bool)
    for c in terms:
        finite = finite & torch.isfinite(c)
    naive = terms[0]
    for c in terms[1:]:
        naive = naive + c
    terms = [torch.where(finite, c, torch.zeros_like(c)) for c in terms]
    d = distill(terms)
    x0, x1 = d[0], d[1]
    x2 = d[2] if len(d) > 2 else torch.zeros_like(x0)
    inf = torch.full_like(x0, float("inf"))
    toward = torch.where(x1 > 0, inf, -inf)
    nxt = torch.nextafter(x0, toward)
    if dtype == torch.float64:
        tie = (x1 != 0) & ((nxt - x0) == 2 * x1)
        adjust = tie & (x2 != 0) & ((x2 > 0) == (x1 > 0))
        r = torch.where(adjust, nxt, x0)
    else:
        inexact = x1 != 0
        r = torch.where(inexact & ~_odd(x0), nxt, x0)  # round to odd in float64
        r = r.to(dtype)
    return torch.where(finite, r.to(dtype), naive.to(dtype))


class _RoundSum(torch.autograd.Function):
    """`round_sum` with the gradient passed to every component unchanged."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *comps: torch.Tensor) -> torch.Tensor:
        ctx.dtypes = [c.dtype for c in comps]
        return round_sum(tuple(comps), dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *(g.to(d) for d in ctx.dtypes))


def to_tensor(x: Comps, dtype: torch.dtype) -> torch.Tensor:
    """`round_sum`, differentiable: the gradient flows to every component.

    >>> import torch
    >>> from anynum.mc.convert import to_tensor
    >>> to_tensor((torch.tensor([1.0]), torch.tensor([2.0**-30])), torch.float64).item() == 1 + 2.0**-30
    True
    """
    info(dtype)
    if torch.is_grad_enabled() and any(c.requires_grad for c in x):
        return _RoundSum.apply(dtype, *x)
    with torch.no_grad():
        return round_sum(x, dtype)


def to_mpmath(x: Comps) -> list[Any]:
    """Exact values as nested lists of ``mpmath.mpf`` (needs mpmath; for checking).

    >>> import torch
    >>> from anynum.mc.convert import to_mpmath
    >>> to_mpmath((torch.tensor([0.5]), torch.tensor([0.25])))
    [mpf('0.75')]
    """
    try:
        import mpmath
    except ImportError as exc:  # pragma: no cover
        raise AnynumError("to_mpmath needs mpmath: pip install mpmath") from exc
    flat = [c.detach().to(torch.float64).reshape(-1).tolist() for c in x]
    with mpmath.workprec(2200):
        vals = [mpmath.fsum(mpmath.mpf(c[i]) for c in flat) for i in range(len(flat[0]))]
    if x[0].dim() == 0:
        return vals
    import numpy as np

    return np.array(vals, dtype=object).reshape(tuple(x[0].shape)).tolist()


def comps_repr(x: Comps, requires_grad: bool) -> str:
    """The text form of an MCTensor: its values rounded to float64, nc and the component dtype.

    >>> import torch
    >>> from anynum.mc.convert import comps_repr
    >>> comps_repr((torch.tensor([1.5]), torch.tensor([0.0])), False)
    'MCTensor([1.5000], nc=2, dtype=torch.float32)'
    """
    with torch.no_grad():
        val = round_sum(tuple(c.detach() for c in x), torch.float64)
    grad = ", requires_grad=True" if requires_grad else ""
    body = repr(val).replace("tensor(", "", 1)
    if body.endswith(")"):
        body = body[:-1]
    body = body.replace(", dtype=torch.float64", "")
    return f"MCTensor({body}, nc={len(x)}, dtype={x[0].dtype}{grad})"
