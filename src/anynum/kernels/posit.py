"""Rounding onto posits, bit pattern by bit pattern, for all nine rounding modes.

`Posit.locate` locates each magnitude on the posit grid: the code of its lower
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

from anynum._bits import select
from anynum.errors import AnynumError
from anynum.formats.posit import Posit
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import RandomSource, Rounding, round_scaled, stochastic_away

__all__: list[str] = []

@working_dtype.register
def _(fmt: Posit, dtype: torch.dtype) -> torch.dtype:
    # The grid is found from the input's own bits (`Posit.locate`), so float32 inputs
    # stay float32 whenever every posit value is a normal float32.
    return torch.float32 if dtype != torch.float64 and fmt.fits_float32() else torch.float64


@round_to_format.register
def _round_posit(
    fmt: Posit,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    a = torch.abs(x)
    finite = a < torch.inf  # not torch.isfinite: that one does not vectorize in Inductor
    a_safe = torch.where(finite & (a > 0), a, 1.0)
    sp = fmt.locate(a_safe)

    if mode is Rounding.STOCHASTIC:
        if rng is None:
            raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
        p = sp.value_position(a_safe) if rand_bits is None else sp.frac_truncated(rand_bits)
        up = stochastic_away(p, rng, rand_bits)
    elif mode is Rounding.STOCHASTIC_UNIFORM:
        up = round_scaled(sp.frac_class(), mode, rng) > 0
    elif mode is Rounding.UP or mode is Rounding.DOWN:
        inexact = sp.frac_class() > 0
        neg = x < 0
        up = inexact & (~neg if mode is Rounding.UP else neg)
    else:  # nearest (three tie rules), toward zero, odd: on the magnitude's code
        parity = sp.parity.to(x.dtype)
        up = (round_scaled(parity + sp.frac_class(), mode) - parity) > 0

    mag = select(up, sp.hi, sp.lo)  # both maxpos above maxpos: never NaR
    if fmt.underflow == "minpos":
        mag = torch.clamp(mag, min=fmt.minpos)  # a nonzero input never rounds to zero
    # ±0 -> 0 (posits have one zero), and underflow="zero" gives no -0 either; mag >= 0
    # takes x's sign (a NaN's is replaced below).
    y = torch.where((a == 0) | (mag == 0), 0.0, torch.copysign(mag, x))
    return torch.where(finite, y, torch.nan)  # NaN, ±inf -> NaR
