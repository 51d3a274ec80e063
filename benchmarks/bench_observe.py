"""Cost of watching a training step with `anynum.nn.observe` (what `anynum.nn.diagnose` does).

One QAT step of the study models on digits, and of the MLP made 1024 wide (weights and
activations E4M3FN, errors E5M2, weight gradients E5M2 through a QuantizedOptimizer, round
to nearest), unobserved, observed, and observed with four candidate formats, at two batch
sizes. Repetitions are interleaved and medians compared (the machine is shared and noisy);
one thread and eager kernels, as ``anynum diagnose`` runs. Prints ratios to the unobserved
step, never lone absolute times.

Run: python benchmarks/bench_observe.py [--reps N] [--steps K]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import anynum as an
from anynum.experiments.datasets import load_dataset
from anynum.experiments.models import MLP, build_model
from anynum.experiments.training import batches, sgd, trial_environment
from anynum.kernels.clib import library

POLICY = an.nn.Policy(weight="e4m3fn", activation="e4m3fn", error="e5m2")
CANDIDATES = ["e2m1", "e3m2", "e4m3fn", "bf16"]


def _model(name: str) -> torch.nn.Module:
    data = load_dataset("digits")
    if name == "mlp-1024":  # the study MLP, 1024 wide: layers where arithmetic outweighs the probes
        return MLP(data.n_features, data.n_outputs, hidden=1024)
    return build_model(name, data)


def steps_time(name: str, batch: int, steps: int, watch: str) -> float:
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = an.nn.convert(_model(name), POLICY)
    opt = an.optim.QuantizedOptimizer(sgd(model, 0.03), grad="e5m2")
    todo = list(batches(data.x_train, data.y_train, batch, seed=0, epochs=4))[:steps]
    obs = None
    if watch != "off":
        obs = an.nn.observe(model, opt, candidates=CANDIDATES if watch == "candidates" else ())
    start = time.perf_counter()
    for x, y in todo:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    seconds = time.perf_counter() - start
    if obs is not None:
        obs.remove()
    return seconds


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    print("| model | batch | observed / unobserved | with 4 candidates / unobserved |")
    print("|---|---|---|---|")
    with trial_environment():
        for name in ("mlp", "cnn", "mlp-1024"):
            for batch in (32, 256):
                times: dict[str, list[float]] = {"off": [], "on": [], "candidates": []}
                steps_time(name, batch, 3, "on")  # warm-up: routes, C loop
                for _ in range(args.reps):
                    for watch in times:
                        times[watch].append(steps_time(name, batch, args.steps, watch))
                base = statistics.median(times["off"])
                on = statistics.median(times["on"]) / base
                cand = statistics.median(times["candidates"]) / base
                print(f"| {name} | {batch} | {on:.1f} | {cand:.1f} |")


if __name__ == "__main__":
    main()
