"""The floor under stochastic rounding: what the counter hash alone costs, against copy_.

    python benchmarks/bench_sr_floor.py [--size 4194304] [--rounds 30] [--threads 2]

Stochastic rounding draws each element's bits from `anynum.rounding.counter_bits` (two
SplitMix64 finaliser rounds of ``index ^ base``: four 64-bit multiplies per element), so
that results do not depend on the thread count, the call size or the path (C kernel,
compiled, eager). Issue 15 keeps that generator. This benchmark builds a kernel that
does only what any SR kernel with this generator must do: read x, draw the element's
bits with the library's own ``counter_bits`` (csrc/common.c), let one bit decide, write
y; threaded by the library's own pool (csrc/pool.c) in the same 64-element-aligned
parts. Its time is a lower bound for every SR mode; the library's SR kernels are timed
beside it, and ``out.copy_(x)`` and the pool's memcpy give the bandwidth line.

Minimum of `--rounds` interleaved rounds (the machine may be shared); ratios from one run.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Callable
from pathlib import Path

import torch

import anynum as an
from anynum.kernels.clib import library
from anynum.kernels.nativelib import NativeSource, load

_CSRC = Path(an.__file__).parent / "kernels" / "csrc"

_FLOOR = r"""
typedef struct { const float *x; float *y; int64_t n; uint64_t base; int hash; } floor_job;

static void floor_task(void *ctx, int part, int parts) {
    const floor_job *j = (const floor_job *)ctx;
    int64_t b, e;
    pool_range(j->n, part, parts, &b, &e);
    if (!j->hash) {
        memcpy(j->y + b, j->x + b, (size_t)(e - b) * sizeof(float));
        return;
    }
    for (int64_t i = b; i < e; i++) { /* one random bit flips the sign: the draw cannot be dropped */
        uint32_t u = f32_bits(j->x[i]) ^ ((uint32_t)counter_bits(j->base, (uint64_t)i, 1) << 31);
        j->y[i] = f32_from(u);
    }
}

void anynum_bench_floor(const float *x, float *y, int64_t n, uint64_t base, int32_t hash, int32_t threads) {
    floor_job j = {x, y, n, base, hash};
    pool_run(floor_task, &j, pool_parts(n, 16384, threads));
}
"""


def _library() -> ctypes.CDLL:
    text = "\n".join((_CSRC / name).read_text(encoding="utf-8") for name in ("common.c", "pool.c"))
    src = NativeSource("anynum_bench_srfloor", text + _FLOOR, flags=("-std=c11", "-pthread"))
    lib = load(src)
    if lib is None:
        raise SystemExit("no C compiler or no private cache directory: nothing to measure")
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.anynum_bench_floor.argtypes = [vp, vp, i64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int32]
    lib.anynum_bench_floor.restype = None
    return lib


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = _library()
    x = torch.randn(args.size)
    out = torch.empty_like(x)
    xp, yp, n = x.data_ptr(), out.data_ptr(), x.numel()
    cases: dict[str, Callable[[], object]] = {
        "out.copy_(x)": lambda: out.copy_(x),
        "pool memcpy": lambda: lib.anynum_bench_floor(xp, yp, n, 0, 0, args.threads),
        "counter bits + one select (floor)": lambda: lib.anynum_bench_floor(
            xp, yp, n, 12345, 1, args.threads
        ),
        "e4m3fn sr": lambda: an.quantize(x, an.E4M3FN, "sr", seed=1, out=out),
        "bf16 sr": lambda: an.quantize(x, an.BF16, "sr", seed=1, out=out),
        "e4m3fn sr, 8 bits": lambda: an.quantize(x, an.E4M3FN, "sr", seed=1, rand_bits=8, out=out),
        "e4m3fn sr_uniform": lambda: an.quantize(x, an.E4M3FN, "sr_uniform", seed=1, out=out),
        "e4m3fn nearest": lambda: an.quantize(x, an.E4M3FN, out=out),
    }
    best = dict.fromkeys(cases, float("inf"))
    for fn in cases.values():
        fn()  # builds, plans, pages
    for _ in range(args.rounds):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    base = best["out.copy_(x)"]
    print(f"{args.size} float32 elements, {args.threads} threads, minimum of {args.rounds} rounds")
    print("| case | ms | x copy_ |\n|---|---|---|")
    for name, t in best.items():
        print(f"| {name} | {t * 1e3:.3f} | {t / base:.2f} |")


if __name__ == "__main__":
    main()
