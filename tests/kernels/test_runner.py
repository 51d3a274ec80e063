"""The C library's parts on torch's own threads (pool.c's ``anynum_set_runner``, handed torch's
OpenMP team by the node library where torch's threads spin: `pairop.torch_threads_spin`).

Oracles: the eager reference for every result, on 1 and 2 threads, with the parts on torch's
threads and on the library's own pool; the threads that ran each part (recorded by the part
itself); and, in fresh processes, which of the two a process picks under each OpenMP wait policy
(read from the library: the runner it holds, the workers it started).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
import torch

import anynum as an
from anynum.kernels import nativelib, pairop
from anynum.kernels.clib import library
from anynum.rounding import Rounding

CASES = [
    (an.E4M3FN, Rounding.NEAREST_EVEN), (an.E4M3FN, Rounding.STOCHASTIC),
    (an.BF16, Rounding.STOCHASTIC_UNIFORM),
    (an.FixedPoint(4, 8), Rounding.TOWARD_ZERO), (an.Posit(8, 0), Rounding.NEAREST_EVEN),
    (an.Posit(16, 1), Rounding.STOCHASTIC), (an.Table.from_format(an.E2M1), Rounding.NEAREST_EVEN),
    (an.MXFP8_E4M3, Rounding.NEAREST_EVEN), (an.NVFP4, Rounding.STOCHASTIC),
]  # fmt: skip


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """torch's runner, from the built node library; the library's own choice restored afterwards."""
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    if nativelib.compiler("c++") is None:
        pytest.skip("no C++ compiler here: no node library, so the library's own pool runs every part")
    if not pairop.build_now():
        pytest.fail("a C++ compiler is here, but the node library did not build")
    lib = library()
    assert lib is not None
    before = lib.anynum_runner()
    yield int(torch.ops.anynum_native.runner())
    lib.anynum_set_runner(before)


_PART = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
_RUN_PARTS = ctypes.CFUNCTYPE(None, _PART, ctypes.c_void_p, ctypes.c_int)


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_torchs_threads_run_the_parts_side_by_side(runner: int, parts: int) -> None:
    """Each part once, on as many of torch's threads as there are parts (up to its 2): the
    runner built on ``at::parallel_for`` ran every part on the calling thread, as that header
    template does in a file compiled without -fopenmp, and so was never parallel."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        assert runner == 0  # no OpenMP team to hand over: the library keeps its own pool
        return
    assert runner != 0
    ran: list[tuple[int, int]] = []
    started = threading.Barrier(min(parts, 2), timeout=10)

    @_PART
    def part(ctx: int | None, p: int, count: int) -> None:
        assert count == parts
        ran.append((p, threading.get_native_id()))
        if p < 2:
            started.wait()  # parts 0 and 1 meet: two threads at once, or a timeout

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _RUN_PARTS(runner)(part, None, parts)
    finally:
        torch.set_num_threads(threads)
    assert sorted(p for p, _ in ran) == list(range(parts))
    assert len({tid for _, tid in ran}) == min(parts, 2)


def _values(n: int, seed: int) -> torch.Tensor:
    """n values over 24 binades, with zeros, infinities and NaNs sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 2.0 ** torch.randint(-12, 12, (n,), generator=g)
    x[:: 997] = 0.0
    x[1:: 1999] = float("inf")
    x[2:: 2999] = float("nan")
    return x


def _id(v: object) -> str:
    return v.display_name() if isinstance(v, an.Format) else str(getattr(v, "name", v))


@pytest.mark.parametrize("fmt,mode", CASES, ids=_id)
def test_parts_on_torchs_threads_are_the_reference(fmt: an.Format, mode: Rounding, runner: int, cn) -> None:  # type: ignore[no-untyped-def]
    lib = library()
    assert lib is not None
    x = _values(300_000 // 64 * 64, 11).reshape(-1, 64)  # rows of whole blocks for the block formats
    want = cn.reference(fmt, mode, fmt.default_overflow, None, x)
    before = torch.get_num_threads()
    try:
        for host in (runner, None):
            lib.anynum_set_runner(host)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got = cn.native(fmt, mode, fmt.default_overflow, None, x)
                where = "torch's threads" if host else "own pool"
                cn.assert_same(got, want, x, (fmt.display_name(), mode.name, where, threads))
    finally:
        torch.set_num_threads(before)


def test_a_group_on_torchs_threads_is_the_reference_over_its_concatenation(runner: int, cn) -> None:  # type: ignore[no-untyped-def]
    lib = library()
    assert lib is not None
    lib.anynum_set_runner(runner)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        group = [_values(n, n) for n in (70_000, 3, 140_000)]
        want = cn.reference(an.E5M2, Rounding.NEAREST_EVEN, an.E5M2.default_overflow, None, torch.cat(group))
        an.nn.Rounder(an.E5M2).round_each_into(group)
        cn.assert_same(torch.cat(group), want, want, "group on torch's threads")
    finally:
        torch.set_num_threads(before)


def _fresh_process(code: str, policy: str | None = None) -> list[str]:
    """What `code` prints in a fresh Python, on the C library (no compile), under OpenMP wait
    policy `policy` (None: unset, OpenMP's default)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(ANYNUM_COMPILE="auto", ANYNUM_COMPILE_MIN=str(1 << 30))  # the C library, not a compile
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    command = [sys.executable, "-W", "ignore", "-c", code]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


_PICK = textwrap.dedent(
    """
    import torch, anynum as an
    from anynum.kernels import pairop
    from anynum.kernels.clib import library
    assert pairop.build_now() and pairop.pair_op() is not None  # loaded and connected
    torch.set_num_threads(2)
    y = an.nn.Rounder(an.E4M3FN)(torch.randn(300_000))
    lib = library()
    print(int(bool(lib.anynum_runner())), lib.anynum_pool_workers())
    """
)


@pytest.mark.parametrize("policy", [None, "ACTIVE", "PASSIVE"])
def test_a_process_picks_torchs_threads_where_they_spin(policy: str | None) -> None:
    if nativelib.compiler("c++") is None:
        pytest.skip("no C++ compiler here: no node library, so the library's own pool runs every part")
    runner_held, workers = map(int, _fresh_process(_PICK, policy)[-2:])
    openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    if policy == "PASSIVE" or not openmp:
        assert (runner_held, workers) == (0, 1)  # the library's own pool: it started its worker
    else:
        assert (runner_held, workers) == (1, 0)  # torch's threads: no worker of its own


_FORKED = textwrap.dedent(
    """
    import os, numpy as np, torch, anynum as an
    from anynum.kernels import pairop
    from anynum.kernels.clib import library
    assert pairop.build_now() and pairop.pair_op() is not None
    torch.set_num_threads(2)
    r, x = an.nn.Rounder(an.E4M3FN), torch.randn(300_000)
    want = r(x)  # the parent's parts on the threads it chose
    pid = os.fork()
    if pid == 0:  # the child's parts: a pool of its own (the parent's OpenMP team is not here)
        # Compared in numpy: torch's own parallel ops hang in a child of a parent that ran an
        # OpenMP region (libgomp's team stays behind), which anynum's parts now do.
        os._exit(0 if np.array_equal(r(x).numpy(), want.numpy()) else 3)
    _, status = os.waitpid(pid, 0)
    print(int(bool(library().anynum_runner())), os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.parametrize("policy", [None, "PASSIVE"])
def test_a_forked_child_rounds_on_its_own_threads(policy: str | None) -> None:
    """After fork() the parent's threads are gone: the child's calls must neither hang nor differ."""
    if nativelib.compiler("c++") is None or not hasattr(os, "fork"):
        pytest.skip("needs the node library and fork()")
    assert _fresh_process(_FORKED, policy)[-1] == "0"  # the child's result was the parent's


_MANY_THREADS = textwrap.dedent(
    """
    import sys, torch, anynum as an
    from anynum.kernels import pairop
    from anynum.kernels.clib import library
    from anynum.kernels.eager import round_to_format
    from anynum.rounding import Rounding
    pairop.build_now() and pairop.pair_op()  # connected where the node library builds
    lib = library()
    torch.set_num_threads(100)  # more parts than the library keeps result slots for (64)
    x = torch.randn(100 * 32768 + 5)
    want = round_to_format(an.E4M3FN, x, Rounding.NEAREST_EVEN, "saturate", None, None)
    for host in {lib.anynum_runner(), None}:  # torch's threads where they were handed in, the pool
        lib.anynum_set_runner(host)
        got = an.nn.Rounder(an.E4M3FN)(x)
        print(int(torch.equal(got, want)))
    """
)


def test_more_threads_than_the_library_has_slots_for() -> None:
    """torch.set_num_threads(100) on a machine of any size: every part still fits the library's
    64 result slots (parts were capped only where its own pool started threads, and a 100-part
    call wrote past them), and every element is rounded."""
    printed = _fresh_process(_MANY_THREADS)
    assert set(printed) == {"1"}, printed
