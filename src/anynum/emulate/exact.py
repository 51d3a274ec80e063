"""Exact sums and dot products of float64 values: the quire, and the exact blocks of ``order=k``.

Two pieces, both exact with no condition on magnitudes or cancellation:

`exact_sum` adds float64 terms into an integer accumulator (a fixed-point
number in 26-bit int64 limbs spanning the terms' exponent range, like a
posit quire), normalises the carries, and returns the exact total as a pair
``(y, e)``: y the sum's first 53 bits and e the rest, whose sign is exact (the
sticky bit); y + e is within 2**-100 of the sum, relative.

`exact_dot` computes ``a @ b`` exactly by Ozaki splitting: each operand is
cut into slices of beta-bit integers (times a power of two per row/column),
chosen so that every slice product ``A_s @ B_t`` is an integer matrix whose
float64 matmul is exact (``K * 2**(2*beta) <= 2**53``); the few slice products
per output are then added by `exact_sum`. Where the operands' whole span fits
one slice (posit8: 13 bits) this is a single float64 matmul.

`anynum.emulate.grid.Grid.round_pair` rounds the pair once; the reference
twin is ``tests/emulate/reference.py`` (fractions.Fraction).
"""

from __future__ import annotations

import math

import torch

from anynum.mc.eft import two_sum

__all__ = ["add_tail", "exact_dot", "exact_sum"]

_W = 26  # limb width: two limbs make an exact 52-bit float64 integer
_MASK = (1 << _W) - 1


def add_tail(y: torch.Tensor, e: torch.Tensor, tail: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair ``(y, e)`` plus `tail`, renormalised: ``y + e + tail`` as ``(y2, e2)`` with e2's sign exact.

    ``(t, tt) = TwoSum(e, tail)`` and ``(y2, u) = TwoSum(y, t)`` are exact, so the
    remainder is exactly ``u + tt``, and a float sum keeps the sign of its exact
    value. Used where tails are TwoSum/TwoProduct errors (|e2| below an ulp of y2).

    >>> import torch
    >>> one, tiny = torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0**-80], dtype=torch.float64)
    >>> y, e = add_tail(one, torch.zeros(1, dtype=torch.float64), -tiny)
    >>> y.item(), e.item() < 0
    (1.0, True)
    """
    t, tt = two_sum(*torch.broadcast_tensors(e, tail))
    y2, u = two_sum(*torch.broadcast_tensors(y, t))
    return y2, u + tt


def _frexp53(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, E) with x = M * 2**E, M an int64 of at most 53 bits (0 for x == 0)."""
    m, e = torch.frexp(x)
    return (m * 2.0**53).to(torch.int64), e.to(torch.int64) - 53


def exact_sum(terms: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sum of float64 `terms` along `dim`, as ``(y, e)`` with ``y + e`` the sum.

    y is within one float64 ulp of the sum; e holds the rest: its sign is exact
    and its value is good to about 2**-100 relative. Empty sums give (0, 0). A
    NaN or ±inf term gives the float64 sum (NaN or ±inf) and e = 0.

    >>> import torch
    >>> t = torch.tensor([[1e30, 1.0, -1e30, 2.0**-60]], dtype=torch.float64)
    >>> y, e = exact_sum(t)
    >>> y.item() == 1.0 and e.item() == 2.0**-60
    True
    """
    t = torch.movedim(terms.to(torch.float64), dim, -1)
    out_shape = t.shape[:-1]
    n_terms = t.shape[-1]
    t = t.reshape(-1, n_terms)
    zero = torch.zeros(t.shape[0], dtype=torch.float64, device=t.device)
    if n_terms == 0 or t.shape[0] == 0:
        return zero.view(out_shape), zero.view(out_shape).clone()
    if n_terms == 1:
        return t[:, 0].reshape(out_shape), zero.view(out_shape).clone()
    finite = torch.isfinite(t).all(dim=1)
    if not bool(finite.all()):
        y, e = zero.clone(), zero.clone()
        y[~finite] = t[~finite].sum(dim=1)
        if bool(finite.any()):
            yf, ef = exact_sum(t[finite])
            y[finite], e[finite] = yf, ef
        return y.view(out_shape), e.view(out_shape)
    mant, expo = _frexp53(t)
    return _sum_scaled(mant, expo, out_shape)


def _sum_scaled(
    mant: torch.Tensor, expo: torch.Tensor, out_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sum along the last dimension of ``mant * 2**expo`` (int64, ``|mant| < 2**53``,
    any exponents: the terms need not be float64 numbers) as the pair of `exact_sum`."""
    zero = torch.zeros(mant.shape[0], dtype=torch.float64, device=mant.device)
    nz = mant != 0
    if not bool(nz.any()):
        return zero.view(out_shape), zero.view(out_shape).clone()
    n_terms = mant.shape[-1]
    low = int(expo[nz].min())
    shift = torch.where(nz, expo - low, 0)
    headroom = max(1, math.ceil(math.log2(n_terms + 1) / _W)) + 1
    n_limbs = (int(shift.max()) + 53) // _W + 2 + headroom
    limbs = torch.zeros(mant.shape[0], n_limbs, dtype=torch.int64, device=mant.device)
    sign = torch.sign(mant)
    mag = mant.abs()
    for piece, offset in ((mag & _MASK, 0), (mag >> _W, _W)):
        pos = shift + offset
        j, r = pos // _W, pos % _W
        wide = piece << r  # < 2**53
        limbs.scatter_add_(1, j, sign * (wide & _MASK))
        limbs.scatter_add_(1, j + 1, sign * (wide >> _W))
    limbs = _propagate(limbs)
    negative = limbs[:, -1] < 0  # the top limb holds the sign after propagation (0 or -1)
    if bool(negative.any()):
        neg = torch.where(negative.unsqueeze(1), _MASK - limbs, limbs)
        neg[:, -1] = 0
        neg[:, 0] += negative.to(torch.int64)
        limbs = _propagate(neg)
    return _to_pair(limbs, low, negative, out_shape)


def _propagate(limbs: torch.Tensor) -> torch.Tensor:
    """Carries moved up so every limb but the last lies in [0, 2**26) (value unchanged)."""
    limbs = limbs.clone()
    carry = torch.zeros_like(limbs[:, 0])
    for j in range(limbs.shape[1] - 1):
        v = limbs[:, j] + carry
        limbs[:, j] = v & _MASK
        carry = v >> _W  # floor division: negative values carry -1s upwards
    limbs[:, -1] += carry
    return limbs


def _to_pair(
    limbs: torch.Tensor, low: int, negative: torch.Tensor, out_shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, e) of sign * sum(limbs[j] * 2**(26 j + low)), magnitude limbs in [0, 2**26).

    y is the magnitude's top 53 bits (truncated, so exact; in float64's subnormal range
    its bits down to 2**-1074), e >= 0 the rest: zero exactly when the rest is, and its
    value taken from the next 52 bits plus half a unit for anything further down
    (within 2**-100 of the sum, relative). A nonzero rest below float64's range
    keeps its sign as e = ±2**-1074.
    """
    n = limbs.shape[1]
    idx = torch.arange(n, device=limbs.device)
    top = torch.where(limbs != 0, idx, -1).amax(dim=1)  # -1: the sum is 0
    zero = top < 0

    def limb(k: torch.Tensor) -> torch.Tensor:
        v = limbs.gather(1, k.clamp(min=0).unsqueeze(1)).squeeze(1)
        return torch.where(k >= 0, v, 0)

    lt = limb(top)
    hi = (lt << _W) | limb(top - 1)  # at most 52 bits
    lo = limb(top - 2)
    nbits = torch.floor(torch.log2(lt.clamp(min=1).to(torch.float64))).to(torch.int64) + 1 + _W
    k = 53 - nbits  # bits still needed from lo: 1 .. 26
    mant = (hi << k) | (lo >> (_W - k))
    dropped = lo & ((1 << (_W - k)) - 1)
    # the sum is (mant + frac) * 2**u, frac in [0, 1) made of `dropped` and the limbs below
    u = (top - 2) * _W + low + (_W - k)
    cut = (-1074 - u).clamp(0, 53)  # y's bits below float64's smallest subnormal go to e
    kept = (mant >> cut) << cut
    y = _ldexp(kept.to(torch.float64), u)  # exact: at most 53 bits, none below 2**-1074
    below = torch.where(idx.unsqueeze(0) < (top - 4).unsqueeze(1), limbs, 0).ne(0).any(dim=1)
    rest = ((limb(top - 3) << _W) | limb(top - 4)).to(torch.float64) * 2.0**-52  # exact: 52 bits
    rest = rest + torch.where(below, 2.0**-53, 0.0)  # 53 bits: exact
    frac = (dropped.to(torch.float64) + rest) * torch.exp2((k - _W).to(torch.float64))
    e = _ldexp((mant - kept).to(torch.float64) + frac, u)  # both below y's last bit; e >= 0
    e = torch.where((e == 0) & (frac + (mant - kept).to(torch.float64) > 0), 2.0**-1074, e)
    sign = torch.where(negative, -1.0, 1.0).to(torch.float64)
    y = torch.where(zero, 0.0, y * sign)
    e = torch.where(zero, 0.0, e * sign)
    return y.view(out_shape), e.view(out_shape)


def _ldexp(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``x * 2**n`` for int64 `n` beyond float64's exponent range, exact wherever the result
    is a float64 number (torch.ldexp multiplies by ``2.0**n``, which is 0 or inf out there).

    The exponent is applied in pieces of one sign, so every partial product lies between x
    and the result: none overflows or underflows unless the result does.
    """
    n = n.clamp(-3000, 3000)
    for _ in range(3):
        step = n.clamp(-1000, 1000)
        x = x * torch.exp2(step.to(torch.float64))
        n = n - step
    return x


def _span(x: torch.Tensor) -> tuple[int, int]:
    """(H, L): every nonzero |x| < 2**H and is a multiple of 2**L."""
    mant, expo = _frexp53(x)
    nz = mant != 0
    if not bool(nz.any()):
        return 0, 0
    tz = _trailing_zeros(mant.abs())
    return int((expo + 53)[nz].max()), int((expo + tz)[nz].min())


def _trailing_zeros(m: torch.Tensor) -> torch.Tensor:
    """Count of trailing zero bits of positive int64 m (53 for m == 0)."""
    lowbit = m & (-m)
    return torch.where(m != 0, torch.log2(lowbit.to(torch.float64)).round().to(torch.int64), 53)


def _slices(x: torch.Tensor, beta: int) -> list[tuple[torch.Tensor, int]]:
    """x = sum_s q_s * 2**t_s with integer q_s, |q_s| < 2**beta (t_s one exponent per slice).

    The slices are laid from x's lowest set bit upwards, so every 2**t_s is at least x's
    smallest nonzero magnitude: a float64 number, which dividing by keeps exact.
    """
    top, low = _span(x)
    n = max(1, math.ceil((top - low) / beta))
    out = []
    r = x
    for s in range(n):
        t = low + (n - 1 - s) * beta
        scale = math.ldexp(1.0, t)
        q = torch.trunc(r / scale)
        r = r - q * scale
        out.append((q, t))
    return out


def _one_slice(x: torch.Tensor, dim: int, beta: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x = q * scale with integer q, |q| < 2**beta, one scale per line (x's `dim` reduced), or None
    where one slice does not hold x exactly.

    The slicing of `_slices` when it needs one slice, without its scan for the lowest set bit:
    try the line's top slice and check that it loses nothing (a few passes instead of twenty).
    """
    _, top = torch.frexp(x.abs().amax(dim=dim, keepdim=True))  # every |x| of a line < 2**top
    one = torch.ones(top.shape, dtype=torch.float64, device=x.device)
    scale = torch.ldexp(one, (top - beta).to(torch.float64))
    q = torch.trunc(x / scale)
    if not bool((q * scale == x).all()):  # a fraction cut off (or a tiny x underflowed to 0)
        return None
    return q, scale


def exact_dot(
    a: torch.Tensor, b: torch.Tensor, extra: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact ``a @ b`` (plus the terms of `extra`, [..., M, N, T]) as a pair ``(y, e)``.

    `a` is [..., M, K] and `b` [..., K, N], float64 (batch dimensions broadcast as
    in torch.matmul). NaN/inf anywhere in a row/column pair give the float64
    result with e = 0.

    >>> import torch
    >>> a = torch.tensor([[2.0**60, 1.0, -(2.0**60)]], dtype=torch.float64)
    >>> b = torch.tensor([[1.0], [2.0**-70], [1.0]], dtype=torch.float64)
    >>> y, e = exact_dot(a, b)
    >>> y.item() == 2.0**-70 and e.item() == 0.0
    True
    """
    a = a.to(torch.float64)
    b = b.to(torch.float64)
    k = a.shape[-1]
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        y = a @ b
        if extra is not None:
            y = y + extra.sum(-1)
        return y, torch.zeros_like(y)
    beta = max(1, (53 - math.ceil(math.log2(max(k, 1) + 1))) // 2)
    if extra is None:  # operands of few bits over a short span (posit8): one exact matmul
        one_a = _one_slice(a, -1, beta)
        one_b = _one_slice(b, -2, beta) if one_a is not None else None
        # exact while the scales' product stays a normal float64 (tiny operands: the slices)
        if one_a is not None and one_b is not None and float(one_a[1].min() * one_b[1].min()) >= 2.0**-1022:
            y = (one_a[0] @ one_b[0]) * one_a[1] * one_b[1]
            return y, torch.zeros_like(y)
    sa = _slices(a, beta)
    sb = _slices(b, beta)
    mants, expos = [], []
    for qa, ta in sa:
        for qb, tb in sb:
            mants.append((qa @ qb).to(torch.int64))  # exact integers of at most 53 bits
            expos.append(ta + tb)  # below float64's range for tiny operands: kept apart
    if len(mants) == 1 and extra is None and expos[0] >= -1074:  # one exact matmul
        y = _ldexp(mants[0].to(torch.float64), torch.tensor(expos[0], device=a.device))
        return y, torch.zeros_like(y)
    mant = torch.stack(mants, dim=-1)
    expo = torch.tensor(expos, dtype=torch.int64, device=mant.device).expand(mant.shape)
    if extra is not None:
        extra = extra.to(torch.float64).expand(*mant.shape[:-1], extra.shape[-1])
        bad = ~torch.isfinite(extra).all(dim=-1)
        if bool(bad.any()):  # a NaN/inf term: the float64 sum there, the exact one elsewhere
            y, e = exact_dot(a, b, torch.where(bad.unsqueeze(-1), 0.0, extra))
            y = torch.where(bad, (a @ b) + extra.sum(-1), y)
            return y, torch.where(bad, 0.0, e)
        em, ee = _frexp53(extra)
        mant, expo = torch.cat([mant, em], -1), torch.cat([expo, ee], -1)
    shape = mant.shape[:-1]
    return _sum_scaled(mant.reshape(-1, mant.shape[-1]), expo.reshape(-1, mant.shape[-1]), shape)
