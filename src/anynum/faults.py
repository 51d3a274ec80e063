"""Bit flips on the real encoding of any format: ``an.flip_bits(x, fmt, p=... | count=...)``.

`flip_bits` rounds `x` onto `fmt` (nearest), encodes it to the format's codes
(`anynum.encode`; for Block formats the element codes and the block scales),
flips chosen bits, decodes, and returns the values and the flip mask (the codes
XOR mask). Which bits may flip is a *field*:

=================  =================================================================================
family             fields
=================  =================================================================================
FloatFormat        "sign", "exponent", "significand" (alias "mantissa"), "any"
Posit              "sign", "regime", "exponent", "fraction", "any": per code, as the 2022 Posit
                   Standard reads the bits (no negation first): after the sign, the regime is the
                   run of bits equal to the first one plus its terminating bit (or the end of the
                   word), then up to es exponent bits, then the fraction. 0 and NaR have a regime
                   of n - 1 bits and no exponent or fraction.
FixedPoint, Int    "sign" (signed only), "integer" (the int_bits, sign included), "fraction", "any"
Table              "any" (the bits of the value's index)
Block              "element" (any element bit), "scale" (the block scales' bits), "any" (both), or
                   an element field ("sign", "exponent", ...): the element codes' field
=================  =================================================================================

``bits=[i, ...]`` restricts flips to those bit positions instead (bit 0 is the least
significant; with a Block format they are element bits, or scale bits with
``field="scale"``). Exactly one of:

* ``p``: every eligible bit flips independently with probability p (the bit error
  rate; honoured to 2**-53);
* ``count``: exactly ``count`` distinct eligible bits of every element flip, chosen
  uniformly (an element with fewer eligible bits gets all of them flipped; the mask says).

Random bits are counter-based (`anynum.rounding`): a result depends only on `seed`
(or one draw from `generator`) and the input, never on threads or chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import anynum as an
from anynum._bits import floor_log2
from anynum.errors import InputError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block, BlockCodes
from anynum.formats.fixed import FixedPoint, UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.ops.arrays import from_torch, kind_of, to_torch
from anynum.ops.core import seed_from_jax_key
from anynum.rounding import RandomSource, make_random_source

__all__ = ["field_masks", "flip_bits"]

_CHUNK = 1 << 20  # element-bit pairs drawn at a time (bounds the temporary memory)
_FIELDS = {
    "float": ("sign", "exponent", "significand", "mantissa", "any"),
    "posit": ("sign", "regime", "exponent", "fraction", "any"),
    "uniform": ("sign", "integer", "fraction", "any"),
    "table": ("any",),
}


def _family(fmt: Format) -> str:
    if isinstance(fmt, FloatFormat):
        return "float"
    if isinstance(fmt, Posit):
        return "posit"
    if isinstance(fmt, UniformFormat):
        return "uniform"
    return "table"


def _bit_length(y: torch.Tensor) -> torch.Tensor:
    """Bit length of non-negative int64 values below 2**53 (0 for 0)."""
    pos = torch.where(y > 0, y, torch.ones_like(y)).to(torch.float64)
    return torch.where(y > 0, floor_log2(pos).to(torch.int64) + 1, torch.zeros_like(y))


def _posit_fields(codes: torch.Tensor, n: int, es: int) -> dict[str, torch.Tensor]:
    """Per-code masks of a posit's sign, regime, exponent and fraction (2022 standard reading)."""
    body = codes & ((1 << (n - 1)) - 1)  # the n - 1 bits after the sign
    first = (body >> (n - 2)) & 1 if n >= 2 else torch.zeros_like(body)
    same = torch.where(first == 1, ~body & ((1 << (n - 1)) - 1), body)  # leading run -> leading zeros
    run = (n - 1) - _bit_length(same)
    length = torch.clamp(run + 1, max=n - 1)  # the run and its terminating bit
    rest = (n - 1) - length
    n_exp = torch.clamp(rest, max=es)
    n_frac = torch.clamp(rest - es, min=0)
    one = torch.ones_like(codes)
    regime = ((one << length) - 1) << rest
    exponent = ((one << n_exp) - 1) << (rest - n_exp)
    fraction = (one << n_frac) - 1
    sign = torch.full_like(codes, 1 << (n - 1))
    return {"sign": sign, "regime": regime, "exponent": exponent, "fraction": fraction}


def _static_field(fmt: Format, field: str) -> int:
    """The mask of a field whose position does not depend on the value (floats, fixed point, tables)."""
    width = fmt.bits
    if field == "any":
        return (1 << width) - 1
    if isinstance(fmt, FloatFormat):
        man, exp = fmt.man_bits, fmt.exp_bits
        masks = {
            "sign": (1 << (width - 1)) if fmt.signed else 0,
            "exponent": ((1 << exp) - 1) << man,
            "significand": (1 << man) - 1,
        }
        mask = masks["significand" if field == "mantissa" else field]
    elif isinstance(fmt, UniformFormat):
        frac = fmt.frac_bits if isinstance(fmt, FixedPoint) else 0
        masks = {
            "sign": (1 << (width - 1)) if fmt.signed else 0,
            "integer": ((1 << width) - 1) & ~((1 << frac) - 1),
            "fraction": (1 << frac) - 1,
        }
        mask = masks[field]
    else:  # pragma: no cover - checked by the caller
        raise AssertionError(field)
    if mask == 0:
        raise InputError(
            f"{fmt.display_name()} has no {field!r} bits; choose another field (one of "
            f"{', '.join(f for f in _FIELDS[_family(fmt)] if f != field)})."
        )
    return mask


def field_masks(codes: torch.Tensor, fmt: Format, field: str) -> torch.Tensor:
    """Per-code int64 masks of the bits of `field` in integer `codes` of `fmt` (not Block).

    >>> import anynum as an, torch
    >>> field_masks(torch.tensor([0b01110110]), an.Posit(8, 1), "regime").tolist()  # run 111, then 0
    [120]
    >>> field_masks(torch.tensor([0]), an.E4M3FN, "exponent").tolist()
    [120]
    """
    family = _family(fmt)
    if field not in _FIELDS[family]:
        raise InputError(
            f"field={field!r} is not a field of {fmt.display_name()}; expected one of "
            f"{', '.join(_FIELDS[family])} (or bits=[...] for explicit positions)."
        )
    if isinstance(fmt, Posit) and field != "any":
        return _posit_fields(codes, fmt.n, fmt.es)[field]
    return torch.full_like(codes, _static_field(fmt, field))


def _positions_mask(bits: Any, width: int, what: str) -> int:
    items = [bits] if isinstance(bits, (int, np.integer)) else list(bits)
    mask = 0
    for b in items:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= int(b) < width:
            raise InputError(f"bits= takes positions 0..{width - 1} of the {what} ({width} bits), got {b!r}.")
        mask |= 1 << int(b)
    if mask == 0:
        raise InputError("bits= is empty: give at least one bit position.")
    return mask


def _draw(eligible: torch.Tensor, width: int, p: float | None, count: int | None, rng: RandomSource,
          stream: int) -> torch.Tensor:
    """The flip masks (int64, shaped like `eligible`) for per-element eligible-bit masks."""
    flat = eligible.reshape(-1)
    out = torch.zeros_like(flat)
    positions = torch.arange(width, device=flat.device, dtype=torch.int64)
    step = max(1, _CHUNK // width)
    threshold = None if p is None else round(p * 2.0**53)  # P(k < threshold) = threshold / 2**53
    for start in range(0, flat.numel(), step):
        el = flat[start : start + step]
        index = (torch.arange(start, start + el.numel(), device=flat.device)[:, None] * width) + positions
        ok = ((el[:, None] >> positions) & 1).bool()
        k = rng.bits_at(index, 53, stream)
        if threshold is not None:
            chosen = ok & (k < threshold)
        else:
            assert count is not None
            # The `count` eligible positions with the smallest random keys: uniform without replacement.
            keys = torch.where(ok, k, torch.full_like(k, 1 << 53))
            take = min(count, width)
            order = torch.argsort(keys, dim=1)[:, :take]
            chosen = torch.zeros_like(ok)
            chosen.scatter_(1, order, True)
            chosen &= ok
        out[start : start + step] = (chosen.to(torch.int64) << positions).sum(dim=1)
    return out.view(eligible.shape)


def _check_args(p: Any, count: Any) -> None:
    if (p is None) == (count is None):
        raise InputError(
            "flip_bits needs exactly one of p= (per-bit flip probability) or count= (bits per element)."
        )
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= float(p) <= 1):
        raise InputError(f"p must be a probability in [0, 1], got {p!r}.")
    bad_count = isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0
    if count is not None and bad_count:
        raise InputError(f"count must be a non-negative int (bits flipped per element), got {count!r}.")


def _values_in(v: torch.Tensor, dtype: torch.dtype, fmt: Format) -> torch.Tensor:
    """Decoded float64 values cast to `dtype`, refusing any finite value the dtype cannot hold."""
    out = v.to(dtype)
    finite = torch.isfinite(v)
    bad = finite & (out.to(torch.float64) != v)
    if bool(bad.any()):
        raise RepresentabilityError(
            f"a flipped {fmt.display_name()} code decodes to {float(v[bad][0])!r}, which {dtype} cannot "
            "hold; pass a float32 or float64 array."
        )
    return out


def flip_bits(
    x: Any,
    fmt: Format | str,
    *,
    p: float | None = None,
    count: int | None = None,
    field: str = "any",
    bits: Sequence[int] | int | None = None,
    seed: int | None = None,
    generator: Any = None,
) -> tuple[Any, Any]:
    """Flip bits of the codes of `x` rounded onto `fmt`; returns ``(values, mask)``.

    `x`: torch tensor, NumPy array (or number) or JAX array of floats; `values` has
    its kind and dtype, and `mask` (the codes XOR mask, int64, same kind) says which
    bits flipped. For a Block format `mask` is a `BlockCodes` of masks (elements,
    scales, tensor scale). See the module docstring for `p`, `count`, `field` and
    `bits`. Specials: `x` is first rounded to nearest (NaN becomes the NaN code; a
    format without one rejects NaN); flipped codes decode as the format says (NaN
    and inf codes included, a fixed-point sign flip wraps around). A decoded value
    that the input dtype cannot hold raises `RepresentabilityError`.

    >>> import anynum as an, torch
    >>> v, m = an.flip_bits(torch.tensor([1.0, -2.0]), an.E4M3FN, count=1, field="sign", seed=0)
    >>> v.tolist(), m.tolist()
    ([-1.0, 2.0], [128, 128])
    >>> v, m = an.flip_bits(torch.tensor([1.0]), "posit(8,0)", bits=[6], count=1)
    >>> v.tolist(), m.tolist()   # 0b01000000 -> 0b00000000
    ([0.0], [64])
    """
    _check_args(p, count)
    f = an.format(fmt) if isinstance(fmt, str) else fmt
    if not isinstance(f, Format):
        raise InputError(f"flip_bits needs a format (an.Format or a name), got {fmt!r}.")
    kind = kind_of([x])
    if kind == "dask":
        raise InputError("flip_bits takes torch, NumPy and JAX arrays; compute a Dask array first.")
    t = to_torch(x, None)
    if not t.is_floating_point():
        raise InputError(f"flip_bits needs a floating-point array, got dtype {t.dtype}.")
    if generator is not None and type(generator).__module__.split(".")[0] in ("jax", "jaxlib"):
        if seed is not None:
            raise InputError("pass either generator= (a JAX key) or seed=, not both.")
        seed, generator = seed_from_jax_key(generator), None
    gen_device = generator.device if isinstance(generator, torch.Generator) else t.device
    rng = make_random_source(generator, seed, gen_device)
    scalar = not hasattr(x, "shape")
    if isinstance(f, Block):
        values, mask = _flip_block(t, f, p, count, field, bits, rng)
        parts = [None if m is None else from_torch(m, kind, False) for m in mask]
        out_mask: Any = BlockCodes(parts[0], parts[1], parts[2])  # type: ignore[arg-type]
    else:
        codes = an.encode(t.detach(), f)
        if bits is not None:
            if field != "any":
                raise InputError("pass field= or bits=, not both (bits= names the positions itself).")
            eligible = torch.full_like(codes, _positions_mask(bits, f.bits, "code"))
        else:
            eligible = field_masks(codes, f, field)
        flips = _draw(eligible, f.bits, p, count, rng, 0)
        values = an.decode(codes ^ flips, f)
        out_mask = from_torch(flips, kind, scalar)
    return from_torch(_values_in(values, t.dtype, f), kind, scalar), out_mask


def _flip_block(t: torch.Tensor, fmt: Block, p: float | None, count: int | None, field: str,
                bits: Any, rng: RandomSource) -> tuple[torch.Tensor, BlockCodes]:
    codes = fmt.encode(t.detach())
    elem, scale = fmt.element, fmt.scale
    if field in ("element", "scale", "any"):
        e_field = "any" if field in ("element", "any") else None
        s_field = "any" if field in ("scale", "any") else None
    else:  # a field of the element format
        e_field, s_field = field, None
    if bits is not None:
        if field not in ("element", "scale", "any"):
            raise InputError("with a Block format, bits= goes with field='element' (default) or 'scale'.")
        on_scale = field == "scale"
        width = scale.bits if on_scale else elem.bits
        pos = _positions_mask(bits, width, "scale code" if on_scale else "element code")
        e_el = None if on_scale else torch.full_like(codes.elements, pos)
        s_el = torch.full_like(codes.scales, pos) if on_scale else None
    else:
        e_el = None if e_field is None else field_masks(codes.elements, elem, e_field)
        s_el = None if s_field is None else field_masks(codes.scales, scale, s_field)
    zero_e, zero_s = torch.zeros_like(codes.elements), torch.zeros_like(codes.scales)
    fe = zero_e if e_el is None else _draw(e_el, elem.bits, p, count, rng, 0)
    fs = zero_s if s_el is None else _draw(s_el, scale.bits, p, count, rng, 2)
    flipped = BlockCodes(codes.elements ^ fe, codes.scales ^ fs, codes.tensor_scale)
    ts_mask = None if codes.tensor_scale is None else torch.zeros_like(codes.tensor_scale)
    return fmt.decode(flipped), BlockCodes(fe, fs, ts_mask)
