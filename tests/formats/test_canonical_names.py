"""Every format has one canonical name that `an.format` reads back into an equal format, and
reading a name never executes anything (state dicts, results files and custom ops store names)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, reject, settings
from hypothesis import strategies as st

import anynum as an
from anynum.errors import FormatError
from anynum.formats.block import UE4M3


def _round_trips(fmt: an.Format) -> None:
    name = fmt.canonical_name
    back = an.format(name)
    assert back == fmt and type(back) is type(fmt), (name, back)
    assert back.canonical_name == name
    x = torch.linspace(-3, 3, 97, dtype=torch.float64)
    a, b = an.quantize(x, back, "rz"), an.quantize(x, fmt, "rz")
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("name", an.list_formats())
def test_every_preset_is_named_by_a_preset_name(name: str) -> None:
    fmt = an.format(name)
    # q43 is the IEEE-like e4m3 under Pychop's name: equal formats share the first preset name
    assert fmt.canonical_name == name or an.format(fmt.canonical_name) == fmt
    assert fmt.canonical_name in an.list_formats()
    _round_trips(fmt)


@st.composite
def float_formats(draw: st.DrawFn) -> an.FloatFormat:
    exp_bits = draw(st.integers(2, 11))
    man_bits = draw(st.integers(0, 20))
    specials = draw(st.sampled_from(["ieee", "fn", "fnuz", "none", "p3109"]))
    signed = draw(st.booleans()) if specials != "fnuz" else True
    subnormals = draw(st.booleans())
    zero = True if subnormals else draw(st.booleans())
    bias = draw(st.none() | st.integers(0, 40))
    try:
        return an.FloatFormat(exp_bits, man_bits, bias=bias, subnormals=subnormals, specials=specials,
                              signed=signed, zero=zero)
    except FormatError:
        reject()


@settings(max_examples=200, deadline=None)
@given(float_formats())
def test_float_formats_round_trip(fmt: an.FloatFormat) -> None:
    _round_trips(fmt)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 20), st.integers(0, 4), st.integers(-20, 20), st.sampled_from(["minpos", "zero"]))
def test_posits_round_trip(n: int, es: int, scale_exp: int, underflow: str) -> None:
    _round_trips(an.Posit(n, es, scale_exp=scale_exp, underflow=underflow))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=64), min_size=1, max_size=40),
    st.sampled_from(["smaller_magnitude", "away", "even", "down", "up"]),
    st.sampled_from(["zero", "saturate"]),
    st.sampled_from(["saturate", "nan"]),
)
def test_tables_round_trip(values: list[float], ties: str, underflow: str, infinity: str) -> None:
    _round_trips(an.Table(values, ties=ties, underflow=underflow, infinity=infinity))


@pytest.mark.parametrize(
    "fmt",
    [
        an.FixedPoint(4, 8), an.FixedPoint(3, -2, overflow="wrap"), an.FixedPoint(1, 7, signed=False),
        an.IntFormat(5, signed=False), an.IntFormat(12),
        an.Table.from_format(an.E2M1), an.Table.from_format(an.Posit(6, 1)),
        an.Table([0.0, 1.0, 2.0], boundaries=[0.25, 1.75]),
        an.Block(an.E2M1, 16, axis=0, scale_rule="ceil"), an.Block(an.FloatFormat(3, 2, bias=2), 8),
        an.Block(an.FixedPoint(2, 6), None, axis=None, symmetric=True),
        an.Block(an.Posit(8, 0), 4, scale=UE4M3, scale_rule="amax"),
        an.Block(an.E2M1, 16, scale=UE4M3, scale_rule="amax", tensor_scale=an.BF16),
        an.formats.p3109(8, 3), an.formats.p3109(6, 2, signed=False, domain="finite"),
    ],
    ids=repr,
)
def test_other_families_round_trip(fmt: an.Format) -> None:
    _round_trips(fmt)


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os').system('echo pwned')",
        "Posit(n=8, es=__import__('os').getpid())",
        "Posit.__class__",
        "Posit(n=8, es=(lambda: 1)())",
        "Posit(**{'n': 8, 'es': 1})",
        "Posit(n=8, es=1).__reduce__()",
        "FloatFormat(exp_bits=4, man_bits=3, specials=f'{1}')",
        "Block(element=open('/etc/passwd'), block_size=2)",
        "Posit(n=8, es=" + "(" * 500 + "1" + ")" * 500 + ")",
        "Posit(" + "n=8," * 3,
        "X" * (1 << 21),
    ],
)
def test_reading_a_name_executes_nothing(hostile: str) -> None:
    with pytest.raises(FormatError):
        an.format(hostile)


def test_bad_constructor_arguments_are_format_errors() -> None:
    with pytest.raises(FormatError, match="Posit"):
        an.format("Posit(n=8, es=1, colour='red')")
    with pytest.raises(FormatError):
        an.format("Posit(n=80, es=1)")
