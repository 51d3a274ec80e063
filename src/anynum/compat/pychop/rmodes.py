"""Pychop's rounding-mode codes (``rmode=``) and names, mapped onto `anynum.Rounding`.

=====  =======================  ===========================================================
code   Pychop names             anynum
=====  =======================  ===========================================================
0      "nearest_odd"            nearest, ties to odd (composed: RNE where not a tie, else ODD)
1      "nearest", "nearest_even" NEAREST_EVEN
2      "plus_inf", "plus_infinity", "up"      UP
3      "minus_inf", "minus_infinity", "down"  DOWN
4      "toward_zero", "towards_zero"          TOWARD_ZERO
5      "stoc_prop", "stochastic_prop"         STOCHASTIC (P(up) proportional to the distance)
6      "stoc_equal", "stochastic_equal"       STOCHASTIC_UNIFORM (inexact values: up or down, 1/2 each)
7      "nearest_zero"           NEAREST_ZERO (ties toward zero)
8      "nearest_away"           NEAREST_AWAY (ties away from zero)
9      "odd"                    ODD (round to odd; exact values stay)
10     "cadna"                  STOCHASTIC_UNIFORM (CADNA random directed rounding: the same law)
=====  =======================  ===========================================================
"""

from __future__ import annotations

from typing import Any

import anynum as an
from anynum.errors import InputError

__all__ = ["RMODES", "TIES_TO_ODD", "RoundingSpec", "parse_rmode"]

#: The one mode with no `anynum.Rounding` member, composed from three that exist.
TIES_TO_ODD = "ties_to_odd"

RoundingSpec = an.Rounding | str

R = an.Rounding
RMODES: dict[int, RoundingSpec] = {
    0: TIES_TO_ODD,
    1: R.NEAREST_EVEN,
    2: R.UP,
    3: R.DOWN,
    4: R.TOWARD_ZERO,
    5: R.STOCHASTIC,
    6: R.STOCHASTIC_UNIFORM,
    7: R.NEAREST_ZERO,
    8: R.NEAREST_AWAY,
    9: R.ODD,
    10: R.STOCHASTIC_UNIFORM,
}

_NAMES = {
    "nearest_odd": 0,
    "nearest": 1,
    "nearest_even": 1,
    "plus_inf": 2,
    "plus_infinity": 2,
    "up": 2,
    "minus_inf": 3,
    "minus_infinity": 3,
    "down": 3,
    "toward_zero": 4,
    "towards_zero": 4,
    "stoc_prop": 5,
    "stochastic_prop": 5,
    "stoc_equal": 6,
    "stochastic_equal": 6,
    "nearest_zero": 7,
    "nearest_away": 8,
    "odd": 9,
    "cadna": 10,
}


def parse_rmode(rmode: Any) -> tuple[int, RoundingSpec]:
    """``(code, mode)`` for a Pychop rmode code or name; an `anynum.Rounding` is accepted too.

    >>> parse_rmode(8)
    (8, <Rounding.NEAREST_AWAY: 'rna'>)
    >>> parse_rmode("stoc_prop")
    (5, <Rounding.STOCHASTIC: 'sr'>)
    """
    if isinstance(rmode, an.Rounding):
        code = next((c for c, m in RMODES.items() if m is rmode), -1)
        return code, rmode
    if isinstance(rmode, str) and rmode.strip().lower() in _NAMES:
        code = _NAMES[rmode.strip().lower()]
        return code, RMODES[code]
    if isinstance(rmode, int) and not isinstance(rmode, bool) and rmode in RMODES:
        return rmode, RMODES[rmode]
    raise InputError(
        f"unknown rmode {rmode!r}; expected a Pychop code 0..10 or one of {sorted(_NAMES)} "
        "(or an anynum.Rounding)."
    )
