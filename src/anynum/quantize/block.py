"""`quantize_block`: what a Block format stores (element values and scales) besides the values.

The rounding itself is the Block kernel's (`anynum.kernels.block`), run through
`block_round`; this module checks the arguments, validates caller-given scales
and converts NumPy inputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import torch

from anynum.errors import InputError
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.kernels import round_to_format, working_dtype
from anynum.kernels.block import block_round
from anynum.quantize.checks import check_rand_bits, check_representable, check_tensor
from anynum.rounding import Rounding, RoundingLike, make_random_source, parse_rounding

__all__ = ["BlockQuantized", "quantize_block"]


class BlockQuantized(NamedTuple):
    """What `quantize_block` returns: ``values = elements * scales (* tensor_scale)``, blockwise.

    ``values`` has the input's type, shape and dtype; ``elements`` are the
    element values (float64, units of the scale), ``scales`` the block scales
    (float64, NaN for blocks holding NaN/inf), ``tensor_scale`` a 0-d float64 or None.
    """

    values: Any
    elements: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None



def quantize_block(
    x: Any,
    fmt: Block | str,
    rounding: RoundingLike = "nearest",
    *,
    scales: Any = None,
    tensor_scale: Any = None,
    overflow: str | None = None,
    generator: Any = None,
    seed: int | None = None,
    rand_bits: int | None = None,
) -> BlockQuantized:
    """Quantize `x` onto a Block format and return values, element values and scales.

    The same rounding as ``an.quantize(x, fmt, ...)`` (which returns only the
    values), plus what a block format stores. ``scales=`` (shape
    ``fmt.scale_shape(x.shape)``, positive values of ``fmt.scale``) replaces the
    scale rule; it is required for ``scale_rule="none"``. ``tensor_scale=``
    does the same for the per-tensor scale. Elements still saturate (or follow
    ``overflow=``) when a given scale is too small. NaN/inf in a block gives a
    NaN block (its scale is NaN) unless scales are given, where NaN/inf then
    follow the element format's rules.

    >>> import anynum as an, torch
    >>> fmt = an.Block(an.E2M1, 2, scale_rule="none")
    >>> q = an.quantize_block(torch.tensor([1.0, 3.0, 8.0, 9.0]), fmt, scales=torch.tensor([1.0, 2.0]))
    >>> q.values.tolist(), q.elements.tolist()
    ([1.0, 3.0, 8.0, 8.0], [1.0, 3.0, 4.0, 4.0])
    """
    block = lookup_format(fmt) if isinstance(fmt, str) else fmt
    if not isinstance(block, Block):
        raise InputError(f"quantize_block needs a Block format, got {block!r}.")
    fmt = block
    mode = parse_rounding(rounding)
    policy = fmt.check_overflow(overflow)
    check_rand_bits(rand_bits, mode)
    numpy_in = not isinstance(x, torch.Tensor)
    if numpy_in:
        if not isinstance(x, np.ndarray):
            raise InputError(
                f"quantize_block accepts torch tensors and NumPy arrays, got {type(x).__name__}."
            )
        t = torch.from_numpy(np.ascontiguousarray(x)) if x.dtype.kind == "f" else torch.as_tensor(x)
    else:
        t = x
    check_tensor(t, "quantize_block")
    # scale_rule="none" has no rule to run; its grid is that of the same block with the "amax" rule.
    check_representable(fmt if fmt.scale_rule != "none" else replace(fmt, scale_rule="amax"), t.dtype)
    rng = make_random_source(generator, seed, t.device) if mode.is_stochastic else None
    given = _given_scales(fmt, t, scales, tensor_scale)
    wdt = working_dtype(fmt, t.dtype)
    with torch.no_grad():
        res = block_round(fmt, t.detach().to(wdt), mode, policy, rng, rand_bits, *given)
    values = res.values.to(t.dtype)
    assert res.elements is not None
    return BlockQuantized(values.numpy() if numpy_in else values, res.elements, res.scales, res.tensor_scale)


def _given_scales(
    fmt: Block, x: torch.Tensor, scales: Any, tensor_scale: Any
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Validate caller-given scales: right shape, positive, on the scale format's grid."""
    if scales is None and fmt.scale_rule == "none":
        raise InputError(
            f"{fmt.display_name()} has scale_rule='none': pass scales= (shape "
            f"{fmt.scale_shape(x.shape)}) to quantize_block, or choose a scale rule."
        )
    if tensor_scale is None and fmt.scale_rule == "none" and fmt.tensor_scale is not None:
        raise InputError(
            f"{fmt.display_name()} has a per-tensor scale and scale_rule='none': pass tensor_scale=."
        )
    out: list[torch.Tensor | None] = []
    for given, sfmt, shape, what in (
        (scales, fmt.scale, fmt.scale_shape(x.shape), "scales"),
        (tensor_scale, fmt.tensor_scale, (), "tensor_scale"),
    ):
        if given is None:
            out.append(None)
            continue
        if sfmt is None:
            raise InputError(f"{fmt.display_name()} has no per-tensor scale; drop {what}=.")
        s = torch.as_tensor(given, dtype=torch.float64, device=x.device)
        if tuple(s.shape) != tuple(shape):
            raise InputError(
                f"{what} must have shape {tuple(shape)} for input shape {tuple(x.shape)}, "
                f"got {tuple(s.shape)}."
            )
        on_grid = round_to_format(sfmt, s, Rounding.NEAREST_EVEN, "saturate", None, None) == s
        if not bool(((s > 0) & torch.isfinite(s) & on_grid).all()):
            raise InputError(
                f"{what} must be positive finite values of {sfmt.display_name()}; round them first, "
                f"e.g. an.quantize(s, {sfmt.display_name()!r}, 'up')."
            )
        out.append(s)
    return out[0], out[1]
