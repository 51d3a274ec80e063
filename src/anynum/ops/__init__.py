"""Chopped math: f(x) computed once on the rounded input and rounded once to a format.

``an.ops.sin(x, fmt, rounding="nearest", *, overflow=None, seed=None, generator=None,
rand_bits=None, domain="nan")`` rounds `x` to `fmt`, computes sin in float64 and rounds
the result once (DESIGN.md §2). Every function takes and returns torch tensors (any
device; float16, bfloat16, float32, float64), NumPy arrays and Python numbers, JAX
arrays (also under ``jax.jit``) and Dask arrays (lazily; stochastic results do not
depend on the chunking); the result has the input's kind and dtype. The covered
functions are Pychop's chopped-math list and NumPy's names for them.

Arguments shared by every function:

* ``fmt``: a Format or a name (``"bf16"``, ``"posit(16,1)"``, ...).
* ``rounding``: a `Rounding` member or alias; the inputs and the result are rounded in this mode.
* ``overflow``, ``seed``/``generator``, ``rand_bits``: as in `anynum.quantize`. Stochastic
  modes draw independent bits for each input and for the result.
* ``domain``: what an input outside the function's domain gives. ``"nan"`` (default):
  NumPy's behaviour, NaN (or ±inf at a pole such as log(0)) and a RuntimeWarning;
  ``"raise"``: `anynum.errors.InputError` naming the first such input; ``"ignore"``:
  NaN or ±inf silently. Pychop raises ValueError instead (and rejects poles).

Accuracy:

* +, -, x, /, sqrt, fma, square, reciprocal, mod, ldexp, diff (n=1) are correctly
  rounded in every mode: the exact result is carried as float64's result plus its
  error term (TwoSum/TwoProduct, or the exact remainder), whose sign decides directed,
  odd and nearest-tie cases and whose value enters the stochastic probability. For
  example ``add(1, 2**-100, "bf16", "ru")`` is 1 + 2**-7. This holds for every format
  whose values and rounding boundaries are float64 numbers of at most 52 significant
  bits (floats of up to 51 significand bits, posits, fixed point up to 51 bits, most
  tables) and for FP64 itself; wider float formats get float64's nearest result rounded.
* The transcendental functions round float64's libm result once (Resolution 6). That
  is the correctly rounded result unless float64's result lies within its own error
  (about one ulp of float64, 2**-52 relative) of a rounding boundary of the format:
  about one input in 2**(52 - p) for a p-bit format, and never for results that are
  exactly representable in float64 (exp2 of integers, log2 of powers of two, exact
  cubes and factorials, which the tests check).
* Reductions accumulate in float64 and round once (``accumulate=None``: float64-accurate,
  not exact for long sums), or follow ``accumulate=fmt2 | "quire"`` (see
  `anynum.ops.reductions`).

>>> import anynum as an, torch
>>> an.ops.add(torch.tensor([1.0]), torch.tensor([2.0**-100]), "bf16", "ru").tolist()
[1.0078125]
>>> an.ops.sin(torch.tensor([0.5, 3.0]), "bf16").tolist()
[0.478515625, 0.1416015625]
"""

from anynum.ops.core import round_exact
from anynum.ops.elementwise import (
    abs,
    add,
    angle,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    cbrt,
    ceil,
    conj,
    copysign,
    cos,
    cosh,
    deg2rad,
    degrees,
    divide,
    erf,
    erfc,
    exp,
    exp2,
    expm1,
    fabs,
    float_power,
    floor,
    floor_divide,
    fmax,
    fmin,
    fmod,
    gamma,
    hypot,
    imag,
    lgamma,
    log,
    log1p,
    log2,
    log10,
    logaddexp,
    logaddexp2,
    maximum,
    minimum,
    mod,
    multiply,
    negative,
    power,
    rad2deg,
    radians,
    real,
    reciprocal,
    remainder,
    rint,
    sign,
    sin,
    sinh,
    sqrt,
    square,
    subtract,
    tan,
    tanh,
    true_divide,
    trunc,
)
from anynum.ops.linalg import dot, matmul
from anynum.ops.reductions import cumprod, cumsum, diff, mean, norm, prod, std, sum, var
from anynum.ops.special import around, clip, fma, frexp, ldexp, modf, round

__all__ = [
    "abs", "add", "angle", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh",
    "around", "bitwise_and", "bitwise_or", "bitwise_xor", "cbrt", "ceil", "clip", "conj", "copysign",
    "cos", "cosh", "cumprod", "cumsum", "deg2rad", "degrees", "diff", "divide", "dot", "erf", "erfc",
    "exp", "exp2", "expm1", "fabs", "float_power", "floor", "floor_divide", "fma", "fmax", "fmin",
    "fmod", "frexp", "gamma", "hypot", "imag", "ldexp", "lgamma", "log", "log1p", "log2", "log10",
    "logaddexp", "logaddexp2", "matmul", "maximum", "mean", "minimum", "mod", "modf", "multiply",
    "negative", "norm", "power", "prod", "rad2deg", "radians", "real", "reciprocal", "remainder",
    "rint", "round", "round_exact", "sign", "sin", "sinh", "sqrt", "square", "std", "subtract", "sum",
    "tan", "tanh", "true_divide", "trunc", "var",
]
