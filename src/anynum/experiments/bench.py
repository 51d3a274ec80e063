# mypy: disable-error-code="misc"
# (the lambdas bind loop variables as default arguments, which mypy cannot type)
"""Quantization speed against native casts, the memory-bandwidth floor and every installed peer.

One run measures everything with interleaved repetitions (each round times
every case once, in a shuffled order) and reports medians, so machine noise
hits all cases alike. Results are ratios: against the bf16 round trip
``x.to(torch.bfloat16).float()`` and against the best peer for the same
format and mode. Peers that are not installed are skipped with a note.

Run ``python benchmarks/bench_quantize.py`` or ``anynum bench``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import anynum as an

__all__ = ["Case", "build_cases", "main_table", "run_benchmark"]


@dataclasses.dataclass
class Case:
    """One timed operation: `group` names what it computes (peers of one group compete)."""

    group: str
    impl: str
    fn: Callable[[], Any]
    kind: str = "peer"  # "anynum" | "peer" | "native" | "floor"
    times: list[float] = dataclasses.field(default_factory=list)


def _optional(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _torch_pychop() -> Any | None:
    """Pychop on its torch backend (its default NumPy+Dask path is about 50x slower)."""
    pychop = _optional("pychop")
    if pychop is not None:
        pychop.backend("torch")
    return pychop


def _float_cases(x: torch.Tensor, out: torch.Tensor, notes: list[str]) -> list[Case]:
    cases: list[Case] = []
    xn = x.numpy()
    qtorch_quant = _optional("qtorch.quant")
    pychop = _torch_pychop()
    if pychop is not None and not hasattr(pychop, "LightChop"):
        version = getattr(pychop, "__version__", "?")
        notes.append(f"pychop {version}: Chop is the class the Pychop paper calls LightChop")
    ml_dtypes = _optional("ml_dtypes")
    outn = np.empty_like(xn)
    gfloat = _optional("gfloat")
    gf_formats = _optional("gfloat.formats")
    formats = {
        "e4m3fn": (an.E4M3FN, 4, 3, "float8_e4m3fn", "format_info_ocp_e4m3", torch.float8_e4m3fn),
        "e5m2": (an.E5M2, 5, 2, "float8_e5m2", "format_info_ocp_e5m2", torch.float8_e5m2),
        "fp16": (an.FP16, 5, 10, None, "format_info_binary16", torch.float16),
        "bf16": (an.BF16, 8, 7, "bfloat16", "format_info_bfloat16", torch.bfloat16),
        "e6m9": (an.FloatFormat(6, 9), 6, 9, None, None, None),
    }
    for name, (fmt, e, m, ml_name, gf_name, tdtype) in formats.items():
        for mode in ("nearest", "sr"):
            group = f"{name} {mode}"
            if mode == "nearest":
                cases.append(Case(group, "anynum", lambda f=fmt: an.quantize(x, f, out=out), "anynum"))
            else:
                cases.append(
                    Case(group, "anynum", lambda f=fmt: an.quantize(x, f, "sr", seed=1, out=out), "anynum")
                )
            if mode == "nearest" and tdtype is not None:
                cases.append(Case(group, "torch cast", lambda d=tdtype: x.to(d).float(), "native"))
            if qtorch_quant is not None:
                rounding = "nearest" if mode == "nearest" else "stochastic"
                cases.append(
                    Case(
                        group,
                        "qtorch float_quantize",
                        lambda e=e, m=m, r=rounding: qtorch_quant.float_quantize(x, e, m, r),
                    )
                )
            if pychop is not None:
                rmode = 1 if mode == "nearest" else 5
                try:
                    chop = pychop.Chop(exp_bits=e, sig_bits=m, rmode=rmode)
                    cases.append(Case(group, "pychop Chop", lambda c=chop: c(x)))
                except Exception as exc:
                    notes.append(f"pychop Chop({e},{m}) unavailable: {exc}")
            if mode == "nearest" and ml_dtypes is not None and ml_name is not None:
                mdt = getattr(ml_dtypes, ml_name)
                cases.append(Case(group, "ml_dtypes astype", lambda d=mdt: xn.astype(d).astype(np.float32)))
                cases.append(
                    Case(group, "anynum (numpy)", lambda f=fmt: an.quantize(xn, f, out=outn), "anynum")
                )
            if gfloat is not None and gf_formats is not None and gf_name is not None:
                fi = getattr(gf_formats, gf_name)
                if mode == "nearest":
                    cases.append(
                        Case(group, "gfloat round_ndarray", lambda fi=fi: gfloat.round_ndarray(fi, xn))
                    )
    return cases


def _other_cases(x: torch.Tensor, out: torch.Tensor, notes: list[str]) -> list[Case]:
    cases: list[Case] = []
    qtorch_quant = _optional("qtorch.quant")
    pychop = _torch_pychop()
    softposit = _optional("softposit")
    fx = an.FixedPoint(4, 8)
    cases.append(Case("fixed(4,8) nearest", "anynum", lambda: an.quantize(x, fx, out=out), "anynum"))
    if qtorch_quant is not None:
        cases.append(
            Case(
                "fixed(4,8) nearest",
                "qtorch fixed_point_quantize",
                lambda: qtorch_quant.fixed_point_quantize(x, 12, 8, rounding="nearest"),
            )
        )
    if pychop is not None and hasattr(pychop, "Chopf"):
        try:
            chopf = pychop.Chopf(ibits=4, fbits=8, rmode=1)
            cases.append(Case("fixed(4,8) nearest", "pychop Chopf", lambda: chopf(x)))
        except Exception as exc:
            notes.append(f"pychop Chopf unavailable: {exc}")
    # The three posits, plus SoftPosit's posit8 (es=0); SoftPosit itself costs about
    # 3 us per element, so it runs at small sizes only.
    softposit_types = {(8, 0): "posit8", (16, 1): "posit16", (32, 2): "posit32"}
    for n_bits, es in ((8, 2), (16, 1), (32, 2), (8, 0)):
        group = f"posit({n_bits},{es}) nearest"
        posit_fmt = an.Posit(n_bits, es)
        cases.append(Case(group, "anynum", lambda f=posit_fmt: an.quantize(x, f, out=out), "anynum"))
        if softposit is not None and x.numel() <= 1 << 16 and (n_bits, es) in softposit_types:
            conv = getattr(softposit, softposit_types[n_bits, es])
            xl = x.tolist()
            cases.append(Case(group, "softposit", lambda c=conv, xl=xl: [float(c(v)) for v in xl]))
    for block in ("MXFP8_E4M3", "MXFP4_E2M1"):
        fmt = getattr(an, block, None)
        if fmt is not None:
            cases.append(
                Case(f"{block.lower()} nearest", "anynum", lambda f=fmt: an.quantize(x, f), "anynum")
            )
    if qtorch_quant is not None:
        cases.append(
            Case("block(8) nearest", "qtorch block_quantize", lambda: qtorch_quant.block_quantize(x, 8, -1))
        )
    return cases


def build_cases(n: int, notes: list[str]) -> list[Case]:
    """Every case at size `n` (float32 input)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * 4
    out = torch.empty_like(x)
    cases = [
        Case("floor", "copy_", lambda: out.copy_(x), "floor"),
        Case("bf16 round trip", "torch cast", lambda: x.to(torch.bfloat16).float(), "native"),
    ]
    cases += _float_cases(x, out, notes)
    cases += _other_cases(x, out, notes)
    return cases


def run_benchmark(
    sizes: Sequence[int] = (1 << 16, 1 << 20, 1 << 22, 1 << 24),
    repeats: int = 7,
    threads: int = 2,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Time every case at every size; returns a JSON-ready dict with medians and ratios."""
    torch.set_num_threads(threads)
    notes: list[str] = []
    for peer in ("qtorch", "pychop", "ml_dtypes", "gfloat", "softposit"):
        if _optional(peer) is None:
            notes.append(f"{peer} not installed: skipped (pip install 'anynum[bench]')")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        cases = build_cases(n, notes)
        for case in cases:  # warm-up: compiles, caches, page faults
            try:
                case.fn()
            except Exception as exc:
                notes.append(f"{case.impl} on {case.group} failed: {type(exc).__name__}: {exc}")
                case.times = [float("nan")]
        live = [c for c in cases if not c.times]
        for r in range(repeats):
            random.Random(r).shuffle(live)
            for case in live:
                t0 = time.perf_counter()
                case.fn()
                case.times.append(time.perf_counter() - t0)
        progress(f"size {n}: timed {len(live)} cases x {repeats} rounds")
        base = statistics.median(next(c for c in cases if c.group == "bf16 round trip").times)
        for group in dict.fromkeys(c.group for c in cases):
            members = [c for c in cases if c.group == group]
            peers = [
                statistics.median(c.times) for c in members if c.kind == "peer" and c.times[0] == c.times[0]
            ]
            best_peer = min(peers) if peers else None
            for c in members:
                med = statistics.median(c.times)
                rows.append(
                    {
                        "size": n,
                        "group": group,
                        "impl": c.impl,
                        "kind": c.kind,
                        "median_s": med,
                        "melem_per_s": n / med / 1e6 if med == med else None,
                        "vs_bf16": med / base,
                        "vs_best_peer": (med / best_peer) if best_peer else None,
                    }
                )
    return {
        "meta": {
            "torch": torch.__version__,
            "anynum": an.__version__,
            "threads": threads,
            "repeats": repeats,
            "machine": platform.machine(),
            "processor": platform.processor(),
            "compile": an.kernels.compile_mode(),
        },
        "notes": sorted(set(notes)),
        "rows": rows,
    }


def main_table(result: dict[str, Any]) -> str:
    """A plain-text table: throughput, time relative to the bf16 round trip and to the best peer."""
    lines = [f"{'size':>9} {'group':<22} {'impl':<28} {'Melem/s':>9} {'x bf16':>8} {'x best peer':>11}"]
    for r in result["rows"]:
        peer = "" if r["vs_best_peer"] is None else f"{r['vs_best_peer']:.3f}"
        mel = "failed" if r["melem_per_s"] is None else f"{r['melem_per_s']:.0f}"
        lines.append(
            f"{r['size']:>9} {r['group']:<22} {r['impl']:<28} {mel:>9} {r['vs_bf16']:>8.2f} {peer:>11}"
        )
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2)
