"""Independent oracles for the facade tests: IEEE-style rounding by definition, in exact arithmetic.

Imported by the tests of this folder (``from compat_oracle import ieee``; pytest puts the folder on
the path). Not a conftest.py: two same-named conftest modules clash under --doctest-modules.

`ieee_round` enumerates a binary float's codes (exp_bits, man_bits, IEEE layout,
optionally without subnormals) and applies each rounding rule as the standard
words it, with `fractions.Fraction` for every comparison; nothing here calls anynum.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def ieee_grid(exp_bits: int, man_bits: int, subnormals: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative finite values (float64, ascending) and their codes, then +inf with the next code."""
    bias = (1 << (exp_bits - 1)) - 1
    values, codes = [], []
    for e in range((1 << exp_bits) - 1):  # the all-ones exponent field holds inf/NaN
        for f in range(1 << man_bits):
            if e == 0:
                if not subnormals and f:
                    continue
                v = f * 2.0 ** (1 - bias - man_bits)
            else:
                v = (1 + f / (1 << man_bits)) * 2.0 ** (e - bias)
            values.append(v)
            codes.append((e << man_bits) | f)
    values.append(np.inf)
    codes.append(((1 << exp_bits) - 1) << man_bits)
    return np.array(values), np.array(codes)


def ieee_round(x: np.ndarray, exp_bits: int, man_bits: int, mode: str, subnormals: bool = True) -> np.ndarray:
    """Round float64 `x` by definition. mode: rne rna rnz rto(ties to odd) rz ru rd ro.

    Overflow follows IEEE 754: the nearest modes treat the value past max as the
    next binade's first value (so x >= max + ulp/2 goes to inf), directed modes go
    to inf only in their own direction, round-to-odd and toward-zero saturate.
    Results below the smallest subnormal (or normal, without subnormals) choose
    between 0 and that value. NaN stays NaN, ±inf stays ±inf, -0 stays -0.
    """
    grid, codes = ieee_grid(exp_bits, man_bits, subnormals)
    finite = grid[:-1]
    top_ulp = finite[-1] - finite[-2]
    virtual_next = Fraction(finite[-1]) + Fraction(top_ulp)  # where inf sits for nearest rounding
    out = np.empty_like(x, dtype=np.float64)
    for i, v in enumerate(np.asarray(x, dtype=np.float64).reshape(-1)):
        if np.isnan(v) or np.isinf(v):
            out.flat[i] = v
            continue
        neg = np.signbit(v)
        a = Fraction(abs(float(v)))
        k = int(np.searchsorted(finite, abs(v), side="right")) - 1  # lo = grid[k] <= a
        lo, hi = finite[k], grid[k + 1]
        if Fraction(lo) == a:
            out.flat[i] = -lo if neg else lo
            continue
        hi_f = virtual_next if np.isinf(hi) else Fraction(hi)
        up_code_odd, lo_code_odd = codes[k + 1] & 1, codes[k] & 1
        if not subnormals and k == 0:  # flushed: 0 and the smallest normal are one step apart
            up_code_odd, lo_code_odd = 1, 0
        mid = (Fraction(lo) + hi_f) / 2
        away_dir = {"ru": not neg, "rd": neg}
        if mode in ("rne", "rna", "rnz", "rto"):
            if a != mid:
                pick_hi = a > mid
            elif mode == "rne":
                pick_hi = not up_code_odd
            elif mode == "rto":
                pick_hi = bool(up_code_odd)
            else:
                pick_hi = mode == "rna"
        elif mode == "rz":
            pick_hi = False
        elif mode in away_dir:
            pick_hi = away_dir[mode]
        elif mode == "ro":
            pick_hi = bool(up_code_odd) and not lo_code_odd
        else:
            raise ValueError(mode)
        r = hi if pick_hi else lo
        out.flat[i] = -r if neg else r
    return out


class ieee:
    """``ieee.round(x, e, m, mode, subnormals)`` and ``ieee.grid(e, m, subnormals)``."""

    round = staticmethod(ieee_round)
    grid = staticmethod(ieee_grid)
