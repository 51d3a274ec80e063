"""The nine rounding modes, each implemented once, on *scaled* values.

Every format reduces rounding to one problem: given ``s = x / quantum`` (an
exact float, because the quantum is a power of two or the grid is uniform),
pick an integer neighbour of ``s``. `round_scaled` is that single
implementation; format kernels only compute the quantum and handle range.

Parity ("even"/"odd") is the parity of the chosen integer, i.e. of the
significand at the finer of the two neighbouring binades. It equals the parity
of the format's code whenever the format has at least one mantissa bit; for
``man_bits == 0`` (E8M0) it means ties go to the larger power of two, as in
ml_dtypes (gfloat picks the even *code* instead; see docs/semantics.md).

Stochastic decisions are taken on the magnitude (with the same random bits,
SR(-x) = -SR(x)). Stochastic rounding with ``rand_bits=None`` is exact: an infinitely precise
uniform u in [0, 1) is compared with the fractional part f of ``s``, 53 bits at
a time, so P(up) = f exactly and E[SR(x)] = x. With ``rand_bits=r`` it is the
hardware scheme: add r random bits below the last kept bit and truncate the
magnitude (gfloat's StochasticFastest), P(up) = floor(f * 2**r) / 2**r.
"""

from __future__ import annotations

import enum
import functools
import random
from dataclasses import dataclass

import numpy as np
import torch

from anynum.errors import AnynumError

__all__ = [
    "CounterRandom",
    "RandomSource",
    "Rounding",
    "RoundingLike",
    "counter_bits",
    "make_random_source",
    "parse_rounding",
    "round_scaled",
    "splitmix64",
    "stochastic_away",
]


_STOCHASTIC_VALUES = frozenset({"sr", "sr_uniform"})
_NEAREST_VALUES = frozenset({"nearest", "rna", "rnz"})


class Rounding(enum.Enum):
    """Rounding modes; every function that takes ``rounding=`` also accepts the string aliases.

    >>> Rounding.parse("rne") is Rounding.NEAREST_EVEN
    True
    """

    NEAREST_EVEN = "nearest"
    NEAREST_AWAY = "rna"
    NEAREST_ZERO = "rnz"
    TOWARD_ZERO = "rz"
    UP = "ru"
    DOWN = "rd"
    ODD = "ro"
    STOCHASTIC = "sr"
    STOCHASTIC_UNIFORM = "sr_uniform"

    @classmethod
    def parse(cls, value: RoundingLike) -> Rounding:
        """Accept a member, its name, or any alias from the table in DESIGN.md."""
        return parse_rounding(value)

    # By value, not by member: reading a member off an Enum class costs about 0.1 us in
    # Python 3.11, and these run on every weight access of a QAT model.
    @property
    def is_stochastic(self) -> bool:
        return self._value_ in _STOCHASTIC_VALUES

    @property
    def is_nearest(self) -> bool:
        return self._value_ in _NEAREST_VALUES

    @property
    def sign_symmetric(self) -> bool:
        """True when rounding -x gives minus the rounding of x (deterministic modes only)."""
        return self not in (Rounding.UP, Rounding.DOWN) and not self.is_stochastic


RoundingLike = Rounding | str

_ALIASES: dict[str, Rounding] = {
    "nearest": Rounding.NEAREST_EVEN,
    "rne": Rounding.NEAREST_EVEN,
    "nearest_even": Rounding.NEAREST_EVEN,
    "rna": Rounding.NEAREST_AWAY,
    "nearest_away": Rounding.NEAREST_AWAY,
    "rnz": Rounding.NEAREST_ZERO,
    "nearest_zero": Rounding.NEAREST_ZERO,
    "rz": Rounding.TOWARD_ZERO,
    "truncate": Rounding.TOWARD_ZERO,
    "toward_zero": Rounding.TOWARD_ZERO,
    "ru": Rounding.UP,
    "ceil": Rounding.UP,
    "up": Rounding.UP,
    "rd": Rounding.DOWN,
    "floor": Rounding.DOWN,
    "down": Rounding.DOWN,
    "ro": Rounding.ODD,
    "odd": Rounding.ODD,
    "sr": Rounding.STOCHASTIC,
    "stochastic": Rounding.STOCHASTIC,
    "sr_uniform": Rounding.STOCHASTIC_UNIFORM,
    "stochastic_uniform": Rounding.STOCHASTIC_UNIFORM,
}


def parse_rounding(value: RoundingLike) -> Rounding:
    """Resolve a rounding mode given as a `Rounding` member or a string alias.

    >>> parse_rounding("floor")
    <Rounding.DOWN: 'rd'>
    """
    if isinstance(value, Rounding):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in _ALIASES:
            return _ALIASES[key]
        if key.upper() in Rounding.__members__:
            return Rounding[key.upper()]
    import difflib

    close = difflib.get_close_matches(str(value).lower(), list(_ALIASES), n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise AnynumError(
        f"unknown rounding mode {value!r}; expected a Rounding member or one of "
        f"{sorted(_ALIASES)}.{hint}"
    )


# --- random bits ---------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed64(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v >> 63 else v


def splitmix64(z: int) -> int:
    """SplitMix64's finaliser on a Python int, taken mod 2**64: the mixing step of the counter stream.

    The scalar twin of the tensor arithmetic in `counter_bits` (and of the C kernels' ``MIX64``);
    `CounterRandom` derives its stream bases with it, and seeds derived elsewhere
    (``anynum.emulate``'s per-call seeds) go through the same function. Integers of any size
    and sign are taken mod 2**64; the result is in [0, 2**64).

    SplitMix64 seeded with 0 (its state steps by 0x9E3779B97F4A7C15) gives its published first
    outputs:

    >>> [hex(splitmix64(k * 0x9E3779B97F4A7C15)) for k in (1, 2, 3)]
    ['0xe220a8397b1dcdaf', '0x6e789e6aa1b965f4', '0x6c45d188009454f']
    >>> splitmix64(-1) == splitmix64(2**64 - 1)
    True
    """
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _lsr_(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns, in place (z must be a tensor the caller owns).

    ``int(k)`` pins k to a constant under torch.compile: a symbolic k made
    Inductor emit the mask as a 32-bit C++ shift, which wraps at 32.
    """
    k = int(k)
    return z.bitwise_right_shift_(k).bitwise_and_((1 << (64 - k)) - 1)


def _splitmix64_(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser on int64 tensors (wrapping arithmetic = arithmetic mod 2**64), in place.

    In place because eagerly each of its ten ops on a fresh tensor cost twice as much
    (allocation and first touch of the pages); Inductor sees the same arithmetic.
    """
    z.bitwise_xor_(_lsr_(z.clone(), 30)).mul_(_signed64(_MIX1))
    z.bitwise_xor_(_lsr_(z.clone(), 27)).mul_(_signed64(_MIX2))
    return z.bitwise_xor_(_lsr_(z.clone(), 31))


def counter_bits(base: torch.Tensor | int, index: torch.Tensor, nbits: int) -> torch.Tensor:
    """Uniform integers in [0, 2**nbits): the top bits of two SplitMix64 finaliser rounds of (index ^ base).

    A pure function of (base, index): the same bits on any device, under
    torch.compile, and whatever the number of threads. The index enters through
    xor, not ``index * constant``: Inductor folds the latter into its loop
    induction arithmetic, where int64 overflow is undefined behaviour in C++
    and gave wrong bits in vector tails.
    """
    z = _splitmix64_(index ^ base)
    z = _splitmix64_(z.bitwise_xor_(_signed64(_GOLDEN)))
    return _lsr_(z, 64 - nbits)


class RandomSource:
    """Supplies uniform random integers for stochastic rounding, addressed by element index.

    ``bits_at(index, nbits, stream)`` must be a pure function of its arguments,
    so that results depend only on the seed and the input, never on threads,
    chunking or the fused/eager path. Subclass it to inject known bits (tests).
    """

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        """int64 tensor shaped like `index`, uniform in [0, 2**nbits)."""
        raise NotImplementedError

    def stream_base(self, stream: int) -> int | None:
        """The int64 counter base of `stream` for `counter_bits`, or None if not counter-based."""
        return None

    def defer_undecided(self, excess: torch.Tensor) -> bool:
        """Hook for the fused path: take exact stochastic rounding's undecided elements
        (``excess > 0``) instead of refining them now (return True), or let the caller
        refine (False)."""
        return False


@functools.lru_cache(maxsize=4096)
def _counter_stream_base(seed: int, stream: int) -> int:
    # four SplitMix64 rounds in Python ints are ~4 us, asked twice per rounding call
    return _signed64(splitmix64(splitmix64(seed) + stream))


@dataclass(frozen=True)
class CounterRandom(RandomSource):
    """Counter-based random bits (SplitMix64 of seed, stream and element index)."""

    seed: int

    def stream_base(self, stream: int) -> int:
        return _counter_stream_base(self.seed, stream)

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        return counter_bits(self.stream_base(stream), index, nbits)


def _seed_from(generator: torch.Generator) -> int:
    """The next 62-bit seed of a torch Generator (one draw: its state advances by one call)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))


def make_random_source(
    generator: object | None, seed: int | None, device: torch.device
) -> RandomSource:
    """Build the random source for ``generator=`` / ``seed=`` (at most one may be given).

    A torch or NumPy Generator yields one 63-bit seed per call (so successive
    calls differ and the generator's state advances reproducibly); ``seed=``
    fixes the bits; neither draws fresh entropy.
    """
    if generator is None and type(seed) is int:
        return CounterRandom(seed)  # ``seed=`` as an int: the checks below would pass it (1-2 us)
    if generator is not None and seed is not None:
        raise AnynumError("pass either generator= or seed=, not both.")
    if type(generator) is torch.Generator and generator.device.type == device.type:
        return CounterRandom(_seed_from(generator))  # every stochastic call's case, checks skipped
    if isinstance(generator, RandomSource):
        return generator
    if isinstance(generator, torch.Generator):
        if generator.device.type != device.type:
            raise AnynumError(
                f"generator is on {generator.device} but the tensor is on {device}; "
                f"create it with torch.Generator(device={str(device)!r})."
            )
        seed = _seed_from(generator)
    elif isinstance(generator, np.random.Generator):
        seed = int(generator.integers(0, 2**62))
    elif generator is not None:
        raise AnynumError(
            "generator must be a torch.Generator or numpy.random.Generator, "
            f"got {type(generator).__name__}."
        )
    if seed is None:
        seed = random.getrandbits(62)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise AnynumError(f"seed must be an int, got {seed!r}.")
    return CounterRandom(int(seed))


# --- the one implementation of each rule ----------------------------------------------------

_EXACT_CHUNK_BITS = 53  # bits of the uniform variate compared per refinement round


def element_index(s: torch.Tensor) -> torch.Tensor:
    """Row-major element indices shaped like `s` (the random-stream address of each element)."""
    return torch.arange(s.numel(), device=s.device, dtype=torch.int64).view(s.shape)


def stochastic_first_round(f: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First 53-bit comparison of u = k * 2**-53 + ... with f: (up, excess).

    ``up`` is final where ``excess`` is 0; where it is positive (u and f share
    their first 53 bits and f has more: probability 2**-53) the element needs
    `stochastic_refine`. The comparisons run in float64, where k (< 2**53) is
    exact: int64 masks cost twice as much in the fused loop.
    """
    t = f.to(torch.float64) * 2.0**_EXACT_CHUNK_BITS  # exact: power-of-two scaling
    c = torch.floor(t)
    kf = k.to(torch.float64)
    return kf < c, torch.where(kf == c, t - c, 0.0)


def stochastic_refine(
    f: torch.Tensor, up: torch.Tensor, undecided: torch.Tensor, rng: RandomSource
) -> torch.Tensor:
    """Resolve undecided elements by drawing further 53-bit chunks (stream = round number)."""
    flat_up = up.reshape(-1).clone()
    idx = torch.nonzero(undecided.reshape(-1)).reshape(-1)
    t = f.reshape(-1)[idx].to(torch.float64) * 2.0**_EXACT_CHUNK_BITS
    r = t - torch.floor(t)  # the bits of f below the 53 already compared (exact)
    level = 0
    while idx.numel():
        level += 1
        t = r * 2.0**_EXACT_CHUNK_BITS
        c = torch.floor(t)
        k = rng.bits_at(idx, _EXACT_CHUNK_BITS, level)
        flat_up[idx] = k < c.to(torch.int64)
        tie = (k == c.to(torch.int64)) & (t != c)
        idx, r = idx[tie], (t - c)[tie]
    return flat_up.view(up.shape)


def _stochastic_exact_up(f: torch.Tensor, rng: RandomSource) -> torch.Tensor:
    """Bernoulli(f) for dyadic f in [0, 1), exactly: compare f with a lazily refined uniform u."""
    k = rng.bits_at(element_index(f), _EXACT_CHUNK_BITS, 0)
    up, excess = stochastic_first_round(f, k)
    if rng.defer_undecided(excess):
        return up
    undecided = excess > 0
    if bool(undecided.any()):
        up = stochastic_refine(f, up, undecided, rng)
    return up


def stochastic_away(f: torch.Tensor, rng: RandomSource, rand_bits: int | None = None) -> torch.Tensor:
    """Stochastic rounding's decisions for fractions `f` in [0, 1): bool, True = away from zero.

    True with probability exactly f (the exact scheme, `rand_bits` None), or where
    ``floor(f * 2**r) + R >= 2**r`` for R the element's r random bits (hardware SR with
    ``rand_bits=r``). The element index is each element's row-major position in `f`.
    `f` must be exact and in [0, 1); NaN gives False.

    >>> f = torch.tensor([0.0, 0.25, 0.999])
    >>> stochastic_away(f, CounterRandom(7)).tolist()[0], stochastic_away(f, CounterRandom(7), 2).tolist()[0]
    (False, False)
    """
    if rand_bits is not None:
        frac_scaled = torch.floor(f.to(torch.float64) * 2.0**rand_bits)
        r = rng.bits_at(element_index(f), rand_bits, 0).to(torch.float64)  # exact: rand_bits <= 52
        return (frac_scaled + r) >= 2.0**rand_bits  # the sum < 2**53 is exact
    return _stochastic_exact_up(f, rng)


def round_scaled(
    s: torch.Tensor,
    mode: Rounding,
    rng: RandomSource | None = None,
    rand_bits: int | None = None,
) -> torch.Tensor:
    """Round scaled values `s` to integers (returned in s's float dtype) under `mode`.

    `s` must be exact (no rounding error) and its fractional part exactly
    computable, which holds for any finite float: ``s - floor(s)`` is exact.
    NaN stays NaN and ±inf stays ±inf. Stochastic modes need `rng`.

    >>> s = torch.tensor([2.5, -2.5, 3.5, 0.25])
    >>> round_scaled(s, Rounding.NEAREST_EVEN).tolist()
    [2.0, -2.0, 4.0, 0.0]
    >>> round_scaled(s, Rounding.NEAREST_AWAY).tolist()
    [3.0, -3.0, 4.0, 0.0]
    >>> round_scaled(s, Rounding.ODD).tolist()
    [3.0, -3.0, 3.0, 1.0]
    """
    if mode is Rounding.NEAREST_EVEN:
        return torch.round(s)
    if mode is Rounding.TOWARD_ZERO:
        return torch.trunc(s)
    if mode is Rounding.UP:
        return torch.ceil(s)
    if mode is Rounding.DOWN:
        return torch.floor(s)

    # The other modes decide on the magnitude: a - floor(a) is exact for a >= 0,
    # while s - floor(s) is not for s in (-1, 0) (1 - |s| may need more bits).
    a = torch.abs(s)
    lo = torch.floor(a)
    f = a - lo
    if mode is Rounding.NEAREST_AWAY:
        away = f >= 0.5
    elif mode is Rounding.NEAREST_ZERO:
        away = f > 0.5
    elif mode is Rounding.ODD:
        away = (f > 0) & (torch.remainder(lo, 2) == 0)
    elif mode is Rounding.STOCHASTIC_UNIFORM:
        if rng is None:
            raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
        away = (f > 0) & rng.bits_at(element_index(s), 1, 0).bool()
    elif mode is Rounding.STOCHASTIC:
        if rng is None:
            raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
        # Away from zero with probability f: the value-space rule P(up) = s - floor(s)
        # seen from the magnitude, for either sign (hardware SR: on the magnitude too).
        away = stochastic_away(f, rng, rand_bits)
    else:  # pragma: no cover - every member is handled above
        raise AssertionError(mode)
    return torch.copysign(lo + away.to(s.dtype), s)
