"""The elementwise functions of `anynum.ops`, built from one table each for unary and binary functions.

Every function rounds its inputs to `fmt`, computes once in float64 and rounds the
result once (`anynum.ops.core.round_exact`). The arithmetic ones carry their exact
error term (see `anynum.ops.exact`), so they are correctly rounded in every mode;
the transcendental ones round float64's libm result (DESIGN.md, Resolution 6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anynum.formats.base import Format
from anynum.ops import exact
from anynum.ops.build import SHAPE_1, SHAPE_2, Pole, call, make_body
from anynum.rounding import RoundingLike

_EXACT = "computed exactly and rounded once: correctly rounded in every mode"
_LIBM = (
    "computed once in float64 and rounded once: correctly rounded unless float64's result "
    "lies within its own error (about an ulp of float64) of a rounding boundary"
)
_SPECIALS = (
    "NaN, ±inf and -0 behave as in ``{np}`` on the rounded inputs, then follow the "
    "format (its overflow policy; -0 only where it has one)"
)
_EXAMPLE = ">>> import anynum as an, torch\n>>> an.ops.{name}({args}).tolist()\n{out}\n"


def _doc(title: str, how: str, domain: str, npname: str, example: tuple[str, str]) -> str:
    text = f"{title}\n\n{how[0].upper()}{how[1:]}. "
    if domain:
        text += f"Domain: {domain}; outside it NaN (or ±inf at a pole) and a RuntimeWarning, "
        text += "or `InputError` with ``domain='raise'``. "
    text += _SPECIALS.format(np=npname) + ". The arguments are described in `anynum.ops`.\n\n"
    return text + _EXAMPLE.format(name=title.split(":")[0].split()[0], args=example[0], out=example[1])


def _unary(name: str, f: Callable[..., Any], title: str, how: str, domain: str, pole: Pole,
           example: tuple[str, str], *, pair: bool = False, npname: str | None = None,
           never_zero: Pole = None, plain: tuple[Callable[..., torch.Tensor], int] | None = None,
           ) -> Callable[..., Any]:
    body = make_body(name, f, pole, domain, pair=pair, never_zero=never_zero, plain=plain)

    def op(x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *, overflow: str | None = None,
           seed: int | None = None, generator: Any = None, rand_bits: int | None = None,
           domain: str = "nan") -> Any:
        opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                    rand_bits=rand_bits, domain=domain)
        return call(name, (x,), body, opts, jax_like=SHAPE_1)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = _doc(f"{name}: {title}", how, domain, npname or f"np.{name}", example)
    return op


def _zero(x: torch.Tensor) -> torch.Tensor:
    return x == 0


def _always(*xs: torch.Tensor) -> torch.Tensor:
    return torch.ones((), dtype=torch.bool, device=xs[0].device)


def _at(v: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x == v


def _sign(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), x, torch.sign(x))  # torch gives 0 for NaN, NumPy NaN


def _lgamma_pole(x: torch.Tensor) -> torch.Tensor:
    return (x <= 0) & (x == torch.round(x))


_T = "torch.tensor([0.5, 3.0])"
_B = '"bf16"'


def _ex(args: str, out: str) -> tuple[str, str]:
    return args, out


# Quotients and square roots of p-bit values are within 2**-(2p+2) of a (p+1)-bit boundary
# only when they are on it; with p <= 25 float64's result rounds like the exact one.
sqrt = _unary("sqrt", exact.sqrt, "square root", _EXACT, "x >= 0", None,
              _ex('torch.tensor([2.0, 0.25]), "e4m3fn", "ru"', "[1.5, 0.5]"), pair=True,
              plain=(torch.sqrt, 25))
square = _unary("square", lambda x: exact.multiply(x, x), "x * x", _EXACT, "", None,
                _ex('torch.tensor([1.0625]), "bf16", "rd"', "[1.125]"), pair=True,
                plain=(torch.square, 26))
reciprocal = _unary("reciprocal", lambda x: exact.divide(torch.ones_like(x), x), "1 / x", _EXACT,
                    "x != 0 (0 is a pole)", _zero, _ex('torch.tensor([3.0]), "bf16", "rz"', "[0.33203125]"),
                    pair=True, plain=(torch.reciprocal, 25))
cbrt = _unary("cbrt", exact.cbrt, "cube root", _LIBM + " (exact cubes give their exact root)", "", None,
              _ex('torch.tensor([27.0, -2.0]), "bf16"', "[3.0, -1.2578125]"))
exp = _unary("exp", torch.exp, "e**x", _LIBM, "", None, _ex(f"{_T}, {_B}", "[1.6484375, 20.125]"),
            never_zero=_always)
expm1 = _unary("expm1", torch.expm1, "e**x - 1", _LIBM, "", None, _ex(f"{_T}, {_B}", "[0.6484375, 19.125]"))
exp2 = _unary("exp2", torch.exp2, "2**x", _LIBM, "", None, _ex(f"{_T}, {_B}", "[1.4140625, 8.0]"),
             never_zero=_always)
log = _unary("log", torch.log, "natural logarithm", _LIBM, "x >= 0 (0 is a pole: -inf)", _zero,
             _ex(f"{_T}, {_B}", "[-0.69140625, 1.1015625]"))
log2 = _unary("log2", torch.log2, "base-2 logarithm", _LIBM, "x >= 0 (0 is a pole: -inf)", _zero,
              _ex(f"{_T}, {_B}", "[-1.0, 1.5859375]"))
log10 = _unary("log10", torch.log10, "base-10 logarithm", _LIBM, "x >= 0 (0 is a pole: -inf)", _zero,
               _ex(f"{_T}, {_B}", "[-0.30078125, 0.4765625]"))
log1p = _unary("log1p", torch.log1p, "log(1 + x)", _LIBM, "x >= -1 (-1 is a pole: -inf)", _at(-1.0),
               _ex(f"{_T}, {_B}", "[0.40625, 1.3828125]"))
sin = _unary("sin", torch.sin, "sine", _LIBM, "", None, _ex(f"{_T}, {_B}", "[0.478515625, 0.1416015625]"))
cos = _unary("cos", torch.cos, "cosine", _LIBM, "", None, _ex(f"{_T}, {_B}", "[0.87890625, -0.98828125]"))
tan = _unary("tan", torch.tan, "tangent", _LIBM, "", None, _ex(f"{_T}, {_B}", "[0.546875, -0.142578125]"))
arcsin = _unary("arcsin", torch.asin, "inverse sine", _LIBM, "-1 <= x <= 1", None,
                _ex('torch.tensor([0.5, 1.0]), "bf16"', "[0.5234375, 1.5703125]"))
arccos = _unary("arccos", torch.acos, "inverse cosine", _LIBM, "-1 <= x <= 1", None,
                _ex('torch.tensor([0.5, 1.0]), "bf16"', "[1.046875, 0.0]"))
arctan = _unary("arctan", torch.atan, "inverse tangent", _LIBM, "", None,
                _ex(f"{_T}, {_B}", "[0.462890625, 1.25]"))
sinh = _unary("sinh", torch.sinh, "hyperbolic sine", _LIBM, "", None,
              _ex(f"{_T}, {_B}", "[0.51953125, 10.0]"))
cosh = _unary("cosh", torch.cosh, "hyperbolic cosine", _LIBM, "", None,
              _ex(f"{_T}, {_B}", "[1.125, 10.0625]"))
tanh = _unary("tanh", torch.tanh, "hyperbolic tangent", _LIBM, "", None,
              _ex(f"{_T}, {_B}", "[0.462890625, 0.99609375]"))
arcsinh = _unary("arcsinh", torch.asinh, "inverse hyperbolic sine", _LIBM, "", None,
                 _ex(f"{_T}, {_B}", "[0.48046875, 1.8203125]"))
arccosh = _unary("arccosh", torch.acosh, "inverse hyperbolic cosine", _LIBM, "x >= 1", None,
                 _ex('torch.tensor([1.0, 3.0]), "bf16"', "[0.0, 1.765625]"))
arctanh = _unary("arctanh", torch.atanh, "inverse hyperbolic tangent", _LIBM,
                 "-1 <= x <= 1 (±1 are poles: ±inf)", lambda x: x.abs() == 1,
                 _ex('torch.tensor([0.5, -0.25]), "bf16"', "[0.55078125, -0.255859375]"))
erf = _unary("erf", torch.special.erf, "error function", _LIBM, "", None,
             _ex(f"{_T}, {_B}", "[0.51953125, 1.0]"))
erfc = _unary("erfc", torch.special.erfc, "complementary error function 1 - erf(x)", _LIBM, "", None,
              _ex(f"{_T}, {_B}", "[0.48046875, 2.205371856689453e-05]"), never_zero=_always)
gamma = _unary("gamma", exact.gamma, "the gamma function",
               _LIBM + " (SciPy's gamma, or libm's tgamma without SciPy; exact factorials at 1..171)",
               "x not 0 or a negative integer (0 is a pole: ±inf; negative integers give NaN)", _zero,
               _ex('torch.tensor([5.0, 0.5]), "bf16"', "[24.0, 1.7734375]"), npname="scipy.special.gamma",
               never_zero=_always)
lgamma = _unary("lgamma", torch.lgamma, "log |gamma(x)|", _LIBM,
                "x not 0 or a negative integer (poles: +inf)", _lgamma_pole,
                _ex('torch.tensor([5.0, 0.5]), "bf16"', "[3.171875, 0.57421875]"), npname="math.lgamma")
degrees = _unary("degrees", torch.rad2deg, "radians to degrees (x * 180 / pi)", _LIBM, "", None,
                 _ex('torch.tensor([1.0]), "bf16"', "[57.25]"))
radians = _unary("radians", torch.deg2rad, "degrees to radians (x * pi / 180)", _LIBM, "", None,
                 _ex('torch.tensor([180.0]), "bf16"', "[3.140625]"))
rad2deg, deg2rad = degrees, radians
abs = _unary("abs", torch.abs, "absolute value", _EXACT, "", None,
             _ex('torch.tensor([-1.3]), "e4m3fn"', "[1.25]"))
fabs = abs
negative = _unary("negative", torch.neg, "-x", _EXACT, "", None,
                  _ex('torch.tensor([1.3]), "e4m3fn"', "[-1.25]"))
sign = _unary("sign", _sign, "-1, 0 or 1 by the sign of x (NaN stays NaN)", _EXACT, "", None,
              _ex('torch.tensor([-0.3, 0.0]), "e4m3fn"', "[-1.0, 0.0]"))
floor = _unary("floor", torch.floor, "largest integer <= x", _EXACT, "", None,
               _ex('torch.tensor([-2.5, 2.7]), "bf16"', "[-3.0, 2.0]"))
ceil = _unary("ceil", torch.ceil, "smallest integer >= x", _EXACT, "", None,
              _ex('torch.tensor([-2.5, 2.7]), "bf16"', "[-2.0, 3.0]"))
trunc = _unary("trunc", torch.trunc, "integer part, toward zero", _EXACT, "", None,
               _ex('torch.tensor([-2.5, 2.7]), "bf16"', "[-2.0, 2.0]"))
rint = _unary("rint", torch.round, "nearest integer, ties to even", _EXACT, "", None,
              _ex('torch.tensor([-2.5, 3.5]), "bf16"', "[-2.0, 4.0]"))
angle = _unary("angle", lambda x: torch.atan2(torch.zeros_like(x), x),
               "the complex argument of a real x (0, or pi for x < 0 and for -0)", _LIBM, "", None,
               _ex('torch.tensor([2.0, -2.0]), "bf16"', "[0.0, 3.140625]"))
real = _unary("real", lambda x: x.clone(), "x itself (real inputs)", _EXACT, "", None,
              _ex('torch.tensor([1.3]), "e4m3fn"', "[1.25]"))
conj = _unary("conj", lambda x: x.clone(), "x itself (real inputs)", _EXACT, "", None,
              _ex('torch.tensor([1.3]), "e4m3fn"', "[1.25]"))
imag = _unary("imag", torch.zeros_like, "0 (real inputs)", _EXACT, "", None,
              _ex('torch.tensor([1.3]), "e4m3fn"', "[0.0]"))


# --- binary functions -----------------------------------------------------------------------------


def _binary(name: str, f: Callable[..., Any], title: str, how: str, domain: str, pole: Pole,
            example: tuple[str, str], *, pair: bool = False, down_aware: bool = False,
            npname: str | None = None, never_zero: Pole = None,
            plain: tuple[Callable[..., torch.Tensor], int] | None = None) -> Callable[..., Any]:
    body = make_body(name, f, pole, domain, pair=pair, down_aware=down_aware, never_zero=never_zero,
                     plain=plain)

    def op(x: Any, y: Any, fmt: Format | str, rounding: RoundingLike = "nearest", *,
           overflow: str | None = None, seed: int | None = None, generator: Any = None,
           rand_bits: int | None = None, domain: str = "nan") -> Any:
        opts = dict(fmt=fmt, rounding=rounding, overflow=overflow, seed=seed, generator=generator,
                    rand_bits=rand_bits, domain=domain)
        return call(name, (x, y), body, opts, jax_like=SHAPE_2)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = _doc(f"{name}: {title}", how, domain, npname or f"np.{name}", example)
    return op


def _divide_pole(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (y == 0) & (x != 0) & torch.isfinite(x)


def _power(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pow from libm, with exact pairs where the exponent is 2, -1 or 1/2 (x > 0)."""
    x, y = torch.broadcast_tensors(x, y)
    s = torch.pow(x, y)
    e = torch.zeros_like(s)
    for special, pair in (
        (y == 2, lambda: exact.multiply(x, x)),
        (y == -1, lambda: exact.divide(torch.ones_like(x), x)),
        ((y == 0.5) & (x > 0) & torch.isfinite(x), lambda: exact.sqrt(x)),
    ):
        if bool(special.any()):
            ps, pe = pair()
            s, e = torch.where(special, ps, s), torch.where(special, pe, e)
    return s, e


def _power_pole(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x == 0) & (y < 0)


def _bitwise(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = torch.broadcast_tensors(x, y)
        ok = torch.isfinite(x) & torch.isfinite(y) & (x.abs() < 2.0**63) & (y.abs() < 2.0**63)
        xi = torch.where(ok, x, 0).to(torch.int64)  # toward zero, as Pychop's int cast
        yi = torch.where(ok, y, 0).to(torch.int64)
        return torch.where(ok, op(xi, yi).to(torch.float64), torch.nan)

    return f


_XY = 'torch.tensor([1.0]), torch.tensor([2.0**-100]), "bf16", "ru"'
add = _binary("add", exact.add, "x + y", _EXACT, "", None, _ex(_XY, "[1.0078125]"), pair=True,
              down_aware=True)
subtract = _binary("subtract", lambda x, y, round_down: exact.add(x, -y, round_down), "x - y", _EXACT, "",
                   None, _ex('torch.tensor([1.0]), torch.tensor([2.0**-100]), "bf16", "rz"', "[0.99609375]"),
                   pair=True, down_aware=True)
multiply = _binary("multiply", exact.multiply, "x * y", _EXACT, "", None,
                   _ex('torch.tensor([1.125]), torch.tensor([1.125]), "e4m3fn", "ru"', "[1.375]"), pair=True,
                   plain=(torch.mul, 26))
divide = _binary("divide", exact.divide, "x / y", _EXACT, "y != 0 (x / 0 is a pole; 0 / 0 is NaN)",
                 _divide_pole, _ex('torch.tensor([1.0, 2.0]), torch.tensor([3.0]), "bf16"',
                                   "[0.333984375, 0.66796875]"), pair=True, plain=(torch.div, 25))
true_divide = divide
power = _binary("power", _power, "x ** y", _LIBM + " (exact for exponents 2, -1 and 1/2)",
                "x >= 0 or integral y (0 to a negative power is a pole)", _power_pole,
                _ex('torch.tensor([2.0, 3.0]), torch.tensor([0.5, 2.0]), "bf16"', "[1.4140625, 9.0]"),
                pair=True, never_zero=lambda x, y: x != 0)
float_power = power
arctan2 = _binary("arctan2", torch.atan2,
                  "the angle of the point (x=y, y=x): atan(x / y) in the right quadrant",
                  _LIBM, "", None, _ex('torch.tensor([1.0]), torch.tensor([-1.0]), "bf16"', "[2.359375]"))
hypot = _binary("hypot", torch.hypot, "sqrt(x**2 + y**2)", _LIBM, "", None,
                _ex('torch.tensor([3.0, 1.0]), torch.tensor([4.0, 1.0]), "bf16"', "[5.0, 1.4140625]"))
logaddexp = _binary("logaddexp", torch.logaddexp, "log(e**x + e**y)", _LIBM, "", None,
                    _ex('torch.tensor([0.0]), torch.tensor([0.0]), "bf16"', "[0.69140625]"))
logaddexp2 = _binary("logaddexp2", torch.logaddexp2, "log2(2**x + 2**y)", _LIBM, "", None,
                     _ex('torch.tensor([0.0]), torch.tensor([1.0]), "bf16"', "[1.5859375]"))
maximum = _binary("maximum", torch.maximum, "the larger of x and y (NaN if either is NaN)", _EXACT, "",
                  None, _ex('torch.tensor([1.3, float("nan")]), torch.tensor([2.0, 0.0]), "e4m3fn"',
                            "[2.0, nan]"))
minimum = _binary("minimum", torch.minimum, "the smaller of x and y (NaN if either is NaN)", _EXACT, "",
                  None, _ex('torch.tensor([1.3, float("nan")]), torch.tensor([2.0, 0.0]), "e4m3fn"',
                            "[1.25, nan]"))
fmax = _binary("fmax", torch.fmax, "the larger of x and y, ignoring a NaN", _EXACT, "", None,
               _ex('torch.tensor([1.3, float("nan")]), torch.tensor([2.0, 0.0]), "e4m3fn"', "[2.0, 0.0]"))
fmin = _binary("fmin", torch.fmin, "the smaller of x and y, ignoring a NaN", _EXACT, "", None,
               _ex('torch.tensor([1.3, float("nan")]), torch.tensor([2.0, 0.0]), "e4m3fn"', "[1.25, 0.0]"))
copysign = _binary("copysign", torch.copysign, "|x| with the sign of y", _EXACT, "", None,
                   _ex('torch.tensor([1.3]), torch.tensor([-0.0]), "e4m3fn"', "[-1.25]"))
mod = _binary("mod", exact.mod, "x modulo y with the sign of y (NumPy's mod; Python's %)", _EXACT,
              "y != 0 and finite x", None,
              _ex('torch.tensor([-1.0, 5.5]), torch.tensor([3.0, -2.0]), "bf16"', "[2.0, -0.5]"), pair=True)
remainder = mod
fmod = _binary("fmod", torch.fmod, "x modulo y with the sign of x (C's fmod)", _EXACT,
               "y != 0 and finite x", None,
               _ex('torch.tensor([-1.0, 5.5]), torch.tensor([3.0, -2.0]), "bf16"', "[-1.0, 1.5]"))
floor_divide = _binary(
    "floor_divide", lambda x, y: torch.div(x, y, rounding_mode="floor"), "floor(x / y)",
    "computed once in float64 by NumPy's algorithm ((x - fmod(x, y)) / y, adjusted) and rounded once",
    "y != 0 (x // 0 is a pole; 0 // 0 is NaN)", _divide_pole,
    _ex('torch.tensor([7.0, -7.0]), torch.tensor([2.0]), "bf16"', "[3.0, -4.0]"))
bitwise_and = _binary("bitwise_and", _bitwise(torch.bitwise_and),
                      "x & y of the values truncated to int64 (Pychop's bitwise methods)", _EXACT,
                      "finite x and y below 2**63", None,
                      _ex('torch.tensor([6.0]), torch.tensor([3.0]), "bf16"', "[2.0]"))
bitwise_or = _binary("bitwise_or", _bitwise(torch.bitwise_or),
                     "x | y of the values truncated to int64 (Pychop's bitwise methods)", _EXACT,
                     "finite x and y below 2**63", None,
                     _ex('torch.tensor([6.0]), torch.tensor([3.0]), "bf16"', "[7.0]"))
bitwise_xor = _binary("bitwise_xor", _bitwise(torch.bitwise_xor),
                      "x ^ y of the values truncated to int64 (Pychop's bitwise methods)", _EXACT,
                      "finite x and y below 2**63", None,
                      _ex('torch.tensor([6.0]), torch.tensor([3.0]), "bf16"', "[5.0]"))
