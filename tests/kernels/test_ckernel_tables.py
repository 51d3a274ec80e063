"""The C table kernels' bucket lookup (anynum.kernels.tablelut) equals the eager reference bit for bit.

Deterministic modes read each input's result from its bucket's entry and stochastic modes its
neighbours; entries whose inputs differ are searched. So the inputs that matter are every
float16 and bfloat16 bit pattern (their float32 keys cover every entry they reach), the first,
second and last member of every bucket and the floats next to them (in float32 keys for
float32 inputs, float64 keys for float64 inputs), every table value and boundary with its
neighbours, and random values across the table's range, in all nine modes, with out= and in
place, on one and two threads. Tables whose values are not short binary fractions have buckets
that are searched; those run here too, and so does an exact-SR element handed back for refinement.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import RepresentabilityError
from anynum.kernels.clib import library
from anynum.kernels.cparams import call_params
from anynum.kernels.tablelut import neighbour_lut, result_lut
from anynum.quantize.checks import check_representable
from anynum.rounding import CounterRandom, Rounding

_RNG = np.random.default_rng(3)
# values of at most 11 significant bits (float16 numbers), not short binary fractions: searched buckets
_RAGGED = np.unique(_RNG.standard_normal(60).astype(np.float16).astype(np.float64) * 8)

TABLES = [
    an.Table.from_format(an.E2M1),
    an.Table.from_format(an.Posit(8, 0)),
    an.Table.from_format(an.Posit(6, 1)),
    an.Table.from_format(an.E3M2),
    an.Table([-3.0, -1.0, 1.0, 2.0, 4.0], ties="up"),  # no zero: an interval straddles it
    an.Table([-3.0, -1.0, 1.0, 2.0, 4.0], ties="down", signed_zero=True),
    an.Table([0.0, 0.5, 1.0, 3.0], negative="nan", signed_zero=True),
    an.Table([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0], underflow="saturate", infinity="nan", ties="away"),
    an.Table([0.375, 0.5, 40.0], ties="even"),  # all positive
    an.Table(_RAGGED, ties="even"),
    an.Table(_RAGGED[::3], underflow="saturate", signed_zero=True),
    an.Table([-1.5, -0.375, 0.0, 0.375, 1.0, 3.0], underflow="saturate", signed_zero=True),
]
WIDE = [  # float64 inputs only: values float32 cannot hold, or beyond its range
    an.Table.log(2, 1),
    an.Table([-5.0, 0.0, 1e-300, 2.0**1020, 1.7976931348623157e308]),  # the scaled SR path
    an.Table([-(2.0**-1074), 2.0**-1070, 2.0**-1022, 0.75, 1.0, 1.0 + 2.0**-52, 3.0]),
]
MODES = list(Rounding)


def _representable(fmt: an.Format, dtype: torch.dtype) -> bool:
    try:
        check_representable(fmt, dtype)
    except an.AnynumError:
        return False
    return True


def _edges(fmt: an.Table, key64: bool) -> torch.Tensor:
    """Every bucket's first, second and last member, their neighbours, and the clamped ends."""
    lut = result_lut(fmt, Rounding.NEAREST_EVEN, key64)
    uint, flt = (np.uint64, np.float64) if key64 else (np.uint32, np.float32)
    c = np.arange(lut.klo // 2, lut.khi // 2 + 2, dtype=np.uint64) << np.uint64(lut.shift)
    low = np.arange(4, dtype=np.uint64)
    bits = np.concatenate([c, c + np.uint64(1), c - np.uint64(1), c + np.uint64(2), low])
    top = 0x7FEFFFFFFFFFFFFF if key64 else 0x7F7FFFFF
    bits = np.minimum(bits, np.uint64(top)).astype(uint)
    mags = bits.view(flt).astype(np.float64)
    return torch.from_numpy(np.concatenate([mags, -mags]))


def _values_and_boundaries(fmt: an.Table, dtype: torch.dtype) -> torch.Tensor:
    lut = fmt.lookup(torch.device("cpu"))
    pts = torch.cat([lut.values, lut.bound]).to(dtype)
    up, down = torch.full_like(pts, math.inf), torch.full_like(pts, -math.inf)
    return torch.cat([pts, torch.nextafter(pts, up), torch.nextafter(pts, down)])


def _inputs(fmt: an.Table, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    span = 2 * max(abs(fmt.min), abs(fmt.max))
    spread = (torch.rand(20_000, generator=g, dtype=torch.float64) * 2 - 1) * span
    tiny = torch.randn(2_000, generator=g, dtype=torch.float64) * fmt.smallest_subnormal
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan], dtype=torch.float64)
    x = torch.cat([_edges(fmt, dtype == torch.float64), spread, tiny, special]).to(dtype)
    return torch.cat([x, _values_and_boundaries(fmt, dtype)])


@pytest.fixture(params=["as built", "portable"])
def table_loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Each lookup of float arrays the library holds, deterministic and stochastic: the one it
    runs here (one AVX-512 pass where the compiler targets it and gathers are fast) and the
    portable passes (the table's `portable` flag), so both are held to the reference on a
    machine that builds the first."""
    from anynum.kernels import cparams

    if request.param == "as built":
        yield
        return
    built = cparams._table_params

    def portable(*args, **kwargs):  # type: ignore[no-untyped-def]
        params, keep = built(*args, **kwargs)
        params.portable = 1
        return params, keep

    monkeypatch.setattr(cparams, "_table_params", portable)
    cparams.call_params.cache_clear()
    taken = call_params(TABLES[0], Rounding.NEAREST_EVEN, "saturate", None, torch.float32)
    assert taken is not None and taken.struct.t.portable == 1
    yield
    monkeypatch.undo()
    cparams.call_params.cache_clear()


@pytest.mark.parametrize("fmt", TABLES, ids=repr)
def test_every_float16_and_bfloat16_pattern(fmt: an.Table, table_loops, cn) -> None:  # type: ignore[no-untyped-def]
    all16 = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16)
    checked = 0
    for dtype in (torch.float16, torch.bfloat16):
        if _representable(fmt, dtype):
            cn.check(fmt, all16.view(dtype))
            checked += 1
    assert checked or not _representable(fmt, torch.float32)


@pytest.mark.parametrize("fmt", TABLES + WIDE, ids=repr)
def test_bucket_edges_values_and_boundaries(fmt: an.Table, table_loops, cn) -> None:  # type: ignore[no-untyped-def]
    """float32 inputs (float32 keys) where the table holds float32 numbers, float64 inputs (float64 keys)."""
    for dtype in (torch.float32, torch.float64):
        if _representable(fmt, dtype):
            cn.check(fmt, _inputs(fmt, dtype))


def test_some_tables_have_searched_buckets_and_these_run() -> None:
    """The point of the ragged tables above: their lookups hold sentinels (and E2M1's none)."""
    ragged, e2m1 = TABLES[-3], TABLES[0]
    for key64 in (False, True):
        res = result_lut(ragged, Rounding.NEAREST_EVEN, key64).entries
        assert int((res == np.iinfo(res.dtype).max).sum()) > 10
        nb = neighbour_lut(ragged, key64).entries
        lo = nb[::2] if key64 else (nb & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
        assert int(np.isnan(lo).sum()) > 10
        assert not (result_lut(e2m1, Rounding.UP, key64).entries == np.iinfo(res.dtype).max).any()


@pytest.mark.parametrize("fmt", [TABLES[0], TABLES[1], TABLES[-3]], ids=repr)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_in_place_out_and_two_threads(fmt: an.Table, dtype: torch.dtype, table_loops, cn) -> None:  # type: ignore[no-untyped-def]
    if not _representable(fmt, dtype):  # refused at the front door: no kernel ever sees it
        with pytest.raises(RepresentabilityError):
            an.quantize(torch.zeros(4, dtype=dtype), fmt)
        return
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(200_003, generator=g, dtype=torch.float64) * max(abs(fmt.min), fmt.max) / 2).to(dtype)
    before = torch.get_num_threads()
    try:
        for mode in MODES:
            want = cn.reference(fmt, mode, "saturate", None, x)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                cn.assert_same(cn.native(fmt, mode, "saturate", None, x), want, x, (fmt, mode.name, threads))
                inplace = x.clone()
                cn.native(fmt, mode, "saturate", None, inplace, out=inplace)
                cn.assert_same(inplace, want, x, (fmt, mode.name, threads, "in place"))
                out = torch.empty_like(x)
                assert cn.native(fmt, mode, "saturate", None, x, out=out) is out
                cn.assert_same(out, want, x, (fmt, mode.name, threads, "out="))
    finally:
        torch.set_num_threads(before)


def test_an_undecided_exact_sr_element_is_refined_like_the_reference(cn) -> None:  # type: ignore[no-untyped-def]
    """On Table([0, 1]) the probability of going up is x itself: x = k 2**-53 + 2**-(53 + spare)
    ties its own first 53 random bits k and has one more bit, so the C hands it back."""
    fmt = an.Table([0.0, 1.0])
    n = 4096
    bits = CounterRandom(5).bits_at(torch.arange(n), 53, 0)
    i = int(torch.argmin(bits))
    k = int(bits[i])
    spare = 53 - k.bit_length()
    x = torch.full((n,), 0.375, dtype=torch.float64)
    x[i] = k * 2.0**-53 + 2.0 ** -(53 + spare)
    sr = Rounding.STOCHASTIC
    params = call_params(fmt, sr, "saturate", None, torch.float64)
    lib = library()
    assert params is not None and lib is not None
    y = torch.empty_like(x)
    base = CounterRandom(5).stream_base(0) & ((1 << 64) - 1)
    assert lib.anynum_round(x.data_ptr(), y.data_ptr(), n, params.address, base, 1, None) == 1
    assert float(y[i]) == float(x[i])  # handed back untouched
    want = cn.reference(fmt, sr, "saturate", None, x, seed=5)
    cn.assert_same(cn.native(fmt, sr, "saturate", None, x, seed=5), want, x, "refined")
    inplace = x.clone()
    cn.native(fmt, sr, "saturate", None, inplace, seed=5, out=inplace)
    cn.assert_same(inplace, want, x, "refined in place")


def _float_lanes(fmt: an.Table, mode: Rounding, rand_bits: int | None) -> bool:
    params = call_params(fmt, mode, "saturate", rand_bits, torch.float32)
    assert params is not None
    return bool(params.struct.t.lut_float_lanes)


def test_which_stochastic_choices_run_on_float_lanes() -> None:
    """table_sr_fast_f32 compares p * 2**B with B draw bits (21 for exact SR): every spacing 2**k
    needs 2**(B - k) normal in float32, so k >= B - 127; SR uniform needs no p."""
    sr, sru = Rounding.STOCHASTIC, Rounding.STOCHASTIC_UNIFORM
    e2m1, not_pow2, tiny = TABLES[0], TABLES[7], an.Table([0.0, 2.0**-120, 2.0**-119])
    assert _float_lanes(e2m1, sr, None) and _float_lanes(e2m1, sr, 30) and not _float_lanes(e2m1, sr, 31)
    assert not _float_lanes(not_pow2, sr, None) and _float_lanes(not_pow2, sru, None)  # a spacing of 1.5
    assert not _float_lanes(tiny, sr, None) and not _float_lanes(tiny, sr, 8) and _float_lanes(tiny, sr, 7)


# float lanes and float64 ones: B from 1 to 30 bits and beyond; the last table's top spacing is
# 2**100 - 2**-119, which float32 and float64 both round to 2**100, and its inputs above 2**-95
# have inexact distances to 2**-119 in float32
_WIDE_SPACINGS = an.Table([0.0, 2.0**-120, 2.0**-119, 2.0**100])


@pytest.mark.parametrize("fmt", [TABLES[0], TABLES[4], TABLES[6], TABLES[7], _WIDE_SPACINGS], ids=repr)
def test_stochastic_choice_for_each_count_of_random_bits(fmt: an.Table, table_loops, cn) -> None:  # type: ignore[no-untyped-def]
    x = _inputs(fmt, torch.float32)
    for rb in (1, 7, 13, 21, 30, 31, 45):
        cn.check(fmt, x, [Rounding.STOCHASTIC], rand_bits=(rb,))


def test_draws_that_tie_the_float_lanes_top_bits_are_chosen_like_the_reference(cn) -> None:  # type: ignore[no-untyped-def]
    """Exact SR on float lanes decides on the draw's top 21 bits dh against floor(p * 2**21): x
    with floor(p * 2**21) == dh is chosen element by element, on both sides of the tie."""
    n = 4096
    dh = (CounterRandom(7).bits_at(torch.arange(n), 53, 0) >> 32).to(torch.float64)
    sr = Rounding.STOCHASTIC
    cases = ((an.Table([0.0, 1.0]), 0.0, 1.0, (0.0, 0.25, 0.5)), (TABLES[0], -4.0, -2.0, (0.0, 0.5)))
    for fmt, start, spacing, fracs in cases:
        assert _float_lanes(fmt, sr, None)
        for frac in fracs:  # p * 2**21 = dh + frac; on [-6, -4), p = (-4 - x) / 2
            exact = start + (dh + frac) * 2.0**-21 * spacing
            x = exact.to(torch.float32)
            assert bool((x.double() == exact).all())
            want = cn.reference(fmt, sr, "saturate", None, x)
            cn.assert_same(cn.native(fmt, sr, "saturate", None, x), want, x, (fmt, frac))
            # frac 0: never away from start (the rest of the draw is at least p's); else both ways
            assert len(want.unique()) == (2 if frac else 1)


@pytest.fixture
def coarse_buckets(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """At most 2 buckets per sign: nearly every input is searched (the fallback path)."""
    from anynum.kernels import cparams, tablelut

    def clear() -> None:
        for f in (tablelut._shape, tablelut.result_lut, tablelut.neighbour_lut, cparams.call_params):
            f.cache_clear()

    monkeypatch.setattr(tablelut, "CAP", 2)
    clear()
    yield
    monkeypatch.undo()
    clear()


# zero's neighbours inside a bucket: under underflow="saturate" the searched inputs between them
# and zero take the neighbour, as the lookup's entries do
_NEAR_ZERO = TABLES[-1]


@pytest.mark.parametrize("fmt", [TABLES[1], TABLES[5], TABLES[6], TABLES[7], _NEAR_ZERO], ids=repr)
def test_the_search_behind_the_lookup(fmt: an.Table, coarse_buckets, table_loops, cn) -> None:  # type: ignore[no-untyped-def]
    for key64 in (False, True):
        res = result_lut(fmt, Rounding.NEAREST_EVEN, key64).entries
        assert int((res == np.iinfo(res.dtype).max).sum()) >= 1  # searched entries there are
    for dtype in (torch.float16, torch.float32, torch.float64):
        if _representable(fmt, dtype):
            x = _inputs(fmt, dtype)
            cn.check(fmt, x)
            for mode in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
                inplace = x.clone()
                cn.native(fmt, mode, "saturate", None, inplace, out=inplace)
                cn.assert_same(inplace, cn.reference(fmt, mode, "saturate", None, x), x, (mode, "in place"))
