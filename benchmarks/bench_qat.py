"""QAT overhead: one training step of a LeNet-style CNN on digits (batch 128), quantized vs fp32.

Quantized step: weights and activations E4M3FN, errors E5M2, gradients BF16
(weight/grad/momentum through QuantizedOptimizer), all round-to-nearest; and
the same with stochastic rounding of errors and gradients; and, where `qtorch`
is installed (``pip install -e '.[bench]'``), QPyTorch's own QAT step for the
same numbers at the same places (its Quantizer and OptimLP). Repetitions are
interleaved (fp32, QAT, QAT-SR, fp32, ...) and medians compared, because the
machine is shared and noisy. Prints ratios, never lone absolute times: the median step over the
median fp32 step, the best over the best, and "paired", the median over rounds of each round's
ratio to the fp32 steps of the same round (the steadiest of the three when the machine's speed
drifts during a run).

The rows "Python Function" are the QAT rows with every activation point through the Python
autograd Function instead of the native pair node (`anynum.kernels.pairop`), in the same run.
The row "QAT onto float32 (floor)" is the same QAT step with every category's format float32
itself: every value stays as it is, but every hook, autograd node, parametrized weight,
optimizer category and kernel pass runs as in the QAT rows. The QAT rows sit that far above
fp32 before any value changes. "QAT hooks, Python clones" replaces every rounding by a Python
clone (`CloneRounder`), so the activation points go through the Python autograd Function
instead of the native node (`anynum.kernels.pairop`): the floor as it was before that node.
The rows "torch casts" and "anynum" with "A/E bf16" round only activations and errors, to
bfloat16, at the same six points, with torch's SGD: once by torch's own casts written into the
model (``x.to(torch.bfloat16).float()``, whose backward casts the gradient the same way), once
by `anynum.nn.convert`. They compute the same numbers (checked after the warm-up); the first is
what rounding at these points costs when torch's native casts do it.

It measures the steady state of a training run. On CPU every rounding goes through the
native C kernels (`anynum.kernels.ckernel`, built once per machine), stochastic rounding
included, from the first call, and every activation point through the native pair node; the
warm-up steps (100 by default, their length printed) only settle allocations and caches.
ANYNUM_COMPILE=0 measures the eager kernels instead.
``--profile`` prints where the QAT step's time goes (cProfile of the SR step); ``--parts`` the
median time of each part of every setup's step (zero_grad, forward, backward, optimizer), timed
apart in interleaved steps, and what each adds to fp32's.

Run: python benchmarks/bench_qat.py [--reps N] [--inner K] [--warmup W] [--threads T] [--parts]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import anynum as an
from anynum.kernels.clib import library
from anynum.kernels.pairop import build_now


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.conv1(x.view(-1, 1, 8, 8))))
        x = self.pool2(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class Bf16Cast(nn.Module):
    """torch's own bfloat16 round trip, whose backward casts the gradient the same way."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16).float()


class QuantizedInputsCNN(CNN):
    """The same CNN with a quantizer module (QPyTorch's `Quantizer`, `Bf16Cast`) at the inputs of
    the same six layers."""

    def __init__(self, quant: nn.Module) -> None:
        super().__init__()
        self.quant = quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.quant
        x = self.pool1(q(torch.relu(self.conv1(q(x.view(-1, 1, 8, 8))))))
        x = self.pool2(q(torch.relu(self.conv2(q(x)))))
        return self.fc2(q(torch.relu(self.fc1(q(x.flatten(1))))))


def qpytorch_setup() -> tuple[nn.Module, object] | None:
    """QPyTorch's QAT step for the same numbers (W e4m3 via OptimLP, A e4m3, E e5m2, G/M bf16), if installed.

    QPyTorch's floats differ in detail (no inf/NaN, one more binade, ties away: PEERS.md); the
    work per element is the same kind. It rounds weights only in OptimLP, never at forward.
    """
    from anynum.experiments.peers import peer_extensions

    try:
        with peer_extensions("qtorch"):  # its C++ build in a directory of its own (Qtorch+ clashes)
            from qtorch import FloatingPoint
            from qtorch.optim import OptimLP
            from qtorch.quant import Quantizer, float_quantize
    except ImportError:
        return None

    def number(exp: int, man: int):  # type: ignore[no-untyped-def]
        return lambda t: float_quantize(t, exp=exp, man=man, rounding="nearest")

    quant = Quantizer(
        forward_number=FloatingPoint(exp=4, man=3),
        backward_number=FloatingPoint(exp=5, man=2),
        forward_rounding="nearest",
        backward_rounding="nearest",
    )
    torch.manual_seed(0)
    m = QuantizedInputsCNN(quant)
    opt = OptimLP(
        torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
        weight_quant=number(4, 3),
        grad_quant=number(8, 7),
        momentum_quant=number(8, 7),
    )
    return m, opt


class CloneRounder(an.nn.Rounder):
    """Rounds nothing: a clone where a rounding would be, nothing where a group is rounded in place.

    A QAT step built with it costs what anynum's QAT machinery costs without its kernels and
    without the native pair node, which takes only `Rounder` itself (the forward pre-hooks,
    the Python autograd Function that rounds errors on the way back, the parametrized
    weights, the optimizer wrapper).
    """

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone()

    def round_each_into(self, tensors: list[torch.Tensor], stage: object = None) -> None:
        return None


def setups() -> dict[str, tuple[nn.Module, object]]:
    out: dict[str, tuple[nn.Module, object]] = {}
    torch.manual_seed(0)
    m = CNN()
    out["fp32"] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    for name, rounding in (("qat", "nearest"), ("qat_sr", "sr"), ("qat_py", "nearest"), ("qat_sr_py", "sr")):
        torch.manual_seed(0)
        m = an.nn.convert(
            CNN(), an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error=("e5m2", rounding), seed=1)
        )
        opt = an.optim.QuantizedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
            weight="e4m3fn", grad=("bf16", rounding), momentum="bf16", seed=2,
        )
        out[name] = (m, opt)
    for name, same in (("floor", an.nn.Rounder(an.FP32)), ("clones", CloneRounder("e4m3fn"))):
        torch.manual_seed(0)
        m = an.nn.convert(CNN(), an.nn.Policy(weight=same, activation=same, error=same))
        opt = an.optim.QuantizedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), weight=same, grad=same, momentum=same
        )
        out[name] = (m, opt)
    torch.manual_seed(0)
    m = QuantizedInputsCNN(Bf16Cast())
    out["casts"] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    torch.manual_seed(0)
    m = an.nn.convert(CNN(), an.nn.Policy(activation="bf16", error="bf16"))
    out["ae_bf16"] = (m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
    peer = qpytorch_setup()
    if peer is not None:
        out["qpytorch"] = peer
    return out


#: Rows whose activation points go through the Python autograd Function instead of the native
#: pair node (`python_pair`): what the node saves, measured in the same run.
PYTHON_PAIR = ("qat_py", "qat_sr_py")


@contextlib.contextmanager
def python_pair(on: bool) -> Iterator[None]:
    """While `on`, `anynum.nn`'s activation points take the Python Function (the node declines)."""
    names = importlib.import_module("anynum.nn.quantizer").__dict__  # what the points look up
    saved = names["round_pair"], names["pair_plan"]
    if on:
        names["round_pair"] = names["pair_plan"] = lambda *args: None
    try:
        yield
    finally:
        names["round_pair"], names["pair_plan"] = saved


def step(model: nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def digits_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The first 128 scikit-learn digits (scaled to [0, 1]) and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data[:128], dtype=torch.float32) / 16.0, torch.tensor(d.target[:128])


def run_steps(
    runs: dict[str, tuple[nn.Module, Any]], x: torch.Tensor, y: torch.Tensor, rounds: int, inner: int
) -> dict[str, list[float]]:
    """`rounds` rounds of `inner` steps of every run in turn (interleaved): seconds per step, by round."""
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, (model, opt) in runs.items():
            with python_pair(name in PYTHON_PAIR):
                t0 = time.perf_counter()
                for _ in range(inner):
                    step(model, opt, x, y)
                times[name].append((time.perf_counter() - t0) / inner)
    return times


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    build_now()  # the same for the native pair node (C++, about 20 s on a first run)
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=5, help="steps per timed repetition")
    ap.add_argument("--warmup", type=int, default=100, help="untimed steps first (compiles happen here)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="cProfile 200 steps of the SR QAT step")
    ap.add_argument("--parts", action="store_true",
                    help="also: each step's zero_grad, forward, backward and optimizer step, timed apart")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    x, y = digits_batch()
    runs = setups()
    t0 = time.perf_counter()
    run_steps(runs, x, y, args.warmup, 1)
    warmup_s = time.perf_counter() - t0
    casts, ours = runs["casts"][0].parameters(), runs["ae_bf16"][0].parameters()
    if not all(torch.equal(a, b) for a, b in zip(casts, ours, strict=True)):
        raise SystemExit("torch's casts and anynum's A/E bf16 rows trained to different weights: a bug")
    times = run_steps(runs, x, y, args.reps, args.inner)
    base = statistics.median(times["fp32"])
    print(f"CNN on digits, batch 128, {args.threads} threads, {args.reps}x{args.inner} interleaved steps")
    print(f"warm-up: {args.warmup} steps of each, {warmup_s:.1f} s (one-off compiles included)")
    print(f"{'step':<36}{'median / fp32':>14}{'best / fp32':>13}{'paired':>9}")
    labels = {
        "fp32": "fp32 (torch SGD)",
        "qat": "QAT nearest (W/A e4m3fn, E e5m2)",
        "qat_sr": "QAT, SR errors and grads",
        "qat_py": "QAT nearest, Python Function",
        "qat_sr_py": "QAT SR, Python Function",
        "floor": "QAT onto float32 (floor)",
        "clones": "QAT hooks, Python clones",
        "casts": "torch casts A/E bf16, torch SGD",
        "ae_bf16": "anynum A/E bf16, torch SGD",
        "qpytorch": "QPyTorch QAT nearest, same numbers",
    }
    for name in runs:
        ratio, best = statistics.median(times[name]) / base, min(times[name]) / min(times["fp32"])
        paired = statistics.median(t / f for t, f in zip(times[name], times["fp32"], strict=True))
        print(f"{labels[name]:<36}{ratio:>13.2f}x{best:>12.2f}x{paired:>8.2f}x")
    if args.parts:
        print_parts(runs, x, y, args.reps * args.inner, labels)
    if args.profile:
        profile(runs["qat_sr"], x, y)


PARTS = ("zero_grad", "forward", "backward", "optimizer")


def print_parts(runs: dict[str, tuple[nn.Module, Any]], x: torch.Tensor, y: torch.Tensor, steps: int,
                labels: dict[str, str]) -> None:
    """The median time of each part of the step (steps interleaved), in us, and what each setup adds
    to fp32's: where a QAT step's extra time goes."""
    clock = time.perf_counter_ns
    spent: dict[str, dict[str, list[int]]] = {name: {part: [] for part in PARTS} for name in runs}
    for _ in range(steps):
        for name, (model, opt) in runs.items():
            with python_pair(name in PYTHON_PAIR):
                t0 = clock()
                opt.zero_grad()
                t1 = clock()
                loss = nn.functional.cross_entropy(model(x), y)
                t2 = clock()
                loss.backward()
                t3 = clock()
                opt.step()
                t4 = clock()
            for part, t in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                spent[name][part].append(t)
    us = {n: {p: statistics.median(v) / 1e3 for p, v in parts.items()} for n, parts in spent.items()}
    print(f"\nparts of the step, median us over {steps} interleaved steps (+ over fp32):")
    print(f"{'step':<36}" + "".join(f"{p:>18}" for p in PARTS))
    for name in runs:
        cells = "".join(f"{us[name][p]:>9.0f} {us[name][p] - us['fp32'][p]:>+7.0f} " for p in PARTS)
        print(f"{labels[name]:<36}{cells}")


def profile(run: tuple[nn.Module, object], x: torch.Tensor, y: torch.Tensor, steps: int = 200) -> None:
    """Where the time of the SR QAT step goes: the functions with the most time of their own."""
    import cProfile
    import pstats

    model, opt = run
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step(model, opt, x, y)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
