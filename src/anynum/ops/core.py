"""What every chopped-math function shares: its settings, the one rounding of an exact result, domain checks.

The rule (DESIGN.md §2 and Resolution 6): inputs are rounded to the format, the
function is computed once in float64, and the result is rounded once. Where the
float64 result is not the exact one, the exact value is carried as a pair
``(s, e)``: ``s`` is float64's round-to-nearest result and ``e`` the error
(exact for + - x and fma by TwoSum/TwoProduct; its sign and an approximation
for / and sqrt, from the exact remainder). `round_exact` rounds ``s + e`` once.

How, without a wider type: round ``s + e`` to float64 *to odd* (``s``, or its
neighbour toward ``e`` when ``s`` is even and ``e != 0``). Every grid point and
every rounding boundary of a format with at most 51 significand bits is a
float64 whose last significand bit is 0, so the odd float64 lies strictly
between the same two boundaries as ``s + e``: rounding it once in any
deterministic mode gives the correct rounding of ``s + e`` (the classic
round-to-odd argument). Stochastic rounding moves the error term into the
probability: ``P(up) = (s + e - lo) / (hi - lo)``, drawn exactly where
``s`` lies on the grid (the case that matters: bf16 "sr" of 1 + 2**-100 goes up
with probability 2**-93) and to within a relative 2**-53 of the probability
elsewhere.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

import anynum as an
from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FP64, FloatFormat
from anynum.formats.posit import Posit
from anynum.formats.table import Table
from anynum.rounding import (
    RandomSource,
    Rounding,
    RoundingLike,
    make_random_source,
    parse_rounding,
    round_scaled,
)

__all__ = [
    "DOMAINS",
    "Settings",
    "check_domain",
    "float32_carries",
    "make_settings",
    "odd_rounding_applies",
    "round_exact",
    "round_input",
    "seed_from_jax_key",
    "significand_bits",
]

#: What an out-of-domain input gives: NumPy's NaN/inf plus a RuntimeWarning, an error, or silence.
DOMAINS = ("nan", "raise", "ignore")

# Random streams: the output rounding uses stream block 0, input i block i + 1, and the
# stochastic error-term correction its own block, so no two roundings share random bits.
_STREAM_STRIDE = 1 << 20
_CORRECTION_STREAM = 512


class _Substream(RandomSource):
    """Stream block `k` of a random source: the same element addresses, independent bits."""

    def __init__(self, base: RandomSource, k: int) -> None:
        self.base, self.offset = base, k * _STREAM_STRIDE

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        return self.base.bits_at(index, nbits, stream + self.offset)

    def stream_base(self, stream: int) -> int | None:
        return self.base.stream_base(stream + self.offset)


class _Gathered(RandomSource):
    """The bits of elements ``positions`` of a larger array, addressed 0, 1, ... (a subset)."""

    def __init__(self, base: RandomSource, positions: torch.Tensor) -> None:
        self.base, self.positions = base, positions

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        where = self.positions[index.reshape(-1)].reshape(index.shape)
        return self.base.bits_at(where, nbits, stream)


@dataclass(frozen=True)
class Settings:
    """The format, mode and options of one call of an `anynum.ops` function."""

    name: str
    fmt: Format
    mode: Rounding
    overflow: str
    rand_bits: int | None
    rng: RandomSource | None
    domain: str

    def stream(self, k: int) -> RandomSource | None:
        """Random stream block `k` (0: the output, i + 1: input i)."""
        return None if self.rng is None else _Substream(self.rng, k)

    def with_rng(self, rng: RandomSource | None) -> Settings:
        return dataclasses.replace(self, rng=rng)

    def quantize(self, t: torch.Tensor, k: int, mode: Rounding | None = None) -> torch.Tensor:
        """`an.quantize` of a float tensor with these settings and random stream block `k`.

        A float64 tensor in a deterministic mode is rounded through its float32
        round-to-odd where that is exact (`float32_carries`): the same result,
        on anynum's fast float32 kernels.
        """
        m = self.mode if mode is None else mode
        if t.dtype == torch.float64 and not m.is_stochastic and float32_carries(self.fmt):
            narrow = an.quantize(_to_odd32(t), self.fmt, m, overflow=self.overflow)
            return narrow.to(torch.float64)  # type: ignore[no-any-return]
        return an.quantize(  # type: ignore[no-any-return]
            t,
            self.fmt,
            m,
            overflow=self.overflow,
            generator=self.stream(k) if m.is_stochastic else None,
            rand_bits=self.rand_bits if m is Rounding.STOCHASTIC else None,
        )


def seed_from_jax_key(key: Any) -> int:
    """A 62-bit seed from the bits of a JAX PRNG key (concrete even inside jit)."""
    import jax

    with jax.ensure_compile_time_eval():  # a concrete key stays concrete inside jit
        words = [int(w) for w in np.asarray(jax.random.key_data(key)).reshape(-1)]
    return sum(w << (32 * i) for i, w in enumerate(reversed(words))) & ((1 << 62) - 1)


def make_settings(
    name: str,
    fmt: Format | str,
    rounding: RoundingLike,
    overflow: str | None,
    seed: int | None,
    generator: Any,
    rand_bits: int | None,
    domain: str,
    device: torch.device,
) -> Settings:
    """Validate the common arguments of an ops function (named `name` in messages)."""
    f = an.format(fmt) if isinstance(fmt, str) else fmt
    if not isinstance(f, Format):
        raise InputError(
            f"an.ops.{name} needs a format (an.Format or a name such as 'bf16'), got {fmt!r}."
        )
    mode = parse_rounding(rounding)
    policy = f.check_overflow(overflow)
    if domain not in DOMAINS:
        raise InputError(f"an.ops.{name}: domain must be one of {DOMAINS}, got {domain!r}.")
    rng = None
    if mode.is_stochastic:
        if generator is not None and type(generator).__module__.split(".")[0] in ("jax", "jaxlib"):
            if seed is not None:
                raise InputError("pass either generator= (a JAX key) or seed=, not both.")
            generator, seed = None, seed_from_jax_key(generator)
        # A CUDA tensor may take a CPU generator: bits are counter-based, drawn on any device.
        gen_device = generator.device if isinstance(generator, torch.Generator) else device
        rng = make_random_source(generator, seed, gen_device)
    return Settings(name, f, mode, policy, rand_bits, rng, domain)


def round_input(t: torch.Tensor, st: Settings, k: int) -> torch.Tensor:
    """Input `k` (0-based) rounded to the format in its own dtype, returned as float64.

    Integer and boolean inputs are values too (NumPy's rule): they are converted to float64 first.
    """
    t = t.detach()
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return st.quantize(t, k + 1).to(torch.float64)


# --- the one rounding of an exact result s + e ---------------------------------------------------


def _even_float64(q: Fraction) -> bool:
    """Whether rational q is 0 or a normal float64 with at most 52 significant bits (last bit 0)."""
    if q == 0:
        return True
    num = abs(q.numerator)
    odd_part_bits = (num // (num & -num)).bit_length()
    dyadic = q.denominator & (q.denominator - 1) == 0
    return dyadic and odd_part_bits <= 52 and 2.0**-1020 <= abs(q) < 2.0**1023


@functools.lru_cache(maxsize=256)
def odd_rounding_applies(fmt: Format) -> bool:
    """Whether every value and rounding boundary of `fmt` is a float64 with a 0 last significand bit.

    Then rounding a round-to-odd float64 onto `fmt` equals rounding the exact value
    (see the module docstring). True for float formats of at most 51 significand
    bits (whose steps stay above float64's subnormal resolution), every posit,
    fixed point and integers of at most 51 bits, tables whose values and
    boundaries have at most 52 significant bits, and power-of-two-scaled blocks of those.
    """
    if isinstance(fmt, Block):
        return fmt.power_of_two_scales and odd_rounding_applies(fmt.element)
    if isinstance(fmt, FloatFormat):
        return fmt.precision <= 51 and fmt.min_quantum_exponent() >= -1072
    if isinstance(fmt, Posit):
        return fmt.underflow == "minpos" or fmt.emin - (1 << fmt.es) >= -1020
    if isinstance(fmt, UniformFormat):
        return fmt.bits <= 51
    if isinstance(fmt, Table):
        vals = [Fraction(float(v)) for v in fmt.values()]
        if fmt.boundaries is not None:
            bounds = [Fraction(b) for b in fmt.boundaries]
        else:
            bounds = [(a + b) / 2 for a, b in itertools.pairwise(vals)]
        return all(_even_float64(v) for v in vals + bounds)
    return False


@functools.lru_cache(maxsize=256)
def significand_bits(fmt: Format) -> int:
    """The most significant bits any value of `fmt` has (a product of two has at most twice as many).

    >>> significand_bits(an.BF16), significand_bits(an.Posit(16, 1)), significand_bits(an.Table([0.1, 3.0]))
    (8, 13, 52)
    """
    if isinstance(fmt, Block):
        return significand_bits(fmt.element) + (0 if fmt.power_of_two_scales else 53)
    if isinstance(fmt, (FloatFormat, Posit)):
        return fmt.precision
    if isinstance(fmt, UniformFormat):
        return fmt.bits
    vals = [Fraction(float(v)) for v in fmt.values()] if isinstance(fmt, Table) else []
    if not vals:
        return 53
    return max(0 if v == 0 else (abs(v.numerator) // (abs(v.numerator) & -abs(v.numerator))).bit_length()
               for v in vals)


_FLOAT32_MAX = torch.finfo(torch.float32).max


def _fits_float32(q: Fraction) -> bool:
    """Whether rational q is a float32 whose last significand bit is 0 (normal or subnormal)."""
    if q == 0:
        return True
    if q.denominator & (q.denominator - 1) or abs(q) >= Fraction(2) ** 127:
        return False
    scaled = abs(q) * Fraction(2) ** 148  # float32 subnormals are multiples of 2**-149
    if scaled.denominator != 1:
        return False
    num = scaled.numerator
    return (num // (num & -num)).bit_length() <= 23


@functools.lru_cache(maxsize=256)
def float32_carries(fmt: Format) -> bool:
    """Whether a float32 round-to-odd of a value rounds onto `fmt` like the value itself (every mode but SR).

    True when every value and rounding boundary of `fmt` is a float32 with a 0
    last bit: formats of at most 22 significand bits whose range, boundaries and
    overflow threshold lie inside float32's (bf16, fp16, the FP8/FP6/FP4 family,
    posits up to 22 bits of precision within 2**±126, fixed point up to 22 bits).
    """
    if isinstance(fmt, FloatFormat):
        return fmt.precision <= 22 and fmt.min_quantum_exponent() >= -147 and fmt.emax <= 127
    if isinstance(fmt, Posit):
        low = fmt.emin - ((1 << fmt.es) if fmt.underflow == "zero" else 0)
        return fmt.precision <= 22 and low >= -126 and fmt.emax <= 126
    if isinstance(fmt, UniformFormat):
        return fmt.bits <= 22 and fmt.step_exp >= -147 and fmt.max < 2.0**126
    if isinstance(fmt, Table) and len(fmt) <= 1 << 16:
        vals = [Fraction(float(v)) for v in fmt.values()]
        bounds = ([Fraction(b) for b in fmt.boundaries] if fmt.boundaries is not None
                  else [(a + b) / 2 for a, b in itertools.pairwise(vals)])
        return all(_fits_float32(v) for v in vals + bounds)
    return False  # blocks (scales reach beyond float32) and wider formats: float64


def _to_odd32(t: torch.Tensor) -> torch.Tensor:
    """float32 round-to-odd of float64 values (beyond float32's range: ±FLT_MAX, which is odd)."""
    y = t.to(torch.float32)
    if bool(torch.isinf(y).any()):  # overflow of a finite value: the odd float below is FLT_MAX
        big = torch.isinf(y) & torch.isfinite(t)
        y = torch.where(big, torch.copysign(torch.full_like(y, _FLOAT32_MAX), y), y)
    back = y.to(torch.float64)
    step = (back != t) & ((y.view(torch.int32) & 1) == 0) & (back == back)  # inexact, even, not NaN
    if not bool(step.any()):
        return y
    toward = torch.where(t > back, torch.inf, -torch.inf).to(torch.float32)
    return torch.where(step, torch.nextafter(y, toward), y)


def _to_odd(s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """float64 round-to-odd of s + e: s, or its neighbour toward e where s is even and e != 0."""
    even = (s.view(torch.int64) & 1) == 0
    step = (e != 0) & even & torch.isfinite(s)
    toward = torch.where(e > 0, torch.inf, -torch.inf).to(s.dtype)
    return torch.where(step, torch.nextafter(s, toward), s)


def _float64_grid(s: torch.Tensor, e: torch.Tensor, st: Settings, k: int) -> torch.Tensor:
    """Rounding s + e onto float64's own grid (FP64): a step to the neighbour toward e, or not."""
    mode = st.mode
    away = torch.where(e > 0, torch.inf, -torch.inf).to(s.dtype)
    other = torch.nextafter(s, away)  # the neighbour on e's side
    inexact = (e != 0) & torch.isfinite(s)
    if mode is Rounding.UP:
        take = inexact & (e > 0)
    elif mode is Rounding.DOWN:
        take = inexact & (e < 0)
    elif mode is Rounding.TOWARD_ZERO:
        take = inexact & (torch.signbit(e) != torch.signbit(s)) & (s != 0)
    elif mode is Rounding.ODD:
        take = inexact & ((s.view(torch.int64) & 1) == 0)
    elif mode.is_nearest:  # s is RN(s + e): only an exact tie can move the result
        tie = inexact & (2 * e.abs() == (other - s).abs())
        bigger = other.abs() > s.abs()
        if mode is Rounding.NEAREST_AWAY:
            take = tie & bigger
        elif mode is Rounding.NEAREST_ZERO:
            take = tie & ~bigger
        else:
            take = torch.zeros_like(tie)
    elif mode is Rounding.STOCHASTIC_UNIFORM:
        coin = st.stream(k)
        assert coin is not None
        flat = torch.arange(s.numel(), device=s.device).view(s.shape)
        take = inexact & coin.bits_at(flat, 1, 0).bool()
    else:  # exact stochastic: the error term is the probability of the step
        q = torch.where(inexact, e.abs() / (other - s).abs(), torch.zeros_like(e))
        take = inexact & (round_scaled(q, Rounding.STOCHASTIC, st.stream(k)) == 1)
    return st.quantize(torch.where(take, other, s), k, Rounding.TOWARD_ZERO)


def _stochastic_correction(y: torch.Tensor, s: torch.Tensor, e: torch.Tensor, st: Settings, k: int) -> None:
    """Where e != 0, move y (an exact SR of s) so that P(up) becomes (s + e - lo) / (hi - lo). In place."""
    fix = ((e != 0) & torch.isfinite(s) & torch.isfinite(y)).reshape(-1)
    if not bool(fix.any()):
        return
    pos = torch.nonzero(fix).reshape(-1)
    sf, ef = s.reshape(-1)[pos], e.reshape(-1)[pos]
    t = _to_odd(sf, ef)
    lo = st.quantize(t, k, Rounding.DOWN)
    hi = st.quantize(t, k, Rounding.UP)
    ok = torch.isfinite(lo) & torch.isfinite(hi) & (lo < hi)
    gap = torch.where(ok, hi - lo, torch.ones_like(hi))
    f_hi = ((sf - lo) / gap).clamp(0.0, 1.0)  # P(up) of the SR of s alone
    f_lo = ef / gap
    up = ef > 0
    # e > 0: a result left at lo goes up with probability f_lo / (1 - f_hi); e < 0: a result at
    # hi comes down with probability -f_lo / f_hi. Both give P(hi) = f_hi + f_lo.
    q = torch.where(up, f_lo / (1.0 - f_hi).clamp(min=2.0**-1074), -f_lo / f_hi.clamp(min=2.0**-1074))
    q = torch.where(ok, q.clamp(0.0, 1.0), torch.zeros_like(q))
    base = st.stream(_CORRECTION_STREAM + k)
    assert base is not None
    move = round_scaled(q, Rounding.STOCHASTIC, _Gathered(base, pos)) == 1
    yf = y.reshape(-1)[pos]
    at_end = torch.where(up, yf == lo, yf == hi)
    yf = torch.where(ok & at_end & move, torch.where(up, hi, lo), yf)
    y.view(-1)[pos] = yf


def round_exact(s: torch.Tensor, e: torch.Tensor | None, st: Settings, k: int = 0) -> torch.Tensor:
    """Round the exact value ``s + e`` once onto ``st.fmt`` (float64 in and out).

    `s` is float64's round-to-nearest result and `e` the error term (``|e|`` at
    most half an ulp of `s`; 0 where `s` is not finite), or None when `s` is
    the value to round (libm results). `k` picks the random stream block.

    >>> import torch
    >>> st = make_settings("add", "bf16", "ru", None, None, None, None, "nan", torch.device("cpu"))
    >>> one = torch.tensor([1.0], dtype=torch.float64)
    >>> round_exact(one, torch.tensor([2.0**-100], dtype=torch.float64), st).item() == 1 + 2**-7
    True
    """
    if e is None:
        return st.quantize(s, k)
    if odd_rounding_applies(st.fmt):
        if st.mode is Rounding.STOCHASTIC and st.rand_bits is None:
            y = st.quantize(s, k)
            _stochastic_correction(y, s, e, st, k)
            return y
        return st.quantize(_to_odd(s, e), k)
    if st.fmt == FP64 and isinstance(st.fmt, FloatFormat):
        return _float64_grid(s, e, st, k)
    return st.quantize(s, k)  # e.g. FloatFormat(11, 51): documented as float64 RN, then rounded


# --- domains --------------------------------------------------------------------------------------


def _user_stacklevel() -> int:
    """The stack level of the first frame outside anynum (for warnings.warn)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("anynum"):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def check_domain(
    st: Settings,
    result: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    pole: Callable[..., torch.Tensor] | None,
    where: str,
    *,
    nan_in: torch.Tensor | None = None,
) -> None:
    """NumPy's rule for out-of-domain inputs: NaN (invalid) or ±inf (pole) plus a RuntimeWarning.

    `result` is the float64 result before rounding, `inputs` the rounded float64
    inputs (broadcastable to `result`), `pole(*inputs)` marks finite inputs where the
    function has a pole, and `where` states the domain for messages. Reductions pass
    `nan_in`, which marks the results whose inputs held a NaN.
    """
    if st.domain == "ignore":
        return
    nan_out = torch.isnan(result)
    if pole is None and not bool(nan_out.any()):
        return  # the common case, in one pass
    reduction = nan_in is not None
    if nan_in is None:
        nan_in = torch.zeros(result.shape, dtype=torch.bool, device=result.device)
        for t in inputs:
            nan_in = nan_in | torch.isnan(t)
    invalid = nan_out & ~nan_in
    bad_pole = pole(*inputs) & ~invalid & ~nan_in if pole is not None else None
    kinds = []
    if bool(invalid.any()):
        kinds.append(("invalid value", invalid))
    if bad_pole is not None and bool(bad_pole.any()):
        kinds.append(("divide by zero", bad_pole))
    for what, mask in kinds:
        if st.domain == "raise":
            i = int(torch.nonzero(mask.reshape(-1))[0])
            if reduction:
                shown = f"the reduction at flat index {i}"
            else:
                shown = "(" + ", ".join(
                    repr(float(t.expand(result.shape).reshape(-1)[i])) for t in inputs) + ")"
            raise InputError(
                f"an.ops.{st.name}: {int(mask.sum())} result(s) outside its domain ({where}); "
                f"the first is {shown}, which gives {float(result.reshape(-1)[i])!r}. Mask such "
                "inputs first, or pass domain='nan' for NumPy's behaviour (NaN or ±inf and a "
                "RuntimeWarning)."
            )
        warnings.warn(
            f"{what} encountered in an.ops.{st.name}", RuntimeWarning, stacklevel=_user_stacklevel()
        )
