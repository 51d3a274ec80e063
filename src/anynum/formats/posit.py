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

from anynum._bits import floor_log2, ldexp, pow2
from anynum.errors import FormatError
from anynum.formats.base import Format

__all__ = ["POSIT8", "POSIT16", "POSIT32", "Posit"]

_MAX_N = 32
_MAX_ES = 9  # useed = 2**(2**es) must be a finite float64 (2**512 is; 2**1024 is not)
_EMAX = 1023  # largest float64 binade
_EMIN = -1022  # smallest normal float64 binade: every posit value stays a normal number
_MANT_MASK = (1 << 52) - 1
_ONE_BITS = 1023 << 52  # the bits of 1.0


@dataclass
class PositSplit:
    """Where a magnitude sits on the posit grid (internal; see `Posit._split`).

    For positive finite ``a`` below maxpos, the infinitely long posit bit string
    of ``a`` read as a binary number with the point after bit n is
    ``code_lo + frac_code`` where ``code_lo`` is the n-bit code of the grid
    point at or below ``a`` and ``frac_code`` in [0, 1) is the position of
    ``a`` between that code and the next one in *code* space (linear in the
    value where fraction bits are cut, in the exponent where exponent or
    regime bits are cut).

    Attributes:
        code_lo: int64 magnitude code of the lower neighbour (0 below minpos).
        frac_exact: the exact ``frac_code`` where only fraction bits are cut
            (``uniform``), else meaningless.
        uniform: bool, True where the cut falls in the fraction bits, so the
            neighbours are a uniform grid step apart.
        rem, f, drop: where not ``uniform``, ``frac_code = (rem + f) / 2**drop``
            with integer ``rem`` < 2**drop (int64), float ``f`` in [0, 1) and
            ``drop`` >= 1 (int64, capped at 62; beyond that rem < 2**(drop-1)).
        over: bool, ``a >= maxpos`` (saturates).
        under: bool, ``a < minpos`` (lower neighbour is zero).
        lo, hi: float64 values (scaled) of the neighbours ``code_lo`` and
            ``code_lo + 1`` (0 and minpos below minpos; both maxpos above maxpos).
    """

    code_lo: torch.Tensor
    frac_exact: torch.Tensor
    uniform: torch.Tensor
    rem: torch.Tensor
    f: torch.Tensor
    drop: torch.Tensor
    over: torch.Tensor
    under: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def frac_class(self) -> torch.Tensor:
        """A float in [0, 1) that compares with 0 and 1/2 exactly as ``frac_code`` does.

        Equal to ``frac_code`` where ``uniform``; elsewhere one of 0, 1/4, 1/2, 3/4
        (zero, below the tie, the tie, above the tie).
        """
        half = torch.bitwise_left_shift(torch.ones_like(self.drop), self.drop - 1)
        zero_f = self.f == 0
        exact = (self.rem == 0) & zero_f
        tie = (self.rem == half) & zero_f
        above = (self.rem > half) | ((self.rem == half) & ~zero_f)
        cls = torch.where(above, 0.75, 0.25)
        cls = torch.where(tie, 0.5, cls)
        cls = torch.where(exact, 0.0, cls).to(torch.float64)
        return torch.where(self.uniform, self.frac_exact, cls)

    def frac_truncated(self, rand_bits: int) -> torch.Tensor:
        """floor(frac_code * 2**rand_bits) / 2**rand_bits, exactly (float64).

        This is what hardware stochastic rounding with ``rand_bits`` random bits
        sees: the first ``rand_bits`` dropped bits of the posit bit string.
        """
        r = rand_bits
        scale = 2.0**r
        uni = torch.floor(self.frac_exact * scale)
        # frac_code = (rem + f) / 2**drop; keep its first r bits.
        drop = self.drop
        shift_up = torch.clamp(r - drop, min=0)
        shift_dn = torch.clamp(drop - r, min=0, max=62)
        wide = torch.bitwise_left_shift(self.rem, shift_up).to(torch.float64) + torch.floor(
            ldexp(self.f, shift_up)
        )
        narrow = torch.bitwise_right_shift(self.rem, shift_dn).to(torch.float64)
        trunc = torch.where(drop <= r, wide, narrow)
        return torch.where(self.uniform, uni, trunc) / scale


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
        v = self._decode_torch(torch.cat([one, one + 1]))
        return float(v[1] - v[0])

    @property
    def has_nan(self) -> bool:
        return True  # NaR

    @property
    def default_overflow(self) -> str:
        return "saturate"

    # --- the grid -------------------------------------------------------------------------
    def _split(self, a: torch.Tensor) -> PositSplit:
        """Locate float64 magnitudes ``a`` (> 0, finite; scaled values) on the posit grid.

        Writing the scaled value as ``2**E * (1 + f)`` with ``E = k * 2**es + e``,
        the posit bit string after the sign is the regime of k, the es bits of e
        and the bits of f. After the regime, m bits are left for exponent and
        fraction; with ``u`` = e (k >= 0) or ``2**es + e`` (k < 0, the regime's
        final 1 folded in), the code is ``B + (u + f) * 2**(m - es)`` where B holds
        the leading regime ones (k >= 0) or nothing (k < 0).
        """
        n, es = self.n, self.es
        # Read a's exponent and fraction straight from its bits. Subnormal inputs are far
        # below minpos (the format's range is inside float64's normal range), so whatever
        # is computed for them is replaced by the `under` branch.
        bits = a.view(torch.int64)
        ex = torch.bitwise_right_shift(bits, 52) - 1023
        mant = bits & _MANT_MASK
        f = torch.bitwise_or(mant, _ONE_BITS).view(torch.float64) - 1.0  # exact, in [0, 1)
        big_e = ex + self.scale_exp
        k = torch.bitwise_right_shift(big_e, es)  # floor division by 2**es
        e = big_e & ((1 << es) - 1)
        pos = k >= 0
        over = k >= n - 2
        under = k <= -(n - 1)
        kc = torch.clamp(k, -(n - 1), n - 3)  # keeps the regime shifts sane; `over` is patched later
        # Bits left after the regime; negative below minpos (then drop > es: the lower neighbour is 0).
        m = torch.where(pos, n - 3 - k, n - 2 + k)
        u = torch.where(pos, e, e + (1 << es))
        ones = torch.ones_like(k)
        regime_ones = torch.where(
            pos,
            torch.bitwise_left_shift(torch.bitwise_left_shift(ones, kc + 2) - 2, torch.clamp(m, min=0)),
            torch.zeros_like(k),
        )
        sh = m - es  # >= 0: sh fraction bits kept; < 0: -sh bits of u are cut
        uniform = sh >= 0
        shp = torch.clamp(sh, 0, 52)
        cut = 52 - shp  # fraction bits of a below the kept ones
        low_mask = torch.bitwise_left_shift(ones, cut) - 1
        low = mant & low_mask
        frac_exact = low.to(torch.float64) * pow2(-cut, torch.float64)  # exact: low < 2**52
        drop = torch.clamp(-sh, min=1, max=62)
        code_uniform = regime_ones + torch.bitwise_left_shift(u, shp) + torch.bitwise_right_shift(mant, cut)
        code_cut = regime_ones + torch.bitwise_right_shift(u, drop)
        code_lo = torch.where(uniform, code_uniform, code_cut)
        rem = u & (torch.bitwise_left_shift(ones, drop) - 1)
        code_lo = torch.where(under, torch.zeros_like(code_lo), code_lo)
        code_lo = torch.where(over, torch.full_like(code_lo, self.maxpos_code), code_lo)
        # The neighbours' values, exactly: where the cut is in the fraction, a with the
        # cut bits cleared and one grid step 2**(ex - sh) more; elsewhere the powers of
        # two 2**(ex - rem) and 2**(ex - rem + 2**drop).
        safe_ex = torch.clamp(ex - shp, -1022, 1023)
        lo_uni = (bits - low).view(torch.float64)
        hi_uni = lo_uni + pow2(safe_ex, torch.float64)
        cut_exp = torch.clamp(ex - rem, -1022, 1023)
        lo_cut = pow2(cut_exp, torch.float64)
        gap_exp = torch.bitwise_left_shift(ones, torch.clamp(drop, max=10))  # 2**drop (<= 2**es)
        hi_cut = pow2(torch.clamp(cut_exp + gap_exp, max=1023), torch.float64)
        lo = torch.where(uniform, lo_uni, lo_cut)
        hi = torch.where(uniform, hi_uni, hi_cut)
        lo = torch.where(under, torch.zeros_like(lo), lo)
        hi = torch.where(under, torch.full_like(hi, self.minpos), hi)
        lo = torch.where(over, torch.full_like(lo, self.maxpos), lo)
        hi = torch.where(over, torch.full_like(hi, self.maxpos), hi)
        return PositSplit(code_lo, frac_exact, uniform, rem, f, drop, over, under, lo, hi)

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

    def _decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.to(torch.int64) & ((1 << self.n) - 1)
        nar = self.nar_code
        negative = codes > nar
        mag = torch.where(negative, (1 << self.n) - codes, codes)
        safe = torch.where((mag == 0) | (mag == nar), torch.ones_like(mag), mag)
        v = self._decode_magnitude(safe)
        v = torch.where(mag == 0, torch.zeros_like(v), v)
        v = torch.where(negative, -v, v)
        return torch.where(codes == nar, torch.full_like(v, torch.nan), v)

    def _encode_torch(self, y: torch.Tensor) -> torch.Tensor:
        y = y.to(torch.float64)
        a = torch.abs(y)
        finite = torch.isfinite(a)
        sp = self._split(torch.where(finite, a, torch.ones_like(a)))
        # On-grid values have frac 0; anything else is encoded as its lower neighbour.
        mag = torch.where(a == 0, torch.zeros_like(sp.code_lo), sp.code_lo)
        mag = torch.where(sp.under & (a > 0), torch.ones_like(mag), mag)  # only minpos' vicinity
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
