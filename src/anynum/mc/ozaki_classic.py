"""The classic Ozaki scheme with floating-point slices: engines ``"native"`` and ``"wide"``.

Ozaki, Ogita, Oishi, Rump, "Error-free transformations of matrix multiplication by using fast
routines of matrix multiplication and its applications", Numer. Algorithms 59, 2012: each
component matrix is cut into slices ``Q * 2**g`` where ``Q`` holds integers of at most
``beta`` bits and ``g`` is a per-row (left operand) or per-column (right operand) power of
two.  With ``2 beta + ceil(log2 kb) <= p_G`` every slice product ``Q_A @ Q_B`` is computed
*exactly* by a native GEMM in the GEMM dtype G, whatever its summation order or blocking.
The exact slice products are then scaled back and accumulated in MC arithmetic, smallest
first.  Slice pairs whose weight is below ``2**-(nc p + 3)`` of ``max|row| max|col|`` are
skipped.  When ``beta`` would be too small the inner dimension is cut into blocks of ``kb``.

* ``"native"``: G is the component dtype; nothing wider is used.
* ``"wide"``: G is float32 for float16/bfloat16 components and float64 for float32
  components (float64 components: same as native).

Both are kept for comparison and for the "nothing wider than the components" guarantee of
``"native"``; the engines chosen by default are in `anynum.mc.ozaki_int8` and
`anynum.mc.ozaki_float`.
"""

from __future__ import annotations

import math

import torch

from anynum.mc import arith
from anynum.mc._core import Comps, exponent, info, ldexp
from anynum.mc.convert import convert_comps
from anynum.mc.expansion import renormalize
from anynum.mc.reduce import tree_sum

__all__ = ["matmul_sliced"]

_WIDE = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
    torch.float64: torch.float64,
}
# smallest slice width worth using before blocking the inner dimension
_BETA_MIN = {torch.float64: 16, torch.float32: 7, torch.float16: 3, torch.bfloat16: 2}


def _slice_rows(x: torch.Tensor, beta: int, nslices: int, work: torch.dtype, gemm: torch.dtype):
    """Cut x (..., r, k) into integer slices along the last dim with per-row exponents.

    Returns a list of (Q in `gemm` dtype, g int32 (..., r, 1)) with x ~= sum Q * 2**g.
    """
    r = x.to(work)
    amax = r.abs().amax(dim=-1, keepdim=True)
    e = exponent(amax)  # |x| < 2**e per row
    out = []
    for s in range(nslices):
        g = e - (s + 1) * beta
        q = torch.round(ldexp(r, -g))
        out.append((q.to(gemm), g))
        if s + 1 < nslices:
            r = r - ldexp(q, g)
    return out


def _nslices(prec: int, beta: int, target: int, level: int) -> int:
    """Slices needed so that what is left is below 2**-target of the row maximum."""
    return max(0, math.ceil((target - level) / beta))


def _scale(p: torch.Tensor, ga: torch.Tensor, gb: torch.Tensor) -> torch.Tensor:
    return ldexp(p, ga + gb)


def _ozaki_core(a: Comps, b: Comps, nc_acc: int, target: int, gemm: torch.dtype) -> Comps:
    """Exact-slice GEMMs in `gemm` dtype; a (..., m, k), b (..., k, n) components in `gemm`."""
    t = gemm
    p = info(t).precision
    k = a[0].shape[-1]
    work = torch.float32 if t in (torch.float16, torch.bfloat16) else t
    lk = max(0, math.ceil(math.log2(max(k, 1))))
    beta = (p - lk) // 2
    kb = k
    if beta < _BETA_MIN[t]:
        beta = _BETA_MIN[t]
        kb = 2 ** (p - 2 * beta)
    nb = math.ceil(k / kb) if k else 1
    if nb > 1:
        pad = nb * kb - k
        if pad:
            a = tuple(torch.nn.functional.pad(c, (0, pad)) for c in a)
            b = tuple(torch.nn.functional.pad(c.transpose(-1, -2), (0, pad)).transpose(-1, -2) for c in b)
        # (..., m, nb, kb) -> (..., nb, m, kb);  (..., nb, kb, n)
        a = tuple(c.reshape(*c.shape[:-1], nb, kb).movedim(-2, -3) for c in a)
        b = tuple(c.reshape(*c.shape[:-2], nb, kb, c.shape[-1]) for c in b)
    # slice every nonzero component; level = nominal bit offset below the leading component
    a_sl: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    for i, c in enumerate(a):
        if i and not bool(c.any()):
            continue
        n_s = _nslices(p, beta, target, i * p)
        for s, (q, g) in enumerate(_slice_rows(c, beta, n_s, work, t)):
            a_sl.append((q, g, i * p + s * beta))
    b_sl: list[tuple[torch.Tensor, torch.Tensor, int]] = []
    for j, c in enumerate(b):
        if j and not bool(c.any()):
            continue
        n_s = _nslices(p, beta, target, j * p)
        for s, (q, g) in enumerate(_slice_rows(c.transpose(-1, -2), beta, n_s, work, t)):
            b_sl.append((q.transpose(-1, -2), g.transpose(-1, -2), j * p + s * beta))
    terms: list[tuple[int, torch.Tensor]] = []
    for qa, ga, la in a_sl:
        sel = [(qb, gb, lb) for qb, gb, lb in b_sl if la + lb < target]
        if not sel:
            continue
        n = sel[0][0].shape[-1]
        qcat = torch.cat([x[0] for x in sel], dim=-1) if len(sel) > 1 else sel[0][0]
        prod = torch.matmul(qa, qcat)
        for idx, (_, gb, lb) in enumerate(sel):
            part = prod[..., idx * n : (idx + 1) * n]
            terms.append((la + lb, _scale(part.to(work), ga, gb).to(t)))
    if not terms:
        shape = torch.broadcast_shapes(a[0].shape[:-1], (*b[0].shape[:-2], 1))
        z = torch.zeros(*shape, b[0].shape[-1], dtype=t, device=a[0].device)
        acc: Comps = (z,) * nc_acc
    else:
        terms.sort(key=lambda lt: -lt[0])  # smallest first
        if nc_acc == 1:
            tot = terms[0][1]
            for _, v in terms[1:]:
                tot = tot + v
            acc = (tot,)
        elif nc_acc == 2:
            acc = (terms[0][1], torch.zeros_like(terms[0][1]))
            for _, v in terms[1:]:
                acc = arith.add(acc, (v,), 2)
        else:
            acc = renormalize([v for _, v in terms[::-1]], nc_acc)
    if nb > 1:
        acc = tree_sum(acc, -3, nc_acc)
    return acc


def matmul_sliced(a: Comps, b: Comps, nc: int, wide: bool) -> Comps:
    """Classic Ozaki product of a (..., m, k) and b (..., k, n): G the component dtype, or wider.

    >>> import torch
    >>> from anynum.mc.ozaki_classic import matmul_sliced
    >>> a = (torch.tensor([[1.0, 2.0**-30]]), torch.zeros(1, 2))
    >>> r = matmul_sliced(a, (torch.ones(2, 1),), 2, wide=False)
    >>> r[0].item(), r[1].item() == 2.0**-30
    (1.0, True)
    """
    t = a[0].dtype
    pt = info(t).precision
    target = nc * pt + 3
    g = _WIDE[t] if wide else t
    if g == t:
        return _ozaki_core(a, b, nc, target, t)
    pg = info(g).precision
    a_g = convert_comps(a, g, max(1, math.ceil(len(a) * pt / pg)))
    b_g = convert_comps(b, g, max(1, math.ceil(len(b) * pt / pg)))
    nc_g = max(1, math.ceil(nc * pt / pg)) + (1 if nc > 1 else 0)
    res = _ozaki_core(a_g, b_g, nc_g, target, g)
    return convert_comps(res, t, nc)
