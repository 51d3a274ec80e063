"""Table.from_format(fmt) is fmt: every value, every rounding mode, the sign of zero.

Over every float format preset of at most 8 bits, every P3109 8-bit format and a sample of
(exp, man, specials, subnormals, signed) combinations: at every value, every boundary (midpoint),
the float64 and float32 neighbours of each, random points, ±0, ±inf, NaN and out-of-range inputs,
in float64 and float32, the table and the format (``overflow="saturate"``) give identical results
- values, NaN and the sign of zero - in all nine modes. The stochastic modes draw from the same
injected `RandomSource` (bits that always say "down", always "up", and a counter stream), with
and without ``rand_bits``. Formats `from_format` refuses (no fraction bits, flushed subnormals:
their ties follow the significand, not the code) are the documented exception.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import FormatError
from anynum.rounding import CounterRandom, RandomSource, Rounding

pytestmark = pytest.mark.usefixtures("eager_only", "one_thread")

MODES = list(Rounding)


class Pattern(RandomSource):
    """Known random bits: all zeros, all ones (the extreme draws), or a counter stream."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.counter = CounterRandom(2024)

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        if self.kind == "zeros":
            return torch.zeros_like(index)
        if self.kind == "ones":
            return torch.full_like(index, (1 << nbits) - 1)
        return self.counter.bits_at(index, nbits, stream)

    def __repr__(self) -> str:
        return f"Pattern({self.kind})"


SOURCES = [Pattern("zeros"), Pattern("ones"), Pattern("counter")]


def _presets() -> list[an.Format]:
    out = []
    for name in an.list_formats():
        f = an.format(name)
        if isinstance(f, an.FloatFormat) and f.bits <= 8:
            out.append(f)
    return out


def _p3109() -> list[an.Format]:
    return [
        an.format(f"p3109(8,{p}){'' if signed else 'u'}{'' if ext else 'f'}")
        for p in range(1, 9)
        for signed in (True, False)
        for ext in (True, False)
        if p < 8 or not signed
    ]


def _sample() -> list[an.Format]:
    """A fixed sample of legal (exp, man, specials, subnormals, signed) combinations up to 10 bits."""
    rng = np.random.default_rng(19)
    out: list[an.Format] = []
    while len(out) < 24:
        e, m = int(rng.integers(1, 6)), int(rng.integers(0, 5))
        specials = str(rng.choice(["ieee", "fn", "fnuz", "none", "p3109"]))
        subnormals, signed = bool(rng.random() < 0.8), bool(rng.random() < 0.8)
        try:
            f = an.FloatFormat(e, m, specials=specials, subnormals=subnormals, signed=signed)
        except FormatError:
            continue
        if f.bits <= 10 and f not in out:
            out.append(f)
    return out


FLOATS = _presets() + _p3109() + _sample()
#: Beyond floats: posits (boundaries geometric where exponent bits are cut), fixed point, integers.
OTHERS = [
    an.Posit(8, 0), an.Posit(8, 2), an.Posit(6, 3), an.Posit(7, 1, underflow="zero"),
    an.Posit(5, 0, scale_exp=3),
    an.FixedPoint(4, 3), an.FixedPoint(5, 2, signed=False), an.IntFormat(5), an.IntFormat(4, signed=False),
]
FORMATS = FLOATS + OTHERS


def refused(fmt: an.Format) -> bool:
    """The documented exception: ties that follow the significand rather than the code."""
    return isinstance(fmt, an.FloatFormat) and (fmt.man_bits == 0 or not fmt.subnormals)


def rand_bits_differ(fmt: an.Format) -> bool:
    """The other documented exception: posits with rand_bits draw on the bit string, tables on the value."""
    return isinstance(fmt, an.Posit)


def probes(fmt: an.Format) -> torch.Tensor:
    v = np.asarray(fmt.values(), dtype=np.float64)
    v = v[np.isfinite(v)]
    ext = np.concatenate([[-2 * np.abs(v).max() - 1], v, [2 * np.abs(v).max() + 1]])
    mids = ext[:-1] + (ext[1:] - ext[:-1]) / 2
    rng = np.random.default_rng(len(v))
    pts = np.concatenate([
        v, -v, mids, -mids,
        np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
        np.nextafter(v, np.inf), np.nextafter(v, -np.inf),
        np.nextafter(mids.astype(np.float32), np.float32(np.inf)).astype(np.float64),
        np.nextafter(mids.astype(np.float32), np.float32(-np.inf)).astype(np.float64),
        rng.uniform(ext[0], ext[-1], 3000),
        rng.standard_normal(3000) * np.exp2(rng.integers(-30, 30, 3000)),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-300, -1e-300, 5e-324, -5e-324],
    ])
    return torch.from_numpy(pts)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.display_name())
def test_table_is_the_format(fmt, same_values):
    if refused(fmt):
        with pytest.raises(FormatError, match="no table tie policy"):
            an.Table.from_format(fmt)
        return
    tab = an.Table.from_format(fmt)
    x64 = probes(fmt)
    x32 = x64.float()
    for x in (x64, x32):
        for mode in MODES:
            bits = (None,) if rand_bits_differ(fmt) else (None, 1, 3, 10)
            cases = [(s, rb) for s in SOURCES for rb in bits] if mode.is_stochastic else [(None, None)]
            for source, rand_bits in cases:
                if rand_bits is not None and mode is not Rounding.STOCHASTIC:
                    continue
                kw = {"generator": source, "rand_bits": rand_bits} if source is not None else {}
                want = an.quantize(x, fmt, mode, overflow="saturate", **kw)
                got = an.quantize(x, tab, mode, **kw)
                what = f"{fmt.display_name()} {mode.name} {x.dtype} {source} rand_bits={rand_bits}"
                same_values(got, want, x, what=what)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if not refused(f)][:12], ids=lambda f: f.display_name())
def test_codes_round_trip_up_to_the_sign_of_zero(fmt):
    """The table's code for a value is its index; decode(encode(x)) is quantize(x), except that the
    one zero code decodes to +0.0."""
    tab = an.Table.from_format(fmt)
    x = probes(fmt)
    x = x[~torch.isnan(an.quantize(x, tab))]
    y = an.quantize(x, tab)
    back = an.decode(an.encode(x, tab), tab)
    assert torch.equal(back, y + 0.0)


def test_signed_zero_and_negative_rules_follow_the_format():
    assert an.Table.from_format(an.E2M1).signed_zero
    assert not an.Table.from_format(an.E4M3FNUZ).signed_zero  # no -0 code
    assert not an.Table.from_format(an.FixedPoint(4, 2)).signed_zero  # two's complement
    assert not an.Table.from_format(an.Posit(8, 0)).signed_zero
    assert an.Table.from_format("p3109(8,4)u").negative == "nan"
    assert an.Table.from_format(an.FixedPoint(4, 2, signed=False)).negative == "saturate"
    t = an.Table([0.0, 1.0], signed_zero=True, negative="nan")
    x = torch.tensor([-0.3, -0.0, 0.3, 0.7])
    got = an.quantize(x, t)
    assert torch.isnan(got[0]) and got[1].item() == 0 and torch.signbit(got[1])
    assert got[2:].tolist() == [0.0, 1.0] and not torch.signbit(got[2])
    assert t == an.Table([0.0, 1.0], signed_zero=True, negative="nan") != an.Table([0.0, 1.0])
    with pytest.raises(FormatError, match="signed_zero"):
        an.Table([0.0, 1.0], signed_zero="yes")
    with pytest.raises(FormatError, match="negative"):
        an.Table([0.0, 1.0], negative="raise")
    with pytest.raises(FormatError, match="without negative values"):
        an.Table([-1.0, 1.0], negative="nan")
