"""Qtorch+'s additions on anynum's kernels: posits with a scale, table formats, posit activations.

Names, signatures and defaults follow ``qtorch_plus.quant``. Differences
(docs/compat.md): ``rounding="stochastic"`` really rounds stochastically; NaN
and ±inf become NaR (NaN), never -inf; any ``nsize`` up to 32 works; table
quantizers keep NaN and saturate ±inf instead of returning 0, and honour the
rounding mode.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import torch

import anynum as an
from anynum.compat.qtorch.number import Posit
from anynum.compat.qtorch.quant.common import as_tensor, draw_seed, scaled
from anynum.compat.straight import straight_through
from anynum.errors import InputError

__all__ = [
    "act_format_quantize",
    "configurable_table_quantize",
    "configurable_table_quantize_geomean",
    "configurable_table_quantize_rounding_hint",
    "new_format_quantize",
    "posit_quantize",
    "posit_sigmoid",
    "posit_tanh",
    "posit_tanh_enhanced",
]

#: The magnitudes of Qtorch+'s fixed "new format" (weights) and "act format" (activations).
NEW_FORMAT = tuple(
    [2.0**-k for k in range(16, 6, -1)]
    + [
        3 / 256,
        1 / 64,
        5 / 256,
        3 / 128,
        7 / 256,
        1 / 32,
        9 / 256,
        5 / 128,
        3 / 64,
        7 / 128,
        1 / 16,
        9 / 128,
        5 / 64,
        3 / 32,
        7 / 64,
        1 / 8,
        9 / 64,
        3 / 16,
        1 / 4,
        3 / 8,
        1 / 2,
        1.0,
    ]
)
ACT_FORMAT = tuple(
    [2.0**-k for k in range(12, 2, -1)]
    + [
        3 / 16,
        1 / 4,
        5 / 16,
        3 / 8,
        7 / 16,
        1 / 2,
        9 / 16,
        5 / 8,
        3 / 4,
        7 / 8,
        1.0,
        9 / 8,
        5 / 4,
        3 / 2,
        7 / 4,
        2.0,
        9 / 4,
        3.0,
        4.0,
        6.0,
        8.0,
        16.0,
    ]
)


def posit_quantize(
    x: torch.Tensor, nsize: int, es: int, scale: float = 1.0, rounding: str = "nearest"
) -> torch.Tensor:
    """Round `x` to posit(`nsize`, `es`), as ``posit(x * scale) / scale``.

    Ties go to the even code; nonzero values never round to 0 (they saturate to
    ±minpos) and large ones saturate to ±maxpos; NaN and ±inf give NaN (NaR).
    A power-of-two `scale` is exact; another scale is applied in float64.

    >>> x = torch.tensor([0.3, 1e6, float("inf")])
    >>> posit_quantize(x, 8, 1).tolist()
    [0.296875, 4096.0, nan]
    >>> posit_quantize(torch.tensor([0.3]), 6, 1, scale=4.0).tolist()
    [0.3125]
    """
    x = as_tensor(x, "posit_quantize")
    number = Posit(nsize, es, scale)
    seed = draw_seed(rounding)
    if number.scale_exp is not None:
        return an.quantize(x, number.format, rounding, seed=seed)
    fmt = an.Posit(nsize, es)
    return scaled(x, scale, lambda t: an.quantize(t, fmt, rounding, seed=seed))


_FRAC = 13  # fraction bits a posit(n <= 16, 0) can have, n - 3 at most


def _value_keys(q: torch.Tensor, nsize: int) -> torch.Tensor:
    """A dense index of the values of posit(nsize <= 16, 0), read off their float32 bits.

    Those values are ±2**k * (1 + f) with |k| <= nsize - 2 and f of at most 13 bits, so the
    float32 exponent and top 13 fraction bits name each one; 0 gets a slot of its own.
    """
    bits = q.to(torch.float32).view(torch.int32)
    e = torch.clamp(((bits >> 23) & 0xFF) - (127 - (nsize - 2)), min=0)
    per_sign = (2 * nsize - 3) << _FRAC
    key = (e << _FRAC) | ((bits >> (23 - _FRAC)) & ((1 << _FRAC) - 1))
    key = torch.where(q == 0, per_sign, key)
    return (key + torch.where(bits < 0, per_sign + 1, 0)).to(torch.int64)


@functools.lru_cache(maxsize=8)
def _sigmoid_lut(nsize: int) -> torch.Tensor:
    """The trick's result for every posit(n <= 16, 0) value, at the value's `_value_keys` slot."""
    fmt = an.Posit(nsize, 0)
    values = torch.from_numpy(fmt.values())  # ascending, NaR left out: index i holds signed code i - half + 1
    half = 1 << (nsize - 1)
    codes = (torch.arange(values.numel()) - (half - 1)) % (1 << nsize)
    lut = torch.zeros(2 * (((2 * nsize - 3) << _FRAC) + 1), dtype=torch.float64)
    lut[_value_keys(values, nsize)] = an.decode((codes ^ half) >> 2, fmt)
    return lut


def _sigmoid_codes(x: torch.Tensor, nsize: int) -> torch.Tensor:
    """Gustafson's posit sigmoid: flip the sign bit of the posit(n, 0) code, shift right by 2.

    Returns float64 values; NaR (from NaN or ±inf) stays NaN.
    """
    if nsize not in range(3, 33):
        raise InputError(f"the posit sigmoid needs nsize in 3..32 (Qtorch+: 8 or 16), got {nsize!r}.")
    fmt = an.Posit(nsize, 0)
    xd = x.detach()
    if nsize <= 16:  # a table lookup on the rounded value (an.encode would round, then split the bits)
        q = an.quantize(xd.to(torch.float64) if xd.dtype == torch.float16 else xd, fmt)
        out = _sigmoid_lut(nsize).to(q.device)[_value_keys(torch.nan_to_num(q), nsize)]
    else:
        codes = an.encode(xd.to(torch.float64), fmt)
        out = an.decode((codes ^ (1 << (nsize - 1))) >> 2, fmt)
    return torch.where(torch.isnan(xd) | torch.isinf(xd), torch.nan, out)


def _check_rounding(rounding: str) -> None:
    if an.Rounding.parse(rounding) is not an.Rounding.NEAREST_EVEN:
        raise InputError(
            f"the posit sigmoid/tanh approximations round to nearest only, got rounding={rounding!r}."
        )


def posit_sigmoid(
    x: torch.Tensor, nsize: int, es: int = 0, scale: float = 1.0, rounding: str = "nearest"
) -> torch.Tensor:
    """The posit(nsize, 0) bit-trick sigmoid: ``decode((code(x) ^ sign_bit) >> 2)``.

    An approximation by design (the fast hardware sigmoid), exact where
    Gustafson's trick is; `es` and `scale` are ignored, as in Qtorch+. NaN and ±inf give NaN.

    >>> posit_sigmoid(torch.tensor([0.0, 2.0, -2.0]), 16).tolist()
    [0.5, 0.875, 0.125]
    """
    x = as_tensor(x, "posit_sigmoid")
    _check_rounding(rounding)
    with torch.no_grad():
        y = _sigmoid_codes(x, nsize).to(x.dtype)
    return straight_through(x, y)


def _tanh(x: torch.Tensor, nsize: int, enhanced: bool) -> torch.Tensor:
    with torch.no_grad():
        t = _sigmoid_codes(x.detach().to(torch.float64) * 2, nsize) * 2 - 1  # exact in float64
        if enhanced:
            # Qtorch+'s correction, in double precision as its C++ does, then rounded to x's dtype
            t = torch.where(t > 0.7583, t + 0.06795, torch.where(t < -0.7583, t - 0.06795, t))
            t = torch.clamp(t.to(x.dtype), -1.0, 1.0)
        y = torch.where(torch.isnan(x), torch.nan, t).to(x.dtype)
    return straight_through(x, y)


def posit_tanh(
    x: torch.Tensor, nsize: int, es: int = 0, scale: float = 1.0, rounding: str = "nearest"
) -> torch.Tensor:
    """tanh(x) as ``2 * posit_sigmoid(2x) - 1`` (Qtorch+'s approximation). NaN and ±inf give NaN.

    >>> posit_tanh(torch.tensor([0.0, 1.0]), 16).tolist()
    [0.0, 0.75]
    """
    x = as_tensor(x, "posit_tanh")
    _check_rounding(rounding)
    return _tanh(x, nsize, enhanced=False)


def posit_tanh_enhanced(
    x: torch.Tensor, nsize: int, es: int = 0, scale: float = 1.0, rounding: str = "nearest"
) -> torch.Tensor:
    """`posit_tanh` with Qtorch+'s correction: ±0.06795 beyond ±0.7583, clamped to [-1, 1].

    >>> posit_tanh_enhanced(torch.tensor([0.0, 1.0, 3.0, 5.0]), 16).tolist()
    [0.0, 0.75, 0.9742000102996826, 1.0]
    """
    x = as_tensor(x, "posit_tanh_enhanced")
    _check_rounding(rounding)
    return _tanh(x, nsize, enhanced=True)


@functools.lru_cache(maxsize=64)
def _signed_table(magnitudes: tuple[float, ...], boundaries: tuple[float, ...] | None) -> an.Table:
    """A Table of ±magnitudes (Qtorch+ compares |x| with the entries and restores the sign)."""
    mags = sorted(set(magnitudes))
    values = [-m for m in reversed(mags) if m > 0] + mags
    if boundaries is None:
        return an.Table(values)
    bounds = list(boundaries)
    return an.Table(values, boundaries=[-b for b in reversed(bounds)] + bounds)


def _table_values(table: Any, name: str) -> tuple[float, ...]:
    if isinstance(table, torch.Tensor):
        table = table.detach().cpu().to(torch.float64).reshape(-1).tolist()
    try:
        mags = tuple(abs(float(v)) for v in table)
    except (TypeError, ValueError):
        raise InputError(f"{name} takes a 1-D tensor or sequence of numbers, got {table!r}.") from None
    if not mags or not all(math.isfinite(m) for m in mags):
        raise InputError(f"{name} needs a non-empty table of finite values.")
    return mags


def _table_round(
    x: torch.Tensor, mags: tuple[float, ...], scale: float, rounding: str, bounds: tuple[float, ...] | None
) -> torch.Tensor:
    fmt = _signed_table(mags, bounds)
    seed = draw_seed(rounding)

    def round_nonzero(t: torch.Tensor) -> torch.Tensor:
        return torch.where(t == 0, t, an.quantize(t, fmt, rounding, seed=seed))  # 0 stays ±0

    return scaled(x, scale, round_nonzero)


def configurable_table_quantize(
    x: torch.Tensor, table_lookup: Any, scale: float = 1.0, rounding: str = "nearest"
) -> torch.Tensor:
    """Round ``|x| * scale`` to the nearest entry of `table_lookup`, restore the sign, divide by scale.

    Ties go to the smaller magnitude; ±0 stays ±0; NaN stays NaN; ±inf and
    values beyond the table saturate to ±(largest entry). Other roundings
    ("stochastic", "rz", ...) act on the same grid.

    >>> t = torch.tensor([0.25, 0.5, 1.0, 2.0])
    >>> configurable_table_quantize(torch.tensor([0.3, -0.8, 1e6, 0.0]), t).tolist()
    [0.25, -1.0, 2.0, 0.0]
    """
    x = as_tensor(x, "configurable_table_quantize")
    return _table_round(x, _table_values(table_lookup, "configurable_table_quantize"), scale, rounding, None)


def new_format_quantize(x: torch.Tensor, scale: float = 1.0, rounding: str = "nearest") -> torch.Tensor:
    """`configurable_table_quantize` with Qtorch+'s built-in 32-entry weight table (2**-16 .. 1).

    >>> new_format_quantize(torch.tensor([0.3, 3.0])).tolist()
    [0.25, 1.0]
    """
    return _table_round(as_tensor(x, "new_format_quantize"), NEW_FORMAT, scale, rounding, None)


def act_format_quantize(x: torch.Tensor, scale: float = 1.0, rounding: str = "nearest") -> torch.Tensor:
    """`configurable_table_quantize` with Qtorch+'s built-in 32-entry activation table (2**-12 .. 16).

    >>> act_format_quantize(torch.tensor([0.3, 20.0])).tolist()
    [0.3125, 16.0]
    """
    return _table_round(as_tensor(x, "act_format_quantize"), ACT_FORMAT, scale, rounding, None)


def configurable_table_quantize_rounding_hint(
    x: torch.Tensor, table_lookup: Any, rounding_hint: Any, scale: float = 1.0
) -> torch.Tensor:
    """Round to the sorted table with explicit boundaries: ``|x| > hint[i]`` selects entry i.

    ``|x| <= hint[0]`` gives 0; a value equal to a hint takes the lower entry.
    Hints must increase and interleave the entries; NaN stays NaN.

    >>> configurable_table_quantize_rounding_hint(torch.tensor([0.7, 0.75, 0.05]),
    ...     torch.tensor([0.5, 1.0]), torch.tensor([0.1, 0.75])).tolist()
    [0.5, 0.5, 0.0]
    """
    x = as_tensor(x, "configurable_table_quantize_rounding_hint")
    mags = _table_values(table_lookup, "configurable_table_quantize_rounding_hint")
    hints = _table_values(rounding_hint, "rounding_hint")
    if 0.0 in mags or len(hints) != len(mags):
        raise InputError("rounding_hint needs one hint per table entry, and the entries must be nonzero.")
    return _table_round(x, (0.0, *mags), scale, "nearest", hints)


def configurable_table_quantize_geomean(
    x: torch.Tensor, table_lookup: Any, scale: float = 1.0
) -> torch.Tensor:
    """Table rounding with geometric-mean boundaries (and 1e-4 below the first entry), as Qtorch+.

    >>> configurable_table_quantize_geomean(torch.tensor([0.7, 0.72]), torch.tensor([0.5, 1.0])).tolist()
    [0.5, 1.0]
    """
    mags = sorted(_table_values(table_lookup, "configurable_table_quantize_geomean"))
    hints = [1e-4] + [math.sqrt(a * b) for a, b in itertools.pairwise(mags)]
    return configurable_table_quantize_rounding_hint(x, mags, hints, scale)
