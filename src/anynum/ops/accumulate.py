"""accumulate= in `anynum.ops`: the seam to anynum.emulate's accumulation engine, and partial products.

Sums, means, dot products and norms with ``accumulate=fmt2 | "quire"`` run on the
emulation engine's `an.matmul` (a sum is a dot product with ones under
``fma=True``: each term enters exactly, one rounding per addition): there is one
accumulation engine in anynum, and `engine_matmul` is the single place that
calls it. Until the engine is in the build, those calls raise a clear error.
Products (prod, cumprod) round each partial product with ops' own correctly
rounded multiply (`partial_products`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

import anynum as an
from anynum.errors import InputError
from anynum.formats.base import Format
from anynum.ops import exact
from anynum.ops.core import Settings, make_settings, round_exact

__all__ = ["check_accumulate", "engine_matmul", "partial_products", "sum_along_last"]


def check_accumulate(name: str, accumulate: Any, order: Any, fma: Any) -> Format | str | None:
    if not isinstance(fma, bool):
        raise InputError(f"an.ops.{name}: fma must be True or False, got {fma!r}.")
    if not (order in ("sequential", "pairwise") or (isinstance(order, int) and not isinstance(order, bool)
                                                     and order >= 1)):
        raise InputError(
            f"an.ops.{name}: order must be 'sequential', 'pairwise' or a positive int (block size), "
            f"got {order!r}."
        )
    if accumulate is None or accumulate == "quire":
        return accumulate  # type: ignore[no-any-return]
    return an.format(accumulate) if isinstance(accumulate, str) else accumulate  # type: ignore[no-any-return]


def engine_matmul(a: torch.Tensor, b: torch.Tensor, accumulate: Any, order: Any, fma: bool,
                   st: Settings) -> torch.Tensor:
    """a @ b with the accumulation semantics of `an.matmul` (float64 in and out, not rounded to fmt).

    The one place that calls the emulation engine. Until it is part of this
    build, accumulate=fmt2/"quire" raise a clear error.
    """
    engine = getattr(an, "matmul", None)
    if engine is None:
        raise InputError(
            f"an.ops.{st.name}(accumulate={accumulate!r}) needs the accumulation engine of anynum.emulate "
            "(an.matmul), which this build of anynum does not have yet; use accumulate=None (float64 "
            "accumulation, rounded once)."
        )
    kwargs: dict[str, Any] = dict(accumulate=accumulate, order=order, fma=fma)
    params = inspect.signature(engine).parameters
    if "rounding" in params:
        kwargs["rounding"] = st.mode
    if "seed" in params and st.rng is not None:
        kwargs["generator"] = st.stream(3)
    return engine(a, b, **kwargs).to(torch.float64)  # type: ignore[no-any-return]


def sum_along_last(x: torch.Tensor, accumulate: Any, order: Any, st: Settings) -> torch.Tensor:
    """Sum over the last axis on the engine: x @ ones with fused multiply-adds (each x_i enters exactly)."""
    ones = torch.ones(x.shape[-1], 1, dtype=torch.float64, device=x.device)
    return engine_matmul(x.unsqueeze(-2), ones, accumulate, order, True, st).reshape(x.shape[:-1])


def partial_products(v: torch.Tensor, acc: Any, order: Any, st: Settings) -> torch.Tensor:
    """Product over the last axis, each partial product rounded to `acc` (sequential or pairwise)."""
    acc_st = make_settings(st.name, acc, st.mode, None, None, st.stream(4), st.rand_bits, "ignore", v.device)

    def mul(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
        return round_exact(*exact.multiply(a, b), acc_st, k)

    n = v.shape[-1]
    if n == 0:
        return torch.ones(v.shape[:-1], dtype=v.dtype, device=v.device)
    if order == "pairwise":
        terms, level = v, 0
        while terms.shape[-1] > 1:
            m = terms.shape[-1]
            paired = mul(terms[..., 0 : m - 1 : 2], terms[..., 1:m:2], 16 + level)
            terms = torch.cat([paired, terms[..., m - 1 :]], dim=-1) if m % 2 else paired
            level += 1
        return terms[..., 0]
    out = v[..., 0]
    out = round_exact(out, torch.zeros_like(out), acc_st, 15)
    for i in range(1, n):
        out = mul(out, v[..., i], 16 + i)
    return out
