"""Posit(n, es): configuration, names, properties, codes, special values, every rounding mode,
scale_exp, underflow, dtypes, autograd and the compiled path. The exhaustive comparisons
against exact rationals and SoftPosit are in tests/oracles/test_posit_*.py."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import anynum as an
from anynum.errors import FormatError, InputError, RepresentabilityError
from anynum.rounding import Rounding

MODES = [m.value for m in Rounding]
DETERMINISTIC = ["nearest", "rna", "rnz", "rz", "ru", "rd", "ro"]
f64 = torch.float64

pytestmark = pytest.mark.usefixtures("eager_only", "one_thread")



def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=f64)


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((1, 0), {}),
        ((0, 0), {}),
        ((40, 2), {}),
        ((33, 2), {}),
        ((8, -1), {}),
        ((8, 10), {}),
        ((4, 9), {}),  # (n-2) * 2**es = 1024: maxpos = 2**1024 is not a float64
        ((32, 6), {}),
        ((8, 2.0), {}),
        ((8.0, 2), {}),
        ((True, 2), {}),
        ((8, 2), {"underflow": "flush"}),
        ((8, 2), {"scale_exp": 1000}),
        ((8, 2), {"scale_exp": -1000}),
        ((8, 2), {"scale_exp": 0.5}),
    ],
)
def test_bad_configurations_raise(args, kwargs):
    with pytest.raises(FormatError):
        an.Posit(*args, **kwargs)
    with pytest.raises(an.AnynumError):  # the public base class
        an.Posit(*args, **kwargs)


def test_no_configuration_kills_the_interpreter():
    """Qtorch+ crashes for n > 16; every (n, es) here either works or raises AnynumError."""
    code = (
        "import anynum as an, torch\n"
        "x = torch.tensor([0.3, -7.0, 1e30, 1e-30], dtype=torch.float64)\n"
        "ok = 0\n"
        "for n in range(-2, 70):\n"
        "    for es in range(-1, 14):\n"
        "        try:\n"
        "            p = an.Posit(n, es)\n"
        "        except an.AnynumError:\n"
        "            continue\n"
        "        an.quantize(x, p); an.encode(x, p, 'rz'); ok += 1\n"
        "print(ok)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    expected = sum(1 for n in range(2, 33) for es in range(10) if (n - 2) << es <= 1022)
    assert int(out.stdout.strip()) == expected


@pytest.mark.parametrize("n,es", [(2, 0), (2, 9), (3, 9), (32, 5), (12, 6), (32, 0), (5, 7)])
def test_extreme_valid_configurations(n, es):
    p = an.Posit(n, es)
    assert p.max == 2.0 ** ((n - 2) * 2**es) and p.smallest_normal == 1 / p.max
    x = t(p.max * 3, p.smallest_normal / 3, 1.0, -1.0, 0.0, float("nan"))
    y = an.quantize(x, p)
    assert y[:5].tolist() == [p.max, p.smallest_normal, 1.0, -1.0, 0.0] and math.isnan(y[5])


def test_presets_and_names():
    assert an.POSIT8 == an.Posit(8, 2) and an.POSIT16 == an.Posit(16, 2) and an.POSIT32 == an.Posit(32, 2)
    assert an.format("posit8") is an.POSIT8 and an.format("posit16") is an.POSIT16
    assert an.format("posit32") is an.POSIT32
    assert an.format("posit(8,2)") == an.POSIT8
    assert an.format("Posit(6, 1)") == an.Posit(6, 1)
    assert an.format("posit8_2") == an.POSIT8
    assert an.format("posit16es1") == an.Posit(16, 1)
    assert an.format("posit8_0") == an.Posit(8, 0)
    for name in ("posit8", "posit16", "posit32"):
        assert name in an.list_formats()
    with pytest.raises(an.AnynumError):
        an.format("posit(1,0)")
    with pytest.raises(an.AnynumError):
        an.format("posit(40,2)")
    assert repr(an.POSIT8) == "POSIT8" and repr(an.Posit(6, 1)) == "Posit(6, 1)"
    assert repr(an.Posit(6, 1, scale_exp=3, underflow="zero")) == "Posit(6, 1, scale_exp=3, underflow='zero')"


def test_equality_hash_pickle():
    p = an.Posit(8, 2)
    assert p == an.POSIT8 and hash(p) == hash(an.POSIT8)
    assert p != an.Posit(8, 2, scale_exp=1) and p != an.Posit(8, 2, underflow="zero")
    assert pickle.loads(pickle.dumps(an.Posit(10, 3, scale_exp=-4))) == an.Posit(10, 3, scale_exp=-4)


# --- properties ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,es", [(8, 0), (8, 2), (16, 1), (16, 2), (32, 2), (6, 3), (3, 0)])
def test_finfo_properties(n, es):
    p = an.Posit(n, es)
    useed = 2.0 ** (2**es)
    assert p.useed == useed
    assert p.max == useed ** (n - 2) == p.maxpos
    assert p.smallest_normal == p.smallest_subnormal == useed ** (2 - n) == p.minpos
    assert p.bits == n and p.has_nan and not p.has_inf and not p.has_negative_zero
    assert p.default_overflow == "saturate"
    assert p.precision == max(n - 3 - es, 0) + 1
    info = p.info
    assert info.emax == (n - 2) * 2**es and info.emin == -(n - 2) * 2**es
    if n - 3 - es >= 0:
        assert p.eps == 2.0 ** -(n - 3 - es)
    assert p.nar_code == 1 << (n - 1) and p.maxpos_code == (1 << (n - 1)) - 1


def test_scale_exp_shifts_the_range():
    p = an.Posit(8, 2, scale_exp=4)
    assert p.max == 2.0**20 and p.smallest_normal == 2.0**-28
    assert p.eps == 2.0**-3 / 16  # best precision now next to 2**-4
    assert p.emin == -28 and p.emax == 20


def test_check_overflow_policy():
    assert an.POSIT8.check_overflow(None) == "saturate"
    for bad in ("inf", "nan", "wrap"):
        with pytest.raises(FormatError):
            an.quantize(t(1.0), an.POSIT8, overflow=bad)


# --- codes ---------------------------------------------------------------------------------------


def test_codes_two_complement():
    p = an.Posit(8, 2)
    assert p.encode(t(0.0, 1.0, -1.0, p.max, -p.max, p.minpos, -p.minpos, float("nan"))).tolist() == [
        0, 64, 192, 127, 129, 1, 255, 128,
    ]
    assert an.decode(np.array([0, 64, 192, 127, 129, 1, 255, 128]), p)[:7].tolist() == [
        0.0, 1.0, -1.0, p.max, -p.max, p.minpos, -p.minpos,
    ]
    assert math.isnan(an.decode(128, p))
    assert isinstance(an.decode(64, p), float) and an.decode(64, p) == 1.0
    with pytest.raises(InputError):
        an.decode(np.array([256]), p)
    with pytest.raises(InputError):
        an.decode(np.array([-1]), p)


def test_posit32_known_codes():
    p = an.POSIT32
    assert p.encode(t(1.0, -1.0, 2.0**120, 2.0**-120, 1.5)).tolist() == [
        0x40000000, 0xC0000000, 0x7FFFFFFF, 1, 0x44000000,
    ]


@pytest.mark.parametrize("n,es", [(2, 0), (3, 1), (5, 2), (8, 0), (8, 2), (10, 1), (12, 3), (12, 4)])
def test_every_code_roundtrips(n, es):
    p = an.Posit(n, es)
    codes = torch.arange(1 << n)
    v = an.decode(codes, p)
    finite = torch.isfinite(v)
    assert int((~finite).sum()) == 1 and bool(torch.isnan(v[1 << (n - 1)]))
    assert torch.equal(an.encode(v, p), codes)  # NaR -> NaR code too
    vals = p.values()
    assert len(vals) == (1 << n) - 1 and np.all(np.diff(vals) > 0)
    for mode in MODES:
        assert torch.equal(an.quantize(torch.from_numpy(vals), p, mode, seed=1), torch.from_numpy(vals)), mode


def test_posit2_is_zero_and_plus_minus_one():
    p = an.Posit(2, 1)
    assert p.values().tolist() == [-1.0, 0.0, 1.0]
    assert an.quantize(t(0.001, -1e9, 0.0), p).tolist() == [1.0, -1.0, 0.0]
    # underflow="zero": the 0 | 1 boundary is the 3-bit code 0b001 = useed**-1 = 0.25
    assert an.quantize(t(0.001, 0.5, 0.25, 0.2500001), an.Posit(2, 1, underflow="zero")).tolist() == [
        0.0, 1.0, 0.0, 1.0,
    ]


# --- rounding ------------------------------------------------------------------------------------


def test_geometric_midpoint_example():
    """The docs' example: posit(8,2) rounds 144179.2 up to 262144; 131072 is a tie that goes to 65536."""
    p = an.Posit(8, 2)
    assert an.quantize(t(144179.2, 131072.0, -144179.2, -131072.0), p).tolist() == [
        262144.0, 65536.0, -262144.0, -65536.0,
    ]
    assert an.quantize(t(131072.0), p, "rna").item() == 262144.0
    assert an.quantize(t(131072.0), p, "rnz").item() == 65536.0
    assert an.quantize(t(131072.0), p, "ro").item() == 262144.0  # odd code 125
    assert an.quantize(t(120000.0), p, "nearest").item() == 65536.0  # arithmetic midpoint is 163840


def test_fraction_bit_tie_goes_to_even_code():
    p = an.Posit(8, 2)  # near 1: 3 fraction bits, step 1/8
    assert an.quantize(t(1.0625, 1.1875, -1.0625), p).tolist() == [1.0, 1.25, -1.0]


@pytest.mark.parametrize("mode", MODES)
def test_specials_in_every_mode(mode):
    p = an.Posit(8, 2)
    x = t(float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e300, -1e300, 1e-300, -1e-300, 5e-324)
    y = an.quantize(x, p, mode, seed=0)
    assert torch.isnan(y[:3]).all()
    assert y[3:].tolist() == [0.0, 0.0, p.max, -p.max, p.minpos, -p.minpos, p.minpos]
    assert not torch.signbit(y[4])  # one zero: -0 becomes +0
    codes = an.encode(x, p, mode, seed=0)
    assert codes[:3].tolist() == [128, 128, 128]


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_never_zero_never_nar(mode):
    p = an.Posit(6, 1)
    x = t(p.minpos / 2, p.minpos * 0.999, -p.minpos / 7, p.max * 1.0001, -p.max * 10)
    assert an.quantize(x, p, mode).tolist() == [p.minpos, p.minpos, -p.minpos, p.max, -p.max]


def test_underflow_zero():
    p = an.Posit(8, 2, underflow="zero")
    m, u = p.minpos, p.useed
    x = t(m / u, m / u * 1.0001, m / u * 0.9999, m / 2, -m / 2, -m / u)
    assert an.quantize(x, p).tolist() == [0.0, m, 0.0, m, -m, 0.0]
    assert an.quantize(t(m / 2, -m / 2), p, "rz").tolist() == [0.0, 0.0]
    assert an.quantize(t(m / 2, -m / 2), p, "ru").tolist() == [m, 0.0]
    assert an.quantize(t(m / 2, -m / 2), p, "rd").tolist() == [0.0, -m]
    assert an.quantize(t(m / 2, -m / 2), p, "ro").tolist() == [m, -m]
    assert not torch.signbit(an.quantize(t(-m / 100), p))  # no -0
    assert p.encode(t(-m / 100)).item() == 0


def test_directed_modes_bracket_and_order():
    p = an.Posit(10, 2)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(np.sort(np.exp2(rng.uniform(-30, 30, 5000)) * rng.choice([-1, 1], 5000)))
    up, down = an.quantize(x, p, "ru"), an.quantize(x, p, "rd")
    assert torch.all(down <= x) and torch.all(x <= up)
    near = an.quantize(x, p)
    assert torch.all((near == up) | (near == down))
    rz = an.quantize(x, p, "rz")
    assert torch.all(torch.abs(rz) <= torch.abs(x))
    assert torch.all(torch.diff(near) >= 0)  # monotone


def test_odd_mode_gives_odd_codes_off_grid():
    p = an.Posit(8, 2)
    x = torch.from_numpy(np.exp2(np.random.default_rng(1).uniform(-20, 20, 3000)))
    on_grid = an.quantize(x, p, "rz") == x
    codes = an.encode(x, p, "ro")
    assert torch.all((codes[~on_grid] % 2) == 1)


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), st.sampled_from(DETERMINISTIC))
def test_symmetric_modes_are_odd_functions(x, mode):
    p = an.Posit(9, 1)
    a = an.quantize(t(x), p, mode).item()
    b = an.quantize(t(-x), p, {"ru": "rd", "rd": "ru"}.get(mode, mode)).item()
    assert a == -b


def test_scale_exp_is_exact():
    """quantize(x, Posit(n, es, scale_exp=t)) == 2**-t * quantize(x * 2**t, Posit(n, es)), codes equal."""
    rng = np.random.default_rng(2)
    x = torch.from_numpy(np.exp2(rng.uniform(-40, 40, 20000)) * rng.choice([-1, 1], 20000))
    for scale in (-9, -1, 3, 17):
        ps, p = an.Posit(8, 1, scale_exp=scale), an.Posit(8, 1)
        for mode in DETERMINISTIC:
            got = an.quantize(x, ps, mode)
            scaled = an.quantize(torch.ldexp(x, torch.tensor(scale)), p, mode)
            want = torch.ldexp(scaled, torch.tensor(-scale))
            assert torch.equal(got, want), (scale, mode)
            assert torch.equal(an.encode(x, ps, mode), an.encode(x * 2.0**scale, p, mode))


# --- stochastic ----------------------------------------------------------------------------------


def test_stochastic_reproducible_and_on_grid():
    p = an.Posit(8, 2)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal(10000) * 100)
    a = an.quantize(x, p, "sr", seed=7)
    assert torch.equal(a, an.quantize(x, p, "sr", seed=7))
    assert not torch.equal(a, an.quantize(x, p, "sr", seed=8))
    grid = torch.from_numpy(p.values())
    assert torch.isin(a, grid).all()
    down, up = an.quantize(x, p, "rd"), an.quantize(x, p, "ru")
    assert torch.all((a == down) | (a == up))
    for r in (1, 4, 23):
        b = an.quantize(x, p, "sr", seed=7, rand_bits=r)
        assert torch.all((b == down) | (b == up))
    c = an.quantize(x, p, "sr_uniform", seed=7)
    assert torch.all((c == down) | (c == up))


def test_stochastic_unbiased_where_exponent_bits_are_cut():
    """Between 65536 and 262144 (posit(8,2)) the grid is geometric; SR stays unbiased in value."""
    p = an.Posit(8, 2)
    x = t(100000.0, 140000.0, 200000.0).repeat(40000)
    y = an.quantize(x, p, "sr", seed=0).view(40000, 3)
    mean = y.mean(0)
    sigma = (262144.0 - 65536.0) * 0.5 / math.sqrt(40000)
    assert torch.all(torch.abs(mean - t(100000.0, 140000.0, 200000.0)) < 5 * sigma)
    # nearest would be far off: 100000 -> 65536, 140000 -> 262144 (geometric boundary 131072)
    assert an.quantize(t(100000.0, 140000.0), p).tolist() == [65536.0, 262144.0]


def test_hardware_sr_follows_the_bit_string():
    """rand_bits=r: P(up) is the r dropped bits of the code; between 65536 and 262144 the first
    dropped bit is an exponent bit, so P(up) jumps from 0 to 1/2 at 131072, linear in the exponent."""
    p = an.Posit(8, 2)
    x = t(100000.0, 140000.0).repeat(20000)
    y = an.quantize(x, p, "sr", seed=1, rand_bits=1).view(20000, 2)
    frac_up = (y == 262144.0).double().mean(0)
    assert frac_up[0].item() == 0.0
    assert abs(frac_up[1].item() - 0.5) < 0.02


# --- dtypes, arrays, autograd -----------------------------------------------------------------------


def test_dtypes():
    x32 = torch.tensor([0.3, -7.7, 1e10], dtype=torch.float32)
    y = an.quantize(x32, an.POSIT16)
    assert y.dtype == torch.float32
    assert torch.equal(y.double(), an.quantize(x32.double(), an.POSIT16))
    bf = torch.tensor([0.3, -7.7, 3e7], dtype=torch.bfloat16)
    assert torch.equal(an.quantize(bf, an.POSIT8).double(), an.quantize(bf.double(), an.POSIT8))
    h = torch.tensor([0.3, -7.7, 1000.0], dtype=torch.float16)
    assert torch.equal(an.quantize(h, an.Posit(8, 0)).double(), an.quantize(h.double(), an.Posit(8, 0)))
    with pytest.raises(RepresentabilityError):  # posit8's values reach 2**24: not float16 numbers
        an.quantize(h, an.POSIT8)
    with pytest.raises(RepresentabilityError):  # 2**±160 is outside float32
        an.quantize(x32, an.Posit(12, 4))


def test_numpy_and_scalars():
    x = np.array([0.3, 144179.2], dtype=np.float64)
    y = an.quantize(x, "posit8")
    assert isinstance(y, np.ndarray) and y.tolist() == [0.3125, 262144.0]
    assert an.encode(np.float64(1.0), "posit8") == 64
    assert an.encode(x, "posit(8,2)").tolist() == [0b0_01_10_010, 125]  # 0.3125 = 2**-2 * 1.25


def test_autograd_straight_through():
    x = torch.tensor([0.3, 3.3, 144179.2], dtype=f64, requires_grad=True)
    y = an.quantize(x, an.POSIT8)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3, dtype=f64))


def test_shapes_and_strides():
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((6, 5, 4))).permute(2, 0, 1)
    y = an.quantize(x, an.POSIT16)
    assert y.shape == x.shape
    assert torch.equal(y, an.quantize(x.contiguous(), an.POSIT16))
    assert an.quantize(torch.zeros(0, 3, dtype=f64), an.POSIT8).shape == (0, 3)


@pytest.mark.slow
@pytest.mark.parametrize("mode,rand_bits", [("nearest", None), ("sr", None)])
def test_compiled_path_matches_eager(mode, rand_bits):
    """The fused torch.compile path runs the same kernel; it must compile and agree bit for bit."""
    from anynum.kernels import fused_round, round_to_format
    from anynum.rounding import CounterRandom

    rng = CounterRandom(5) if mode == "sr" else None
    x = torch.from_numpy(np.exp2(np.random.default_rng(5).uniform(-30, 30, 4099)) - 3.0)
    x = torch.cat([x, t(0.0, -0.0, float("nan"), float("inf"), 1e300, 5e-324)])
    fmt = an.Posit(10, 2, scale_exp=1)
    m = Rounding.parse(mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a compile failure warns and falls back
        fast = fused_round(fmt, x, m, "saturate", rng, rand_bits)
    ref = round_to_format(fmt, x, m, "saturate", rng, rand_bits)
    assert torch.equal(fast.nan_to_num(7.0), ref.nan_to_num(7.0))
