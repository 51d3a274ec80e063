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

nc >= 3 uses expansion arithmetic (`anynum.mc.expansion`).

Where the operation runs (:func:`_fast`): the formulas below are the reference, one fresh
tensor per operation.  Same-shape contiguous float32/float64 CPU operands without autograd
recording run the same operation sequence as a C loop (`anynum.mc.cloops`, the default,
``ANYNUM_COMPILE`` unset or "auto"), as one torch.compile'd loop (additions with
``ANYNUM_COMPILE=1``, `anynum.mc.compiled`), or, from 2**15 elements, as cache-blocked eager
kernels (`anynum.mc.blocked`; ``ANYNUM_COMPILE=0``, or where no C compiler is found): bit for
bit the same results on every route.  The product and quotient routes need the verified FMA
(`anynum.mc.eft.fma_available`); without it the formulas run (DWTimesDW1/DWTimesFP1).

All functions here assume finite inputs; the ops in `anynum.mc.ops` patch NaN/inf results
with the native result of the leading components.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anynum.mc import blocked, cloops, compiled
from anynum.mc._core import Comps
from anynum.mc.eft import fma_available, raw_fast_two_sum, raw_fma, raw_two_prod, raw_two_sum
from anynum.mc.expansion import exp_add, exp_div, exp_mul, pad
from anynum.mc.scratch import poolable_shape

__all__ = ["add", "div", "dw_div_dw", "dw_div_fp", "dw_plus_dw", "dw_plus_fp", "dw_times_dw",
           "dw_times_fp", "mul", "neg", "pad", "scale_pow2", "square", "sub"]

_NATIVE = (torch.float32, torch.float64)  # dtypes whose torch ops (and addcmul FMA) are native


# ----------------------------------------------------------------- nc = 2 (JMP17)
def _dw_plus_fp_formula(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    """DWPlusFP (JMP17 Alg. 4), one fresh tensor per operation."""
    sh, sl = raw_two_sum(xh, y)
    v = xl + sl
    return raw_fast_two_sum(sh, v)


def _dw_plus_dw_formula(
    xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor
) -> Comps:
    """AccurateDWPlusDW (JMP17 Alg. 6), one fresh tensor per operation."""
    sh, sl = raw_two_sum(xh, yh)
    th, tl = raw_two_sum(xl, yl)
    c = sl + th
    vh, vl = raw_fast_two_sum(sh, c)
    w = tl + vl
    return raw_fast_two_sum(vh, w)


def _fast(name: str, formula: Callable[..., Comps] | None, *ins: torch.Tensor) -> Comps | None:
    """Run kernel `name` on the fastest route that applies (see the module doc), or None."""
    if ins[0].dtype in _NATIVE and not (torch.is_grad_enabled() and any(t.requires_grad for t in ins)):
        if cloops.available(*ins):
            return cloops.run(name, *ins)
        shape = poolable_shape(*ins)
        if shape is not None and name in blocked.KERNELS:
            if formula is not None:
                out = compiled.run(formula, shape, *ins)
                if out is not None:
                    return out
            return blocked.run(name, shape, *ins)
    return None


def dw_plus_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    """DWPlusFP (JMP17 Alg. 4): double word + float, relative error <= 2u^2.

    >>> import torch
    >>> from anynum.mc import arith
    >>> arith.dw_plus_fp(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0**-30]))[1].item()
    9.313225746154785e-10
    """
    return _fast("dw_plus_fp", _dw_plus_fp_formula, xh, xl, y) or _dw_plus_fp_formula(xh, xl, y)


def dw_plus_dw(xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor) -> Comps:
    """AccurateDWPlusDW (JMP17 Alg. 6): double word + double word, <= 3u^2/(1 - 4u)."""
    return (_fast("dw_plus_dw", _dw_plus_dw_formula, xh, xl, yh, yl)
            or _dw_plus_dw_formula(xh, xl, yh, yl))


def dw_times_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor, *, use_fma: bool) -> Comps:
    """DWTimesFP3 (Alg. 9, FMA, <= 2u^2) or DWTimesFP1 (Alg. 7, <= 1.5u^2 + 4u^3)."""
    if use_fma:
        out = _fast("dw_times_fp_fma", None, xh, xl, y)
        if out is not None:
            return out
    ch, cl1 = raw_two_prod(xh, y)
    if use_fma:
        cl3 = raw_fma(xl, y, cl1)
        return raw_fast_two_sum(ch, cl3)
    cl2 = xl * y
    th, tl1 = raw_fast_two_sum(ch, cl2)
    tl2 = tl1 + cl1
    return raw_fast_two_sum(th, tl2)


def dw_times_dw(
    xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor, *, use_fma: bool
) -> Comps:
    """DWTimesDW3 (Alg. 12, FMA, <= 4u^2) or DWTimesDW1 (Alg. 10, <= 7u^2)."""
    if use_fma:
        out = _fast("dw_times_dw_fma", None, xh, xl, yh, yl)
        if out is not None:
            return out
    ch, cl1 = raw_two_prod(xh, yh)
    if use_fma:
        tl0 = xl * yl
        tl1 = raw_fma(xh, yl, tl0)
        cl2 = raw_fma(xl, yh, tl1)
    else:
        cl2 = xh * yl + xl * yh
    cl3 = cl1 + cl2
    return raw_fast_two_sum(ch, cl3)


def dw_div_fp(xh: torch.Tensor, xl: torch.Tensor, y: torch.Tensor) -> Comps:
    """DWDivFP3 (JMP17 Alg. 15): double word / float, <= 3u^2."""
    if xh.dtype in _NATIVE and fma_available(xh.dtype):
        out = _fast("dw_div_fp_fma", None, xh, xl, y)
        if out is not None:
            return out
    th = xh / y
    ph, pl = raw_two_prod(th, y)
    dh = xh - ph
    dt = dh - pl
    d = dt + xl
    tl = d / y
    return raw_fast_two_sum(th, tl)


def dw_div_dw(xh: torch.Tensor, xl: torch.Tensor, yh: torch.Tensor, yl: torch.Tensor) -> Comps:
    """DWDivDW2 (JMP17 Alg. 17): double word / double word, <= 15u^2 + 56u^3."""
    if xh.dtype in _NATIVE and fma_available(xh.dtype):
        out = _fast("dw_div_dw_fma", None, xh, xl, yh, yl)
        if out is not None:
            return out
    th = xh / yh
    rh, rl = dw_times_fp(yh, yl, th, use_fma=False)  # JMP17 Alg. 17 uses Alg. 7
    ph, pl = raw_two_sum(xh, -rh)
    dh = xl - rl
    dl = pl + dh
    d = ph + dl
    tl = d / yh
    return raw_fast_two_sum(th, tl)


# ----------------------------------------------------------------- dispatch
def neg(x: Comps) -> Comps:
    """Exact negation."""
    return tuple(-c for c in x)


def add(x: Comps, y: Comps, nc: int) -> Comps:
    """x + y with nc output components; len(x), len(y) in {1, nc}.

    >>> import torch
    >>> from anynum.mc import arith
    >>> s = arith.add((torch.tensor([1.0]),), (torch.tensor([2.0**-30]),), 2)
    >>> s[0].item(), s[1].item() == 2.0**-30
    (1.0, True)
    """
    if nc == 1:
        return (x[0] + y[0],)
    if nc == 2:
        if len(y) == 1 and len(x) == 1:
            return raw_two_sum(x[0], y[0])
        if len(y) == 1:
            return dw_plus_fp(x[0], x[1], y[0])
        if len(x) == 1:
            return dw_plus_fp(y[0], y[1], x[0])
        return dw_plus_dw(x[0], x[1], y[0], y[1])
    return exp_add(x, y, nc)


def sub(x: Comps, y: Comps, nc: int) -> Comps:
    """x - y (see :func:`add`)."""
    return add(x, neg(y), nc)


def mul(x: Comps, y: Comps, nc: int) -> Comps:
    """x * y with nc output components; len(x), len(y) in {1, nc}."""
    if nc == 1:
        return (x[0] * y[0],)
    if nc == 2:
        use_fma = fma_available(x[0].dtype)
        if len(x) == 1 and len(y) == 1:
            return raw_two_prod(x[0], y[0])
        if len(y) == 1:
            return dw_times_fp(x[0], x[1], y[0], use_fma=use_fma)
        if len(x) == 1:
            return dw_times_fp(y[0], y[1], x[0], use_fma=use_fma)
        return dw_times_dw(x[0], x[1], y[0], y[1], use_fma=use_fma)
    return exp_mul(x, y, nc)


def div(x: Comps, y: Comps, nc: int) -> Comps:
    """x / y with nc output components (y nonzero and finite)."""
    if nc == 1:
        return (x[0] / y[0],)
    if nc == 2:
        xl = x[1] if len(x) > 1 else torch.zeros_like(x[0])
        if len(y) == 1:
            return dw_div_fp(x[0], xl, y[0])
        return dw_div_dw(x[0], xl, y[0], y[1])
    return exp_div(x, y, nc)


def square(x: Comps, nc: int) -> Comps:
    """x * x (see :func:`mul`)."""
    return mul(x, x, nc)


def scale_pow2(x: Comps, factor: float) -> Comps:
    """Multiply by an exact power of two (exact barring over/underflow)."""
    return tuple(c * factor for c in x)
