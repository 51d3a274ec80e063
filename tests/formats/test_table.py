"""Table(values): normalisation and errors, tie policies, all nine rounding modes, saturation,
underflow and infinity options, custom boundaries, codes, the log-format factory, dtypes,
O(log size) lookup, and Table.from_format reproducing formats exactly."""

from __future__ import annotations

import math
import pickle
import time
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import FormatError, RepresentabilityError
from anynum.rounding import RandomSource, Rounding

MODES = [m.value for m in Rounding]
DETERMINISTIC = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]
f64 = torch.float64

pytestmark = pytest.mark.usefixtures("eager_only", "one_thread")



def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=f64)


def q(x, table, mode="nearest", **kw):
    return an.quantize(t(*x) if isinstance(x, (list, tuple)) else x, table, mode, **kw).tolist()


# --- construction ----------------------------------------------------------------------------------


def test_normalisation():
    a = an.Table([3.0, -1.0, 0.5, 1.0, 1.0, -0.0, 0.0])
    assert a.values().tolist() == [-1.0, 0.0, 0.5, 1.0, 3.0]
    assert not np.signbit(a.values()[1])  # -0.0 is read as 0.0
    assert a == an.Table(np.array([0, 3, 1, -1, 0.5])) == an.Table(torch.tensor([1.0, 3.0, -1.0, 0.0, 0.5]))
    assert hash(a) == hash(an.Table((0.5, 1, 3, -1, 0)))
    assert an.Table(np.array([3, 1, 2], dtype=np.int8)).values().tolist() == [1.0, 2.0, 3.0]
    v = a.values()
    v[0] = 99.0  # values() is a copy
    assert a.values()[0] == -1.0


@pytest.mark.parametrize(
    "values,match",
    [
        ([], "at least one value"),
        (np.array([]), "at least one value"),
        ([1.0, float("nan")], "finite"),
        ([1.0, float("inf")], "finite"),
        ([[1.0, 2.0], [3.0, 4.0]], "1-D"),
        (5.0, "1-D"),
        (["a", "b"], "real numbers"),
        ([1 + 2j], "real numbers"),
        ([True, False], "real numbers"),
        ([2**60 + 1], "exactly representable"),
        ([[1.0], [2.0, 3.0]], "1-D sequence"),
    ],
)
def test_bad_values_raise(values, match):
    with pytest.raises(FormatError, match=match):
        an.Table(values)


def test_bad_options_raise():
    with pytest.raises(FormatError, match="ties"):
        an.Table([1.0, 2.0], ties="nearest")
    with pytest.raises(FormatError, match="underflow"):
        an.Table([1.0, 2.0], underflow="minpos")
    with pytest.raises(FormatError, match="infinity"):
        an.Table([1.0, 2.0], infinity="inf")
    with pytest.raises(FormatError, match="one value between"):
        an.Table([1.0, 2.0, 3.0], boundaries=[1.5])
    with pytest.raises(FormatError, match="strictly between"):
        an.Table([1.0, 2.0, 3.0], boundaries=[1.5, 3.0])
    with pytest.raises(FormatError):
        an.quantize(t(1.0), an.Table([1.0, 2.0]), overflow="inf")


def test_properties_and_repr():
    a = an.Table([-2.0, -0.25, 0.0, 1.0, 1.5, 8.0])
    assert a.bits == 3 and len(a) == a.size == 6
    assert a.max == 8.0 and a.min == -2.0
    assert a.smallest_normal == a.smallest_subnormal == 0.25
    assert a.eps == 0.5 and a.emin == -2 and a.emax == 3 and a.signed
    assert not a.has_nan and not a.has_inf and a.default_overflow == "saturate"
    assert a.info.max == 8.0
    assert math.isnan(an.Table([0.5, 2.0]).eps)
    assert an.Table([5.0]).bits == 1 and an.Table(range(1024)).bits == 10 and an.Table(range(1025)).bits == 11
    assert repr(an.Table([2.0, 1.0])) == "Table([1.0, 2.0])"
    assert repr(an.Table([2.0, 1.0], ties="even")) == "Table([1.0, 2.0], ties='even')"
    assert "<100 values" in repr(an.Table(range(100)))
    assert repr(an.Table.from_format(an.E2M1)) == "table(e2m1)"


def test_equality_pickle_and_aliases():
    a = an.Table([1.0, 2.0, 4.0], ties="even_index")
    assert a.ties == "even" and a == an.Table([4.0, 2.0, 1.0], ties="even")
    assert a != an.Table([1.0, 2.0, 4.0])
    assert an.Table([1.0, 2.0], ties="larger_magnitude").ties == "away"
    for tab in (a, an.Table.from_format(an.Posit(6, 1)), an.Table.log(2, 2)):
        back = pickle.loads(pickle.dumps(tab))
        assert back == tab and hash(back) == hash(tab)
        x = torch.linspace(-10, 10, 301, dtype=f64)
        assert torch.equal(an.quantize(x, back), an.quantize(x, tab))
    # the boundaries equal to the midpoints are the default: the same table
    assert an.Table([1.0, 2.0, 4.0], boundaries=[1.5, 3.0]) == an.Table([1.0, 2.0, 4.0])


# --- rounding ------------------------------------------------------------------------------------


def test_nearest_and_ties():
    tab = [-3.0, -1.0, 0.0, 1.0, 2.0, 6.0]
    x = [1.5, -0.5, 4.0, 0.5, -2.0, 1.25, 5.0]
    assert q(x, an.Table(tab)) == [1.0, 0.0, 2.0, 0.0, -1.0, 1.0, 6.0]  # smaller magnitude (default)
    assert q(x, an.Table(tab, ties="away")) == [2.0, -1.0, 6.0, 1.0, -3.0, 1.0, 6.0]
    assert q(x, an.Table(tab, ties="down")) == [1.0, -1.0, 2.0, 0.0, -3.0, 1.0, 6.0]
    assert q(x, an.Table(tab, ties="up")) == [2.0, 0.0, 6.0, 1.0, -1.0, 1.0, 6.0]
    # even rank: rank counts from the first non-negative entry (0.0 has rank 0)
    assert q(x, an.Table(tab, ties="even")) == [2.0, 0.0, 2.0, 0.0, -3.0, 1.0, 6.0]
    # rna / rnz ignore the table's policy
    for ties in ("smaller_magnitude", "away", "even", "down", "up"):
        assert q(x, an.Table(tab, ties=ties), "rna") == [2.0, -1.0, 6.0, 1.0, -3.0, 1.0, 6.0]
        assert q(x, an.Table(tab, ties=ties), "rnz") == [1.0, 0.0, 2.0, 0.0, -1.0, 1.0, 6.0]


def test_tie_between_opposite_values_follows_the_sign_of_zero():
    sym = [-1.0, 1.0]
    for ties in ("smaller_magnitude", "away"):
        assert q([0.0, -0.0], an.Table(sym, ties=ties)) == [1.0, -1.0]
    assert q([0.0, -0.0], an.Table(sym), "rz") == [1.0, -1.0]
    assert q([0.0, -0.0], an.Table(sym, ties="down")) == [-1.0, -1.0]


def test_midpoints_are_exact():
    """Boundaries are exact rationals: the float64 neighbours of a midpoint never tie."""
    a, b = 1.0, 1.0 + 2**-52  # midpoint 1 + 2**-53 is not a float64
    tab = an.Table([a, b])
    assert q([1.0 + 2**-52], tab) == [b]
    lo, hi = 0.1, 0.3  # midpoint 0.2 is not exactly 0.1/2 + 0.3/2 in float
    tab = an.Table([lo, hi])
    m = Fraction(lo) / 2 + Fraction(hi) / 2
    xs = np.array([0.2, np.nextafter(0.2, 0), np.nextafter(0.2, 1)])
    want = [lo if Fraction(x) < m else hi for x in xs]
    assert q(xs.tolist(), tab) == want
    big = an.Table([-1.7e308, 1.7e308, 1.79e308])  # lo + hi overflows: the midpoint is still exact
    m = (Fraction(1.7e308) + Fraction(1.79e308)) / 2
    near_m = [float(m), np.nextafter(float(m), 0), np.nextafter(float(m), np.inf)]
    want = [1.7e308 if Fraction(v) < m else 1.79e308 for v in near_m]
    assert q([0.0, 1e-300, -1e-300, *near_m], big) == [1.7e308, 1.7e308, -1.7e308, *want]
    tiny = an.Table([5e-324, 1.5e-323])  # midpoint 1e-323 is a float64, a tie
    assert q([1e-323], tiny) == [5e-324] and q([1e-323], tiny, "rna") == [1.5e-323]


def test_directed_and_odd_modes():
    tab = an.Table([-4.0, -2.0, 0.5, 1.0, 3.0])
    x = [2.0, -3.0, 0.0, -1.0, 0.75]
    assert q(x, tab, "ru") == [3.0, -2.0, 0.5, 0.5, 1.0]
    assert q(x, tab, "rd") == [1.0, -4.0, -2.0, -2.0, 0.5]
    # rz: the neighbour on the side of zero; across the gap that straddles zero the one of x's
    # sign (-2.0 for -1.0, 0.5 for +0.0), so that RZ is monotone and keeps signs (found by the
    # fuzzer: the old rule gave RZ(-1.0) = 0.5, RZ(0.0) = 0.5 (the nearer) and RZ(0.25) = -2.0)
    assert q(x, tab, "rz") == [1.0, -2.0, 0.5, -2.0, 0.5]
    assert q([-0.0, -1e-300, 1e-300], tab, "rz") == [-2.0, -2.0, 0.5]
    # ro: odd rank (ranks: -4 -> -2, -2 -> -1, 0.5 -> 0, 1 -> 1, 3 -> 2)
    assert q(x, tab, "ro") == [1.0, -2.0, -2.0, -2.0, 1.0]
    exact = [-4.0, -2.0, 0.5, 1.0, 3.0]
    for mode in MODES:
        assert q(exact, tab, mode, seed=0) == exact


@pytest.mark.parametrize("mode", MODES)
def test_saturation_and_specials_in_every_mode(mode):
    tab = an.Table([-1.0, 0.0, 2.0])
    x = [10.0, -10.0, float("inf"), -float("inf"), 1e308, float("nan")]
    y = q(x, tab, mode, seed=1)
    assert y[:5] == [2.0, -1.0, 2.0, -1.0, 2.0] and math.isnan(y[5])
    y = q(x, an.Table([-1.0, 0.0, 2.0], infinity="nan"), mode, seed=1)
    assert y[0] == 2.0 and y[1] == -1.0 and all(math.isnan(v) for v in y[2:4])


def test_underflow_saturate():
    tab = an.Table([-2.0, -0.5, 0.0, 0.25, 4.0], underflow="saturate")
    for mode in MODES:
        assert q([0.01, -0.01, 0.0, -0.0], tab, mode, seed=2) == [0.25, -0.5, 0.0, 0.0]
    assert q([0.01, -0.01], an.Table([-2.0, -0.5, 0.0, 0.25, 4.0])) == [0.0, 0.0]
    one_sided = an.Table([0.0, 1.0], underflow="saturate")  # no negative entry: 0 is the only choice
    assert q([-0.3, 0.3], one_sided) == [0.0, 1.0]


def test_single_value_table():
    tab = an.Table([3.0])
    for mode in MODES:
        y = q([-5.0, 3.0, 1e300, float("nan")], tab, mode, seed=0)
        assert y[:3] == [3.0, 3.0, 3.0] and math.isnan(y[3])
    assert an.encode(t(7.0), tab).tolist() == [0]


def test_custom_boundaries():
    tab = an.Table([1.0, 4.0, 16.0], boundaries=[2.0, 8.0], ties="up")  # geometric
    assert q([1.9, 2.0, 2.1, 7.9, 8.0, 3.0], tab) == [1.0, 4.0, 4.0, 4.0, 16.0, 4.0]
    assert q([2.0], tab, "rnz") == [1.0]


# --- stochastic ----------------------------------------------------------------------------------


def test_stochastic_linear_in_value():
    tab = an.Table([-3.0, 0.0, 1.0, 10.0, 11.0])
    x = t(0.25, 4.0, 10.9, -1.0).repeat(20000)
    y = an.quantize(x, tab, "sr", seed=3).view(20000, 4)
    p = (y == t(1.0, 10.0, 11.0, 0.0)).double().mean(0)
    want = t(0.25, 3.0 / 9.0, 0.9, 2.0 / 3.0)
    assert torch.all(torch.abs(p - want) < 5 * torch.sqrt(want * (1 - want) / 20000))
    assert torch.all(torch.abs(y.mean(0) - t(0.25, 4.0, 10.9, -1.0)) < 0.1)
    assert torch.equal(y, an.quantize(x, tab, "sr", seed=3).view(20000, 4))


class _Injected(RandomSource):
    def __init__(self, bits: np.ndarray, nbits: int):
        self.bits = torch.from_numpy(bits.astype(np.int64))
        self.nbits = nbits

    def bits_at(self, index, nbits, stream):
        assert nbits == self.nbits and stream == 0
        return self.bits[index.cpu()].to(index.device)


def test_stochastic_rand_bits_truncates_the_probability():
    """rand_bits=r: up iff floor(p * 2**r) + R >= 2**r, p = (x - lo)/(hi - lo)."""
    tab = an.Table([0.0, 1.0, 4.0])
    x = np.array([0.3, 0.3, 0.3, 2.5, 2.5, 2.5, 0.75, 0.75])
    R = np.array([0, 4, 5, 0, 3, 4, 1, 2])
    r = 3  # p = 0.3 -> floor(2.4) = 2: up iff R >= 6; p = 0.5 -> 4: up iff R >= 4; 0.75 -> 6
    y = an.quantize(torch.from_numpy(x), tab, "sr", rand_bits=r, generator=_Injected(R, r)).tolist()
    assert y == [0.0, 0.0, 0.0, 1.0, 1.0, 4.0, 0.0, 1.0]


def test_stochastic_uniform():
    tab = an.Table([0.0, 1.0])
    y = an.quantize(t(0.01).repeat(20000), tab, "sr_uniform", seed=5)
    assert abs(y.mean().item() - 0.5) < 5 * math.sqrt(0.25 / 20000)


# --- codes -----------------------------------------------------------------------------------------


def test_codes_are_indices():
    tab = an.Table([-1.0, 0.5, 1.0, 3.0, 7.0])
    assert tab.bits == 3
    assert an.encode(t(0.9, 2.9, -100.0, 100.0), tab).tolist() == [2, 3, 0, 4]
    assert an.decode(np.arange(8), tab)[:5].tolist() == [-1.0, 0.5, 1.0, 3.0, 7.0]
    assert np.isnan(an.decode(np.arange(8), tab)[5:]).all()  # unused codes
    with pytest.raises(FormatError, match="no NaN code"):
        an.encode(t(float("nan")), tab)
    assert an.encode(t(-1.0), an.Table.from_format(an.E2M1)).tolist() == [5]


# --- from_format -------------------------------------------------------------------------------------


def _probes(fmt: an.Format, seed: int = 0) -> torch.Tensor:
    v = fmt.values()
    mids = v[:-1] + (v[1:] - v[:-1]) / 2
    rng = np.random.default_rng(seed)
    pts = np.concatenate(
        [
            v,
            mids,
            np.nextafter(mids, np.inf),
            np.nextafter(mids, -np.inf),
            np.nextafter(v, np.inf),
            np.nextafter(v, -np.inf),
            rng.uniform(v[0] * 1.5, v[-1] * 1.5, 20000),
            rng.standard_normal(20000) * np.exp2(rng.integers(-40, 40, 20000)),
            [0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, 5e-324, float("nan")],
        ]
    )
    return torch.from_numpy(pts)


FROM_FORMATS = [
    an.E4M3FN,
    an.E2M1,
    an.Posit(8, 0),
    an.FixedPoint(4, 3),
    # beyond the list
    an.Posit(8, 2),
    an.Posit(6, 1, underflow="zero"),
    an.Posit(9, 3, scale_exp=4),
    an.E5M2,
    an.E3M2,
    an.FixedPoint(3, 2, signed=False),
    an.IntFormat(5),
]


@pytest.mark.parametrize("fmt", FROM_FORMATS, ids=repr)
def test_from_format_rounds_identically(fmt, same_values):
    """Every deterministic mode, at every value, midpoint (boundary), float64 neighbour, random
    points, zeros, out-of-range values and NaN: the table and the format (overflow="saturate")
    give the same values, and ±0 results are both zero."""
    tab = an.Table.from_format(fmt)
    x = _probes(fmt)
    for mode in DETERMINISTIC:
        want = an.quantize(x, fmt, mode, overflow="saturate")
        got = an.quantize(x, tab, mode)
        same_values(got, want, x, what=f"{fmt!r} {mode}", check_sign=False)
        codes = an.encode(x[~torch.isnan(x)], tab, mode)
        assert torch.equal(an.decode(codes, tab), want[~torch.isnan(x)] + 0.0)


def test_from_format_specials():
    """±inf: formats that saturate saturate in the table too; posits give NaR, and so does their table."""
    x = t(float("inf"), -float("inf"))
    for fmt in (an.E4M3FN, an.E2M1, an.FixedPoint(4, 3)):
        assert q(x, an.Table.from_format(fmt)) == an.quantize(x, fmt).tolist()
    assert all(math.isnan(v) for v in q(x, an.Table.from_format(an.Posit(8, 0))))
    assert all(math.isnan(v) for v in an.quantize(x, an.Posit(8, 0)).tolist())


def test_from_format_tie_rule_is_even_code():
    """Why ties="even" (even rank) and not the plain index: E2M1 has 7 negative values, so plain
    index parity is the opposite of code parity; rank parity is the code's parity."""
    tab = an.Table.from_format(an.E2M1)
    assert tab.ties == "even"
    x = t(2.5, 5.0, 0.25, 0.75, 1.25, -2.5, -0.25)
    assert q(x, tab) == an.quantize(x, an.E2M1).tolist() == [2.0, 4.0, 0.0, 1.0, 1.0, -2.0, -0.0]
    plain_index = an.Table(an.E2M1.values(), ties="down")  # not the format's rule
    assert q(x, plain_index) != an.quantize(x, an.E2M1).tolist()
    assert an.Table.from_format("posit(8,0)").underflow == "saturate"
    assert an.Table.from_format(an.Posit(8, 0, underflow="zero")).underflow == "zero"


def test_from_format_needs_enumerable_format():
    with pytest.raises(FormatError):
        an.Table.from_format(an.FP32)


@pytest.mark.parametrize("fmt", [an.FloatFormat(3, 2, subnormals=False, specials="none"), an.E8M0])
def test_from_format_refuses_what_it_cannot_reproduce(fmt):
    """Formats whose ties follow the significand rather than the code (flushed subnormals: the
    zero codes collapse; no fraction bits: ties go to the larger power of two) raise, unless
    ties= is given explicitly."""
    with pytest.raises(FormatError, match="no table tie policy"):
        an.Table.from_format(fmt)
    tab = an.Table.from_format(fmt, ties="away")
    assert np.array_equal(tab.values(), fmt.values())


# --- the log format ------------------------------------------------------------------------------------


def test_log_format_values():
    mpmath = pytest.importorskip("mpmath")
    tab = an.Table.log(3, 2)  # t in {-4, -3.75, ..., 3.75}: 32 exponents, 64 values, 6 bits
    v = tab.values()
    assert len(v) == 64 and tab.bits == 6 and 0.0 not in v
    pos = v[v > 0]
    mpmath.mp.prec = 200
    for j, val in enumerate(pos):
        exact = mpmath.power(2, mpmath.mpf(j - 16) / 4)
        assert val == float(exact), j  # correctly rounded (mpmath's float() rounds to nearest)
    assert np.array_equal(v[:32], -pos[::-1])
    assert an.Table.log(3, 2, zero=True).values().tolist() == sorted([*v.tolist(), 0.0])
    assert tab.name == "log(3,2)"


def test_log_format_rounds_to_nearest_entry():
    tab = an.Table.log(2, 1)
    v = tab.values()
    x = torch.from_numpy(np.random.default_rng(6).uniform(-3, 3, 5000))
    y = an.quantize(x, tab).numpy()
    dist = np.abs(x.numpy()[:, None] - v[None, :])
    assert np.all(np.abs(y - x.numpy()) == dist.min(axis=1))


@pytest.mark.parametrize("args", [(0, 2), (11, 0), (4, 13), (2, -1), (2.0, 1), (True, 1)])
def test_log_format_bad_arguments(args):
    with pytest.raises(FormatError):
        an.Table.log(*args)


# --- dtypes, scale, speed ------------------------------------------------------------------------------


def test_dtypes():
    tab = an.Table.from_format(an.E4M3FN)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.tensor([0.3, -7.7, 1000.0], dtype=dt)
        y = an.quantize(x, tab)
        assert y.dtype == dt and torch.equal(y, an.quantize(x, an.E4M3FN))
    with pytest.raises(RepresentabilityError):
        an.quantize(torch.tensor([1.0], dtype=torch.float32), an.Table([0.1, 0.2]))
    with pytest.raises(RepresentabilityError):
        an.quantize(torch.tensor([1.0], dtype=torch.float16), an.Table([1.0, 70000.0]))
    assert an.quantize(np.array([0.14, 0.16]), an.Table([0.1, 0.2])).tolist() == [0.1, 0.2]
    x = torch.tensor([0.12], dtype=f64, requires_grad=True)
    an.quantize(x, an.Table([0.1, 0.2])).sum().backward()
    assert x.grad.tolist() == [1.0]


def _best_time(fn, repeats=5):
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def test_large_table_costs_log_size():
    """A 65,536-entry table: binary search, so it costs a small factor over a 16-entry one
    (a linear scan would cost 4096 times as much)."""
    big = an.Table(np.sort(np.random.default_rng(7).standard_normal(65536)))
    small = an.Table(np.linspace(-3, 3, 16))
    assert len(big) == 65536 and big.bits == 16
    x = torch.from_numpy(np.random.default_rng(8).standard_normal(100_000))
    an.quantize(x, big), an.quantize(x, small)  # warm up
    ratio = _best_time(lambda: an.quantize(x, big)) / _best_time(lambda: an.quantize(x, small))
    assert ratio < 30, ratio
    y = an.quantize(x[:300], big).numpy()
    v = big.values()
    nearest = v[np.abs(x[:300].numpy()[:, None] - v[None, :]).argmin(axis=1)]
    assert np.array_equal(y, nearest)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["nearest"])
def test_compiled_path_matches_eager(mode):
    from anynum.kernels import fused_round, round_to_format
    from anynum.rounding import CounterRandom

    tab = an.Table.from_format(an.Posit(7, 1))
    rng = CounterRandom(9) if mode == "sr" else None
    x = torch.from_numpy(np.random.default_rng(9).standard_normal(5003) * 30)
    x = torch.cat([x, t(0.0, float("nan"), float("inf"), -1e300)])
    m = Rounding.parse(mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fast = fused_round(tab, x, m, "saturate", rng, None)
    ref = round_to_format(tab, x, m, "saturate", rng, None)
    assert torch.equal(fast.nan_to_num(7.0), ref.nan_to_num(7.0))


_SR_FORMATS = [an.E4M3FN, an.E2M1, an.Posit(8, 0), an.FixedPoint(4, 3), an.Posit(8, 2)]


@pytest.mark.parametrize("fmt", _SR_FORMATS, ids=repr)
@pytest.mark.parametrize("mode,rand_bits", [("sr", None), ("sr", 3), ("sr_uniform", None)])
def test_from_format_stochastic_bit_for_bit(fmt, mode, rand_bits):
    """With the same seed the table draws exactly like the format (both decide on the magnitude;
    the probability is the same exact ratio). Posits with rand_bits draw on the bit string, so
    they are compared only where the grid is uniform (fraction bits cut)."""
    tab = an.Table.from_format(fmt)
    x = torch.from_numpy(np.random.default_rng(10).standard_normal(20000) * 4)
    if isinstance(fmt, an.Posit) and rand_bits is not None and fmt.es > 0:
        x = x[(x.abs() > 1 / 16) & (x.abs() < 16)]  # posit(8,2): fraction bits kept here
    a = an.quantize(x, tab, mode, seed=11, rand_bits=rand_bits)
    b = an.quantize(x, fmt, mode, seed=11, rand_bits=rand_bits, overflow="saturate")
    assert torch.equal(a, b + 0.0)
