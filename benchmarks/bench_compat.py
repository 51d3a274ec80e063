"""Speed of the drop-in facades against the peers they replace, on the same calls.

    python benchmarks/bench_compat.py [--sizes 65536 4194304] [--repeats 7] [--threads 1]
                                      [--budget 10] [--json bench-results/compat.json]

Each row is one call made twice with the same float32 input: through
``anynum.compat.qtorch`` / ``anynum.compat.pychop`` and through ``qtorch``,
``qtorch_plus`` or ``pychop`` (``pip install -e '.[bench]'``; missing peers are
skipped with a note). Each timing is the fastest of interleaved repetitions
(every round times every case once, in a shuffled order): on a shared machine
the minimum is the least disturbed run, and interleaving makes noise hit both
columns alike. The result is the ratio peer time / facade time (> 1: the facade
is faster). One intra-op thread by default: QPyTorch's CPU kernels are
single-threaded, and on a loaded machine torch's thread pool mostly waits. A
peer call slower than ``--budget`` seconds is timed once and its repeats skipped.
The facades give correct results where the peers do not (docs/compat.md), so a
few rows compare different answers on the same call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import random
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from anynum.compat import pychop as fp
from anynum.compat import qtorch as fq
from anynum.compat.qtorch import quant as fqq
from anynum.experiments.peers import peer_extensions
from anynum.kernels.clib import library


def _optional(name: str) -> Any | None:
    try:
        with peer_extensions(name), open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            return importlib.import_module(name)
    except Exception:
        return None


def build_cases(
    x: torch.Tensor, notes: list[str]
) -> list[tuple[str, Callable[[], Any], Callable[[], Any] | None]]:
    """(name, facade call, peer call or None) for one input tensor."""
    xn = x.numpy()
    x2 = x.reshape(-1, 256)
    table = torch.tensor([2.0**k for k in range(-8, 8)])
    q = _optional("qtorch.quant")
    qp = _optional("qtorch_plus.quant")
    pc = _optional("pychop")
    for name, mod in (("qtorch", q), ("qtorch-plus", qp), ("pychop", pc)):
        if mod is None:
            notes.append(f"{name} not installed: its column is empty")
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any] | None]] = []

    def add(name: str, facade: Callable[[], Any], peer: Callable[[], Any] | None) -> None:
        cases.append((name, facade, peer))

    for e, m in ((5, 10), (8, 7), (5, 2)):
        for r in ("nearest", "stochastic"):
            add(
                f"qtorch float_quantize e{e}m{m} {r}",
                lambda e=e, m=m, r=r: fqq.float_quantize(x, e, m, r),
                None if q is None else lambda e=e, m=m, r=r: q.float_quantize(x, e, m, r),
            )
    for r in ("nearest", "stochastic"):
        add(
            f"qtorch fixed_point_quantize (8,4) {r}",
            lambda r=r: fqq.fixed_point_quantize(x, 8, 4, rounding=r),
            None if q is None else lambda r=r: q.fixed_point_quantize(x, 8, 4, rounding=r),
        )
    add(
        "qtorch block_quantize wl=8 dim=-1",
        lambda: fqq.block_quantize(x, 8, -1, "nearest"),
        None if q is None else lambda: q.block_quantize(x, 8, -1, "nearest"),
    )
    add(
        "qtorch block_quantize wl=8 dim=0 (rows of 256)",
        lambda: fqq.block_quantize(x2, 8, 0, "nearest"),
        None if q is None else lambda: q.block_quantize(x2, 8, 0, "nearest"),
    )
    fq_fwd = fqq.Quantizer(fq.FloatingPoint(5, 2), None, "nearest", "nearest")
    peer_fwd = None
    if q is not None:
        peer_fwd = q.Quantizer(
            importlib.import_module("qtorch").FloatingPoint(5, 2), None, "nearest", "nearest"
        )
    add("qtorch Quantizer e5m2 forward", lambda: fq_fwd(x), None if peer_fwd is None else lambda: peer_fwd(x))
    for n, es in ((8, 1), (16, 1)):
        add(
            f"qtorch+ posit_quantize ({n},{es})",
            lambda n=n, es=es: fqq.posit_quantize(x, n, es),
            None if qp is None else lambda n=n, es=es: qp.posit_quantize(x, n, es),
        )
    add(
        "qtorch+ posit_quantize (8,1) scale=4",
        lambda: fqq.posit_quantize(x, 8, 1, 4.0),
        None if qp is None else lambda: qp.posit_quantize(x, 8, 1, 4.0),
    )
    add(
        "qtorch+ configurable_table_quantize (16 entries)",
        lambda: fqq.configurable_table_quantize(x, table),
        None if qp is None else lambda: qp.configurable_table_quantize(x, table),
    )
    add(
        "qtorch+ posit_sigmoid (16)",
        lambda: fqq.posit_sigmoid(x, 16),
        None if qp is None else lambda: qp.posit_sigmoid(x, 16),
    )

    pchop = {}
    if pc is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pc.backend("auto")
        pchop = {
            "c1": pc.Chop(5, 10, rmode=1),
            "c5": pc.Chop(5, 10, rmode=5),
            "c3": pc.Chop(8, 7, rmode=3),
            "f": pc.Chopf(4, 4),
            "fault": pc.FaultChop("h"),
            "i": pc.Chopi(8, symmetric=True),
        }
    fc = {
        "c1": fp.Chop(5, 10, rmode=1),
        "c5": fp.Chop(5, 10, rmode=5),
        "c3": fp.Chop(8, 7, rmode=3),
        "f": fp.Chopf(4, 4),
        "fault": fp.FaultChop("h"),
        "i": fp.Chopi(8, symmetric=True),
    }

    def peer(key: str, arr: Any) -> Callable[[], Any] | None:
        return None if not pchop else (lambda c=pchop[key]: c(arr))

    add("pychop Chop(5,10) rmode 1, torch", lambda: fc["c1"](x), peer("c1", x))
    add("pychop Chop(5,10) rmode 5, torch", lambda: fc["c5"](x), peer("c5", x))
    add("pychop Chop(8,7) rmode 3, torch", lambda: fc["c3"](x), peer("c3", x))
    add("pychop Chop(5,10) rmode 1, numpy", lambda: fc["c1"](xn), peer("c1", xn))
    add(
        "pychop FaultChop('h'), numpy",
        lambda: fc["fault"](xn),
        None if not pchop else (lambda: pchop["fault"](xn.astype(np.float64))),
    )
    add("pychop Chopf(4,4), torch", lambda: fc["f"](x), None if not pchop else (lambda: pchop["f"](x)))
    add("pychop Chopi(8) fake-quantize, torch", lambda: fc["i"](x), peer("i", x))
    add(
        "pychop sin(x, Chop(5,10)), numpy",
        lambda: fp.sin(xn, fc["c1"]),
        None if not pchop else (lambda: pc.sin(xn, pchop["c1"])),
    )
    return cases


def _time(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run(sizes: list[int], repeats: int, threads: int, budget: float) -> dict[str, Any]:
    torch.set_num_threads(threads)
    notes: list[str] = []
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 4
        cases = build_cases(x, notes)
        timers: list[tuple[int, str, Callable[[], Any]]] = []
        times: dict[tuple[int, str], list[float]] = {}
        for i, (_, facade, peer) in enumerate(cases):
            for side, fn in (("facade", facade), ("peer", peer)):
                if fn is None:
                    continue
                first = _time(fn)  # warm-up (and first-call costs, not counted)
                times[(i, side)] = []
                if side == "peer" and first > budget:
                    times[(i, side)] = [_time(fn)]
                    notes.append(f"{cases[i][0]} at {n}: peer timed once ({first:.1f} s > {budget} s budget)")
                    continue
                timers.append((i, side, fn))
        for _ in range(repeats):
            random.shuffle(timers)
            for i, side, fn in timers:
                times[(i, side)].append(_time(fn))
        for i, (name, _, _) in enumerate(cases):
            f = min(times[(i, "facade")])
            p = min(times[(i, "peer")]) if (i, "peer") in times else None
            rows.append(
                {"case": name, "size": n, "facade_s": f, "peer_s": p, "ratio": None if p is None else p / f}
            )
    return {
        "rows": rows,
        "notes": sorted(set(notes)),
        "threads": threads,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def table(result: dict[str, Any]) -> str:
    sizes = sorted({r["size"] for r in result["rows"]})
    names = list(dict.fromkeys(r["case"] for r in result["rows"]))
    by = {(r["case"], r["size"]): r for r in result["rows"]}
    head = "| call | " + " | ".join(f"peer / facade at {s:,}" for s in sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes)]
    for name in names:
        cells = []
        for s in sizes:
            r = by.get((name, s))
            cells.append("-" if r is None or r["ratio"] is None else f"{r['ratio']:.1f}x")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"torch {result['torch']}, {result['threads']} threads, {result['cpus']} CPUs ({result['machine']})"
    )
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 16, 1 << 22])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=float, default=10.0)
    p.add_argument("--json", default="bench-results/compat.json")
    args = p.parse_args()
    result = run(args.sizes, args.repeats, args.threads, args.budget)
    print(table(result))
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
