"""`Stats`: what rounding did to one stream of tensors, folded into a few running sums.

One `Stats` belongs to one (layer, category) of a diagnosis. `add(x, y)` takes a tensor
before rounding and the rounded tensor the model actually used; `add_update(before,
x, y)` takes a weight before an optimizer step, the value the step computed and the
value stored. Only sums, a running maximum and a histogram of the exponents are kept,
so memory does not grow with the run. For float32/float64 CPU tensors `add` reads each
tensor once, in C (`anynum.nn.statsnative`); the torch code here is the reference and
runs everywhere else.

Definitions (``x`` before rounding, ``y`` after; fractions are of the *nonzero* inputs,
since zero is exact in every format):

* ``overflow``: ``|x| > max`` (the format's largest finite value; for block formats the
  largest value any block can hold); infinite inputs count, NaN does not.
* ``underflow``: ``x != 0`` but ``y == 0`` (flushed to zero).
* ``subnormal``: ``0 < |y| < smallest_normal`` (None for block formats, whose grid moves with
  each block's scale).
* ``sqnr_db``: ``10 log10(sum x^2 / sum (y - x)^2)`` over finite ``x``; a finite ``x``
  rounded to inf or NaN makes the noise infinite (-inf dB); no error gives +inf.
* ``rel_err``: mean of ``|y - x| / |x|`` over finite nonzero ``x``.
* ``sr_rel_var`` (stochastic modes only): ``sum (x - lo)(hi - x) / sum x^2``, ``lo`` and
  ``hi`` the grid neighbours of ``x``: the variance stochastic rounding adds, relative to
  the signal, computed exactly from the neighbours rather than from the draws.
* ``candidates``: SQNR (dB) the same tensors would have in other formats (round to nearest,
  each format's default overflow).

For optimizer updates the signal is the update ``u = x - before``: ``sqnr_db`` and
``rel_err`` compare the stored error ``y - x`` with ``u``, ``sr_rel_var`` divides by
``sum u^2``, the fractions are of the nonzero updates, and

* ``stagnation``: ``|u| < ulp(before) / 2``, where ``ulp(w)`` is the gap from the grid value
  at or below ``|w|`` to the next one above (the updates round to nearest would lose);
* ``lost``: ``y == before``: the stored weight did not move at all.

Update statistics count only weights that were on the grid before the step (the first step
of a model initialised off the grid moves its weights onto it, which is no update lost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from anynum.errors import RepresentabilityError
from anynum.formats.base import Format
from anynum.nn.statsnative import fold as native_fold
from anynum.quantize import quantize
from anynum.rounding import Rounding

__all__ = ["HIST_OFFSET", "Stats"]

#: floor(log2|x|) of a float64 lies in [-1074, 1023]; bin i of the histogram is exponent i - offset.
HIST_OFFSET = 1100
_BINS = 2200

# Positions in the running-sum vector.
_N, _NZ, _NAN, _OVER, _UNDER, _SUB, _SIG, _NOISE, _REL, _RELN, _SRVAR, _STAG, _LOST = range(13)


def _range(fmt: Format) -> tuple[float, float | None]:
    """(largest finite magnitude, smallest normal or None where the grid moves per block)."""
    abs_max = getattr(fmt, "abs_max", None)
    if abs_max is not None:  # block formats: the element grid times each block's scale
        return float(abs_max), None
    return float(fmt.max), float(fmt.smallest_normal)


def _count(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(dtype=torch.float64)


def _error(x: torch.Tensor, y: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """y - x where x is finite (0 elsewhere); a finite x rounded to inf or NaN is an infinite error."""
    return torch.where(finite, y - x, 0.0).nan_to_num(nan=math.inf, posinf=math.inf, neginf=-math.inf)


class Stats:
    """Running statistics of one (layer, category); see the module docstring for the definitions.

    >>> import torch, anynum as an
    >>> s = Stats(an.E4M3FN, "nearest")
    >>> x = torch.tensor([0.0, 1.0, 1000.0, 1e-4])
    >>> s.add(x, an.quantize(x, an.E4M3FN))
    >>> r = s.summary(); r["overflow"], r["underflow"], r["max_abs"]
    (0.3333333333333333, 0.3333333333333333, 1000.0)
    """

    def __init__(
        self,
        fmt: Format,
        mode: Rounding | str = Rounding.NEAREST_EVEN,
        overflow: str | None = None,
        candidates: Sequence[tuple[str, Format]] = (),
    ) -> None:
        self.fmt = fmt
        self.mode = Rounding.parse(mode)
        self.overflow = fmt.check_overflow(overflow)
        self.fmax, self.smallest_normal = _range(fmt)
        self.candidates = list(candidates)
        self.sums: torch.Tensor | None = None  # float64 running sums, on the device of the data
        self.cand_noise: torch.Tensor | None = None
        self.max_abs: torch.Tensor | None = None
        self.hist: torch.Tensor | None = None
        self.updates = False

    def _neighbours(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = quantize(x, self.fmt, Rounding.DOWN, overflow=self.overflow)
        hi = quantize(x, self.fmt, Rounding.UP, overflow=self.overflow)
        return lo, hi

    def _sr_var(self, x: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
        if not self.mode.is_stochastic:
            return torch.zeros((), dtype=torch.float64, device=x.device)
        lo, hi = self._neighbours(x)
        inside = finite & (x.abs() <= self.fmax)
        return torch.where(inside, (x - lo) * (hi - x), 0.0).nan_to_num(0.0).sum()

    def _accumulators(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The running sums, histogram and maximum (zeros on the device of the first call)."""
        if self.sums is None or self.hist is None or self.max_abs is None:
            self.sums = torch.zeros(13, dtype=torch.float64, device=device)
            self.hist = torch.zeros(_BINS, dtype=torch.int64, device=device)
            self.max_abs = torch.zeros((), dtype=torch.float64, device=device)
        return self.sums, self.hist, self.max_abs

    def _fold(self, sums: list[torch.Tensor], signal: torch.Tensor, keep: torch.Tensor) -> None:
        """Add one call's float64 sums; `signal` feeds the maximum and (where `keep`) the histogram."""
        acc, hist, top = self._accumulators(signal.device)
        acc += torch.stack(sums).to(acc.device)
        biggest = signal.abs().nan_to_num(nan=0.0, posinf=math.inf).amax()
        torch.maximum(top, biggest.to(top.device), out=top)
        _, exp = torch.frexp(signal[keep])
        hist += torch.bincount(exp.long() + (HIST_OFFSET - 1), minlength=_BINS).to(hist.device)

    def add(self, x: torch.Tensor, y: torch.Tensor, *, reference: bool = False) -> None:
        """Fold in a tensor `x` and its rounded value `y` (same shape).

        Float32/float64 CPU tensors go through one C loop (`anynum.nn.statsnative`);
        ``reference=True``, other devices and dtypes use the torch reference below.
        """
        if x.numel() == 0:
            return
        x, y = x.detach(), y.detach()
        acc, hist, top = self._accumulators(x.device)
        done = not reference and native_fold(
            x, y, self.fmax, self.smallest_normal, HIST_OFFSET, acc, hist, top
        )
        if not done:
            self._reference(x.to(torch.float64), y.to(torch.float64))
        if self.mode.is_stochastic:
            x64 = x.to(torch.float64)
            acc[_SRVAR] += self._sr_var(x64, x64.abs() < math.inf).to(acc.device)
        for i, (_, fmt) in enumerate(self.candidates):
            self._candidate(i, fmt, x, reference)

    def _candidate(self, i: int, fmt: Format, x: torch.Tensor, reference: bool) -> None:
        """Add the noise of round-to-nearest onto candidate `i` to ``cand_noise[i]``."""
        if self.cand_noise is None:
            self.cand_noise = torch.zeros(len(self.candidates), dtype=torch.float64, device=x.device)
        try:  # round in the input's own dtype (the fast kernels)
            q = quantize(x, fmt)
        except RepresentabilityError:  # wider than the input's dtype: round a float64 copy
            x = x.to(torch.float64)
            q = quantize(x, fmt)
        scratch = torch.zeros(13, dtype=torch.float64, device=self.cand_noise.device)
        spare = (torch.zeros(_BINS, dtype=torch.int64, device=scratch.device), scratch.new_zeros(()))
        if not reference and native_fold(x, q, self.fmax, None, HIST_OFFSET, scratch, *spare):
            self.cand_noise[i] += scratch[_NOISE]
            return
        x64 = x.to(torch.float64)
        e = _error(x64, q.to(torch.float64), x64.abs() < math.inf)
        self.cand_noise[i] += (e * e).sum().to(self.cand_noise.device)

    def _reference(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """The statistics of float64 `x` and `y` in plain torch (the definitions, any device)."""
        ax = x.abs()
        finite = ax < math.inf  # NaN compares False
        nz = ax > 0  # nonzero and not NaN
        rel = finite & nz
        err = _error(x, y, finite)
        xs = torch.where(finite, x, 0.0)
        zero = x.new_zeros(())
        if self.smallest_normal is None:
            sub = zero
        else:
            ay = y.abs()
            sub = _count(nz & (ay > 0) & (ay < self.smallest_normal))
        self._fold(
            [
                x.new_tensor(float(x.numel())),
                _count(nz),
                _count(torch.isnan(x)),
                _count(ax > self.fmax),
                _count(nz & (y == 0)),
                sub,
                (xs * xs).sum(),
                (err * err).sum(),
                torch.where(rel, err.abs() / ax, 0.0).sum(),
                _count(rel),
                zero,
                zero,
                zero,
            ],
            x,
            rel,
        )

    def add_update(self, before: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fold in one optimizer update: weights `before` the step, the computed `x`, the stored `y`."""
        if x.numel() == 0:
            return
        self.updates = True
        before = before.detach().to(torch.float64)
        x = x.detach().to(torch.float64)
        y = y.detach().to(torch.float64)
        u = x - before
        # ulp(before): from the grid value at or below |before| to the next value above it.
        low = quantize(before.abs(), self.fmt, Rounding.DOWN, overflow=self.overflow)
        up = quantize(
            torch.nextafter(low, torch.full_like(low, math.inf)),
            self.fmt,
            Rounding.UP,
            overflow=self.overflow,
        )
        gap = up - low
        has_gap = torch.isfinite(gap) & (gap > 0)
        # Only weights already on the grid: the first step of an off-grid initialisation
        # moves the weight onto the grid, which is not an update being lost.
        finite = torch.isfinite(u) & torch.isfinite(x) & (low == before.abs())
        live = finite & (u != 0)
        err = _error(x, y, finite)
        us = torch.where(finite, u, 0.0)
        self._fold(
            [
                torch.tensor(float(x.numel()), device=x.device),
                _count(live),
                _count(torch.isnan(u)),
                _count(live & (x.abs() > self.fmax)),
                torch.zeros((), device=x.device),
                torch.zeros((), device=x.device),
                (us * us).sum(),
                (err * err).sum(),
                torch.where(live, err.abs() / torch.where(live, u.abs(), 1.0), 0.0).sum(),
                _count(live),
                self._sr_var(x, finite),
                _count(live & has_gap & (u.abs() < gap / 2)),
                _count(live & (y == before)),
            ],
            u,
            live,
        )

    # --- results ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The statistics as plain Python values (see the module docstring). Fractions and the
        relative error are None when no value was nonzero (nothing to be a fraction of)."""
        s = self.sums.tolist() if self.sums is not None else [0.0] * 13
        nz = s[_NZ]

        def frac(i: int) -> float | None:
            return s[i] / nz if nz else None  # no nonzero value: nothing to be a fraction of

        def sqnr(signal: float, noise: float) -> float:
            if signal == 0.0:
                return math.nan
            if noise == 0.0:
                return math.inf
            return 10.0 * math.log10(signal / noise) if math.isfinite(noise) else -math.inf

        hist: dict[int, int] = {}
        if self.hist is not None:
            idx = torch.nonzero(self.hist).flatten().tolist()
            counts = self.hist[idx].tolist() if idx else []
            hist = {i - HIST_OFFSET: int(c) for i, c in zip(idx, counts)}
        cands: dict[str, float] = {}
        if self.cand_noise is not None:
            for (name, _), noise in zip(self.candidates, self.cand_noise.tolist()):
                cands[name] = sqnr(s[_SIG], noise)
        update = self.updates
        return {
            "count": int(s[_N]),
            "nonzero": int(nz),
            "nan": int(s[_NAN]),
            "max_abs": float(self.max_abs) if self.max_abs is not None else 0.0,
            "format_max": self.fmax,
            "overflow": frac(_OVER),
            "underflow": None if update else frac(_UNDER),
            "subnormal": None if update or self.smallest_normal is None else frac(_SUB),
            "sqnr_db": sqnr(s[_SIG], s[_NOISE]),
            "rel_err": s[_REL] / s[_RELN] if s[_RELN] else None,
            "sr_rel_var": (s[_SRVAR] / s[_SIG] if s[_SIG] else 0.0) if self.mode.is_stochastic else None,
            "stagnation": frac(_STAG) if update else None,
            "lost": frac(_LOST) if update else None,
            "candidates": cands,
            "log2_hist": hist,
        }
