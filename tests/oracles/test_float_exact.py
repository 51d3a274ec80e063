"""An exact rational (fractions.Fraction) reference for every rounding mode and overflow policy.

The reference builds the format's value set from its parameters (exponent and
fraction widths, bias, subnormals, which codes are special, sign, zero) and
rounds by comparing exact rationals, following the rules of DESIGN.md §2:

* nearest modes pick the closer neighbour; ties go to the neighbour that is an
  even multiple of the gap between the two (the even significand; for
  man_bits=0 that is the larger power of two), away from zero, or toward zero;
* ODD picks the neighbour that is an odd multiple of the gap;
* directed modes pick the neighbour on their side;
* above the top, the grid continues with one more step of the top binade
  (unbounded exponent), and a result past ``max`` overflows: "saturate" gives
  ±max; "inf"/"nan" give ±inf/NaN for nearest and stochastic modes, the IEEE 754
  direction rule for up/down, and ±max for toward-zero and odd;
* formats without zero give their smallest value for anything below it;
  unsigned formats give NaN for negative inputs; -0 survives where the format has it;
* stochastic modes are checked with injected random bits (a RandomSource
  subclass). Every stochastic decision is taken on the magnitude (so with the
  same bits SR(-x) = -SR(x)): exact SR rounds away from zero iff u < f, u being
  the 53-bit chunks read as a binary fraction and f the fraction of |x|/step;
  ``rand_bits=r`` rounds away iff floor(f * 2**r) + R >= 2**r; "sr_uniform"
  rounds away iff the coin is 1.

Used for the cases the other oracles get wrong (ODD, E8M0, unsigned and
no-zero formats, ``subnormals=False``, custom biases, precision-1 ties) and on
every small preset as a second opinion.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from fractions import Fraction

import numpy as np
import pytest
import torch

import anynum as an
from anynum.rounding import RandomSource

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

CHUNK = 53
NSTREAMS = 6


# --- the reference -----------------------------------------------------------------------------


def ref_positive_values(fmt: an.FloatFormat) -> list[Fraction]:
    """Every finite value >= 0 of `fmt`, from its layout (codes with the sign bit clear)."""
    E, M, b = fmt.exp_bits, fmt.man_bits, fmt.bias
    nmag = 1 << (E + M)
    if fmt.specials == "ieee":
        special = set(range(((1 << E) - 1) << M, nmag))
    elif fmt.specials == "fn":
        special = {nmag - 1}
    elif fmt.specials == "p3109":
        special = {nmag - 1} if fmt.signed else {nmag - 1, nmag - 2}
    else:  # "fnuz" (only the negative-zero code is special) and "none"
        special = set()
    vals = set()
    for m in range(nmag):
        if m in special:
            continue
        e, f = m >> M, m & ((1 << M) - 1)
        if e == 0 and fmt.zero:
            v = Fraction(f, 1 << M) * Fraction(2) ** (1 - b) if fmt.subnormals else Fraction(0)
        else:
            v = (1 + Fraction(f, 1 << M)) * Fraction(2) ** (e - b)
        vals.add(v)
    return sorted(vals)


def ref_has_negative_zero(fmt) -> bool:
    return fmt.signed and fmt.zero and fmt.specials not in ("fnuz", "p3109")


class Reference:
    """Exact rounding onto one format; `locate` once per input, then any mode cheaply."""

    def __init__(self, fmt: an.FloatFormat):
        self.fmt = fmt
        self.P = ref_positive_values(fmt)
        self.Pf = [float(p) for p in self.P]  # exact: every value is a float64
        self.max = self.P[-1]
        self.top = self.max + Fraction(2) ** (math.floor(math.log2(self.max)) - fmt.man_bits)

    def locate(self, xs: np.ndarray) -> dict[str, np.ndarray]:
        """Neighbours of |x| (lo <= |x| <= hi), the exact position d = (|x| - lo) / (hi - lo), flags."""
        n = xs.size
        lo = np.zeros(n)
        hi = np.zeros(n)
        d = [Fraction(0)] * n
        lo_even = np.zeros(n, bool)  # lo is an even multiple of the gap
        kind = np.zeros(n, dtype="U5")  # nan, inf, neg (unsigned < 0), below, over, exact, mid
        for i, x in enumerate(xs.tolist()):
            if math.isnan(x):
                kind[i] = "nan"
                continue
            if not self.fmt.signed and x < 0:
                kind[i] = "neg"
                continue
            a = abs(x)
            if math.isinf(a):
                kind[i] = "inf"
                continue
            A = Fraction(a)
            j = bisect_left(self.Pf, a)
            if j < len(self.P) and self.Pf[j] == a:
                kind[i], lo[i], hi[i] = "exact", a, a
            elif j == 0:  # no zero and below the smallest value
                kind[i] = "below"
            elif A >= self.top:
                kind[i] = "over"
            else:
                L = self.P[j - 1]
                H = self.P[j] if j < len(self.P) else self.top
                gap = H - L
                q = L / gap
                assert q.denominator == 1, (self.fmt, x)  # the grid is aligned to its gaps
                kind[i], lo[i], hi[i] = "mid", float(L), float(H)
                d[i] = (A - L) / gap
                lo_even[i] = q.numerator % 2 == 0
        return {"x": xs, "lo": lo, "hi": hi, "d": d, "lo_even": lo_even, "kind": kind}

    def round(self, loc, mode: str, overflow: str, rand=None, rand_bits=None) -> np.ndarray:
        """Exact results (float64) for located inputs; `rand` holds the injected bits per element."""
        x, lo, hi, d, kind = loc["x"], loc["lo"], loc["hi"], loc["d"], loc["kind"]
        neg = np.signbit(x) & self.fmt.signed
        mid = kind == "mid"
        half = Fraction(1, 2)
        lt = np.array([di < half for di in d])
        tie = np.array([di == half for di in d])
        # which neighbour, in magnitude: True = hi (away from zero)
        if mode == "nearest":
            away = ~lt & ~(tie & loc["lo_even"])
        elif mode == "rna":
            away = ~lt
        elif mode == "rnz":
            away = ~lt & ~tie
        elif mode == "rz":
            away = np.zeros(x.shape, bool)
        elif mode == "ru":
            away = ~neg
        elif mode == "rd":
            away = neg.copy()
        elif mode == "ro":
            away = loc["lo_even"].copy()
        elif mode == "sr" and rand_bits is None:
            u = [sum(Fraction(int(rand[s][i]), 1 << (CHUNK * (s + 1))) for s in range(NSTREAMS))
                 for i in range(x.size)]
            # away from zero iff u < d, d the fraction of the scaled magnitude
            away = np.array([u[i] < d[i] for i in range(x.size)])
        elif mode == "sr":
            r = rand_bits
            fl = np.array([math.floor(di * (1 << r)) for di in d], dtype=np.int64)
            away = fl + rand[0] >= (1 << r)
        elif mode == "sr_uniform":
            away = rand[0].astype(bool)
        else:
            raise AssertionError(mode)
        mag = np.where(mid & away, hi, lo)
        over = (kind == "over") | (mid & away & (hi > float(self.max)))
        mag = np.where(kind == "below", self.Pf[0], mag)
        # overflow
        vmax = float(self.max)
        if overflow == "saturate":
            to_beyond = np.zeros(x.shape, bool)
        elif mode in ("rz", "ro"):
            to_beyond = np.zeros(x.shape, bool)
        elif mode == "ru":
            to_beyond = ~neg
        elif mode == "rd":
            to_beyond = neg.copy()
        else:
            to_beyond = np.ones(x.shape, bool)
        beyond = np.inf if overflow == "inf" else np.nan
        mag = np.where(over, np.where(to_beyond, beyond, vmax), mag)
        inf_in = kind == "inf"
        mag = np.where(inf_in, {"saturate": vmax, "inf": np.inf, "nan": np.nan}[overflow], mag)
        out = np.where(neg, -mag, mag)
        if not ref_has_negative_zero(self.fmt):
            out = np.where(out == 0, 0.0, out)
        out = np.where((kind == "nan") | (kind == "neg"), np.nan, out)
        return out


# --- injected randomness -----------------------------------------------------------------------


class Injected(RandomSource):
    """Known bits per element and stream: what stochastic rounding reads, we also read."""

    def __init__(self, tables: dict[int, np.ndarray], nbits: int):
        self.tables = {s: torch.from_numpy(np.asarray(t, dtype=np.int64)) for s, t in tables.items()}
        self.nbits = nbits
        self.calls: list[tuple[int, int]] = []

    def bits_at(self, index, nbits, stream):
        assert nbits == self.nbits, (nbits, self.nbits)
        self.calls.append((nbits, stream))
        return self.tables[stream][index.cpu()].to(index.device)


def _sr_tables(loc, seed: int) -> dict[int, np.ndarray]:
    """53-bit chunks: random, except that a third of the elements tie f in the first chunk
    (and then land just below, on, or just above f in the second), to exercise refinement."""
    rng = np.random.default_rng(seed)
    n = loc["x"].size
    tabs = {s: rng.integers(0, 1 << CHUNK, n, dtype=np.int64) for s in range(NSTREAMS)}
    for i in range(n):
        if loc["kind"][i] != "mid" or i % 3:
            continue
        f = loc["d"][i]
        t = f * (1 << CHUNK)
        c0 = math.floor(t)
        c1 = math.floor((t - c0) * (1 << CHUNK))
        tabs[0][i] = c0
        tabs[1][i] = min(max(c1 + (i // 3) % 3 - 1, 0), (1 << CHUNK) - 1)
    return tabs


# --- formats and inputs -----------------------------------------------------------------------

FORMATS = {
    "e8m0": an.E8M0,
    "e5m2": an.E5M2,
    "e4m3fn": an.E4M3FN,
    "e4m3fnuz": an.E4M3FNUZ,
    "e5m2fnuz": an.E5M2FNUZ,
    "e4m3": an.E4M3,
    "e3m4": an.E3M4,
    "e3m2": an.E3M2,
    "e2m3": an.E2M3,
    "e2m1": an.E2M1,
    "e3m0": an.FloatFormat(3, 0),
    "e4m3_nosub": an.FloatFormat(4, 3, subnormals=False),
    "e5m2fn_nosub": an.FloatFormat(5, 2, subnormals=False, specials="fn"),
    "e3m2none_nosub": an.FloatFormat(3, 2, subnormals=False, specials="none"),
    "e4m3_bias3": an.FloatFormat(4, 3, bias=3),
    "e3m3none_bias0": an.FloatFormat(3, 3, bias=0, specials="none"),
    "e4m2fnuz_bias12": an.FloatFormat(4, 2, bias=12, specials="fnuz"),
    "e4m2u_fn": an.FloatFormat(4, 2, signed=False, specials="fn"),
    "e4m2u_nozero": an.FloatFormat(4, 2, bias=5, subnormals=False, zero=False, signed=False,
                                   specials="fn"),
    "p3109(8,1)": an.formats.p3109(8, 1),
    "p3109(8,3)": an.formats.p3109(8, 3),
    "p3109(8,1)u": an.formats.p3109(8, 1, signed=False),
    "p3109(8,3)u": an.formats.p3109(8, 3, signed=False),
    "p3109(8,4)uf": an.formats.p3109(8, 4, signed=False, domain="finite"),
    "p3109(5,2)f": an.formats.p3109(5, 2, domain="finite"),
}


def _policies(fmt):
    out = ["saturate"]
    if fmt.has_inf:
        out.append("inf")
    if fmt.has_nan:
        out.append("nan")
    return out


def _inputs(fmt, ref: Reference, probe_points, random_values, dtype) -> np.ndarray:
    grid = np.array(ref.Pf)
    top = float(ref.top - ref.max)
    pts = probe_points(grid, top_step=top)[np.dtype(dtype).name]
    lo_e = math.floor(math.log2(ref.Pf[1] if ref.Pf[0] == 0 else ref.Pf[0])) - 3
    hi_e = math.floor(math.log2(ref.Pf[-1])) + 3
    rnd = random_values(600, dtype, seed=fmt.bits * 7 + fmt.man_bits, lo_exp=lo_e, hi_exp=hi_e)
    tiny = np.array([2.0**-149, 2.0**-140, -(2.0**-149), 2.0**-1074, -(2.0**-1074)])
    x = np.concatenate([pts, rnd, tiny.astype(dtype)]).astype(dtype)
    return x[np.isfinite(x) | np.isnan(x) | np.isinf(x)]


DET_MODES = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]


def _fits32(fmt, ref) -> bool:
    return ref.Pf[-1] < 2.0**127 and min(p for p in ref.Pf if p > 0) >= 2.0**-149


@pytest.mark.parametrize(
    "name", list(FORMATS)
)
def test_deterministic_modes_exact(name, probe_points, random_values, same_values):
    fmt = FORMATS[name]
    ref = Reference(fmt)
    dtypes = [np.float64] + ([np.float32] if _fits32(fmt, ref) else [])
    for dt in dtypes:
        x = _inputs(fmt, ref, probe_points, random_values, dt)
        loc = ref.locate(x.astype(np.float64))
        xt = torch.from_numpy(x)
        for mode in DET_MODES:
            for overflow in _policies(fmt):
                want = ref.round(loc, mode, overflow)
                got = an.quantize(xt, fmt, mode, overflow=overflow)
                same_values(got.double().numpy(), want, x,
                             what=f"{fmt} {mode} overflow={overflow} {np.dtype(dt).name}")


SR_NAMES = ["e4m3fn", "e8m0", "e3m2", "e4m3_nosub", "p3109(8,3)u", "p3109(8,1)", "e4m2u_nozero",
            "e5m2"]
SR_VARIANTS = ["sr", "sr_bits1", "sr_bits4", "sr_bits13", "sr_uniform"]


@pytest.mark.parametrize(
    ("variant", "name"),
    [(v, n)
     for n in SR_NAMES for v in SR_VARIANTS],
)
def test_stochastic_modes_exact_with_injected_bits(name, variant, probe_points, random_values,
                                                   same_values):
    fmt = FORMATS[name]
    ref = Reference(fmt)
    x = _inputs(fmt, ref, probe_points, random_values, np.float64)
    # values with fraction bits far below the format's step (where f = s - floor(s) needs care)
    extra = np.array(ref.Pf[1:6] + ref.Pf[-3:]) * (1 + 2.0**-45)
    extra = np.concatenate([extra, ref.Pf[1] * np.array([2.0**-60, 1 - 2.0**-52, 0.5 + 2.0**-50])])
    x = np.concatenate([x, extra, -extra])
    loc = ref.locate(x)
    n = x.size
    rand_bits = None
    if variant == "sr":
        tables, nbits = _sr_tables(loc, seed=5), CHUNK
    elif variant == "sr_uniform":
        tables, nbits = {0: np.random.default_rng(6).integers(0, 2, n)}, 1
    else:
        rand_bits = int(variant.removeprefix("sr_bits"))
        tables, nbits = {0: np.random.default_rng(7).integers(0, 1 << rand_bits, n)}, rand_bits
    mode = "sr_uniform" if variant == "sr_uniform" else "sr"
    for overflow in _policies(fmt):
        src = Injected(tables, nbits)
        got = an.quantize(torch.from_numpy(x), fmt, mode, overflow=overflow, generator=src,
                          rand_bits=rand_bits)
        assert src.calls, "the injected RandomSource was not used"
        want = ref.round(loc, mode, overflow, rand=tables, rand_bits=rand_bits)
        same_values(got.numpy(), want, x, what=f"{fmt} {variant} overflow={overflow}")


def test_reference_value_sets_match_ml_dtypes():
    """The reference's enumerator agrees with ml_dtypes on the formats both know."""
    import ml_dtypes

    for mltype, fmt in [(ml_dtypes.float8_e4m3fn, an.E4M3FN), (ml_dtypes.float8_e8m0fnu, an.E8M0),
                        (ml_dtypes.float6_e3m2fn, an.E3M2), (ml_dtypes.float8_e5m2fnuz, an.E5M2FNUZ)]:
        v = np.arange(256, dtype=np.uint8)[: 1 << fmt.bits].view(mltype).astype(np.float64)
        v = np.unique(np.abs(v[np.isfinite(v)]))
        assert [Fraction(t) for t in v] == ref_positive_values(fmt)


def test_values_match_reference_for_every_format():
    """values() (our enumeration) is the reference value set with its negatives."""
    for fmt in FORMATS.values():
        P = np.array([float(p) for p in ref_positive_values(fmt)])
        want = np.unique(np.concatenate([P, -P])) if fmt.signed else P
        np.testing.assert_array_equal(fmt.values(), want, err_msg=str(fmt))


@pytest.mark.parametrize(
    ("fmt", "x", "mode", "want"),
    [
        # E8M0 (man_bits=0): ties between 2**e and 2**(e+1) go to the even significand, i.e. up;
        # gfloat goes to the even code instead (3.0 -> 2.0 since code(2) = 128 is even).
        (an.E8M0, 3.0, "nearest", 4.0),
        (an.E8M0, 6.0, "nearest", 8.0),
        (an.E8M0, 0.75, "nearest", 1.0),
        # no zero: 0 and tiny values give the smallest value (ml_dtypes: NaN / 2**-126)
        (an.E8M0, 0.0, "nearest", 2.0**-127),
        (an.E8M0, 0.0, "rd", 2.0**-127),
        (an.E8M0, 1.2 * 2.0**-127, "nearest", 2.0**-127),
        (an.E8M0, 1.6 * 2.0**-127, "nearest", 2.0**-126),
        (an.E8M0, 2.0**-200, "rz", 2.0**-127),
        # saturating by default (no inf code): ml_dtypes gives NaN
        (an.E8M0, math.inf, "nearest", 2.0**127),
        (an.E8M0, 1.5 * 2.0**127, "nearest", 2.0**127),
        # unsigned: negatives give NaN (gfloat passes them through; torch's e8m0 cast drops the sign)
        (an.E8M0, -1.0, "nearest", math.nan),
        (an.E8M0, -0.0, "nearest", 2.0**-127),
        (an.formats.p3109(8, 3, signed=False), -1.0, "rz", math.nan),
        (an.formats.p3109(8, 3, signed=False), -0.0, "rz", 0.0),
        # precision-1 P3109: ties go up, to the even significand
        (an.formats.p3109(8, 1), 3.0, "nearest", 4.0),
        # round to odd keeps exact values and picks the odd neighbour otherwise
        (an.E4M3FN, 1.0, "ro", 1.0),
        (an.E4M3FN, 1.01, "ro", 1.125),
        (an.E4M3FN, 1.2, "ro", 1.125),
        (an.E4M3FN, -1.01, "ro", -1.125),
        (an.E4M3FN, 500.0, "ro", 448.0),
        # subnormals=False: the gap below the smallest normal is one step, ties go to zero
        (an.FloatFormat(4, 3, subnormals=False), 2.0**-7, "nearest", 0.0),
        (an.FloatFormat(4, 3, subnormals=False), 2.0**-7 * 1.01, "nearest", 2.0**-6),
        (an.FloatFormat(4, 3, subnormals=False), 2.0**-7, "rna", 2.0**-6),
        (an.FloatFormat(4, 3, subnormals=False), 2.0**-9, "ru", 2.0**-6),
        (an.FloatFormat(4, 3, subnormals=False), -(2.0**-9), "ru", -0.0),
    ],
)
def test_documented_cases(fmt, x, mode, want):
    got = an.quantize(torch.tensor([x], dtype=torch.float64), fmt, mode).item()
    if math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (got, want)
