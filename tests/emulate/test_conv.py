"""Convolutions as dot products (emulate/conv.py): the zero-skipping transposed convolution against
the dense one (padding and inserted zeros materialised), bit for bit."""

from __future__ import annotations

import pytest
import torch

import anynum as an
from anynum.emulate.accumulate import Accumulation, Accumulator
from anynum.emulate.conv import conv_backward, conv_forward
from anynum.emulate.grid import Grid

pytestmark = pytest.mark.usefixtures("one_thread")


def _on_grid(g: Grid, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(-3, 4, shape, generator=gen).to(torch.float64)
    )
    x[torch.rand(*shape, generator=gen) < 0.1] = 0.0
    return g.round(x)


def _dot(acc: Accumulator, g: Grid):
    return lambda a, b, bias=None: acc.dot(a, b, g, bias=bias, operand_bits=g.precision)


CASES = [  # (stride, padding, dilation, output_padding, groups, kernel, input hw)
    ((1, 1), (0, 0), (1, 1), (0, 0), 1, (5, 5), (9, 9)),     # LeNet-5's conv2 and conv3 shapes
    ((1, 1), (1, 2), (1, 1), (0, 0), 2, (3, 3), (6, 7)),
    ((2, 1), (1, 0), (1, 2), (1, 0), 1, (3, 2), (7, 8)),
    ((3, 2), (2, 1), (2, 1), (2, 1), 2, (2, 3), (9, 7)),
    ((1, 1), (3, 3), (1, 1), (0, 0), 1, (3, 3), (5, 5)),     # padding beyond the kernel: cropped
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    ("fmt", "accumulate", "fma"),
    [
        ("posit(16,2)", "posit(16,2)", False), ("posit(8,0)", "posit(8,0)", True),
        ("e5m2fnuz", "e5m2fnuz", False), ("posit(8,0)", "quire", False),
    ],
)
def test_sparse_grad_input_equals_dense(case, fmt, accumulate, fma):
    stride, padding, dilation, out_pad, groups, kernel, hw = case
    g = Grid(fmt)
    acc = Accumulator(Accumulation.resolve(accumulate, fma=fma, result_format=g.fmt), g)
    assert acc.zero_terms_vanish
    gen = torch.Generator().manual_seed(hash((case, fmt)) % 2**31)
    x = _on_grid(g, (3, 2 * groups, *hw), gen)
    w = _on_grid(g, (2 * groups, 2, *kernel), gen)
    y = conv_forward(x, w, None, stride, padding, dilation, False, out_pad, groups, _dot(acc, g))
    gy = _on_grid(g, tuple(y.shape), gen)
    sum_over = lambda t, dims: acc.sum(t, dims, g)  # noqa: E731
    mask = (True, True, True)
    args = (gy, x, w, stride, padding, dilation, False, out_pad, groups, mask, _dot(acc, g), sum_over)
    dense = conv_backward(*args, skip_zeros=False)
    sparse = conv_backward(*args, skip_zeros=True)
    for d, s in zip(dense, sparse):
        assert torch.equal(d, s) and torch.equal(torch.signbit(d), torch.signbit(s))
    # the transposed convolution forward (with a bias) takes the same path
    wt = _on_grid(g, (2 * groups, 3, *kernel), gen)
    bias = _on_grid(g, (3 * groups,), gen)
    conv = (stride, padding, dilation, True, out_pad, groups, _dot(acc, g))
    fwd = [conv_forward(x, wt, bias, *conv, skip_zeros=s) for s in (False, True)]
    assert torch.equal(fwd[0], fwd[1])


def test_non_finite_weights_keep_their_zero_products():
    """0 * inf is NaN: with an infinite weight the padding terms count, so the dense path runs."""
    g = Grid("posit(16,2)")
    acc = Accumulator(Accumulation.resolve("posit(16,2)"), g)
    gen = torch.Generator().manual_seed(5)
    x = _on_grid(g, (2, 2, 6, 6), gen)
    w = _on_grid(g, (3, 2, 3, 3), gen)
    w[0, 0, 0, 0] = float("inf")
    gy = _on_grid(g, (2, 3, 4, 4), gen)
    sum_over = lambda t, dims: acc.sum(t, dims, g)  # noqa: E731
    args = (gy, x, w, (1, 1), (0, 0), (1, 1), False, (0, 0), 1, (True, False, False), _dot(acc, g), sum_over)
    dense, sparse = conv_backward(*args, skip_zeros=False)[0], conv_backward(*args, skip_zeros=True)[0]
    assert bool(torch.isnan(dense).any())
    assert torch.equal(torch.isnan(dense), torch.isnan(sparse))
    assert torch.equal(dense[~torch.isnan(dense)], sparse[~torch.isnan(sparse)])


@pytest.mark.parametrize(
    ("accumulate", "order", "rounding", "vanish"),
    [
        ("posit(16,2)", "sequential", "nearest", True),
        ("posit(16,2)", "sequential", "rz", True),
        ("e4m3fnuz", "sequential", "nearest", True),
        ("bf16", "sequential", "nearest", False),      # -0 + -0 is -0: a zero term can set the sign
        ("posit(16,2)", "pairwise", "nearest", False),  # the tree's shape counts the terms
        ("posit(16,2)", 4, "nearest", False),
        ("posit(16,2)", "sequential", "sr", False),     # the random stream counts the roundings
        (None, "sequential", "nearest", False),
        ("quire", "sequential", "nearest", True),       # an exact sum
        ("quire", "sequential", "sr", False),
    ],
)
def test_which_accumulations_may_skip_zero_terms(accumulate, order, rounding, vanish):
    g = Grid("posit(16,2)", rounding, seed=0 if rounding == "sr" else None)
    assert Accumulator(Accumulation.resolve(accumulate, order), g).zero_terms_vanish is vanish


@pytest.mark.parametrize("accumulate", ["posit(16,2)", "quire"])
def test_emulated_lenet_conv_backward_equals_dense(monkeypatch, accumulate):
    """A padded, strided conv stack trained one step under sequential posit accumulation (and the
    quire): the same gradients with the zero-skipping grad_input as with the dense one."""
    from anynum.emulate import rules

    def step() -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.Tanh(), torch.nn.Conv2d(3, 4, 3, stride=2),
            torch.nn.Tanh(), torch.nn.Conv2d(4, 2, 3),
        )
        x = torch.randn(2, 1, 11, 11)
        with an.emulate("posit(16,2)", accumulate=accumulate):
            net(x).square().sum().backward()
        return [p.grad for p in net.parameters()]

    sparse = step()
    monkeypatch.setattr(rules, "_skip_zeros", lambda em: False)
    dense = step()
    assert all(torch.equal(s, d) for s, d in zip(sparse, dense))


def test_axis_views_and_gathers_read_the_same_elements():
    from anynum.emulate.conv import _axis_view, _positions

    t = torch.arange(2 * 7 * 3, dtype=torch.float64).reshape(2, 7, 3)
    for idx in ([[0, 2], [1, 3], [2, 4]], [[6]], [[0, 2], [1, 1]], [[5, 3], [4, 2]]):
        want = torch.stack([torch.stack([t[:, i] for i in row], 1) for row in idx], 1)
        assert torch.equal(_axis_view(t, 1, idx), want)
    for pos in ([1, 3, 5], [4], [0, 1, 5], [5, 2]):
        assert torch.equal(_positions(t, 1, pos), t[:, pos])
