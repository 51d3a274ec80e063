"""Whether a tensor dtype can hold what rounding onto a format gives: the representability rules.

Rounding x onto a grid gives one of x's two grid neighbours, in x's own dtype; a
neighbour that dtype cannot hold would be rounded a second time. `check_representable`
and `check_overflow_fits` refuse such (format, dtype) pairs. `anynum.quantize` checks
them before every eager call, and the ``anynum::`` custom ops in their fake kernels,
which torch.compile runs while tracing (`anynum.kernels.customop`).

>>> import torch, anynum as an
>>> check_representable(an.E4M3FN, torch.float16) is None
True
"""

from __future__ import annotations

import functools

import torch

from anynum._bits import layout
from anynum.errors import RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.rounding import Rounding

__all__ = ["check_overflow_fits", "check_representable"]


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
