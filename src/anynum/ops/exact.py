"""float64 kernels of `anynum.ops` that give the exact result as a pair (s, e), or an exact value.

A pair is float64's round-to-nearest result ``s`` and the error ``e`` with
``s + e`` the exact result: exact for add, subtract, multiply, fma and mod
(TwoSum/TwoProduct from `anynum.mc.eft`); for divide and sqrt ``e`` has the
exact sign and a value correct to about 2**-53 (from the exact remainder
``x - y*q`` or ``x - q*q``). ``e`` is 0 wherever ``s`` is not finite.
The other kernels here return values that are exact in float64 (ldexp, modf)
or correctly rounded where libm is not (gamma of integers, cube roots of cubes).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from anynum.mc.eft import two_prod, two_sum

__all__ = [
    "add",
    "cbrt",
    "divide",
    "fma",
    "gamma",
    "ldexp",
    "mod",
    "modf",
    "multiply",
    "sqrt",
]

Pair = tuple[torch.Tensor, torch.Tensor]
_TINY = 2.0**-1074  # stands for an error too small for float64, keeping its sign


def _clean(s: torch.Tensor, e: torch.Tensor) -> Pair:
    return s, torch.where(torch.isfinite(s) & torch.isfinite(e), e, torch.zeros_like(e))


def add(x: torch.Tensor, y: torch.Tensor, round_down: bool = False) -> Pair:
    """x + y. An exact zero sum is +0 unless both are -0, or -0 under round-down (IEEE 754)."""
    s, e = two_sum(*torch.broadcast_tensors(x, y))
    if round_down:
        both_plus = (x == 0) & (y == 0) & ~torch.signbit(x) & ~torch.signbit(y)
        s = torch.where((s == 0) & (e == 0) & ~both_plus, -0.0, s)
    return s, e


def multiply(x: torch.Tensor, y: torch.Tensor) -> Pair:
    return two_prod(*torch.broadcast_tensors(x, y))


def _remainder_error(r: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The quotient's error r / scale, kept nonzero (with its sign) when it underflows."""
    e = r / scale
    tiny = torch.where((r > 0) == (scale > 0), _TINY, -_TINY).to(r.dtype)
    return torch.where((e == 0) & (r != 0), tiny, e)


def divide(x: torch.Tensor, y: torch.Tensor) -> Pair:
    """x / y with the error's sign from the exact remainder x - y*q (representable for q = RN(x/y))."""
    x, y = torch.broadcast_tensors(x, y)
    q = x / y
    p, pe = two_prod(y, q)
    r = (x - p) - pe  # x - p is exact (Sterbenz); the remainder is representable
    ok = torch.isfinite(q) & torch.isfinite(x) & (y != 0) & torch.isfinite(y)
    return _clean(q, torch.where(ok, _remainder_error(r, y), torch.zeros_like(q)))


def sqrt(x: torch.Tensor) -> Pair:
    """sqrt(x) with the error's sign from the exact residual x - q*q."""
    q = torch.sqrt(x)
    p, pe = two_prod(q, q)
    r = (x - p) - pe
    ok = torch.isfinite(q) & (q > 0)
    return _clean(q, torch.where(ok, _remainder_error(r, 2 * q), torch.zeros_like(q)))


def fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, round_down: bool = False) -> Pair:
    """x*y + z as (s, e): s + e is exact, and |e| is below the spacing of float64 next to s.

    The product is exact as ph + pl; ph + z and the two error terms are summed by
    TwoSums, so s is float64's sum and e the sign-exact remainder (see Boldo and
    Melquiond on emulating FMA by round-to-odd).
    """
    x, y, z = torch.broadcast_tensors(x, y, z)
    ph, pl = two_prod(x, y)
    s1, e1 = two_sum(ph, z)
    t, e3 = two_sum(e1, pl)
    s, e4 = two_sum(s1, t)
    e = e4 + e3  # its sign is that of the exact e4 + e3
    if round_down:
        plus = (ph == 0) & (z == 0) & ~torch.signbit(ph) & ~torch.signbit(z)
        s = torch.where((s == 0) & (e == 0) & ~plus, -0.0, s)
    return _clean(s, e)


def mod(x: torch.Tensor, y: torch.Tensor) -> Pair:
    """NumPy's mod (the sign of y): fmod, plus y where the signs differ; zero takes y's sign."""
    x, y = torch.broadcast_tensors(x, y)
    r = torch.fmod(x, y)  # exact
    shift = (r != 0) & (torch.signbit(r) != torch.signbit(y))
    s, e = two_sum(r, torch.where(shift, y, torch.zeros_like(y)))
    s = torch.where(s == 0, torch.copysign(torch.zeros_like(s), y), s)
    return _clean(s, e)


def ldexp(x: torch.Tensor, n: torch.Tensor) -> Pair:
    """x * 2**n for any integer n: one rounding (only below float64's normal range), as a pair.

    A nonzero result that underflows to 0 keeps its sign in the error term.
    """
    x, n = torch.broadcast_tensors(x, n)
    m, k = torch.frexp(x)  # x = m * 2**k, 0.5 <= |m| < 1
    total = torch.clamp(k.to(torch.int64) + n.to(torch.int64), -1200, 1200)
    half = torch.div(total, 2, rounding_mode="floor")
    one = torch.ones_like(m)
    y = m * torch.ldexp(one, half) * torch.ldexp(one, total - half)  # the first product is exact
    live = torch.isfinite(x) & (x != 0)
    y = torch.where(live, y, x)
    lost = live & (y == 0)
    return y, torch.where(lost, torch.copysign(torch.full_like(y, _TINY), x), torch.zeros_like(y))


def modf(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fractional part, integral part), both exact and with x's sign (NumPy's modf)."""
    whole = torch.trunc(x)
    frac = torch.where(torch.isinf(x), torch.zeros_like(x), x - whole)
    return torch.copysign(frac, x), whole


def cbrt(x: torch.Tensor) -> torch.Tensor:
    """Cube root: pow and a Newton step (about 1 ulp), and exact for every exact cube.

    A float64 that is the cube of a dyadic rational has a root of at most 18
    significant bits; that candidate is checked exactly (its cube as an exact pair).
    """
    a = x.abs()
    y = torch.pow(a, 1.0 / 3.0)
    y = torch.where((y > 0) & torch.isfinite(y), y - (y * y * y - a) / (3.0 * y * y), y)
    m, k = torch.frexp(y)
    cand = torch.ldexp(torch.round(torch.ldexp(m, torch.full_like(k, 18))), k - 18)
    sq = cand * cand  # exact: 36 bits
    ph, pl = two_prod(sq, cand)
    exact = (ph == a) & (pl == 0) & torch.isfinite(a) & (a > 0)
    y = torch.where(exact, cand, y)
    return torch.where(torch.isfinite(x) & (x != 0), torch.copysign(y, x), x)


@functools.lru_cache(maxsize=4)
def _factorials(device: str) -> torch.Tensor:
    """float(k!) for k = 0..170, correctly rounded (Python int to float conversion)."""
    return torch.tensor([float(math.factorial(k)) for k in range(171)], dtype=torch.float64, device=device)


def _gamma_float64(x: torch.Tensor) -> torch.Tensor:
    a = x.detach().cpu().numpy()
    try:
        from scipy.special import gamma as sgamma
    except ImportError:  # the standard library's tgamma, element by element
        def one(v: float) -> float:
            if math.isnan(v) or v == -math.inf:
                return math.nan
            try:
                return math.gamma(v)
            except ValueError:  # poles: 0 gives ±inf, negative integers NaN
                return math.copysign(math.inf, v) if v == 0 else math.nan
            except OverflowError:
                return math.inf

        out = np.array([one(v) for v in a.reshape(-1).tolist()], dtype=np.float64).reshape(a.shape)
    else:
        with np.errstate(all="ignore"):
            out = np.asarray(sgamma(a), dtype=np.float64)
    return torch.from_numpy(np.array(out, dtype=np.float64)).to(x.device)


def gamma(x: torch.Tensor) -> torch.Tensor:
    """The gamma function: SciPy's (or libm's tgamma) in float64; exact factorials at 1..171."""
    g = _gamma_float64(x)
    integral = (x == torch.round(x)) & (x >= 1) & (x <= 171)
    table = _factorials(str(x.device))
    idx = torch.where(integral, x, torch.ones_like(x)).to(torch.int64) - 1
    return torch.where(integral, table[idx], g)
