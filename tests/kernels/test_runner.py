"""The C library's parts on torch's own OpenMP team (pool.c's ``anynum_use_torch_team``, chosen
where torch's threads spin: `anynum.kernels.clib.torch_threads_spin`) or on its own pool.

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
from anynum.kernels.clib import library
from anynum.rounding import Rounding

#: Where torch's team can be had: a torch with OpenMP, and ELF weak references to reach it.
TEAM_HERE = sys.platform.startswith("linux") and "backend: OpenMP" in torch.__config__.parallel_info()

CASES = [
    (an.E4M3FN, Rounding.NEAREST_EVEN), (an.E4M3FN, Rounding.STOCHASTIC),
    (an.BF16, Rounding.STOCHASTIC_UNIFORM),
    (an.FixedPoint(4, 8), Rounding.TOWARD_ZERO), (an.Posit(8, 0), Rounding.NEAREST_EVEN),
    (an.Posit(16, 1), Rounding.STOCHASTIC), (an.Table.from_format(an.E2M1), Rounding.NEAREST_EVEN),
    (an.MXFP8_E4M3, Rounding.NEAREST_EVEN), (an.NVFP4, Rounding.STOCHASTIC),
]  # fmt: skip


@pytest.fixture
def team(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Whether torch's team took the library's jobs when asked; the library's choice restored after."""
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    lib = library()
    assert lib is not None, "the C library did not build (a C compiler is part of every test machine)"
    before = lib.anynum_torch_team()
    got = lib.anynum_use_torch_team(1)
    assert got == int(TEAM_HERE)
    yield got
    lib.anynum_use_torch_team(before)


_PART = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)


@pytest.mark.parametrize("parts", [1, 2, 5])
@pytest.mark.parametrize("on_team", [1, 0], ids=["torch's team", "own pool"])
def test_the_parts_run_side_by_side(team: int, on_team: int, parts: int) -> None:
    """Each part once, on as many threads as there are parts (on torch's team, up to its 2), on
    either pool. A first version of the team, on ``at::parallel_for`` in the node library, ran
    every part on the calling thread (that header template does, compiled without -fopenmp)."""
    lib = library()
    assert lib is not None
    assert lib.anynum_use_torch_team(on_team) == (on_team and team)
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
        lib.anynum_run_parts(ctypes.cast(part, ctypes.c_void_p), None, parts)
    finally:
        torch.set_num_threads(threads)
    assert sorted(p for p, _ in ran) == list(range(parts))
    # torch's team is its 2 threads; the library's pool has a worker for each part it is given
    # (its callers give it at most torch's thread count)
    assert len({tid for _, tid in ran}) == (min(parts, 2) if on_team and team else parts)


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
def test_parts_on_torchs_threads_are_the_reference(fmt: an.Format, mode: Rounding, team: int, cn) -> None:  # type: ignore[no-untyped-def]
    lib = library()
    assert lib is not None
    x = _values(300_000 // 64 * 64, 11).reshape(-1, 64)  # rows of whole blocks for the block formats
    want = cn.reference(fmt, mode, fmt.default_overflow, None, x)
    before = torch.get_num_threads()
    try:
        for on_team in (1, 0):
            lib.anynum_use_torch_team(on_team)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got = cn.native(fmt, mode, fmt.default_overflow, None, x)
                where = "torch's team" if on_team and team else "own pool"
                cn.assert_same(got, want, x, (fmt.display_name(), mode.name, where, threads))
    finally:
        torch.set_num_threads(before)


def test_a_group_on_torchs_threads_is_the_reference_over_its_concatenation(team: int, cn) -> None:  # type: ignore[no-untyped-def]
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
    from anynum.kernels.clib import library
    lib = library()
    torch.set_num_threads(2)
    y = an.nn.Rounder(an.E4M3FN)(torch.randn(300_000))
    print(lib.anynum_torch_team(), lib.anynum_pool_workers())
    """
)


@pytest.mark.parametrize("policy", [None, "ACTIVE", "PASSIVE"])
def test_a_process_picks_torchs_threads_where_they_spin(policy: str | None) -> None:
    on_team, workers = map(int, _fresh_process(_PICK, policy)[-2:])
    if policy == "PASSIVE" or not TEAM_HERE:
        assert (on_team, workers) == (0, 1)  # the library's own pool: it started its worker
    else:
        assert (on_team, workers) == (1, 0)  # torch's team: no worker of its own


_FORKED = textwrap.dedent(
    """
    import os, numpy as np, torch, anynum as an
    from anynum.kernels.clib import library
    torch.set_num_threads(2)
    r, x = an.nn.Rounder(an.E4M3FN), torch.randn(300_000)
    want = r(x)  # the parent's parts on the threads it chose
    pid = os.fork()
    if pid == 0:  # the child's parts: a pool of its own (the parent's OpenMP team is not here)
        # Compared in numpy: torch's own parallel ops hang in a child of a parent that ran an
        # OpenMP region (libgomp's team stays behind), which anynum's parts now do.
        os._exit(0 if np.array_equal(r(x).numpy(), want.numpy()) else 3)
    _, status = os.waitpid(pid, 0)
    print(library().anynum_torch_team(), os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.parametrize("policy", [None, "PASSIVE"])
def test_a_forked_child_rounds_on_its_own_threads(policy: str | None) -> None:
    """After fork() the parent's threads are gone: the child's calls must neither hang nor differ."""
    on_team, child = _fresh_process(_FORKED, policy)[-2:]
    assert child == "0"  # the child's result was the parent's
    assert on_team == str(int(TEAM_HERE and policy is None))


_MANY_THREADS = textwrap.dedent(
    """
    import sys, torch, anynum as an
    from anynum.kernels.clib import library
    from anynum.kernels.eager import round_to_format
    from anynum.rounding import Rounding
    lib = library()
    torch.set_num_threads(100)  # more parts than the library keeps result slots for (64)
    x = torch.randn(100 * 32768 + 5)
    want = round_to_format(an.E4M3FN, x, Rounding.NEAREST_EVEN, "saturate", None, None)
    for on_team in (1, 0):  # torch's team where it can be had, then the library's pool
        lib.anynum_use_torch_team(on_team)
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
