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

Stochastic rounding with ``rand_bits=None`` is exact: an infinitely precise
uniform u in [0, 1) is compared with the fractional part f of ``s``, 53 bits at
a time, so P(up) = f exactly and E[SR(x)] = x. With ``rand_bits=r`` it is the
hardware scheme: add r random bits below the last kept bit and truncate the
magnitude (gfloat's StochasticFastest), P(up) = floor(f * 2**r) / 2**r.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Union

import numpy as np
import torch

from anynum.errors import AnynumError

__all__ = [
    "RandomSource",
    "Rounding",
    "RoundingLike",
    "TorchRandom",
    "make_random_source",
    "parse_rounding",
    "round_scaled",
]


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

    @property
    def is_stochastic(self) -> bool:
        return self in (Rounding.STOCHASTIC, Rounding.STOCHASTIC_UNIFORM)

    @property
    def is_nearest(self) -> bool:
        return self in (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY, Rounding.NEAREST_ZERO)

    @property
    def sign_symmetric(self) -> bool:
        """True when rounding -x gives minus the rounding of x (deterministic modes only)."""
        return self not in (Rounding.UP, Rounding.DOWN) and not self.is_stochastic


RoundingLike = Union[Rounding, str]

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


class RandomSource:
    """Supplies uniform random integers for stochastic rounding.

    Draws go through one generator in a fixed order, so results depend only on
    the seed and the input, never on the number of threads.
    """

    def integers(self, shape: torch.Size, bits: int, device: torch.device) -> torch.Tensor:
        """int64 tensor of uniform integers in [0, 2**bits)."""
        raise NotImplementedError


@dataclass
class TorchRandom(RandomSource):
    """Random integers from a `torch.Generator` (on the tensor's device)."""

    generator: torch.Generator | None

    def integers(self, shape: torch.Size, bits: int, device: torch.device) -> torch.Tensor:
        return torch.randint(
            0, 1 << bits, shape, generator=self.generator, dtype=torch.int64, device=device
        )


def make_random_source(
    generator: object | None, seed: int | None, device: torch.device
) -> RandomSource:
    """Build the random source for ``generator=`` / ``seed=`` (at most one may be given).

    A NumPy Generator is accepted and seeds a torch generator from its stream, so
    a NumPy Generator drives NumPy inputs reproducibly.
    """
    if generator is not None and seed is not None:
        raise AnynumError("pass either generator= or seed=, not both.")
    if isinstance(generator, RandomSource):
        return generator
    if isinstance(generator, torch.Generator):
        if generator.device.type != device.type:
            raise AnynumError(
                f"generator is on {generator.device} but the tensor is on {device}; "
                f"create it with torch.Generator(device={str(device)!r})."
            )
        return TorchRandom(generator)
    if isinstance(generator, np.random.Generator):
        seed = int(generator.integers(0, 2**63 - 1))
    elif generator is not None:
        raise AnynumError(
            f"generator must be a torch.Generator or numpy.random.Generator, got {type(generator).__name__}."
        )
    if seed is None:
        # Fresh entropy, but still one stream per call: fork from Python's RNG.
        seed = random.getrandbits(63)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise AnynumError(f"seed must be an int, got {seed!r}.")
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return TorchRandom(g)


# --- the one implementation of each rule ----------------------------------------------------

_EXACT_CHUNK_BITS = 53  # bits of the uniform variate compared per refinement round


def _stochastic_exact_up(f: torch.Tensor, rng: RandomSource) -> torch.Tensor:
    """Bernoulli(f) for dyadic f in [0, 1), exactly: compare f with a lazily refined uniform u."""
    f = f.to(torch.float64)
    up = torch.zeros(f.shape, dtype=torch.bool, device=f.device)
    undecided = f > 0
    flat_f = f.reshape(-1)
    k = rng.integers(f.shape, _EXACT_CHUNK_BITS, f.device).reshape(-1)
    idx = torch.arange(flat_f.numel(), device=f.device)
    scale = 2.0**_EXACT_CHUNK_BITS
    flat_up = up.reshape(-1)
    flat_und = undecided.reshape(-1)
    t = flat_f[flat_und] * scale  # exact: power-of-two scaling
    k = k[flat_und]
    idx = idx[flat_und]
    while True:
        c = torch.floor(t)
        flat_up[idx] = k < c.to(torch.int64)
        tie = k == c.to(torch.int64)
        # A tie (prob. 2**-53 per element) means u and f agree on these 53 bits: draw more.
        if not bool(tie.any()):
            break
        t = (t[tie] - c[tie]) * scale
        idx = idx[tie]
        k = rng.integers(torch.Size([idx.numel()]), _EXACT_CHUNK_BITS, f.device)
    return flat_up.reshape(f.shape)


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

    lo = torch.floor(s)
    f = s - lo  # exact
    inexact = f > 0
    if mode is Rounding.NEAREST_AWAY or mode is Rounding.NEAREST_ZERO:
        # Ties: away from zero rounds up for s > 0 (lo + 1) and down for s < 0 (lo).
        tie_up = (s > 0) if mode is Rounding.NEAREST_AWAY else (s < 0)
        up = (f > 0.5) | ((f == 0.5) & tie_up)
    elif mode is Rounding.ODD:
        lo_is_even = torch.remainder(lo, 2) == 0
        up = inexact & lo_is_even
    elif mode is Rounding.STOCHASTIC_UNIFORM:
        if rng is None:
            raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
        coin = rng.integers(s.shape, 1, s.device).bool()
        up = inexact & coin
    elif mode is Rounding.STOCHASTIC:
        if rng is None:
            raise AnynumError("stochastic rounding needs a random source (generator= or seed=).")
        if rand_bits is None:
            up = _stochastic_exact_up(f, rng)
        else:
            return _stochastic_truncating(s, rng, rand_bits)
    else:  # pragma: no cover - every member is handled above
        raise AssertionError(mode)
    return lo + up.to(s.dtype)


def _stochastic_truncating(s: torch.Tensor, rng: RandomSource, rand_bits: int) -> torch.Tensor:
    """Hardware stochastic rounding on the magnitude: floor(|s| + R * 2**-r), R ~ U{0..2**r-1}."""
    a = torch.abs(s)
    lo = torch.floor(a)
    frac_scaled = torch.floor(((a - lo).to(torch.float64)) * 2.0**rand_bits).to(torch.int64)
    r = rng.integers(s.shape, rand_bits, s.device)
    up = (frac_scaled + r) >= (1 << rand_bits)
    return torch.copysign(lo + up.to(s.dtype), s)
