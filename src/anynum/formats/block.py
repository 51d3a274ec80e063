"""Block formats: one shared scale per block of elements (block floating point, OCP MX, NVFP4).

A `Block` splits the input along ``axis`` into blocks of ``block_size``
consecutive elements, picks one positive scale per block (rule
``scale_rule``, value in the ``scale`` format), and rounds every ``x / scale``
onto the ``element`` format. The result is ``element_value * scale`` (times a
per-tensor scale for NVFP4). The kernel is `anynum.kernels.block`; the
semantics, with their proofs of exactness, are in docs/block.md.

Scale rules (``k0 = floor(log2(amax)) - element.emax``, amax = largest |x| in the block):

=========  ==================================================================================
"floor"    2**k0 (OCP MX v1.0): elements above element.max saturate
"ceil"     the smallest power of two S with amax / S <= element.max: nothing saturates
"even"     2**(round(log2 amax) - element.emax), log2 rounded to the nearest integer
           (log2 of a rational is never an odd multiple of 1/2, so there are no ties)
"amax"     amax / element.max rounded *up* into the scale format: nothing saturates;
           the scale need not be a power of two (P3109 / NVFP4 style)
"none"     the caller passes the scales to `anynum.quantize_block`
=========  ==================================================================================

Every rule is clamped to the scale format's positive range; an all-zero block
gets the smallest scale. A block holding NaN or ±inf gets a NaN scale and
every value of that block is NaN.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from anynum.errors import FormatError, InputError
from anynum.formats.base import Format
from anynum.formats.fixed import FixedPoint
from anynum.formats.floating import E2M1, E2M3, E3M2, E4M3FN, E5M2, E8M0, FP32, FloatFormat
from anynum.formats.registry import format as lookup_format
from anynum.formats.registry import register_family, register_name

__all__ = [
    "MXFP4_E2M1",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXINT8",
    "NVFP4",
    "SCALE_RULES",
    "UE4M3",
    "Block",
    "BlockCodes",
]

SCALE_RULES = ("floor", "ceil", "even", "amax", "none")

#: NVFP4's block scale: E4M3 with the sign bit always 0 (cuBLAS ``CUDA_R_8F_UE4M3``).
#: Its 7-bit codes equal the E4M3FN byte with the sign bit clear; it is stored in a byte.
UE4M3 = FloatFormat(4, 3, specials="fn", signed=False, name="ue4m3")


class BlockCodes(NamedTuple):
    """What `Block.encode` returns and `Block.decode` takes.

    ``elements``: int64 codes of the element format, shaped like the input.
    ``scales``: int64 codes of the scale format, one per block (shape: see `Block.scale_shape`).
    ``tensor_scale``: 0-d int64 code of the per-tensor scale, or None.
    """

    elements: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor | None


@dataclass(frozen=True)
class Block(Format):
    """A shared scale per block of `block_size` elements along `axis` (block floating point, MX).

    Args:
        element: the element format (FloatFormat, FixedPoint, IntFormat, any Format but Block).
        block_size: elements per block; None makes the block the whole axis.
        axis: the blocked axis; None flattens the tensor (row-major) first, so
            ``block_size=None, axis=None`` is one block for the whole tensor
            (QPyTorch ``block_quantize(x, wl, dim=-1)``). A block that does not
            divide the axis is padded with zeros, which never reach the result.
        scale: an *unsigned* FloatFormat holding the block scales (default E8M0).
        scale_rule: "floor" (OCP MX), "ceil", "even", "amax" or "none" (see the module docstring).
        tensor_scale: a FloatFormat for a second, per-tensor scale (NVFP4: FP32), or None.
        symmetric: clamp element values to [-element.max, element.max], so that a
            two's-complement element never uses its lone most negative code (MXINT8's -2.0).

    Values: ``element value * block scale * tensor scale``. The finfo-style
    properties (`max`, `smallest_subnormal`, `eps`, ...) describe the element
    grid *in units of the scale*, that is, the element's own; the absolute
    range is `abs_max` / `abs_min`. The default overflow policy is "saturate"
    whatever the element (OCP MX elements saturate). NaN or ±inf in a block
    makes the whole block NaN; an all-zero block gets the smallest scale.

    >>> import anynum as an, torch
    >>> x = torch.tensor([1.0, 0.3, -5.0, 100.0])
    >>> an.quantize(x, an.Block(an.E2M1, 2)).tolist()   # scales 2**-2 and 2**4
    [1.0, 0.25, -8.0, 96.0]
    >>> an.MXFP8_E4M3.storage_bits_per_element
    8.25
    """

    element: Format
    block_size: int | None = None
    axis: int | None = -1
    scale: Format = E8M0
    scale_rule: str = "floor"
    tensor_scale: Format | None = None
    symmetric: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.element, Format) or isinstance(self.element, Block):
            raise FormatError(
                f"Block element must be a non-block Format (e.g. an.E4M3FN, an.FixedPoint(2, 6)), "
                f"got {self.element!r}."
            )
        bs = self.block_size
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise FormatError(
                f"block_size must be a positive integer, or None for the whole axis; got {bs!r}."
            )
        if self.axis is not None and (isinstance(self.axis, bool) or not isinstance(self.axis, int)):
            raise FormatError(f"axis must be an integer or None (whole tensor), got {self.axis!r}.")
        if not isinstance(self.symmetric, bool):
            raise FormatError(f"symmetric must be True or False, got {self.symmetric!r}.")
        if self.scale_rule not in SCALE_RULES:
            raise FormatError(f"scale_rule must be one of {SCALE_RULES}, got {self.scale_rule!r}.")
        if not isinstance(self.scale, FloatFormat):
            raise FormatError(
                f"scale must be an unsigned FloatFormat (e.g. an.E8M0), got {self.scale!r}."
            )
        if self.scale.signed:
            raise FormatError(
                f"scale must be an unsigned format, got the signed {self.scale.display_name()}: block "
                "scales are positive. For a signed storage format whose sign bit is always 0 use its "
                "unsigned twin, e.g. anynum.formats.block.UE4M3 for NVFP4's E4M3 scale."
            )
        if self.tensor_scale is not None and not isinstance(self.tensor_scale, FloatFormat):
            raise FormatError(
                f"tensor_scale must be a FloatFormat (e.g. an.FP32) or None, got {self.tensor_scale!r}."
            )
        if self.tensor_scale is not None and self.scale_rule in ("floor", "ceil", "even"):
            raise FormatError(
                "a per-tensor scale needs scale_rule='amax' or 'none' (the power-of-two rules "
                f"ignore it); got scale_rule={self.scale_rule!r}."
            )
        for part in (self.element, self.scale, self.tensor_scale):
            # Compute cached properties now: their first access takes a lock that torch.compile
            # cannot trace, and the kernel reads them inside the compiled region.
            if part is not None:
                _warm_cached_properties(part)
        if not self.power_of_two_scales:
            # x / S and element * S are exact in float64 only if the scale's significand,
            # the tensor scale's and the element's (plus one bit for midpoints) fit 53 bits.
            width = self.element.precision + 1 + self.scale.precision
            width += self.tensor_scale.precision if self.tensor_scale is not None else 0
            if width > 53:
                raise FormatError(
                    f"element precision {self.element.precision} + 1 + scale precision "
                    f"{self.scale.precision}{' + tensor scale precision' if self.tensor_scale else ''} "
                    f"= {width} bits exceeds float64's 53, so non-power-of-two scales cannot be exact; "
                    "use a narrower scale format or a power-of-two scale_rule."
                )

    # --- scales ---------------------------------------------------------------------------
    @property
    def power_of_two_scales(self) -> bool:
        """True when every block scale is a power of two (then ``x / scale`` is exact)."""
        scale = self.scale
        assert isinstance(scale, FloatFormat)
        pow2_rule = self.scale_rule in ("floor", "ceil", "even")
        return self.tensor_scale is None and (pow2_rule or scale.man_bits == 0)

    @property
    def scale_exponent_range(self) -> tuple[int, int]:
        """(smallest, largest) k with 2**k in the scale format: the clamp of the power-of-two rules."""
        scale = self.scale
        return math.floor(math.log2(scale.smallest_subnormal)), scale.emax

    # --- finfo-style properties: the element grid, in units of the scale ---------------------
    @property
    def bits(self) -> int:
        return self.element.bits

    @property
    def max(self) -> float:
        """The element's largest value (units of the scale); see `abs_max` for the absolute one."""
        return self.element.max

    @property
    def smallest_normal(self) -> float:
        return self.element.smallest_normal

    @property
    def smallest_subnormal(self) -> float:
        return self.element.smallest_subnormal

    @property
    def eps(self) -> float:
        return self.element.eps

    @property
    def emin(self) -> int:
        return self.element.emin

    @property
    def emax(self) -> int:
        return self.element.emax

    @property
    def precision(self) -> int:
        return self.element.precision

    @property
    def has_inf(self) -> bool:
        return self.element.has_inf

    @property
    def has_nan(self) -> bool:
        return True  # the scale formats all have NaN; a NaN scale makes its block NaN

    @property
    def has_negative_zero(self) -> bool:
        return self.element.has_negative_zero

    @property
    def signed(self) -> bool:
        return self.element.signed

    @property
    def default_overflow(self) -> str:
        """"saturate" (OCP MX) whenever the element supports it."""
        return "saturate" if "saturate" in self.element.overflow_policies else self.element.default_overflow

    def check_overflow(self, overflow: str | None) -> str:
        if overflow is None:
            return self.default_overflow
        return self.element.check_overflow(overflow)

    @property
    def abs_max(self) -> float:
        """Largest finite magnitude any block can hold: element.max * scale.max (* tensor_scale.max)."""
        value = self.element.max * self.scale.max
        return value * (self.tensor_scale.max if self.tensor_scale is not None else 1.0)

    @property
    def abs_min(self) -> float:
        """Smallest positive magnitude any block can hold (element and scale at their smallest)."""
        value = self.element.smallest_subnormal * self.scale.smallest_subnormal
        return value * (self.tensor_scale.smallest_subnormal if self.tensor_scale is not None else 1.0)

    # --- storage -----------------------------------------------------------------------------
    @staticmethod
    def _container_bits(fmt: Format) -> int:
        return 8 * math.ceil(fmt.bits / 8)

    @property
    def storage_bits_per_element(self) -> float:
        """Element bits plus the block scale's byte(s) amortised over the block.

        Scales are stored in whole bytes (E8M0: 8 bits; UE4M3: 8 bits, sign bit
        0). The per-tensor scale (NVFP4) is not included: it depends on the
        tensor size, see `storage_bits`. With ``block_size=None`` the block
        length is unknown and only the element bits are reported.
        """
        if self.block_size is None:
            return float(self.element.bits)
        return self.element.bits + self._container_bits(self.scale) / self.block_size

    def storage_bits(self, shape: tuple[int, ...] | torch.Size) -> int:
        """Exact bits to store a tensor of `shape`: elements, block scales and the per-tensor scale.

        >>> import anynum as an
        >>> an.NVFP4.storage_bits((4, 20))   # 80 * 4 + 8 blocks * 8 + 32
        416
        """
        shape = tuple(shape)
        numel = math.prod(shape)
        blocks = math.prod(self.scale_shape(shape))
        extra = self.tensor_scale.bits if self.tensor_scale is not None else 0
        return numel * self.element.bits + blocks * self._container_bits(self.scale) + extra

    def scale_shape(self, shape: tuple[int, ...] | torch.Size) -> tuple[int, ...]:
        """Shape of the scales for an input of `shape`.

        The blocked axis becomes the number of blocks (``ceil(n / block_size)``,
        1 for ``block_size=None``); with ``axis=None`` it is ``(blocks,)`` over
        the flattened tensor. A 0-d input counts as shape ``(1,)``.
        """
        shape = tuple(shape) or (1,)
        if self.axis is None:
            n = math.prod(shape)
            return (self.block_count(n),)
        axis = self.resolve_axis(len(shape))
        out = list(shape)
        out[axis] = self.block_count(shape[axis])
        return tuple(out)

    def block_count(self, n: int) -> int:
        """Blocks along an axis of `n` elements: ceil(n / block_size); 1 (0 if n = 0) for block_size None."""
        if self.block_size is None:
            return 1 if n else 0
        return -(-n // self.block_size)

    def resolve_axis(self, ndim: int) -> int:
        """The blocked axis as a non-negative index for an `ndim`-d input (0-d counts as 1-d)."""
        ndim = max(ndim, 1)
        assert self.axis is not None
        if not -ndim <= self.axis < ndim:
            raise InputError(
                f"{self.display_name()} blocks axis {self.axis}, which is out of range for a "
                f"{ndim}-d tensor; pass Block(..., axis=a) with -{ndim} <= a < {ndim}, or axis=None."
            )
        return self.axis % ndim

    # --- codes ---------------------------------------------------------------------------------
    def values(self) -> np.ndarray:
        raise FormatError(
            f"{self.display_name()} has no fixed value set: each block's values are "
            f"element values times its scale; use .element.values()."
        )

    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        raise FormatError(
            f"{self.display_name()} codes are element codes plus scale codes (BlockCodes): "
            "use fmt.encode(x) / fmt.decode(block_codes), or an.encode / an.decode."
        )

    def encode_torch(self, y: torch.Tensor) -> torch.Tensor:
        self.decode_torch(y)  # raises with the same explanation
        raise AssertionError  # pragma: no cover

    def __repr__(self) -> str:
        if self.name:
            return self.name.upper() if self.name.isidentifier() else self.name
        parts = [repr(self.element), f"block_size={self.block_size!r}"]
        if self.axis != -1:
            parts.append(f"axis={self.axis!r}")
        if self.scale != E8M0:
            parts.append(f"scale={self.scale!r}")
        if self.scale_rule != "floor":
            parts.append(f"scale_rule={self.scale_rule!r}")
        if self.tensor_scale is not None:
            parts.append(f"tensor_scale={self.tensor_scale!r}")
        if self.symmetric:
            parts.append("symmetric=True")
        return f"Block({', '.join(parts)})"


def _warm_cached_properties(fmt: Format) -> None:
    for klass in type(fmt).__mro__:
        for name, attr in vars(klass).items():
            if isinstance(attr, functools.cached_property):
                getattr(fmt, name)


# --- presets (OCP Microscaling Formats v1.0, NVIDIA NVFP4) --------------------------------------

#: OCP MX INT8 element: 8-bit two's complement with an implicit scale 2**-6, i.e. FixedPoint(2, 6),
#: range [-2, 2 - 2**-6]. MXINT8 uses it symmetrically (codes -127..127, as OCP recommends):
#: with -2.0 allowed, a block's result could reach 2**(floor(log2 amax) + 1), beyond its
#: binade (float16 inputs near 65504 would give -65536). gfloat keeps -2.0; see docs/block.md.
MXINT8_ELEMENT = FixedPoint(2, 6, name="mxint8_element")


def _mx(name: str, element: Format, **kwargs: Any) -> Block:
    return Block(element, 32, name=name, **kwargs)


MXFP8_E4M3 = _mx("mxfp8_e4m3", E4M3FN)
MXFP8_E5M2 = _mx("mxfp8_e5m2", E5M2)
MXFP6_E3M2 = _mx("mxfp6_e3m2", E3M2)
MXFP6_E2M3 = _mx("mxfp6_e2m3", E2M3)
MXFP4_E2M1 = _mx("mxfp4_e2m1", E2M1)
MXINT8 = _mx("mxint8", MXINT8_ELEMENT, symmetric=True)
#: NVFP4: E2M1 elements, a UE4M3 scale per 16 elements (amax rule, rounded up), an FP32 per-tensor scale.
NVFP4 = Block(E2M1, 16, scale=UE4M3, scale_rule="amax", tensor_scale=FP32, name="nvfp4")

register_name(MXFP8_E4M3, "mxfp8_e4m3", "mxfp8", "mxfp8_e4m3fn")
register_name(MXFP8_E5M2, "mxfp8_e5m2")
register_name(MXFP6_E3M2, "mxfp6_e3m2")
register_name(MXFP6_E2M3, "mxfp6_e2m3")
register_name(MXFP4_E2M1, "mxfp4_e2m1", "mxfp4")
register_name(MXINT8, "mxint8")
register_name(NVFP4, "nvfp4")


def _block_family(m: re.Match[str]) -> Format:
    element = lookup_format(m.group(1))
    size = None if m.group(2) == "none" else int(m.group(2))
    scale = lookup_format(m.group(3)) if m.group(3) else E8M0
    rule = m.group(4) or "floor"
    if isinstance(element, Block):
        raise FormatError(f"block elements cannot be blocks themselves, got {m.group(1)!r}.")
    return Block(element, size, scale=scale, scale_rule=rule)


register_family(
    r"block\(([^,()]+(?:\([^()]*\))?),(\d+|none)(?:,([a-z0-9_]+))?(?:,(floor|ceil|even|amax|none))?\)",
    _block_family,
    "'block(ELEMENT,SIZE[,SCALE][,RULE])'",
)
