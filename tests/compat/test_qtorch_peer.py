"""The qtorch facade equals QPyTorch and Qtorch+ wherever the peers are correct (PEERS.md).

Needs ``qtorch`` / ``qtorch-plus`` (with ninja and a C++ compiler: they build
their extension, about 45 s each, at first import). Each test is skipped only
when the package is not installed (``pip install qtorch qtorch-plus ninja``);
a broken build fails the test.

Where they differ the facade is right and the peer wrong, so the comparisons
mask exactly the documented cases: QPyTorch rounds ties away from zero (its own
docstring says even), uses the top exponent field for numbers (no inf/NaN),
rounds subnormals twice, loses the sign of zero in block_quantize and of tiny
fixed-point results, keeps only float32 precision when fl is large
(clamp=False, |x| >= 2**(23 - fl)), and its block ties (and near-ties its
float32 offset makes ties) go up; Qtorch+ applies non-power-of-two scales in
float32 and its 8-bit posit sigmoid keeps two bits below the 8-bit word.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.compat.qtorch import quant as F
from anynum.experiments.peers import peer_extensions


def _peer(module: str):
    with peer_extensions(module):  # each peer's "quant_cpu" build in a directory of its own
        return pytest.importorskip(module)


@pytest.fixture(scope="module")
def Q():
    return _peer("qtorch.quant")


@pytest.fixture(scope="module")
def P():
    return _peer("qtorch_plus.quant")


def _data(n: int = 200_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp2(torch.randint(-24, 24, (n,), generator=g).float())


def _is_tie(x: torch.Tensor, fn) -> torch.Tensor:
    up, down = fn(x, "ru"), fn(x, "rd")
    return (up != down) & ((up.double() + down.double()) / 2 == x.double())


@pytest.mark.parametrize("exp,man", [(5, 10), (8, 7), (5, 2), (4, 3), (6, 9)])
def test_float_quantize_equals_qtorch_in_the_normal_range(Q, exp, man):
    x = _data()
    fmt = an.FloatFormat(exp, man)
    normal = (x.abs() >= fmt.smallest_normal) & (x.abs() <= fmt.max)
    ties = _is_tie(x, lambda t, r: an.quantize(t, fmt, r))
    keep = normal & ~ties
    assert keep.sum() > 50_000
    assert torch.equal(
        Q.float_quantize(x, exp, man, "nearest")[keep], F.float_quantize(x, exp, man, "nearest")[keep]
    )
    # and the ties QPyTorch sends away from zero are ties-to-even here
    if ties.any():
        assert torch.equal(F.float_quantize(x[ties], exp, man, "nearest"), an.quantize(x[ties], fmt))


@pytest.mark.parametrize("wl,fl", [(8, 4), (16, 8), (4, 2)])
@pytest.mark.parametrize("clamp,symmetric", [(True, False), (True, True), (False, False)])
def test_fixed_point_equals_qtorch(Q, wl, fl, clamp, symmetric):
    x = _data(100_000, wl)
    keep = x.abs() < 2.0 ** (23 - fl)  # beyond, QPyTorch's float32 arithmetic drops bits
    a = Q.fixed_point_quantize(x, wl, fl, clamp, symmetric, "nearest")[keep]
    b = F.fixed_point_quantize(x, wl, fl, clamp, symmetric, "nearest")[keep]
    assert torch.equal(a, b)  # values (QPyTorch's CPU kernel ties to even too)


@pytest.mark.parametrize("wl", [4, 8, 12])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_block_quantize_equals_qtorch_except_ties(Q, wl, dim):
    x = torch.randn(64, 300, generator=torch.Generator().manual_seed(wl))
    a, b = Q.block_quantize(x, wl, dim, "nearest"), F.block_quantize(x, wl, dim, "nearest")
    diff = a != b
    # QPyTorch adds 6 * 2**e to x in float32 and rounds that sum: ties, and values so close to a tie
    # that the sum's rounding makes them one, go up (toward +inf). Everywhere else the two agree.
    for xi, ai, bi in zip(x[diff].tolist(), a[diff].tolist(), b[diff].tolist()):
        step = abs(ai - bi)
        frac = (xi / step) % 1.0
        assert ai > bi and abs(frac - 0.5) < 2.0**-8, (xi, ai, bi)
    assert diff.sum() < 20


@pytest.mark.parametrize("n,es", [(8, 0), (8, 1), (8, 2), (6, 1), (16, 1), (16, 2), (12, 3)])
@pytest.mark.parametrize("scale", [1.0, 4.0, 0.125])
def test_posit_quantize_equals_qtorch_plus(P, n, es, scale):
    if (n - 2) * 2**es > 120:
        pytest.skip("Qtorch+ gives garbage when (n - 2) * 2**es > 127")
    x = _data(100_000, n)
    assert torch.equal(P.posit_quantize(x, n, es, scale), F.posit_quantize(x, n, es, scale))


def test_posit_activations_and_tables_equal_qtorch_plus(P):
    xs = torch.linspace(-8, 8, 20001)
    for name in ("posit_sigmoid", "posit_tanh", "posit_tanh_enhanced"):
        assert torch.equal(getattr(P, name)(xs, 16), getattr(F, name)(xs, 16)), name
    table = torch.tensor([0.1, 0.25, 0.5, 1.0, 2.0, 3.0])
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(3)) * 3
    for scale in (1.0, 2.0, 0.7):
        assert torch.equal(
            P.configurable_table_quantize(x, table, scale), F.configurable_table_quantize(x, table, scale)
        )
        assert torch.equal(P.new_format_quantize(x, scale), F.new_format_quantize(x, scale))
        assert torch.equal(P.act_format_quantize(x, scale), F.act_format_quantize(x, scale))
        assert torch.equal(
            P.configurable_table_quantize_geomean(x, table, scale),
            F.configurable_table_quantize_geomean(x, table, scale),
        )


def test_tutorial_training_step_equals_qtorch(Q):
    """The Functionality Overview's OptimLP step (nearest rounding) gives QPyTorch's weights."""
    qt = pytest.importorskip("qtorch.optim")
    results = []
    for quant, optim in ((Q, qt), (F, None)):
        from anynum.compat.qtorch.optim import OptimLP

        torch.manual_seed(0)
        model = torch.nn.Linear(5, 1)
        x = torch.rand(16, 5)
        model(x).pow(2).mean().backward()
        opt_cls = optim.OptimLP if optim is not None else OptimLP
        opt = opt_cls(
            torch.optim.SGD(model.parameters(), momentum=0.9, lr=0.1),
            weight_quant=lambda t, q=quant: q.float_quantize(t, 5, 10, "nearest"),
            grad_quant=lambda t, q=quant: q.float_quantize(t, 5, 10, "nearest"),
            momentum_quant=lambda t, q=quant: q.fixed_point_quantize(t, 16, 8, rounding="nearest"),
        )
        for _ in range(3):
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_facade_accepts_what_qtorch_refuses():
    x = np.float32(0.3)
    assert F.float_quantize(torch.tensor([x], dtype=torch.float64), 5, 10, "nearest").dtype == torch.float64
