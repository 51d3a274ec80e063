"""Speed of anynum.mc (nc = 2) as ratios to the float64 op, one table per run.

Run:  OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_mc.py [--reps 7] [--threads 1,2]
                                                          [--dtype float32] [--json out.json]

The header says where the numbers come from: torch version, CPU model and the SIMD flags that
matter, which engine runs MC matrix products here and why (the once-per-process probe of
`anynum.mc.engine`, or ``ANYNUM_MC_MATMUL``), and whether the native (C) kernels loaded.
Each repetition times the float64 reference and the MC op back to back (interleaved); a cell
is the median of the per-repetition ratios, so machine noise affects both sides alike.  Rows:

* elementwise ops on 1000 x 1000 operands (default route: the C loops of `anynum.mc.cloops`),
  and the same with ``ANYNUM_COMPILE=0`` ("eager") for comparison;
* mv (5000 x 500) . 500 and matmul (500 x 200) . (200 x 50), MC . tensor and MC . MC, with the
  engine chosen here ("auto") and with each engine forced (``engine=``), so one run shows what
  a machine that picks the other engine would get;
* the large products 1000 x 1000 x 1000 and (2000 x 500) . (500 x 500), MC . tensor and
  MC . MC, on the engine chosen here, where the GEMMs' share shows (``--no-large`` skips them).

Targets (issue 15): add and mul <= 3x; matmul nc = 2 float32 <= 10x on both kinds of machine.
The first call of each row (native build or cache load, the engine probe) is timed separately
and printed when above 0.1 s; it is excluded from the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from anynum import mc
from anynum.mc import engine, native


def _time(f: Callable[[], object], inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        f()
    return (time.perf_counter() - t0) / inner


def eager(f: Callable[[], object]) -> Callable[[], object]:
    """`f` with the native and compiled kernels switched off (ANYNUM_COMPILE=0)."""

    def run() -> object:
        old = os.environ.get("ANYNUM_COMPILE")
        os.environ["ANYNUM_COMPILE"] = "0"
        try:
            return f()
        finally:
            if old is None:
                del os.environ["ANYNUM_COMPILE"]
            else:
                os.environ["ANYNUM_COMPILE"] = old

    return run


Case = tuple[str, Callable[[], object], Callable[[], object], int, str]


def cases(dtype: torch.dtype, large: bool = True) -> list[Case]:
    """(name, float64 reference, MC op, inner repetitions, target)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1000, 1000, dtype=torch.float64, generator=g)
    Y = torch.randn(1000, 1000, dtype=torch.float64, generator=g) + 3.0
    x, y = mc.MCTensor(X, 2, dtype=dtype), mc.MCTensor(Y, 2, dtype=dtype)
    M = torch.randn(5000, 500, dtype=torch.float64, generator=g)
    v = torch.randn(500, dtype=torch.float64, generator=g)
    m = mc.MCTensor(M, 2, dtype=dtype)
    A = torch.randn(500, 200, dtype=torch.float64, generator=g)
    B = torch.randn(200, 50, dtype=torch.float64, generator=g)
    a, bm = mc.MCTensor(A, 2, dtype=dtype), mc.MCTensor(B, 2, dtype=dtype)
    vt, bt, yt = v.to(dtype), B.to(dtype), Y.to(dtype)
    out: list[Case] = [
        ("add MC+MC", lambda: X + Y, lambda: x + y, 3, "<= 3x"),
        ("add MC+tensor", lambda: X + Y, lambda: x + yt, 3, "<= 3x"),
        ("mul MC*MC", lambda: X * Y, lambda: x * y, 3, "<= 3x"),
        ("mul MC*tensor", lambda: X * Y, lambda: x * yt, 3, "<= 3x"),
        ("div MC/MC", lambda: X / Y, lambda: x / y, 2, ""),
        ("div MC/tensor", lambda: X / Y, lambda: x / yt, 2, ""),
        ("add MC+MC, eager", lambda: X + Y, eager(lambda: x + y), 3, ""),
        ("mul MC*MC, eager", lambda: X * Y, eager(lambda: x * y), 3, ""),
        ("div MC/MC, eager", lambda: X / Y, eager(lambda: x / y), 2, ""),
    ]
    for eng in ("auto", "float", "int8"):
        out += [
            (f"matmul MC.tensor ({eng})", lambda: A @ B, lambda e=eng: mc.matmul(a, bt, engine=e), 2,
             "<= 10x" if eng != "int8" else ""),
            (f"matmul MC.MC ({eng})", lambda: A @ B, lambda e=eng: mc.matmul(a, bm, engine=e), 2,
             "<= 10x" if eng != "int8" else ""),
            (f"mv MC.tensor ({eng})", lambda: M @ v, lambda e=eng: mc.matmul(m, vt, engine=e), 1, ""),
        ]
    if large:
        for mm, kk, nn in ((1000, 1000, 1000), (2000, 500, 500)):
            L = torch.randn(mm, kk, dtype=torch.float64, generator=g)
            R = torch.randn(kk, nn, dtype=torch.float64, generator=g)
            lm, rm, rt = mc.MCTensor(L, 2, dtype=dtype), mc.MCTensor(R, 2, dtype=dtype), R.to(dtype)
            shape = f"({mm}x{kk})({kk}x{nn})"
            out += [
                (f"matmul MC.tensor {shape} (auto)", lambda L=L, R=R: L @ R,
                 lambda lm=lm, rt=rt: mc.matmul(lm, rt), 1, "<= 10x"),
                (f"matmul MC.MC {shape} (auto)", lambda L=L, R=R: L @ R,
                 lambda lm=lm, rm=rm: mc.matmul(lm, rm), 1, "<= 10x"),
            ]
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header(dtype: str, threads: list[int]) -> dict[str, object]:
    rep = engine.report()
    info = {
        "torch": torch.__version__, "cpu": _cpu_model(), "cpu_flags": rep["cpu_flags"],
        "threads": threads, "dtype": dtype, "matmul_engine": rep["engine"],
        "matmul_engine_reason": rep["reason"], "probe_int8_ms": rep["int8_ms"],
        "probe_float64_ms": rep["float64_ms"], "native_kernels": native.library() is not None,
        "ANYNUM_COMPILE": os.environ.get("ANYNUM_COMPILE", "auto"),
        "ANYNUM_MC_MATMUL": os.environ.get(engine.ENV, "auto"),
    }
    print(f"torch {info['torch']}, {info['cpu']}, flags: {' '.join(map(str, rep['cpu_flags']))}")
    print(f"MC matmul engine here: {rep['engine']} ({rep['reason']}); native C kernels: "
          f"{'loaded' if info['native_kernels'] else 'not available'}; "
          f"ANYNUM_COMPILE={info['ANYNUM_COMPILE']}, {engine.ENV}={info['ANYNUM_MC_MATMUL']}")
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--no-large", dest="large", action="store_false",
                    help="skip the 1000^3 and (2000x500)(500x500) products")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    threads = [int(t) for t in args.threads.split(",")]
    info = header(args.dtype, threads)
    rows: dict[str, dict[str, object]] = {}
    for th in threads:
        torch.set_num_threads(th)
        for name, ref, op, inner, target in cases(dtype, args.large):
            t0 = time.perf_counter()
            op()
            first = time.perf_counter() - t0
            if first > 0.1:
                print(f"  first call of '{name}' at {th} thread(s): {first:.2f} s (build/cache load, probe)")
            ref()
            ratios, tr, to = [], [], []
            for _ in range(args.reps):
                a = _time(ref, inner * 5)
                b = _time(op, inner)
                tr.append(a)
                to.append(b)
                ratios.append(b / a)
            row = rows.setdefault(name, {"op": name, "target": target})
            row[f"{th}T"] = statistics.median(ratios)
            row[f"{th}T_float64_ms"] = statistics.median(tr) * 1e3
            row[f"{th}T_mc_ms"] = statistics.median(to) * 1e3
    cols = [f"{th}T" for th in threads]
    print(f"\n| op (nc=2 {args.dtype}, ratio to the float64 op) | "
          + " | ".join(f"{th} thread{'s' if th > 1 else ''}" for th in threads) + " | target |")
    print("|---|" + "---|" * len(cols) + "---|")
    for row in rows.values():
        cells = " | ".join(f"{row[c]:.1f}x" for c in cols)
        print(f"| {row['op']} | {cells} | {row['target']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": list(rows.values())}, f, indent=1)


if __name__ == "__main__":
    main()
