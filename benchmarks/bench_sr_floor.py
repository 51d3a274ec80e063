"""The floor under stochastic rounding: what the counter hash alone costs, against copy_.

    python benchmarks/bench_sr_floor.py [--size 4194304] [--rounds 30] [--threads 2] [--cycles]
    python benchmarks/bench_sr_floor.py --families [--rounds 9]

Stochastic rounding draws each element's bits from `anynum.rounding.counter_bits` (two
SplitMix64 finaliser rounds of ``index ^ base``: four 64-bit multiplies per element, three
vector ones in ``counter_draws``, which takes the first from a table for consecutive indices),
so that results do not depend on the thread count, the call size or the path (C kernel,
compiled, eager). Issue 15 keeps that generator. This benchmark builds a kernel that
does only what any SR kernel with this generator must do: read x, draw the element's
bits (256 elements at a time with the library's own ``counter_draws``, csrc/common.c, as its
SR loops do), let one bit decide, write y; threaded by the library's own pool (csrc/pool.c)
in the same 64-element-aligned parts. Its time is a lower bound for every SR mode;
``out.copy_(x)`` and the pool's memcpy give the bandwidth line.

Every stochastic case of bench_quantize's table is timed beside it, with its format's
round-to-nearest twin. The estimate for a case is the floor plus what its family's rounding
adds to copy_ (nearest's time less copy_'s): an SR kernel must draw the bits and also find the
neighbours the draw chooses between. It is a model, not a bound (the two overlap in a kernel,
and finding both neighbours can cost more or less than rounding to the nearest one); "case /
estimate" says how far each kernel sits from it.

``--families`` splits each stochastic case's time, in core cycles per element on one thread with
the data in L2 (262,144 float32 elements, each call repeated so that the front door's few
microseconds drop out): its round-to-nearest twin, the case itself, and what the case takes
beyond the hash alone. Where the case is the hash plus its twin, drawing and deciding run on the
same vector ports one after the other; on two threads each core does half, so a 4M ratio to
copy_ is about the case's cycles over copy_'s at 4M (about 1 cycle an element a core here).

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
from anynum.experiments.bench import CASES, case_format
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
    for (int64_t i0 = b; i0 < e; i0 += 256) { /* the library's draws, as its SR loops take them */
        const int64_t m = e - i0 < 256 ? e - i0 : 256;
        uint64_t d[256];
        counter_draws(d, j->base, (uint64_t)i0, 1, m, 1);
        for (int64_t i = 0; i < m; i++) { /* one random bit flips the sign: the draw cannot be dropped */
            uint32_t u = f32_bits(j->x[i0 + i]) ^ ((uint32_t)d[i] << 31);
            j->y[i0 + i] = f32_from(u);
        }
    }
}

/* --cycles: what the hash costs in core cycles, and the instructions it is made of, alone */
uint64_t anynum_bench_clock(int64_t n) { /* dependent 64-bit multiplies: 3 cycles each on x86 cores */
    uint64_t z = 3;
    for (int64_t i = 0; i < n; i++) {
        z *= 0x9E3779B97F4A7C15ull;
        __asm__ volatile("" : "+r"(z));
    }
    return z;
}

uint64_t anynum_bench_hash_only(int64_t n, uint64_t base) { /* the compiler's loop, no memory traffic */
    uint64_t acc = 0;
    for (int64_t i = 0; i < n; i++) acc ^= counter_bits(base, (uint64_t)i, 64);
    return acc;
}

/* counter_draws, into L1 and back, on indices i * step: step 1 takes the first round from its table,
   any other step the four general chains */
uint64_t anynum_bench_draws_only(int64_t n, uint64_t base, uint64_t step, int32_t nbits) {
    uint64_t acc = 0, d[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        counter_draws(d, base, (uint64_t)i0 * step, step, 256, nbits);
        for (int k = 0; k < 256; k++) acc ^= d[k];
    }
    return acc;
}

#if defined(__AVX512F__)
typedef uint64_t lanes __attribute__((vector_size(64))); /* the vector width the hash loop uses */
#define KEEP(v) __asm__ volatile("" : "+v"(v)) /* in a register: the compiler can neither fold nor spill */
#else
typedef uint64_t lanes __attribute__((vector_size(32)));
#define KEEP(v) __asm__ volatile("" : "+x"(v))
#endif

/* op 0: 64-bit multiply, 1: shift, 2: xor; 16 independent chains, so that throughput, not the
   multiply's latency (15 cycles for vpmullq), sets the time */
uint64_t anynum_bench_lanes(int64_t rounds, int32_t op) {
    lanes c = (lanes){0} + 0x9E3779B97F4A7C15ull;
    lanes a0 = c + 1, a1 = c + 2, a2 = c + 3, a3 = c + 4, a4 = c + 5, a5 = c + 6, a6 = c + 7;
    lanes a7 = c + 8, b0 = c + 9, b1 = c + 10, b2 = c + 11, b3 = c + 12, b4 = c + 13, b5 = c + 14;
    lanes b6 = c + 15, b7 = c + 16;
#define STEP(a) do { a = op == 0 ? a * c : op == 1 ? a >> 7 : a ^ c; KEEP(a); } while (0)
    for (int64_t r = 0; r < rounds; r++) {
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5); STEP(a6); STEP(a7);
        STEP(b0); STEP(b1); STEP(b2); STEP(b3); STEP(b4); STEP(b5); STEP(b6); STEP(b7);
    }
#undef STEP
    lanes t = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7 ^ b0 ^ b1 ^ b2 ^ b3 ^ b4 ^ b5 ^ b6 ^ b7;
    return t[0];
}

int32_t anynum_bench_lane_count(void) { return (int32_t)(sizeof(lanes) / sizeof(uint64_t)); }

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
    lib.anynum_bench_clock.argtypes = [i64]
    lib.anynum_bench_hash_only.argtypes = [i64, ctypes.c_uint64]
    lib.anynum_bench_draws_only.argtypes = [i64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32]
    lib.anynum_bench_lanes.argtypes = [i64, ctypes.c_int32]
    lib.anynum_bench_lane_count.restype = ctypes.c_int32
    for f in (lib.anynum_bench_clock, lib.anynum_bench_hash_only, lib.anynum_bench_draws_only,
              lib.anynum_bench_lanes):
        f.restype = ctypes.c_uint64
    return lib


def _best(fn: Callable[[], object], rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """The best time of each function, timed in turn in every round (so a slow spell on a shared
    machine falls on all of them alike)."""
    for fn in fns.values():
        fn()  # builds, plans, pages
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def cycles(lib: ctypes.CDLL, size: int, rounds: int) -> None:
    """One thread: the core clock, then each part of the hash in cycles per element.

    The clock is a chain of dependent 64-bit multiplies (3 cycles each on current x86 cores).
    Per element the hash (`counter_bits` in csrc/common.c, vectorised by the compiler) is 4
    multiplies, 6 shifts and 7 xors on 64-bit lanes, 8 lanes to a 512-bit vector (4 to a
    256-bit one without AVX-512); `counter_draws` on consecutive indices is 3 multiplies, 5
    shifts, 6 xors and an add (the first round from a table). Timing each instruction kind
    alone, over independent chains, gives its throughput here.
    """
    torch.set_num_threads(1)
    n_clock = 20_000_000
    ghz = 3 * n_clock / _best(lambda: lib.anynum_bench_clock(n_clock), rounds) / 1e9
    x = torch.randn(size)
    out = torch.empty_like(x)
    parts: dict[str, Callable[[], object]] = {
        "out.copy_(x)": lambda: out.copy_(x),
        "floor (read x, hash, write y)": lambda: lib.anynum_bench_floor(
            x.data_ptr(), out.data_ptr(), size, 12345, 1, 1
        ),
        "hash alone, the compiler's loop over counter_bits": lambda: lib.anynum_bench_hash_only(size, 12345),
        "hash alone, counter_draws, consecutive indices (the first round from a table)": (
            lambda: lib.anynum_bench_draws_only(size, 12345, 1, 64)
        ),
        "hash alone, counter_draws, every third index (four general chains)": (
            lambda: lib.anynum_bench_draws_only(size, 12345, 3, 64)
        ),
    }
    per = {name: t / size for name, t in _interleaved(parts, rounds).items()}
    lanes = lib.anynum_bench_lane_count()
    rounds_lanes = 1_000_000
    ops = rounds_lanes * 16  # 16 chains a round
    kind = {name: _best(lambda op=op: lib.anynum_bench_lanes(rounds_lanes, op), rounds) / ops * ghz * 1e9
            for op, name in enumerate(("multiply", "shift", "xor"))}  # fmt: skip
    print(f"one thread, core clock {ghz:.2f} GHz (dependent 64-bit multiplies, 3 cycles each)")
    print("| part | cycles per element |\n|---|---|")
    for name, t in per.items():
        print(f"| {name} | {t * ghz * 1e9:.2f} |")
    sum_ops = (4 * kind["multiply"] + 6 * kind["shift"] + 7 * kind["xor"]) / lanes
    print(f"| 4 multiplies + 6 shifts + 7 xors, each kind alone, {lanes} lanes a vector | {sum_ops:.2f} |")
    table_ops = (3 * kind["multiply"] + 5 * kind["shift"] + 7 * kind["xor"]) / lanes  # an add as an xor
    print(f"| 3 multiplies + 5 shifts + 6 xors + an add, the same way | {table_ops:.2f} |")
    alone = ", ".join(f"{k} {v:.2f}" for k, v in kind.items())
    print(f"cycles per {lanes}-lane vector instruction, alone: {alone}")


def _stochastic_cases(
    x: torch.Tensor, out: torch.Tensor
) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Every stochastic case of bench_quantize's table and its round-to-nearest twin, as calls that
    round x into out; and each case's twin by label."""
    cases: dict[str, Callable[[], object]] = {}
    twins: dict[str, str] = {}
    for label, _family, name, mode, rand_bits in CASES:
        if not mode.startswith("sr"):
            continue
        fmt, overflow = case_format(name)
        cases[label] = lambda f=fmt, m=mode, o=overflow, r=rand_bits: an.quantize(
            x, f, m, overflow=o, seed=1, rand_bits=r, out=out
        )
        twins[label] = f"{name} nearest"
        cases.setdefault(twins[label], lambda f=fmt, o=overflow: an.quantize(x, f, overflow=o, out=out))
    return cases, twins


def families(lib: ctypes.CDLL, rounds: int, size: int = 262_144) -> None:
    """One thread, data in L2: each stochastic case, its nearest twin and the hash, in cycles."""
    torch.set_num_threads(1)
    n_clock = 20_000_000
    ghz = 3 * n_clock / _best(lambda: lib.anynum_bench_clock(n_clock), rounds) / 1e9
    x = torch.randn(size) * 4
    out = torch.empty_like(x)
    reps = 8  # calls a timing: the front door's microseconds are a few hundredths of a cycle each

    def repeated(fn: Callable[[], object]) -> Callable[[], object]:
        return lambda: [fn() for _ in range(reps)]

    parts: dict[str, Callable[[], object]] = {
        "out.copy_(x)": repeated(lambda: out.copy_(x)),
        # 31 bits, as the float32 SR loops draw (at most 31 bits skip the hash's last step)
        "hash": repeated(lambda: lib.anynum_bench_draws_only(size, 12345, 1, 31)),
    }
    cases, twins = _stochastic_cases(x, out)
    parts.update({label: repeated(fn) for label, fn in cases.items()})
    cyc = {k: t / reps / size * ghz * 1e9 for k, t in _interleaved(parts, rounds).items()}
    print(f"one thread, {size} float32 elements (in L2), core clock {ghz:.2f} GHz, cycles per element; "
          f"out.copy_(x) {cyc['out.copy_(x)']:.2f}, "
          f"the hash alone (counter_draws, 31 bits) {cyc['hash']:.2f}")
    print("| stochastic case | nearest twin | case | case - hash | (case - hash) / twin |")
    print("|---|---|---|---|---|")
    for label, twin in twins.items():
        rest = cyc[label] - cyc["hash"]
        print(f"| {label} | {cyc[twin]:.2f} | {cyc[label]:.2f} | {rest:.2f} | {rest / cyc[twin]:.2f} |")


def main() -> None:
    library()  # steady state: a first build would otherwise run in the background (eager meanwhile)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cycles", action="store_true", help="one thread: the hash in core cycles, by part")
    ap.add_argument("--families", action="store_true", help="one thread, in L2: each SR case in cycles")
    args = ap.parse_args()
    lib = _library()
    if args.cycles:
        cycles(lib, args.size, args.rounds)
        return
    if args.families:
        families(lib, args.rounds)
        return
    torch.set_num_threads(args.threads)
    x = torch.randn(args.size) * 4  # as bench_quantize's inputs
    out = torch.empty_like(x)
    xp, yp, n = x.data_ptr(), out.data_ptr(), x.numel()
    cases: dict[str, Callable[[], object]] = {
        "out.copy_(x)": lambda: out.copy_(x),
        "pool memcpy": lambda: lib.anynum_bench_floor(xp, yp, n, 0, 0, args.threads),
        "floor": lambda: lib.anynum_bench_floor(xp, yp, n, 12345, 1, args.threads),
    }
    sr_cases, twins = _stochastic_cases(x, out)
    cases.update(sr_cases)
    best = _interleaved(cases, args.rounds)
    copy, floor = best["out.copy_(x)"], best["floor"]
    print(f"{args.size} float32 elements (randn * 4), {args.threads} threads, "
          f"minimum of {args.rounds} rounds")
    print(f"out.copy_(x) {copy * 1e3:.3f} ms; pool memcpy {best['pool memcpy'] / copy:.2f}x copy_; "
          f"floor (read x, counter bits, one select, write y) {floor / copy:.2f}x copy_")
    print("| stochastic case | ms | x copy_ | x floor | nearest, x copy_ | estimate, x copy_ "
          "| case / estimate |")
    print("|---|---|---|---|---|---|---|")
    for label, twin in twins.items():
        t, near = best[label], best[twin]
        estimate = floor + (near - copy)  # the floor, plus what rounding adds to copy_ in this family
        print(f"| {label} | {t * 1e3:.3f} | {t / copy:.2f} | {t / floor:.2f} | {near / copy:.2f} | "
              f"{estimate / copy:.2f} | {t / estimate:.2f} |")

if __name__ == "__main__":
    main()
