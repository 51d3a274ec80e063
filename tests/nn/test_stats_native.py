"""The C loop of `Stats.add` against its torch reference: counts, histogram and maximum equal,
float64 sums equal up to summation order, on special values, subnormals and random data."""

from __future__ import annotations

import math

import pytest
import torch

import anynum as an
from anynum.nn.stats import Stats
from anynum.nn.statsnative import _library

pytestmark = [
    pytest.mark.usefixtures("eager_only"),
    pytest.mark.skipif(_library() is None, reason="no C compiler: the reference is the only path"),
]

SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, -1e-45, 2**-126, 3e38, -3e38, 1.0, -448.5, 1e-8]


def both(fmt, x, y, **kw):
    fast, ref = Stats(fmt, **kw), Stats(fmt, **kw)
    fast.add(x, y)
    ref.add(x, y, reference=True)
    return fast, ref


def assert_same(fast: Stats, ref: Stats) -> None:
    a, b = fast.summary(), ref.summary()
    for key in ("count", "nonzero", "nan", "max_abs", "overflow", "underflow", "subnormal", "log2_hist"):
        assert a[key] == b[key], key
    pairs = [(a[k], b[k], k) for k in ("sqnr_db", "rel_err", "sr_rel_var")]
    pairs += [(a["candidates"][c], b["candidates"][c], c) for c in b["candidates"]]
    for u, v, key in pairs:
        if u is None or (isinstance(u, float) and not math.isfinite(u)):
            assert u == v or (u != u and v != v), key
        else:
            assert u == pytest.approx(v, rel=1e-12), key


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e2m1", "bf16", "posit(8,2)", "fixed(8,4)", "mxfp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_and_random_values(fmt, dtype):
    g = torch.Generator().manual_seed(0)
    rand = torch.randn(5000, generator=g, dtype=dtype) * torch.exp2(
        torch.randint(-40, 12, (5000,), generator=g)
    )
    x = torch.cat([torch.tensor(SPECIAL, dtype=dtype), rand])
    y = an.quantize(x, fmt)
    candidates = [("e2m1", an.E2M1), ("bf16", an.BF16), ("fp64", an.FP64)]
    assert_same(*both(an.format(fmt), x, y, candidates=candidates))


def test_float64_subnormals_in_the_histogram():
    x = torch.tensor([5e-324, 1e-310, 2.5e-308, 1.0], dtype=torch.float64)
    fast, ref = both(an.BF16, x, torch.zeros_like(x))
    assert fast.summary()["log2_hist"] == ref.summary()["log2_hist"]
    assert set(fast.summary()["log2_hist"]) == {-1074, math.floor(math.log2(1e-310)), -1022, 0}


def test_calls_accumulate_and_mix_with_the_reference():
    x = torch.randn(3, 100, generator=torch.Generator().manual_seed(1))
    y = an.quantize(x, "e3m2")
    mixed, ref = Stats(an.E3M2), Stats(an.E3M2)
    for i in range(3):
        mixed.add(x[i], y[i], reference=i == 1)
        ref.add(x[i], y[i], reference=True)
    assert_same(mixed, ref)


def test_strided_and_half_inputs():
    x = torch.randn(40, 30, generator=torch.Generator().manual_seed(2)).t()  # not contiguous
    y = an.quantize(x, "e4m3fn", "sr", seed=0)
    assert_same(*both(an.E4M3FN, x, y, mode="sr"))
    h = x.to(torch.bfloat16)  # not a C-loop dtype: the reference path
    assert_same(*both(an.E4M3FN, h, an.quantize(h, "e4m3fn")))
