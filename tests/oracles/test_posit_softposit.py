"""Bit-exact agreement with SoftPosit, the reference C implementation of the Posit Standard.

SoftPosit's types (the `softposit` package): ``posit8`` is posit(8,0), ``posit16``
posit(16,1), ``posit32`` posit(32,2), and ``posit_2`` is posit(n,2) for widths
3..32 (bits left-aligned in 32). Its float64 -> posit conversions round to
nearest, ties to even, never to 0 or NaR, as anynum's default does; NaN and
±inf become NaR. (Beware the names: anynum's "posit8"/"posit16" are the 2022
standard's es=2 formats, SoftPosit's posit8/posit16 are es=0/es=1.)

Checked, by comparing codes: every float16 and every bfloat16 bit pattern
(inf and NaN included) for all 33 configurations; random float32 and float64
values (2*10**4 per configuration in the quick test, 10**6 in the slow one);
and decode() of every code (every 32-bit code is sampled) against SoftPosit's
posit -> float64 conversion. SoftPosit costs about 1 µs per call, so the slow
test (33 * 10**6 calls) takes about 30 s.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an

sp = pytest.importorskip("softposit")

pytestmark = pytest.mark.usefixtures("eager_only", "one_thread")

CONFIGS = [(8, 0), (16, 1), (32, 2)] + [(n, 2) for n in range(3, 33)]
IDS = ["sp.posit8", "sp.posit16", "sp.posit32"] + [f"sp.posit_2({n})" for n in range(3, 33)]



def softposit_codes(x: np.ndarray, n: int, es: int) -> np.ndarray:
    """SoftPosit's n-bit codes of float64 values (right-aligned, as anynum's)."""
    vals = np.asarray(x, dtype=np.float64).tolist()
    if (n, es) == (8, 0):
        f8 = sp.convertDoubleToP8
        out = [f8(v).v for v in vals]
    elif (n, es) == (16, 1):
        f16 = sp.convertDoubleToP16
        out = [f16(v).v for v in vals]
    elif (n, es) == (32, 2):
        f32 = sp.convertDoubleToP32
        out = [f32(v).v for v in vals]
    else:
        assert es == 2
        fx = sp.convertDoubleToPX2
        shift = 32 - n
        out = [fx(v, n).v >> shift for v in vals]
    return np.array(out, dtype=np.int64)


def softposit_decode(codes: np.ndarray, n: int, es: int) -> np.ndarray:
    """SoftPosit's float64 values of n-bit codes; NaR (+inf or NaN there) is mapped to NaN."""
    if (n, es) == (8, 0):
        t8, d8 = sp.posit8_t(), sp.convertP8ToDouble
        def one(c):
            t8.v = c
            return d8(t8)
    elif (n, es) == (16, 1):
        t16, d16 = sp.posit16_t(), sp.convertP16ToDouble
        def one(c):
            t16.v = c
            return d16(t16)
    elif (n, es) == (32, 2):
        t32, d32 = sp.posit32_t(), sp.convertP32ToDouble
        def one(c):
            t32.v = c
            return d32(t32)
    else:
        tx, dx, shift = sp.posit_2_t(), sp.convertPX2ToDouble, 32 - n
        def one(c):
            tx.v = c << shift
            return dx(tx)
    out = np.array([one(int(c)) for c in codes], dtype=np.float64)
    out[np.asarray(codes) == 1 << (n - 1)] = np.nan
    return out


def check_codes(x: np.ndarray, n: int, es: int, what: str) -> None:
    x = np.asarray(x, dtype=np.float64)
    want = softposit_codes(x, n, es)
    got = an.encode(torch.from_numpy(x), an.Posit(n, es)).numpy()
    bad = np.flatnonzero(want != got)
    if bad.size:
        rows = "\n".join(f"  x={x[i]!r}: softposit {want[i]:#x}, anynum {got[i]:#x}" for i in bad[:10])
        raise AssertionError(f"posit({n},{es}) {what}: {bad.size} of {x.size} codes differ:\n{rows}")
    # quantize() returns the value of that code
    vals = an.quantize(torch.from_numpy(x), an.Posit(n, es)).numpy()
    np.testing.assert_array_equal(vals, an.decode(want, an.Posit(n, es)))


def check_codes_float32(x: np.ndarray, n: int, es: int, what: str) -> None:
    """As `check_codes`, with float32 tensors in (the float32 kernel path where the posit fits)."""
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        want = softposit_codes(x32.astype(np.float64), n, es)
    fmt = an.Posit(n, es)
    got = an.encode(torch.from_numpy(x32), fmt).numpy()
    bad = np.flatnonzero(want != got)
    assert not bad.size, f"posit({n},{es}) float32 {what}: {bad.size} codes differ, e.g. x={x32[bad[0]]!r}"
    if fmt.fits_float32():  # otherwise maxpos is not a float32 and quantize() rightly refuses
        vals = an.quantize(torch.from_numpy(x32), fmt).numpy()
        np.testing.assert_array_equal(vals, an.decode(want, fmt).astype(np.float32))


def all_patterns(dtype: torch.dtype) -> np.ndarray:
    return torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype).to(torch.float64).numpy()


@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_every_float16_pattern(n, es):
    check_codes(all_patterns(torch.float16), n, es, "float16 patterns")


@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_every_bfloat16_pattern(n, es):
    check_codes(all_patterns(torch.bfloat16), n, es, "bfloat16 patterns")


def random_inputs(n: int, es: int, count: int, seed: int) -> np.ndarray:
    """Half float32, half float64: log-uniform over the posit range and 8 binades past each end
    (every significand bit random), plus raw random float32 bit patterns."""
    rng = np.random.default_rng(seed)
    top = (n - 2) << es
    half = count // 2
    e32 = rng.integers(max(-top - 8, -149), min(top + 9, 128), half - half // 4)  # float32's range
    f32 = np.ldexp(1.0 + rng.random(e32.size), e32).astype(np.float32)
    raw32 = rng.integers(0, 1 << 32, half // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    e64 = rng.integers(-top - 8, top + 9, count - half)
    sig64 = (rng.integers(0, 1 << 52, e64.size, dtype=np.int64) | (1 << 52)).astype(np.float64)
    f64 = np.ldexp(sig64, e64 - 52)
    with np.errstate(over="ignore", invalid="ignore"):  # rounding to float32; signalling NaN patterns
        x = np.concatenate([f32.astype(np.float64), raw32.astype(np.float64), f64])
    return np.where(rng.random(x.size) < 0.5, -x, x)


@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_float32_inputs(n, es):
    """float32 tensors: every float16 pattern, random float32 values and raw float32 bit patterns."""
    x = np.concatenate([all_patterns(torch.float16), random_inputs(n, es, 20_000, seed=7 * n)])
    raw = np.random.default_rng(n).integers(0, 1 << 32, 20_000, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([x.astype(np.float32), raw.view(np.float32)])
    check_codes_float32(x, n, es, "float16 patterns, random and raw float32")


@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_random_values_quick(n, es):
    check_codes(random_inputs(n, es, 20_000, seed=n), n, es, "random float32/float64")


@pytest.mark.slow
@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_random_values_million(n, es):
    """10**6 random float32/float64 values per configuration (about 1 s each)."""
    check_codes(random_inputs(n, es, 1_000_000, seed=1000 + n), n, es, "10**6 random values")


@pytest.mark.parametrize("n,es", CONFIGS, ids=IDS)
def test_decode_every_code(n, es):
    codes = np.arange(1 << n) if n <= 16 else np.unique(
        np.concatenate([np.arange(256), (1 << n) - 1 - np.arange(256), (1 << (n - 1)) + np.arange(-128, 128),
                        np.random.default_rng(n).integers(0, 1 << n, 50_000)])
    )
    want = softposit_decode(codes, n, es)
    got = an.decode(codes, an.Posit(n, es))
    np.testing.assert_array_equal(got, want)


def test_documented_example_agrees():
    """SoftPosit agrees with the geometric-midpoint example of docs/posits.md."""
    assert float(sp.posit_2(144179.2, 8)) == 262144.0
    assert float(sp.posit_2(131072.0, 8)) == 65536.0
