"""Rounding onto posits, bit pattern by bit pattern, for all nine rounding modes.

`Posit._split` locates each magnitude on the posit grid: the code of its lower
neighbour and its position towards the next code (in *code* space, where the
2022 standard rounds). From that:

* deterministic modes round ``parity + position`` with `round_scaled`, so ties
  go to the even *code*, ODD picks the odd code, and directed modes follow the
  value order (codes are ordered like values);
* STOCHASTIC (exact) goes up with probability ``(x - lo) / (hi - lo)``: linear in
  the value, so E[SR(x)] = x also where exponent or regime bits are cut (where
  the grid is uniform that ratio is the exact dyadic position; elsewhere it is
  computed in float64, within 2**-53 of the true ratio);
* STOCHASTIC with ``rand_bits=r`` is the hardware scheme on the bit string:
  add r random bits below the last kept bit and truncate;
* nothing nonzero rounds to 0 (unless ``underflow="zero"``) and nothing rounds
  to NaR: results saturate to ±minpos / ±maxpos in every mode. NaN and ±inf
  give NaR (NaN).
"""

from __future__ import annotations

import torch

from anynum.formats.posit import Posit
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import RandomSource, Rounding, round_scaled

__all__: list[str] = []

_ONE_MINUS_ULP = 1.0 - 2.0**-53  # largest float64 below 1


@working_dtype.register
def _(fmt: Posit, dtype: torch.dtype) -> torch.dtype:
    return torch.float64  # integer code arithmetic and 52-bit fractions: float64 throughout


@round_to_format.register
def _round_posit(
    fmt: Posit,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    x = x.to(torch.float64)
    a = torch.abs(x)
    finite = torch.isfinite(x)
    nonzero = finite & (a > 0)
    a_safe = torch.where(nonzero, a, torch.ones_like(a))
    sp = fmt._split(a_safe)
    neg = x < 0

    if mode is Rounding.STOCHASTIC:
        if rand_bits is None:
            gap = sp.hi - sp.lo
            ratio = (a_safe - sp.lo) / torch.where(gap > 0, gap, torch.ones_like(gap))
            p = torch.where(sp.uniform & ~sp.under, sp.frac_exact, ratio)
            p = torch.clamp(p, 0.0, _ONE_MINUS_ULP)
        else:
            p = sp.frac_truncated(rand_bits)
        up = round_scaled(p, mode, rng, rand_bits) > 0
    elif mode is Rounding.STOCHASTIC_UNIFORM:
        up = round_scaled(sp.frac_class(), mode, rng) > 0
    elif mode is Rounding.UP or mode is Rounding.DOWN:
        inexact = sp.frac_class() > 0
        up = inexact & (~neg if mode is Rounding.UP else neg)
    else:  # nearest (three tie rules), toward zero, odd: on the magnitude's code
        parity = (sp.code_lo & 1).to(torch.float64)
        up = (round_scaled(parity + sp.frac_class(), mode) - parity) > 0

    mag = torch.where(up, sp.hi, sp.lo)  # both maxpos above maxpos: never NaR
    if fmt.underflow == "minpos":
        mag = torch.clamp(mag, min=fmt.minpos)  # a nonzero input never rounds to zero
    y = torch.where(neg, -mag, mag)
    y = torch.where(a == 0, torch.zeros_like(y), y)  # ±0 -> 0: posits have one zero
    y = torch.where(y == 0, torch.zeros_like(y), y)  # underflow="zero": no -0 either
    return torch.where(finite, y, torch.full_like(y, torch.nan))  # NaN, ±inf -> NaR
