"""Posits (type III unums) of any width 2..32 and exponent size, per the 2022 Posit Standard.

An n-bit posit is a two's-complement code: 0 is zero, ``1 << (n-1)`` is NaR
(Not a Real), and the other codes read, after negating negative codes, as a
sign bit, a regime (a run of identical bits ended by the opposite bit or by
the end of the word), ``es`` exponent bits and the fraction::

    value = useed**k * 2**e * (1 + f),   useed = 2**(2**es)

Bits cut off by the end of the word read as zeros. Codes are ordered like
their values (as two's-complement integers), which is what makes rounding on
the bit string possible: the boundary between neighbours with codes L and L+1
is the value of the (n+1)-bit code 2L+1. Where that extra bit is a fraction
bit the boundary is the arithmetic midpoint of the neighbours; where it is an
exponent or regime bit it is the geometric one (posit(8,2): the neighbours
65536 and 262144 meet at 131072, so 144179.2 rounds up). Ties go to the even
code. Rounding never gives 0 or NaR for a nonzero real input: below minpos it
saturates to ±minpos (``underflow="zero"`` lifts that rule for zero), above
maxpos to ±maxpos. NaN and ±inf become NaR, which decodes to NaN.

``scale_exp`` is the Qtorch+ exponent bias: the format's values are the posit
values times ``2**-scale_exp``, and rounding x is rounding ``x * 2**scale_exp``
to the posit, scaled back; both steps are exact. See docs/posits.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from anynum._bits import floor_log2, layout, ldexp, pow2, select
from anynum.errors import FormatError
from anynum.formats.base import Format

__all__ = ["POSIT8", "POSIT16", "POSIT32", "Posit"]

_MAX_N = 32
_MAX_ES = 9  # useed = 2**(2**es) must be a finite float64 (2**512 is; 2**1024 is not)
_EMAX = 1023  # largest float64 binade
_EMIN = -1022  # smallest normal float64 binade: every posit value stays a normal number
_ONE_MINUS_ULP = 1.0 - 2.0**-53  # largest float64 below 1


@dataclass
class PositSplit:
    """Where magnitudes sit on the posit grid (see `Posit.locate`).

    For positive finite ``a`` below maxpos, the infinitely long posit bit string
    of ``a``, read as a binary number with the point after bit n, is
    ``code_lo + frac_code``: ``code_lo`` is the n-bit code of the grid point at
    or below ``a`` and ``frac_code`` in [0, 1) the dropped bits, i.e. the
    position of ``a`` between that code and the next in *code* space (linear in
    the value where fraction bits are cut, in the exponent where exponent or
    regime bits are cut). The dropped bits are kept exactly as the integer
    ``dropped`` over ``2**dropped_len``.

    Attributes:
        kc, m, p, kept: the regime k (clamped to the regimes of minpos .. maxpos),
            the bits kept after the regime, the bits dropped from z (negative:
            none, and -p zero bits appended) and z's kept bits (see `Posit.locate`).
        parity: the last bit of the lower neighbour's code (bool).
        dropped, dropped_len: frac_code = dropped / 2**dropped_len (int32 or int64, as the input;
            dropped_len may exceed 63 far below minpos, where only its size matters).
        uniform: bool, the cut falls in the fraction bits (the neighbours are one
            uniform grid step apart and the value-space position equals frac_code).
        over: bool, ``a >= maxpos`` (saturates).  under: bool, ``a < minpos``.
        lo, hi: values (scaled, working dtype) of ``code_lo`` and ``code_lo + 1``
            (0 and minpos below minpos; both maxpos above maxpos).
    """

    kc: torch.Tensor
    m: torch.Tensor
    p: torch.Tensor
    kept: torch.Tensor
    parity: torch.Tensor
    dropped: torch.Tensor
    dropped_len: torch.Tensor
    uniform: torch.Tensor
    over: torch.Tensor
    under: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def code_lo(self, n: int) -> torch.Tensor:
        """int64 magnitude code of the lower neighbour (0 below minpos, maxpos above it)."""
        kc, m = self.kc.to(torch.int64), self.m.to(torch.int64)
        one = torch.ones_like(kc)
        regime = torch.where(kc >= 0, (one << (kc + 2)) - 2, one)  # k + 1 ones and a zero, or ...01
        suffix = self.kept.to(torch.int64) << torch.clamp(-self.p, min=0).to(torch.int64)
        code = (regime << m) + suffix
        code = torch.where(self.under, 0, code)
        return torch.where(self.over, (1 << (n - 1)) - 1, code)

    def frac_class(self) -> torch.Tensor:
        """A float in [0, 1) that compares with 0 and 1/2 exactly as ``frac_code`` does.

        One of 0, 1/4, 1/2, 3/4 (exact, below the tie, the tie, above the tie), in
        the dtype of ``lo``.
        """
        top = 8 * self.dropped.element_size() - 2  # far below minpos only its size matters
        shift = torch.clamp(self.dropped_len - 1, 0, top)
        half = torch.where(self.dropped_len > 0, torch.ones_like(self.dropped) << shift, 0)
        cls = (self.dropped > half).to(self.lo.dtype) * 0.5 + 0.25  # 3/4 above the tie, else 1/4
        cls = torch.where(self.dropped == half, 0.5, cls)
        return torch.where(self.dropped == 0, 0.0, cls).to(self.lo.dtype)

    def value_position(self, a: torch.Tensor) -> torch.Tensor:
        """(a - lo) / (hi - lo) in float64 for magnitudes `a` strictly below maxpos.

        Exact where ``uniform`` (it is frac_code there) and below minpos;
        elsewhere within 2**-53 of the true ratio. Always in [0, 1).
        """
        a64, lo, hi = a.to(torch.float64), self.lo.to(torch.float64), self.hi.to(torch.float64)
        gap = hi - lo
        ratio = (a64 - lo) / torch.where(gap > 0, gap, 1.0)
        exact = self.dropped.to(torch.float64) * pow2(-torch.clamp(self.dropped_len, max=62), torch.float64)
        p = select(self.uniform & ~self.under, exact, ratio)
        return torch.clamp(p, 0.0, _ONE_MINUS_ULP)

    def frac_truncated(self, rand_bits: int) -> torch.Tensor:
        """floor(frac_code * 2**rand_bits) / 2**rand_bits, exactly (float64).

        What hardware stochastic rounding with ``rand_bits`` random bits sees:
        the first ``rand_bits`` dropped bits of the posit bit string.
        """
        r = int(rand_bits)
        dropped, length = self.dropped.to(torch.int64), self.dropped_len.to(torch.int64)  # r may exceed 31
        up = torch.clamp(r - length, 0, 62)
        down = torch.clamp(length - r, 0, 62)
        kept = torch.bitwise_right_shift(torch.bitwise_left_shift(dropped, up), down)
        return kept.to(torch.float64) * 2.0**-r


@dataclass(frozen=True)
class Posit(Format):
    """An n-bit posit with ``es`` exponent bits (2022 Posit Standard rounding).

    Args:
        n: total width in bits, 2..32.
        es: exponent field size, 0..9; ``useed = 2**(2**es)``.
        scale_exp: the Qtorch+ exponent bias t: values are posit values times
            ``2**-scale_exp``, so inputs near ``2**-t`` get posit(n, es)'s
            best precision.
        underflow: "minpos" (the standard: a nonzero input never rounds to
            0; tiny magnitudes give ±minpos) or "zero" (zero is an ordinary
            neighbour; the boundary between 0 and minpos is the value of the
            (n+1)-bit code 1, i.e. minpos / useed).

    The range ``[minpos, maxpos] = [useed**-(n-2), useed**(n-2)] * 2**-scale_exp``
    must lie within float64's normal range, otherwise `FormatError` is raised.

    >>> import anynum as an, torch
    >>> p = an.Posit(8, 2)
    >>> p == an.POSIT8, p.max, p.smallest_normal, p.useed
    (True, 16777216.0, 5.960464477539063e-08, 16.0)
    >>> an.quantize(torch.tensor([144179.2, 131072.0, 1e30, 1e-30, float("inf")]), p).tolist()
    [262144.0, 65536.0, 16777216.0, 5.960464477539063e-08, nan]
    >>> p.encode(torch.tensor([1.0, -1.0, float("nan")])).tolist()
    [64, 192, 128]
    """

    n: int
    es: int
    scale_exp: int = 0
    underflow: str = "minpos"

    overflow_policies: ClassVar[tuple[str, ...]] = ("saturate",)

    def __post_init__(self) -> None:
        for label, v in (("n", self.n), ("es", self.es), ("scale_exp", self.scale_exp)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise FormatError(f"Posit {label} must be an integer, got {v!r}.")
        if not 2 <= self.n <= _MAX_N:
            raise FormatError(
                f"Posit width n must be in 2..{_MAX_N}, got {self.n} "
                "(codes and fractions must stay exact in a float64 working type)."
            )
        if not 0 <= self.es <= _MAX_ES:
            raise FormatError(
                f"Posit es must be in 0..{_MAX_ES}, got {self.es} "
                "(useed = 2**(2**es) must be a finite float64)."
            )
        if self.underflow not in ("minpos", "zero"):
            raise FormatError(f"Posit underflow must be 'minpos' or 'zero', got {self.underflow!r}.")
        lo, hi = -self.max_exp - self.scale_exp, self.max_exp - self.scale_exp
        if lo < _EMIN or hi > _EMAX:
            raise FormatError(
                f"posit({self.n},{self.es}) with scale_exp={self.scale_exp} spans 2**{lo} .. 2**{hi}, "
                f"beyond float64's normal range 2**{_EMIN} .. 2**{_EMAX} (the working type); "
                "use a smaller n or es, or a scale_exp closer to 0."
            )

    # --- layout ---------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.n

    @property
    def max_exp(self) -> int:
        """log2(maxpos) of the unscaled posit: (n - 2) * 2**es."""
        return (self.n - 2) << self.es

    @property
    def useed(self) -> float:
        """2**(2**es), the regime's base."""
        return math.ldexp(1.0, 1 << self.es)

    @property
    def nar_code(self) -> int:
        """The code of NaR, 1 << (n - 1)."""
        return 1 << (self.n - 1)

    @property
    def maxpos_code(self) -> int:
        return (1 << (self.n - 1)) - 1

    # --- finfo-style properties -----------------------------------------------------------
    @property
    def max(self) -> float:
        """maxpos (scaled by 2**-scale_exp)."""
        return math.ldexp(1.0, self.max_exp - self.scale_exp)

    @property
    def maxpos(self) -> float:
        return self.max

    @property
    def minpos(self) -> float:
        """The smallest positive value, useed**-(n-2) (scaled by 2**-scale_exp)."""
        return math.ldexp(1.0, -self.max_exp - self.scale_exp)

    @property
    def smallest_normal(self) -> float:
        return self.minpos

    @property
    def smallest_subnormal(self) -> float:
        return self.minpos

    @property
    def emin(self) -> int:
        return -self.max_exp - self.scale_exp

    @property
    def emax(self) -> int:
        return self.max_exp - self.scale_exp

    @property
    def precision(self) -> int:
        """Significand bits (hidden bit included) at its best, next to 2**-scale_exp."""
        return max(self.n - 3 - self.es, 0) + 1

    @property
    def eps(self) -> float:
        """Gap above 2**-scale_exp (1.0 when unscaled) to the next larger value."""
        one = torch.tensor([self.nar_code >> 1], dtype=torch.int64)  # the code of useed**0
        v = self.decode_torch(torch.cat([one, one + 1]))
        return float(v[1] - v[0])

    @property
    def has_nan(self) -> bool:
        return True  # NaR

    @property
    def default_overflow(self) -> str:
        return "saturate"

    # --- the grid -------------------------------------------------------------------------
    def fits_float32(self) -> bool:
        """Whether float32 can carry the rounding of float32 inputs (`locate` in int32 bits).

        Every value, hence every result, must be a normal float32 and the bit
        string after the regime (es exponent bits, 23 fraction bits and a carry)
        must fit in an int32.
        """
        return self.es <= 6 and self.emin >= -126 and self.emax <= 127

    def locate(self, a: torch.Tensor) -> PositSplit:
        """Locate magnitudes ``a`` (> 0, finite, float32 or float64; scaled values) on the grid.

        Write the scaled value as ``2**E * (1 + f)`` with ``E = k * 2**es + e``.
        The posit bit string after the sign is the regime of k (k + 1 ones and a
        zero, or -k zeros and a one), the es bits of e, then the bits of f. All
        that follows the regime is the integer ``z = e << M | mantissa`` (M the
        working type's fraction bits); keeping m bits after the regime drops the
        low ``p = es + M - m`` bits of z. Read as a float's bits rebased by
        ``k * 2**es``, z truncated and z truncated plus ``1 << p`` are the two
        neighbours, a carry out of the exponent bits included (it lands on the
        next regime's first value, useed**(k+1)), so the grid is found with
        integer arithmetic on the input's bits, in the input's own width.
        """
        n, es = self.n, self.es
        lay = layout(a.dtype)
        man = lay.man_bits
        if self.emin - (1 << es) < lay.emin or self.underflow == "zero":
            # The tie point below minpos may be subnormal in the working type, and with
            # underflow="zero" the dropped bits of any tiny input matter (hardware SR):
            # lift subnormal inputs so their exponent and fraction read correctly.
            lift = man + 2
            tiny = a < 2.0**lay.emin
            a = torch.where(tiny, a * 2.0**lift, a)
            big_e = (a.view(lay.int_dtype) >> man) - lay.bias - tiny.to(lay.int_dtype) * lift
        else:
            big_e = (a.view(lay.int_dtype) >> man) - lay.bias
        mant = a.view(lay.int_dtype) & ((1 << man) - 1)
        big_e = big_e + self.scale_exp
        k = big_e >> es  # floor division by 2**es
        z = ((big_e & ((1 << es) - 1)) << man) | mant
        over = k >= n - 2
        under = k <= -(n - 1)
        kc = torch.clamp(k, -(n - 2), n - 3)  # the regimes of minpos .. the one below maxpos
        # Bits kept after the regime, >= 0: n - 3 - kc for kc >= 0 (k + 1 ones and a zero),
        # n - 2 + kc below (-k zeros and a one); arithmetic, as kc's sign is data.
        m = n - 2 - torch.maximum(kc + 1, -kc)
        p = es + man - m  # dropped bits of z (negative: z is kept whole, plus zero bits)
        pc = torch.clamp(p, min=0)
        kept = z >> pc
        step = torch.ones_like(z) << pc
        dropped = z - (kept << pc)
        # The last kept bit: of z, a padding zero, or the regime's final bit (0 for k >= 0).
        parity = torch.where(m == 0, kc < 0, (kept & 1).bool() & (p >= 0))
        base = (kc * (1 << es) + (lay.bias - self.scale_exp)) << man
        lo_bits = base + (kept << pc)
        lo = torch.where(over, self.maxpos, torch.where(under, 0.0, lo_bits.view(a.dtype)))
        hi = torch.where(over, self.maxpos, torch.where(under, self.minpos, (lo_bits + step).view(a.dtype)))
        # Below minpos the n - 1 kept bits are zeros and the dropped string is the
        # regime's remaining zeros, its final one, then z.
        depth = -k - (n - 2)  # >= 1 below minpos
        dropped = torch.where(under, (1 << (es + man)) + z, torch.where(over, 0, dropped))
        dropped_len = torch.where(under, es + man + depth, pc)
        uniform = (p <= man) & ~under & ~over
        return PositSplit(
            kc, m, p, kept, parity & ~under, dropped, dropped_len, uniform, over, under, lo, hi
        )

    def _decode_magnitude(self, c: torch.Tensor) -> torch.Tensor:
        """float64 values of magnitude codes c in [1, 2**(n-1)) (scaled)."""
        n, es = self.n, self.es
        nb = n - 1
        mask = (1 << nb) - 1
        r0 = torch.bitwise_right_shift(c, nb - 1) & 1
        y = torch.where(r0 == 1, torch.bitwise_not(c) & mask, c)
        ypos = torch.where(y > 0, y, torch.ones_like(y)).to(torch.float64)
        bitlen = torch.where(y > 0, floor_log2(ypos).to(torch.int64) + 1, torch.zeros_like(y))
        run = nb - bitlen
        k = torch.where(r0 == 1, run - 1, -run)
        m = torch.clamp(nb - run - 1, min=0)
        ones = torch.ones_like(c)
        rest = c & (torch.bitwise_left_shift(ones, m) - 1)
        fb = torch.clamp(m - es, min=0)
        e = torch.where(
            m >= es,
            torch.bitwise_right_shift(rest, fb),
            torch.bitwise_left_shift(rest, torch.clamp(es - m, min=0)),
        )
        frac = torch.where(m >= es, rest & (torch.bitwise_left_shift(ones, fb) - 1), torch.zeros_like(rest))
        sig = (torch.bitwise_left_shift(ones, fb) + frac).to(torch.float64)
        big_e = k * (1 << es) + e
        return ldexp(sig, big_e - fb - self.scale_exp)

    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.to(torch.int64) & ((1 << self.n) - 1)
        nar = self.nar_code
        negative = codes > nar
        mag = torch.where(negative, (1 << self.n) - codes, codes)
        safe = torch.where((mag == 0) | (mag == nar), torch.ones_like(mag), mag)
        v = self._decode_magnitude(safe)
        v = torch.where(mag == 0, torch.zeros_like(v), v)
        v = torch.where(negative, -v, v)
        return torch.where(codes == nar, torch.full_like(v, torch.nan), v)

    def encode_kernel(self, y: torch.Tensor) -> torch.Tensor:
        y = y.to(torch.float64)
        a = torch.abs(y)
        finite = a < torch.inf  # not isfinite: it does not vectorize in Inductor
        sp = self.locate(torch.where(finite, a, torch.ones_like(a)))
        # On-grid values have frac 0; anything else is encoded as its lower neighbour.
        mag = torch.where(a == 0, 0, sp.code_lo(self.n))
        mag = torch.where(sp.under & (a > 0), 1, mag)  # only minpos' vicinity
        code = torch.where(y < 0, ((1 << self.n) - mag) & ((1 << self.n) - 1), mag)
        return torch.where(finite, code, torch.full_like(code, self.nar_code))

    def __repr__(self) -> str:
        if self.name:
            return self.name.upper() if self.name.isidentifier() else self.name
        extra = ""
        if self.scale_exp:
            extra += f", scale_exp={self.scale_exp}"
        if self.underflow != "minpos":
            extra += f", underflow={self.underflow!r}"
        return f"Posit({self.n}, {self.es}{extra})"


POSIT8 = Posit(8, 2, name="posit8")
POSIT16 = Posit(16, 2, name="posit16")
POSIT32 = Posit(32, 2, name="posit32")


# --- names ---------------------------------------------------------------------------------


def _register_names() -> None:
    from anynum.formats.registry import register_family, register_name

    register_name(POSIT8, "posit8", "posit8_2", "posit8es2")
    register_name(POSIT16, "posit16", "posit16_2", "posit16es2")
    register_name(POSIT32, "posit32", "posit32_2", "posit32es2")
    register_family(
        r"posit\((\d+),(\d+)\)", lambda m: Posit(int(m.group(1)), int(m.group(2))), "'posit(n,es)'"
    )
    register_family(
        r"posit(\d+)(?:_|es)(\d+)", lambda m: Posit(int(m.group(1)), int(m.group(2))), "'posit{n}_{es}'"
    )


_register_names()
