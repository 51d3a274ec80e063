"""Which engine runs MC matrix products: decided once per process from what is fast here.

Both default engines are exact to the same proven bound (`anynum.mc.linalg`); they differ in
which GEMM does the work:

* ``"int8"`` (`anynum.mc.ozaki_int8`): 7-bit digits, ``torch._int_mm``.  For float32
  components and nc = 2 an MC x MC product takes 93 int8 digit-pair GEMMs of the problem's
  size (66 for MC x tensor).
* ``"float"`` (`anynum.mc.ozaki_float`): one exact float64 slice GEMM plus one float64 tail
  GEMM of twice the inner dimension, 3 float64 GEMMs' worth of work.

So int8 wins where an int8 GEMM is more than 93 / 3 = 31 times faster than a float64 GEMM of
the same size: CPUs with AMX; with AVX-512 VNNI an int8 GEMM is
about 8 times faster than float64 (measured on an AMD EPYC, torch 2.13), without VNNI about
as fast or slower, and there the float engine wins.  On a GPU the 93 GEMMs are launch-bound
at common sizes (an H200 ran the int8 engine at 76x and the float engine at 25x the float64
matmul, 1024^3).  So on the CPU and on CUDA alike a probe times a 256 x 256 x 256 int8 and
float64 GEMM once per process and device type, on the first MC matrix product (never at
import), and compares them with that factor.

Forcing (Resolution 10): ``engine=`` of `anynum.mc.matmul` first, then
:func:`set_matmul_engine`, then the environment variable ``ANYNUM_MC_MATMUL`` (``int8``,
``float``, ``native``, ``wide`` or ``auto``), then the probe.  :func:`report` says what was
chosen and why (the benchmark prints it with the CPU flags).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from anynum.errors import AnynumError

__all__ = ["ENGINES", "ENV", "INT8_ADVANTAGE", "Decision", "cpu_flags", "decide", "probe",
           "report", "resolve", "set_matmul_engine", "setting"]

ENGINES = ("auto", "int8", "float", "native", "wide")
ENV = "ANYNUM_MC_MATMUL"
INT8_ADVANTAGE = 31.0  # int8 digit-pair GEMMs / float64 GEMMs, float32 components, nc = 2, MC x MC
_PROBE_N = 256
_SETTING = ["auto"]
_DECIDED: dict[str, Decision] = {}


@dataclass(frozen=True)
class Decision:
    """The engine chosen for a device type, why, and the probe's timings (ms) if it ran."""

    engine: str
    reason: str
    int8_ms: float | None = None
    float64_ms: float | None = None


def _check(engine: str, where: str) -> str:
    if engine not in ENGINES:
        raise AnynumError(
            f"{where} must be one of {', '.join(ENGINES)}; got {engine!r}. "
            "Use 'auto' to let anynum choose by what is fast on this machine."
        )
    return engine


def set_matmul_engine(engine: str) -> None:
    """Choose the engine of MC matrix products for this process.

    ``"auto"`` (default): by what is fast here (module doc); ``"int8"``: exact int8 x int8 ->
    int32 digit GEMMs (``torch._int_mm``); ``"float"``: exact float64 slice GEMMs plus one
    float64 tail GEMM; ``"native"``: classic Ozaki slices in the component dtype, nothing
    wider; ``"wide"``: classic slices in float32 for float16/bfloat16 components and float64
    for float32 components.  Overrides ``ANYNUM_MC_MATMUL``; ``engine=`` of `anynum.mc.matmul`
    overrides both.

    >>> from anynum import mc
    >>> mc.set_matmul_engine("float"); mc.set_matmul_engine("auto")
    """
    _SETTING[0] = _check(engine, "the matmul engine")


def setting() -> str:
    """The engine set by :func:`set_matmul_engine`, else by ``ANYNUM_MC_MATMUL``, else "auto".

    >>> from anynum.mc import engine
    >>> engine.setting() in engine.ENGINES
    True
    """
    if _SETTING[0] != "auto":
        return _SETTING[0]
    env = os.environ.get(ENV, "").strip().lower()
    return _check(env, f"the environment variable {ENV}") if env else "auto"


def resolve(engine: str | None, device: torch.device) -> str:
    """The concrete engine (int8, float, native or wide) for an `engine=` argument and device.

    >>> import torch
    >>> from anynum.mc import engine
    >>> engine.resolve("wide", torch.device("cpu"))
    'wide'
    """
    chosen = _check(engine, "engine") if engine is not None else "auto"
    if chosen == "auto":
        chosen = setting()
    if chosen == "auto":
        chosen = decide(device).engine
    return chosen


def probe(device: torch.device) -> tuple[float, float]:
    """Seconds for one 256 x 256 x 256 int8 GEMM (``torch._int_mm``) and one float64 GEMM.

    The best of a few runs each, after a warm-up, at the current thread count.

    >>> import torch
    >>> from anynum.mc import engine
    >>> t_int8, t_f64 = engine.probe(torch.device("cpu"))
    >>> t_int8 > 0 and t_f64 > 0
    True
    """
    g = torch.Generator(device=device).manual_seed(0)
    n = _PROBE_N
    a8 = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device, generator=g)
    b8 = torch.randint(-127, 128, (n, n), dtype=torch.int8, device=device, generator=g)
    a64, b64 = a8.to(torch.float64), b8.to(torch.float64)

    def best(fn: object) -> float:
        times = []
        for _ in range(6):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times[1:])  # the first run warms up

    return best(lambda: torch._int_mm(a8, b8)), best(lambda: a64 @ b64)


def decide(device: torch.device) -> Decision:
    """The automatic choice for `device`'s type, made once per process (see the module doc).

    >>> import torch
    >>> from anynum.mc import engine
    >>> engine.decide(torch.device("cpu")).engine in ("int8", "float")
    True
    """
    key = device.type
    if key not in _DECIDED:
        _DECIDED[key] = _decide(device)
    return _DECIDED[key]


def _decide(device: torch.device) -> Decision:
    # CUDA is probed like the CPU: on an H200 (torch 2.11) the int8 engine ran 76x and the
    # float engine 25x the float64 matmul at 1024^3, so int8 tensor cores alone do not decide it
    if device.type not in ("cpu", "cuda"):
        return Decision("native", f"{device.type}: no int8 or float64 GEMM assumed")
    try:
        t_int8, t_f64 = probe(device)
    except RuntimeError as exc:  # no int8 GEMM here
        return Decision("float", f"torch._int_mm unavailable ({exc})")
    ratio = t_f64 / t_int8 if t_int8 > 0 else float("inf")
    engine = "int8" if ratio > INT8_ADVANTAGE else "float"
    reason = (f"probe: int8 GEMM {ratio:.1f}x faster than float64 GEMM "
              f"({'>' if engine == 'int8' else '<='} {INT8_ADVANTAGE:g}x needed for int8)")
    return Decision(engine, reason, t_int8 * 1e3, t_f64 * 1e3)


def cpu_flags() -> list[str]:
    """The CPU's SIMD features that matter for the choice (Linux /proc/cpuinfo; [] elsewhere).

    >>> from anynum.mc import engine
    >>> isinstance(engine.cpu_flags(), list)
    True
    """
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
              "amx_bf16", "asimd", "i8mm", "sve")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def report(device: torch.device | None = None) -> dict[str, object]:
    """What runs MC matrix products here: setting, engine, reason, probe timings, CPU flags.

    >>> from anynum.mc import engine
    >>> sorted(engine.report())
    ['cpu_flags', 'engine', 'float64_ms', 'int8_ms', 'reason', 'setting']
    """
    device = device or torch.device("cpu")
    chosen = setting()
    d = decide(device)
    engine = d.engine if chosen == "auto" else chosen
    how = "set_matmul_engine" if _SETTING[0] != "auto" else ENV
    reason = d.reason if chosen == "auto" else f"forced ({how})"
    return {"setting": chosen, "engine": engine, "reason": reason, "int8_ms": d.int8_ms,
            "float64_ms": d.float64_ms, "cpu_flags": cpu_flags()}
