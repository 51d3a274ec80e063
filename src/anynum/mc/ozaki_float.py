"""The float64 slicing engine of MC matrix products: exact leading slices, one float64 tail.

The engine for machines where an int8 GEMM is not ~31x faster than a float64 one (CPUs
without AMX, measured with and without VNNI; `anynum.mc.engine` decides).  Both
operands are taken as float64 expansions (exact conversions; an expansion of float16, bfloat16
or float32 components that fits in 49 bits is first summed into one float64, relative error
``<= (nc - 1) 2**-53``).  Rows of the left operand (columns of the right one) are scaled by a
per-row (per-column) power of two ``2**-e`` so that every component is below 1, then cut into
``S`` integer slices of ``beta`` bits and a remainder::

    a = 2**e (sum_{s<S} QA_s 2**(-(s+1) beta) + RA 2**(-S beta)),  |QA_s| <= nA 2**beta, |RA| <= nA/2

(each component is cut separately: ``x <- x 2**beta; q = round(x); x <- x - q``, all exact;
``QA_s`` sums the components' digits, exact integers; ``RA`` sums their remainders in float64).
The product splits exactly into

* the **exact part**, level sums ``D_d = sum_{i+j=d} QA_i QB_j`` for ``d < S``: integer
  GEMMs with ``S k nA nB 2**(2 beta) <= 2**53``, so every partial sum of any float64 GEMM
  (any order, blocking or FMA) is an integer below ``2**53``: computed **exactly**;
* the **tail**, ``sum_{s<S} QA_s RB_{S-s} + RA (2**beta RB_0)`` (``RB_m`` the right operand's
  remainder after m slices, ``RB_0`` the scaled operand itself), whose weight is
  ``2**(-S beta)`` of ``k 2**(e + f)``: one float64 GEMM with inner dimension ``(S + 1) k``,
  rounded, with a proven error below ``2**-(nc p + 4)`` of ``k 2**(e_r + f_c)`` by the choice
  of S (:func:`plan`).

For float32 components and nc = 2 that is S = 1: one exact k-GEMM and one 2k-GEMM, three
float64 GEMMs' worth of work in all.  The terms are summed, smallest first, in float64 MC
arithmetic and rounded to the component dtype; for float32 components and nc = 2 the scaling,
the sum and the rounding run as one C pass over the products (`anynum.mc.cslices.mm_narrow`,
the same operations in the same order: the same bits).  The error bound shared with the int8 engine is
proven in `anynum.mc.linalg`.
"""

from __future__ import annotations

import functools
import math

import torch

from anynum.mc import arith, cslices
from anynum.mc._core import Comps, exponent, info, ldexp
from anynum.mc.batch2d import batched
from anynum.mc.convert import convert_comps
from anynum.mc.expansion import renormalize
from anynum.mc.reduce import tree_sum
from anynum.mc.scratch import MIN_NUMEL, POOL

__all__ = ["COLLAPSE_BITS", "matmul_float", "plan"]

_F64 = torch.float64
_S_MAX = 32
COLLAPSE_BITS = 49  # an expansion of at most this many bits is summed into one float64


def plan(k: int, na: int, nb: int, target: int) -> tuple[int, int, int]:
    """(S slices, beta bits per slice, inner block length kb) for a target of `target` bits.

    beta is the largest width with ``S kb nA nB 2**(2 beta) <= 2**53`` (exact level sums); S is
    the smallest count whose tail error bound ``2 (S+1)**2 kb nA nB max(nA, nB) 2**(-53 - S beta)``
    (relative to ``kb 2**(e + f)``) is at most ``2**-(target + 4)``; the inner dimension is
    cut into blocks of kb when no S qualifies (very long inner dimensions).

    >>> from anynum.mc.ozaki_float import plan
    >>> plan(200, 1, 1, 48)   # float32 components, nc = 2, MC x tensor
    (1, 22, 200)
    >>> plan(200, 2, 2, 106)  # float64 components, nc = 2, MC x MC
    (4, 20, 200)
    """
    return _plan(k, na, nb, target, _S_MAX)


@functools.lru_cache(maxsize=256)
def _plan(k: int, na: int, nb: int, target: int, s_max: int) -> tuple[int, int, int]:
    kb = max(k, 1)
    while True:
        for s in range(s_max + 1):
            beta = (53 - math.ceil(math.log2(max(s, 1) * kb * na * nb))) // 2
            if beta < 1:
                break
            tail = 1 + math.log2((s + 1) ** 2 * kb * na * nb * max(na, nb)) - 53 - s * beta
            if tail <= -target - 4:
                return s, beta, kb
        if kb == 1:  # pragma: no cover - unreachable for targets below ~1000 bits
            raise ValueError(f"no slicing plan for a {target}-bit target")
        kb = (kb + 1) // 2


def _as_f64(x: Comps, pt: int) -> list[torch.Tensor]:
    """The operand as a float64 expansion: exact, or one float64 when it fits in 49 bits."""
    if len(x) > 1 and len(x) * pt <= COLLAPSE_BITS:
        s = x[0].to(_F64, copy=True)
        for c in x[1:]:
            s.add_(c)
        return [s]
    return [c.to(_F64) for i, c in enumerate(x) if i == 0 or bool(c.abs().max() > 0)]


def _row_exponent(comps: list[torch.Tensor]) -> torch.Tensor:
    """Per-row e (int, shape (R, 1)) with |every component| < 2**e (0 for zero rows)."""
    rmax = None
    for c in comps:  # amax and amin: two passes without a temporary (aminmax is slower)
        m = torch.maximum(c.amax(dim=-1, keepdim=True), -c.amin(dim=-1, keepdim=True))
        rmax = m if rmax is None else torch.maximum(rmax, m)
    assert rmax is not None
    return exponent(rmax).to(torch.int64)


def _scaled(c: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
    """c * 2**ex (ex integer per row): one multiplication where 2**ex is a normal float64, two
    (by 2**floor(ex/2), then the rest, `anynum.mc._core.ldexp`) elsewhere, row by row."""
    ok = (ex >= -1022) & (ex <= 1023)
    if bool(ok.all()):
        return c * _pow2(ex)
    return torch.where(ok, c * _pow2(ex.clamp(-1022, 1023)), ldexp(c, ex))


def _pow2(ex: torch.Tensor) -> torch.Tensor:
    """2**ex as float64, built from the exponent bits (exact), for -1022 <= ex <= 1023."""
    return ((ex + 1023) << 52).view(_F64)


def _cut(comps: list[torch.Tensor], e: torch.Tensor, S: int, beta: int,
         slices: list[torch.Tensor], tails: list[torch.Tensor | None]) -> None:
    """Write slice s into ``slices[s]`` (s < S) and remainders into `tails` (see module doc).

    Each component is scaled by ``2**(beta - e)`` (``2**-e`` when S = 0) and then, per slice,
    ``q = round(x)``, ``x <- x - q`` (exact: the remainder of rounding to an integer is a
    multiple of ulp(x) of magnitude <= 1/2), ``x <- 2**beta x`` (exact).  ``tails[m]`` (where
    not None) receives the sum of the components' remainders after m slices,
    ``|.| <= len(comps) / 2`` for m >= 1; ``tails[0]`` is ``2**beta`` times the scaled operand
    when S >= 1 (the scaled operand itself when S = 0).
    """
    xs = [_scaled(c, beta - e if S else -e) for c in comps]
    head = tails[0]
    if head is not None:
        _sum_into(xs, head)
    for s in range(S):
        if s:
            for x in xs:
                x.mul_(2.0**beta)
        tail = tails[s + 1]
        if len(xs) == 1:  # write straight into the buffers: no temporaries
            torch.round(xs[0], out=slices[s])
            if tail is not None and s == S - 1:
                torch.sub(xs[0], slices[s], out=tail)
                return
            xs[0].sub_(slices[s])
        else:
            qs = [torch.round(x) for x in xs]
            for x, q in zip(xs, qs):
                x.sub_(q)
            _sum_into(qs, slices[s])
        if tail is not None:
            _sum_into(xs, tail)


def _sum_into(ts: list[torch.Tensor], out: torch.Tensor) -> None:
    if len(ts) == 1:
        out.copy_(ts[0])
        return
    torch.add(ts[0], ts[1], out=out)
    for t in ts[2:]:
        out.add_(t)


class _Operand:
    """One operand, (R, k) rows to slice: its float64 expansion, or its components for the C slicer."""

    def __init__(self, comps: Comps, pt: int) -> None:
        self.c = cslices.available(comps)
        self.comps = comps if self.c else tuple(_as_f64(comps, pt))
        self.n = 1 if self.c else len(self.comps)

    def block(self, k0: int, kb: int) -> Comps:
        return tuple(c[:, k0 : k0 + kb] for c in self.comps)


@functools.cache
def _f64_like() -> torch.Tensor:
    return torch.empty(0, dtype=_F64)


def _scratch(shape: tuple[int, ...] | torch.Size, device: torch.device, taken: list[torch.Tensor] | None
             ) -> torch.Tensor:
    """An uninitialised float64 buffer: from the scratch pool when `taken` is a list (the buffer
    is appended to it, for the caller to give back) and the buffer is large, else fresh."""
    size = torch.Size(shape)
    if taken is None or device.type != "cpu" or size.numel() < MIN_NUMEL:
        return torch.empty(size, dtype=_F64, device=device)
    buf = POOL.take(size, _f64_like())
    taken.append(buf)
    return buf


def _mm(x: torch.Tensor, y: torch.Tensor, taken: list[torch.Tensor] | None) -> torch.Tensor:
    """x @ y (2-D float64), into a pooled buffer where `_scratch` would pool it."""
    size = torch.Size((x.shape[0], y.shape[1]))
    if taken is None or x.device.type != "cpu" or size.numel() < MIN_NUMEL:
        return torch.mm(x, y)
    return torch.mm(x, y, out=_scratch(size, x.device, taken))


def _slice_left(x: Comps, use_c: bool, S: int, beta: int, taken: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(abuf (R, S + 1, k): slices 0..S-1 and the remainder after S side by side, e (R, 1))."""
    R, k = x[0].shape
    abuf = _scratch((R, S + 1, k), x[0].device, taken)
    if use_c:  # slices and remainder share the buffer: plane stride k, row stride (S + 1) k
        e = torch.empty(R, dtype=torch.int64)
        cslices.slice_rows(x, S, beta, (abuf, (S + 1) * k, k), (abuf, 0, (S + 1) * k, k), 1 << S, e)
        return abuf, e.unsqueeze(1)
    xs = list(x)
    e = _row_exponent(xs)
    tails: list[torch.Tensor | None] = [None] * (S + 1)
    tails[S] = abuf[:, S]
    _cut(xs, e, S, beta, [abuf[:, s] for s in range(S)], tails)
    return abuf, e


def _slice_right(x: Comps, use_c: bool, S: int, beta: int
                 ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(bq (S, N, k) slices or None, btail (N, S + 1, k) = [RB_S, ..., RB_1, 2**beta RB_0], f (N, 1))."""
    N, k = x[0].shape
    dev = x[0].device
    bq = torch.empty(S, N, k, dtype=_F64, device=dev) if S else None
    btail = torch.empty(N, S + 1, k, dtype=_F64, device=dev)
    if use_c:  # remainder m goes to btail[:, S - m]: offset S k, plane stride -k
        f = torch.empty(N, dtype=torch.int64)
        q = (bq, k, N * k) if bq is not None else None
        cslices.slice_rows(x, S, beta, q, (btail, S * k, (S + 1) * k, -k), (1 << (S + 1)) - 1, f)
        f = f.unsqueeze(1)
    else:
        xs = list(x)
        f = _row_exponent(xs)
        tails: list[torch.Tensor | None] = [btail[:, S - mm] for mm in range(S + 1)]
        _cut(xs, f, S, beta, [bq[s] for s in range(S)] if bq is not None else [], tails)
    if not S:
        btail.mul_(2.0**beta)  # S = 0: the tail is RA (2**beta RB_0)
    return bq, btail, f


def _products(a: Comps, a_c: bool, bt: Comps, b_c: bool, S: int, beta: int,
              taken: list[torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The unscaled slice products of a (m, k) @ bt (n, k).T: (tail (m, n), level sums (S, m, n)
    or None when S = 0, row exponents e (m, 1), column exponents f (n, 1)).

    With a list `taken`, large temporaries and the products come from the scratch pool
    (`anynum.mc.scratch`) and are appended to it: the caller gives them back once done with
    the products.  Without, everything is freshly allocated.
    """
    m, k = a[0].shape
    n = bt[0].shape[0]
    bq, btail, f = _slice_right(bt, b_c, S, beta)
    if n == 1 and a_c and S <= cslices.MV_MAX_S:  # matrix-vector: slice and multiply in one pass
        lev_v, tail_v, e_v = cslices.mv(a, S, beta, bq.view(S, k) if bq is not None else None,
                                        btail.view(S + 1, k))
        e = e_v.unsqueeze(1)
        tail = tail_v.unsqueeze(1)
        lev: torch.Tensor | None = lev_v.unsqueeze(2)
    else:
        dev = a[0].device
        abuf, e = _slice_left(a, a_c, S, beta, taken)
        tail = _mm(abuf.view(m, (S + 1) * k), btail.view(n, (S + 1) * k).T, taken)
        lev = None
        if S > 1:
            lev = _scratch((S, m, n), dev, taken)
            lev.zero_()
        for s in range(S):
            assert bq is not None
            # exact: integers < 2**53
            p = _mm(abuf.select(1, s), bq.narrow(0, 0, S - s).reshape((S - s) * n, k).T, taken)
            if lev is None:  # S = 1: the one level sum is this product
                lev = p.view(1, m, n)
            else:
                lev[s:].add_(p.view(m, S - s, n).transpose(0, 1))  # exact
    return tail, lev if S else None, e, f


def _core2d(a: Comps, a_c: bool, bt: Comps, b_c: bool, S: int, beta: int, narrow: bool
            ) -> list[torch.Tensor]:
    """Terms (float64, (m, n)), smallest first, whose sum is the product a (m, k) @ bt (n, k).T."""
    tail, lev, e, f = _products(a, a_c, bt, b_c, S, beta)
    scale = _Scale(e, f, narrow)
    terms = [scale(tail, (S + 1) * beta)]
    if lev is not None:
        terms += [scale(lev[d], (d + 2) * beta) for d in range(S - 1, -1, -1)]
    return terms


class _Scale:
    """x * 2**(e_r + f_c - c) for (m, n) terms x, exactly (barring underflow of the result).

    For operands of 16- and 32-bit components (`narrow`) two broadcast multiplications, by
    2**e_r and by 2**(f_c - c): the exponents are within float32's range, so both factors are
    normal float64 numbers and so is every intermediate (the terms' nonzero magnitudes lie
    within 2**+-350 there), so both multiplications are exact.  Otherwise `_scaled` on the
    (m, n) exponents.
    """

    def __init__(self, e: torch.Tensor, f: torch.Tensor, narrow: bool) -> None:
        self.e, self.f, self.narrow = e, f.T, narrow
        if narrow:
            self.pe = _pow2(self.e)

    def __call__(self, x: torch.Tensor, c: int) -> torch.Tensor:
        if self.narrow:
            return x * self.pe * _pow2(self.f - c)
        return _scaled(x, self.e + self.f - c)


def sum_terms(terms: list[torch.Tensor], nc_acc: int) -> Comps:
    """The sum of slice products `terms` (smallest first) as `nc_acc` components (both Ozaki engines).

    >>> sum_terms([torch.tensor([2.0**-60]), torch.tensor([1.0])], 2)[1].item() == 2.0**-60
    True
    """
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
    return renormalize(terms[::-1], nc_acc)


def matmul_float(a: Comps, b: Comps, nc: int) -> Comps:
    """Float-slicing Ozaki product of a (..., m, k) and b (..., k, n), nc-component result.

    >>> import torch
    >>> from anynum.mc.ozaki_float import matmul_float
    >>> a = (torch.tensor([[1.0, 2.0**-30]]), torch.zeros(1, 2))
    >>> r = matmul_float(a, (torch.ones(2, 1),), 2)
    >>> r[0].item(), r[1].item() == 2.0**-30
    (1.0, True)
    """
    t = a[0].dtype
    pt = info(t).precision
    nc_acc = nc if t == _F64 else max(1, math.ceil(nc * pt / 53)) + (1 if nc > 1 else 0)
    fused = t == torch.float32 and nc == 2 and nc_acc == 2  # float32 double words: mm_narrow

    def core(p: Comps, q: Comps) -> Comps:
        m, k = p[0].shape
        n = q[0].shape[1]
        if m == 0 or n == 0 or k == 0:
            z = torch.zeros(m, n, dtype=_F64, device=p[0].device)
            return (z,) + (torch.zeros_like(z),) * (nc_acc - 1)
        if m == 1 and n > 1:  # a vector times a matrix: the matrix-vector product, transposed
            return tuple(c.T for c in core(tuple(c.T for c in q), tuple(c.T for c in p)))
        pa, pb = _Operand(p, pt), _Operand(tuple(c.T for c in q), pt)
        S, beta, kb = plan(k, pa.n, pb.n, nc * pt)
        if fused and pa.c and pb.c and kb >= k and S <= cslices.EPI_MAX_S:
            # scale, sum and narrow in one C pass: the bits of the steps below (_Scale,
            # sum_terms, convert_comps), as two float32 components
            taken: list[torch.Tensor] = []
            tail, lev, e, f = _products(pa.comps, True, pb.comps, True, S, beta, taken)
            try:
                return cslices.mm_narrow(tail, lev, S, beta, e.view(-1), f.view(-1))
            finally:
                POOL.give(*taken)
        blocks = []
        for k0 in range(0, k, kb):
            terms = _core2d(pa.block(k0, kb), pa.c, pb.block(k0, kb), pb.c, S, beta, t != _F64)
            blocks.append(sum_terms(terms, nc_acc))
        if len(blocks) == 1:
            return blocks[0]
        return tree_sum(tuple(torch.stack([blk[i] for blk in blocks]) for i in range(nc_acc)), 0, nc_acc)

    res = batched(core, a, b)
    if res[0].dtype != t or len(res) != nc:  # not already narrowed by mm_narrow
        res = convert_comps(res, t, nc)
    return res
