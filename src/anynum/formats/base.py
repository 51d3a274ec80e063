"""The abstract `Format` and its numpy.finfo-like summary `FormatInfo`.

A Format is immutable data (frozen dataclass: hashable, comparable by value,
readable repr) plus derived properties. It says *which values exist* and how
they are laid out as bit codes; how to round onto them lives in
`anynum.rounding` and `anynum.kernels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from anynum.errors import FormatError

if TYPE_CHECKING:
    from anynum.rounding import RoundingLike

__all__ = [
    "MAX_ENUMERABLE_BITS",
    "Format",
    "FormatInfo",
    "OverflowPolicy",
    "constructor_spec",
    "family_classes",
    "hook",
    "install_hooks",
    "record_preset_name",
]

#: ``values()`` enumerates every code; beyond this width that is too many.
MAX_ENUMERABLE_BITS = 16

OverflowPolicy = str  # "saturate" | "inf" | "nan" | "wrap" (fixed point only)

# Formats are data; what happens to arrays lives in the layers above. `Format.quantize`,
# `.encode` and `.decode` call the front door through these hooks, which `anynum.quantize`
# installs when anynum is imported (DESIGN.md section 7, resolution 2).
_hooks: dict[str, Callable[..., Any]] = {}
_FAMILIES: dict[str, type[Format]] = {}  # every concrete format class, by class name
_PRESET_NAMES: dict[Format, str] = {}  # a preset's canonical registered name (see formats.registry)


def family_classes() -> dict[str, type[Format]]:
    """Every format class by name (the constructors `anynum.format` accepts in a canonical name)."""
    return dict(_FAMILIES)


def record_preset_name(fmt: Format, name: str) -> None:
    """Make `name` the canonical name of `fmt` (the first registration wins)."""
    _PRESET_NAMES.setdefault(fmt, name)


def _literal(value: Any) -> str:
    if isinstance(value, Format):  # a nested format: a preset by its bare name, else its constructor
        preset = _PRESET_NAMES.get(value)
        return preset if preset is not None and preset.isidentifier() else constructor_spec(value)
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, float):
        return repr(value)  # repr round-trips every float64
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    raise FormatError(f"cannot name a format parameter of type {type(value).__name__}: {value!r}")


def _canonical_name(fmt: Format) -> str:
    preset = _PRESET_NAMES.get(fmt)
    return preset if preset is not None else constructor_spec(fmt)


# What `torch.compiler.assume_constant_result` sets (that function imports torch._dynamo, which
# costs seconds at import): torch.compile computes a format's name while tracing, as a constant.
_canonical_name._dynamo_marked_constant = True  # type: ignore[attr-defined]


def constructor_spec(fmt: Format) -> str:
    """``ClassName(param=value, ...)``: the parameters of `fmt` that differ from their defaults.

    A parameter is written when leaving it out would construct something else, so
    ``anynum.format(constructor_spec(fmt)) == fmt`` for every format.
    """
    import dataclasses

    cls = type(fmt)
    fields = [f for f in dataclasses.fields(fmt) if f.name != "name" and f.init]
    required = {
        cls.spec_parameters.get(f.name, f.name): getattr(fmt, f.name)
        for f in fields
        if (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        or f.name in cls.spec_parameters
    }
    params = dict(required)
    plain = cls(**required)  # what the required parameters alone build
    optional = [(cls.spec_parameters.get(f.name, f.name), getattr(fmt, f.name), getattr(plain, f.name))
                for f in fields if cls.spec_parameters.get(f.name, f.name) not in required]
    params.update({param: value for param, value, default in optional if value != default})
    if cls(**params) != fmt:  # a default that depends on another parameter (a fnuz bias): say all
        params.update({param: value for param, value, _ in optional})
    return f"{cls.__name__}({', '.join(f'{k}={_literal(v)}' for k, v in params.items())})"


def install_hooks(**hooks: Callable[..., Any]) -> None:
    """Install the front door's functions (``quantize``, ``encode``, ``decode``) behind the format methods."""
    _hooks.update(hooks)


def hook(name: str) -> Callable[..., Any]:
    """The installed front-door function `name` ("quantize", "encode" or "decode")."""
    try:
        return _hooks[name]
    except KeyError:  # pragma: no cover - `import anynum` installs them
        raise FormatError(f"Format.{name} needs the anynum package imported (import anynum).") from None


@dataclass(frozen=True)
class FormatInfo:
    """A numpy.finfo-style summary of a format's range and precision.

    >>> import anynum as an
    >>> an.E4M3FN.info.max
    448.0
    """

    bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    emin: int
    emax: int
    precision: int
    has_inf: bool
    has_nan: bool
    has_negative_zero: bool
    signed: bool
    default_overflow: str


@dataclass(frozen=True)
class Format:
    """Abstract base of every number format.

    Subclasses are frozen dataclasses: two formats with the same parameters are
    equal and hash alike whatever their display name. Concrete families:
    `FloatFormat`, `FixedPoint`, `IntFormat` (and, in later modules, posits,
    tables and block formats).
    """

    name: str | None = field(default=None, compare=False, kw_only=True)

    #: Overflow policies this family understands (checked by `check_overflow`).
    overflow_policies: ClassVar[tuple[str, ...]] = ("saturate", "inf", "nan")
    #: Constructor parameters whose dataclass field has another name (``{field: parameter}``).
    spec_parameters: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _FAMILIES[cls.__name__] = cls

    @property
    def canonical_name(self) -> str:
        """The one string that names this format, and that `anynum.format` turns back into it.

        A preset's registered name (``"e4m3fn"``), else the constructor call with the
        parameters that differ from a default construction (``"Posit(n=12, es=1)"``),
        nested for Block formats. State dicts, results files and custom ops record
        formats by it; reading it back executes nothing (a literal-only parser).

        >>> import anynum as an
        >>> an.E4M3FN.canonical_name, an.Posit(12, 1).canonical_name
        ('e4m3fn', 'Posit(n=12, es=1)')
        >>> fmt = an.FloatFormat(5, 2, subnormals=False)
        >>> an.format(fmt.canonical_name) == fmt
        True
        """
        return _canonical_name(self)

    # --- properties every family provides -------------------------------------------------
    @property
    def bits(self) -> int:
        """Width of one code in bits."""
        raise NotImplementedError

    @property
    def max(self) -> float:
        """Largest finite value."""
        raise NotImplementedError

    @property
    def smallest_normal(self) -> float:
        """Smallest positive normal value (the smallest positive value where there are no subnormals)."""
        raise NotImplementedError

    @property
    def smallest_subnormal(self) -> float:
        """Smallest positive value."""
        raise NotImplementedError

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value."""
        raise NotImplementedError

    @property
    def emin(self) -> int:
        """Exponent of `smallest_normal` (floor(log2))."""
        return math.floor(math.log2(self.smallest_normal))

    @property
    def emax(self) -> int:
        """Exponent of `max` (floor(log2))."""
        return math.floor(math.log2(self.max))

    @property
    def precision(self) -> int:
        """Significand bits, hidden bit included."""
        raise NotImplementedError

    @property
    def has_inf(self) -> bool:
        return False

    @property
    def has_nan(self) -> bool:
        return False

    @property
    def has_negative_zero(self) -> bool:
        return False

    @property
    def signed(self) -> bool:  # overridden by families that store a `signed` field
        return True

    @property
    def default_overflow(self) -> str:
        """The overflow policy used when ``quantize(..., overflow=None)``."""
        return "inf" if self.has_inf else "saturate"

    @property
    def info(self) -> FormatInfo:
        """All finfo-style properties at once."""
        return FormatInfo(
            bits=self.bits,
            max=self.max,
            smallest_normal=self.smallest_normal,
            smallest_subnormal=self.smallest_subnormal,
            eps=self.eps,
            emin=self.emin,
            emax=self.emax,
            precision=self.precision,
            has_inf=self.has_inf,
            has_nan=self.has_nan,
            has_negative_zero=self.has_negative_zero,
            signed=self.signed,
            default_overflow=self.default_overflow,
        )

    # --- what happens to arrays: one-line aliases of the front door (installed hooks) ----------
    def quantize(self, x: Any, rounding: RoundingLike = "nearest", **kwargs: Any) -> Any:
        """``anynum.quantize(x, self, rounding, **kwargs)``: `x` rounded onto this format.

        >>> import anynum as an, torch
        >>> an.E4M3FN.quantize(torch.tensor([0.3, 1000.0])).tolist()
        [0.3125, 448.0]
        """
        return hook("quantize")(x, self, rounding, **kwargs)

    def encode(self, x: Any, rounding: RoundingLike = "nearest", **kwargs: Any) -> Any:
        """``anynum.encode(x, self, rounding, **kwargs)``: `x` rounded, as integer codes (int64).

        >>> import anynum as an, torch
        >>> an.E4M3FN.encode(torch.tensor([1.0, -2.0])).tolist()
        [56, 192]
        """
        return hook("encode")(x, self, rounding, **kwargs)

    def decode(self, codes: Any) -> Any:
        """``anynum.decode(codes, self)``: float64 values of integer codes; NaN codes decode to NaN.

        >>> import anynum as an, torch
        >>> an.E4M3FN.decode(torch.tensor([56, 127])).tolist()
        [1.0, nan]
        """
        return hook("decode")(codes, self)

    def values(self) -> np.ndarray:
        """Every finite value, sorted ascending, distinct, as float64 (formats up to 16 bits).

        >>> import anynum as an
        >>> an.E2M1.values().tolist()
        [-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        """
        if self.bits > MAX_ENUMERABLE_BITS:
            raise FormatError(
                f"values() enumerates formats of at most {MAX_ENUMERABLE_BITS} bits; "
                f"{self!r} has {self.bits}. Use .info for its range instead."
            )
        codes = torch.arange(1 << self.bits, dtype=torch.int64)
        vals = self.decode_torch(codes)
        vals = vals[torch.isfinite(vals)]
        # -0.0 and 0.0 are one value; unique keeps the first it sees.
        return np.unique(vals.numpy() + 0.0)

    # --- the bit layout, on torch tensors (what the kernels build on) -------------------------
    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        """float64 values of int64 codes (every code valid for the format; no checks).

        The layout primitive under `decode`; use `decode` (or `anynum.decode`) for user input.
        """
        raise NotImplementedError

    def encode_torch(self, y: torch.Tensor) -> torch.Tensor:
        """int64 codes of float64 values already on the grid; NaN without a NaN code raises."""
        return self.check_codes(self.encode_kernel(y))

    def encode_kernel(self, y: torch.Tensor) -> torch.Tensor:
        """int64 codes of float64 values already on the grid, as one pure (compilable) kernel.

        NaN maps to the NaN code, or to -1 where the format has none (`check_codes`
        turns that into an error outside the kernel, which must not branch on data).
        """
        raise NotImplementedError

    def check_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """`codes` from `encode_kernel`, or `FormatError` if one marks a NaN the format cannot hold."""
        if not self.has_nan and codes.numel() and bool((codes < 0).any()):
            raise FormatError(f"{self.display_name()} has no NaN code; the input holds NaN.")
        return codes

    def check_overflow(self, overflow: str | None) -> str:
        """Resolve ``overflow=None`` to the default and validate an explicit policy."""
        if overflow is None:
            return self.default_overflow
        if overflow not in self.overflow_policies:
            raise FormatError(
                f"overflow={overflow!r} is not a policy of {self!r}; "
                f"expected one of {self.overflow_policies}."
            )
        if overflow == "inf" and not self.has_inf:
            raise FormatError(
                f"overflow='inf' needs a format with infinities, and {self!r} has none; "
                "use overflow='saturate' or 'nan'."
            )
        if overflow == "nan" and not self.has_nan:
            raise FormatError(
                f"overflow='nan' needs a format with a NaN code, and {self!r} has none; "
                "use overflow='saturate'."
            )
        return overflow

    def display_name(self) -> str:
        return self.name if self.name is not None else repr(self)
