"""The int8 Ozaki engine of MC matrix products: exact int8 digit GEMMs (``torch._int_mm``).

Every row of the left operand and every column of the right one gets an exponent ``e`` (all
its components are below ``2**e``).  Each component is scaled by ``2**(7 - e)`` (exact) and
cut into int8 digits on one grid: ``q = trunc(r)`` (the float -> int8 conversion truncates,
``|r| < 128``, exact) and ``r <- 128 frac(r)`` (exact), so the row equals
``sum_s q_s 2**(e - 7 - 7s)`` up to ``2**(e - 7L)`` per component, with
``L = ceil((nc p + 10) / 7)`` levels.  Digit products are computed by ``torch._int_mm``
(int8 x int8 -> int32, exact), one GEMM per (left digit, right component) over just the pairs
with level sum ``< L``; the exact integer sums per anti-diagonal are combined exactly in int64
(:func:`combine_diagonals`) and rounded to an MC result.  No floating-point GEMM and no float
type wider than the components' work dtype (float32 for float16/bfloat16) is used.  The error
bound, shared with the float engine, is proven in `anynum.mc.linalg`.
"""

from __future__ import annotations

import math

import torch

from anynum.mc._core import Comps, exponent, info, ldexp
from anynum.mc.batch2d import batched
from anynum.mc.convert import convert_comps
from anynum.mc.ozaki_float import sum_terms
from anynum.mc.scratch import POOL

__all__ = ["INT_K", "combine_diagonals", "matmul_int8"]

# Digits are truncated 7-bit signed integers (|q| <= 127), so one digit product is at most
# 127**2 < 2**14 and an int32 dot product of length <= INT_K = 2**17 is exact
# (127**2 * 2**17 = 2_114_060_288 < 2**31 - 1); longer inner dimensions are cut into
# chunks of INT_K whose int32 results are summed in int64.
INT_K = 1 << 17
_WORK = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _pow2(ex: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """2**ex as `dtype` if every exponent gives a normal number, else None."""
    inf = info(dtype)
    if ex.numel() and (int(ex.min()) < inf.emin or int(ex.max()) > inf.emax):
        return None
    return torch.exp2(ex.to(dtype))


def _digit_slices(x: Comps, levels: int) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Cut the rows of an (R, k) expansion into int8 digits on one per-row grid.

    With ``e`` the per-row exponent (all components of the row are below ``2**e``), the
    digit of level s is an int8 matrix ``q`` with weight ``2**(e - 7 - 7s)``: the scaled
    remainder r (|r| < 128) is truncated to ``q = trunc(r)`` (an exact conversion), and the
    next remainder ``128 * frac(r)`` is exact too.  Each component is cut separately,
    starting at the first level whose grid reaches it, so a row is represented by
    ``sum_s q_s 2**(e-7-7s)`` up to less than ``nc * 2**(e - 7 levels)``.
    Returns (levels of the slices, component by component; int8 stack (S, R, k) from the scratch pool,
    to be given back; e of shape (R, 1)).
    """
    amaxes = []
    for c in x:
        buf = POOL.take(c.shape, c)
        amaxes.append(torch.abs(c, out=buf).amax(dim=-1, keepdim=True))
        POOL.give(buf)
    rmax = amaxes[0]
    for am in amaxes[1:]:
        rmax = torch.maximum(rmax, am)
    e = exponent(rmax)
    plan: list[tuple[int, int]] = []  # (first level, component)
    for i in range(len(x)):
        s0 = 0
        if i:
            bound = float(ldexp(amaxes[i], -e).max()) if amaxes[i].numel() else 0.0
            if bound == 0.0:
                continue
            s0 = max(0, math.ceil((-math.log2(bound) - 7) / 7))
            if s0 >= levels:
                continue
        plan.append((s0, i))
    order = [(s, i) for s0, i in plan for s in range(s0, levels)]  # by component, then level
    pos = {si: j for j, si in enumerate(order)}
    like = torch.empty(0, dtype=torch.int8, device=x[0].device)
    stack = POOL.take(torch.Size((len(order), *x[0].shape)), like)
    for s0, i in plan:
        c = x[i]
        ex = 7 + 7 * s0 - e
        f = _pow2(ex, c.dtype)
        r = POOL.take(c.shape, c)
        if f is not None:
            torch.mul(c, f, out=r)
        else:
            r.copy_(ldexp(c, ex))
        for s in range(s0, levels):
            stack[pos[(s, i)]].copy_(r)  # truncation toward zero, |r| < 128
            if s + 1 < levels:
                r.frac_().mul_(128.0)
        POOL.give(r)
    return [s for s, _ in order], stack, e


def _ozaki_int2d(a: Comps, b: Comps, nc_acc: int, levels: int, work: torch.dtype) -> Comps:
    """Exact int8 digit GEMMs (torch._int_mm) for 2-D a (m, k) and b (k, n) in `work` dtype."""
    m, k = a[0].shape
    n = b[0].shape[-1]
    dev = a[0].device
    if m == 0 or n == 0 or k == 0:
        z = torch.zeros(m, n, dtype=work, device=dev)
        return (z,) + (torch.zeros_like(z),) * (nc_acc - 1)
    la_s, sa, ea = _digit_slices(a, levels)
    lb_s, sb, eb = _digit_slices(tuple(c.transpose(-1, -2) for c in b), levels)
    # The B slices of one component have consecutive levels s0..levels-1 (rows j0..j0+cnt
    # of the stack).  One GEMM per (A slice, B component) over just the digit pairs above
    # the cut: P = digits_a @ [digits_b of levels l0..], exact in int32 per chunk of INT_K.
    na, nbs = len(la_s), len(lb_s)
    bf = sb.view(nbs * n, k)
    groups = [j for j in range(nbs) if j == 0 or lb_s[j] != lb_s[j - 1] + 1]
    ends = [*groups[1:], nbs]
    spans = [(j0, lb_s[j0], j1 - j0) for j0, j1 in zip(groups, ends)]
    # int32 holds the diagonal sums if even the sum over all pairs cannot overflow
    acc_t = torch.int32 if na * nbs * k * 127 * 127 < 2**31 else torch.int64
    acc = torch.zeros(levels, m, n, dtype=acc_t, device=dev)  # diagonal d = acc[d]
    for ia, la in enumerate(la_s):
        for j0, l0, cnt in spans:
            cnt = min(cnt, levels - la - l0)
            if cnt <= 0:
                continue
            bq = bf[j0 * n : (j0 + cnt) * n]
            if k <= INT_K:
                prod = torch._int_mm(sa[ia], bq.T)
            else:
                prod = torch.zeros(m, cnt * n, dtype=torch.int64, device=dev)
                for k0 in range(0, k, INT_K):
                    prod += torch._int_mm(sa[ia, :, k0 : k0 + INT_K], bq[:, k0 : k0 + INT_K].T)
            acc[la + l0 : la + l0 + cnt].add_(prod.view(m, cnt, n).transpose(0, 1))
    POOL.give(sa, sb)
    return combine_diagonals(acc, ea, eb, nc_acc, work)


def combine_diagonals(acc: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, nc_acc: int,
                       work: torch.dtype) -> Comps:
    """sum_d acc[d] 2**(ea + eb - 14 - 7d) as an nc_acc-component expansion of `work`.

    The exact integer diagonal sums are first combined exactly in int64 by Horner's rule in
    groups of g consecutive diagonals, ``G_j = sum_t acc[jg + t] 2**(7(g - 1 - t))``, with g
    as large as the largest |acc| allows below 2**62 (float32 components, k = 200: g = 5, so
    9 diagonals give 2 groups).  Each G_j is split exactly into components of `work`
    (RN(G), RN(G - RN(G)), ...), scaled by ``2**(ea + eb - 14 - 7(jg + g - 1))`` (exact
    unless the result is subnormal) and the few resulting terms are summed in MC arithmetic,
    smallest first.
    """
    levels, m, n = acc.shape
    lo, hi = torch.aminmax(acc)
    amax = max(int(hi), -int(lo))
    g = max(1, min(levels, (61 - amax.bit_length()) // 7 + 1))
    base = ea.view(m, 1) + eb.view(1, n) - 14
    bmin, bmax = int(base.min()), int(base.max())
    fi = info(work)
    groups: list[list[torch.Tensor]] = []  # exact parts of each group, largest first
    for d0 in range(0, levels, g):
        d1 = min(levels, d0 + g)
        grp = acc[d0].to(torch.int64, copy=True)  # never mul_ into acc itself
        for d in range(d0 + 1, d1):  # Horner, exact: |grp| < 2**62
            grp.mul_(128).add_(acc[d])
        ex = base - 7 * (d1 - 1)  # 2**ex is the weight of the group's lowest diagonal
        if bmin - 7 * (d1 - 1) >= fi.emin and bmax - 7 * (d1 - 1) <= fi.emax:
            f: torch.Tensor | None = torch.exp2(ex.to(work))
        else:
            f = None
        parts = []
        rest = grp
        while True:
            c = rest.to(work)
            parts.append(c * f if f is not None else ldexp(c, ex))
            rest = rest - c.to(torch.int64)
            if not bool(rest.any()):
                break
        groups.append(parts)
    # smallest first: lower groups, then lower parts within a group
    terms = [t for parts in groups[::-1] for t in parts[::-1]]
    return sum_terms(terms, nc_acc)


def matmul_int8(a: Comps, b: Comps, nc: int) -> Comps:
    """Int8 Ozaki product of a (..., m, k) and b (..., k, n) with nc-component result.

    >>> import torch
    >>> from anynum.mc.ozaki_int8 import matmul_int8
    >>> a = (torch.tensor([[1.0, 2.0**-30]]), torch.zeros(1, 2))
    >>> r = matmul_int8(a, (torch.ones(2, 1),), 2)
    >>> r[0].item(), r[1].item() == 2.0**-30
    (1.0, True)
    """
    t = a[0].dtype
    work = _WORK.get(t, t)
    pt = info(t).precision
    levels = math.ceil((nc * pt + 10) / 7)
    nc_acc = nc if work == t else max(1, math.ceil(nc * pt / info(work).precision)) + (1 if nc > 1 else 0)
    a = tuple(c.to(work) for c in a)
    b = tuple(c.to(work) for c in b)
    res = batched(lambda p, q: _ozaki_int2d(p, q, nc_acc, levels, work), a, b)
    if work != t:
        res = convert_comps(res, t, nc)
    return res
