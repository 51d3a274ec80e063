"""The differential fuzzer's pieces: format and input strategies, the kernel routes, the checks.

`kernel_routes` is the one place that knows which kernels exist: it asks the router
(``anynum.kernels.route``) for every registered kernel covering a call.

Run modes (see tests/fuzz/conftest.py): a bounded, derandomized run inside the normal test
suite, and a long run with ``pytest -m fuzz`` (``--fuzz-examples=N``, ``--fuzz-seed=S``).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, reject, seed, settings
from hypothesis import strategies as st

import anynum as an
from anynum.errors import AnynumError, FormatError
from anynum.formats.block import SCALE_RULES
from anynum.kernels import route
from anynum.rounding import CounterRandom, RandomSource, Rounding

LONG = os.environ.get("ANYNUM_FUZZ_LONG") == "1"
EXAMPLES = int(os.environ.get("ANYNUM_FUZZ_EXAMPLES") or 0)
SEED = os.environ.get("ANYNUM_FUZZ_SEED")


def fuzz(ci_examples: int, long_examples: int = 1_000_000) -> Callable[[Any], Any]:
    """Decorator (above ``@given``): bounded and derandomized in the normal run; long, and
    seeded by ``--fuzz-seed`` when given, under ``pytest -m fuzz``."""
    n = EXAMPLES or (long_examples if LONG else ci_examples)
    config = settings(
        max_examples=n,
        deadline=None,
        derandomize=not LONG and SEED is None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )

    def decorate(test: Any) -> Any:
        test = config(test)
        return seed(int(SEED))(test) if SEED is not None else test

    return decorate


# --- what a run tried: printed at the end of the session (conftest) ---------------------------

COUNTS: dict[str, int] = {}


def count(what: str) -> None:
    COUNTS[what] = COUNTS.get(what, 0) + 1


# --- formats ---------------------------------------------------------------------------------


def _build(make: Callable[[], an.Format]) -> an.Format:
    try:
        return make()
    except FormatError:
        reject()
        raise AssertionError from None  # unreachable: reject() raises


@st.composite
def float_formats(draw: Any) -> an.Format:
    """FloatFormat over the legal parameter space, edge parameters favoured."""
    e = draw(st.one_of(st.integers(1, 5), st.integers(1, 11)))
    m = draw(st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, 23), st.integers(0, 52)))
    specials = draw(st.sampled_from(["ieee", "fn", "fnuz", "none", "p3109"]))
    signed = draw(st.booleans()) if specials != "fnuz" else True
    subnormals = draw(st.booleans())
    zero = draw(st.booleans()) if not subnormals else True
    bias = draw(st.one_of(st.none(), st.integers(-8, (1 << e) + 4)))
    return _build(
        lambda: an.FloatFormat(
            e, m, bias=bias, subnormals=subnormals, zero=zero, signed=signed, specials=specials
        )
    )


@st.composite
def posits(draw: Any) -> an.Format:
    n = draw(st.one_of(st.integers(2, 10), st.integers(2, 32)))
    es = draw(st.one_of(st.integers(0, 3), st.integers(0, 9)))
    scale_exp = draw(st.one_of(st.just(0), st.integers(-40, 40)))
    underflow = draw(st.sampled_from(["minpos", "zero"]))
    return _build(lambda: an.Posit(n, es, scale_exp=scale_exp, underflow=underflow))


@st.composite
def uniform_formats(draw: Any) -> an.Format:
    signed = draw(st.booleans())
    overflow = draw(st.sampled_from(["saturate", "wrap"]))
    if draw(st.booleans()):
        bits = draw(st.integers(1, 32))
        return _build(lambda: an.IntFormat(bits, signed=signed))
    i, f = draw(st.integers(-4, 24)), draw(st.integers(-4, 24))
    return _build(lambda: an.FixedPoint(i, f, signed=signed, overflow=overflow))


@st.composite
def tables(draw: Any) -> an.Format:
    kind = draw(st.sampled_from(["tiny", "random", "huge", "from_format"]))
    opts = {
        "ties": draw(st.sampled_from(["smaller_magnitude", "away", "even", "down", "up"])),
        "underflow": draw(st.sampled_from(["zero", "saturate"])),
        "infinity": draw(st.sampled_from(["saturate", "nan"])),
        "signed_zero": draw(st.booleans()),
        "negative": draw(st.sampled_from(["saturate", "nan"])),
    }
    if kind == "from_format":
        base = draw(
            st.sampled_from(
                [
                    an.E2M1,
                    an.E3M2,
                    an.E4M3FN,
                    an.E5M2,
                    an.E4M3FNUZ,
                    an.Posit(8, 1),
                    an.Posit(6, 0),
                    an.FixedPoint(3, 3),
                    an.format("p3109(8,3)u"),
                ]
            )
        )
        return _build(lambda: an.Table.from_format(base))
    if kind == "huge":
        n = draw(st.sampled_from([1 << 12, (1 << 16) - 3, 1 << 16]))
        lo = draw(st.floats(-1e3, 0.0))
        vals = np.linspace(lo, lo + draw(st.floats(1e-3, 1e6)), n)
        return _build(lambda: an.Table(vals, **opts))
    size = (1, 3) if kind == "tiny" else (1, 12)
    elem = st.one_of(
        st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.0, 1.0, -1.0, 0.5, 2.0**-40, 1e300])
    )
    vals = draw(st.lists(elem, min_size=size[0], max_size=size[1]))
    return _build(lambda: an.Table(vals, **opts))


SCALES = [
    an.E8M0,
    an.FloatFormat(4, 3, signed=False, specials="fn"),
    an.FloatFormat(5, 0, signed=False, bias=15, subnormals=False, zero=False, specials="fn"),
]


@st.composite
def blocks(draw: Any) -> an.Format:
    element = draw(
        st.sampled_from(
            [
                an.E2M1,
                an.E4M3FN,
                an.E5M2,
                an.E3M2,
                an.FixedPoint(2, 6),
                an.IntFormat(8),
                an.Posit(8, 1),
                an.FloatFormat(2, 1, specials="ieee"),
            ]
        )
    )
    rule = draw(st.sampled_from(SCALE_RULES))
    tensor_scale = draw(st.sampled_from([None, an.FP32])) if rule in ("amax", "none") else None
    return _build(
        lambda: an.Block(
            element,
            draw(st.sampled_from([None, 1, 2, 3, 5, 7, 16, 33])),
            axis=draw(st.sampled_from([-1, 0, 1, None])),
            scale=draw(st.sampled_from(SCALES)),
            scale_rule=rule,
            tensor_scale=tensor_scale,
            symmetric=draw(st.booleans()),
        )
    )


PRESETS = st.sampled_from(an.list_formats()).map(an.format)
ELEMENTWISE_PRESETS = st.sampled_from(
    [n for n in an.list_formats() if not isinstance(an.format(n), an.Block)]
)
ELEMENTWISE = st.one_of(
    ELEMENTWISE_PRESETS.map(an.format), float_formats(), posits(), uniform_formats(), tables()
)
#: Where the C loop and torch's casts apply: float formats (presets weigh in) on float32.
FAST_FLOATS = st.one_of(
    st.sampled_from([n for n in an.list_formats() if isinstance(an.format(n), an.FloatFormat)]).map(
        an.format
    ),
    float_formats(),
)
FORMATS = st.one_of(ELEMENTWISE, blocks())
MODES = st.sampled_from(list(Rounding))
#: Half-precision inputs are refused (RepresentabilityError) by most wide formats: drawn less often.
DTYPES = st.sampled_from(
    [torch.float64, torch.float64, torch.float32, torch.float32, torch.float16, torch.bfloat16]
)


@st.composite
def overflow_for(draw: Any, fmt: an.Format) -> str | None:
    return draw(st.sampled_from([None, *fmt.overflow_policies]))


# --- inputs ------------------------------------------------------------------------------------


def landmarks(fmt: an.Format) -> list[float]:
    """Values where rounding changes: the format's ends, tiny steps, and special values."""
    base = [
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        math.nan,
        1.0,
        -1.0,
        0.5,
        1.5,
        3.0,
        2.0**-149,
        5e-324,
        1e300,
        65504.0,
        65520.0,
        448.0,
        464.0,
        3.4028234663852886e38,
    ]
    if fmt is None:
        return base
    inner = fmt.element if isinstance(fmt, an.Block) else fmt
    for v in (inner.max, inner.smallest_subnormal, inner.smallest_normal):
        if math.isfinite(v) and v > 0:
            base += [v, -v, v * 1.5, v / 2, v * 2, v * (1 + 2**-20), v * (1 - 2**-20)]
    return base


@st.composite
def inputs(draw: Any, fmt: an.Format | None, max_size: int = 24) -> np.ndarray:
    """float64 values: landmarks, midpoints between grid neighbours, and any float."""
    marks = landmarks(fmt)
    anything = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
    moderate = st.floats(-1e6, 1e6)
    vals = draw(
        st.lists(st.one_of(st.sampled_from(marks), anything, moderate), min_size=0, max_size=max_size)
    )
    if fmt is not None and not isinstance(fmt, an.Block) and vals and draw(st.booleans()):
        vals += midpoints(fmt, np.asarray(vals, dtype=np.float64))
    return np.asarray(vals, dtype=np.float64)


def midpoints(fmt: an.Format, x: np.ndarray) -> list[float]:
    """The midpoints (and their float64 neighbours) between the grid neighbours of finite x."""
    x = x[np.isfinite(x)]
    if not x.size:
        return []
    t = torch.from_numpy(x)
    try:
        lo = an.quantize(t, fmt, "rd", overflow="saturate" if "saturate" in fmt.overflow_policies else None)
        hi = an.quantize(t, fmt, "ru", overflow="saturate" if "saturate" in fmt.overflow_policies else None)
    except AnynumError:
        return []
    lo, hi = lo.numpy(), hi.numpy()
    ok = np.isfinite(lo) & np.isfinite(hi) & (lo != hi)
    with np.errstate(over="ignore"):
        mid = lo[ok] / 2 + hi[ok] / 2
    return [*mid, *np.nextafter(mid, np.inf), *np.nextafter(mid, -np.inf)]


def as_tensor(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    with np.errstate(over="ignore"):
        return torch.from_numpy(values).to(dtype)


# --- the kernel routes: the router's list (anynum.kernels.route) -----------------------------------


@contextlib.contextmanager
def _compile_setting(value: str) -> Iterator[None]:
    """ANYNUM_COMPILE=value for a moment: kernels read it in `covers` (C kernels only when not "0")."""
    before = os.environ.get("ANYNUM_COMPILE")
    os.environ["ANYNUM_COMPILE"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ANYNUM_COMPILE", None)
        else:
            os.environ["ANYNUM_COMPILE"] = before


def kernel_routes(
    fmt: an.Format,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    *,
    compiled: bool,
) -> dict[str, Callable[[], torch.Tensor | None]]:
    """Every registered kernel that covers rounding `x` (whatever ANYNUM_COMPILE says), by name.

    Each entry runs that kernel alone (its size limits ignored) and returns its result, or
    None where it declines at run time (no C compiler). `compiled` keeps the compiled kernel
    (slow to build: callers use it on a fixed small set of formats).
    """
    call = route.Call(fmt, mode, overflow, rand_bits, x.dtype, x.device.type, route.random_kind(rng))
    with _compile_setting("auto"):
        covering = [k for k in route.kernels() if k.covers(call)]
    routes: dict[str, Callable[[], torch.Tensor | None]] = {}
    for kernel in covering:
        if kernel.name == "compiled" and not compiled:
            continue

        def run(kernel: route.Kernel = kernel) -> torch.Tensor | None:
            with _compile_setting("auto"), warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # a failed compile must not hide as eager
                return kernel.round(call, x.detach(), rng, None)

        routes[kernel.name] = run
    return routes


# --- checks ------------------------------------------------------------------------------------


def same(a: torch.Tensor, b: torch.Tensor, *, zero_sign: bool = True) -> bool:
    """Identical values: NaN where NaN, equal elsewhere, and (if `zero_sign`) the same sign of zero."""
    a64, b64 = a.detach().to(torch.float64).cpu(), b.detach().to(torch.float64).cpu()
    if a64.shape != b64.shape:
        return False
    nan_a, nan_b = torch.isnan(a64), torch.isnan(b64)
    ok = (nan_a == nan_b) & ((a64 == b64) | nan_a)
    if zero_sign:
        ok &= (torch.signbit(a64) == torch.signbit(b64)) | nan_a
    return bool(ok.all())


def diff(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, zero_sign: bool = True) -> str:
    """The first few elements where a and b differ (as `same` sees them), with their inputs."""
    a64, b64 = a.to(torch.float64).reshape(-1), b.to(torch.float64).reshape(-1)
    x64 = x.to(torch.float64).reshape(-1)
    ok = (a64 == b64) | (torch.isnan(a64) & torch.isnan(b64))
    if zero_sign:
        ok &= (torch.signbit(a64) == torch.signbit(b64)) | torch.isnan(a64)
    idx = torch.nonzero(~ok).reshape(-1)[:5].tolist()
    return "; ".join(f"x={float(x64[i])!r}: {float(a64[i])!r} vs {float(b64[i])!r}" for i in idx)


def rng_for(mode: Rounding, seed: int) -> RandomSource | None:
    return CounterRandom(seed) if mode.is_stochastic else None


def symmetric_values(fmt: an.Format) -> bool:
    """Whether -v is a value for every value v (and ties have no direction)."""
    if isinstance(fmt, an.Table):
        v = fmt.values()
        return (
            fmt.ties not in ("up", "down") and np.array_equal(np.sort(-v), v) and fmt.negative == "saturate"
        )
    if isinstance(fmt, an.Block):
        return symmetric_values(fmt.element) and fmt.element.signed
    if isinstance(fmt, (an.FixedPoint, an.IntFormat)):
        return False  # two's complement: -min has no partner (checked on |x| <= max instead)
    return fmt.signed


def exact_wrap(fmt: an.Format, mode: Rounding, x: float) -> float:
    """The exact result of rounding x onto fixed point/integers with wrap-around (deterministic modes)."""
    step = Fraction(2) ** fmt.step_exp
    f = Fraction(x) / step
    lo = math.floor(f)
    frac = f - lo
    half = Fraction(1, 2)
    up = {
        Rounding.NEAREST_EVEN: frac > half or (frac == half and lo % 2 == 1),
        Rounding.NEAREST_AWAY: frac > half or (frac == half and f > 0),
        Rounding.NEAREST_ZERO: frac > half or (frac == half and f < 0),
        Rounding.TOWARD_ZERO: frac > 0 and f < 0,
        Rounding.UP: frac > 0,
        Rounding.DOWN: False,
        Rounding.ODD: frac > 0 and lo % 2 == 0,
    }[mode]
    n = (lo + int(up)) % (1 << fmt.bits)
    if fmt.signed and n >= 1 << (fmt.bits - 1):
        n -= 1 << fmt.bits
    return float(n * step)
