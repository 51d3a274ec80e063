"""Quantization throughput against native casts, copy_ and every installed peer.

    python benchmarks/bench_quantize.py [--sizes 65536 4194304 16777216] [--repeats 7]
                                        [--threads 2] [--json bench-results/quantize.json]

Peers come with ``pip install -e '.[bench]'`` (qtorch, pychop, ml_dtypes, gfloat,
softposit); missing ones are skipped with a note. Same as ``anynum bench``.
"""

from __future__ import annotations

import argparse
import os

from anynum.experiments.bench import main_table, run_benchmark, write_json


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 16, 1 << 20, 1 << 22, 1 << 24])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default="bench-results/quantize.json")
    args = p.parse_args()
    result = run_benchmark(args.sizes, args.repeats, args.threads)
    print(main_table(result))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    write_json(result, args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
