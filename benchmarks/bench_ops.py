"""an.ops (chopped math) against Pychop's Chop math methods on the same calls: ratios from one run.

    python benchmarks/bench_ops.py [--sizes 100000 1000000] [--repeats 7] [--threads 2]

Both sides get the same float32 torch tensor and the same format (bf16 = Chop(8, 7),
fp16 = Chop(5, 10)), round to nearest or up (Pychop rmode 1 / 2). The table gives
median times and ``pychop / anynum`` (above 1: anynum is faster). Pychop comes with
``pip install -e '.[bench]'``; without it only anynum's times are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import anynum as an

UNARY = ("sin", "exp", "log", "sqrt", "tanh")
BINARY = ("add", "multiply", "divide")
FORMATS = {"bf16": (8, 7), "fp16": (5, 10)}
MODES = {"nearest": 1, "ru": 2}


def _time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (first-call set-up, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pychop(exp_bits: int, sig_bits: int, rmode: int) -> Any:
    try:
        from pychop import Chop
    except ImportError:
        return None
    ch = Chop(exp_bits, sig_bits, rmode=rmode)
    ch(torch.ones(4))  # Pychop binds its backend on the first plain call
    return ch


def cases(n: int) -> list[tuple[str, Callable[..., Any], Callable[..., Any] | None, tuple[Any, ...]]]:
    """(label, anynum call, pychop call, args) for one size."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g) * 4 + 0.1
    y = torch.rand(n, generator=g) * 4 + 0.1
    side = round(n**0.5 / 4)
    a = torch.rand(side, side, generator=g)
    out = []
    for fname, (e, m) in FORMATS.items():
        for mode, rmode in MODES.items():
            ch = _pychop(e, m, rmode)
            for f in UNARY:
                out.append((f"{f} {fname} {mode}",
                            lambda f=f, fname=fname, mode=mode: getattr(an.ops, f)(x, fname, mode),
                            None if ch is None else (lambda f=f, ch=ch: getattr(ch, f)(x)), (n,)))
            for f in BINARY:
                out.append((f"{f} {fname} {mode}",
                            lambda f=f, fname=fname, mode=mode: getattr(an.ops, f)(x, y, fname, mode),
                            None if ch is None else (lambda f=f, ch=ch: getattr(ch, f)(x, y)), (n,)))
            out.append((f"sum {fname} {mode}", lambda fname=fname, mode=mode: an.ops.sum(x, fname, mode),
                        None if ch is None else (lambda ch=ch: ch.sum(x)), (n,)))
            out.append((f"cumsum {fname} {mode}",
                        lambda fname=fname, mode=mode: an.ops.cumsum(x, fname, mode, axis=0),
                        None if ch is None else (lambda ch=ch: ch.cumsum(x, axis=0)), (n,)))
            out.append((f"matmul {side}x{side} {fname} {mode}",
                        lambda fname=fname, mode=mode: an.ops.matmul(a, a, fname, mode),
                        None if ch is None else (lambda ch=ch: ch.matmul(a, a)), (side, side)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, float32 inputs, median of {args.repeats}")
    print(f"{'call':<28}{'size':>10}{'anynum ms':>12}{'pychop ms':>12}{'pychop/anynum':>15}")
    ratios = []
    for n in args.sizes:
        for label, ours, theirs, shape in cases(n):
            t_ours = _time(ours, args.repeats)
            t_theirs = _time(theirs, args.repeats) if theirs is not None else float("nan")
            ratio = t_theirs / t_ours
            if theirs is not None:
                ratios.append(ratio)
            size = "x".join(map(str, shape))
            print(f"{label:<28}{size:>10}{t_ours * 1e3:>12.2f}{t_theirs * 1e3:>12.2f}{ratio:>15.2f}")
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"geometric mean pychop/anynum: {gm:.2f} over {len(ratios)} calls")


if __name__ == "__main__":
    main()
