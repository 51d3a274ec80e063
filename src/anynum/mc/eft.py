"""Error-free transforms: two_sum, fast_two_sum, two_prod, split, and the FMA probe.

An error-free transform returns the rounded result ``s`` of one operation and its exact
rounding error ``e`` (``s + e`` equals the exact result), which is what multi-component
arithmetic is built from.

FMA
    ``two_prod`` needs the exact error ``a*b - RN(a*b)``.  With a fused multiply-add that is
    ``fma(a, b, -p)``.  PyTorch has no public ``torch.fma``; on AVX2/AVX-512 CPUs eager
    ``torch.addcmul`` happens to be fused, but not with ``ATEN_CPU_CAPABILITY=default`` nor
    under ``torch.compile``.  So for float32/float64 we *probe* it the first time it is needed
    (never at ``import anynum``): ``torch.addcmul`` must reproduce the Dekker error term on
    known and random inputs, vector tails included.  If it does not, Dekker/Veltkamp
    splitting is used (splitter ``2**ceil(p/2) + 1``: ``2**27+1`` for float64, ``2**12+1``
    for float32, ``2**6+1`` for float16, ``2**4+1`` for bfloat16), with power-of-two scaling
    around the problem so the split cannot overflow or underflow.

    For float16 and bfloat16 the "FMA" is emulated exactly in float32: the product of two
    such numbers is exact in float32, the float32 sum is made round-to-odd with a two-sum
    correction, and rounding a round-to-odd float32 (24 >= p + 2 bits) to the component
    dtype is then the correctly rounded fused result.  This uses float32 for these
    elementwise transforms only; matrix products never use a wider type unless asked.

    Set ``ANYNUM_MC_FMA=0`` in the environment, or use :func:`fma_policy`, to force the
    Dekker path (for testing it, or for bit-reproducibility across CPUs).

Package-internal names
    ``raw_two_sum``, ``raw_fast_two_sum``, ``raw_two_prod`` and ``raw_fma`` are the same
    transforms without the argument checks and without the NaN/inf clean-up of the public
    functions (their error term may be NaN/inf where the result is not finite).  The
    arithmetic modules of `anynum.mc` use them on tensors they have already checked; they
    are not re-exported by :mod:`anynum.mc`.

Remaining limits (documented in docs/mc.md): the error term is exact only when it is
representable, i.e. when ``|a*b|`` is at least ``2**(emin + p)`` (for smaller products it is
rounded, as it must be); when ``a*b`` or ``a+b`` overflows, ``s`` is ±inf and the public
functions return ``e = 0``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from anynum.mc._core import exponent, info, ldexp

__all__ = [
    "fast_two_sum",
    "fma",
    "fma_available",
    "fma_policy",
    "split",
    "two_prod",
    "two_sum",
]

_PROBED: dict[torch.dtype, bool] = {}
_FORCE: list[bool | None] = [None]


def _env_force() -> bool | None:
    v = os.environ.get("ANYNUM_MC_FMA")
    if v is None or v == "":
        return None
    return v.strip().lower() not in ("0", "false", "no", "off")


@contextlib.contextmanager
def fma_policy(enabled: bool | None) -> Iterator[None]:
    """Force the FMA path on/off (``None``: probe) inside a ``with`` block.

    Forcing it on where the probe fails gives wrong error terms, so only ``False`` and
    ``None`` are normally useful.

    >>> import torch
    >>> from anynum import mc
    >>> with mc.eft.fma_policy(False):
    ...     mc.fma_available(torch.float64)
    False
    """
    old = _FORCE[0]
    _FORCE[0] = enabled
    try:
        yield
    finally:
        _FORCE[0] = old


def _probe(dtype: torch.dtype) -> bool:
    """Does eager ``torch.addcmul(c, a, b)`` compute an exact fused multiply-add?"""
    inf = info(dtype)
    h = 2.0 ** -((inf.precision + 1) // 2 + 1)
    gen = torch.Generator().manual_seed(1234)
    vals = [1.0 + h, 1.0 - h, 3.0 + 2 * h, 1.0 / 3.0]
    for n in (1, 7, 64, 1031):
        a = torch.empty(n, dtype=torch.float64).uniform_(0.5, 2.0, generator=gen).to(dtype)
        b = torch.empty(n, dtype=torch.float64).uniform_(-2.0, 2.0, generator=gen).to(dtype)
        a[: min(n, 4)] = torch.tensor(vals[: min(n, 4)], dtype=torch.float64).to(dtype)
        b[: min(n, 4)] = torch.tensor(vals[: min(n, 4)], dtype=torch.float64).to(dtype)
        p = a * b
        e_fma = torch.addcmul(-p, a, b)
        e_ref = _dekker_error(a, b, p)
        if not torch.equal(e_fma, e_ref):
            return False
        if n >= 4 and not bool((e_ref[:4] != 0).any()):  # pragma: no cover - sanity
            return False
    return True


def fma_available(dtype: torch.dtype) -> bool:
    """Whether `two_prod` and the multiplication algorithms use an exact FMA for `dtype`.

    float16/bfloat16: exact float32 emulation, always available unless forced off.
    float32/float64: ``torch.addcmul`` verified by a probe on first use (cached).

    >>> import torch
    >>> from anynum import mc
    >>> isinstance(mc.fma_available(torch.float32), bool)
    True
    """
    info(dtype)
    force = _FORCE[0] if _FORCE[0] is not None else _env_force()
    if force is False:
        return False
    if dtype in (torch.float16, torch.bfloat16):
        return True
    if dtype not in _PROBED:
        _PROBED[dtype] = _probe(dtype)
    return _PROBED[dtype]


# ------------------------------------------------------------------ primitives
def raw_two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum without checks: ``s = RN(a + b)``, ``e = a + b - s`` (6 operations).

    >>> import torch
    >>> from anynum.mc import eft
    >>> s, e = eft.raw_two_sum(torch.tensor([1.0]), torch.tensor([2.0**-30]))
    >>> e.item() == 2.0**-30
    True
    """
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def raw_fast_two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's Fast2Sum without checks: exact when ``|a| >= |b|`` (3 operations).

    >>> import torch
    >>> from anynum.mc import eft
    >>> eft.raw_fast_two_sum(torch.tensor([1.0]), torch.tensor([2.0**-30]))[1].item() == 2.0**-30
    True
    """
    s = a + b
    e = b - (s - a)
    return s, e


def _split_raw(a: torch.Tensor, splitter: float) -> tuple[torch.Tensor, torch.Tensor]:
    c = a * splitter
    hi = c - (c - a)
    return hi, a - hi


def _dekker_error(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Dekker's exact error of p = RN(a*b), valid without over/underflow."""
    k = info(a.dtype).splitter
    ah, al = _split_raw(a, k)
    bh, bl = _split_raw(b, k)
    return ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _safe_for_dekker(a: torch.Tensor, b: torch.Tensor, p: torch.Tensor) -> bool:
    inf = info(a.dtype)
    half = (inf.precision + 1) // 2
    big = 2.0 ** (inf.emax - half - 1)
    small = 2.0 ** (inf.emin + inf.precision + 1)
    aa, ab, ap = a.abs(), b.abs(), p.abs()
    ok = (aa <= big) & (ab <= big) & (ap <= big) & ((ap >= small) | (ap == 0))
    return bool(ok.all())


def _two_prod_dekker(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = a * b
    if _safe_for_dekker(a, b, p):
        return p, _dekker_error(a, b, p)
    # Scale a and b to [1/2, 1): the split and the partial products can then neither
    # overflow nor underflow; scale the exact error back.
    ea = torch.where(a == 0, 0, exponent(a))
    eb = torch.where(b == 0, 0, exponent(b))
    a_s = ldexp(a, -ea)
    b_s = ldexp(b, -eb)
    p_s = a_s * b_s
    e_s = _dekker_error(a_s, b_s, p_s)
    big = ea + eb
    e = ldexp(e_s, big) + (ldexp(p_s, big) - p)
    e = torch.where(torch.isfinite(a_s) & torch.isfinite(b_s), e, torch.zeros_like(e))
    return p, e


def _two_prod_lowp(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float16/bfloat16: the product is exact in float32."""
    p32 = a.float() * b.float()
    p = p32.to(a.dtype)
    e = (p32 - p.float()).to(a.dtype)
    return p, e


def raw_two_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`two_prod` without checks; ``e`` may be NaN/inf where ``p`` is not finite.

    >>> import torch
    >>> from anynum.mc import eft
    >>> x = torch.tensor([1.0 + 2.0**-20])
    >>> eft.raw_two_prod(x, x)[1].item() == 2.0**-40
    True
    """
    if fma_available(a.dtype):
        if a.dtype in (torch.float16, torch.bfloat16):
            return _two_prod_lowp(a, b)
        p = a * b
        return p, torch.addcmul(-p, a, b)
    return _two_prod_dekker(a, b)


def _fma_lowp(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Exact RN(a*b + c) for float16/bfloat16 via float32 round-to-odd."""
    p = a.float() * b.float()
    c32 = c.float()
    s, e = raw_two_sum(p, c32)
    odd = (s.view(torch.int32) & 1) == 1
    need = (e != 0) & ~odd & torch.isfinite(s)
    if bool(need.any()):
        toward = torch.where(e > 0, torch.full_like(s, float("inf")), torch.full_like(s, -float("inf")))
        s = torch.where(need, torch.nextafter(s, toward), s)
    return s.to(a.dtype)


def raw_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """:func:`fma` without checks: only valid where :func:`fma_available` is true.

    >>> import torch
    >>> from anynum.mc import eft
    >>> a = torch.tensor([1.0 + 2.0**-6], dtype=torch.float16)  # float16: always exact
    >>> eft.raw_fma(a, a, -(a * a)).item() == 2.0**-12
    True
    """
    if a.dtype in (torch.float16, torch.bfloat16):
        return _fma_lowp(a, b, c)
    return torch.addcmul(c, a, b)


# ------------------------------------------------------------------ public API
def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    from anynum.errors import AnynumError

    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise AnynumError(
            f"expected two torch.Tensors, got {type(a).__name__} and {type(b).__name__}; "
            "wrap numbers with torch.tensor(..., dtype=...)"
        )
    info(a.dtype)
    if a.dtype != b.dtype:
        raise AnynumError(
            f"both operands must have the same dtype, got {a.dtype} and {b.dtype}; "
            "convert one with .to(other.dtype)"
        )


def _clean(s: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return s, torch.where(torch.isfinite(s), e, torch.zeros_like(e))


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum: ``s = RN(a + b)`` and the exact error ``e = a + b - s``.

    No condition on the magnitudes.  NaN/inf: where ``s`` is not finite (an input is
    NaN/inf, or the sum overflows) ``e`` is 0, so ``s + e`` is ``s``.

    >>> import torch
    >>> from anynum import mc
    >>> s, e = mc.two_sum(torch.tensor([1.0]), torch.tensor([2.0**-30]))
    >>> s.item(), e.item() == 2.0**-30
    (1.0, True)
    """
    _check_pair(a, b)
    return _clean(*raw_two_sum(a, b))


def fast_two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dekker's Fast2Sum: exact ``(s, e)`` provided ``|a| >= |b|`` (or a == 0).

    Three operations instead of six; if ``|a| < |b|`` the error term may be wrong
    (use :func:`two_sum`).  NaN/inf: as :func:`two_sum`.

    >>> import torch
    >>> from anynum import mc
    >>> s, e = mc.fast_two_sum(torch.tensor([1.0]), torch.tensor([1e-9]))
    >>> (s.double() + e.double()).item() == 1.0 + float(torch.tensor(1e-9))
    True
    """
    _check_pair(a, b)
    return _clean(*raw_fast_two_sum(a, b))


def two_prod(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``p = RN(a * b)`` and the exact error ``e = a * b - p``.

    Uses an exact FMA where :func:`fma_available` says so, otherwise Dekker's algorithm
    with Veltkamp splitting and power-of-two scaling (so huge or tiny operands do not
    overflow in the split).  The error is exact whenever it is representable, i.e. unless
    ``|a*b| < 2**(emin + p)`` (then it is rounded).  NaN/inf: where ``p`` is not finite
    (NaN/inf input or overflow) ``e`` is 0.

    >>> import torch
    >>> from anynum import mc
    >>> x = torch.tensor([1.0 + 2.0**-20])
    >>> p, e = mc.two_prod(x, x)
    >>> e.item() == 2.0**-40
    True
    """
    _check_pair(a, b)
    return _clean(*raw_two_prod(a, b))


def split(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Veltkamp split ``a = hi + lo`` with ``hi`` holding the top ``p - ceil(p/2)`` bits.

    The splitter is ``2**ceil(p/2) + 1`` (``2**27+1`` float64, ``2**12+1`` float32,
    ``2**6+1`` float16, ``2**4+1`` bfloat16).  Large inputs are scaled down by a power of
    two first so ``splitter * a`` cannot overflow.  NaN/inf: ``hi`` is the input, ``lo`` 0.

    >>> import torch
    >>> from anynum import mc
    >>> hi, lo = mc.split(torch.tensor([1.0 / 3.0], dtype=torch.float64))
    >>> bool(hi + lo == torch.tensor([1.0 / 3.0], dtype=torch.float64))
    True
    """
    if not isinstance(a, torch.Tensor):
        from anynum.errors import AnynumError

        raise AnynumError(f"expected a torch.Tensor, got {type(a).__name__}")
    inf = info(a.dtype)
    half = (inf.precision + 1) // 2
    big = 2.0 ** (inf.emax - half - 1)
    shift = half + 2
    large = a.abs() > big
    a_s = torch.where(large, a * 2.0 ** (-shift), a)
    hi, lo = _split_raw(a_s, inf.splitter)
    hi = torch.where(large, hi * 2.0**shift, hi)
    lo = torch.where(large, lo * 2.0**shift, lo)
    fin = torch.isfinite(a)
    return torch.where(fin, hi, a), torch.where(fin, lo, torch.zeros_like(lo))


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Correctly rounded ``a * b + c`` where :func:`fma_available` is true.

    Raises `AnynumError` where no exact FMA is available for the dtype.  NaN/inf follow
    IEEE 754 fusedMultiplyAdd.

    >>> import torch
    >>> from anynum import mc
    >>> a = torch.tensor([1.0 + 2.0**-12])
    >>> mc.eft.fma(a, a, -(a * a)).item() == 2.0**-24
    True
    """
    _check_pair(a, b)
    _check_pair(a, c)
    if not fma_available(a.dtype):
        from anynum.errors import AnynumError

        raise AnynumError(
            f"no exact fused multiply-add is available for {a.dtype} on this machine "
            "(the torch.addcmul probe failed or ANYNUM_MC_FMA=0); use two_prod instead"
        )
    return raw_fma(a, b, c)
