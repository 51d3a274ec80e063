# mypy: disable-error-code="misc"
# (the lambdas bind loop variables as default arguments, which mypy cannot type)
"""Quantization speed: every format family and mode, four sizes, against copy_, casts and peers.

One run times, at each size (4k, 65k, 1M, 4M and 16M elements by default, float32 input),
``out.copy_(x)`` (the memory-bandwidth floor), the bf16 round trip
``x.to(torch.bfloat16).float()``, anynum's ``quantize(x, fmt, mode, out=out)`` for every
family and mode, and every installed peer that computes the same thing (QPyTorch,
Qtorch+, Pychop on its torch backend, ml_dtypes, gfloat, SoftPosit). Repetitions are
interleaved (each round times every entry once, in a shuffled order) and medians are
reported as ratios to copy_ in the same run; small sizes repeat each call until a timing
lasts about a millisecond. A peer cell whose estimated cost exceeds the time budget is not
run and reads "skipped (N s budget)". The result is a JSON-ready dict (`run_benchmark`), a
text table (`main_table`) and a plot of throughput against size (`plot_throughput`).

Run ``python benchmarks/bench_quantize.py`` or ``anynum bench``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import anynum as an
from anynum.experiments.firstcalls import first_calls, first_calls_table
from anynum.experiments.peers import import_peer
from anynum.kernels.clib import library

__all__ = [
    "PEERS",
    "SIZES",
    "Entry",
    "bench_report",
    "case_format",
    "cpu_description",
    "first_calls",
    "first_calls_table",
    "main_table",
    "plot_throughput",
    "run_benchmark",
    "write_json",
]  # fmt: skip

SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
PEERS = ("qtorch", "qtorch_plus", "pychop", "ml_dtypes", "gfloat", "softposit")
Fn = Callable[[], Any]


@dataclasses.dataclass
class Entry:
    """One timed operation at one size: a case ("e4m3fn sr") done by an implementation."""

    case: str
    family: str
    impl: str  # "anynum", "copy_", "bf16", or a peer's name
    fn: Fn
    inner: int = 1  # calls per timing
    times: list[float] = dataclasses.field(default_factory=list)
    skipped: str | None = None


def cpu_description() -> dict[str, str]:
    """The CPU model and the flags that matter to these kernels (Linux /proc/cpuinfo).

    >>> sorted(cpu_description())[:2]
    ['cores', 'flags']
    """
    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                model = line.split(":", 1)[1].strip()
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1]
                break
    except OSError:
        pass
    wanted = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
              "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "asimd", "sve")  # fmt: skip
    have = [f for f in wanted if f in flags.split()]
    return {"model": model, "flags": " ".join(have), "cores": str(os.cpu_count())}


# --- cases: (label, family, format, rounding, rand_bits) -------------------------------------------

_FLOAT_MODES = ("nearest", "rna", "rnz", "rz", "ru", "rd", "ro", "sr", "sr/8", "sr_uniform")
CASES: list[tuple[str, str, str, str, int | None]] = [
    *((f"e4m3fn {m}", "float", "e4m3fn", m.split("/")[0], 8 if "/" in m else None) for m in _FLOAT_MODES),
    *((f"{f} {m}", "float", f, m, None) for f in ("e5m2", "fp16", "bf16", "e6m9") for m in ("nearest", "sr")),
    ("bf16 sr_uniform", "float", "bf16", "sr_uniform", None),
    ("fixed(4,8) nearest", "fixed", "fixed(4,8)", "nearest", None),
    ("fixed(4,8) sr", "fixed", "fixed(4,8)", "sr", None),
    ("fixed(6,3) wrap rz", "fixed", "fixed(6,3)/wrap", "rz", None),
    ("int8 nearest", "fixed", "int8", "nearest", None),
    *((f"posit({n},{es}) nearest", "posit", f"posit({n},{es})", "nearest", None) for n, es in
      ((8, 0), (8, 2), (16, 1), (32, 2))),
    ("posit(16,1) ru", "posit", "posit(16,1)", "ru", None),
    ("posit(16,1) sr", "posit", "posit(16,1)", "sr", None),
    ("posit(8,0) sr", "posit", "posit(8,0)", "sr", None),
    ("table(e2m1) nearest", "table", "table(e2m1)", "nearest", None),
    ("table(e2m1) sr", "table", "table(e2m1)", "sr", None),
    ("table(posit(8,0)) nearest", "table", "table(posit(8,0))", "nearest", None),
    *((f"{b} nearest", "block", b, "nearest", None) for b in ("mxfp8_e4m3", "mxfp4_e2m1", "mxint8", "nvfp4")),
    ("mxfp8_e4m3 sr", "block", "mxfp8_e4m3", "sr", None),
]  # fmt: skip


def case_format(name: str) -> tuple[an.Format, str | None]:
    """The format and overflow policy a benchmark case names ("fixed(6,3)/wrap", "table(e2m1)").

    >>> case_format("fixed(6,3)/wrap")[1], case_format("table(e2m1)")[0].size
    ('wrap', 15)
    """
    if name.endswith("/wrap"):
        return an.format(name[: -len("/wrap")]), "wrap"
    if name.startswith("table("):
        return an.Table.from_format(name[len("table(") : -1]), None
    if name == "e6m9":
        return an.FloatFormat(6, 9), None
    return an.format(name), None


_FLOAT_BITS = {"e4m3fn": (4, 3), "e5m2": (5, 2), "fp16": (5, 10), "bf16": (8, 7), "e6m9": (6, 9)}
_PYCHOP_MODES = {
    "nearest": 1,
    "ru": 2,
    "rd": 3,
    "rz": 4,
    "sr": 5,
    "sr_uniform": 6,
    "rnz": 7,
    "rna": 8,
    "ro": 9,
}
_ML = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "bf16": "bfloat16", "fp16": "float16"}
_GF = {"e4m3fn": "format_info_ocp_e4m3", "e5m2": "format_info_ocp_e5m2", "fp16": "format_info_binary16",
       "bf16": "format_info_bfloat16"}  # fmt: skip
_GF_MODES = {"nearest": "TiesToEven", "rna": "TiesToAway", "rz": "TowardZero", "ru": "TowardPositive",
             "rd": "TowardNegative"}  # fmt: skip


def _peer_fns(label: str, fam: str, name: str, mode: str, rand_bits: int | None, x: torch.Tensor,
              mods: dict[str, Any]) -> dict[str, Fn]:  # fmt: skip
    """What each installed peer does for this case (only the peers that compute the same kind of thing)."""
    fns: dict[str, Fn] = {}
    qt, qtp, pychop, ml, gf, sp = (mods.get(p) for p in PEERS)
    if fam == "float" and rand_bits is None:
        e, m = _FLOAT_BITS[name]
        if qt is not None and mode in ("nearest", "sr"):
            r = "nearest" if mode == "nearest" else "stochastic"
            fns["qtorch"] = lambda: qt.quant.float_quantize(x, e, m, r)
        if pychop is not None and mode in _PYCHOP_MODES:
            chop = pychop.Chop(exp_bits=e, sig_bits=m, rmode=_PYCHOP_MODES[mode])
            fns["pychop"] = lambda: chop(x)
        if ml is not None and mode == "nearest" and name in _ML:
            xn, dt = x.numpy(), getattr(ml, _ML[name], None) or getattr(np, _ML[name])
            fns["ml_dtypes"] = lambda: xn.astype(dt).astype(np.float32)
        if gf is not None and mode in _GF_MODES and name in _GF:
            fi, rnd, xn = getattr(gf.formats, _GF[name]), getattr(gf.RoundMode, _GF_MODES[mode]), x.numpy()
            fns["gfloat"] = lambda: gf.round_ndarray(fi, xn, rnd)
    elif fam == "fixed" and name == "fixed(4,8)":
        if qt is not None:
            r = "nearest" if mode == "nearest" else "stochastic"
            fns["qtorch"] = lambda: qt.quant.fixed_point_quantize(x, 12, 8, rounding=r)
        if pychop is not None and mode in _PYCHOP_MODES:
            chopf = pychop.Chopf(ibits=4, fbits=8, rmode=_PYCHOP_MODES[mode])
            fns["pychop"] = lambda: chopf(x)
    elif fam == "posit":
        n, es = (int(v) for v in name[len("posit(") : -1].split(","))
        if qtp is not None and n <= 16 and mode == "nearest":  # nsize > 16 exits the process (PEERS.md)
            fns["qtorch_plus"] = lambda: qtp.quant.posit_quantize(x, n, es, 1.0, "nearest")
        conv = {(8, 0): "posit8", (16, 1): "posit16", (32, 2): "posit32"}.get((n, es))
        if sp is not None and conv is not None and mode == "nearest":
            fn, xl = getattr(sp, conv), x.tolist()
            fns["softposit"] = lambda: [float(fn(v)) for v in xl]
    elif fam == "table" and qtp is not None and mode == "nearest":
        lut = torch.from_numpy(case_format(name)[0].values()).float()
        fns["qtorch_plus"] = lambda: qtp.quant.configurable_table_quantize(x, lut, 1.0)
    elif fam == "block" and name == "mxfp8_e4m3" and mode == "nearest" and qt is not None:
        fns["qtorch"] = lambda: qt.quant.block_quantize(x, 8, -1, "nearest")  # its own rule (PEERS.md)
    return fns


def _entries(n: int, mods: dict[str, Any]) -> tuple[list[Entry], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * 4
    out = torch.empty_like(x)
    inner = max(1, (1 << 18) // n)  # a timing of about a millisecond or more at small sizes
    entries = [
        Entry("copy_", "floor", "copy_", lambda: out.copy_(x), inner),
        Entry("bf16 round trip", "floor", "bf16", lambda: x.to(torch.bfloat16).float(), inner),
    ]
    for label, fam, name, mode, rand_bits in CASES:
        fmt, overflow = case_format(name)
        seed = 1 if mode.startswith("sr") else None
        entries.append(Entry(label, fam, "anynum", lambda f=fmt, m=mode, o=overflow, s=seed, r=rand_bits:
                             an.quantize(x, f, m, overflow=o, seed=s, rand_bits=r, out=out),
                             inner))  # fmt: skip
        for peer, fn in _peer_fns(label, fam, name, mode, rand_bits, x, mods).items():
            entries.append(Entry(label, fam, peer, fn, inner))
    return entries, x


def run_benchmark(
    sizes: Sequence[int] = SIZES,
    repeats: int = 7,
    threads: int = 2,
    budget: float = 2.0,
    progress: Callable[[str], None] = print,
    peers: Sequence[str] = PEERS,
) -> dict[str, Any]:
    """Time every entry at every size; a JSON-ready dict of medians, minima and ratios to copy_.

    `peers`: the peers to time (those installed); `budget`: seconds a peer's cell may take.

    >>> result = run_benchmark([4096], repeats=1, peers=(), progress=lambda m: None)
    >>> row = next(r for r in result["rows"] if r["case"] == "e4m3fn nearest")
    >>> row["impl"], row["size"], row["x_copy"] > 0
    ('anynum', 4096, True)
    """
    # Pychop's global backend switch (set to "auto" when Pychop is imported): restored below
    chop_backend = os.environ.get("chop_backend", "auto")
    try:
        return _run(sizes, repeats, threads, budget, progress, peers)
    finally:
        if "chop_backend" in os.environ:
            os.environ["chop_backend"] = chop_backend


def _run(
    sizes: Sequence[int],
    repeats: int,
    threads: int,
    budget: float,
    progress: Callable[[str], None],
    peers: Sequence[str],
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    library()  # the steady state: a first build would otherwise run in the background (eager meanwhile)
    mods = {p: import_peer(p) if p in peers else None for p in PEERS}
    for p in ("qtorch", "qtorch_plus"):
        if mods[p] is not None:
            mods[p] = import_peer(f"{p}.quant") and mods[p]
    if mods["pychop"] is not None:
        mods["pychop"].backend("torch")  # its default NumPy+Dask path is about 50x slower
    if mods["gfloat"] is not None:
        mods["gfloat"] = import_peer("gfloat.formats") and mods["gfloat"]
    notes = [f"{p} not installed: its column is empty (pip install 'anynum[bench]')"
             for p in peers if p in PEERS and mods[p] is None]  # fmt: skip
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    rows: list[dict[str, Any]] = []
    last_cost: dict[tuple[str, str], tuple[int, float]] = {}  # (case, peer) -> (size, seconds per call)
    for n in sizes:
        entries, _ = _entries(n, mods)
        for e in entries:  # warm-up (first calls, caches, page faults), or skip past the budget
            key = (e.case, e.impl)
            if e.impl in PEERS and key in last_cost:
                prev_n, prev_s = last_cost[key]
                if prev_s * n / prev_n * (1 + repeats * e.inner) > budget:
                    e.skipped = f"skipped ({budget:g} s budget)"
                    continue
            t0 = time.perf_counter()
            try:
                e.fn()
            except Exception as exc:  # a peer that cannot do this case
                e.skipped = f"failed: {type(exc).__name__}"
                notes.append(f"{e.impl} on {e.case}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            spent = time.perf_counter() - t0
            last_cost[key] = (n, spent)
            if e.impl in PEERS and spent * repeats * e.inner > budget:
                e.skipped = f"skipped ({budget:g} s budget)"
        live = [e for e in entries if e.skipped is None]
        for r in range(repeats):
            random.Random(r).shuffle(live)
            for e in live:
                t0 = time.perf_counter()
                for _ in range(e.inner):
                    e.fn()
                e.times.append((time.perf_counter() - t0) / e.inner)
        copy = statistics.median(next(e for e in entries if e.impl == "copy_").times)
        bf16 = statistics.median(next(e for e in entries if e.impl == "bf16").times)
        for e in entries:
            med = statistics.median(e.times) if e.times else None
            rows.append({
                "size": n, "case": e.case, "family": e.family, "impl": e.impl, "skipped": e.skipped,
                "median_s": med, "min_s": min(e.times) if e.times else None,
                "melem_per_s": n / med / 1e6 if med else None,
                "x_copy": med / copy if med else None, "x_bf16": med / bf16 if med else None,
            })  # fmt: skip
        progress(f"size {n}: {len(live)} entries x {repeats} interleaved rounds")
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    meta = {
        "torch": torch.__version__, "anynum": an.__version__, "threads": threads, "repeats": repeats,
        "budget_s": budget, "cpu": cpu_description(), "compile": an.kernels.compile_mode(),
        "load_before": [round(v, 2) for v in load_before], "load_after": [round(v, 2) for v in load_after],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }  # fmt: skip
    return {"meta": meta, "notes": sorted(set(notes)), "rows": rows}


def _target(size: int, family: str, row: dict[str, Any]) -> str:
    """The issue's target for this cell, and whether the run met it."""
    if size == 1 << 22 and row["x_copy"] is not None:
        limit = 1.5 if family == "float" else 2.5
        return f"<={limit:g} copy {'ok' if row['x_copy'] <= limit else 'MISSED'}"
    if size == 1 << 16 and row["x_bf16"] is not None:
        return f"<=3 bf16 {'ok' if row['x_bf16'] <= 3 else 'MISSED'}"
    return ""


def main_table(result: dict[str, Any]) -> str:
    """One text table: per size and case, anynum's time as a multiple of copy_ and of the bf16 round
    trip, its throughput, the target, and each peer's time as a multiple of copy_.

    >>> result = run_benchmark([4096], repeats=1, peers=(), progress=lambda m: None)
    >>> print(main_table(result).splitlines()[1])
    times are medians as multiples of out.copy_(x) (and of x.to(bfloat16).float()) in the same run
    """
    meta = result["meta"]
    cpu = meta["cpu"]
    peers = [p for p in PEERS if any(r["impl"] == p for r in result["rows"])]
    head = f"{'size':>9} {'case':<26} {'x copy_':>8} {'x bf16':>7} {'Melem/s':>8} {'target':<18}"
    head += "".join(f" {p:>22}" for p in peers)
    lines = [
        f"CPU: {cpu['model']} ({cpu['cores']} cores; {cpu['flags']}); torch {meta['torch']}, "
        f"{meta['threads']} threads, ANYNUM_COMPILE={meta['compile']}, {meta['repeats']} interleaved "
        f"rounds, load {meta['load_before']} -> {meta['load_after']}, {meta['date']}",
        "times are medians as multiples of out.copy_(x) (and of x.to(bfloat16).float()) in the same run",
        head,
    ]
    by_key = {(r["size"], r["case"], r["impl"]): r for r in result["rows"]}
    for size in dict.fromkeys(r["size"] for r in result["rows"]):
        floor = by_key[(size, "copy_", "copy_")]
        bf16 = by_key[(size, "bf16 round trip", "bf16")]["x_copy"]
        lines.append(f"{size:>9} {'copy_ / bf16 round trip':<26} {1.0:>8.2f} "
                     f"{bf16:>7.2f} {floor['melem_per_s']:>8.0f}")  # fmt: skip
        for case, fam, *_ in CASES:
            r = by_key.get((size, case, "anynum"))
            if r is None or r["x_copy"] is None:
                continue
            line = f"{size:>9} {case:<26} {r['x_copy']:>8.2f} {r['x_bf16']:>7.2f} {r['melem_per_s']:>8.0f} "
            line += f"{_target(size, fam, r):<18}"
            for p in peers:
                pr = by_key.get((size, case, p))
                cell = "" if pr is None else (pr["skipped"] or f"{pr['x_copy']:.2f}")
                line += f" {cell:>22}"
            lines.append(line)
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
    """Write `result` (from `run_benchmark`) as indented JSON to `path`.

    >>> import json, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_json({"meta": {}, "notes": [], "rows": []}, f"{d}/bench.json")
    ...     json.load(open(f"{d}/bench.json"))["rows"]
    []
    """
    import json

    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)


def plot_throughput(result: dict[str, Any], path: str) -> None:
    """A PNG of throughput (Melem/s) against size: one panel per family, copy_ and bf16 as references.

    >>> import os, tempfile
    >>> result = run_benchmark([4096, 8192], repeats=1, peers=(), progress=lambda m: None)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot_throughput(result, f"{d}/throughput.png")
    ...     os.path.getsize(f"{d}/throughput.png") > 0
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = ("float", "fixed", "posit", "table", "block")
    fig, axes = plt.subplots(1, len(families), figsize=(4 * len(families), 4), sharey=True)
    rows = [r for r in result["rows"] if r["melem_per_s"]]
    for ax, fam in zip(axes, families):
        for case, impl, style in (("copy_", "copy_", "k-"), ("bf16 round trip", "bf16", "k--")):
            pts = [(r["size"], r["melem_per_s"]) for r in rows if r["case"] == case and r["impl"] == impl]
            ax.plot(*zip(*pts), style, lw=2, label=case)
        for case in dict.fromkeys(r["case"] for r in rows if r["family"] == fam and r["impl"] == "anynum"):
            pts = [(r["size"], r["melem_per_s"]) for r in rows if r["case"] == case and r["impl"] == "anynum"]
            ax.plot(*zip(*pts), "-o", ms=3, lw=1, label=case)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(fam)
        ax.set_xlabel("elements (float32)")
        ax.legend(fontsize=6)
    axes[0].set_ylabel("Melem/s (anynum.quantize, out=)")
    fig.suptitle(f"{result['meta']['cpu']['model']}, {result['meta']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- first calls --------------------------------------------------------------------------------

def bench_report(
    sizes: Sequence[int] = SIZES,
    repeats: int = 7,
    threads: int = 2,
    budget: float = 2.0,
    *,
    with_first_calls: bool = False,
    json_path: str | None = None,
    plot_path: str | None = None,
    progress: Callable[[str], None] = print,
    peers: Sequence[str] = PEERS,
) -> str:
    """``anynum bench``: run the benchmark, write its JSON and plot, return the text to print.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     text = bench_report([4096], 1, json_path=f"{d}/b.json", progress=lambda m: None, peers=())
    >>> text.splitlines()[-1].startswith("wrote ")
    True
    """
    result = run_benchmark(sizes, repeats, threads, budget, progress=progress, peers=peers)
    if with_first_calls:
        result["first_calls"] = first_calls(threads)
    text = [main_table(result)]
    if with_first_calls:
        text.append(first_calls_table(result["first_calls"]))
    written = []
    for path, write in ((json_path, write_json), (plot_path, plot_throughput)):
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            write(result, path)
            written.append(path)
    if written:
        text.append(f"wrote {' and '.join(written)}")
    return "\n".join(text)
