"""Reductions and matrix products on component tuples.

Reductions (sum, mean) are tree-shaped: ``log2(n)`` vectorised MC additions, never a
Python loop over elements.

Matrix products use the Ozaki scheme (Ozaki, Ogita, Oishi, Rump, "Error-free
transformations of matrix multiplication by using fast routines of matrix
multiplication and its applications", Numer. Algorithms 59, 2012): each component matrix
is cut into slices ``Q * 2**g`` where ``Q`` holds integers of at most ``beta`` bits and
``g`` is a per-row (left operand) or per-column (right operand) power of two.  With
``2 beta + ceil(log2 kb) <= p_G`` every slice product ``Q_A @ Q_B`` is computed *exactly* by
a native GEMM in the GEMM dtype G, whatever its summation order or blocking.  The exact
slice products are then scaled back and accumulated in MC arithmetic, smallest first.
Slice pairs whose weight is below ``2**-(nc p + 3)`` of ``max|row| max|col|`` are skipped.
When ``beta`` would be too small the inner dimension is cut into blocks of ``kb``.

Engines:

* ``"int8"`` (default, :func:`_ozaki_int`): int8 digits on one per-row/column grid, exact
  ``torch._int_mm`` digit products, integer anti-diagonal sums combined exactly in int64
  (:func:`_combine_diagonals`); no float GEMM and nothing wider than the work dtype.
* ``"native"``: G is the component dtype; nothing wider is used.
* ``"wide"``: G is float32 for float16/bfloat16 components and float64 for float32
  components (float64 components: same as native).  Fewer, larger slices; much faster for
  float16 on CPUs without fast float16 GEMMs.  Opt in with ``engine="wide"`` or
  :func:`anynum.mc.set_matmul_engine`.

Error bound: the result differs from the exact product by at most about
``(c_pairs + 2) u^2 * k * max_j |a_rj| * max_j |b_jc|`` for nc = 2, i.e. the bound is
relative to row/column maxima (normwise per row/column) rather than to ``|A| |B|``
entrywise; it is ``~u^2 (|A||B|)_rc`` when entries of a row/column have similar magnitudes.
"""

from __future__ import annotations

import math

import torch

from anynum.mc import arith
from anynum.mc._core import Comps, exponent, info, ldexp

_ENGINE = ["int8"]
ENGINES = ("int8", "native", "wide")
_WIDE = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
    torch.float64: torch.float64,
}
# smallest slice width worth using before blocking the inner dimension
_BETA_MIN = {torch.float64: 16, torch.float32: 7, torch.float16: 3, torch.bfloat16: 2}


# ----------------------------------------------------------------- reductions
def tree_sum(x: Comps, dim: int, nc: int, keepdim: bool = False) -> Comps:
    """Sum along `dim` with a balanced tree of vectorised MC additions."""
    comps = [c.movedim(dim, -1) for c in arith.pad(x, nc)]
    n = comps[0].shape[-1]
    if n == 0:
        out = tuple(torch.zeros(c.shape[:-1], dtype=c.dtype, device=c.device) for c in comps)
    else:
        while n > 1:
            h = n // 2
            a = tuple(c[..., :h] for c in comps)
            b = tuple(c[..., h : 2 * h] for c in comps)
            s = arith.add(a, b, nc)
            if n % 2:
                s = tuple(torch.cat([si, c[..., 2 * h :]], dim=-1) for si, c in zip(s, comps))
            comps = list(s)
            n = h + n % 2
        out = tuple(c[..., 0] for c in comps)
    if keepdim:
        out = tuple(c.unsqueeze(dim) for c in out)
    return out


def sum_all(x: Comps, nc: int) -> Comps:
    return tree_sum(tuple(c.reshape(-1) for c in x), 0, nc)


# ----------------------------------------------------------------- Ozaki scheme
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
            acc = arith.renormalize([v for _, v in terms[::-1]], nc_acc)
    if nb > 1:
        acc = tree_sum(acc, -3, nc_acc)
    return acc


# ----------------------------------------------------------------- int8 Ozaki engine
# Digits are truncated 7-bit signed integers (|q| <= 127), so one digit product is at most
# 127**2 < 2**14 and an int32 dot product of length <= _INT_K = 2**17 is exact
# (127**2 * 2**17 = 2_114_060_288 < 2**31 - 1); longer inner dimensions are cut into
# chunks of _INT_K whose int32 results are summed in int64.
_INT_K = 1 << 17
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
        buf = arith._POOL.take(c.shape, c)
        amaxes.append(torch.abs(c, out=buf).amax(dim=-1, keepdim=True))
        arith._POOL.give(buf)
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
    stack = arith._POOL.take(torch.Size((len(order), *x[0].shape)), like)
    for s0, i in plan:
        c = x[i]
        ex = 7 + 7 * s0 - e
        f = _pow2(ex, c.dtype)
        r = arith._POOL.take(c.shape, c)
        if f is not None:
            torch.mul(c, f, out=r)
        else:
            r.copy_(ldexp(c, ex))
        for s in range(s0, levels):
            stack[pos[(s, i)]].copy_(r)  # truncation toward zero, |r| < 128
            if s + 1 < levels:
                r.frac_().mul_(128.0)
        arith._POOL.give(r)
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
    # the cut: P = digits_a @ [digits_b of levels l0..], exact in int32 per chunk of _INT_K.
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
            if k <= _INT_K:
                prod = torch._int_mm(sa[ia], bq.T)
            else:
                prod = torch.zeros(m, cnt * n, dtype=torch.int64, device=dev)
                for k0 in range(0, k, _INT_K):
                    prod += torch._int_mm(sa[ia, :, k0 : k0 + _INT_K], bq[:, k0 : k0 + _INT_K].T)
            acc[la + l0 : la + l0 + cnt].add_(prod.view(m, cnt, n).transpose(0, 1))
    arith._POOL.give(sa, sb)
    return _combine_diagonals(acc, ea, eb, nc_acc, work)


def _combine_diagonals(acc: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, nc_acc: int,
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
    if nc_acc == 1:
        tot = terms[0]
        for t in terms[1:]:
            tot = tot + t
        return (tot,)
    if nc_acc == 2:
        res: Comps = (terms[0], torch.zeros_like(terms[0]))
        for t in terms[1:]:
            res = arith.add(res, (t,), 2)
        return res
    return arith.renormalize(terms[::-1], nc_acc)


def _ozaki_int(a: Comps, b: Comps, nc: int) -> Comps:
    """Int8 Ozaki product of a (..., m, k) and b (..., k, n) with nc-component result."""
    t = a[0].dtype
    work = _WORK.get(t, t)
    pt = info(t).precision
    levels = math.ceil((nc * pt + 10) / 7)
    nc_acc = nc if work == t else max(1, math.ceil(nc * pt / info(work).precision)) + (1 if nc > 1 else 0)
    a = tuple(c.to(work) for c in a)
    b = tuple(c.to(work) for c in b)
    m, n = a[0].shape[-2], b[0].shape[-1]
    if b[0].dim() == 2:
        batch = a[0].shape[:-2]
        res = _ozaki_int2d(tuple(c.reshape(-1, c.shape[-1]) for c in a), b, nc_acc, levels, work)
        res = tuple(c.reshape(*batch, m, n) for c in res)
    elif a[0].dim() == 2:
        batch = b[0].shape[:-2]
        bt = tuple(c.transpose(-1, -2).reshape(-1, c.shape[-2]) for c in b)
        res = _ozaki_int2d(bt, tuple(c.T for c in a), nc_acc, levels, work)
        res = tuple(c.reshape(*batch, n, m).transpose(-1, -2) for c in res)
    else:
        batch = torch.broadcast_shapes(a[0].shape[:-2], b[0].shape[:-2])
        ab = [c.expand(*batch, *c.shape[-2:]).reshape(-1, *c.shape[-2:]) for c in a]
        bb = [c.expand(*batch, *c.shape[-2:]).reshape(-1, *c.shape[-2:]) for c in b]
        outs = [
            _ozaki_int2d(tuple(c[i] for c in ab), tuple(c[i] for c in bb), nc_acc, levels, work)
            for i in range(ab[0].shape[0])
        ]
        res = tuple(torch.stack([o[j] for o in outs]).reshape(*batch, m, n) for j in range(nc_acc))
    if work != t:
        from anynum.mc.convert import convert_comps

        res = convert_comps(res, t, nc)
    return res


def matmul2(a: Comps, b: Comps, nc: int, engine: str | None = None) -> Comps:
    """MC matrix product of a (..., m, k) and b (..., k, n) component tuples."""
    engine = engine or _ENGINE[0]
    if engine == "int8":
        return _ozaki_int(a, b, nc)
    t = a[0].dtype
    pt = info(t).precision
    target = nc * pt + 3
    if engine == "native":
        return _ozaki_core(a, b, nc, target, t)
    g = _WIDE[t]
    if g == t:
        return _ozaki_core(a, b, nc, target, t)
    from anynum.mc.convert import convert_comps

    pg = info(g).precision
    a_g = convert_comps(a, g, max(1, math.ceil(len(a) * pt / pg)))
    b_g = convert_comps(b, g, max(1, math.ceil(len(b) * pt / pg)))
    nc_g = max(1, math.ceil(nc * pt / pg)) + (1 if nc > 1 else 0)
    res = _ozaki_core(a_g, b_g, nc_g, target, g)
    return convert_comps(res, t, nc)


def matmul(a: Comps, b: Comps, nc: int, engine: str | None = None) -> Comps:
    """torch.matmul semantics (1-D operands, broadcasting batch dims)."""
    a1 = a[0].dim() == 1
    b1 = b[0].dim() == 1
    if a1:
        a = tuple(c.unsqueeze(0) for c in a)
    if b1:
        b = tuple(c.unsqueeze(-1) for c in b)
    r = matmul2(a, b, nc, engine)
    if a1 and b1:
        return tuple(c[..., 0, 0] for c in r)
    if b1:
        return tuple(c.squeeze(-1) for c in r)
    if a1:
        return tuple(c.squeeze(-2) for c in r)
    return r
