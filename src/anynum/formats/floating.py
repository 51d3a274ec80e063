"""Binary floating-point formats of any width: IEEE, OCP FP8/FP6/FP4, fnuz, P3109, E8M0.

A `FloatFormat` is a sign bit (unless unsigned), ``exp_bits`` of biased
exponent and ``man_bits`` of fraction. Which codes are special depends on
``specials``:

==========  =====================================================================
"ieee"      top exponent field holds ±inf (fraction 0) and NaN (IEEE 754, bfloat16, tf32, e5m2)
"fn"        no infinities; only the all-ones magnitude code is NaN (OCP e4m3fn, max 448)
"fnuz"      no infinities, no -0; the negative-zero code 0b100..0 is NaN (e4m3fnuz, e5m2fnuz)
"none"      every code is a finite number (OCP e2m1, e2m3, e3m2)
"p3109"     P3109 extended domain: signed: NaN at 0b100..0 and ±inf at the two largest
            magnitude codes; unsigned: all-ones is NaN, the code below it is +inf
==========  =====================================================================

``subnormals=False`` flushes: exponent field 0 means zero and the gap between
0 and the smallest normal is one rounding step. ``zero=False`` (E8M0 only, in
practice) makes exponent field 0 an ordinary binade, so there is no zero and
results below the smallest value saturate to it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from anynum._bits import floor_log2, ldexp
from anynum.errors import FormatError
from anynum.formats.base import Format

__all__ = [
    "BF16",
    "E2M1",
    "E2M3",
    "E3M2",
    "E3M4",
    "E4M3",
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "E5M2FNUZ",
    "E8M0",
    "FP16",
    "FP32",
    "FP64",
    "Q43",
    "Q52",
    "TF32",
    "FloatFormat",
    "p3109",
]

_SPECIALS = ("ieee", "fn", "fnuz", "none", "p3109")


@dataclass(frozen=True)
class FloatFormat(Format):
    """A binary floating-point format.

    Args:
        exp_bits: exponent field width, 1..11.
        man_bits: fraction field width (hidden bit excluded), 0..52.
        bias: exponent bias; default IEEE ``2**(exp_bits-1) - 1`` (one more for "fnuz").
        subnormals: keep subnormals (True) or flush them to zero.
        specials: which codes are inf/NaN (see module docstring).
        signed: False for unsigned formats (E8M0, P3109 unsigned); negative inputs give NaN.
        zero: False makes exponent field 0 a normal binade (E8M0: no zero).

    >>> import anynum as an
    >>> fmt = an.FloatFormat(4, 3, specials="fn")
    >>> fmt == an.E4M3FN, fmt.max, fmt.smallest_subnormal
    (True, 448.0, 0.001953125)
    >>> an.quantize(torch.tensor([1000.0, float("nan")]), fmt).tolist()  # saturates by default
    [448.0, nan]
    """

    exp_bits: int
    man_bits: int
    bias: int | None = None
    subnormals: bool = True
    specials: str = "ieee"
    signed: bool = True  # type: ignore[assignment]
    zero: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.exp_bits, int) or not 1 <= self.exp_bits <= 11:
            raise FormatError(
                f"exp_bits must be an integer in 1..11, got {self.exp_bits!r} "
                "(wider exponents are not exact in a float64 working type)."
            )
        if not isinstance(self.man_bits, int) or not 0 <= self.man_bits <= 52:
            raise FormatError(
                f"man_bits must be an integer in 0..52, got {self.man_bits!r} "
                "(float64 holds at most 52 fraction bits exactly)."
            )
        if self.specials not in _SPECIALS:
            raise FormatError(f"specials must be one of {_SPECIALS}, got {self.specials!r}.")
        if self.specials == "fnuz" and not self.signed:
            raise FormatError("specials='fnuz' puts NaN on the negative-zero code; it needs a signed format.")
        if not self.zero and self.subnormals:
            raise FormatError("zero=False needs subnormals=False (exponent field 0 becomes a normal binade).")
        if self.specials == "ieee" and self.exp_bits < 2:
            raise FormatError("specials='ieee' needs exp_bits >= 2 (one exponent code is reserved).")
        if self.bias is None:
            default = (1 << (self.exp_bits - 1)) - 1 + (1 if self.specials == "fnuz" else 0)
            object.__setattr__(self, "bias", default)
        if not isinstance(self.bias, int):
            raise FormatError(f"bias must be an integer, got {self.bias!r}.")
        if self.max_exponent_value() > 1023 or self.min_quantum_exponent() < -1074:
            raise FormatError(
                f"{self!r} reaches beyond float64's range (largest exponent "
                f"{self.max_exponent_value()}, smallest step 2**{self.min_quantum_exponent()}); "
                "reduce the bias or exp_bits."
            )
        if self.min_quantum_exponent() > 0:
            raise FormatError(
                f"{self!r} has a smallest step of 2**{self.min_quantum_exponent()} > 1; "
                "formats whose grid starts above 1 are not supported (raise the bias)."
            )
        if self._top_finite_magnitude_code() < (0 if self.zero else 1) or self.max <= 0:
            raise FormatError(f"{self!r} has no finite positive values (its codes are all inf or NaN).")
        if self.zero and not self.subnormals and self._top_finite_magnitude_code() >> self.man_bits == 0:
            # every finite code sits in exponent field 0, which without subnormals is all zero
            raise FormatError(
                f"{self!r} has no finite positive values: its only finite codes have exponent field 0, "
                "which is zero without subnormals. Use subnormals=True, more exp_bits, or fewer specials."
            )
        if not math.isfinite(self.max):
            raise FormatError(f"{self!r} has no finite positive values.")
        if not self.zero and self.signed and self.specials in ("fnuz", "p3109"):
            raise FormatError(
                f"specials={self.specials!r} puts NaN on the code 0b100..0, which zero=False would "
                "need for -smallest: the negative grid would lose its smallest value. Use "
                "specials='fn' or 'none', or keep zero=True."
            )

    # --- layout ---------------------------------------------------------------------------
    @property
    def _bias(self) -> int:
        assert self.bias is not None
        return self.bias

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def _exp_field_max(self) -> int:
        return (1 << self.exp_bits) - 1

    @property
    def _man_mask(self) -> int:
        return (1 << self.man_bits) - 1

    @property
    def _magnitude_mask(self) -> int:
        return (1 << (self.exp_bits + self.man_bits)) - 1

    def _top_finite_magnitude_code(self) -> int:
        """Largest magnitude code (sign bit clear) that holds a finite value."""
        top = self._magnitude_mask
        if self.specials == "ieee":
            return top - self._man_mask - 1  # exp field all-ones is special
        if self.specials == "fn":
            return top - 1
        if self.specials == "p3109":
            return top - 1 if self.signed else top - 2
        return top  # "fnuz", "none"

    def max_exponent_value(self) -> int:
        code = self._top_finite_magnitude_code()
        return max((code >> self.man_bits) - self._bias, self.emin)

    def min_quantum_exponent(self) -> int:
        """Exponent of the grid step in the lowest binade."""
        return self.emin - (self.man_bits if self.subnormals else 0)

    # --- finfo-style properties ---------------------------------------------------------------
    @functools.cached_property
    def emin(self) -> int:
        return (0 if not self.zero else 1) - self._bias

    @functools.cached_property
    def emax(self) -> int:
        return self.max_exponent_value()

    @property
    def precision(self) -> int:
        return self.man_bits + 1

    @functools.cached_property
    def max(self) -> float:  # type: ignore[override]
        code = self._top_finite_magnitude_code()
        e_field, frac = code >> self.man_bits, code & self._man_mask
        if e_field == 0 and self.zero:
            return math.ldexp(frac, self.emin - self.man_bits)
        return math.ldexp((1 << self.man_bits) | frac, e_field - self._bias - self.man_bits)

    @functools.cached_property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @functools.cached_property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.min_quantum_exponent())

    @functools.cached_property
    def eps(self) -> float:
        return math.ldexp(1.0, -self.man_bits)

    @property
    def has_inf(self) -> bool:
        return self.specials in ("ieee", "p3109")

    @property
    def has_nan(self) -> bool:
        # An IEEE-style format without fraction bits has only inf in its top binade.
        return self.specials != "none" and not (self.specials == "ieee" and self.man_bits == 0)

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.zero and self.specials not in ("fnuz", "p3109")

    # --- codes ------------------------------------------------------------------------------
    def _nan_code(self) -> int:
        mag = self._magnitude_mask
        if not self.has_nan:
            raise FormatError(f"{self.display_name()} has no NaN code; the input holds NaN.")
        if self.specials == "ieee":
            return (self._exp_field_max << self.man_bits) | (1 << max(self.man_bits - 1, 0))
        if self.specials == "fnuz" or (self.specials == "p3109" and self.signed):
            return 1 << (self.bits - 1)
        if self.specials in ("fn", "p3109"):
            return mag
        raise FormatError(f"{self.display_name()} has no NaN code.")

    def _inf_code(self) -> int:
        if self.specials == "ieee":
            return self._exp_field_max << self.man_bits
        if self.specials == "p3109":
            return self._magnitude_mask if self.signed else self._magnitude_mask - 1
        raise FormatError(f"{self.display_name()} has no infinity code.")

    def decode_torch(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.to(torch.int64)
        mag = codes & self._magnitude_mask
        negative = ((codes >> (self.exp_bits + self.man_bits)) & 1).bool() if self.signed else None
        e_field = mag >> self.man_bits
        frac = (mag & self._man_mask).to(torch.float64)
        normal = e_field > 0 if self.zero else torch.ones_like(e_field, dtype=torch.bool)
        if self.subnormals or not self.zero:
            sig = torch.where(normal, frac + 2.0**self.man_bits, frac)
        else:  # flushed: exponent field 0 decodes to zero whatever the fraction
            sig = torch.where(normal, frac + 2.0**self.man_bits, torch.zeros_like(frac))
        exp = torch.where(normal, e_field - self._bias, torch.full_like(e_field, self.emin))
        value = ldexp(sig, (exp - self.man_bits).to(torch.int64))
        if self.specials == "ieee":
            special = e_field == self._exp_field_max
            value = torch.where(special & (frac == 0), torch.inf, value)
            value = torch.where(special & (frac != 0), torch.nan, value)
        elif self.specials == "fn":
            value = torch.where(mag == self._magnitude_mask, torch.nan, value)
        elif self.specials == "p3109":
            value = torch.where(mag == self._inf_code(), torch.inf, value)
            if not self.signed:
                value = torch.where(mag == self._nan_code(), torch.nan, value)
        if negative is not None:
            value = torch.where(negative, -value, value)
            if self.specials in ("fnuz", "p3109"):
                value = torch.where(codes == (1 << (self.bits - 1)), torch.nan, value)
        if not self.has_negative_zero:  # flushed negative subnormals read as zero, which is +0 here
            value = torch.where(value == 0, 0.0, value)
        return value

    def encode_kernel(self, y: torch.Tensor) -> torch.Tensor:
        a = torch.abs(y)
        finite_nonzero = (a < torch.inf) & (a > 0)  # not isfinite: it does not vectorize in Inductor
        safe = torch.where(finite_nonzero, a, torch.ones_like(a))
        e = floor_log2(safe).to(torch.int64)
        if self.zero:
            e = torch.clamp(e, min=self.emin)
        normal = safe >= self.smallest_normal
        sig = ldexp(safe, (self.man_bits - e)).to(torch.int64)  # exact: y is on the grid
        if self.zero:
            e_field = torch.where(normal, e + self._bias, torch.zeros_like(e))
        else:
            e_field = e + self._bias
        frac = torch.where(normal, sig - (1 << self.man_bits), sig)
        mag = (e_field << self.man_bits) | frac
        mag = torch.where(finite_nonzero, mag, torch.zeros_like(mag))
        if self.has_inf:
            mag = torch.where(a == torch.inf, self._inf_code(), mag)
        code = mag
        if self.signed:
            sign = torch.signbit(y)
            if not self.has_negative_zero:
                sign = sign & (a != 0)
            code = code | (sign.to(torch.int64) << (self.bits - 1))
        return torch.where(y != y, self._nan_code() if self.has_nan else -1, code)  # y != y: NaN

    def __repr__(self) -> str:
        if self.name:
            return self.name.upper() if self.name.isidentifier() else self.name
        parts = [f"exp_bits={self.exp_bits}", f"man_bits={self.man_bits}"]
        default_bias = (1 << (self.exp_bits - 1)) - 1 + (1 if self.specials == "fnuz" else 0)
        if self.bias != default_bias:
            parts.append(f"bias={self.bias}")
        if not self.subnormals:
            parts.append("subnormals=False")
        if self.specials != "ieee":
            parts.append(f"specials={self.specials!r}")
        if not self.signed:
            parts.append("signed=False")
        if not self.zero:
            parts.append("zero=False")
        return f"FloatFormat({', '.join(parts)})"


def _preset(name: str, *args: int, **kwargs: object) -> FloatFormat:
    return FloatFormat(*args, name=name, **kwargs)  # type: ignore[arg-type]


FP64 = _preset("fp64", 11, 52)
FP32 = _preset("fp32", 8, 23)
TF32 = _preset("tf32", 8, 10)
FP16 = _preset("fp16", 5, 10)
BF16 = _preset("bf16", 8, 7)
E5M2 = _preset("e5m2", 5, 2)
E4M3 = _preset("e4m3", 4, 3)  # IEEE-like e4m3 with inf (max 240) = Pychop q43
E3M4 = _preset("e3m4", 3, 4)
E4M3FN = _preset("e4m3fn", 4, 3, specials="fn")
E4M3FNUZ = _preset("e4m3fnuz", 4, 3, specials="fnuz")
E5M2FNUZ = _preset("e5m2fnuz", 5, 2, specials="fnuz")
E3M2 = _preset("e3m2", 3, 2, specials="none")
E2M3 = _preset("e2m3", 2, 3, specials="none")
E2M1 = _preset("e2m1", 2, 1, specials="none")
E8M0 = _preset("e8m0", 8, 0, bias=127, subnormals=False, zero=False, signed=False, specials="fn")
Q43 = _preset("q43", 4, 3)
Q52 = _preset("q52", 5, 2)


def p3109(k: int, p: int, signed: bool = True, domain: str = "extended") -> FloatFormat:
    """The IEEE P3109 format binary{k}p{p}: k bits, precision p (hidden bit included).

    Signed formats have one NaN (the negative-zero code) and no -0; the
    extended domain adds ±inf at the largest magnitude codes. Unsigned formats
    put NaN at the all-ones code (and +inf below it when extended). Bias is
    2**(k-p-1) signed, 2**(k-p) unsigned, as in the P3109 interim report.

    >>> fmt = p3109(8, 4)
    >>> fmt.max, fmt.has_inf
    (224.0, True)
    """
    if domain not in ("extended", "finite"):
        raise FormatError(f"domain must be 'extended' or 'finite', got {domain!r}.")
    if not isinstance(k, int) or not isinstance(p, int) or k < 2 or not 1 <= p < k + (0 if signed else 1):
        raise FormatError(
            f"P3109 needs integers k >= 2 and 1 <= p < k (p <= k unsigned); got k={k!r}, p={p!r}."
        )
    exp_bits = k - p + (0 if signed else 1)
    bias = 2 ** (k - p - 1) if signed else 2 ** (k - p)
    if domain == "extended":
        specials = "p3109"
    else:
        specials = "fnuz" if signed else "fn"
    name = f"p3109({k},{p})" + ("" if signed else "u") + ("" if domain == "extended" else "f")
    return FloatFormat(exp_bits, p - 1, bias=bias, specials=specials, signed=signed, name=name)
