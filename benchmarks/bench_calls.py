"""Per-call time of `an.quantize` at 4k and 65k elements: the median of many calls, as JSON.

For comparisons across commits (run it in each checkout with ``PYTHONPATH=src``, alternating
a few times, and compare medians): small calls are where routing and the front door show.
No compile enters the timing (``ANYNUM_COMPILE_MIN`` is set beyond every size).

    PYTHONPATH=src python benchmarks/bench_calls.py > calls.json
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

os.environ.setdefault("ANYNUM_COMPILE_MIN", str(1 << 40))  # eager/C paths only: no compile timed

import torch

import anynum as an
from anynum.kernels.clib import library

CASES = [("e4m3fn", "nearest"), ("bf16", "nearest"), ("e5m2", "rz"), ("e5m2", "sr"),
         ("posit(16,1)", "nearest"), ("fixed(4,8)", "nearest"), ("mxfp8_e4m3", "nearest")]  # fmt: skip


def median_seconds(fn: Callable[[], object], reps: int) -> float:
    """The median time of `reps` calls of `fn` (after one untimed call)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    torch.set_num_threads(2)
    out: dict[str, float] = {}
    for n in (4096, 65536):
        x = torch.randn(n)
        ref = torch.empty_like(x)
        reps = 400 if n == 4096 else 100
        out[f"copy_ {n}"] = median_seconds(lambda: ref.copy_(x), reps)  # noqa: B023
        for name, mode in CASES:
            fmt = an.format(name)
            seed = 0 if mode == "sr" else None
            out[f"{name} {mode} {n}"] = median_seconds(
                lambda: an.quantize(x, fmt, mode, seed=seed), reps  # noqa: B023
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
