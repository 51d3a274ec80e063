"""Exact references for the ops and fault tests, built from the formats' parameters alone.

Nothing here calls anynum's rounding, encoding or decoding:

* `decode_float`, `decode_posit`, `decode_fixed`: the exact value (Fraction; None for
  NaN/NaR, or ±inf as a float) of an integer code, read from the bit layout. Posits use
  the 2022 standard's formula on the raw bits,
  ``((1 - 3s) + f) * 2**((1 - 2s) * (2**es * r + e + s))``, not the negate-first reading
  anynum's decoder uses.
* `round_ref(v, fmt, mode, overflow)`: the exact rounding of a rational onto a float,
  posit or fixed-point format (floats by arithmetic on the exponent and significand,
  posits by enumerating codes and their (n+1)-bit boundary codes).
* `near_boundary(v, fmt, mode, rel)`: whether rational v lies within a relative `rel` of a
  point where `mode`'s result changes (a grid point or a midpoint/boundary).
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_right
from fractions import Fraction

import anynum as an

NEAREST = ("nearest", "rna", "rnz")
DETERMINISTIC = ("nearest", "rna", "rnz", "rz", "ru", "rd", "ro")


def floor_log2(a: Fraction) -> int:
    """floor(log2(a)) for a positive rational, exactly."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


# --- codes -> exact values -------------------------------------------------------------------------


def decode_float(code: int, exp_bits: int, man_bits: int, bias: int, specials: str, signed: bool = True):
    """Exact value of a float code: a Fraction, ±math.inf, or None (NaN). Formats with zero and subnormals."""
    mag_bits = exp_bits + man_bits
    negative = signed and (code >> mag_bits) & 1
    mag = code & ((1 << mag_bits) - 1)
    e, f = mag >> man_bits, mag & ((1 << man_bits) - 1)
    if specials == "ieee" and e == (1 << exp_bits) - 1:
        if f:
            return None
        return -math.inf if negative else math.inf
    if specials == "fn" and mag == (1 << mag_bits) - 1:
        return None
    if specials == "fnuz" and negative and mag == 0:
        return None
    if e == 0:
        v = Fraction(f, 1 << man_bits) * Fraction(2) ** (1 - bias)
    else:
        v = (1 + Fraction(f, 1 << man_bits)) * Fraction(2) ** (e - bias)
    return -v if negative else v


def decode_e8m0(code: int):
    """OCP E8M0 scale: 2**(code - 127); 255 is NaN."""
    return None if code == 255 else Fraction(2) ** (code - 127)


def posit_fields(code: int, n: int, es: int) -> dict[str, list[int]]:
    """Bit positions of each field of an n-bit posit code, read from the raw bits (2022 standard)."""
    bits = format(code, f"0{n}b")  # bits[0] is bit n-1
    out: dict[str, list[int]] = {"sign": [n - 1], "regime": [], "exponent": [], "fraction": []}
    i = 1
    first = bits[1] if n > 1 else "0"
    while i < n and bits[i] == first:
        out["regime"].append(n - 1 - i)
        i += 1
    if i < n:  # the terminating bit
        out["regime"].append(n - 1 - i)
        i += 1
    for _ in range(es):
        if i < n:
            out["exponent"].append(n - 1 - i)
            i += 1
    while i < n:
        out["fraction"].append(n - 1 - i)
        i += 1
    return out


def decode_posit(code: int, n: int, es: int):
    """Exact value of an n-bit posit code by the 2022 standard's formula (None for NaR)."""
    if code == 0:
        return Fraction(0)
    if code == 1 << (n - 1):
        return None
    bits = format(code, f"0{n}b")
    s = int(bits[0])
    fields = posit_fields(code, n, es)
    reg = fields["regime"]
    first = bits[1]
    run = len(reg) - (1 if len(reg) and bits[n - 1 - reg[-1]] != first else 0)
    r = run - 1 if first == "1" else -run
    ebits = "".join(bits[n - 1 - p] for p in fields["exponent"]).ljust(es, "0")
    e = int(ebits, 2) if es else 0
    fb = "".join(bits[n - 1 - p] for p in fields["fraction"])
    f = Fraction(int(fb, 2), 1 << len(fb)) if fb else Fraction(0)
    return ((1 - 3 * s) + f) * Fraction(2) ** ((1 - 2 * s) * ((1 << es) * r + e + s))


def decode_fixed(code: int, int_bits: int, frac_bits: int) -> Fraction:
    """Two's-complement fixed point."""
    width = int_bits + frac_bits
    k = code - (1 << width) if code >> (width - 1) else code
    return Fraction(k, 1 << frac_bits)


# --- exact rounding --------------------------------------------------------------------------------


def _pick(lo: Fraction, hi: Fraction, bound: Fraction, lo_even: bool, a: Fraction, mode: str) -> Fraction:
    """Choose between magnitudes lo < a < hi (bound: the nearest-rounding boundary)."""
    if mode in NEAREST:
        if a < bound:
            return lo
        if a > bound:
            return hi
        return {"nearest": lo if lo_even else hi, "rna": hi, "rnz": lo}[mode]
    if mode == "rz":
        return lo
    if mode == "ro":
        return hi if lo_even else lo
    raise AssertionError(mode)


def _magnitude_mode(mode: str, negative: bool) -> str:
    if mode == "ru":
        return "rd_mag" if negative else "ru_mag"
    if mode == "rd":
        return "ru_mag" if negative else "rd_mag"
    return mode


def _float_params(fmt: an.FloatFormat) -> tuple[int, Fraction]:
    """(emin, max) from the parameters: the top finite magnitude code depends on `specials`."""
    E, M, b = fmt.exp_bits, fmt.man_bits, fmt.bias
    top = (1 << (E + M)) - 1
    if fmt.specials == "ieee":
        top -= (1 << M)
    elif fmt.specials == "fn":
        top -= 1
    e, f = top >> M, top & ((1 << M) - 1)
    return 1 - b, (1 + Fraction(f, 1 << M)) * Fraction(2) ** (e - b)


def round_float(v: Fraction, fmt: an.FloatFormat, mode: str, overflow: str) -> float:
    """Exact rounding of rational v (v != 0) onto a float format with zero and subnormals."""
    assert fmt.subnormals and fmt.zero and fmt.signed
    emin, vmax = _float_params(fmt)
    neg, a = v < 0, abs(v)
    m = _magnitude_mode(mode, neg)
    e = max(floor_log2(a), emin)
    q = Fraction(2) ** (e - fmt.man_bits)
    k = math.floor(a / q)
    lo, hi = k * q, (k + 1) * q
    if a == lo:
        r = lo
    elif m == "ru_mag":
        r = hi
    elif m == "rd_mag":
        r = lo
    else:
        r = _pick(lo, hi, (lo + hi) / 2, k % 2 == 0, a, m)
    if a > vmax:
        top_q = Fraction(2) ** (floor_log2(vmax) - fmt.man_bits)
        over = {
            "ru_mag": True, "rd_mag": False, "rz": False, "ro": False,
            "nearest": a > vmax + top_q / 2 or (a == vmax + top_q / 2 and (vmax / top_q) % 2 == 1),
            "rna": a >= vmax + top_q / 2, "rnz": a > vmax + top_q / 2,
        }[m]
        if not over or overflow == "saturate":
            r = vmax
        else:
            return math.nan if overflow == "nan" else (-math.inf if neg else math.inf)
    out = float(r)
    return -out if neg else out


@functools.cache
def posit_table(n: int, es: int) -> tuple[list[Fraction], list[Fraction]]:
    """Positive posit values (index = code) and boundaries between codes L, L+1 (code 2L+1 of n+1 bits)."""
    top = 1 << (n - 1)
    vals = [decode_posit(c, n, es) for c in range(top)]
    bounds = [decode_posit(2 * c + 1, n + 1, es) for c in range(top - 1)]
    return vals, bounds  # type: ignore[return-value]


def round_posit(v: Fraction, fmt: an.Posit, mode: str) -> float:
    """Exact posit rounding (2022 standard: never 0 or NaR for nonzero input, saturating)."""
    vals, bounds = posit_table(fmt.n, fmt.es)
    neg, a = v < 0, abs(v)
    m = _magnitude_mode(mode, neg)
    top = len(vals) - 1
    if a >= vals[top]:
        r = vals[top]
    elif a <= vals[1]:
        r = vals[1]
    else:
        L = bisect_right(vals, a) - 1
        lo, hi = vals[L], vals[L + 1]
        if a == lo:
            r = lo
        elif m == "ru_mag":
            r = hi
        elif m == "rd_mag":
            r = lo
        else:
            r = _pick(lo, hi, bounds[L], L % 2 == 0, a, m)
    out = float(r)
    return -out if neg else out


def round_fixed(v: Fraction, fmt: an.FixedPoint, mode: str) -> float:
    """Exact rounding onto signed saturating fixed point."""
    q = Fraction(1, 1 << fmt.frac_bits)
    lo_i = math.floor(v / q)
    lo, hi = lo_i * q, (lo_i + 1) * q
    vmin, vmax = -Fraction(1 << (fmt.int_bits - 1)), Fraction(1 << (fmt.int_bits - 1)) - q
    if v == lo:
        r = lo
    elif mode == "ru":
        r = hi
    elif mode == "rd":
        r = lo
    else:  # decide on the magnitude
        neg = v < 0
        a = abs(v)
        k = math.floor(a / q)
        r = _pick(k * q, (k + 1) * q, (2 * k + 1) * q / 2, k % 2 == 0, a, mode)
        r = -r if neg else r
    return float(min(max(r, vmin), vmax))


def round_ref(v, fmt, mode: str, overflow: str | None = None) -> float:
    """Exact rounding of a rational (or ±inf/NaN as floats) onto `fmt` in a deterministic mode."""
    if isinstance(v, float):
        if math.isnan(v):
            return math.nan
        assert math.isinf(v)
        if isinstance(fmt, an.Posit):
            return math.nan
        if isinstance(fmt, an.FixedPoint):  # saturates
            top = Fraction(1 << (fmt.int_bits - 1))
            return float(top - Fraction(1, 1 << fmt.frac_bits)) if v > 0 else float(-top)
        policy = overflow or fmt.default_overflow
        if policy == "saturate":
            return math.copysign(float(_float_params(fmt)[1]), v)
        return v if policy == "inf" else math.nan
    if v == 0:
        return 0.0
    if isinstance(fmt, an.Posit):
        return round_posit(v, fmt, mode)
    if isinstance(fmt, an.FixedPoint):
        return round_fixed(v, fmt, mode)
    return round_float(v, fmt, mode, overflow or fmt.default_overflow)


def neighbours(v: Fraction, fmt) -> tuple[float, float]:
    """The grid neighbours lo <= v <= hi (values, not saturated past the range)."""
    return round_ref(v, fmt, "rd", "saturate"), round_ref(v, fmt, "ru", "saturate")


def near_boundary(v: Fraction, fmt, mode: str, rel: float) -> bool:
    """Whether v is within a relative `rel` of a grid point or of the nearest-rounding boundary."""
    if v == 0:
        return True
    tol = abs(v) * Fraction(rel)
    lo_a, hi_a = round_ref(v - tol, fmt, "rd", "saturate"), round_ref(v + tol, fmt, "ru", "saturate")
    if lo_a != round_ref(v + tol, fmt, "rd", "saturate") or hi_a != round_ref(v - tol, fmt, "ru", "saturate"):
        return True  # a grid point lies within the tolerance
    if mode in NEAREST:
        return round_ref(v - tol, fmt, mode) != round_ref(v + tol, fmt, mode)
    return False


def isqrt_proxy(v: Fraction) -> Fraction:
    """A rational strictly between the same grid boundaries as sqrt(v) (or sqrt(v) itself when exact)."""
    K = 2400
    num = v.numerator * (1 << (2 * K))
    r = math.isqrt(num // v.denominator)
    cand = Fraction(r, 1 << K)
    while cand * cand > v:  # floor(num / den) may undershoot by less than 1: correct downward
        r -= 1
        cand = Fraction(r, 1 << K)
    if cand * cand == v:
        return cand
    return cand + Fraction(1, 1 << (K + 1))
