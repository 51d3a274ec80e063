"""Differential fuzzing over array types and layouts: a strided view, a transposed matrix, a
channels-last tensor, 0-d and empty tensors, ``out=`` (also in place), NumPy, JAX and Dask arrays
all give the contiguous torch tensor's result, bit for bit, in its own type and dtype (stochastic
modes too: the random bits follow the logical element index)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fuzzlib import FORMATS, MODES, as_tensor, count, fuzz, inputs, rng_for, same
from hypothesis import given, note
from hypothesis import strategies as st

import anynum as an
from anynum.errors import AnynumError
from anynum.rounding import Rounding

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::RuntimeWarning")]

KINDS = ["strided", "transposed", "channels_last", "0-d", "empty", "out", "in_place", "numpy", "jax", "dask"]
_NP = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


@st.composite
def array_cases(draw):
    fmt = draw(FORMATS)
    mode = draw(MODES)
    overflow = draw(st.sampled_from([None, *fmt.overflow_policies]))
    rand_bits = draw(st.sampled_from([None, 3])) if mode is Rounding.STOCHASTIC else None
    kind = draw(st.sampled_from(KINDS))
    dtypes = {
        "numpy": [torch.float32, torch.float64, torch.float16],
        "dask": [torch.float32, torch.float64],
        "jax": [torch.float32, torch.float16, torch.bfloat16],
    }
    dtype = draw(
        st.sampled_from(dtypes.get(kind, [torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    )
    values = draw(inputs(fmt, max_size=30))
    return fmt, mode, overflow, rand_bits, kind, dtype, values, draw(st.integers(0, 2**62))


def _reference(x: torch.Tensor, fmt, mode, kw):
    try:
        return an.quantize(x.contiguous(), fmt, mode, **kw)
    except AnynumError as exc:
        note(f"refused: {exc}")
        return None


@fuzz(ci_examples=120)
@given(case=array_cases())
def test_array_types_and_layouts_agree(case):
    fmt, mode, overflow, rand_bits, kind, dtype, values, seed = case
    note(f"{kind} {fmt!r} {mode} {overflow} {dtype}")
    kw = {"overflow": overflow, "generator": rng_for(mode, seed), "rand_bits": rand_bits}
    x = as_tensor(values, dtype)
    if kind in ("transposed", "channels_last"):
        n = x.numel() // 6 * 6
        if n == 0:
            return
        x = x[:n].reshape(2, 3, -1) if kind == "channels_last" else x[:n].reshape(3, -1)
    ref = _reference(x.reshape(1, *x.shape[0:]) if kind == "channels_last" else x, fmt, mode, kw)
    if ref is None:
        return
    count(f"array {kind}")
    if kind == "strided":
        base = torch.full((2 * x.numel() + 1,), 7.0, dtype=dtype)
        view = base[1::2]
        view.copy_(x)
        got = an.quantize(view, fmt, mode, **kw)
        assert same(got, ref) and bool((base[0::2] == 7.0).all())
    elif kind == "transposed":
        t = x.T.contiguous().T  # same values, column-major storage
        assert not t.is_contiguous()
        assert same(an.quantize(t, fmt, mode, **kw), ref)
    elif kind == "channels_last":
        t = x.reshape(1, *x.shape).contiguous(memory_format=torch.channels_last)
        got = an.quantize(t, fmt, mode, **kw)
        assert same(got, ref)
    elif kind == "0-d":
        if x.numel() == 0 or isinstance(fmt, an.Block):
            return
        one = an.quantize(x[0].clone(), fmt, mode, **kw)
        assert one.dim() == 0 and same(one.reshape(1), ref[:1])
    elif kind == "empty":
        for shape in [(0,), (3, 0), (0, 2, 0)]:
            try:
                e = an.quantize(torch.empty(shape, dtype=dtype), fmt, mode, **kw)
            except AnynumError:
                continue  # e.g. a block axis the shape does not have
            assert e.shape == shape and e.dtype == dtype
    elif kind == "out":
        out = torch.full_like(x, 3.0)
        assert an.quantize(x, fmt, mode, out=out, **kw) is out and same(out, ref)
    elif kind == "in_place":
        y = x.clone()
        assert an.quantize(y, fmt, mode, out=y, **kw) is y and same(y, ref)
    elif kind == "numpy":
        a = x.numpy()
        got = an.quantize(a, fmt, mode, **kw)
        assert isinstance(got, np.ndarray) and got.dtype == a.dtype
        assert same(torch.from_numpy(np.ascontiguousarray(got)), ref)
    elif kind == "jax":
        jnp = pytest.importorskip("jax.numpy")
        j = jnp.asarray(x.float().numpy()).astype(
            {torch.float32: jnp.float32, torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16}[dtype]
        )
        got = an.quantize(j, fmt, mode, **kw)
        assert got.dtype == j.dtype
        assert same(torch.from_numpy(np.asarray(got.astype(jnp.float32))), ref)
    elif kind == "dask":
        da = pytest.importorskip("dask.array")
        if isinstance(fmt, an.Block):
            return  # refused by design (blocks cross chunk borders)
        arr = da.from_array(x.numpy(), chunks=max(1, x.numel() // 3 + 1))
        got = an.quantize(arr, fmt, mode, **kw).compute()
        assert got.dtype == _NP[dtype]
        assert same(torch.from_numpy(got), ref)
