"""Quantization speed, every format family and mode, against copy_, the bf16 round trip and peers.

    python benchmarks/bench_quantize.py [--sizes 4096 65536 1048576 4194304 16777216] [--repeats 7]
        [--threads 2] [--budget 2] [--json bench-results/quantize.json] [--plot bench-results/quantize.png]
        [--first-calls]

Prints one table (anynum's time as a multiple of out.copy_(x) and of x.to(bfloat16).float()
in the same run, each installed peer's as a multiple of copy_, the issue's targets at 4M and
65k elements), writes the JSON and a plot of throughput against size. ``--first-calls`` adds
the first-call latencies (cold native build, then warm cache), each in fresh processes.
Peers come with ``pip install -e '.[bench]'`` (qtorch, qtorch-plus, pychop, ml_dtypes,
gfloat, softposit); a peer cell estimated to exceed ``--budget`` seconds is skipped and
says so. Same as ``anynum bench``. On a shared machine set OMP_WAIT_POLICY=PASSIVE and
compare only ratios from one run (docs/speed.md).
"""

from __future__ import annotations

import argparse
import os

from anynum.experiments.bench import (
    PEERS,
    SIZES,
    first_calls,
    first_calls_table,
    main_table,
    plot_throughput,
    run_benchmark,
    write_json,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budget", type=float, default=2.0, help="seconds a peer cell may take")
    p.add_argument("--json", default="bench-results/quantize.json")
    p.add_argument("--plot", default="bench-results/quantize.png")
    p.add_argument("--first-calls", action="store_true", help="also time first calls in fresh processes")
    p.add_argument("--peers", nargs="*", default=list(PEERS), help="peers to time (default: all installed)")
    args = p.parse_args()
    result = run_benchmark(args.sizes, args.repeats, args.threads, args.budget, peers=args.peers)
    if args.first_calls:
        result["first_calls"] = first_calls(args.threads)
    print(main_table(result))
    if args.first_calls:
        print(first_calls_table(result["first_calls"]))
    for path in (args.json, args.plot):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json(result, args.json)
    plot_throughput(result, args.plot)
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
