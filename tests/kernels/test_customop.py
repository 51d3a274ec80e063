"""Converted models run under torch.compile and torch.export without graph breaks (DESIGN.md section 4):
rounding reaches the compiler as the opaque ``anynum::`` custom ops, with the eager bits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import anynum as an
from anynum.errors import RepresentabilityError
from anynum.rounding import Rounding


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _converted(error: object) -> nn.Module:
    policy = an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error=error, seed=0)
    return an.nn.convert(_mlp(), policy)


def _forward_backward(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    assert x.grad is not None
    return y.detach(), x.grad


@pytest.mark.parametrize("error", ["e5m2", ("e5m2", "sr")], ids=["nearest", "stochastic"])
def test_converted_mlp_has_no_graph_breaks(error: object) -> None:
    torch._dynamo.reset()
    model = _converted(error)
    explained = torch._dynamo.explain(model)(torch.randn(8, 16))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("error", ["e5m2", ("e5m2", "sr")], ids=["nearest", "stochastic"])
def test_compiled_training_step_equals_eager(error: object) -> None:
    """Same forward values and input gradients, bit for bit; SR included (same streams, same draws)."""
    torch._dynamo.reset()
    x = torch.randn(8, 16)
    eager, compiled = _converted(error), _converted(error)
    want = [_forward_backward(eager, x) for _ in range(2)]  # two steps: the streams advance alike
    fn = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    got = [_forward_backward(fn, x) for _ in range(2)]
    for (wy, wg), (gy, gg) in zip(want, got):
        assert torch.equal(wy, gy) and torch.equal(wg, gg)


def test_exported_program_equals_eager() -> None:
    model = _converted("e5m2").eval()
    x = torch.randn(8, 16)
    program = torch.export.export(model, (x,))
    assert any("anynum.round" in str(n.target) for n in program.graph.nodes)
    assert torch.equal(program.module()(x), model(x))


@pytest.mark.parametrize("mode", ["nearest", "rz", "ro"])
def test_round_op_is_quantize(mode: str) -> None:
    x = torch.randn(1000) * 100
    for fmt in (an.E4M3FN, an.Posit(8, 1), an.FixedPoint(4, 4), an.MXFP4_E2M1):
        got = torch.ops.anynum.round(x, fmt.canonical_name, mode, fmt.default_overflow, 0)
        assert torch.equal(got, an.quantize(x, fmt, mode))


def test_ops_pass_torch_opcheck() -> None:
    x = torch.randn(64)
    torch.library.opcheck(torch.ops.anynum.round.default, (x, "bf16", "rz", "inf", 0))
    rounder = an.nn.Rounder("e5m2", Rounding.STOCHASTIC, seed=3)
    stream = rounder._stream
    assert stream is not None
    # a seeded op cannot be compared across calls for equal values; check schema and fake kernel only
    torch.library.opcheck(
        torch.ops.anynum.round_stream.default, (x, "e5m2", "sr", "inf", 0, stream),
        test_utils=("test_schema", "test_faketensor"),
    )


P81 = an.Posit(8, 1)


def test_quantize_inside_compiled_code() -> None:
    """`an.quantize` with a format object or name, deterministic or seeded SR: one graph, eager bits, STE."""

    def f(x: torch.Tensor) -> torch.Tensor:
        y = an.quantize(x * 2, an.E4M3FN, "rz") + an.quantize(x, P81, "sr", seed=3)
        return y + an.quantize(x, "bf16")

    torch._dynamo.reset()
    x = torch.randn(100, requires_grad=True)
    explained = torch._dynamo.explain(f)(x)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    torch._dynamo.reset()
    y = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    y.sum().backward()
    assert torch.equal(y, f(x))
    assert x.grad is not None and torch.equal(x.grad, torch.full_like(x, 4.0))  # 2 + 1 + 1, straight through


def test_compiled_quantize_refuses_what_eager_refuses() -> None:
    """Representability is checked while tracing (the ops' fake kernels), as eager `quantize` checks it."""
    x = torch.randn(8, dtype=torch.float16)
    with pytest.raises(RepresentabilityError):
        an.quantize(x, an.BF16)  # bf16 values float16 cannot hold: eager refuses

    torch._dynamo.reset()
    compiled = torch.compile(lambda t: an.quantize(t, an.BF16), backend="eager", fullgraph=True)
    with pytest.raises(Exception, match=r"that torch\.float16 cannot hold"):
        compiled(x)
    with pytest.raises(RepresentabilityError):
        torch.ops.anynum.round(x, "bf16", "nearest", "inf", 0)  # the op itself, called eagerly
