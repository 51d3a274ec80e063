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

import functools
from collections.abc import Callable
from typing import Any

import torch

from anynum.kernels.fused import own_code, run_compiled, use_fused
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
    shape = ts[0].shape
    if any(t.shape != shape for t in ts[1:]):
        shape = torch.broadcast_shapes(*(t.shape for t in ts))
    if shape.numel() < _Pool.MIN_NUMEL:
        return None
    return shape


# Elements per block of the blocked CPU kernels (per thread): with float32 components the
# 9-10 arrays a double-word kernel touches (inputs, scratch, outputs) take ~2.5 MiB per block,
# so the 20-27 passes over one block run from L2/L3 instead of main memory.
BLOCK = 1 << 16


def _run(kernel, nscratch: int, shape: torch.Size, *ins: torch.Tensor) -> Comps:  # type: ignore[no-untyped-def]
    """Run an elementwise double-word kernel ``kernel(*ins, *scratch, out_h, out_l)``.

    The kernel performs a fixed sequence of elementwise torch operations with ``out=``
    arguments, so running it block by block gives bit-for-bit the same result as running it on
    the whole tensors.  On the CPU, with same-shape contiguous inputs, the work is cut into
    blocks of ``BLOCK`` elements per thread that stay in cache across the ~20 passes, and
    both result components are written into one ``(2, *shape)`` allocation.  Otherwise
    (broadcasting, other devices) the kernel runs once on whole tensors with pooled scratch.
    """
    x0 = ins[0]
    if x0.device.type == "cpu" and all(t.shape == shape and t.is_contiguous() for t in ins):
        out = torch.empty((2, *shape), dtype=x0.dtype, device=x0.device)
        n = out[0].numel()
        blk = BLOCK * max(1, torch.get_num_threads())
        size = torch.Size((min(blk, n),))
        scr = [_POOL.take(size, x0) for _ in range(nscratch)]  # taken, so reentrant-safe
        flat = [t.reshape(-1) for t in ins]
        oh, ol = out.view(2, -1).unbind(0)
        for i in range(0, n, blk):
            j = min(n, i + blk)
            if j - i == blk or i == 0:
                sc = scr
            else:
                sc = [t[: j - i] for t in scr]
            kernel(*(t[i:j] for t in flat), *sc, oh[i:j], ol[i:j])
        _POOL.give(*scr)
        zh, zl = out.unbind(0)
        return zh, zl
    P = _POOL
    scr = [P.take(shape, x0) for _ in range(nscratch)]
    zh = torch.empty(shape, dtype=x0.dtype, device=x0.device)
    zl = torch.empty_like(zh)
    kernel(*ins, *scr, zh, zl)
    P.give(*scr)
    return zh, zl


def _k_dw_plus_dw(xh, xl, yh, yl, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
    """AccurateDWPlusDW (JMP17 Alg. 6) with out= operations; zh, zl receive the result.

    The output buffers double as scratch (zh holds bb, zl holds tl and w) so that a block
    touches 9 arrays, and operations overwrite a dead operand where they can (two arrays
    streamed instead of three).
    """
    torch.add(xh, yh, out=t0)  # sh
    torch.sub(t0, xh, out=t1)  # bb
    torch.sub(t0, t1, out=t2)
    torch.sub(xh, t2, out=t2)
    torch.sub(yh, t1, out=t1)
    t2.add_(t1)  # sl
    torch.add(xl, yl, out=t1)  # th
    torch.sub(t1, xl, out=zh)  # bb
    torch.sub(t1, zh, out=zl)
    torch.sub(xl, zl, out=zl)
    torch.sub(yl, zh, out=zh)
    zl.add_(zh)  # tl
    t2.add_(t1)  # c = sl + th
    torch.add(t0, t2, out=t1)  # vh
    torch.sub(t1, t0, out=t0)  # vh - sh
    t2.sub_(t0)  # vl = c - (vh - sh)
    zl.add_(t2)  # w = tl + vl
    torch.add(t1, zl, out=zh)  # zh = RN(vh + w)
    torch.sub(zh, t1, out=t1)  # zh - vh
    zl.sub_(t1)  # zl = w - (zh - vh)


def _k_dw_plus_fp(xh, xl, y, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
    """DWPlusFP (JMP17 Alg. 4) with out= operations."""
    torch.add(xh, y, out=t0)  # sh
    torch.sub(t0, xh, out=t1)  # bb
    torch.sub(t0, t1, out=t2)
    torch.sub(xh, t2, out=t2)
    torch.sub(y, t1, out=t1)
    t2.add_(t1)  # sl
    t2.add_(xl)  # v
    torch.add(t0, t2, out=zh)
    torch.sub(zh, t0, out=zl)
    torch.sub(t2, zl, out=zl)


def _k_dw_times_dw_fma(xh, xl, yh, yl, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
    """DWTimesDW3 (JMP17 Alg. 12) with out= operations (addcmul is a verified FMA)."""
    torch.mul(xh, yh, out=t0)  # ch
    torch.neg(t0, out=t1)
    torch.addcmul(t1, xh, yh, out=t1)  # cl1
    torch.mul(xl, yl, out=t2)  # tl0
    torch.addcmul(t2, xh, yl, out=t2)  # tl1
    torch.addcmul(t2, xl, yh, out=t2)  # cl2
    t1.add_(t2)  # cl3
    torch.add(t0, t1, out=zh)
    torch.sub(zh, t0, out=zl)
    torch.sub(t1, zl, out=zl)


def _k_dw_div_dw_fma(xh, xl, yh, yl, t0, t1, t2, t3, zh, zl):  # type: ignore[no-untyped-def]
    """DWDivDW2 (JMP17 Alg. 17, with DWTimesFP1 and an FMA two_prod) with out= operations."""
    torch.div(xh, yh, out=t0)  # th
    torch.mul(yh, t0, out=t1)  # ch
    torch.neg(t1, out=t2)
    torch.addcmul(t2, yh, t0, out=t2)  # cl1
    torch.mul(yl, t0, out=t3)  # cl2
    torch.add(t1, t3, out=zh)  # th2 = ch + cl2
    torch.sub(zh, t1, out=t1)
    t3.sub_(t1)  # tl1 = cl2 - (th2 - ch)
    t3.add_(t2)  # tl2 = tl1 + cl1
    torch.add(zh, t3, out=t1)  # rh = th2 + tl2
    torch.sub(t1, zh, out=zh)
    t3.sub_(zh)  # rl = tl2 - (rh - th2)
    torch.sub(xh, t1, out=zl)  # ph = xh + (-rh)
    torch.sub(zl, xh, out=t2)  # bb
    torch.sub(zl, t2, out=zh)
    torch.sub(xh, zh, out=zh)  # xh - (ph - bb)
    t1.neg_()
    t1.sub_(t2)  # (-rh) - bb
    zh.add_(t1)  # pl
    torch.sub(xl, t3, out=t3)  # dh = xl - rl
    zh.add_(t3)  # dl = pl + dh
    zl.add_(zh)  # d = ph + dl
    zl.div_(yh)  # tl = d / yh
    torch.add(t0, zl, out=zh)  # zh = th + tl
    torch.sub(zh, t0, out=t0)
    zl.sub_(t0)  # zl = tl - (zh - th)


def _k_dw_times_fp_fma(xh, xl, y, t0, t1, zh, zl):  # type: ignore[no-untyped-def]
    """DWTimesFP3 (JMP17 Alg. 9) with out= operations."""
    torch.mul(xh, y, out=t0)  # ch
    torch.neg(t0, out=t1)
    torch.addcmul(t1, xh, y, out=t1)  # cl1
    torch.addcmul(t1, xl, y, out=t1)  # cl3
    torch.add(t0, t1, out=zh)
    torch.sub(zh, t0, out=zl)
    torch.sub(t1, zl, out=zl)


def _zeros(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like)


def pad(x: Comps, nc: int) -> Comps:
    """Pad with zero components (or keep) up to nc; never truncates."""
    if len(x) >= nc:
        return x
    z = _zeros(x[0])
    return tuple(x) + (z,) * (nc - len(x))


# ----------------------------------------------------------------- nc = 2 (JMP17)
def _dw_plus_fp_formula(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    """DWPlusFP (JMP17 Alg. 4), one fresh tensor per operation."""
    sh, sl = _two_sum(xh, y)
    v = xl + sl
    return _fast_two_sum(sh, v)


def _dw_plus_dw_formula(
    xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor
) -> Comps:
    """AccurateDWPlusDW (JMP17 Alg. 6), one fresh tensor per operation."""
    sh, sl = _two_sum(xh, yh)
    th, tl = _two_sum(xl, yl)
    c = sl + th
    vh, vl = _fast_two_sum(sh, c)
    w = tl + vl
    return _fast_two_sum(vh, w)


# The formulas torch.compile may fuse into one loop.  Only sums: Inductor turns addcmul into
# a separately rounded multiply and add (no FMA), so the product and quotient kernels would
# not be bit-identical compiled; additions and subtractions are kept exactly (Inductor
# compiles them with -fno-unsafe-math-optimizations -ffp-contract=off, pinned below, and does
# no algebraic rewriting of float expressions), which tests/mc/test_kernels.py checks bit for
# bit, and which fails with the unsafe-math flag on.
_FUSABLE: dict[str, Callable[..., Comps]] = {
    "dw_plus_fp": _dw_plus_fp_formula,
    "dw_plus_dw": _dw_plus_dw_formula,
}


@functools.cache
def _compiled(name: str) -> Callable[..., torch.Tensor]:
    formula = _FUSABLE[name]

    def body(*ins: torch.Tensor) -> torch.Tensor:
        return torch.stack(formula(*ins))  # both components in one (2, n) allocation

    # Own code object per kernel, so each has its own dynamo cache; 1-D inputs of any length
    # share one compiled loop (dynamic size): one compile per kernel, dtype and thread count.
    # The float flags are pinned, whatever TORCHINDUCTOR_* variables the user has set:
    # reassociation or contraction would make the error terms vanish.
    options: dict[str, str | int | bool | Callable[..., Any]] = {
        "cpp.enable_unsafe_math_opt_flag": False,
        "cpp.enable_floating_point_contract_flag": "off",
    }
    return torch.compile(own_code(body), dynamic=True, fullgraph=True, options=options)


def _fused(name: str, shape: torch.Size, *ins: torch.Tensor) -> Comps | None:
    """Run formula `name` as one compiled loop, or return None when the eager kernel applies.

    Used on the CPU for same-shape contiguous float32/float64 operands when
    ``anynum.kernels.use_fused`` allows it (``ANYNUM_COMPILE``: ``0`` never, ``1`` always,
    default from ``ANYNUM_COMPILE_MIN`` = 262144 elements up).  The 20 passes of
    AccurateDWPlusDW then become one pass over memory: 2-3x a native float64 add instead of
    ~7x for the eager blocked kernel (docs/mc.md, Speed); the bits are the same.
    """
    x0 = ins[0]
    if (
        x0.device.type != "cpu"
        or not use_fused(x0, None)
        or not all(t.shape == shape and t.is_contiguous() for t in ins)
    ):
        return None
    flat = [t.view(-1) for t in ins]
    out = run_compiled(("mc", name, x0.dtype), f"MCTensor {name}", lambda: _compiled(name)(*flat))
    if out is None:
        return None
    zh, zl = out.reshape(2, *shape).unbind(0)
    return zh, zl


def dw_plus_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    shape = _pooled(xh, xl, y)
    if shape is not None and xh.dtype in _NATIVE:
        return _fused("dw_plus_fp", shape, xh, xl, y) or _run(_k_dw_plus_fp, 3, shape, xh, xl, y)
    return _dw_plus_fp_formula(xh, xl, y)


def dw_plus_dw(xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor) -> Comps:
    shape = _pooled(xh, xl, yh, yl)
    if shape is not None and xh.dtype in _NATIVE:
        return _fused("dw_plus_dw", shape, xh, xl, yh, yl) or _run(
            _k_dw_plus_dw, 3, shape, xh, xl, yh, yl
        )
    return _dw_plus_dw_formula(xh, xl, yh, yl)


def dw_times_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor, *, use_fma: bool) -> Comps:
    shape = _pooled(xh, xl, y)
    if shape is not None and use_fma and xh.dtype in _NATIVE:
        return _run(_k_dw_times_fp_fma, 2, shape, xh, xl, y)
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
    if use_fma and xh.dtype in _NATIVE:
        shape = _pooled(xh, xl, yh, yl)
        if shape is not None:
            return _run(_k_dw_times_dw_fma, 3, shape, xh, xl, yh, yl)
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
    if xh.dtype in _NATIVE and fma_available(xh.dtype):
        shape = _pooled(xh, xl, yh, yl)
        if shape is not None:
            return _run(_k_dw_div_dw_fma, 4, shape, xh, xl, yh, yl)
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
