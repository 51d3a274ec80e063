"""How low can the QAT step go with these kernels? bench_qat's nearest step against an idealised one.

The idealised step rounds the same tensors onto the same formats with the least Python that the
same kernels allow (the script prints whether the two models' weights are equal after the
warm-up; the first step may differ, since bench_qat's model rounds its initial weights at its
first forward and this one after its first step):

* each selected layer's forward pre-hook calls the native pair node directly, with its two
  sides resolved once (no `InputHook` / `apply_pair` / `round_pair` layers);
* no weight parametrization: the optimizer rounds the weights in place after its step, which
  is what the marked parametrization amounts to in `bench_qat`'s step;
* the optimizer is torch's SGD plus three raw calls of the C library's ``anynum_round_each``
  (gradients, momentum buffers, weights), with the pointer arrays of the persistent tensors
  built once.

It is not a usable API (it assumes float32 CPU tensors, deterministic modes, one dtype, nothing
replaced between steps). It measures what the kernels and torch cost under QAT with almost no
Python of ours: the gap between its ratio and 1.0 is the floor under any Python design of
hooks and optimizer wrappers; the gap between it and the real step is our Python.

Run: OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_qat_ideal.py [--reps 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import array
import statistics
from typing import Any

import torch
from bench_qat import CNN, digits_batch, run_steps
from torch import nn

import anynum as an
from anynum.kernels.clib import library
from anynum.kernels.pairop import build_now, pair_op, side


def _side(rounder: an.nn.Rounder) -> list[int]:
    found = side(rounder.plan(torch.float32, "cpu"))
    if found is None:
        raise SystemExit("the C library is not the first kernel here (ANYNUM_COMPILE=0?)")
    return found


class DirectHook:
    """A forward pre-hook that calls the pair node itself (float32 CPU inputs only)."""

    def __init__(self, fwd: an.nn.Rounder, bwd: an.nn.Rounder) -> None:
        self.op, self.fwd = pair_op(), fwd
        self.fwd_side, self.bwd_side = _side(fwd), _side(bwd)

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor]:
        x = args[0]
        if x.requires_grad:
            return (self.op(x, self.fwd_side, self.bwd_side, 0, None),)
        return (self.fwd(x),)


class RawOptimizer:
    """SGD with momentum, then the C library on gradients (before), momentum and weights (after)."""

    def __init__(self, model: nn.Module, grad: str, momentum: str, weight: str) -> None:
        lib = library()
        if lib is None:
            raise SystemExit("no C library here (is there a C compiler?)")
        self.lib = lib
        self.params = list(model.parameters())
        self.inner = torch.optim.SGD(self.params, lr=0.01, momentum=0.9)
        self.calls = [_side(an.nn.Rounder(f))[0] for f in (grad, momentum, weight)]
        self.offsets = array.array("q", [0])
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.weights = array.array("Q", [p.data_ptr() for p in self.params])
        self.momenta: array.array[int] | None = None

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def _round(self, pointers: array.array[int], call: int) -> None:
        address = pointers.buffer_info()[0]
        offsets = self.offsets.buffer_info()[0]
        threads = torch.get_num_threads()
        self.lib.anynum_round_each(address, address, offsets, len(self.params), call, 0, threads)

    def step(self) -> None:
        grads = [p.grad.data_ptr() for p in self.params if p.grad is not None]
        self._round(array.array("Q", grads), self.calls[0])
        self.inner.step()
        if self.momenta is None:
            buffers = [self.inner.state[p]["momentum_buffer"] for p in self.params]
            self.momenta = array.array("Q", [b.data_ptr() for b in buffers])
        self._round(self.momenta, self.calls[1])
        self._round(self.weights, self.calls[2])


def setups() -> dict[str, tuple[nn.Module, Any]]:
    torch.manual_seed(0)
    plain = CNN()
    out: dict[str, tuple[nn.Module, Any]] = {}
    out["fp32"] = (plain, torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9))
    torch.manual_seed(0)
    model = an.nn.convert(CNN(), an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error="e5m2", seed=1))
    opt = an.optim.QuantizedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        weight="e4m3fn", grad="bf16", momentum="bf16",
    )
    out["qat"] = (model, opt)
    torch.manual_seed(0)
    ideal = an.nn.convert(CNN(), an.nn.Policy(activation="e4m3fn", error="e5m2", seed=1))
    for layer in (ideal.conv1, ideal.pool1, ideal.conv2, ideal.pool2, ideal.fc1, ideal.fc2):
        layer._forward_pre_hooks.clear()  # the InputHook convert attached, replaced below
        layer.register_forward_pre_hook(DirectHook(an.nn.Rounder("e4m3fn"), an.nn.Rounder("e5m2")))
    out["ideal"] = (ideal, RawOptimizer(ideal, "bf16", "bf16", "e4m3fn"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    library()
    build_now()
    torch.set_num_threads(args.threads)
    x, y = digits_batch()
    runs = setups()
    run_steps(runs, x, y, args.warmup, 1)
    same = all(torch.equal(a, b) for a, b in zip(runs["qat"][0].parameters(), runs["ideal"][0].parameters()))
    times = run_steps(runs, x, y, args.reps, args.inner)
    base = statistics.median(times["fp32"])
    print(f"CNN on digits, batch 128, {args.threads} threads; weights equal after the warm-up: {same}")
    labels = {"fp32": "fp32 (torch SGD)", "qat": "QAT nearest (bench_qat's step)"}
    labels["ideal"] = "the idealised step"
    for name, label in labels.items():
        print(f"{label:<34}{statistics.median(times[name]) / base:>8.2f}x")


if __name__ == "__main__":
    main()
