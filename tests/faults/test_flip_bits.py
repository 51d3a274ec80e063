"""an.flip_bits against exact, independent decoders (tests/ops/reference.py), exhaustively where small.

Every flip of every code of e4m3fn, e5m2, posit(8,0), fixed(4,4) and of every MXFP8
scale code (and a sample of posit(16,1) codes) changes exactly the chosen bit and
decodes to the value an exact, fractions-based decoder gives for the flipped code.
Posit fields are checked against the 2022 standard's reading of the raw bits, done
by hand in the reference. Probabilities are checked with binomial tests at fixed
seeds (each with a false-alarm rate below 1e-6: |z| < 5).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "ops"))  # the exact decoders of the ops tests
from reference import decode_e8m0, decode_fixed, decode_float, decode_posit, posit_fields

import anynum as an
from anynum.errors import InputError, RepresentabilityError
from anynum.faults import field_masks
from anynum.formats.block import BlockCodes

Z = 5.0


def as_float(v) -> float:
    if v is None:
        return math.nan
    return float(v)


FLOATS = {
    "e4m3fn": (an.E4M3FN, lambda c: decode_float(c, 4, 3, 7, "fn")),
    "e5m2": (an.E5M2, lambda c: decode_float(c, 5, 2, 15, "ieee")),
    "posit(8,0)": (an.Posit(8, 0), lambda c: decode_posit(c, 8, 0)),
    "fixed(4,4)": (an.FixedPoint(4, 4), lambda c: decode_fixed(c, 4, 4)),
}


def start_codes(decode, width, sample=None, seed=0):
    """Codes with a value (NaN codes are not reachable from a value: tested apart)."""
    codes = range(1 << width) if sample is None else np.random.default_rng(seed).choice(1 << width, sample,
                                                                                          replace=False)
    return [int(c) for c in codes if decode(int(c)) is not None]


def value_of(decode, c, fmt):
    """The float value of code c; the zero with the sign bit set is -0 where the format has one."""
    v = as_float(decode(c))
    if v == 0 and c >> (fmt.bits - 1) and fmt.has_negative_zero:
        return -0.0
    return v


def check_every_flip(fmt, decode, codes):
    x = np.array([value_of(decode, c, fmt) for c in codes])
    for b in range(fmt.bits):
        v, m = an.flip_bits(x, fmt, bits=[b], count=1)
        assert m.dtype == np.int64 and (m == 1 << b).all(), (fmt, b)
        want = np.array([value_of(decode, c ^ (1 << b), fmt) for c in codes])
        same = ((v == want) & (np.signbit(v) == np.signbit(want))) | (np.isnan(v) & np.isnan(want))
        assert same.all(), (fmt, b, x[~same][:5], v[~same][:5], want[~same][:5])
    if fmt.has_nan:  # NaN goes to the format's NaN code; its flips decode as that code's neighbours
        nan_code = int(an.encode(np.array([math.nan]), fmt)[0])
        assert decode(nan_code) is None
        for b in range(fmt.bits):
            v, _ = an.flip_bits(np.array([math.nan]), fmt, bits=[b], count=1)
            want = value_of(decode, nan_code ^ (1 << b), fmt)
            assert (math.isnan(v[0]) and math.isnan(want)) or v[0] == want


@pytest.mark.parametrize("name", sorted(FLOATS))
def test_every_flip_of_every_code(name):
    fmt, decode = FLOATS[name]
    check_every_flip(fmt, decode, start_codes(decode, fmt.bits))


def test_posit16_sampled_codes():
    decode = lambda c: decode_posit(c, 16, 1)  # noqa: E731
    check_every_flip(an.Posit(16, 1), decode, start_codes(decode, 16, sample=1500, seed=1))


def test_every_flip_of_every_mxfp8_scale_code():
    """Blocks built from known element codes with a known scale code s; each scale bit flipped."""
    elem_codes = np.array([0x78, *range(0, 62, 2)])  # 0x78 = 256: the block max sets the scale
    elem_vals = np.array([as_float(decode_float(int(c), 4, 3, 7, "fn")) for c in elem_codes])
    scales = np.array([as_float(decode_e8m0(s)) for s in range(255)])
    x = elem_vals[None, :] * scales[:, None]  # row s: one block with scale code s
    for b in range(8):
        v, m = an.flip_bits(x, an.MXFP8_E4M3, field="scale", bits=[b], count=1)
        assert (m.scales == 1 << b).all() and not m.elements.any()
        new = np.array([as_float(decode_e8m0(s ^ (1 << b))) for s in range(255)])
        assert np.array_equal(v, elem_vals[None, :] * new[:, None], equal_nan=True), b


def test_mxfp8_element_flips():
    x = np.linspace(-3, 3, 64).reshape(2, 32)
    v, m = an.flip_bits(x, an.MXFP8_E4M3, field="element", count=1, seed=3)
    assert (np.bitwise_count(m.elements) == 1).all() and not m.scales.any()
    c = an.MXFP8_E4M3.encode(torch.from_numpy(x))
    flipped = BlockCodes(c.elements ^ torch.from_numpy(m.elements), c.scales, None)
    scale = np.array([as_float(decode_e8m0(int(s))) for s in c.scales.reshape(-1)])
    elems = np.array([as_float(decode_float(int(e), 4, 3, 7, "fn")) for e in flipped.elements.reshape(-1)])
    assert np.array_equal(v.reshape(-1), elems * np.repeat(scale, 32), equal_nan=True)
    _, m2 = an.flip_bits(x, an.MXFP8_E4M3, field="exponent", p=1.0)
    assert (m2.elements == 0x78).all()  # an element field of a block format


@pytest.mark.parametrize(("n", "es"), [(8, 0), (8, 2), (6, 1), (16, 1)])
def test_posit_field_masks_match_the_standard(n, es):
    codes = list(range(1 << n)) if n <= 8 else list(np.random.default_rng(2).choice(1 << n, 3000))
    t = torch.tensor(codes, dtype=torch.int64)
    fmt = an.Posit(n, es)
    for field in ("sign", "regime", "exponent", "fraction"):
        got = field_masks(t, fmt, field).tolist()
        want = [sum(1 << p for p in posit_fields(int(c), n, es)[field]) for c in codes]
        assert got == want, field
    all_bits = sum(field_masks(t, fmt, f) for f in ("sign", "regime", "exponent", "fraction"))
    assert (all_bits == (1 << n) - 1).all()  # the fields partition the word


def test_posit_fields_by_hand():
    """Worked examples (2022 standard: fields read from the raw bits, negative codes included)."""
    p81, p80 = an.Posit(8, 1), an.Posit(8, 0)
    # 0 1110 1 10: regime 1110 (bits 6..3), exponent bit 2, fraction bits 1..0
    c = torch.tensor([0b01110110])
    assert [field_masks(c, p81, f).item() for f in ("regime", "exponent", "fraction")] == [0x78, 0x04, 0x03]
    # -1.5 in posit(8,0) is 0b10110000: sign, regime 01 (bits 6..5), fraction bits 4..0
    c = torch.tensor([0b10110000])
    assert [field_masks(c, p80, f).item() for f in ("regime", "exponent", "fraction")] == [0x60, 0, 0x1F]
    assert float(decode_posit(0b10110000, 8, 0)) == -1.5
    # maxpos 0b01111111: the regime fills the word
    assert field_masks(torch.tensor([0x7F]), p81, "regime").item() == 0x7F


def test_static_fields():
    x = torch.linspace(-2, 2, 100)
    for fmt, field, mask in [(an.E4M3FN, "sign", 0x80), (an.E4M3FN, "exponent", 0x78),
                             (an.E4M3FN, "mantissa", 7),
                             (an.E5M2, "exponent", 0x7C), (an.E5M2, "significand", 3),
                             (an.FixedPoint(4, 4), "integer", 0xF0), (an.FixedPoint(4, 4), "fraction", 0x0F),
                             (an.FixedPoint(4, 4), "sign", 0x80), (an.IntFormat(8), "integer", 0xFF)]:
        _, m = an.flip_bits(x, fmt, field=field, p=1.0)
        assert (m == mask).all(), (fmt, field)


def test_p_is_honoured_per_bit():
    n, p = 40000, 0.03
    _, m = an.flip_bits(np.zeros(n), an.E4M3FN, p=p, seed=0)
    bits = (m[:, None] >> np.arange(8)) & 1
    sd = math.sqrt(n * p * (1 - p))
    for b in range(8):
        assert abs(bits[:, b].sum() - n * p) < Z * sd, b
    both = (bits[:, 1] & bits[:, 6]).sum()  # independence: P(both) = p**2
    assert abs(both - n * p * p) < Z * math.sqrt(n * p * p)
    _, m = an.flip_bits(np.zeros(n), an.E4M3FN, p=p, field="exponent", seed=1)
    assert not (m & ~0x78).any()
    assert abs(np.bitwise_count(m).sum() - 4 * n * p) < Z * math.sqrt(4 * n * p * (1 - p))


def test_count_is_exact_and_uniform():
    n = 20000
    x = np.random.default_rng(0).standard_normal(n)
    _, m = an.flip_bits(x, an.E5M2, count=3, seed=4)
    assert (np.bitwise_count(m) == 3).all()
    per_bit = ((m[:, None] >> np.arange(8)) & 1).sum(axis=0)
    sd = math.sqrt(n * (3 / 8) * (5 / 8))
    assert (abs(per_bit - n * 3 / 8) < Z * sd).all()
    # maxpos has no fraction bits: count=2 of the fraction field flips nothing there
    _, m = an.flip_bits(np.array([1.0, 2.0**24]), an.Posit(8, 2), field="fraction", count=2, seed=1)
    assert np.bitwise_count(m).tolist() == [2, 0]


def test_kinds_and_dtypes():
    x = np.array([0.5, -1.5, 3.0], dtype=np.float32)
    v, m = an.flip_bits(x, "e4m3fn", count=1, seed=5)
    assert isinstance(v, np.ndarray) and v.dtype == np.float32 and m.dtype == np.int64
    vt, mt = an.flip_bits(torch.from_numpy(x), "e4m3fn", count=1, seed=5)
    assert isinstance(vt, torch.Tensor) and vt.dtype == torch.float32 and mt.dtype == torch.int64
    vj, mj = an.flip_bits(jnp.asarray(x), "e4m3fn", count=1, seed=5)
    assert isinstance(vj, jax.Array) and vj.dtype == jnp.float32
    assert np.array_equal(v, vt.numpy()) and np.array_equal(v, np.asarray(vj))
    assert np.array_equal(m, mt.numpy()) and np.array_equal(m, np.asarray(mj))
    vb, _ = an.flip_bits(torch.ones(4, dtype=torch.bfloat16), "e4m3fn", count=1, seed=0)
    assert vb.dtype == torch.bfloat16
    s, sm = an.flip_bits(0.5, "e4m3fn", bits=[7], count=1)
    assert float(s) == -0.5 and int(sm) == 128


def test_reproducible_by_seed_and_generator():
    x = torch.randn(1000)
    a = an.flip_bits(x, "bf16", p=0.01, seed=3)[1]
    assert torch.equal(a, an.flip_bits(x, "bf16", p=0.01, seed=3)[1])
    assert not torch.equal(a, an.flip_bits(x, "bf16", p=0.01, seed=4)[1])
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(an.flip_bits(x, "bf16", p=0.01, generator=g1)[1],
                       an.flip_bits(x, "bf16", p=0.01, generator=g2)[1])
    k = jax.random.key(1)
    assert np.array_equal(np.asarray(an.flip_bits(jnp.asarray(x.numpy()), "bf16", p=0.01, generator=k)[1]),
                          np.asarray(an.flip_bits(jnp.asarray(x.numpy()), "bf16", p=0.01, generator=k)[1]))


def test_bad_arguments():
    x = torch.ones(3)
    for kwargs, match in [
        ({}, "exactly one of"), ({"p": 0.1, "count": 1}, "exactly one of"), ({"p": 1.5}, "probability"),
        ({"count": -1}, "non-negative"), ({"p": 0.1, "field": "regime"}, "not a field"),
        ({"p": 0.1, "bits": [8]}, "positions 0..7"), ({"p": 0.1, "bits": [1], "field": "sign"}, "not both"),
    ]:
        with pytest.raises(InputError, match=match):
            an.flip_bits(x, "e4m3fn", **kwargs)
    with pytest.raises(InputError, match="no 'significand' bits"):
        an.flip_bits(x, an.E8M0, p=0.1, field="significand")
    with pytest.raises(InputError, match="no 'sign' bits"):
        an.flip_bits(x, an.FixedPoint(4, 4, signed=False), p=0.1, field="sign")
    with pytest.raises(RepresentabilityError):  # 511 fits FixedPoint(10, 0), not bfloat16
        an.flip_bits(torch.full((64,), 300.0, dtype=torch.bfloat16), an.FixedPoint(10, 0), bits=[0], count=1)
    import dask.array as da

    with pytest.raises(InputError, match="Dask"):
        an.flip_bits(da.ones(3), "e4m3fn", p=0.1)
