"""Cache-blocked eager kernels of the double-word (nc = 2) algorithms.

Each kernel is the exact operation sequence of one algorithm of Joldes, Muller and Popescu
(ACM TOMS 44(2), 2017), written with ``out=`` and in-place torch operations so that it can
run block by block: on the CPU, with same-shape contiguous operands, the work is cut into
blocks of `BLOCK` elements per thread that stay in L2/L3 across the 20-27 passes, instead of
streaming whole arrays through memory once per operation.  Because the sequence is fixed and
elementwise, running it block by block gives bit for bit the results of the plain formulas
in `anynum.mc.arith` (tests/mc/test_kernels.py compares the bit patterns).

The product and quotient kernels use ``torch.addcmul`` as the fused multiply-add: callers use
them only where `anynum.mc.eft.fma_available` verified that it is one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from anynum.mc._core import Comps
from anynum.mc.scratch import POOL

__all__ = ["BLOCK", "KERNELS", "run"]

# Elements per block of the blocked CPU kernels (per thread): with float32 components the
# 9-10 arrays a double-word kernel touches (inputs, scratch, outputs) take ~2.5 MiB per block,
# so the 20-27 passes over one block run from L2/L3 instead of main memory.
BLOCK = 1 << 16


def _dw_plus_dw(xh, xl, yh, yl, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
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


def _dw_plus_fp(xh, xl, y, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
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


def _dw_times_dw_fma(xh, xl, yh, yl, t0, t1, t2, zh, zl):  # type: ignore[no-untyped-def]
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


def _dw_div_dw_fma(xh, xl, yh, yl, t0, t1, t2, t3, zh, zl):  # type: ignore[no-untyped-def]
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


def _dw_times_fp_fma(xh, xl, y, t0, t1, zh, zl):  # type: ignore[no-untyped-def]
    """DWTimesFP3 (JMP17 Alg. 9) with out= operations."""
    torch.mul(xh, y, out=t0)  # ch
    torch.neg(t0, out=t1)
    torch.addcmul(t1, xh, y, out=t1)  # cl1
    torch.addcmul(t1, xl, y, out=t1)  # cl3
    torch.add(t0, t1, out=zh)
    torch.sub(zh, t0, out=zl)
    torch.sub(t1, zl, out=zl)


# name -> (kernel, number of scratch buffers)
KERNELS: dict[str, tuple[Callable[..., None], int]] = {
    "dw_plus_dw": (_dw_plus_dw, 3),
    "dw_plus_fp": (_dw_plus_fp, 3),
    "dw_times_dw_fma": (_dw_times_dw_fma, 3),
    "dw_times_fp_fma": (_dw_times_fp_fma, 2),
    "dw_div_dw_fma": (_dw_div_dw_fma, 4),
}


def run(name: str, shape: torch.Size, *ins: torch.Tensor) -> Comps:
    """Run kernel `name` of `KERNELS` on operands broadcastable to `shape`; returns (zh, zl).

    On the CPU, with same-shape contiguous inputs, the work is cut into blocks of ``BLOCK``
    elements per thread and both result components are written into one ``(2, *shape)``
    allocation (two independent contiguous views).  Otherwise (broadcasting, other devices)
    the kernel runs once on whole tensors with pooled scratch.  NaN/inf propagate as in the
    plain formulas (the callers patch them).

    >>> import torch
    >>> from anynum.mc import blocked
    >>> x = torch.ones(1 << 15)
    >>> zh, zl = blocked.run("dw_plus_fp", x.shape, x, x * 0, x * 2.0**-30)
    >>> zh[0].item(), zl[0].item() == 2.0**-30
    (1.0, True)
    """
    kernel, nscratch = KERNELS[name]
    x0 = ins[0]
    if x0.device.type == "cpu" and all(t.shape == shape and t.is_contiguous() for t in ins):
        out = torch.empty((2, *shape), dtype=x0.dtype, device=x0.device)
        n = out[0].numel()
        blk = BLOCK * max(1, torch.get_num_threads())
        size = torch.Size((min(blk, n),))
        scr = [POOL.take(size, x0) for _ in range(nscratch)]  # taken, so reentrant-safe
        flat = [t.reshape(-1) for t in ins]
        oh, ol = out.view(2, -1).unbind(0)
        for i in range(0, n, blk):
            j = min(n, i + blk)
            sc = scr if (j - i == blk or i == 0) else [t[: j - i] for t in scr]
            kernel(*(t[i:j] for t in flat), *sc, oh[i:j], ol[i:j])
        POOL.give(*scr)
        zh, zl = out.unbind(0)
        return zh, zl
    scr = [POOL.take(shape, x0) for _ in range(nscratch)]
    zh = torch.empty(shape, dtype=x0.dtype, device=x0.device)
    zl = torch.empty_like(zh)
    kernel(*ins, *scr, zh, zl)
    POOL.give(*scr)
    return zh, zl
