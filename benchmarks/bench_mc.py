"""Speed of anynum.mc (nc=2) relative to the native float64 op, at 1 and 2 threads.

Run:  python benchmarks/bench_mc.py [--json out.json] [--reps 7] [--dtype float32]

Each repetition times the float64 reference and the MC op back to back (interleaved), and
the table reports the median of the per-repetition ratios, so machine noise affects both
sides alike.  The MCTensor paper's own code, on this machine at 1 thread, nc=2 float32:
add 73 ms (~74x), mul 1070 ms, div 522 ms, mv 793 ms (~720x), matmul 1709 ms (~4900x).
Targets: add <= 7x, mul/div <= 30x, mv/matmul <= 20x.  The matrix products use the default
engine (exact int8 GEMMs); the "native" rows are the previous default, for comparison.

Additions of large float32/float64 operands run as one loop compiled by torch.compile unless
``ANYNUM_COMPILE=0`` (default "auto": from 262144 elements); the "(eager)" rows force the
eager cache-blocked kernels in the same run.  The first call of each compiled kernel (the
compile, or a load from Inductor's disk cache) is timed separately and printed as "first
call"; it is excluded from the ratios.

``--baseline DIR`` adds "(baseline)" rows that run the same MCTensor operations with the
``arith.py``/``linalg.py`` found in DIR (e.g. an earlier version extracted with
``git show REV:src/anynum/mc/arith.py > DIR/arith.py``, same for linalg.py), interleaved in
the same run, for before/after comparisons on a noisy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import time

import torch

from anynum import mc


def _time(f, inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        f()
    return (time.perf_counter() - t0) / inner


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def baseline(directory: str):
    """A wrapper running a callable with the arith/linalg modules of `directory` swapped in."""
    from anynum.mc import tensor

    old_arith = _load(os.path.join(directory, "arith.py"), "_mc_baseline_arith")
    old_linalg = _load(os.path.join(directory, "linalg.py"), "_mc_baseline_linalg")
    old_linalg.arith = old_arith

    @contextlib.contextmanager
    def swapped():
        saved = tensor.arith, tensor.linalg
        tensor.arith, tensor.linalg = old_arith, old_linalg
        try:
            yield
        finally:
            tensor.arith, tensor.linalg = saved

    def wrap(f):
        def run():
            with swapped():
                return f()
        return run

    return wrap


def eager(f):
    """`f` with the compiled elementwise kernels switched off (ANYNUM_COMPILE=0)."""

    def run():
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


def cases(dtype: torch.dtype, base=None):
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
    out = [
        ("add 1000x1000 (MC+MC)", lambda: X + Y, lambda: x + y, 3),
        ("add 1000x1000 (MC+tensor)", lambda: X + Y, lambda: x + yt, 3),
        ("add 1000x1000 (MC+MC) (eager)", lambda: X + Y, eager(lambda: x + y), 3),
        ("add 1000x1000 (MC+tensor) (eager)", lambda: X + Y, eager(lambda: x + yt), 3),
        ("mul 1000x1000 (MC*MC)", lambda: X * Y, lambda: x * y, 3),
        ("div 1000x1000 (MC/MC)", lambda: X / Y, lambda: x / y, 2),
        ("mv (5000x500).500 (MC.tensor)", lambda: M @ v, lambda: m @ vt, 1),
        ("matmul (500x200).(200x50) (MC.tensor)", lambda: A @ B, lambda: a @ bt, 2),
        ("matmul (500x200).(200x50) (MC.MC)", lambda: A @ B, lambda: a @ bm, 1),
        ("matmul wide engine (MC.tensor)", lambda: A @ B,
         lambda: mc.matmul(a, bt, engine="wide"), 2),
        # the previous default (component-dtype float GEMMs), for a same-run comparison
        ("mv native engine (MC.tensor)", lambda: M @ v, lambda: mc.matmul(m, vt, engine="native"), 1),
        ("matmul native engine (MC.tensor)", lambda: A @ B,
         lambda: mc.matmul(a, bt, engine="native"), 1),
        ("matmul native engine (MC.MC)", lambda: A @ B,
         lambda: mc.matmul(a, bm, engine="native"), 1),
    ]
    if base is not None:
        out += [
            ("add 1000x1000 (MC+MC) (baseline)", lambda: X + Y, base(lambda: x + y), 3),
            ("mul 1000x1000 (MC*MC) (baseline)", lambda: X * Y, base(lambda: x * y), 3),
            ("div 1000x1000 (MC/MC) (baseline)", lambda: X / Y, base(lambda: x / y), 2),
            ("mv (5000x500).500 (MC.tensor) (baseline)", lambda: M @ v, base(lambda: m @ vt), 1),
            ("matmul (500x200).(200x50) (MC.tensor) (baseline)", lambda: A @ B, base(lambda: a @ bt), 2),
            ("matmul (500x200).(200x50) (MC.MC) (baseline)", lambda: A @ B, base(lambda: a @ bm), 1),
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--baseline", default=None,
                    help="directory with an earlier arith.py and linalg.py to compare against")
    args = ap.parse_args()
    base = baseline(args.baseline) if args.baseline else None
    dtype = getattr(torch, args.dtype)
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, ref, op, inner in cases(dtype, base):
            t0 = time.perf_counter()
            op()
            first = time.perf_counter() - t0
            if first > 0.5:
                print(f"{threads}T  {name:42s} first call {first:.1f} s (compile or cache load)")
            ref()
            ratios, tr, to = [], [], []
            for _ in range(args.reps):
                a = _time(ref, inner * 5)
                b = _time(op, inner)
                tr.append(a)
                to.append(b)
                ratios.append(b / a)
            row = {"threads": threads, "op": name, "dtype": args.dtype,
                   "float64_ms": statistics.median(tr) * 1e3, "mc_ms": statistics.median(to) * 1e3,
                   "ratio": statistics.median(ratios)}
            results.append(row)
            print(f"{threads}T  {name:42s} f64 {row['float64_ms']:8.3f} ms  "
                  f"MC {row['mc_ms']:9.3f} ms  ratio {row['ratio']:7.1f}x", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
