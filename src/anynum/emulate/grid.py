"""The one rounding seam of emulation: `Grid`, a format with its rounding mode and random stream.

Every value that emulation produces is rounded here and nowhere else: `Grid.round`
(one rounding of float values), `Grid.round_pair` (one rounding of an exact value
held as ``y + e``, the TwoSum/TwoProduct form) and `Grid.round_scalar` (Python
scalars, cached). Deterministic modes go through one cached
`anynum.nn.quantizer.Rounder` per (format, mode, overflow); stochastic modes
through `anynum.quantize` with a fresh counter-based seed per call, derived from
``(seed, calls)``, so the stream state is two plain ints (`state_dict`).

Why ``round_pair``: rounding ``fl64(a + b)`` is the correct single rounding of
``a + b`` in the nearest modes for every format of at most 25 significant bits
(2p + 2 <= 53 makes float64 double rounding innocuous), but not under directed,
odd or stochastic modes: bf16 ``ru`` of ``1 + 2**-100`` must give ``1 + 2**-7``
although ``fl64(1 + 2**-100) == 1``. The exact error ``e`` decides: its sign is
the sticky bit (where y is itself a rounding boundary it is moved one float64
step towards e, which reaches no other boundary of a grid of at most 50 bits),
and its value enters the stochastic probability exactly (`bernoulli_pair`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from anynum.emulate import native
from anynum.errors import AnynumError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.floating import FP32
from anynum.formats.registry import format as lookup_format
from anynum.mc.eft import two_prod, two_sum
from anynum.nn.quantizer import Rounder
from anynum.quantize import quantize
from anynum.rounding import CounterRandom, RandomSource, Rounding, RoundingLike, parse_rounding

__all__ = ["Grid", "bernoulli_pair", "elementwise_format", "is_exact_pair_mode"]

#: Deterministic rounders, resolved once per (format, mode, overflow) for the whole process.
_ROUNDERS: dict[tuple[Format, Rounding, str], Rounder] = {}
#: Attribute on tensors that holds the tag of the grid they were last rounded onto.
_TAG = "_anynum_grid"
#: Attribute holding (tag, float64 copy) of a narrower tensor this grid produced (see `Grid.wide`).
_WIDE = "_anynum_f64"
#: Beyond this many significant bits the one-ulp nudge of `round_pair` could cross a boundary.
_PAIR_MAX_PRECISION = 50
_MASK62 = (1 << 62) - 1


def _rounder(fmt: Format, mode: Rounding, overflow: str) -> Rounder:
    key = (fmt, mode, overflow)
    r = _ROUNDERS.get(key)
    if r is None:
        r = _ROUNDERS[key] = Rounder(fmt, mode, overflow)
    return r


def elementwise_format(fmt: Format) -> Format:
    """The format elementwise results are rounded to: `fmt` itself, or FP32 for a Block format.

    A Block format (MX, NVFP4) scales blocks of dot-product operands; the other
    results of an emulated model have no block to share a scale with, and OCP MX
    dot products return FP32, so they are rounded to FP32.

    >>> import anynum as an
    >>> elementwise_format(an.MXFP8_E4M3), elementwise_format(an.BF16)
    (FP32, BF16)
    """
    return FP32 if isinstance(fmt, Block) else fmt


def is_exact_pair_mode(mode: Rounding, precision: int) -> bool:
    """Whether rounding ``fl64(x)`` can differ from rounding an exact sum/product x (so `round_pair` is needed).

    Nearest modes are safe up to 25 significant bits (2p + 2 <= 53); every other
    mode reads the bits float64 drops.
    """
    return not (mode.is_nearest and precision <= 25)


def _mix(seed: int, n: int) -> int:
    """A 62-bit seed for call `n` of the stream `seed` (SplitMix64 finaliser of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + n + 1) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK62


class Grid:
    """A format's grid with a rounding mode and (stochastic modes) a counter-based stream.

    Calling ``grid.round(x)`` rounds every element of a float tensor once and
    returns a tensor of x's dtype. NaN stays NaN (NaR for posits), ±inf and
    overflow follow the format's default policy (inf where it has infinities,
    else saturation), -0 is kept where the format has it.

    >>> import torch, anynum as an
    >>> g = Grid(an.BF16, "ru")
    >>> g.round(torch.tensor([1.0 + 2**-10], dtype=torch.float64)).tolist()
    [1.0078125]
    >>> y, e = torch.tensor([1.0], dtype=torch.float64), torch.tensor([2.0**-100], dtype=torch.float64)
    >>> g.round_pair(y, e).tolist()   # the exact 1 + 2**-100, rounded up once
    [1.0078125]
    """

    def __init__(
        self,
        fmt: Format | str,
        rounding: RoundingLike = "nearest",
        *,
        overflow: str | None = None,
        seed: int | None = None,
    ) -> None:
        self.fmt = lookup_format(fmt)
        if isinstance(self.fmt, Block):
            raise AnynumError(
                f"a Grid rounds elementwise; {self.fmt.display_name()} is a block format. "
                "Use elementwise_format(fmt) for its elementwise grid."
            )
        self.mode = parse_rounding(rounding)
        self.overflow = self.fmt.check_overflow(overflow)
        self.precision = int(self.fmt.precision)
        self.key = (self.fmt, self.overflow)  # the grid's values; the mode does not change them
        self.stochastic = self.mode.is_stochastic
        if self.stochastic and seed is None:
            seed = int(torch.randint(0, 2**62, (1,)))  # torch.manual_seed fixes it
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise AnynumError(f"seed must be an int or None, got {seed!r}.")
        self.seed = seed
        self.calls = 0
        self.needs_pair = is_exact_pair_mode(self.mode, self.precision)
        self._nearest = _rounder(self.fmt, Rounding.NEAREST_EVEN, self.overflow)
        self._det = None if self.stochastic else _rounder(self.fmt, self.mode, self.overflow)
        self._scalars: dict[float, float] = {}

    def __repr__(self) -> str:
        return f"Grid({self.fmt.display_name()}, {self.mode.name})"

    # --- the stream -------------------------------------------------------------------------
    def next_seed(self) -> int:
        """The seed of the next stochastic call (advances the stream)."""
        assert self.seed is not None
        self.calls += 1
        return _mix(self.seed, self.calls)

    def state_dict(self) -> dict[str, int | None]:
        """The stream position as plain ints (loads with ``torch.load(weights_only=True)``)."""
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = None if state["seed"] is None else int(state["seed"])
        self.calls = int(state["calls"])

    # --- rounding ---------------------------------------------------------------------------
    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise `RepresentabilityError` when tensors of `dtype` cannot hold this grid's values."""
        self._nearest.check_dtype(dtype)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Every element of float tensor `x` rounded once onto the grid (a new tensor, x's dtype)."""
        if x.numel() == 0:
            return x.detach().clone()
        if self._det is not None:
            if x.dtype in (torch.float64, torch.float32):  # float32 values widen exactly
                fast = native.round_values(x.to(torch.float64), self, x.dtype)
                if fast is not None:
                    return fast
            return self._det(x)
        return quantize(x.detach(), self.fmt, self.mode, overflow=self.overflow, seed=self.next_seed())

    def round_blocks(self, x: torch.Tensor, block: Block, axis: int) -> torch.Tensor:
        """`x` quantized onto Block format `block` with its blocks along `axis` (this grid's mode).

        The Block's own rounding rules apply (its scale rule, saturating elements);
        the rounding mode and random stream are this grid's.
        """
        fmt = dataclasses.replace(block, axis=axis)
        seed = self.next_seed() if self.stochastic else None
        return quantize(x.detach(), fmt, self.mode, seed=seed)

    def round_to(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``round(x)`` stored as `dtype` (checked to hold the grid, so the cast is exact)."""
        if dtype != x.dtype:
            self.check_dtype(dtype)
            if self._det is not None and x.dtype == torch.float64 and dtype == torch.float32:
                fast = native.round_values(x, self, dtype)  # rounds and narrows in one pass
                if fast is not None:
                    return fast
        return self.round(x).to(dtype)

    def round_scalar(self, v: float) -> float:
        """A Python float rounded onto the grid (cached for deterministic modes)."""
        if not self.stochastic:
            r = self._scalars.get(v)
            if r is None:
                r = float(self.round(torch.tensor([float(v)], dtype=torch.float64))[0])
                if len(self._scalars) < 4096:
                    self._scalars[v] = r
            return r
        return float(self.round(torch.tensor([float(v)], dtype=torch.float64))[0])

    def round_pair(self, y: torch.Tensor, e: torch.Tensor, *, force: bool = False) -> torch.Tensor:
        """The exact value ``y + e`` (float64, ``|e|`` below one ulp of y) rounded once.

        `e` is the TwoSum/TwoProduct error term (0 where y is exact). Without
        `force`, nearest modes on grids of at most 25 bits round ``y`` alone, which
        is exact when y + e is a sum or product of two values of the grid (double
        rounding through float64 is innocuous there); pass ``force=True`` for any
        other pair. Formats of more than 50 significant bits round ``y`` (float64
        is their working precision).
        """
        if self.precision > _PAIR_MAX_PRECISION or not (force or self.needs_pair):
            return self.round(y)
        inexact = (e != 0).reshape(-1)
        if not bool(inexact.any()):
            return self.round(y)
        idx = torch.nonzero(inexact).reshape(-1)
        ys, es = y.reshape(-1)[idx], e.reshape(-1)[idx]
        if self.stochastic:
            out = self.round(y).reshape(-1).clone()
            out[idx] = self._stochastic_pair(ys, es, idx)
            return out.view(y.shape)
        flat = y.reshape(-1).clone()
        flat[idx] = self._nudge(ys, es, self.mode)
        return self.round(flat.view(y.shape))

    def _nudge(self, y: torch.Tensor, e: torch.Tensor, mode: Rounding) -> torch.Tensor:
        """y moved one float64 step towards e where y is a decision point of `mode`, else y.

        The exact value y + e lies strictly between y and its float64 neighbour on e's
        side. Where y is not a boundary of the rounding, y rounds like y + e; where it is
        (a grid point for directed, odd and stochastic modes, a tie point for the nearest
        ones), the neighbour does, since boundaries of a grid of at most 50 bits are more
        than one float64 step apart.
        """
        if mode.is_nearest:
            at = _rounder(self.fmt, Rounding.NEAREST_AWAY, self.overflow)(y) != _rounder(
                self.fmt, Rounding.NEAREST_ZERO, self.overflow)(y)
        else:
            at = self._nearest(y) == y
        towards = torch.where(e > 0, math.inf, -math.inf).to(y.dtype)
        return torch.where(at, torch.nextafter(y, towards), y)

    def _stochastic_pair(self, y: torch.Tensor, e: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        z = self._nudge(y, e, Rounding.TOWARD_ZERO)  # between the same grid neighbours as y + e
        lo = _rounder(self.fmt, Rounding.DOWN, self.overflow)(z)
        hi = _rounder(self.fmt, Rounding.UP, self.overflow)(z)
        rng = CounterRandom(self.next_seed())
        if self.mode is Rounding.STOCHASTIC_UNIFORM:
            up = rng.bits_at(index, 1, 0).bool()
        else:
            gap = hi - lo
            ok = torch.isfinite(gap) & (gap > 0)
            safe = torch.where(ok, gap, torch.ones_like(gap))
            d = torch.where(ok, y - lo, torch.zeros_like(y))  # exact: lo is a coarse multiple below y
            f1, r = _div_pair(d, safe)
            f2 = (r + torch.where(ok, e, torch.zeros_like(e))) / safe
            up = bernoulli_pair(f1, f2, rng, index)
        out = torch.where(up, hi, lo)
        # beyond the grid's range (no finite neighbour pair) the plain stochastic rule decides
        finite = torch.isfinite(lo) & torch.isfinite(hi) & (hi > lo)
        if not bool(finite.all()):
            out = torch.where(finite, out, quantize(z, self.fmt, self.mode, overflow=self.overflow,
                                                    seed=self.next_seed()))
        return out

    # --- tensors known to be on the grid ----------------------------------------------------
    def mark(self, t: torch.Tensor, *, written: bool = False) -> torch.Tensor:
        """Record that `t`, as it is now, holds values of this grid (returns t).

        ``written=True`` for a tensor an in-place or out= op has just written: autograd's
        ADInplaceOrView layer bumps its version once more when the op returns, so the mark
        expects that next version (an unrelated write after it bumps past it).
        """
        setattr(t, _TAG, (self.key, t._version + int(written), t.data_ptr(), t.dtype))
        return t

    def is_marked(self, t: torch.Tensor) -> bool:
        """Whether `t` was marked by a grid of the same values and has not been written since."""
        tag = getattr(t, _TAG, None)
        return tag is not None and tag == (self.key, t._version, t.data_ptr(), t.dtype)

    def round_to_kept(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``round_to(x, dtype)`` for a float64 `x`, keeping the float64 rounding beside the result.

        The next op that reads the result widens it to float64 again; `wide` hands it this
        copy instead (while the result is unchanged), which saves a conversion per read at
        the cost of the copy's memory while the result lives.
        """
        if dtype == x.dtype or x.dtype != torch.float64:
            return self.mark(self.round_to(x, dtype))
        self.check_dtype(dtype)
        r64 = self.round(x)
        out = self.mark(r64.to(dtype))
        setattr(out, _WIDE, (getattr(out, _TAG), r64))
        return out

    def wide(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as float64: its kept float64 copy where `round_to_kept` left one and t is unchanged."""
        kept = getattr(t, _WIDE, None)
        if kept is not None and kept[0] == (self.key, t._version, t.data_ptr(), t.dtype):
            return kept[1]  # type: ignore[no-any-return]
        return t.to(torch.float64)

    def round_input(self, t: torch.Tensor) -> torch.Tensor:
        """`t` itself when marked on this grid, else its rounding (a new, marked tensor)."""
        if self.is_marked(t):
            return t
        return self.mark(self.round(t))


def _div_pair(d: torch.Tensor, gap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q = fl(d / gap)`` and ``r = d - q * gap`` (exact for power-of-two gaps, else to 2**-106)."""
    q = d / gap
    p, pe = two_prod(q, gap)
    return q, (d - p) - pe


def bernoulli_pair(f1: torch.Tensor, f2: torch.Tensor, rng: RandomSource, index: torch.Tensor) -> torch.Tensor:
    """True with probability ``f1 + f2`` (a two-term value in [0, 1]), exactly.

    A uniform u is compared with f 53 bits at a time: chunk k of u (stream =
    round) against the integer part of ``f * 2**53``; equal chunks pass the rest
    of f, still two-term, to the next round. Decided after one round except with
    probability about 2**-52 per element. `index` addresses each element's bits.

    >>> import torch
    >>> from anynum.rounding import CounterRandom
    >>> f = torch.full((20000,), 0.25, dtype=torch.float64)
    >>> up = bernoulli_pair(f, torch.zeros_like(f), CounterRandom(1), torch.arange(20000))
    >>> abs(up.double().mean().item() - 0.25) < 0.02
    True
    """
    f1, f2 = two_sum(f1, f2)
    up = torch.zeros(f1.shape, dtype=torch.bool, device=f1.device)
    live = torch.arange(f1.numel(), device=f1.device)
    a, b, idx = f1.reshape(-1), f2.reshape(-1), index.reshape(-1)
    flat = up.reshape(-1)
    for level in range(8):
        k = rng.bits_at(idx, 53, level).to(torch.float64)
        t = a * 2.0**53
        c = torch.floor(t)
        s1, s2 = two_sum(c - k, t - c)  # (c - k) is an exact integer, t - c exact
        s1, s3 = two_sum(s1, b * 2.0**53)
        g1, g2 = two_sum(s1, s2 + s3)
        yes = (g1 > 1) | ((g1 == 1) & (g2 >= 0))
        no = (g1 < 0) | ((g1 == 0) & (g2 <= 0))
        flat[live[yes]] = True
        more = ~(yes | no)
        live, a, b, idx = live[more], g1[more], g2[more], idx[more]
        if live.numel() == 0:
            break
    return up


def check_float_container(grid: Grid, dtype: torch.dtype) -> None:
    """`Grid.check_dtype` with the fix spelled out for emulated models."""
    try:
        grid.check_dtype(dtype)
    except RepresentabilityError as exc:
        raise RepresentabilityError(
            f"{exc} Under emulation keep such tensors in a wider dtype (model.double(), x.double())."
        ) from None
