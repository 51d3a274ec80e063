"""Quantizer / quantizer / Rounder: forward and backward rounding against torch's own casts."""

from __future__ import annotations

import sys

import pytest
import torch

import anynum as an
from anynum.kernels import round_to_format, route
from anynum.nn.quantizer import Rounder

fused_module = sys.modules["anynum.kernels.fused"]
_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e-30, 2.0**-140]


def _probe(dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    """Random values over many binades plus special values; optionally a non-contiguous view."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(24, 40, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-20, 20, (24, 40), generator=g).to(torch.float64)
    )
    x.view(-1)[: len(_SPECIALS)] = torch.tensor(_SPECIALS, dtype=torch.float64)
    x = x.to(dtype)
    return x.t() if transposed else x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN, and the same signs of zero."""
    equal = (a == b) | (a.isnan() & b.isnan())
    return a.shape == b.shape and bool(equal.all()) and torch.equal(torch.signbit(a), torch.signbit(b))


def _reference(rounder: Rounder, x: torch.Tensor) -> torch.Tensor:
    """`anynum.quantize` fed with a copy of the rounder's generator, taken before the call."""
    gen = None
    if rounder.mode.is_stochastic:
        gen = torch.Generator().manual_seed(0)
        gen.set_state(rounder.generator(x.device).get_state())
    return an.quantize(x, rounder.fmt, rounder.mode, overflow=rounder.overflow, generator=gen)


def test_quantizer_forward_and_backward_match_torch_casts():
    q = an.Quantizer(forward=an.BF16, backward=an.E5M2)
    x = torch.randn(1000, requires_grad=True)
    y = q(x)
    assert torch.equal(y.detach(), x.detach().bfloat16().float())
    g = torch.randn(1000) * 1e-3
    y.backward(g)
    assert torch.equal(x.grad, g.to(torch.float8_e5m2).float())


def test_quantizer_none_directions_pass_through():
    x = torch.randn(10, requires_grad=True)
    y = an.Quantizer(backward="e4m3fn")(x)
    assert torch.equal(y.detach(), x.detach())
    y.backward(torch.full((10,), 0.3))
    assert torch.equal(x.grad, torch.full((10,), 0.3).to(torch.float8_e4m3fn).float())
    z = an.Quantizer(forward="bf16")(x)
    g = torch.full((10,), 0.1 + 2**-20)
    x.grad = None
    z.backward(g)
    assert torch.equal(x.grad, g)


def test_functional_quantizer_and_rounding_modes():
    f = an.nn.quantizer(forward="e4m3fn", forward_rounding="rz")
    x = torch.tensor([1.2, -1.2, 500.0])
    assert f(x).tolist() == [1.125, -1.125, 448.0]


def test_stochastic_errors_are_seeded_independent_and_unbiased():
    def run(seed):
        q = an.Quantizer(backward="e5m2", backward_rounding="sr", seed=seed)
        x = torch.zeros(20000, requires_grad=True)
        grads = []
        for _ in range(2):
            x.grad = None
            q(x).backward(torch.full((20000,), 1.1))
            grads.append(x.grad.clone())
        return grads

    a1, a2 = run(5)
    b1, _ = run(5)
    assert torch.equal(a1, b1)  # same seed, same stream
    assert not torch.equal(a1, a2)  # the stream advances between calls
    assert set(a1.unique().tolist()) == {1.0, 1.25}  # the two e5m2 neighbours of 1.1
    # E[SR(1.1)] = 1.1: P(up) = 0.4; 20000 draws give a standard error of about 0.0035 * 0.25.
    assert abs(a1.mean().item() - 1.1) < 0.005


def test_sr_default_stream_follows_torch_manual_seed():
    torch.manual_seed(1)
    a = Rounder("e4m3fn", "sr")(torch.full((500,), 1.01))
    torch.manual_seed(1)
    b = Rounder("e4m3fn", "sr")(torch.full((500,), 1.01))
    assert torch.equal(a, b)


def test_bad_arguments_raise_anynum_errors():
    with pytest.raises(an.AnynumError, match="unknown"):
        an.Quantizer(forward="e9m9x")
    with pytest.raises(an.AnynumError):
        an.Quantizer(forward="e4m3fn", forward_overflow="inf")
    with pytest.raises(an.AnynumError, match="rand_bits"):
        Rounder("bf16", "nearest", rand_bits=4)
    with pytest.raises(an.AnynumError, match="either"):
        Rounder("bf16", "sr", generator=torch.Generator(), seed=1)
    with pytest.raises(an.AnynumError):
        Rounder("bf16")(torch.arange(3))


def test_top_level_export():
    assert an.Quantizer is an.nn.Quantizer
    assert "Quantizer" in an.__all__


@pytest.mark.parametrize(
    ("fmt", "rounding", "overflow", "dtype"),
    [
        ("e4m3fn", "nearest", None, torch.float32),  # torch's native cast
        ("bf16", "nearest", None, torch.float32),
        ("e4m3fn", "nearest", None, torch.float64),  # same format, eager kernel
        ("e5m2", "sr", None, torch.float32),
        ("bf16", "sr", None, torch.bfloat16),
        ("e2m1", "rz", "saturate", torch.float32),
        ("posit(8,1)", "sr_uniform", None, torch.float32),
        ("fixed(8,4)", "rna", "wrap", torch.float64),
    ],
)
@pytest.mark.parametrize("transposed", [False, True])
def test_rounder_equals_the_quantize_front_door(fmt, rounding, overflow, dtype, transposed):
    r = Rounder(fmt, rounding, overflow, seed=11)
    for _ in range(2):  # the second call checks that the stream advanced as quantize's would
        x = _probe(dtype, transposed)
        expected = _reference(r, x)
        got = r(x)
        assert got.dtype == x.dtype
        assert _same(got, expected)


def test_warm_kernels_switch_to_the_compiled_path_with_identical_results(monkeypatch):
    """Once a kernel has rounded ANYNUM_COMPILE_MIN elements, calls go through `fused_round`, flattened.

    `fused_round` is replaced by a recorder running the eager kernel (the fused kernel's equality
    with it is tested in tests/kernels), so this checks the routing, flattening and random stream.
    """
    monkeypatch.delenv("ANYNUM_COMPILE", raising=False)  # "auto"
    monkeypatch.setenv("ANYNUM_COMPILE_MIN", "2000")
    # On CPU the compiled kernels run only for calls the native C kernels decline: make them decline.
    from anynum.kernels import ckernel

    monkeypatch.setattr(ckernel, "library", lambda: None)
    compiled = next(k for k in route.kernels() if k.name == "compiled")
    monkeypatch.setattr(compiled, "_elements", {})  # what slower kernels have rounded so far
    seen: list[tuple[int, ...]] = []

    def recorder(fmt, x, mode, overflow, rng, rand_bits, out=None):
        seen.append(tuple(x.shape))
        return round_to_format(fmt, x, mode, overflow, rng, rand_bits)

    monkeypatch.setattr(fused_module, "fused_round", recorder)
    sr = Rounder("e5m2", "sr", seed=4)
    native = Rounder("e4m3fn")  # a torch cast is used whatever the count
    blocked = Rounder(an.Block(an.E2M1, 8), "sr", seed=5)  # shape-dependent: never flattened
    for call in range(4):
        x = _probe(torch.float32, transposed=True)  # 960 elements, non-contiguous
        expected = _reference(sr, x)
        got = sr(x)
        assert _same(got, expected)
        assert _same(native(x), x.to(torch.float8_e4m3fn).float())
        expected = _reference(blocked, x)
        assert _same(blocked(x), expected)
        # The rounder and its `quantize` reference share the kernel's count (960 elements each):
        # 2880 >= 2000 after the second reference, so from the second rounder call on, every
        # call (rounder and reference) is compiled.
        assert seen == [(960,)] * max(0, 2 * call - 1)
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    sr(_probe(torch.float32, transposed=False))
    assert len(seen) == 5  # "0": no compiled call, however warm
