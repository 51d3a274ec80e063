"""Multi-component arithmetic on component tuples (largest component first).

nc = 2 uses the double-word algorithms of Joldes, Muller and Popescu, "Tight and rigorous
error bounds for basic building blocks of double-word arithmetic", ACM TOMS 44(2), 2017
(JMP17 below), with their proven relative error bounds (u = 2**-p):

============================  =====================  ==========================
operation                     algorithm (JMP17)      bound
============================  =====================  ==========================
MC + MC                       6  AccurateDWPlusDW    3u^2 / (1 - 4u)
MC + tensor                   4  DWPlusFP            2u^2
MC * tensor                   9  DWTimesFP3 (FMA)    2u^2
                              7  DWTimesFP1          1.5u^2 + 4u^3
MC * MC                       12 DWTimesDW3 (FMA)    4u^2
                              10 DWTimesDW1          7u^2
MC / tensor                   15 DWDivFP3            3u^2
MC / MC                       17 DWDivDW2            15u^2 + 56u^3
============================  =====================  ==========================

nc >= 3 uses expansion arithmetic: all partial sums/products are formed with error-free
transforms, then renormalised (sort by magnitude, two bottom-up VecSum passes, fold the
discarded tail into the last kept component), which keeps everything above
``u**nc`` relative.  The error bounds for nc >= 3 are the measured ones reported in
docs/mc.md, in the spirit of Joldes, Muller, Popescu, Tucker, "Arithmetic algorithms for
extended precision using floating-point expansions", IEEE TC 65(4), 2016.

All functions here assume finite inputs; `anynum.mc.tensor` patches NaN/inf results with
the native result of the leading components.
"""

from __future__ import annotations

import torch

from anynum.mc._core import Comps
from anynum.mc.eft import _fast_two_sum, _fma, _two_prod, _two_sum, fma_available

_NATIVE = (torch.float32, torch.float64)  # dtypes whose torch ops (and addcmul FMA) are native


class _Pool:
    """Scratch buffers reused across calls.

    Large temporaries freshly allocated on every operation cost page faults (glibc returns
    freed large blocks to the OS), which dominated the run time of the double-word
    algorithms; reusing a few scratch buffers per shape removes that cost.  Only used
    without autograd recording, for tensors of at least 2**15 elements, and never for
    results.
    """

    MIN_NUMEL = 1 << 15
    MAX_KEYS = 6
    MAX_PER_KEY = 12

    def __init__(self) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}

    def take(self, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(shape), like.dtype, like.device)
        lst = self.free.get(key)
        if lst:
            return lst.pop()
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def give(self, *ts: torch.Tensor) -> None:
        for t in ts:
            key = (tuple(t.shape), t.dtype, t.device)
            lst = self.free.get(key)
            if lst is None:
                if len(self.free) >= self.MAX_KEYS:
                    self.free.pop(next(iter(self.free)))
                lst = self.free[key] = []
            if len(lst) < self.MAX_PER_KEY:
                lst.append(t)


_POOL = _Pool()


def _pooled(*ts: torch.Tensor) -> torch.Size | None:
    """Broadcast shape if the pooled in-place kernels apply, else None."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return None
    shape = torch.broadcast_shapes(*(t.shape for t in ts))
    n = 1
    for d in shape:
        n *= d
    if n < _Pool.MIN_NUMEL:
        return None
    return shape


def _dw_plus_dw_pooled(xh, xl, yh, yl, shape):  # type: ignore[no-untyped-def]
    P = _POOL
    t0, t1, t2, t3, t4 = (P.take(shape, xh) for _ in range(5))
    torch.add(xh, yh, out=t0)  # sh
    torch.sub(t0, xh, out=t1)  # bb
    torch.sub(t0, t1, out=t2)
    torch.sub(xh, t2, out=t2)
    torch.sub(yh, t1, out=t1)
    t2.add_(t1)  # sl
    torch.add(xl, yl, out=t1)  # th
    torch.sub(t1, xl, out=t3)  # bb
    torch.sub(t1, t3, out=t4)
    torch.sub(xl, t4, out=t4)
    torch.sub(yl, t3, out=t3)
    t4.add_(t3)  # tl
    t2.add_(t1)  # c = sl + th
    torch.add(t0, t2, out=t1)  # vh
    torch.sub(t1, t0, out=t3)
    torch.sub(t2, t3, out=t3)  # vl
    t4.add_(t3)  # w
    zh = t1 + t4
    zl = zh - t1
    torch.sub(t4, zl, out=zl)
    P.give(t0, t1, t2, t3, t4)
    return zh, zl


def _dw_plus_fp_pooled(xh, xl, y, shape):  # type: ignore[no-untyped-def]
    P = _POOL
    t0, t1, t2 = (P.take(shape, xh) for _ in range(3))
    torch.add(xh, y, out=t0)  # sh
    torch.sub(t0, xh, out=t1)  # bb
    torch.sub(t0, t1, out=t2)
    torch.sub(xh, t2, out=t2)
    torch.sub(y, t1, out=t1)
    t2.add_(t1)  # sl
    t2.add_(xl)  # v
    zh = t0 + t2
    zl = zh - t0
    torch.sub(t2, zl, out=zl)
    P.give(t0, t1, t2)
    return zh, zl


def _dw_times_dw_fma_pooled(xh, xl, yh, yl, shape):  # type: ignore[no-untyped-def]
    P = _POOL
    t0, t1, t2 = (P.take(shape, xh) for _ in range(3))
    torch.mul(xh, yh, out=t0)  # ch
    torch.neg(t0, out=t1)
    torch.addcmul(t1, xh, yh, out=t1)  # cl1
    torch.mul(xl, yl, out=t2)  # tl0
    torch.addcmul(t2, xh, yl, out=t2)  # tl1
    torch.addcmul(t2, xl, yh, out=t2)  # cl2
    t1.add_(t2)  # cl3
    zh = t0 + t1
    zl = zh - t0
    torch.sub(t1, zl, out=zl)
    P.give(t0, t1, t2)
    return zh, zl


def _dw_times_fp_fma_pooled(xh, xl, y, shape):  # type: ignore[no-untyped-def]
    P = _POOL
    t0, t1 = (P.take(shape, xh) for _ in range(2))
    torch.mul(xh, y, out=t0)  # ch
    torch.neg(t0, out=t1)
    torch.addcmul(t1, xh, y, out=t1)  # cl1
    torch.addcmul(t1, xl, y, out=t1)  # cl3
    zh = t0 + t1
    zl = zh - t0
    torch.sub(t1, zl, out=zl)
    P.give(t0, t1)
    return zh, zl


def _zeros(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like)


def pad(x: Comps, nc: int) -> Comps:
    """Pad with zero components (or keep) up to nc; never truncates."""
    if len(x) >= nc:
        return x
    z = _zeros(x[0])
    return tuple(x) + (z,) * (nc - len(x))


# ----------------------------------------------------------------- nc = 2 (JMP17)
def dw_plus_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    shape = _pooled(xh, xl, y)
    if shape is not None and xh.dtype in _NATIVE:
        return _dw_plus_fp_pooled(xh, xl, y, shape)
    sh, sl = _two_sum(xh, y)
    v = xl + sl
    return _fast_two_sum(sh, v)


def dw_plus_dw(xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor) -> Comps:
    shape = _pooled(xh, xl, yh, yl)
    if shape is not None and xh.dtype in _NATIVE:
        return _dw_plus_dw_pooled(xh, xl, yh, yl, shape)
    sh, sl = _two_sum(xh, yh)
    th, tl = _two_sum(xl, yl)
    c = sl + th
    vh, vl = _fast_two_sum(sh, c)
    w = tl + vl
    return _fast_two_sum(vh, w)


def dw_times_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor, *, use_fma: bool) -> Comps:
    shape = _pooled(xh, xl, y)
    if shape is not None and use_fma and xh.dtype in _NATIVE:
        return _dw_times_fp_fma_pooled(xh, xl, y, shape)
    ch, cl1 = _two_prod(xh, y)
    if use_fma:
        cl3 = _fma(xl, y, cl1)
        return _fast_two_sum(ch, cl3)
    cl2 = xl * y
    th, tl1 = _fast_two_sum(ch, cl2)
    tl2 = tl1 + cl1
    return _fast_two_sum(th, tl2)


def dw_times_dw(
    xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor, *, use_fma: bool
) -> Comps:
    ch, cl1 = _two_prod(xh, yh)
    if use_fma:
        tl0 = xl * yl
        tl1 = _fma(xh, yl, tl0)
        cl2 = _fma(xl, yh, tl1)
    else:
        cl2 = xh * yl + xl * yh
    cl3 = cl1 + cl2
    return _fast_two_sum(ch, cl3)


def dw_div_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    th = xh / y
    ph, pl = _two_prod(th, y)
    dh = xh - ph
    dt = dh - pl
    d = dt + xl
    tl = d / y
    return _fast_two_sum(th, tl)


def dw_div_dw(xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor) -> Comps:
    th = xh / yh
    rh, rl = dw_times_fp(yh, yl, th, use_fma=False)  # JMP17 Alg. 17 uses Alg. 7
    ph, pl = _two_sum(xh, -rh)
    dh = xl - rl
    dl = pl + dh
    d = ph + dl
    tl = d / yh
    return _fast_two_sum(th, tl)


# ----------------------------------------------------------------- expansions
def vecsum(terms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Bottom-up VecSum: exact, returns s_0 ~ total, then the errors."""
    n = len(terms)
    if n == 1:
        return list(terms)
    out: list[torch.Tensor] = [terms[0]] * n
    s = terms[-1]
    for i in range(n - 2, -1, -1):
        s, e = _two_sum(terms[i], s)
        out[i + 1] = e
    out[0] = s
    return out


def sort_by_magnitude(terms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sort the terms elementwise by decreasing magnitude (exact permutation)."""
    if len(terms) <= 1:
        return list(terms)
    st = torch.stack(torch.broadcast_tensors(*terms))
    idx = st.abs().argsort(dim=0, descending=True, stable=True)
    st = st.gather(0, idx)
    return list(st.unbind(0))


def renormalize(terms: list[torch.Tensor], nc: int) -> Comps:
    """Compress an exact list of terms to an nc-component expansion (largest first)."""
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
    """Repeat VecSum until nothing changes: then x_i = RN(x_i + x_{i+1}) for every i."""
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
    return renormalize([*x, *y], nc)


def exp_mul(x: Comps, y: Comps, nc: int) -> Comps:
    terms: list[torch.Tensor] = []
    low: list[torch.Tensor] = []
    for i, xi in enumerate(x):
        for j, yj in enumerate(y):
            if i + j < nc:
                p, e = _two_prod(xi, yj)
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


# ----------------------------------------------------------------- dispatch
def neg(x: Comps) -> Comps:
    return tuple(-c for c in x)


def add(x: Comps, y: Comps, nc: int) -> Comps:
    """x + y with nc output components; len(x), len(y) in {1, nc}."""
    if nc == 1:
        return (x[0] + y[0],)
    if nc == 2:
        if len(y) == 1 and len(x) == 1:
            return _two_sum(x[0], y[0])
        if len(y) == 1:
            return dw_plus_fp(x[0], x[1], y[0])
        if len(x) == 1:
            return dw_plus_fp(y[0], y[1], x[0])
        return dw_plus_dw(x[0], x[1], y[0], y[1])
    return exp_add(x, y, nc)


def sub(x: Comps, y: Comps, nc: int) -> Comps:
    return add(x, neg(y), nc)


def mul(x: Comps, y: Comps, nc: int) -> Comps:
    if nc == 1:
        return (x[0] * y[0],)
    if nc == 2:
        use_fma = fma_available(x[0].dtype)
        if len(x) == 1 and len(y) == 1:
            return _two_prod(x[0], y[0])
        if len(y) == 1:
            return dw_times_fp(x[0], x[1], y[0], use_fma=use_fma)
        if len(x) == 1:
            return dw_times_fp(y[0], y[1], x[0], use_fma=use_fma)
        return dw_times_dw(x[0], x[1], y[0], y[1], use_fma=use_fma)
    return exp_mul(x, y, nc)


def div(x: Comps, y: Comps, nc: int) -> Comps:
    if nc == 1:
        return (x[0] / y[0],)
    if nc == 2:
        xl = x[1] if len(x) > 1 else _zeros(x[0])
        if len(y) == 1:
            return dw_div_fp(x[0], xl, y[0])
        return dw_div_dw(x[0], xl, y[0], y[1])
    return exp_div(x, y, nc)


def square(x: Comps, nc: int) -> Comps:
    return mul(x, x, nc)


def scale_pow2(x: Comps, factor: float) -> Comps:
    """Multiply by an exact power of two (exact barring over/underflow)."""
    return tuple(c * factor for c in x)
