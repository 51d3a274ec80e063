"""Emulation overhead: one training step of the thesis's LeNet-5 (batch 128, Adam), as ratios to fp32.

Settings, timed in one run with repetitions interleaved (fp32, A, B, ..., fp32, A, ...) and
compared by medians, of wall time and of the process's CPU time (all its threads: the work
done, which other processes on a shared machine disturb far less than the wall time), and by
the minimum wall times (on a machine shared with other jobs, a step whose second thread waits
for a busy core can take ten times its time: the minimum is the step undisturbed):

* ``emulate(posit16es2)``: every op in posit(16,2), accumulate=None (float64, rounded once);
* ``emulate(posit16es2, accumulate=posit16es2)``: every partial sum rounded (sequential order;
  the C kernel of `anynum.emulate.native` where it builds, else the torch loop);
* ``as_format(model, posit16es2)``: EmulatedTensor parameters (packed int16 codes), plain inputs;
* ``emulate(posit8es0, accumulate="quire")``: the exact quire (one exact matmul per dot product).

Targets (DESIGN Resolution 11: LeNet-5, batch 128, 2 threads): accumulate=None at most 4x the
fp32 step, sequential posit16 accumulation at most 30x. ``--profile NAME`` prints where the time
of one setting goes (cProfile, top functions). Also prints the memory of the model's parameters
converted by `as_format` (bytes of the packed codes and block scales vs float32).

Run: python benchmarks/bench_emulate.py [--reps N] [--warmup W] [--threads T] [--batch B] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import anynum as an
from anynum.experiments.models import LeNet5
from anynum.kernels.clib import library

P16 = an.Posit(16, 2)
P8 = an.Posit(8, 0)


def make_step(setting: str, batch: int, device: str = "cpu") -> Callable[[], None]:
    """One LeNet-5 training step (Adam) under `setting` ("fp32", "emulate", "sequential",
    "quire8", "as_format") on `device`; benchmarks/bench_cuda.py times it on a GPU."""
    torch.manual_seed(0)
    model = LeNet5().to(device)
    mode: contextlib.AbstractContextManager = contextlib.nullcontext()
    if setting == "emulate":
        mode = an.emulate(P16)
    elif setting == "sequential":
        mode = an.emulate(P16, accumulate=P16)
    elif setting == "quire8":
        mode = an.emulate(P8, accumulate="quire")
    elif setting == "as_format":
        an.as_format(model, P16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    x = torch.rand(batch, 1, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        with mode:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

    return step


def memory_table() -> list[tuple[str, int, float]]:
    rows = []
    base = sum(p.numel() * 4 for p in LeNet5().parameters())
    rows.append(("float32", base, 1.0))
    for name in ("posit(16,2)", "bf16", "posit(8,0)", "e4m3fn", "e2m1", "mxfp8_e4m3", "mxfp4_e2m1", "nvfp4"):
        m = an.as_format(LeNet5(), name)
        held = sum(p.nbytes_stored for p in m.parameters())
        rows.append((name, held, held / base))
    return rows


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--only", nargs="+", default=["emulate", "sequential", "as_format", "quire8"])
    ap.add_argument("--profile", metavar="NAME", help="profile one setting instead of timing")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from anynum.emulate import native

    print(f"threads {args.threads}, batch {args.batch}, C kernel: {'yes' if native.available() else 'no'}")
    if args.profile:
        step = make_step(args.profile, args.batch)
        for _ in range(args.warmup):
            step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.reps):
            step()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    settings = ["fp32", *args.only]
    steps = {s: make_step(s, args.batch) for s in settings}
    for s, step in steps.items():
        t = time.perf_counter()
        for _ in range(args.warmup):
            step()
        print(f"warm-up {s}: {time.perf_counter() - t:.1f} s", flush=True)
    times: dict[str, list[float]] = {s: [] for s in settings}
    cpu: dict[str, list[float]] = {s: [] for s in settings}
    for _ in range(args.reps):
        for s, step in steps.items():
            t, c = time.perf_counter(), time.process_time()
            step()
            times[s].append(time.perf_counter() - t)
            cpu[s].append(time.process_time() - c)
    base, base_cpu = statistics.median(times["fp32"]), statistics.median(cpu["fp32"])
    print(
        "\n| setting | wall time / fp32 (medians) | CPU time / fp32 (medians) | wall time / fp32 (minimums) "
        "| wall time (median, min) |\n|---|---|---|---|---|"
    )
    for s in settings:
        wall, work = statistics.median(times[s]) / base, statistics.median(cpu[s]) / base_cpu
        best = min(times[s]) / min(times["fp32"])
        ms = f"{statistics.median(times[s]) * 1e3:.0f} ms, {min(times[s]) * 1e3:.0f} ms"
        print(f"| {s} | {wall:.1f}x | {work:.1f}x | {best:.1f}x | {ms} |")
    print("\n| parameters as_format | bytes held | vs float32 |\n|---|---|---|")
    for name, held, ratio in memory_table():
        print(f"| {name} | {held} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
