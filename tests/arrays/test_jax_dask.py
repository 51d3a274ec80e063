"""JAX and Dask arrays through `an.quantize`: the torch path's results, bit for bit.

The oracle is the torch/NumPy path itself (already checked against ml_dtypes,
gfloat, SoftPosit and exact references elsewhere): these tests check that the
adapters neither change values nor random streams, whatever the chunking,
tracing or dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an

pytestmark = pytest.mark.usefixtures("eager_only")


def _data(shape=(20, 13), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))).astype(np.float32)
    x.flat[:4] = [np.inf, -np.inf, np.nan, -0.0]
    return x


def _bits_equal(a, b) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


# --- Dask ----------------------------------------------------------------------------------


@pytest.fixture
def da():
    return pytest.importorskip("dask.array")


@pytest.mark.parametrize("fmt", [an.E4M3FN, an.BF16, an.POSIT16, an.FixedPoint(4, 6)], ids=repr)
@pytest.mark.parametrize("mode", ["nearest", "sr", "rz"])
def test_dask_equals_numpy_whatever_the_chunks(da, fmt, mode):
    x = _data()
    seed = 7 if mode == "sr" else None
    want = an.quantize(x, fmt, mode, seed=seed)
    for chunks in ((7, 5), (20, 13), (1, 13), (3, 2)):
        lazy = an.quantize(da.from_array(x, chunks=chunks), fmt, mode, seed=seed)
        assert isinstance(lazy, da.Array)  # nothing computed yet
        _bits_equal(lazy.compute(), want)


def test_dask_float64_and_errors(da):
    x = _data().astype(np.float64)
    _bits_equal(an.quantize(da.from_array(x, chunks=4), an.E5M2).compute(), an.quantize(x, an.E5M2))
    with pytest.raises(an.AnynumError, match="float16/bfloat16/float32/float64 Dask"):
        an.quantize(da.ones(4, dtype=np.int32), an.E5M2)
    with pytest.raises(an.AnynumError, match="out="):
        an.quantize(da.ones(4), an.E5M2, out=np.empty(4))


# --- JAX -----------------------------------------------------------------------------------


@pytest.fixture
def jax():
    return pytest.importorskip("jax")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fmt", [an.E4M3FN, an.E5M2, an.FixedPoint(4, 3)], ids=repr)
def test_jax_equals_torch(jax, dtype, fmt):
    jnp = jax.numpy
    x = jnp.asarray(_data(), dtype=dtype)
    t = torch.from_dlpack(jnp.array(x, copy=True))
    want = an.quantize(t, fmt).view(torch.int16 if dtype != "float32" else torch.int32).numpy()
    got = an.quantize(x, fmt)
    assert got.dtype == x.dtype and got.shape == x.shape
    _bits_equal(np.asarray(got.view(jnp.int16 if dtype != "float32" else jnp.int32)), want)
    # inside jit the rounding runs as a host callback: same bits
    jitted = jax.jit(lambda a: an.quantize(a, fmt))(x)
    _bits_equal(np.asarray(jitted.view(jnp.int16 if dtype != "float32" else jnp.int32)), want)


def test_jax_gradient_passes_straight_through(jax):
    jnp = jax.numpy
    x = jnp.asarray([0.3, 1.7, -2.2, 100.0])
    g = jax.grad(lambda a: jnp.sum(an.quantize(a, an.E2M1) * jnp.arange(4.0)))(x)
    np.testing.assert_array_equal(np.asarray(g), [0.0, 1.0, 2.0, 3.0])
    gj = jax.jit(jax.grad(lambda a: jnp.sum(an.quantize(a, an.E2M1))))(x)
    np.testing.assert_array_equal(np.asarray(gj), np.ones(4))


def test_jax_stochastic_rounding_seeds_and_keys(jax):
    jnp = jax.numpy
    x = _data()
    want = an.quantize(torch.from_numpy(x), an.E4M3FN, "sr", seed=11).numpy()
    _bits_equal(np.asarray(an.quantize(jnp.asarray(x), an.E4M3FN, "sr", seed=11)), want)
    key = jax.random.key(3)
    a = an.quantize(jnp.asarray(x), an.E4M3FN, "sr", generator=key)
    b = an.quantize(jnp.asarray(x), an.E4M3FN, "sr", generator=key)
    c = an.quantize(jnp.asarray(x), an.E4M3FN, "sr", generator=jax.random.key(4))
    _bits_equal(np.asarray(a), np.asarray(b))  # the same key, the same draw
    assert not np.array_equal(np.asarray(a), np.asarray(c), equal_nan=True)


def test_jax_errors(jax):
    jnp = jax.numpy
    with pytest.raises(an.AnynumError, match="float16/bfloat16/float32/float64 JAX"):
        an.quantize(jnp.arange(3), an.E5M2)
    with pytest.raises(an.AnynumError, match="out="):
        an.quantize(jnp.ones(3), an.E5M2, out=np.empty(3))


def test_dask_unknown_chunk_sizes_raise(da):
    x = da.from_array(_data(), chunks=5)
    masked = x[x > 0]  # unknown chunk sizes
    with pytest.raises(an.AnynumError, match="compute_chunk_sizes"):
        an.quantize(masked, an.E5M2)


def test_dask_bfloat16_zero_dim_and_block_formats(da):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = _data()
    xb = x.astype(ml_dtypes.bfloat16)
    got = an.quantize(da.from_array(xb, chunks=(3, 5)), an.E4M3FN).compute()
    want = an.quantize(torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16), an.E4M3FN)
    np.testing.assert_array_equal(got.view(np.int16), want.view(torch.int16).numpy())
    scalar = an.quantize(da.from_array(np.array(0.3)), an.POSIT8).compute()
    assert scalar.shape == () and float(scalar) == float(an.quantize(np.array(0.3), an.POSIT8))
    with pytest.raises(an.AnynumError, match="Block formats"):
        an.quantize(da.from_array(x, chunks=5), an.MXFP8_E4M3)


def test_encode_refuses_jax_and_dask_clearly(da, jax):
    for arr in (da.ones(3), jax.numpy.ones(3)):
        with pytest.raises(an.AnynumError, match="encode takes torch tensors and NumPy arrays"):
            an.encode(arr, an.E4M3FN)


def test_jax_vmap_and_stochastic_rounding_under_tracing(jax):
    jnp = jax.numpy
    x = jnp.asarray(_data((4, 9)))
    rows = jax.vmap(lambda v: an.quantize(v, an.E4M3FN, "sr", seed=3))(x)
    for i in range(4):  # each example is rounded as its own array
        _bits_equal(np.asarray(rows[i]), np.asarray(an.quantize(x[i], an.E4M3FN, "sr", seed=3)))
    with pytest.raises(an.AnynumError, match="concrete seed"):
        jax.jit(lambda v: an.quantize(v, an.E4M3FN, "sr"))(x)
    with pytest.raises(an.AnynumError, match="concrete seed"):
        jax.jit(lambda v, k: an.quantize(v, an.E4M3FN, "sr", generator=k))(x, jax.random.key(0))
    key = jax.random.key(1)  # a concrete key closed over is fine, and fixed like seed=
    a = jax.jit(lambda v: an.quantize(v, an.E4M3FN, "sr", generator=key))(x)
    _bits_equal(np.asarray(a), np.asarray(an.quantize(x, an.E4M3FN, "sr", generator=key)))


def test_dask_threads_share_the_compiled_kernel_safely(da, monkeypatch):
    """Dask's threaded scheduler runs chunks concurrently; compiled calls are serialised."""
    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    x = _data((8, 5000), seed=3)
    lazy = an.quantize(da.from_array(x, chunks=(1, 5000)), an.Posit(12, 1), "rz")  # a compiled kernel
    got = lazy.compute(scheduler="threads", num_workers=4)
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    _bits_equal(got, an.quantize(x, an.Posit(12, 1), "rz"))
