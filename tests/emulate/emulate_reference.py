"""Reference twins for emulation, in exact rational arithmetic (fractions.Fraction), readable by eye.

* `round_exact(x, fmt, mode)`: one rounding of an exact rational onto a float or
  posit grid, from the enumerated values: neighbours by binary search; nearest
  modes compare with the boundary (the midpoint for floats; for posits the value
  of the (n+1)-bit code between the neighbours, i.e. the bit-pattern rule);
  ties go to the even code, or away from / toward zero; directed modes follow
  the value order; ODD keeps exact values and otherwise takes the odd code.
  Posits never round a nonzero value to 0 and saturate at maxpos.
* `ref_dot(a, b, ...)`: one dot product with the accumulation rules of
  `anynum.emulate.accumulate`, spelled out element by element.

It uses the library only to enumerate values (``fmt.values()``) and read code
parity (``an.encode``), both checked elsewhere against independent oracles.
"""

from __future__ import annotations

import bisect
import functools
from fractions import Fraction

import torch

import anynum as an


@functools.lru_cache(maxsize=64)
def _grid(fmt: an.Format) -> tuple[list[Fraction], dict[Fraction, int]]:
    values = sorted({Fraction(float(v)) for v in fmt.values()})
    codes = an.encode(torch.tensor([float(v) for v in values], dtype=torch.float64), fmt).tolist()
    return values, dict(zip(values, codes))


def posit_value(code: int, n: int, es: int) -> Fraction:
    """The exact value of the n-bit posit code (two's complement, NaR excluded), from its bits."""
    code %= 1 << n
    if code == 0:
        return Fraction(0)
    negative = code >> (n - 1)
    if negative:
        code = (1 << n) - code
    bits = [(code >> i) & 1 for i in range(n - 2, -1, -1)]  # after the sign, most significant first
    run = 1
    while run < len(bits) and bits[run] == bits[0]:
        run += 1
    k = run - 1 if bits[0] else -run
    rest = bits[run + 1 :]
    e_bits = (rest[:es] + [0] * es)[:es]
    e = int("".join(map(str, e_bits)), 2) if es else 0
    frac_bits = rest[es:]
    f = Fraction(int("".join(map(str, frac_bits)), 2), 1 << len(frac_bits)) if frac_bits else Fraction(0)
    v = Fraction(2) ** (k * (1 << es) + e) * (1 + f)
    return -v if negative else v


def boundary(fmt: an.Format, lo: Fraction, hi: Fraction) -> Fraction:
    if isinstance(fmt, an.Posit):
        _, codes = _grid(fmt)
        low_code = codes[lo]
        signed = low_code - (1 << fmt.n) if low_code >> (fmt.n - 1) else low_code
        b = posit_value(2 * signed + 1, fmt.n + 1, fmt.es)
        assert lo < b < hi
        return b
    return (lo + hi) / 2


def round_exact(x: Fraction, fmt: an.Format, mode: str = "nearest") -> Fraction:
    """x rounded once onto fmt (finite x within the format's range; posits saturate)."""
    values, codes = _grid(fmt)
    if isinstance(fmt, an.Posit):
        if x == 0:
            return Fraction(0)
        minpos, maxpos = values[len(values) // 2 + 1], values[-1]
        if abs(x) >= maxpos:
            return maxpos if x > 0 else -maxpos
        if abs(x) <= minpos:
            return minpos if x > 0 else -minpos
    i = bisect.bisect_left(values, x)
    if i < len(values) and values[i] == x:
        return x
    lo, hi = values[i - 1], values[i]
    toward_zero = lo if x > 0 else hi
    away = hi if x > 0 else lo
    if mode == "rz":
        return toward_zero
    if mode == "ru":
        return hi
    if mode == "rd":
        return lo
    if mode == "ro":
        return lo if codes[lo] % 2 else hi
    b = boundary(fmt, lo, hi)
    if x != b:
        return lo if x < b else hi
    if mode == "rna":
        return away
    if mode == "rnz":
        return toward_zero
    return lo if codes[lo] % 2 == 0 else hi


def ref_dot(
    a: list[Fraction],
    b: list[Fraction],
    acc: an.Format | str | None,
    order: str | int,
    fma: bool,
    out: an.Format,
    mode: str = "nearest",
) -> Fraction:
    """One dot product under the accumulation rules; acc None means an exact sum (the quire)."""
    prods = [x * y for x, y in zip(a, b)]
    if acc is None or acc == "quire":
        return round_exact(sum(prods, Fraction(0)), out, mode)
    assert isinstance(acc, an.Format)

    def r(v: Fraction) -> Fraction:
        return round_exact(v, acc, mode)

    if order == "sequential":
        s = None
        for p in prods:
            leaf = p if fma else r(p)
            s = r(leaf) if s is None else r(s + leaf)
    elif order == "pairwise":
        nodes = [p if fma else r(p) for p in prods]
        while len(nodes) > 1:
            nxt = [r(nodes[i] + nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
            if len(nodes) % 2:
                nxt.append(nodes[-1])
            nodes = nxt
        s = r(nodes[0]) if fma and len(prods) == 1 else nodes[0]
    else:
        s = None
        for start in range(0, len(prods), int(order)):
            t = sum(prods[start : start + int(order)], Fraction(0))
            s = r(t) if s is None else r(s + t)
    assert s is not None
    return round_exact(s, out, mode)
