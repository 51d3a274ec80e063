"""Speed on a CUDA device, as ratios to the same device's native ops in one run.

    python benchmarks/bench_cuda.py [--size 16777216] [--reps 20] [--json bench-results/cuda.json]

Three tables: quantize (float32 input, out= given) through the router's default route (the
compiled kernel from ``ANYNUM_COMPILE_MIN`` elements) and through the eager reference
(``ANYNUM_COMPILE=0``), as multiples of ``out.copy_(x)`` and of the bf16 round trip, with each
case's first call (the compile) in seconds; the MC matrix product (nc = 2, float32 components)
against the float64 matmul, per engine; one LeNet-5 training step (batch 128, Adam) under
``an.emulate`` against the fp32 step. Times are medians of ``--reps`` calls timed with CUDA
events after a synchronising warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_emulate import make_step  # the same LeNet-5 step as the CPU benchmark

import anynum as an
from anynum import mc

CASES: list[tuple[str, an.Format, str]] = [
    ("e4m3fn nearest", an.E4M3FN, "nearest"),
    ("e5m2 sr", an.E5M2, "sr"),
    ("bf16 sr", an.BF16, "sr"),
    ("fixed(4,8) sr", an.FixedPoint(4, 8), "sr"),
    ("posit(16,1) nearest", an.Posit(16, 1), "nearest"),
    ("posit(8,0) sr", an.Posit(8, 0), "sr"),
    ("table(e2m1) nearest", an.Table.from_format(an.E2M1), "nearest"),
    ("mxfp8_e4m3 nearest", an.MXFP8_E4M3, "nearest"),
    ("nvfp4 nearest", an.NVFP4, "nearest"),
]


def cuda_ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of `fn` on the current stream."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def quantize_rows(size: int, reps: int) -> list[dict[str, object]]:
    x = torch.randn(size, device="cuda")
    out = torch.empty_like(x)
    copy = cuda_ms(lambda: out.copy_(x), reps)
    bf16 = cuda_ms(lambda: x.to(torch.bfloat16).float(), reps)
    rows: list[dict[str, object]] = [{"case": "copy_", "ms": copy}, {"case": "bf16 round trip", "ms": bf16}]
    for route in ("auto", "0"):
        os.environ["ANYNUM_COMPILE"] = route
        for name, fmt, mode in CASES:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            an.quantize(x, fmt, mode, seed=1, out=out)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = cuda_ms(lambda fmt=fmt, mode=mode: an.quantize(x, fmt, mode, seed=1, out=out), reps)
            rows.append({"case": name, "route": "compiled" if route == "auto" else "eager", "ms": ms,
                         "x_copy": ms / copy, "x_bf16": ms / bf16, "first_call_s": first})
    os.environ.pop("ANYNUM_COMPILE")
    return rows


def mc_rows(n: int, reps: int) -> list[dict[str, object]]:
    a64 = torch.randn(n, n, dtype=torch.float64, device="cuda")
    b64 = torch.randn(n, n, dtype=torch.float64, device="cuda")
    ref = cuda_ms(lambda: a64 @ b64, reps)
    a = mc.MCTensor(a64, 2, dtype=torch.float32)
    b = mc.MCTensor(b64, 2, dtype=torch.float32)
    rows: list[dict[str, object]] = []
    for engine in ("int8", "float"):
        ms = cuda_ms(lambda engine=engine: mc.matmul(a, b, engine=engine), reps)
        rows.append({"case": f"mc matmul {n}^3 nc=2 f32, {engine}", "ms": ms, "x_float64": ms / ref})
    return rows


def emulate_rows(reps: int) -> list[dict[str, object]]:
    base = cuda_ms(make_step("fp32", 128, "cuda"), reps)
    rows: list[dict[str, object]] = [{"case": "LeNet-5 step fp32", "ms": base}]
    for label, setting in (("emulate(posit16es2)", "emulate"), ("emulate(posit8es0, quire)", "quire8")):
        ms = cuda_ms(make_step(setting, 128, "cuda"), max(3, reps // 4))
        rows.append({"case": f"LeNet-5 step {label}", "ms": ms, "x_fp32": ms / base})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mc-size", type=int, default=1024)
    ap.add_argument("--json", default="bench-results/cuda.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda needs a CUDA device")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} elements")
    rows: list[dict[str, object]] = []
    for section in (lambda: quantize_rows(args.size, args.reps), lambda: mc_rows(args.mc_size, args.reps),
                    lambda: emulate_rows(args.reps)):
        for r in section():
            rows.append(r)
            extra = "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in r.items() if k != "case")
            print(f"{r['case']:<42} {extra}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                           "size": args.size, "rows": rows}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
