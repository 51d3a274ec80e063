"""The argument checks every entry point shares: tensors, rand_bits, out=, and representability.

One implementation each, used by `quantize`, `quantize_block`, `Rounder` and the
layers above (emulation, compat facades); each raises an `AnynumError` subclass
that names what was expected, what was received and the fix.

>>> import torch, anynum as an
>>> try:
...     check_tensor(torch.ones(2, dtype=torch.int64))
... except an.AnynumError as e:
...     print(str(e)[:60])
quantize needs a float16, bfloat16, float32 or float64 tenso
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from anynum._bits import layout
from anynum.errors import InputError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.kernels import round_to_format, working_dtype
from anynum.rounding import Rounding

__all__ = [
    "NUMPY_FLOATS",
    "TORCH_FLOATS",
    "check_out",
    "check_overflow_fits",
    "check_rand_bits",
    "check_representable",
    "check_tensor",
]

TORCH_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def check_rand_bits(rand_bits: Any, mode: Rounding) -> None:
    """`rand_bits` is None, or an int in 1..52 given with rounding="stochastic"."""
    if rand_bits is None:
        return
    if isinstance(rand_bits, bool) or not isinstance(rand_bits, (int, np.integer)):
        raise InputError(f"rand_bits must be an integer in 1..52 or None, got {rand_bits!r}.")
    if not 1 <= rand_bits <= 52:
        raise InputError(
            f"rand_bits must be in 1..52 (random bits added below the last kept bit), got {rand_bits}."
        )
    if mode is not Rounding.STOCHASTIC:
        raise InputError(
            f"rand_bits applies to rounding='stochastic' only, not {mode.name}; drop rand_bits."
        )


def check_tensor(x: torch.Tensor, what: str = "quantize") -> None:
    """`x` is a float16/bfloat16/float32/float64 tensor (`what` names the caller in the message)."""
    if x.dtype not in TORCH_FLOATS:
        kind = "complex" if x.is_complex() else "integer/bool" if not x.is_floating_point() else "unsupported"
        article = "an" if kind[0] in "aeiou" else "a"
        raise InputError(
            f"{what} needs a float16, bfloat16, float32 or float64 tensor, got {article} {kind} tensor of "
            f"dtype {x.dtype}; convert it first, e.g. x.float()."
        )


def check_out(out: Any, x: torch.Tensor) -> None:
    """`out` (when given) is a tensor of x's shape, dtype and device."""
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != x.shape
        or out.dtype != x.dtype
        or out.device != x.device
    ):
        raise InputError(
            "out= must be a tensor of the input's shape, dtype and device; got "
            f"{getattr(out, 'shape', None)}/{getattr(out, 'dtype', None)}/{getattr(out, 'device', None)} "
            f"for input {tuple(x.shape)}/{x.dtype}/{x.device}."
        )


def _in_dtype(v: float, dtype: torch.dtype) -> bool:
    return float(torch.tensor(v, dtype=torch.float64).to(dtype)) == v


def _saturating(fmt: Format) -> str:
    return "saturate" if "saturate" in fmt.overflow_policies else fmt.default_overflow


def _on_grid(fmt: Format, v: float) -> bool:
    x = torch.tensor([v], dtype=torch.float64)
    y = round_to_format(fmt, x, Rounding.NEAREST_EVEN, _saturating(fmt), None, None)
    return float(y[0]) == v


@functools.lru_cache(maxsize=512)
def check_representable(fmt: Format, dtype: torch.dtype) -> None:
    """Raise RepresentabilityError if rounding `dtype` values onto `fmt` can give values `dtype` cannot hold.

    The result of rounding x onto a grid is one of x's two grid neighbours. On
    16-bit dtypes every input is checked exhaustively (round up and down); on
    float32/float64 the grid's ends are checked: the largest value (or the
    dtype's largest, which then must be on the grid) and the smallest positive one.

    >>> import anynum as an
    >>> check_representable(an.E4M3FN, torch.float16) is None
    True
    """
    if dtype in (torch.float16, torch.bfloat16):
        allx = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype).to(torch.float32)
        allx = allx[torch.isfinite(allx)]
        wdt = working_dtype(fmt, dtype)
        for mode in (Rounding.UP, Rounding.DOWN):
            y = round_to_format(fmt, allx.to(wdt), mode, _saturating(fmt), None, None)
            y = y[torch.isfinite(y)]
            bad = y.to(dtype).to(y.dtype) != y
            if bool(bad.any()):
                example = float(y[bad][0])
                raise RepresentabilityError(
                    f"{fmt.display_name()} produces values such as {example!r} that {dtype} cannot "
                    f"hold exactly; quantize a float32 tensor instead (x.float()) to avoid double rounding."
                )
        return
    dmax = torch.finfo(dtype).max
    problems = []
    if fmt.max > dmax:
        if not _on_grid(fmt, dmax):
            problems.append(f"{dtype}'s largest value {dmax!r} is not on the grid and would round past it")
    elif not _in_dtype(fmt.max, dtype):
        problems.append(f"its largest value {fmt.max!r} is not a {dtype} value")
    tiny = fmt.smallest_subnormal
    info = torch.finfo(dtype)
    reachable = tiny >= info.smallest_normal * info.eps or not _on_grid(fmt, 0.0)
    if reachable and not _in_dtype(tiny, dtype):
        problems.append(f"its smallest positive value {tiny!r} is not a {dtype} value")
    elif tiny < info.smallest_normal * info.eps and not isinstance(fmt, Block):
        # Values below the dtype's resolution are unreachable only if tiny inputs can round to
        # zero; posits (underflow="minpos") round the dtype's smallest value down to minpos.
        x = torch.tensor([info.smallest_normal * info.eps], dtype=torch.float64)
        lowest = float(round_to_format(fmt, x, Rounding.DOWN, _saturating(fmt), None, None)[0])
        if lowest > 0 and not _in_dtype(lowest, dtype):
            problems.append(
                f"it rounds {dtype}'s smallest positive value down to {lowest!r}, not a {dtype} value"
            )
    if problems:
        raise RepresentabilityError(
            f"{fmt.display_name()} cannot be held exactly in {dtype}: {'; '.join(problems)}. "
            "Quantize a float64 tensor instead."
        )


@functools.lru_cache(maxsize=512)
def check_overflow_fits(fmt: Format, overflow: str, dtype: torch.dtype) -> None:
    """Raise RepresentabilityError where the overflow policy itself yields values `dtype` cannot hold.

    ``overflow="saturate"`` sends ±inf to ±max, and ``"wrap"`` can give any code of
    the format; a result that the input dtype cannot hold would come back as ±inf
    or rounded a second time. (FP64 saturating on float32 inputs, uint16 wrapping on
    float16.)

    >>> import anynum as an
    >>> check_overflow_fits(an.E4M3FN, "saturate", torch.float16) is None
    True
    """
    if isinstance(fmt, Block):
        return
    info = torch.finfo(dtype)
    if overflow == "saturate" and (fmt.max > info.max or not _in_dtype(fmt.max, dtype)):
        other = " such as overflow='inf'" if fmt.has_inf else ""
        raise RepresentabilityError(
            f"overflow='saturate' turns ±inf into ±{fmt.max!r}, the largest value of {fmt.display_name()}, "
            f"which {dtype} cannot hold; quantize a wider tensor (x.double()) or choose another "
            f"policy{other}."
        )
    if overflow == "wrap":
        widest = max(abs(int(getattr(fmt, "code_min", 0))), abs(int(getattr(fmt, "code_max", 0))))
        if widest > 2 ** (layout(dtype).man_bits + 1) or fmt.max > info.max:
            raise RepresentabilityError(
                f"overflow='wrap' can give any value of {fmt.display_name()}, and {dtype} cannot hold "
                f"them all exactly (codes up to {widest}); quantize a wider tensor, or use "
                "overflow='saturate'."
            )


# Under torch.compile this check runs at trace time, as a constant (None or an error), instead of
# being traced: see `anynum.formats.base` for why the attribute is set by hand.
# Dynamo looks through the lru_cache wrapper, so the mark goes on the function it wraps.
check_representable.__wrapped__._dynamo_marked_constant = True  # type: ignore[attr-defined]
