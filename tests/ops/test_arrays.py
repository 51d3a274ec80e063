"""Every array kind in, the same kind and dtype out, the same values: torch, NumPy, JAX (jit too), Dask."""

from __future__ import annotations

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import anynum as an
from anynum.errors import InputError, RepresentabilityError

pytestmark = pytest.mark.usefixtures("eager_only")

RNG = np.random.default_rng(0)
X = (RNG.standard_normal((6, 8)) * 3).astype(np.float32)
Y = (RNG.standard_normal((6, 8)) * 3).astype(np.float32)
M = (RNG.standard_normal((8, 5))).astype(np.float32)

CALLS = {
    "sin": lambda o, x, y, m: o.sin(x, "bf16", "ru"),
    "add_sr": lambda o, x, y, m: o.add(x, y, "e4m3fn", "sr", seed=3),
    "divide": lambda o, x, y, m: o.divide(x, y, "posit(8,2)", "rz"),
    "fma": lambda o, x, y, m: o.fma(x, y, x, "bf16", "ro"),
    "sum_axis": lambda o, x, y, m: o.sum(x, "bf16", axis=1),
    "mean_all_sr": lambda o, x, y, m: o.mean(x, "fp16", "sr", seed=1),
    "cumsum": lambda o, x, y, m: o.cumsum(x, "bf16", axis=0),
    "matmul": lambda o, x, y, m: o.matmul(x, m, "bf16"),
    "diff": lambda o, x, y, m: o.diff(x, "bf16", axis=1),
    "var": lambda o, x, y, m: o.var(x, "bf16", axis=0, keepdims=True),
    "clip": lambda o, x, y, m: o.clip(x, -1.0, 2.0, "e4m3fn"),
    "frexp": lambda o, x, y, m: o.frexp(x, "bf16"),
    "modf": lambda o, x, y, m: o.modf(x, "bf16", "sr", seed=2),
    "sqrt_sr": lambda o, x, y, m: o.sqrt(o.abs(x, "bf16"), "bf16", "sr", seed=5),
}


def as_numpy(out):
    if isinstance(out, tuple):
        return tuple(as_numpy(o) for o in out)
    if isinstance(out, torch.Tensor):
        return out.numpy()
    if hasattr(out, "compute"):
        return np.asarray(out.compute())
    return np.asarray(out)


def same(a, b):
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for p, q in zip(a, b):
            same(p, q)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_kinds_agree(name):
    call = CALLS[name]
    ref = as_numpy(call(an.ops, torch.from_numpy(X), torch.from_numpy(Y), torch.from_numpy(M)))
    out_np = call(an.ops, X, Y, M)
    assert isinstance(out_np if not isinstance(out_np, tuple) else out_np[0], (np.ndarray, np.generic))
    same(as_numpy(out_np), ref)
    out_jax = call(an.ops, jnp.asarray(X), jnp.asarray(Y), jnp.asarray(M))
    assert isinstance(out_jax if not isinstance(out_jax, tuple) else out_jax[0], jax.Array)
    same(as_numpy(out_jax), ref)
    out_da = call(an.ops, da.from_array(X, chunks=(4, 3)), da.from_array(Y, chunks=(4, 3)),
                  da.from_array(M, chunks=(3, 2)))
    assert isinstance(out_da if not isinstance(out_da, tuple) else out_da[0], da.Array)
    same(as_numpy(out_da), ref)


@pytest.mark.parametrize("name", ["sin", "add_sr", "sum_axis", "matmul", "frexp", "mean_all_sr"])
def test_jax_jit(name):
    call = CALLS[name]
    ref = as_numpy(call(an.ops, X, Y, M))
    out = jax.jit(lambda x, y, m: call(an.ops, x, y, m))(jnp.asarray(X), jnp.asarray(Y), jnp.asarray(M))
    same(as_numpy(out), ref)


@pytest.mark.parametrize("chunks", [(1, 8), (6, 1), (4, 5), (6, 8)])
def test_dask_stochastic_results_do_not_depend_on_chunking(chunks):
    ref = an.ops.multiply(X, Y, "e5m2", "sr", seed=7)
    dx, dy = da.from_array(X, chunks=chunks), da.from_array(Y, chunks=chunks)
    out = an.ops.multiply(dx, dy, "e5m2", "sr", seed=7)
    assert np.array_equal(out.compute(), ref)
    ref_sum = an.ops.sum(X, "e5m2", "sr", axis=0, seed=7)
    assert np.array_equal(an.ops.sum(da.from_array(X, chunks=chunks), "e5m2", "sr", axis=0, seed=7).compute(),
                          ref_sum)


def test_dtypes():
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert an.ops.sin(torch.ones(3, dtype=dt), "e4m3fn").dtype == dt
    assert an.ops.add(torch.ones(2, dtype=torch.float16), torch.ones(2), "e4m3fn").dtype == torch.float32
    assert an.ops.add(torch.ones(2, dtype=torch.float16), 1.5, "e4m3fn").dtype == torch.float16  # weak scalar
    assert an.ops.sin(torch.arange(3), "bf16").dtype == torch.get_default_dtype()
    assert an.ops.sin(np.arange(3), "bf16").dtype == np.float64
    out = an.ops.sin(0.5, "bf16")
    assert isinstance(out, np.float64) and out == 0.478515625
    assert an.ops.sin(np.float32(0.5), "bf16").dtype == np.float32
    assert an.ops.sin(np.ones((), np.float32), "bf16").shape == ()


def test_bad_inputs():
    with pytest.raises(RepresentabilityError):
        an.ops.sin(torch.ones(2, dtype=torch.float16), "fp32")
    with pytest.raises(InputError, match="different kinds"):
        an.ops.add(torch.ones(2), np.ones(2), "bf16")
    with pytest.raises(InputError, match="complex"):
        an.ops.sin(torch.ones(2, dtype=torch.complex64), "bf16")
    with pytest.raises(InputError, match="take torch tensors"):
        an.ops.sin([1.0, 2.0], "bf16")
    with pytest.raises(an.AnynumError, match="unknown"):
        an.ops.sin(torch.ones(2), "bf17")
    with pytest.raises(InputError, match="domain must be"):
        an.ops.sin(torch.ones(2), "bf16", domain="warn")
    with pytest.raises(InputError, match="integer exponents"):
        an.ops.ldexp(torch.ones(2), torch.ones(2), "bf16")


def test_block_formats_round_in_blocks():
    x = torch.tensor([[1.0, 0.3, -5.0, 100.0]])
    out = an.ops.multiply(x, torch.ones_like(x), an.Block(an.E2M1, 2))
    assert out.tolist() == an.quantize(x, an.Block(an.E2M1, 2)).tolist()


def test_no_gradient_is_silently_dropped():
    """Results are values, computed without autograd: they do not require grad."""
    x = torch.ones(3, requires_grad=True)
    assert not an.ops.sin(x, "bf16").requires_grad


def test_jit_stochastic_needs_a_seed_from_outside():
    f = jax.jit(lambda v: an.ops.add(v, v, "bf16", "sr"))
    with pytest.raises(InputError, match="concrete seed"):
        f(jnp.asarray(X))
    g = jax.jit(lambda v: an.ops.add(v, v, "bf16", "sr", seed=3))
    assert np.array_equal(np.asarray(g(jnp.asarray(X))), an.ops.add(X, X, "bf16", "sr", seed=3))
