"""First-call latency of quantize in fresh processes: the one native build, then warm first calls."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["first_calls", "first_calls_table"]

_FIRST = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, anynum as an
from anynum.experiments.bench import CASES, case_format
imported = time.perf_counter() - t0
torch.set_num_threads(int(sys.argv[2]))
x = torch.randn(int(sys.argv[3])) * 4
out = torch.empty_like(x)
times = {}
for label, fam, name, mode, rand_bits in CASES:
    if sys.argv[1] not in ("all", fam):
        continue
    fmt, overflow = case_format(name)
    t0 = time.perf_counter()
    an.quantize(x, fmt, mode, overflow=overflow, seed=1 if mode.startswith("sr") else None,
                rand_bits=rand_bits, out=out)
    times[label] = time.perf_counter() - t0
from anynum.kernels.clib import library
t0 = time.perf_counter()
library()  # a cold cache: the rest of the background build, which the calls above did not wait for
print(json.dumps({"import_s": imported, "first_s": times, "build_wait_s": time.perf_counter() - t0}))
"""


def first_calls(
    threads: int = 2,
    size: int = 1 << 22,
    cache_dir: str | None = None,
    families: Sequence[str] = ("float", "fixed", "posit", "table", "block"),
) -> dict[str, Any]:
    """First-call latency, each part in fresh processes (ANYNUM_COMPILE=auto).

    ``cold``: the first call of every case with an empty native cache (the one build per user
    and machine: a fresh ``ANYNUM_CACHE_DIR``; the calls made while it runs take the eager
    reference, those after it the C kernels); ``warm``: for each of `families`, a fresh process whose
    first call loads the built library, then the first call of every other (format, mode) of
    the family in that process. With `cache_dir` (an existing cache) nothing is built.

    >>> from anynum.kernels.nativelib import cache_dir
    >>> fc = first_calls(size=4096, cache_dir=str(cache_dir()), families=("fixed",))
    >>> sorted(fc["warm"]), fc["size"]
    (['fixed'], 4096)
    """
    import json
    import subprocess
    import sys
    import tempfile

    def run(family: str, env: dict[str, str]) -> dict[str, Any]:
        cmd = [sys.executable, "-c", _FIRST, family, str(threads), str(size)]
        done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"first-call run failed: {done.stderr[-2000:]}")
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    env = {"ANYNUM_COMPILE": "auto"}
    with tempfile.TemporaryDirectory(prefix="anynum-bench-cache-") as fresh:
        cold = run("all", {**env, "ANYNUM_CACHE_DIR": cache_dir or fresh})
        warm = {fam: run(fam, {**env, "ANYNUM_CACHE_DIR": cache_dir or fresh})
                for fam in families}  # fmt: skip
    return {"size": size, "threads": threads, "cold": cold, "warm": warm}


def first_calls_table(fc: dict[str, Any]) -> str:
    """The first-call results as lines of text: the cold build, then the warm first calls.

    >>> fc = {"size": 4096, "threads": 2, "cold": {"first_s": {"e4m3fn nearest": 0.9}},
    ...       "warm": {"float": {"import_s": 1.1, "first_s": {"e4m3fn nearest": 0.02, "e5m2 sr": 0.001}}}}
    >>> print(first_calls_table(fc).splitlines()[-1])
      worst first call with the cache warm: 0.020 s (target <= 0.5 s: ok)
    """
    cold = fc["cold"]["first_s"]
    first_label = next(iter(cold))
    slowest = max(cold, key=cold.__getitem__)
    lines = [f"first calls, {fc['size']} float32 elements, {fc['threads']} threads, fresh processes:",
             f"  cold native cache (the one build per user and machine, in the background; the eager "
             f"reference meanwhile): {first_label}: {cold[first_label]:.2f} s, worst "
             f"{cold[slowest]:.2f} s ({slowest}); the build was in "
             f"{fc['cold'].get('build_wait_s', 0.0):.1f} s after the last of them"]  # fmt: skip
    worst = 0.0
    for fam, res in fc["warm"].items():
        t = res["first_s"]
        label = next(iter(t))
        rest = [v for k, v in t.items() if k != label]
        worst = max(worst, *t.values())
        lines.append(f"  warm cache, {fam}: first call in the process ({label}, loads the library) "
                     f"{t[label]:.3f} s; first call of each other (format, mode): max "
                     f"{max(rest) if rest else 0.0:.3f} s; "
                     f"import anynum {res['import_s']:.2f} s")  # fmt: skip
    lines.append(
        f"  worst first call with the cache warm: {worst:.3f} s (target <= 0.5 s: "
        f"{'ok' if worst <= 0.5 else 'MISSED'})"
    )
    return "\n".join(lines)
