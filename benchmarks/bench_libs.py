"""Two builds of the native library side by side in one process: what a change to csrc/ did.

    python benchmarks/bench_libs.py OLD [NEW] [--cases "posit(16,1):sr" "bf16:nearest" ...]
        [--size 4194304] [--rounds 26] [--threads 1]

OLD and NEW are git revisions of this repository; NEW defaults to the working tree. Each
revision's C source is assembled by that revision's own ``anynum.kernels.clib.source_text``
and built with this checkout's flags through the private, verified cache
(`anynum.kernels.nativelib`), so the two builds differ only in their C. The parameter
structure must have the same layout in both (checked through ``anynum_call_size``): the
parameters come from this checkout's `anynum.kernels.cparams.call_params`.

A case is ``format:mode[:rand_bits]`` with the formats of bench_quantize's table
(``e4m3fn``, ``fixed(4,8)``, ``posit(16,1)``, ``table(e2m1)``, ``mxfp8_e4m3``, ...); the
default is every stochastic case of that table and a few deterministic controls. Every case
rounds the same float32 input (``torch.randn(size) * 4``) with the same seed in both builds.
The outputs must be equal bit for bit, or the script stops. Each round times out.copy_(x) and
then every case in both builds, in an order that alternates from round to round, so that a slow
spell on a shared machine falls on both. It prints the best time of each as a multiple of
copy_, and new / old. The controls, whose code a change did not touch, show how far two
identical builds drift apart on the machine. With ``--threads`` above 1 and
``OMP_WAIT_POLICY`` unset it runs itself again under ``PASSIVE`` (torch's spinning team and
the library's pool would share the cores, and copy_ would time slow).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from anynum.experiments.bench import CASES, case_format
from anynum.formats.block import Block
from anynum.kernels.clib import SOURCE, source_text
from anynum.kernels.cparams import CallStruct, call_params
from anynum.kernels.nativelib import NativeSource, load
from anynum.rounding import CounterRandom, Rounding

_ROOT = Path(__file__).resolve().parent.parent
_CONTROLS = ("e4m3fn:nearest", "posit(16,1):nearest", "table(e2m1):nearest", "mxfp8_e4m3:nearest")


def revision_source(rev: str | None) -> str:
    """The library's C source at git revision `rev` (None: this working tree)."""
    if rev is None:
        return source_text()
    archive = subprocess.run(
        ["git", "-C", str(_ROOT), "archive", "--format=tar", rev, "src/anynum/kernels"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.isfile():
                    target = Path(tmp) / member.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    data = tar.extractfile(member)
                    assert data is not None
                    target.write_bytes(data.read())
        spec = importlib.util.spec_from_file_location(f"clib_{rev}", Path(tmp, "src/anynum/kernels/clib.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # its csrc/ is the one beside it, in tmp
        return str(module.source_text())


def build(rev: str | None) -> ctypes.CDLL:
    """The library built from `rev`'s source, its three entry points typed."""
    name = "anynum_round" if rev is None else f"anynum_round_at_{rev.replace('/', '_')}"
    lib = load(NativeSource(name, revision_source(rev), flags=SOURCE.flags))
    if lib is None:
        raise SystemExit(f"the library of {rev or 'the working tree'} did not build (no C compiler?)")
    vp, i64, i32, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint64
    lib.anynum_round.argtypes = [vp, vp, i64, vp, u64, i32, vp]
    lib.anynum_round.restype = i64
    lib.anynum_round_blocks.argtypes = [vp, vp, i64, i64, vp, u64, i32]
    lib.anynum_round_blocks.restype = i64
    lib.anynum_call_size.restype = i64
    if lib.anynum_call_size() != ctypes.sizeof(CallStruct):
        raise SystemExit(f"{rev or 'the working tree'}: its parameter structure differs from this checkout's")
    return lib


def default_cases() -> list[str]:
    """Every stochastic case of bench_quantize's table, then the deterministic controls."""
    cases = [f"{name}:{mode}" + (f":{bits}" if bits else "") for _l, _f, name, mode, bits in CASES
             if mode.startswith("sr")]  # fmt: skip
    return cases + list(_CONTROLS)


def case_call(
    lib: ctypes.CDLL, spec: str, x: torch.Tensor, y: torch.Tensor, threads: int
) -> Callable[[], int]:
    """One case's call of `lib` on x into y."""
    name, mode, *bits = spec.split(":")
    fmt, overflow = case_format(name)
    rounding = Rounding(mode)
    params = call_params(fmt, rounding, overflow or getattr(fmt, "default_overflow", "saturate"),
                         int(bits[0]) if bits else None, x.dtype)  # fmt: skip
    if params is None:
        raise SystemExit(f"{spec}: the C kernel does not cover it")
    base = CounterRandom(1).stream_base(0) & ((1 << 64) - 1) if rounding.is_stochastic else 0
    n, xp, yp = x.numel(), x.data_ptr(), y.data_ptr()
    if isinstance(fmt, Block):  # one row of n elements
        return lambda: lib.anynum_round_blocks(xp, yp, 1, n, params.address, base, threads)
    return lambda: lib.anynum_round(xp, yp, n, params.address, base, threads, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new", nargs="?", default=None)
    ap.add_argument("--cases", nargs="+", default=None)
    ap.add_argument("--size", type=int, default=1 << 22)
    ap.add_argument("--rounds", type=int, default=26)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.threads > 1 and "OMP_WAIT_POLICY" not in os.environ:
        # torch's team, spinning between its regions under OpenMP's default policy, would meet the
        # library's pool on the cores and time copy_ slow: new / old stays right, x copy_ does not
        print("OMP_WAIT_POLICY unset with --threads > 1: running again under PASSIVE", flush=True)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    torch.set_num_threads(args.threads)
    libs = [build(args.old), build(args.new)]
    x = torch.randn(args.size, generator=torch.Generator().manual_seed(0)) * 4
    out = torch.empty_like(x)
    ys = [torch.empty_like(x) for _ in libs]
    cases = args.cases or default_cases()
    calls = {spec: [case_call(lib, spec, x, y, args.threads) for lib, y in zip(libs, ys)] for spec in cases}
    for spec, pair in calls.items():
        for call in pair:
            call()
        if not torch.equal(ys[0].view(torch.int32), ys[1].view(torch.int32)):
            raise SystemExit(f"{spec}: the two builds give different bits")
    best: dict[object, float] = {}

    def timed(key: object, fn: Callable[[], object]) -> None:
        t = time.perf_counter()
        fn()
        best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)

    for r in range(args.rounds):
        timed("copy_", lambda: out.copy_(x))
        for spec, pair in calls.items():
            for j in (0, 1) if r % 2 == 0 else (1, 0):
                timed((spec, j), pair[j])
    copy = best["copy_"]
    print(f"{args.size} float32 elements, {args.threads} thread(s), best of {args.rounds} rounds; "
          f"old {args.old}, new {args.new or 'working tree'}; out.copy_(x) {copy * 1e3:.3f} ms")  # fmt: skip
    print("| case | old, x copy_ | new, x copy_ | new / old |\n|---|---|---|---|")
    for spec in calls:
        old, new = best[(spec, 0)], best[(spec, 1)]
        print(f"| {spec} | {old / copy:.2f} | {new / copy:.2f} | {new / old:.3f} |")


if __name__ == "__main__":
    main()
