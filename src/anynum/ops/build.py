"""The plumbing every `anynum.ops` function shares: how a call runs, and its body around the kernel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from anynum.errors import InputError
from anynum.kernels.arrays import is_jax_tracer
from anynum.ops.arrays import Call, run
from anynum.ops.core import (
    Settings,
    check_domain,
    make_settings,
    odd_rounding_applies,
    round_exact,
    significand_bits,
)
from anynum.rounding import Rounding, parse_rounding

__all__ = ["SHAPE_1", "SHAPE_2", "Pole", "call", "jnp_like", "make_body", "options", "range_pair"]

#: A predicate on the (rounded, float64) inputs, or None.
Pole = Callable[..., torch.Tensor] | None


def call(name: str, args: Sequence[Any], body: Callable[..., Any], opts: dict[str, Any], *,
         jax_like: Callable[..., Any] | None = None, rounded: Sequence[bool] | None = None,
         outputs: tuple[str, ...] = ("f",), dask: Callable[..., Any] | None = None) -> Any:
    """Run an ops function: `opts` are its common arguments (see `options`), `body` its computation."""
    if parse_rounding(opts["rounding"]).is_stochastic and any(is_jax_tracer(a) for a in args):
        generator = opts.get("generator")
        if is_jax_tracer(generator) or (generator is None and opts.get("seed") is None):
            raise InputError(
                f"an.ops.{name}: stochastic rounding under jax.jit/vmap needs a concrete seed= or PRNG "
                "key passed from outside the traced function; one drawn while tracing would repeat on "
                "every call."
            )

    def settings(device: torch.device) -> Settings:
        return make_settings(name, device=device, **opts)

    return run(Call(settings, args, body, rounded, jax_like, dask, outputs))


def options(fmt: Any, rounding: Any, overflow: Any, seed: Any, generator: Any, rand_bits: Any,
            domain: Any) -> dict[str, Any]:
    """The common arguments of every ops function, as `call` takes them."""
    return dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                rand_bits=rand_bits, domain=domain)


def jnp_like(name: str) -> Callable[..., Any]:
    """A jax.numpy function with the output shapes and dtypes of ours (for ``jax.jit``)."""

    def like(*a: Any) -> Any:
        import jax.numpy as jnp

        return getattr(jnp, name)(*a)

    return like


SHAPE_1 = jnp_like("sin")  # elementwise, float result
SHAPE_2 = jnp_like("arctan2")  # broadcast, float result


_DBL_MAX = torch.finfo(torch.float64).max
_BEYOND = 2.0**900  # an error term standing for "further out than float64's largest value"
_TINY = 2.0**-1074


def range_pair(s: torch.Tensor, e: torch.Tensor | None, xs: Sequence[torch.Tensor], pole: Pole,
                never_zero: Pole, st: Settings) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A float64 result with float64's own overflow and underflow undone, as a pair (s, e).

    float64 gives ±inf for a finite exact value beyond its range, and libm 0 for a
    nonzero one below it. Directed, odd and stochastic rounding need to know such a
    value is finite, or nonzero: it becomes ±DBL_MAX (or ±0) with an error term of
    its sign (posits then saturate instead of becoming NaR). Poles stay ±inf, and
    rounding to nearest on float64's own range keeps float64's result.
    """
    if st.mode.is_nearest and st.fmt.max >= _DBL_MAX:
        return s, e
    if not bool(torch.isinf(s).any()) and (never_zero is None or not bool((s == 0).any())):
        return s, e  # the common case, in one or two passes
    finite = torch.ones(s.shape, dtype=torch.bool, device=s.device)
    for t in xs:
        finite = finite & torch.isfinite(t)
    over = torch.isinf(s) & finite
    if pole is not None:
        over = over & ~pole(*xs)
    under = (s == 0) & finite & never_zero(*xs) if never_zero is not None else None
    if under is not None and e is not None:
        under = under & (e == 0)
    if not bool(over.any()) and (under is None or not bool(under.any())):
        return s, e
    e = torch.zeros_like(s) if e is None else e
    e = torch.where(over, torch.copysign(torch.full_like(s, _BEYOND), s), e)
    s = torch.where(over, torch.copysign(torch.full_like(s, _DBL_MAX), s), s)
    if under is not None:
        e = torch.where(under, torch.copysign(torch.full_like(s, _TINY), s), e)
    return s, e


def make_body(name: str, f: Callable[..., Any], pole: Pole, where: str, *, pair: bool,
              down_aware: bool = False, never_zero: Pole = None,
              plain: tuple[Callable[..., torch.Tensor], int] | None = None) -> Callable[..., Any]:
    """The body of a function: compute (a pair or a value), check the domain, round once.

    ``plain=(g, bits)``: where the format's values have at most `bits` significant
    bits and the mode is deterministic, float64's own result ``g(*xs)`` already
    rounds like the exact one (it cannot land on a rounding boundary unless it is
    exact), so the error term is not computed.
    """

    def body(st: Settings, *xs: torch.Tensor) -> torch.Tensor:
        if (plain is not None and not st.mode.is_stochastic and significand_bits(st.fmt) <= plain[1]
                and odd_rounding_applies(st.fmt)):
            s = plain[0](*xs)
            check_domain(st, s, xs, pole, where)
            s, e0 = range_pair(s, None, xs, pole, never_zero, st)
            return round_exact(s, e0, st)
        if down_aware:
            out = f(*xs, round_down=st.mode is Rounding.DOWN)
        else:
            out = f(*xs)
        s, e = out if pair else (out, None)
        check_domain(st, s, xs, pole, where)
        s, e = range_pair(s, e, xs, pole, never_zero, st)
        return round_exact(s, e, st)

    return body


# --- unary functions ------------------------------------------------------------------------------
