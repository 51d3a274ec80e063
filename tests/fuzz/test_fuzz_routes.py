"""Differential fuzzing of the rounding kernels.

Random formats of every family (presets, FloatFormat over its whole parameter space, posits
n=2..32 with extreme es, fixed point and integers, tiny to huge tables, blocks with odd sizes and
axes), every rounding mode and overflow policy, every input dtype, inputs with special values
and grid midpoints mixed in. Checked: every kernel route (`fuzzlib.kernel_routes`) gives the
front door's result bit for bit; results are on the grid; rounding is idempotent, monotone
where the mode is and sign-symmetric where it is (RU(-x) = -RD(x) too); encode and decode
invert each other; nothing raises but AnynumError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fuzzlib import (
    DTYPES,
    ELEMENTWISE,
    FAST_FLOATS,
    FORMATS,
    MODES,
    as_tensor,
    count,
    diff,
    exact_wrap,
    fuzz,
    inputs,
    kernel_routes,
    rng_for,
    same,
    symmetric_values,
)
from hypothesis import given, note
from hypothesis import strategies as st

import anynum as an
from anynum.errors import AnynumError, FormatError
from anynum.rounding import Rounding

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]


@st.composite
def cases(draw, formats=FORMATS):
    fmt = draw(formats)
    mode = draw(MODES)
    overflow = draw(st.sampled_from([None, *fmt.overflow_policies]))
    rand_bits = draw(st.one_of(st.none(), st.integers(1, 52))) if mode is Rounding.STOCHASTIC else None
    dtype = draw(DTYPES)
    values = draw(inputs(fmt))
    if isinstance(fmt, an.Block) and len(values) >= 4 and draw(st.booleans()):
        rows = draw(st.sampled_from([2, 3]))
        values = values[: len(values) // rows * rows].reshape(rows, -1)
        if draw(st.booleans()):
            values = values.T
    return fmt, mode, overflow, rand_bits, dtype, values, draw(st.integers(0, 2**62))


def quantize_or_none(x, fmt, mode, **kw):
    """`an.quantize`, or None when it refuses with an AnynumError (any other exception fails)."""
    try:
        return an.quantize(x, fmt, mode, **kw)
    except AnynumError as exc:
        note(f"refused: {exc}")
        count("refused (AnynumError)")
        return None


def check_on_grid(fmt: an.Format, y: torch.Tensor, x: torch.Tensor, overflow: str) -> None:
    """Every result is a value of the format, or ±inf / NaN where the format's rules give them."""
    y64, x64 = y.to(torch.float64).reshape(-1), x.to(torch.float64).reshape(-1)
    fin = torch.isfinite(y64)
    if not isinstance(fmt, an.Block) and fmt.bits <= 16:
        vals = torch.from_numpy(fmt.values())
        member = torch.isin(y64[fin], vals)
        assert bool(member.all()), f"off the grid of {fmt!r}: {y64[fin][~member][:5].tolist()}"
    inf = torch.isinf(y64)
    if bool(inf.any()):
        assert (fmt.has_inf and overflow == "inf") or (isinstance(fmt, an.Block) and fmt.tensor_scale), (
            f"±inf from {fmt!r} under overflow={overflow!r}"
        )
    nan = torch.isnan(y64) & ~torch.isnan(x64)
    if bool(nan.any()) and not isinstance(fmt, an.Block):  # (a NaN anywhere makes its whole block NaN)
        why = torch.isinf(x64) | (overflow == "nan")
        if not fmt.signed or (isinstance(fmt, an.Table) and fmt.negative == "nan"):
            why |= x64 < 0
        assert bool(why[nan].all()), f"NaN from finite inputs {x64[nan & ~why][:5].tolist()}"


def check_monotone(x: torch.Tensor, y: torch.Tensor) -> None:
    """Nondecreasing in x, with -0.0 before +0.0 (a format without zero sends them apart)."""
    x64, y64 = x.to(torch.float64).reshape(-1), y.to(torch.float64).reshape(-1)
    keep = ~torch.isnan(x64) & ~torch.isnan(y64)
    xs = x64[keep].numpy()
    order = torch.from_numpy(np.lexsort((~np.signbit(xs), xs)).copy())
    ys = y64[keep][order]
    assert bool((ys[1:] >= ys[:-1]).all()), f"not monotone: {x64[keep][order].tolist()} -> {ys.tolist()}"


def zero_sign_kept(fmt: an.Format) -> bool:
    inner = fmt.element if isinstance(fmt, an.Block) else fmt
    return bool(inner.has_negative_zero or (isinstance(inner, an.Table) and inner.signed_zero))


@fuzz(ci_examples=150)
@given(case=cases())
def test_routes_agree_and_rounding_is_right(case):
    fmt, mode, overflow, rand_bits, dtype, values, seed = case
    note(f"{fmt!r} {mode} overflow={overflow} rand_bits={rand_bits} {dtype}")
    count("cases")
    x = as_tensor(values, dtype)
    rng = rng_for(mode, seed)
    kw = {"overflow": overflow, "generator": rng, "rand_bits": rand_bits}
    y = quantize_or_none(x, fmt, mode, **kw)
    if y is None:
        return
    assert y.dtype == x.dtype and y.shape == x.shape
    policy = fmt.check_overflow(overflow)

    # every kernel route: the front door's result, bit for bit
    for name, run in kernel_routes(fmt, x, mode, policy, rng, rand_bits, compiled=False).items():
        r = run()
        if r is not None:
            assert same(r.to(x.dtype), y), f"route {name}: {diff(x, r, y)}"
            count(f"route {name}")

    if policy == "wrap" and not mode.is_stochastic:  # an exact oracle for wrap-around
        for xi, yi in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist()):
            if math.isfinite(xi):
                assert yi == exact_wrap(fmt, mode, xi), (
                    f"wrap of {xi!r}: {yi!r}, exactly {exact_wrap(fmt, mode, xi)!r}"
                )
        count("exact wrap")
    check_on_grid(fmt, y, x, policy)
    if not isinstance(fmt, an.Block):  # a block's scale can change when its values are re-rounded
        again = an.quantize(y, fmt, mode, **kw)
        assert same(again, y), f"not idempotent: {diff(x, again, y)}"
        if not mode.is_stochastic and policy != "wrap":
            check_monotone(x, y)

    # sign symmetry: q(-x) = -q(x) (stochastic: with the same bits), RU(-x) = -RD(x)
    mask = torch.ones_like(x, dtype=torch.bool)
    if isinstance(fmt, (an.FixedPoint, an.IntFormat)) and fmt.signed:
        mask = x.to(torch.float64).abs() <= fmt.max  # two's complement: symmetric inside ±max
    if (symmetric_values(fmt) or (isinstance(fmt, (an.FixedPoint, an.IntFormat)) and fmt.signed)) and (
        mode.sign_symmetric or mode.is_stochastic or mode in (Rounding.UP, Rounding.DOWN)
    ):
        if isinstance(fmt, an.Block) or bool(mask.all()):
            twin = {Rounding.UP: Rounding.DOWN, Rounding.DOWN: Rounding.UP}.get(mode, mode)
            neg = an.quantize(-x, fmt, twin, **kw)
            keep = zero_sign_kept(fmt)
            assert same(neg, -y, zero_sign=keep), f"not sign-symmetric: {diff(x, neg, -y, zero_sign=keep)}"
            count("sign symmetry")

    # encode/decode invert each other
    if isinstance(fmt, an.Block):
        try:
            codes = fmt.encode(x, mode, **kw)
        except AnynumError:
            return
        back = fmt.decode(codes).to(x.dtype)  # NVFP4-style values in float32: rounded once (docs/block.md)
    else:
        try:
            codes = an.encode(x, fmt, mode, **kw)
        except FormatError as exc:
            assert not fmt.has_nan and bool(torch.isnan(y).any()), f"encode refused: {exc}"
            return
        assert codes.dtype == torch.int64
        if fmt.bits < 63:
            assert bool(((codes >= 0) & (codes < 2**fmt.bits)).all()), codes
        back = an.decode(codes, fmt)
    tables_lose_zero_sign = isinstance(fmt, an.Table)
    assert same(back.to(torch.float64), y.to(torch.float64), zero_sign=not tables_lose_zero_sign), (
        f"decode(encode): {diff(x, back, y)}"
    )
    count("encode/decode")


@fuzz(ci_examples=60)
@given(fmt=ELEMENTWISE, data=st.data())
def test_codes_decode_and_encode_back(fmt, data):
    """encode(decode(c)) == c for every code of a small format (a sample of a wide one)."""
    count("codes")
    n = 1 << fmt.bits
    if n <= 1 << 12:
        codes = torch.arange(n)
    else:  # (codes of 64-bit formats above 2**63 do not fit int64: see test_regressions)
        top = min(n, 1 << 63) - 1
        codes = torch.tensor(data.draw(st.lists(st.integers(0, top), min_size=1, max_size=64)))
    values = an.decode(codes, fmt)
    assert values.dtype == torch.float64 and values.shape == codes.shape
    real = ~torch.isnan(values)
    if isinstance(fmt, an.Table):
        real &= codes < fmt.size  # unused codes decode to NaN
    back = an.encode(values[real], fmt)
    # Codes of one value (flushed subnormals all read 0) come back as one of them: compare values.
    again = an.decode(back, fmt)
    assert same(again, values[real]), f"{fmt!r}: {diff(codes[real], again, values[real])}"
    unique = torch.unique(values[real]).numel() == int(real.sum()) and not torch.any(values[real] == 0)
    if unique:
        assert torch.equal(back, codes[real])


@st.composite
def fast_cases(draw):
    fmt = draw(FAST_FLOATS)
    mode = draw(st.sampled_from([m for m in Rounding if not m.is_stochastic]))
    overflow = draw(st.sampled_from([None, *fmt.overflow_policies]))
    values = draw(inputs(fmt, max_size=40))
    return fmt, mode, overflow, values


@fuzz(ci_examples=100)
@given(case=fast_cases())
def test_fast_routes_agree(case):
    """Float formats on float32 CPU tensors, deterministic modes: the C loop and torch's casts."""
    fmt, mode, overflow, values = case
    count("fast cases")
    x = as_tensor(values, torch.float32)
    y = quantize_or_none(x, fmt, mode, overflow=overflow)
    if y is None:
        return
    policy = fmt.check_overflow(overflow)
    for name, run in kernel_routes(fmt, x, mode, policy, None, None, compiled=False).items():
        r = run()
        if r is not None:
            assert same(r.to(x.dtype), y), f"route {name}: {diff(x, r, y)}"
            count(f"route {name}")
    check_on_grid(fmt, y, x, policy)


# --- the compiled route, on a fixed small set (compiling takes seconds per kernel) -------------------------

COMPILED_FORMATS = [an.E4M3FN, an.E2M1, an.Posit(8, 1), an.FixedPoint(4, 3), an.Table.from_format(an.E2M1)]
COMPILED_CI = [(an.E4M3FN, Rounding.STOCHASTIC)]
LENGTH = 48  # one shape: one compile per kernel


@st.composite
def compiled_cases(draw):
    from fuzzlib import LONG

    if LONG:
        fmt, mode = draw(st.sampled_from(COMPILED_FORMATS)), draw(MODES)
    else:
        fmt, mode = draw(st.sampled_from(COMPILED_CI))
    values = draw(inputs(fmt, max_size=LENGTH))
    values = np.resize(values, LENGTH) if values.size else np.zeros(LENGTH)
    rand_bits = draw(st.sampled_from([None, 5])) if mode is Rounding.STOCHASTIC else None
    return fmt, mode, rand_bits, values, draw(st.integers(0, 2**62))


@pytest.mark.slow
@fuzz(ci_examples=15, long_examples=3000)
@given(case=compiled_cases())
def test_compiled_route_agrees(case):
    fmt, mode, rand_bits, values, seed = case
    count("compiled")
    x = torch.from_numpy(values).float()
    rng = rng_for(mode, seed)
    policy = fmt.check_overflow(None)
    routes = kernel_routes(fmt, x, mode, policy, rng, rand_bits, compiled=True)
    ref = routes["eager"]()
    got = routes["compiled"]()
    assert same(got, ref), diff(x, got, ref)
