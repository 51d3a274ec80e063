"""What the native C kernels cost: per element (one thread, data in cache) and per call (4k elements).

    python benchmarks/bench_ckernel.py [--size 1048576] [--rounds 15] [--calls 3000] [--thread-time]

Part 1 rounds `--size` float32 elements with one thread, every case once per round in turn, and
prints the minimum time as a multiple of ``out.copy_(x)``'s minimum: with the data in cache this is
the arithmetic each family costs per element, not a bandwidth figure. ``--thread-time`` times part 1
by the thread's CPU time, which leaves out the time other processes hold the core. Part 2 times
4,096-element calls (2 threads) through each layer: copy_, the bf16 round trip, the C kernel alone
(`anynum.kernels.ckernel.native_round`), the router's plan, `Rounder` and `an.quantize`, in
microseconds per call (best of 5 batches). Ratios from one run only (docs/speed.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import anynum as an
from anynum.kernels.ckernel import native_round
from anynum.kernels.cparams import call_params
from anynum.kernels.route import Call, plan_for
from anynum.rounding import Rounding

CASES: list[tuple[str, an.Format | None, str, int | None]] = [
    ("copy_", None, "", None),
    ("e4m3fn nearest", an.E4M3FN, "nearest", None),
    ("e4m3fn sr", an.E4M3FN, "sr", None),
    ("e4m3fn sr, 8 bits", an.E4M3FN, "sr", 8),
    ("bf16 sr", an.BF16, "sr", None),
    ("fixed(4,8) sr", an.FixedPoint(4, 8), "sr", None),
    ("posit(16,1) nearest", an.Posit(16, 1), "nearest", None),
    ("posit(8,0) sr", an.Posit(8, 0), "sr", None),
    ("table(e2m1) nearest", an.Table.from_format(an.E2M1), "nearest", None),
    ("table(posit(8,0)) nearest", an.Table.from_format(an.Posit(8, 0)), "nearest", None),
    ("mxfp8_e4m3 nearest", an.MXFP8_E4M3, "nearest", None),
    ("mxfp4_e2m1 nearest", an.MXFP4_E2M1, "nearest", None),
    ("mxint8 nearest", an.MXINT8, "nearest", None),
    ("nvfp4 nearest", an.NVFP4, "nearest", None),
    ("mxfp8_e4m3 sr", an.MXFP8_E4M3, "sr", None),
    ("nvfp4 sr", an.NVFP4, "sr", None),
]


def per_element(size: int, rounds: int, thread_time: bool = False) -> None:
    torch.set_num_threads(1)
    clock = time.thread_time if thread_time else time.perf_counter
    x = torch.randn(size) * 4
    out = torch.empty_like(x)

    def fn(fmt: an.Format | None, mode: str, bits: int | None) -> Callable[[], object]:
        if fmt is None:
            return lambda: out.copy_(x)
        seed = 1 if mode.startswith("sr") else None
        return lambda: an.quantize(x, fmt, mode, seed=seed, rand_bits=bits, out=out)

    fns = [fn(f, m, b) for _, f, m, b in CASES]
    for f in fns:
        f()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, f in enumerate(fns):
            t0 = clock()
            f()
            best[i] = min(best[i], clock() - t0)
    what = "thread CPU time" if thread_time else "wall time"
    print(f"one thread, {size} float32 elements, minimum of {rounds} interleaved rounds ({what}):")
    for (label, *_), t in zip(CASES, best):
        print(f"  {label:<28} {t / best[0]:7.2f}x copy_   {t * 1e3:8.3f} ms")


def per_call(calls: int) -> None:
    torch.set_num_threads(2)
    x = torch.randn(4096)
    out = torch.empty_like(x)
    nearest = Rounding.NEAREST_EVEN
    params = call_params(an.E4M3FN, nearest, "saturate", None, torch.float32)
    assert params is not None
    call = Call(an.E4M3FN, nearest, "saturate", None, torch.float32, "cpu", None)
    plan = plan_for(an.E4M3FN, nearest, "saturate", None, torch.float32, "cpu", None)
    rounder = an.nn.Rounder(an.E4M3FN)
    layers: list[tuple[str, Callable[[], object]]] = [
        ("copy_", lambda: out.copy_(x)),
        ("bf16 round trip", lambda: x.to(torch.bfloat16).float()),
        ("C kernel (native_round)", lambda: native_round(params, call, x, None, out)),
        ("router plan.run", lambda: plan.run(x, None, out)),
        ("Rounder(E4M3FN)(x)", lambda: rounder(x)),
        ("an.quantize(x, E4M3FN, out=)", lambda: an.quantize(x, an.E4M3FN, out=out)),
        ("an.quantize(..., 'sr', seed=1)", lambda: an.quantize(x, an.E4M3FN, "sr", seed=1, out=out)),
    ]
    print(f"4096 float32 elements, 2 threads, best of 5 x {calls} calls:")
    for label, f in layers:
        f()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            best = min(best, (time.perf_counter() - t0) / calls)
        print(f"  {label:<32} {best * 1e6:7.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument(
        "--thread-time",
        action="store_true",
        help="time part 1 by the calling thread's CPU time (a loaded machine's preemptions left out)",
    )
    args = ap.parse_args()
    per_element(args.size, args.rounds, args.thread_time)
    per_call(args.calls)


if __name__ == "__main__":
    main()
