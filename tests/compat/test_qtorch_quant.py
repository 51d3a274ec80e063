"""The qtorch facade's quantizers against independent oracles (no peer needed).

Floats: IEEE rounding by definition in exact arithmetic (compat_oracle.ieee_round)
and torch's own float16/bfloat16 casts; fixed point and block floating point:
NumPy float64 formulas (exact for float32 inputs); posits: SoftPosit; tables:
brute-force nearest search. The relations QPyTorch's own tests check are
re-derived here: fixed point stays on its grid and in range, clamping,
symmetric ranges, block exponents per dimension, stochastic rounding is
unbiased, and the Quantizer rounds forward values and backward gradients.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from compat_oracle import ieee

from anynum.compat import qtorch
from anynum.compat.qtorch.quant import (
    Quantizer,
    block_quantize,
    configurable_table_quantize,
    configurable_table_quantize_rounding_hint,
    fixed_point_quantize,
    float_quantize,
    new_format_quantize,
    posit_quantize,
    posit_sigmoid,
    posit_tanh,
    quantizer,
)
from anynum.errors import AnynumError

FLOATS = [(5, 10), (8, 7), (5, 2), (4, 3), (3, 2)]


@pytest.mark.parametrize("exp,man", FLOATS)
def test_float_quantize_nearest_is_ieee_rounding(exp, man, probe_points, same_values):
    grid, _ = ieee.grid(exp, man)
    x = probe_points(grid[:-1], top_step=grid[-2] - grid[-3])["float32"]
    if x.size > 6000:  # wide formats: a fixed sample of the probes (torch casts cover them all below)
        x = np.random.default_rng(exp * man).choice(x, 6000, replace=False)
    got = float_quantize(torch.from_numpy(x), exp, man, "nearest").numpy()
    same_values(got, ieee.round(x.astype(np.float64), exp, man, "rne"), x, what=f"e{exp}m{man}")


def test_float_quantize_matches_torch_casts(random_values, same_values):
    x = torch.from_numpy(random_values(100_000, np.float32, seed=1, lo_exp=-30, hi_exp=20))
    same_values(float_quantize(x, 5, 10, "nearest"), x.half().float(), x, what="fp16")
    same_values(float_quantize(x, 8, 7, "nearest"), x.bfloat16().float(), x, what="bf16")
    assert float_quantize(x, 8, 23, "nearest").equal(x)  # man=23 is the identity (QPyTorch flips signs)


def test_float_specials_keep_ieee_meaning():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 65519.0, 65520.0, 131000.0])
    assert float_quantize(x, 5, 10, "nearest").tolist()[1:] == [
        math.inf,
        -math.inf,
        -0.0,
        65504.0,
        math.inf,
        math.inf,
    ]
    assert math.isnan(float_quantize(x, 5, 10, "nearest")[0])
    assert float_quantize(torch.tensor([-1e-30]), 5, 10, "stochastic")[0].item() == 0.0
    assert math.copysign(1, float_quantize(torch.tensor([-1e-30]), 5, 10, "nearest").item()) == -1


def _fixed_oracle(x: np.ndarray, wl: int, fl: int, clamp=True, symmetric=False) -> np.ndarray:
    s = 2.0**fl
    y = np.round(x.astype(np.float64) * s)
    if clamp:
        lo = -(2.0 ** (wl - 1)) + (1 if symmetric else 0)
        y = np.clip(y, lo, 2.0 ** (wl - 1) - 1)
    return np.copysign(y / s, x).astype(x.dtype)


@pytest.mark.parametrize("wl,fl", [(8, 4), (4, 2), (16, 8), (12, 0), (6, 9), (8, -2)])
@pytest.mark.parametrize("clamp,symmetric", [(True, False), (True, True), (False, False)])
def test_fixed_point_nearest(wl, fl, clamp, symmetric, random_values, same_values):
    x = random_values(20_000, np.float32, seed=wl * 100 + fl, lo_exp=-14, hi_exp=30)
    x = np.concatenate([x, np.float32([0.0, -0.0, 2.5 / 2**fl, -2.5 / 2**fl, 3.5 / 2**fl])])
    got = fixed_point_quantize(torch.from_numpy(x), wl, fl, clamp, symmetric, "nearest").numpy()
    same_values(got, _fixed_oracle(x, wl, fl, clamp, symmetric), x, what=f"fixed({wl},{fl})")


def test_fixed_point_specials():
    x = torch.tensor([float("nan"), float("inf"), -float("inf")])
    y = fixed_point_quantize(x, 8, 4, rounding="nearest")
    assert math.isnan(y[0]) and y[1:].tolist() == [7.9375, -8.0]
    assert fixed_point_quantize(x, 8, 4, clamp=False, rounding="nearest")[1:].tolist() == [
        math.inf,
        -math.inf,
    ]


def _block_oracle(x: np.ndarray, wl: int, dim: int) -> np.ndarray:
    x64 = x.astype(np.float64)
    if dim == -1:
        amax = np.full_like(x64, np.abs(x64).max())
    else:
        moved = np.moveaxis(np.abs(x64), dim, 0).reshape(x.shape[dim], -1)
        amax = np.moveaxis(
            np.broadcast_to(moved.max(1).reshape([-1] + [1] * (x.ndim - 1)), np.moveaxis(x64, dim, 0).shape),
            0,
            dim,
        )
    e = np.floor(np.log2(np.where(amax > 0, amax, 1.0)))
    step = 2.0 ** (e + 2 - wl)
    top = 2.0 ** (e + 1) - step
    return np.copysign(np.clip(np.round(x64 / step) * step, -top, top), x64).astype(x.dtype)


@pytest.mark.parametrize("wl", [3, 4, 8, 12])
@pytest.mark.parametrize(
    "shape,dim", [((1000,), -1), ((64, 50), 0), ((64, 50), 1), ((4, 5, 6), 1), ((4, 5, 6), 2), ((7,), 0)]
)
def test_block_quantize_nearest(wl, shape, dim, same_values):
    g = torch.Generator().manual_seed(wl)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g).float())
    got = block_quantize(x, wl, dim, "nearest").numpy()
    same_values(got, _block_oracle(x.numpy(), wl, dim), x.numpy(), what=f"block wl={wl} dim={dim}")


def test_block_quantize_special_blocks():
    x = torch.tensor([[1.0, float("nan")], [0.5, -0.25], [0.0, -0.0]])
    y = block_quantize(x, 8, dim=0, rounding="nearest")
    assert torch.isnan(y[0]).all() and y[1].tolist() == [0.5, -0.25]
    assert torch.signbit(y[2]).tolist() == [False, True]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: float_quantize(x, 5, 2, "stochastic"),
        lambda x: fixed_point_quantize(x, 8, 2),
        lambda x: block_quantize(x, 6),
        lambda x: posit_quantize(x, 8, 1, rounding="stochastic"),
    ],
    ids=["float", "fixed", "block", "posit"],
)
def test_stochastic_rounding_is_unbiased_and_follows_manual_seed(fn):
    x = torch.full((40_000,), 1.3)
    x[0] = 1.9  # the block's exponent
    torch.manual_seed(5)
    a = fn(x)
    torch.manual_seed(5)
    assert torch.equal(a, fn(x))  # reproducible under torch.manual_seed
    assert not torch.equal(a, fn(x))  # successive calls draw fresh bits
    vals = a[1:].double()
    lo, hi = vals.min().item(), vals.max().item()
    p = (1.3 - lo) / (hi - lo)
    n = vals.numel()
    frac_up = (vals == hi).double().mean().item()
    assert lo < 1.3 < hi and abs(frac_up - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_posit_quantize_matches_softposit():
    sp = pytest.importorskip("softposit")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=g) * torch.exp2(torch.randint(-20, 20, (3000,), generator=g).float())
    for n, es, conv in [(8, 0, sp.posit8), (16, 1, sp.posit16), (12, 2, lambda v: sp.posit_2(v, 12))]:
        for scale in (1.0, 8.0):
            want = [float(conv(float(v) * scale)) / scale for v in x.tolist()]
            got = posit_quantize(x, n, es, scale=scale).tolist()
            assert got == want, (n, es, scale)


def test_posit_quantize_specials_and_wide_posits():
    y = posit_quantize(torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, 1e-30]), 8, 1)
    assert torch.isnan(y[:3]).all() and y[3].item() == 0.0 and y[4].item() == 2.0**-12  # minpos
    assert posit_quantize(torch.tensor([1.0 + 2**-20]), 32, 2).item() == 1.0 + 2**-20  # nsize > 16 works
    assert posit_quantize(torch.tensor([0.3]), 6, 1, scale=3).item() == np.float32(0.875 / 3)  # 0.9 -> 0.875


def test_posit_sigmoid_and_tanh_bit_trick():
    # Hand-decoded posit(16, 0) codes: 2.0 is 0x6000 -> (0x6000 ^ 0x8000) >> 2 = 0x3800 = 0.875.
    assert posit_sigmoid(torch.tensor([0.0, 2.0, -2.0]), 16).tolist() == [0.5, 0.875, 0.125]
    assert posit_tanh(torch.tensor([1.0]), 16).tolist() == [0.75]  # 2 * sigmoid(2) - 1
    y = posit_sigmoid(torch.linspace(-8, 8, 101), 8)
    assert (
        bool((torch.diff(y) >= 0).all()) and torch.isnan(posit_sigmoid(torch.tensor([float("nan")]), 8)).all()
    )
    posit8 = set(qtorch.Posit(8, 0).format.values().tolist())
    assert set(y.tolist()) <= posit8  # the posit8 sigmoid is a posit8 value


def _table_oracle(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    mags = np.unique(np.abs(table))
    a = np.abs(x.astype(np.float64))[:, None]
    d = np.abs(a - mags[None, :])
    idx = np.argmin(d, axis=1)  # first minimum: the smaller magnitude at a tie
    y = mags[idx]
    y = np.where(np.isinf(x), mags[-1], y)
    return np.where(x == 0, x, np.copysign(y, x)).astype(x.dtype)


def test_table_quantizers_round_to_the_nearest_entry(same_values):
    table = np.array([0.125, 0.25, 0.5, 1.0, 3.0], dtype=np.float32)
    x = np.concatenate(
        [np.linspace(-4, 4, 801, dtype=np.float32), np.float32([0.0, -0.0, 2.0, np.inf, -np.inf])]
    )
    got = configurable_table_quantize(torch.from_numpy(x), torch.from_numpy(table)).numpy()
    same_values(got, _table_oracle(x, table), x, what="table")
    assert math.isnan(
        configurable_table_quantize(torch.tensor([float("nan")]), torch.from_numpy(table)).item()
    )
    got = new_format_quantize(torch.from_numpy(x)).numpy()
    from anynum.compat.qtorch.quant.plus import NEW_FORMAT

    same_values(got, _table_oracle(x, np.array(NEW_FORMAT)), x, what="new_format")
    hint = configurable_table_quantize_rounding_hint(
        torch.tensor([0.6, 0.75, 0.76, 0.09]), torch.tensor([0.5, 1.0]), torch.tensor([0.1, 0.75])
    )
    assert hint.tolist() == [0.5, 0.5, 1.0, 0.0]


def test_quantizer_rounds_forward_and_backward():
    fwd, bwd = qtorch.FixedPoint(wl=8, fl=4), qtorch.FloatingPoint(exp=5, man=2)
    q = quantizer(fwd, bwd, "nearest", "nearest")
    x = torch.tensor([0.3, 100.0, -0.01], requires_grad=True)
    y = q(x)
    assert y.tolist() == [0.3125, 7.9375, -0.0]
    y.backward(torch.tensor([0.3, 1000.0, -3.3]))
    assert x.grad.tolist() == [0.3125, 1024.0, -3.5]
    module = Quantizer(forward_number=fwd, backward_number=bwd, forward_rounding="nearest")
    assert pickle.loads(pickle.dumps(module))(x).tolist() == [0.3125, 7.9375, -0.0]


def test_quantizer_clamping_grad_zero_and_hooks():
    q = quantizer(
        qtorch.FixedPoint(4, 2),
        qtorch.FloatingPoint(8, 7),
        "nearest",
        "nearest",
        clamping_grad_zero=True,
        backward_hooks=[lambda g: g * 2],
    )
    x = torch.tensor([0.3, 5.0, -5.0], requires_grad=True)
    q(x).sum().backward()
    assert x.grad.tolist() == [2.0, 0.0, 0.0]  # clamped values get no gradient; the hook doubled the rest


def test_bad_arguments_raise_anynum_errors():
    with pytest.raises(AnynumError):
        float_quantize(np.ones(3), 5, 2)
    with pytest.raises(AnynumError):
        float_quantize(torch.ones(3), 5, 2, "sideways")
    with pytest.raises(AnynumError):
        qtorch.FloatingPoint(exp=0, man=2)
    with pytest.raises(AnynumError):
        posit_quantize(torch.ones(1), 40, 1)
    with pytest.raises(AnynumError):
        quantizer(forward_number="fp16")
    with pytest.raises(AnynumError):
        block_quantize(torch.ones(2, 2), 8, dim=2)


@pytest.mark.parametrize("wl", [3, 5, 8])
def test_block_with_exponent_minus_one_is_symmetric_fixed_point(wl):
    """QPyTorch's relation: a block whose largest magnitude is in [1/2, 1) is fixed point with fl = wl - 1
    without its most negative value (steps 2**(1 - wl), range ±(1 - 2**(1 - wl)))."""
    top = 1 - 2.0 ** (1 - wl)
    x = torch.linspace(-top, top, 1001)
    fixed = fixed_point_quantize(x, wl, wl - 1, symmetric=True, rounding="nearest")
    assert torch.equal(block_quantize(x, wl, rounding="nearest"), fixed)
    assert torch.equal(quantizer(qtorch.BlockFloatingPoint(wl), forward_rounding="nearest")(x), fixed)


@pytest.mark.parametrize(
    "number",
    [qtorch.FixedPoint(7, 6), qtorch.BlockFloatingPoint(6, dim=0), qtorch.FloatingPoint(6, 5)],
    ids=["fixed", "block", "float"],
)
def test_stochastic_quantizer_is_unbiased_on_a_range(number):
    """QPyTorch's relation: the mean of many stochastic roundings converges to the input."""
    x = torch.linspace(-0.9, 0.9, 100).repeat(2000, 1).T.contiguous()  # 2000 draws of each value
    if isinstance(number, qtorch.BlockFloatingPoint):
        x = x.abs().reshape(100, 2000)
    torch.manual_seed(0)
    q = quantizer(number)(x)  # default rounding: stochastic
    assert ((q.double().mean(1) - x.double().mean(1)) ** 2).mean() < 1e-5
