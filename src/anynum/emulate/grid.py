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
although ``fl64(1 + 2**-100) == 1``. The exact error ``e`` decides (DESIGN.md
Resolution 6). The rule is the project's one rule for exact pairs,
`anynum.ops.core.round_exact`: round ``y + e`` to odd in float64, then once onto
the grid; stochastic modes move ``e`` into the probability. The C sequential
kernel (`anynum.emulate.native`) applies the same round-to-odd step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from anynum.errors import AnynumError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.floating import FP32
from anynum.formats.registry import format as lookup_format
from anynum.kernels.route import Plan
from anynum.ops.core import Settings, float32_carries, round_exact
from anynum.quantize import quantize
from anynum.quantize.rounder import Rounder
from anynum.rounding import CounterRandom, Rounding, RoundingLike, parse_rounding, splitmix64

__all__ = ["Grid", "check_float_container", "elementwise_format", "is_exact_pair_mode"]

#: Deterministic rounders, resolved once per (format, mode, overflow) for the whole process.
_ROUNDERS: dict[tuple[Format, Rounding, str], Rounder] = {}
#: Attribute on tensors that holds the tag of the grid they were last rounded onto.
_TAG = "_anynum_grid"
#: Attribute holding (tag, float64 copy) of a narrower tensor this grid produced (see `Grid.wide`).
_WIDE = "_anynum_f64"
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
    """Whether rounding ``fl64(x)`` can differ from rounding an exact sum/product x (`round_pair` needed).

    Nearest modes are safe up to 25 significant bits (2p + 2 <= 53); every other
    mode reads the bits float64 drops.
    """
    return not (mode.is_nearest and precision <= 25)


def _mix(seed: int, n: int) -> int:
    """A 62-bit seed for call `n` of the stream `seed` (SplitMix64 finaliser of both)."""
    return splitmix64(seed * 0x9E3779B97F4A7C15 + n + 1) & _MASK62


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
        # float64 values of a format float32 carries may round through their float32 round-to-odd
        # (ops' rule, `Settings.quantize`): the same results, worth it where the kernel router
        # has a faster float32 kernel for the size than the float64 one (`_detour_pays`)
        self._via32 = None
        if self._det is not None and float32_carries(self.fmt):
            self._via32 = Settings("emulate", self.fmt, self.mode, self.overflow, None, None, "ignore")
        self._scalars: dict[float, float] = {}
        self._products_exact: dict[int, bool] = {}

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
        n = x.numel()
        if n == 0:
            return x.detach().clone()
        det = self._det
        if det is not None:
            # what the Rounder does, with its plan looked up once here: this runs for every output
            # of every emulated op, where the Python around a small tensor's rounding is the cost
            dev = x.device.type
            plan = det.plan(x.dtype, dev)
            if self._via32 is not None and x.dtype == torch.float64 and self._detour_pays(plan, n, dev):
                return self._via32.quantize(x.detach(), 0)
            return plan.run(x.detach() if x.requires_grad else x, None)
        return quantize(x.detach(), self.fmt, self.mode, overflow=self.overflow, seed=self.next_seed())

    def _detour_pays(self, plan64: Plan, n: int, dev: str) -> bool:
        """Whether the router rounds `n` float64s with its eager kernel but float32s with a faster one."""
        if plan64.choose(n).name != "eager":
            return False
        assert self._det is not None
        return self._det.plan(torch.float32, dev).choose(n).name != "eager"

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
        """The exact value ``y + e`` (float64; y + e lies strictly between y and its float64
        neighbour on e's side, as after TwoSum/TwoProduct or a truncation) rounded once.

        `e` is the error term (0 where y is exact). The rounding is `anynum.ops`' one rule
        for exact pairs, `anynum.ops.core.round_exact` (round to odd in float64, then once
        onto the grid; stochastic modes move the error term into the probability). Without
        `force`, nearest modes on grids of at most 25 bits round ``y`` alone, which is exact
        when y + e is a sum or product of two values of the grid (double rounding through
        float64 is innocuous there); pass ``force=True`` for any other pair.
        """
        if not (force or self.needs_pair):
            return self.round(y)
        if not bool((e != 0).any()):
            return self.round(y)
        rng = CounterRandom(self.next_seed()) if self.stochastic else None
        st = Settings("emulate", self.fmt, self.mode, self.overflow, None, rng, "ignore")
        return round_exact(y.to(torch.float64), e.to(torch.float64), st).to(y.dtype)

    def products_exact(self, k: int) -> bool:
        """Whether every product of `k` values of this grid is exact in float64: at most 53
        significant bits, and no overflow or underflow below float64's normal range.

        >>> Grid("posit(16,2)").products_exact(3), Grid("fp32").products_exact(3)
        (True, False)
        """
        exact = self._products_exact.get(k)
        if exact is None:
            tiny, big = float(self.fmt.smallest_subnormal), float(self.fmt.max)
            exact = (
                k * self.precision <= 53
                and 0 < tiny <= big < math.inf
                and k * math.log2(tiny) >= -1022
                and k * math.log2(big) < 1023
            )
            self._products_exact[k] = exact
        return exact

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

    def round_owned(self, x: torch.Tensor) -> torch.Tensor:
        """``round(x)`` for a tensor no one else holds (a result just computed): written into `x`
        itself where the router can (deterministic modes).

        A fresh result buffer is not free: the allocator maps new pages for a large one, and
        their first touch costs more than the rounding (measured: about 5 ns per float64 element
        against 2.4 for the rounding itself).
        """
        n = x.numel()
        if self._det is None or n == 0 or x.requires_grad:
            return self.round(x)
        dev = x.device.type
        plan = self._det.plan(x.dtype, dev)
        if self._via32 is not None and x.dtype == torch.float64 and self._detour_pays(plan, n, dev):
            return self._via32.quantize(x, 0)
        return plan.run(x, None, x)

    def round_to_kept(self, x: torch.Tensor, dtype: torch.dtype, *, owned: bool = False) -> torch.Tensor:
        """``round_to(x, dtype)`` for a float64 `x`, keeping the float64 rounding beside the result.

        The next op that reads the result widens it to float64 again; `wide` hands it this
        copy instead (while the result is unchanged), which saves a conversion per read at
        the cost of the copy's memory while the result lives. `owned`: x is a result no one else
        holds, rounded in place (`round_owned`).
        """
        if dtype == x.dtype or x.dtype != torch.float64:
            if owned and dtype == x.dtype:
                return self.mark(self.round_owned(x))
            return self.mark(self.round_to(x, dtype))
        self.check_dtype(dtype)
        r64 = self.round_owned(x) if owned else self.round(x)
        out = self.mark(r64.to(dtype))
        setattr(out, _WIDE, (getattr(out, _TAG), r64))
        return out

    def write_kept(self, t: torch.Tensor, r64: torch.Tensor) -> None:
        """Write the float64 rounding `r64` into `t` (an in-place or out= target, any float dtype
        that holds the grid), mark it written and keep `r64` as its float64 copy (see `wide`)."""
        if t.dtype != r64.dtype:
            self.check_dtype(t.dtype)
        t.copy_(r64)
        self.mark(t, written=True)
        if t.dtype != r64.dtype:
            setattr(t, _WIDE, (getattr(t, _TAG), r64))

    def wide(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as float64: its kept float64 copy where `round_to_kept` left one and t is unchanged."""
        kept = getattr(t, _WIDE, None)
        if kept is not None and kept[0] == (self.key, t._version, t.data_ptr(), t.dtype):
            return kept[1]  # type: ignore[no-any-return]
        return t.to(torch.float64)

    def wide_rounded(self, t: torch.Tensor) -> torch.Tensor:
        """``wide(round_input(t))`` for a `t` not marked on this grid: its rounding as float64.

        Deterministic modes round the float64 copy (the same values: a rounding depends on the
        value, not on the dtype holding it), which spares a narrow rounded copy; stochastic modes
        round in t's own dtype, as `round_input` does, so the random stream is the same.
        """
        if self.stochastic or t.dtype == torch.float64:
            return self.round_input(t).to(torch.float64)
        self.check_dtype(t.dtype)
        return self.round(t.to(torch.float64))

    def round_input(self, t: torch.Tensor) -> torch.Tensor:
        """`t` itself when marked on this grid, else its rounding (a new, marked tensor)."""
        if self.is_marked(t):
            return t
        return self.mark(self.round(t))


def check_float_container(grid: Grid, dtype: torch.dtype) -> None:
    """`Grid.check_dtype` with the fix spelled out for emulated models."""
    try:
        grid.check_dtype(dtype)
    except RepresentabilityError as exc:
        raise RepresentabilityError(
            f"{exc} Under emulation keep such tensors in a wider dtype (model.double(), x.double())."
        ) from None
