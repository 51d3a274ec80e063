"""Floating-point expansions: padding, renormalisation and nc >= 3 arithmetic.

An expansion is a tuple of tensors of one dtype whose exact sum is the value, largest
component first.  For nc >= 3 every partial sum and product is formed with error-free
transforms and the exact list of terms is then renormalised: sorted by magnitude, two
bottom-up VecSum passes, and the discarded tail folded into the last kept component, which
keeps everything above ``u**nc`` relative.  These bounds are measured (docs/mc.md), in the
spirit of Joldes, Muller, Popescu, Tucker, "Arithmetic algorithms for extended precision
using floating-point expansions", IEEE TC 65(4), 2016.  Inputs are assumed finite; the
callers patch NaN/inf.
"""

from __future__ import annotations

import torch

from anynum.mc._core import Comps
from anynum.mc.eft import raw_two_prod, raw_two_sum

__all__ = ["distill", "exp_add", "exp_div", "exp_mul", "pad", "renormalize", "sort_by_magnitude",
           "vecsum"]


def pad(x: Comps, nc: int) -> Comps:
    """Pad with zero components (or keep) up to nc; never truncates.

    >>> import torch
    >>> from anynum.mc.expansion import pad
    >>> [c.tolist() for c in pad((torch.tensor([1.0]),), 2)]
    [[1.0], [0.0]]
    """
    if len(x) >= nc:
        return x
    z = torch.zeros_like(x[0])
    return tuple(x) + (z,) * (nc - len(x))


def vecsum(terms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Bottom-up VecSum: exact, returns s_0 ~ total, then the errors.

    >>> import torch
    >>> from anynum.mc.expansion import vecsum
    >>> [t.item() for t in vecsum([torch.tensor(1.0), torch.tensor(2.0**-30)])]
    [1.0, 9.313225746154785e-10]
    """
    n = len(terms)
    if n == 1:
        return list(terms)
    out: list[torch.Tensor] = [terms[0]] * n
    s = terms[-1]
    for i in range(n - 2, -1, -1):
        s, e = raw_two_sum(terms[i], s)
        out[i + 1] = e
    out[0] = s
    return out


def sort_by_magnitude(terms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sort the terms elementwise by decreasing magnitude (exact permutation).

    >>> import torch
    >>> from anynum.mc.expansion import sort_by_magnitude
    >>> [t.item() for t in sort_by_magnitude([torch.tensor(1.0), torch.tensor(-3.0)])]
    [-3.0, 1.0]
    """
    if len(terms) <= 1:
        return list(terms)
    if len(terms) == 2:  # the same permutation as the stable sort below, without sorting
        a, b = torch.broadcast_tensors(*terms)
        an, bn = torch.isnan(a), torch.isnan(b)
        swap = (a.abs() < b.abs()) | (bn & ~an)  # descending; NaN counts as the largest
        return [torch.where(swap, b, a), torch.where(swap, a, b)]
    st = torch.stack(torch.broadcast_tensors(*terms))
    idx = st.abs().argsort(dim=0, descending=True, stable=True)
    st = st.gather(0, idx)
    return list(st.unbind(0))


def renormalize(terms: list[torch.Tensor], nc: int) -> Comps:
    """Compress an exact list of terms to an nc-component expansion (largest first).

    >>> import torch
    >>> from anynum.mc.expansion import renormalize
    >>> [c.item() for c in renormalize([torch.tensor(1.0), torch.tensor(1.0)], 2)]
    [2.0, 0.0]
    """
    terms = sort_by_magnitude(list(terms))
    terms = vecsum(terms)
    terms = vecsum(terms)
    if len(terms) > nc:
        terms = sort_by_magnitude(terms)  # pushes exact zeros to the end
        terms = vecsum(terms)
        terms = vecsum(terms)
        tail = terms[nc]
        for t in terms[nc + 1 :]:
            tail = tail + t
        last = terms[nc - 1] + tail
        terms = [*terms[: nc - 1], last]
        terms = vecsum(terms)
    return pad(tuple(terms), nc)


def distill(terms: list[torch.Tensor], max_passes: int | None = None) -> list[torch.Tensor]:
    """Repeat VecSum until nothing changes: then x_i = RN(x_i + x_{i+1}) for every i.

    >>> import torch
    >>> from anynum.mc.expansion import distill
    >>> [t.item() for t in distill([torch.tensor(2.0**-60), torch.tensor(1.0)])]
    [1.0, 8.673617379884035e-19]
    """
    terms = sort_by_magnitude(list(terms))
    cap = max_passes if max_passes is not None else 4 * len(terms) + 8
    for _ in range(cap):
        new = vecsum(terms)
        same = all(torch.equal(a, b) for a, b in zip(new, terms))
        terms = new
        if same:
            break
    return terms


def exp_add(x: Comps, y: Comps, nc: int) -> Comps:
    """Sum of two expansions as an nc-component expansion."""
    return renormalize([*x, *y], nc)


def exp_mul(x: Comps, y: Comps, nc: int) -> Comps:
    """Product of two expansions: exact partial products of order < nc, plain ones of order nc."""
    terms: list[torch.Tensor] = []
    low: list[torch.Tensor] = []
    for i, xi in enumerate(x):
        for j, yj in enumerate(y):
            if i + j < nc:
                p, e = raw_two_prod(xi, yj)
                terms.append(p)
                low.append(e)
            elif i + j == nc:
                low.append(xi * yj)
    return renormalize(terms + low, nc)


def exp_div(x: Comps, y: Comps, nc: int) -> Comps:
    """Long division: nc+1 quotient terms, each removing ~p bits of the remainder."""
    q: list[torch.Tensor] = []
    r = pad(x, nc)
    for _ in range(nc + 1):
        qi = r[0] / y[0]
        q.append(qi)
        prod = exp_mul(y, (qi,), nc)
        r = exp_add(r, tuple(-t for t in prod), nc)
    return renormalize(q, nc)
