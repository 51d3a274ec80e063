"""The native rounding pair node (`anynum.kernels.pairop`, `anynum.quantize.rounder.round_pair`).

Oracles: the eager reference (`cn.reference`, with the seed the rounder's generator hands out)
for the forward values and for the gradients, and the Python autograd Function `_QuantizeFn`
for everything a training step sees (values, gradients, strides, the streams' positions after
several calls). Every test checks that the native node really ran (its grad_fn), so none of
them can pass by comparing the Python path with itself.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import anynum as an
from anynum.errors import RepresentabilityError
from anynum.kernels import nativelib, pairop
from anynum.nn.quantizer import PairPoint
from anynum.quantize.rounder import Rounder, round_each_native, round_pair
from anynum.rounding import Rounding

quantizer_module = importlib.import_module("anynum.nn.quantizer")
rounder_module = importlib.import_module("anynum.quantize.rounder")
optimizer_module = importlib.import_module("anynum.optim.optimizer")
_QuantizeFn = quantizer_module._QuantizeFn

FORMATS = [
    an.E4M3FN, an.E5M2, an.BF16, an.FixedPoint(4, 8), an.Posit(8, 0), an.Posit(16, 1),
    an.Table.from_format(an.E2M1),
]  # fmt: skip
MODES = [("nearest", None), ("rz", None), ("ro", None), ("sr", None), ("sr", 8), ("sr_uniform", None)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _holds(fmt: an.Format, dtype: torch.dtype) -> bool:
    try:
        Rounder(fmt).check_dtype(dtype)
    except RepresentabilityError:
        return False
    return True


#: Every format with every dtype that can hold its values (BF16 in float16 cannot).
COMBOS = [(fmt, dtype) for fmt in FORMATS for dtype in DTYPES if _holds(fmt, dtype)]


@pytest.fixture(autouse=True)
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C kernels on (CI runs the suite with ANYNUM_COMPILE=0), the node built.

    A machine with a C++ compiler must build the node. Without one there is no node to test,
    and only the test of that case runs.
    """
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    if request.node.name.startswith("test_without_a_cxx_compiler"):
        return
    if nativelib.compiler("c++") is None:
        pytest.skip("no C++ compiler here: the node cannot be built (its fallback is tested)")
    if not pairop.build_now():
        pytest.fail("a C++ compiler is here, but the native pair node did not build")


def _ran_native(y: torch.Tensor) -> bool:
    return y.grad_fn is not None and "RoundPair" in y.grad_fn.name()


def _values(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-14, 10, (n,), generator=g))
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    x[:6] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e30])
    return x.to(dtype)


def _next_seed(rounder: Rounder) -> int:
    """The seed the rounder's CPU generator hands out next (without advancing it)."""
    g = torch.Generator()
    g.set_state(rounder.generator(torch.device("cpu")).get_state())
    return int(torch.randint(0, 2**62, (1,), generator=g))


def _pair(fmt: an.Format, mode: str, rand_bits: int | None, seed: int) -> tuple[Rounder, Rounder]:
    bwd_fmt = an.E5M2 if fmt is an.E4M3FN else fmt
    fwd = Rounder(fmt, mode, rand_bits=rand_bits, seed=seed)
    return fwd, Rounder(bwd_fmt, mode, rand_bits=rand_bits, seed=seed + 1)


def _python(x: torch.Tensor, fwd: Rounder | None, bwd: Rounder | None) -> torch.Tensor:
    y: torch.Tensor = _QuantizeFn.apply(x, fwd, bwd)
    return y


@pytest.mark.parametrize("mode,rand_bits", MODES, ids=lambda v: str(v))
@pytest.mark.parametrize("fmt,dtype", COMBOS, ids=lambda v: repr(v) if isinstance(v, an.Format) else str(v))
def test_values_and_gradients_are_the_references(  # type: ignore[no-untyped-def]
    fmt: an.Format, mode: str, rand_bits: int | None, dtype: torch.dtype, cn
) -> None:
    """Three calls in a row (the streams advance), each against the reference at the seed drawn
    and against the Python Function with twin rounders."""
    fwd, bwd = _pair(fmt, mode, rand_bits, 11)
    twin_fwd, twin_bwd = _pair(fmt, mode, rand_bits, 11)
    rounding = an.rounding.parse_rounding(mode)
    for call in range(3):
        x = _values(3000, dtype, call).requires_grad_()
        g = _values(3000, dtype, 10 + call)
        fseed = _next_seed(fwd) if rounding.is_stochastic else 0
        y = round_pair(x, fwd, bwd)
        assert y is not None and _ran_native(y)
        bseed = _next_seed(bwd) if rounding.is_stochastic else 0
        y.backward(g)
        want_y = cn.reference(fmt, rounding, fwd.overflow, rand_bits, x.detach(), seed=fseed)
        want_g = cn.reference(bwd.fmt, rounding, bwd.overflow, rand_bits, g, seed=bseed)
        cn.assert_same(y.detach(), want_y, x.detach(), (fmt, mode, call, "forward"))
        assert x.grad is not None
        cn.assert_same(x.grad, want_g, g, (fmt, mode, call, "backward"))
        xp = x.detach().clone().requires_grad_()
        yp = _python(xp, twin_fwd, twin_bwd)
        yp.backward(g)
        cn.assert_same(y.detach(), yp.detach(), x.detach(), "forward, as the Python Function")
        assert xp.grad is not None
        cn.assert_same(x.grad, xp.grad, g, "backward, as the Python Function")


@pytest.mark.parametrize("mode", ["nearest", "sr"])
def test_layouts_keep_the_strides_of_the_python_function(mode: str, cn) -> None:  # type: ignore[no-untyped-def]
    nchw = _values(3 * 5 * 7 * 11, torch.float32, 3).reshape(3, 5, 7, 11)
    for x0 in (
        nchw.contiguous(memory_format=torch.channels_last),
        nchw.transpose(1, 3),
        nchw[:, ::2],
    ):
        fwd, bwd = _pair(an.E4M3FN, mode, None, 5)
        twin_fwd, twin_bwd = _pair(an.E4M3FN, mode, None, 5)
        x, xp = x0.detach().requires_grad_(), x0.detach().clone().requires_grad_()
        reversed_dims = range(x0.dim() - 1, -1, -1)  # a gradient of another layout than x
        g = _values(x0.numel(), torch.float32, 4).reshape(x0.shape[::-1]).permute(*reversed_dims)
        y = round_pair(x, fwd, bwd)
        assert y is not None and _ran_native(y)
        yp = _python(xp, twin_fwd, twin_bwd)
        assert y.stride() == yp.stride(), (x0.stride(), y.stride(), yp.stride())
        cn.assert_same(y.detach(), yp.detach(), x0, ("forward", x0.stride()))
        y.backward(g)
        yp.backward(g)
        assert x.grad is not None and xp.grad is not None
        cn.assert_same(x.grad, xp.grad, g, ("backward", x0.stride()))


def test_results_do_not_depend_on_the_thread_count(cn) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fwd, bwd = _pair(an.Posit(8, 0), "sr", None, 9)
            x = _values(200_000, torch.float32, 1).requires_grad_()
            y = round_pair(x, fwd, bwd)
            assert y is not None and _ran_native(y)
            y.backward(_values(200_000, torch.float32, 2))
            assert x.grad is not None
            out.append((y.detach(), x.grad))
    finally:
        torch.set_num_threads(before)
    cn.assert_same(out[0][0], out[1][0], out[0][0], "forward, 1 vs 2 threads")
    cn.assert_same(out[0][1], out[1][1], out[0][1], "backward, 1 vs 2 threads")


def test_undecided_elements_are_refined_through_the_callback(cn) -> None:  # type: ignore[no-untyped-def]
    """Exact SR leaves an element undecided when its fraction ties its own 53 random bits: the
    node hands it to Python (`refine_undecided`) in both directions."""
    fwd, bwd = Rounder(an.FP16, "sr", seed=21), Rounder(an.FP16, "sr", seed=22)
    fseed = _next_seed(fwd)
    x, i = cn.self_tie(4096, fseed)
    x.requires_grad_()
    y = round_pair(x, fwd, bwd)
    assert y is not None and _ran_native(y)
    bseed = _next_seed(bwd)
    g, j = cn.self_tie(4096, bseed)
    y.backward(g)
    sr = Rounding.STOCHASTIC
    cn.assert_same(y.detach(), cn.reference(an.FP16, sr, "inf", None, x.detach(), seed=fseed), x, "fwd")
    assert x.grad is not None
    cn.assert_same(x.grad, cn.reference(an.FP16, sr, "inf", None, g, seed=bseed), g, "bwd")
    assert float(y[i]) != float(x[i]) and float(x.grad[j]) != float(g[j])  # refined, not handed back


def test_a_failed_refinement_raises(monkeypatch: pytest.MonkeyPatch, cn) -> None:  # type: ignore[no-untyped-def]
    def broken(*args: object) -> None:
        raise ValueError("broken")

    monkeypatch.setattr(pairop, "refine_undecided", broken)
    fwd = Rounder(an.FP16, "sr", seed=23)
    x, _ = cn.self_tie(4096, _next_seed(fwd))
    with pytest.raises(RuntimeError, match="refining the undecided elements"):
        with pytest.warns(RuntimeWarning, match="ValueError\\('broken'\\)"):
            round_pair(x.requires_grad_(), fwd, None)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_missing_direction_passes_unchanged(which: str, cn) -> None:  # type: ignore[no-untyped-def]
    r = Rounder(an.E4M3FN)
    fwd, bwd = (None, r) if which == "forward" else (r, None)
    x = _values(500, torch.float32, 6).requires_grad_()
    g = _values(500, torch.float32, 7)
    y = round_pair(x, fwd, bwd)
    assert y is not None and _ran_native(y)
    y.backward(g)
    assert x.grad is not None
    want_y = x.detach() if fwd is None else r(x.detach())
    want_g = g if bwd is None else r(g)
    cn.assert_same(y.detach(), want_y, x, "forward")
    cn.assert_same(x.grad, want_g, g, "backward")


class _Sub(torch.Tensor):
    pass


class _Doubling(Rounder):
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_calls_the_node_cannot_take_are_handed_back(monkeypatch: pytest.MonkeyPatch) -> None:
    r = Rounder(an.E4M3FN)
    x = torch.randn(8, requires_grad=True)
    assert round_pair(x, _Doubling(an.E4M3FN), None) is None  # a subclass rounds its own way
    assert round_pair(torch.randn(8, device="meta", requires_grad=True), r, r) is None
    assert round_pair(x.detach().as_subclass(_Sub).requires_grad_(), r, r) is None
    monkeypatch.setenv("ANYNUM_COMPILE", "0")  # the C kernels are off: the eager reference runs
    assert round_pair(x, r, r) is None
    y = quantizer_module.apply_pair(x, r, r)
    assert not _ran_native(y)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


@pytest.mark.parametrize("rounding", ["nearest", "sr"])
def test_training_is_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch, rounding: str) -> None:
    """Twenty QAT steps of a small CNN on channels-last inputs: the same weights at the end."""
    x = torch.randn(16, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (16,))

    def train(native_node: bool) -> list[torch.Tensor]:
        if not native_node:
            monkeypatch.setattr(quantizer_module, "round_pair", lambda *args: None)
            monkeypatch.setattr(quantizer_module, "pair_plan", lambda *args: None)
        torch.manual_seed(0)
        policy = an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error=("e5m2", rounding), seed=1)
        model = an.nn.convert(_Net(), policy)
        opt = an.optim.QuantizedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), weight="e4m3fn",
            grad=("bf16", rounding), momentum="bf16", seed=2,
        )
        for _ in range(20):
            opt.zero_grad()
            out = model(x)
            nn.functional.cross_entropy(out, target).backward()
            opt.step()
        monkeypatch.undo()
        monkeypatch.setenv("ANYNUM_COMPILE", "auto")
        return [p.detach().clone() for p in model.parameters()]

    native_weights, python_weights = train(True), train(False)
    for a, b in zip(native_weights, python_weights):
        assert torch.equal(a, b)


def test_the_node_runs_inside_a_converted_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch's Linear computes with, inside the converted layer's forward, came from the
    node: twice, as the second call takes the plan the first made (`PairPoint`)."""
    model = an.nn.convert(_Net(), an.nn.Policy(activation="e4m3fn", error="e5m2"))
    seen: list[bool] = []
    linear_forward = nn.Linear.forward

    def recording(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        seen.append(_ran_native(x))
        return linear_forward(self, x)

    monkeypatch.setattr(nn.Linear, "forward", recording)
    for _ in range(2):
        model(torch.randn(2, 3, 8, 8, requires_grad=True)).sum().backward()
    assert seen == [True, True]


def test_without_a_cxx_compiler_the_python_function_runs(tmp_path: Path) -> None:
    """No C++ compiler: one warning, the Python Function, the same bits."""
    code = textwrap.dedent(
        """
        import warnings; warnings.simplefilter("always")
        import torch, anynum as an
        from anynum.kernels.clib import library
        from anynum.kernels import pairop
        from anynum.nn.quantizer import apply_pair
        from anynum.quantize.rounder import Rounder
        library()
        print("BUILT" if pairop.build_now() else "NOT-BUILT")
        x = torch.tensor([0.3, 3.3], requires_grad=True)
        y = apply_pair(x, Rounder(an.E4M3FN), Rounder(an.E5M2))
        y.backward(torch.tensor([0.1, 1000.0]))
        print(type(y.grad_fn).__name__, y.detach().tolist(), x.grad.tolist())
        """
    )
    env = {**os.environ, "ANYNUM_COMPILE": "auto", "CXX": str(tmp_path / "no-such-c++")}
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "NOT-BUILT" in result.stdout and "_QuantizeFnBackward" in result.stdout, result.stdout
    assert "[0.3125, 3.25] [0.09375, 1024.0]" in result.stdout
    assert "could not build or load the native kernel 'anynum_pairop'" in result.stderr


# --- the group rounding (round_each_native: the optimizer's categories) -------------------------


@pytest.fixture
def each_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What the native group op returned, call by call (so a test knows it ran)."""
    calls: list[int] = []
    op = pairop.each_op()
    assert op is not None

    def counted(*args: object) -> int:
        calls.append(op(*args))
        return calls[-1]

    monkeypatch.setattr(rounder_module, "each_op", lambda: counted)
    return calls


def _group(dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """An optimizer's kind of group: several shapes, an empty tensor, specials at the front."""
    sizes = [(8, 1, 3, 3), (0,), (16,), (33, 7), (1,), (500,)]
    flat = _values(sum(torch.Size(s).numel() for s in sizes), dtype, seed)
    parts = flat.split([torch.Size(s).numel() for s in sizes])
    return [part.reshape(s).clone() for part, s in zip(parts, sizes)]


@pytest.mark.parametrize("mode,rand_bits", MODES, ids=lambda v: str(v))
@pytest.mark.parametrize("fmt,dtype", COMBOS, ids=lambda v: repr(v) if isinstance(v, an.Format) else str(v))
def test_group_rounding_is_the_reference_over_the_concatenation(  # type: ignore[no-untyped-def]
    fmt: an.Format, mode: str, rand_bits: int | None, dtype: torch.dtype, each_calls: list[int], cn
) -> None:
    """Three calls in a row, each against the reference of the group's concatenation at the seed
    drawn, and against the Python path (a twin rounder, the op switched off)."""
    r, twin = Rounder(fmt, mode, rand_bits=rand_bits, seed=3), Rounder(fmt, mode, rand_bits=rand_bits, seed=3)
    rounding = an.rounding.parse_rounding(mode)
    for call in range(3):
        xs, ys = _group(dtype, call), _group(dtype, call)
        seed = _next_seed(r) if rounding.is_stochastic else 0
        before = torch.cat([x.reshape(-1) for x in xs])
        r.round_each_into(xs)
        assert each_calls[-1] >= 0 and len(each_calls) == call + 1
        got = torch.cat([x.reshape(-1) for x in xs])
        want = cn.reference(fmt, rounding, r.overflow, rand_bits, before, seed=seed)
        cn.assert_same(got, want, before, call)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(rounder_module, "each_op", lambda: None)
            twin.round_each_into(ys)
        cn.assert_same(got, torch.cat([y.reshape(-1) for y in ys]), before, (call, "as the Python path"))


def test_group_rounding_does_not_depend_on_the_thread_count(each_calls: list[int], cn) -> None:  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            xs = list(_values(200_000, torch.float32, 1).split([70_000, 1, 129_999]))
            xs = [x.clone() for x in xs]
            assert round_each_native(xs, Rounder(an.Posit(8, 0), "sr", seed=9))
            out.append(torch.cat(xs))
    finally:
        torch.set_num_threads(before)
    assert len(each_calls) == 2
    cn.assert_same(out[0], out[1], out[0], "1 vs 2 threads")


def test_group_rounding_refines_undecided_elements(each_calls: list[int], cn) -> None:  # type: ignore[no-untyped-def]
    """The tie sits in the second tensor, at its index in the concatenation's stream."""
    r = Rounder(an.FP16, "sr", seed=31)
    seed = _next_seed(r)
    x, i = cn.self_tie(4096, seed)
    cut = max(i - 5, 1)
    xs = [x[:cut].clone(), x[cut:].clone()]
    assert round_each_native(xs, r) and each_calls == [1]
    got = torch.cat(xs)
    cn.assert_same(got, cn.reference(an.FP16, Rounding.STOCHASTIC, "inf", None, x, seed=seed), x, "refined")
    assert float(got[i]) != float(x[i])  # refined, not left as it came


def test_group_rounding_declines_what_it_cannot_take(
    monkeypatch: pytest.MonkeyPatch, each_calls: list[int]
) -> None:
    """Declined: False, nothing written, nothing drawn (the generator's state is unchanged)."""
    r = Rounder(an.E4M3FN, "sr", seed=5)
    state = r.generator(torch.device("cpu")).get_state()
    a = torch.randn(4, 6)
    cases = {
        "not contiguous": [torch.randn(3), a.t()],
        "mixed dtypes": [torch.randn(3), torch.randn(3, dtype=torch.float64)],
        "a tensor subclass": [torch.randn(3), torch.randn(3).as_subclass(_Sub)],
        "another device": [torch.randn(3, device="meta"), torch.randn(3)],
    }
    for what, xs in cases.items():
        saved = [x.clone() for x in xs]
        assert round_each_native(xs, r) is False, what
        for x, y in zip(xs, saved):
            if x.device.type == "cpu":
                assert torch.equal(x, y), what
        assert torch.equal(r.generator(torch.device("cpu")).get_state(), state), what
    assert all(v == -1 for v in each_calls)  # the op itself declined the first two
    assert round_each_native([torch.randn(3)], _Doubling(an.E4M3FN)) is False  # a subclass rounds its own way
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    assert round_each_native([torch.randn(3)], r) is False  # the C kernels are off


def test_an_empty_group_draws_nothing(each_calls: list[int]) -> None:
    r = Rounder(an.BF16, "sr", seed=6)
    state = r.generator(torch.device("cpu")).get_state()
    assert round_each_native([torch.empty(0), torch.empty(0, 3)], r)
    assert torch.equal(r.generator(torch.device("cpu")).get_state(), state)


@pytest.mark.parametrize("rounding", ["nearest", "sr"])
def test_optimizer_steps_are_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch, rounding: str,
                                                     each_calls: list[int]) -> None:
    """Twenty QuantizedOptimizer steps (gradients, momentum, weights; fp32 and fp64 parameters in
    one group) with the native group rounding and with the Python path: the same weights."""

    def train(native_group: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
        model[2].double()
        opt = an.optim.QuantizedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), weight="e4m3fn",
            grad=("bf16", rounding), momentum=("bf16", rounding), seed=2,
        )
        x, target = torch.randn(16, 6), torch.randn(16, 2, dtype=torch.float64)
        with pytest.MonkeyPatch.context() as m:
            if not native_group:
                m.setattr(optimizer_module, "round_each_native", lambda *args: False)
                m.setattr(rounder_module, "each_op", lambda: None)
            for _ in range(20):
                opt.zero_grad()
                nn.functional.mse_loss(model[2](model[1](model[0](x)).double()), target).backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    native = train(True)
    ran = list(each_calls)
    python = train(False)
    assert ran.count(-1) == 60 and len(ran) > 60  # mixed dtypes: declined, then each dtype on its own
    assert len(each_calls) == len(ran)  # the Python run did not reach the op
    for a, b in zip(native, python):
        assert torch.equal(a, b)


def test_without_a_cxx_compiler_the_optimizer_rounds_in_python(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import torch, anynum as an
        from anynum.kernels.clib import library
        from anynum.kernels import pairop
        from anynum.quantize.rounder import Rounder, round_each_native
        library()
        print("BUILT" if pairop.build_now() else "NOT-BUILT")
        a, b = torch.tensor([0.3]), torch.tensor([1000.0, 2.0])
        print(round_each_native([a, b], Rounder(an.E4M3FN)))
        Rounder(an.E4M3FN).round_each_into([a, b])
        print(a.tolist(), b.tolist())
        """
    )
    env = {**os.environ, "ANYNUM_COMPILE": "auto", "CXX": str(tmp_path / "no-such-c++")}
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["NOT-BUILT", "False", "[0.3125] [448.0, 2.0]"], result.stdout


@pytest.mark.parametrize("mode", ["nearest", "sr"])
def test_a_tensor_without_gradient_is_rounded_by_the_node(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                          cn) -> None:  # type: ignore[no-untyped-def]
    """An activation point whose input takes no part in autograd (a model's first input, inference)
    rounds through the node's forward alone, with the bits and stream of `Rounder.__call__`."""
    calls: list[bool] = []
    op = pairop.pair_op()
    monkeypatch.setattr(rounder_module, "pair_op", lambda: lambda *a: calls.append(True) or op(*a))
    r, twin = Rounder(an.E4M3FN, mode, seed=8), Rounder(an.E4M3FN, mode, seed=8)
    for call in range(3):
        x = _values(5000, torch.float32, call).reshape(50, 100).t()  # strided: its strides kept
        with torch.no_grad() if call == 2 else contextlib.nullcontext():
            y = quantizer_module.apply_pair(x, r, r)
        want = twin(x)
        assert len(calls) == call + 1 and y.grad_fn is None and y.stride() == want.stride()
        cn.assert_same(y, want, x, (mode, call))


DETERMINISTIC = [("nearest", None), ("rz", None), ("ro", None)]


@pytest.mark.parametrize("mode", [m for m, _ in DETERMINISTIC])
@pytest.mark.parametrize("fmt,dtype", COMBOS, ids=lambda v: repr(v) if isinstance(v, an.Format) else str(v))
def test_a_planned_point_is_the_reference(fmt: an.Format, mode: str, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    """`PairPoint` plans the node's call on its first call and takes the plan after: values and
    gradients as the eager reference's, in and outside autograd."""
    fwd, bwd = _pair(fmt, mode, None, 3)
    rounding = an.rounding.parse_rounding(mode)
    point = PairPoint(fwd, bwd)
    for call in range(3):
        x = _values(700, dtype, call).requires_grad_()
        g = _values(700, dtype, 50 + call)
        y = point.round(x)
        assert _ran_native(y) and point._plan is not None
        y.backward(g)
        want_y = cn.reference(fmt, rounding, fwd.overflow, None, x.detach())
        cn.assert_same(y.detach(), want_y, x.detach(), (fmt, mode, call, "forward"))
        assert x.grad is not None
        want_g = cn.reference(bwd.fmt, rounding, bwd.overflow, None, g)
        cn.assert_same(x.grad, want_g, g, (fmt, mode, call, "backward"))
        with torch.no_grad():
            z = point.round(x)
        assert z.grad_fn is None
        cn.assert_same(z, want_y, x.detach(), (fmt, mode, call, "no_grad"))
        z = point.round(x.detach())
        assert z.grad_fn is None
        cn.assert_same(z, want_y, x.detach(), (fmt, mode, call, "outside autograd"))


def test_a_point_plans_again_for_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Other rounders (an observer's swap), another dtype, the eager switch, and a stochastic
    rounder: each call is the Python Function's for what the point holds then."""
    point = PairPoint(Rounder(an.E4M3FN), Rounder(an.E5M2))
    x = torch.tensor([0.3, 3.3, 1000.0], requires_grad=True)
    assert point.round(x).tolist() == [0.3125, 3.25, 448.0] and point._plan is not None
    point.fwd = Rounder(an.BF16)
    assert point.round(x).tolist() == [0.30078125, 3.296875, 1000.0]
    assert point.round(x.double()).dtype == torch.float64 and point._plan.dtype is torch.float64
    assert _ran_native(point.round(x)) and point._plan.dtype is torch.float32
    monkeypatch.setenv("ANYNUM_COMPILE", "0")  # the eager reference: the Python Function
    y = point.round(x)
    assert type(y.grad_fn).__name__ == "_QuantizeFnBackward" and y.tolist() == [0.30078125, 3.296875, 1000.0]
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    point.bwd = Rounder(an.E5M2, "sr", seed=4)  # draws at each call: no plan
    twin = Rounder(an.E5M2, "sr", seed=4)
    y = point.round(x)
    assert point._plan is None and _ran_native(y)
    y.backward(torch.full((3,), 0.1))
    x2 = x.detach().requires_grad_()
    _python(x2, Rounder(an.BF16), twin).backward(torch.full((3,), 0.1))
    assert torch.equal(x.grad, x2.grad)


def test_a_copied_or_pickled_point_plans_afresh() -> None:
    import copy
    import pickle

    point = PairPoint(Rounder(an.E4M3FN), None)
    x = torch.tensor([0.3])
    point.round(x)
    for twin in (copy.deepcopy(point), pickle.loads(pickle.dumps(point))):
        assert twin._plan is None and twin.round(x).tolist() == [0.3125] and twin._plan is not None
