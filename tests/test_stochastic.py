"""Stochastic rounding: unbiased within statistical bounds, hardware-style rand_bits equal to
gfloat's StochasticFastest on the same random bits, reproducible, and thread-count independent.

Statistical checks draw N samples of SR(x) in one call; the number of round-ups
is Binomial(N, p) with p = (x - lo) / (hi - lo), and must lie within 5 standard
deviations of N p (a fixed seed makes each check deterministic; a correct
implementation fails with probability below 1e-6 per check).
"""

from __future__ import annotations

import functools
import math

import gfloat
import numpy as np
import pytest
import torch

import anynum as an
from anynum.rounding import RandomSource

pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.usefixtures("eager_only"),
]

N = 20000


@functools.cache
def _grid(fmt) -> np.ndarray:
    return fmt.values()


def _neighbours(fmt, x: float) -> tuple[float, float]:
    v = _grid(fmt)
    j = np.searchsorted(v, x)
    return float(v[j - 1]), float(v[j])


def _points(fmt) -> list[float]:
    """Several x per format: mid-range, near max, in the subnormal range, negative, at a binade edge."""
    v = _grid(fmt)
    pos = v[v > 0]
    mx, prev = pos[-1], pos[-2]
    sub = pos[0]
    pts = [
        prev + 0.3 * (mx - prev),  # just below max
        prev + 0.9 * (mx - prev),
        0.3 * sub if fmt.zero else sub + 0.3 * (pos[1] - sub),  # lowest interval
        sub + 0.7 * (pos[1] - sub),
        1.0 + 0.1 * fmt.eps,  # far from a tie
        2.0 - 0.25 * fmt.eps,  # top of a binade
        1.0 + 0.5 * fmt.eps,  # a tie: p = 1/2
    ]
    if fmt.signed:
        pts += [-p for p in pts[:4]]
    return [float(p) for p in pts]


def _check_binomial(count: int, n: int, p: float, what: str) -> None:
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= 5 * sd + 1e-9, f"{what}: {count} ups of {n}, expected {n * p:.1f} ± {sd:.1f}"


SR_FORMATS = [an.E4M3FN, an.E5M2, an.E2M1, an.E3M2, an.BF16, an.FP16,
              an.FloatFormat(4, 3, subnormals=False), an.formats.p3109(8, 3)]


@pytest.mark.parametrize("fmt", SR_FORMATS, ids=str)
def test_sr_is_unbiased(fmt):
    pts = _points(fmt)
    x = torch.tensor(pts, dtype=torch.float64)[:, None].expand(-1, N)
    y = an.quantize(x, fmt, "sr", seed=1234).numpy()
    for i, xi in enumerate(pts):
        lo, hi = _neighbours(fmt, xi)
        assert np.isin(y[i], [lo, hi]).all(), (fmt, xi, np.unique(y[i]))
        p = (xi - lo) / (hi - lo)  # exact enough: well inside float64 precision
        _check_binomial(int((y[i] == hi).sum()), N, p, f"{fmt} x={xi}")
        # the sample mean is within 5 standard errors of x itself
        se = (hi - lo) * math.sqrt(p * (1 - p) / N)
        assert abs(y[i].mean() - xi) <= 5 * se + 1e-300


@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E2M1, an.BF16], ids=str)
@pytest.mark.parametrize("rand_bits", [1, 2, 3, 8])
def test_sr_rand_bits_probability(fmt, rand_bits):
    """Hardware style: P(away from zero) = floor(f * 2**r) / 2**r, f the magnitude's fraction."""
    pts = _points(fmt)
    x = torch.tensor(pts, dtype=torch.float64)[:, None].expand(-1, N)
    y = an.quantize(x, fmt, "sr", seed=99, rand_bits=rand_bits).numpy()
    for i, xi in enumerate(pts):
        lo, hi = _neighbours(fmt, abs(xi)) if xi > 0 else _neighbours(fmt, -xi)
        f = (abs(xi) - lo) / (hi - lo)
        p = math.floor(f * 2**rand_bits) / 2**rand_bits
        away = int((np.abs(y[i]) == hi).sum())
        if p in (0.0, 1.0):
            assert away == (N if p == 1.0 else 0), (fmt, xi, rand_bits)
        else:
            _check_binomial(away, N, p, f"{fmt} x={xi} r={rand_bits}")


@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E2M1, an.FP16], ids=str)
def test_sr_uniform_is_a_fair_coin(fmt):
    pts = _points(fmt)
    x = torch.tensor(pts, dtype=torch.float64)[:, None].expand(-1, N)
    y = an.quantize(x, fmt, "sr_uniform", seed=7).numpy()
    for i, xi in enumerate(pts):
        _, hi = _neighbours(fmt, xi)
        _check_binomial(int((y[i] == hi).sum()), N, 0.5, f"{fmt} x={xi}")


def test_exact_values_never_move():
    for fmt in [f for f in SR_FORMATS if f.bits <= 8]:
        v = torch.from_numpy(fmt.values())
        for kw in ({}, {"rand_bits": 1}, {"rand_bits": 20}):
            np.testing.assert_array_equal(an.quantize(v, fmt, "sr", seed=3, **kw), v)
        np.testing.assert_array_equal(an.quantize(v, fmt, "sr_uniform", seed=3), v)


# --- rand_bits against gfloat's StochasticFastest, same random bits ---------------------------


class Injected(RandomSource):
    def __init__(self, bits: np.ndarray, nbits: int):
        self.bits = torch.from_numpy(bits.astype(np.int64))
        self.nbits = nbits

    def bits_at(self, index, nbits, stream):
        assert (nbits, stream) == (self.nbits, 0)
        return self.bits[index]


def _gfloat_info(fmt):
    high, dom, nz = {"ieee": ((1 << fmt.man_bits) - 1, gfloat.Domain.Extended, True),
                     "fn": (1, gfloat.Domain.Finite, True),
                     "fnuz": (0, gfloat.Domain.Finite, False),
                     "none": (0, gfloat.Domain.Finite, True)}[fmt.specials]
    return gfloat.FormatInfo(repr(fmt), k=fmt.bits, precision=fmt.man_bits + 1, bias=fmt.bias,
                             is_signed=True, domain=dom, has_nz=nz, num_high_nans=high,
                             has_subnormals=True, is_twos_complement=False)


@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E5M2, an.E4M3FNUZ, an.E2M1, an.BF16,
                                 an.FloatFormat(5, 2, bias=10)], ids=str)
@pytest.mark.parametrize("rand_bits", [1, 3, 8, 13])
def test_rand_bits_matches_gfloat_stochastic_fastest(fmt, rand_bits, probe_points, random_values,
                                                     same_values):
    fi = _gfloat_info(fmt)
    v = fmt.values()
    x = np.concatenate([
        probe_points(v, top_step=2.0 ** (math.floor(math.log2(fmt.max)) - fmt.man_bits))["float64"],
        random_values(3000, np.float64, seed=rand_bits, lo_exp=-30, hi_exp=20),
    ])
    # gfloat adds delta + R * 2**-r in float64, which rounds (and may round up to 1) when the
    # fraction has bits below 2**-53: only below the smallest subnormal. test_float_exact.py
    # checks that range against exact arithmetic.
    x = x[~(np.abs(x) < fmt.smallest_subnormal) | (x == 0)]
    if x.size > 30000:  # 16-bit formats: a sample of the probe points
        x = np.random.default_rng(0).choice(x, 30000, replace=False)
    x = np.repeat(x, 3)  # several random draws per point
    bits = np.random.default_rng(rand_bits).integers(0, 1 << rand_bits, x.size)
    policies = [(True, "saturate")]
    if fmt.has_nan:
        policies.append((False, "inf" if fmt.has_inf else "nan"))
    for sat, overflow in policies:
        want = gfloat.round_ndarray(fi, x, gfloat.RoundMode.StochasticFastest, sat, bits, rand_bits)
        got = an.quantize(torch.from_numpy(x), fmt, "sr", overflow=overflow,
                          generator=Injected(bits, rand_bits), rand_bits=rand_bits)
        same_values(got.numpy(), want, x, what=f"{fmt} r={rand_bits} {overflow}")


# --- reproducibility ---------------------------------------------------------------------------


def _x(n=4096, dtype=torch.float32):
    return torch.linspace(-3, 3, n, dtype=torch.float64).to(dtype) * 1.0001


@pytest.mark.parametrize("mode", ["sr", "sr_uniform"])
def test_same_seed_same_bits(mode):
    x = _x()
    kw = {"rand_bits": 5} if mode == "sr" else {}
    a = an.quantize(x, an.E4M3FN, mode, seed=11, **kw)
    b = an.quantize(x, an.E4M3FN, mode, seed=11, **kw)
    c = an.quantize(x, an.E4M3FN, mode, seed=12, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # torch and NumPy generators: same state, same result; the state advances between calls
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    r1 = an.quantize(x, an.E4M3FN, mode, generator=g1)
    assert torch.equal(r1, an.quantize(x, an.E4M3FN, mode, generator=g2))
    assert not torch.equal(r1, an.quantize(x, an.E4M3FN, mode, generator=g1))
    n1, n2 = np.random.default_rng(8), np.random.default_rng(8)
    xn = x.numpy()
    np.testing.assert_array_equal(an.quantize(xn, an.E4M3FN, mode, generator=n1),
                                  an.quantize(xn, an.E4M3FN, mode, generator=n2))


def test_same_bits_whatever_the_dtype_container():
    """The random stream is addressed by element, not by dtype: float32 and float64 copies agree."""
    x = _x()
    a = an.quantize(x, an.E4M3FN, "sr", seed=4)
    b = an.quantize(x.double(), an.E4M3FN, "sr", seed=4)
    assert torch.equal(a.double(), b)


def test_independent_of_thread_count():
    x = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    try:
        out = []
        for n in (1, 2):
            torch.set_num_threads(n)
            out.append((an.quantize(x, an.E4M3FN, "sr", seed=21),
                        an.quantize(x, an.BF16, "sr", seed=21, rand_bits=9),
                        an.quantize(x, an.E2M1, "sr_uniform", seed=21)))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)


def test_injected_exact_sr_compares_u_with_f():
    """With rand_bits=None, SR goes up iff u < f, u = k * 2**-53 (+ later chunks)."""

    class Fixed(RandomSource):
        def __init__(self, k):
            self.k = torch.tensor(k, dtype=torch.int64)

        def bits_at(self, index, nbits, stream):
            assert nbits == 53
            return self.k[index] if stream == 0 else torch.zeros_like(index)

    # x = 1 + f * eps for E4M3FN (eps = 1/8): f = 0.25 exactly
    x = torch.tensor([1.03125] * 3, dtype=torch.float64)
    k = [2**51 - 1, 2**51, 2**51 + 1]  # u just below f, at f, above f
    y = an.quantize(x, an.E4M3FN, "sr", generator=Fixed(k))
    assert y.tolist() == [1.125, 1.0, 1.0]
