"""Native code is loaded only from a private, verified cache (issue 21, DESIGN.md section 6).

The attack these tests replay: another local user prepares the directory anynum
caches its C kernels in (world-writable, or their own) and plants a shared library
under the predictable name, with a constructor that runs at load time and a kernel
that returns garbage, plus a manifest whose hash matches the planted bytes. Before
the fix, the victim's `an.quantize` ran the constructor and returned garbage.

Each scenario runs in a fresh interpreter (the loaded library is per process).
Where the tests run as root they hand directories to another uid for real;
otherwise ownership is faked at the os.stat level (the checks read it there).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pkgutil
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import anynum
from anynum.kernels import nativelib, nativesoon
from anynum.kernels.nativelib import NativeSource

pytestmark = pytest.mark.skipif(
    not hasattr(os, "getuid") or nativelib.compiler() is None, reason="POSIX with a C compiler only"
)


def _import_everything() -> None:
    """Import every anynum module, so that every native source the project has is defined."""
    for info in pkgutil.walk_packages(anynum.__path__, "anynum."):
        if info.name != "anynum.cli":
            importlib.import_module(info.name)


_import_everything()
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
OTHER_UID = 65534  # nobody

_HOSTILE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("ANYNUM_TEST_MARKER");
    if (marker) { FILE *f = fopen(marker, "w"); if (f) { fputs("pwned", f); fclose(f); } }
}
/* every entry point the project's kernels export, doing nothing */
int64_t anynum_round(const void *x, void *y, int64_t n, const void *c, uint64_t b, int32_t t,
                     const void *l) { return 0; }
int64_t anynum_round_blocks(const void *x, void *y, int64_t r, int64_t n, const void *c, uint64_t b,
                            int32_t t) { return 0; }
double anynum_block_tensor_scale(const void *x, int64_t n, const void *c, int32_t t) { return 1.0; }
int32_t anynum_pool_workers(void) { return 0; }
int64_t anynum_call_size(void) { return 0; }
"""

# Runs in the victim's process: quantize through every path and compare with the eager reference.
_VICTIM = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("always")
    {prelude}
    import torch, anynum as an
    from anynum.kernels import round_to_format
    x = torch.linspace(-600.0, 600.0, 4001)
    ref = round_to_format(an.E4M3FN, x, an.Rounding.TOWARD_ZERO, "saturate", None, None)
    first = an.quantize(x, an.E4M3FN, "rz")  # the eager reference while a first build runs
    from anynum.kernels import clib
    loaded = clib.library() is not None  # waits for that build
    again = an.quantize(x, an.E4M3FN, "rz")  # the C loop, where it loaded
    print("EQUAL" if torch.equal(first, ref) and torch.equal(again, ref) else "DIFFERENT")
    print("LOADED" if loaded else "NOT-LOADED")
    """
)

# Reports another owner for chosen paths: for runs that cannot chown (not root).
_FAKE_OWNER = textwrap.dedent(
    """
    import os
    _fake = set(os.environ["ANYNUM_TEST_FAKE_OWNER"].split(os.pathsep))
    def _wrap(real):
        def patched(path, *args, **kwargs):
            st = real(path, *args, **kwargs)
            if isinstance(path, (str, os.PathLike)) and os.path.abspath(path) in _fake:
                fields = list(st[:10]); fields[4] = 65534
                return os.stat_result(fields)
            return st
        return patched
    os.stat, os.lstat = _wrap(os.stat), _wrap(os.lstat)
    """
)


def _run(code: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "ANYNUM_COMPILE": "auto", **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout
    )


def _plant(directory: Path, tmp: Path) -> None:
    """Build the hostile library and plant it, with a matching manifest, under every project name."""
    src = tmp / "hostile.c"
    src.write_text(_HOSTILE_C)
    lib = tmp / "hostile.so"
    subprocess.run([nativelib.compiler() or "cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    data = lib.read_bytes()
    sources = nativelib.registered_sources()
    assert {"anynum_round", "diagnose_stats", "mc"} <= {s.name for s in sources}, sources
    for s in sources:
        target = nativelib.library_path(s, directory)
        target.write_bytes(data)
        target.with_suffix(".json").write_text(
            json.dumps({"sha256": hashlib.sha256(data).hexdigest(), "name": s.name})
        )
        os.chmod(target, 0o777)


def _ran_right(result: subprocess.CompletedProcess[str], loaded: str = "LOADED") -> bool:
    """The victim exited cleanly, its results equal the reference, and the C loop was (not) loaded."""
    words = result.stdout.split()
    return result.returncode == 0 and "EQUAL" in words and loaded in words


def _manifest_matches(lib: Path) -> bool:
    recorded = json.loads(lib.with_suffix(".json").read_text())["sha256"]
    return bool(hashlib.sha256(lib.read_bytes()).hexdigest() == recorded)


def _assert_safe(result: subprocess.CompletedProcess[str], marker: Path, named: Path) -> None:
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "the planted library's constructor ran"
    assert "EQUAL" in result.stdout, result.stdout
    assert str(named) in result.stderr and "mode" in result.stderr, result.stderr  # the warning says why
    assert "LOADED" in result.stdout.split()  # a library built in a fresh private directory


def test_world_writable_cache_dir_is_refused(tmp_path: Path) -> None:
    hostile = tmp_path / "shared-cache"
    hostile.mkdir()
    os.chmod(hostile, 0o777)
    _plant(hostile, tmp_path)
    marker = tmp_path / "marker"
    result = _run(
        _VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(hostile), "ANYNUM_TEST_MARKER": str(marker)}
    )
    _assert_safe(result, marker, hostile)
    assert "group or others can write" in result.stderr


@pytest.mark.parametrize("real_chown", [True, False] if ROOT else [False])
def test_cache_dir_of_another_user_is_refused(tmp_path: Path, real_chown: bool) -> None:
    hostile = tmp_path / "their-cache"
    hostile.mkdir()
    _plant(hostile, tmp_path)
    marker = tmp_path / "marker"
    env = {"ANYNUM_CACHE_DIR": str(hostile), "ANYNUM_TEST_MARKER": str(marker)}
    if real_chown:
        for p in [hostile, *hostile.iterdir()]:
            os.chown(p, OTHER_UID, OTHER_UID)
        prelude = ""
    else:
        env["ANYNUM_TEST_FAKE_OWNER"] = str(hostile)
        prelude = _FAKE_OWNER
    result = _run(_VICTIM.format(prelude=prelude), env)
    _assert_safe(result, marker, hostile)
    assert "belongs to another user" in result.stderr


def test_home_under_a_hostile_parent_is_refused(tmp_path: Path) -> None:
    """The default ~/.cache/anynum, where a directory above it is writable by others."""
    home = tmp_path / "home"
    cache = home / ".cache" / "anynum"
    cache.mkdir(parents=True)
    os.chmod(home, 0o777)  # anyone may rename .cache away and put their own in its place
    _plant(cache, tmp_path)
    marker = tmp_path / "marker"
    env = {"HOME": str(home), "ANYNUM_TEST_MARKER": str(marker), "ANYNUM_CACHE_DIR": ""}
    result = _run(_VICTIM.format(prelude=""), env)
    _assert_safe(result, marker, home)
    assert "an ancestor of" in result.stderr


def test_fresh_cache_is_private(tmp_path: Path) -> None:
    cache = tmp_path / "a" / "b" / "cache"
    result = _run(_VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(cache)})
    assert _ran_right(result), result.stderr
    assert "not using" not in result.stderr
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    libs = list(cache.glob("anynum_round-*.so"))
    assert len(libs) == 1
    for f in [libs[0], libs[0].with_suffix(".json")]:
        st = os.stat(f)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0
    assert _manifest_matches(libs[0])


def test_corrupt_library_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(_VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(cache)})
    assert _ran_right(first), first.stderr
    (lib,) = cache.glob("anynum_round-*.so")
    good = lib.read_bytes()
    lib.write_bytes(good[: len(good) // 3])  # truncated: loading it could crash the interpreter
    second = _run(_VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(cache)})
    assert _ran_right(second), second.stderr
    assert _manifest_matches(lib) and len(lib.read_bytes()) == len(good)


def test_symlinked_library_is_not_followed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _run(_VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(cache)})
    assert _ran_right(first), first.stderr
    (lib,) = cache.glob("anynum_round-*.so")
    elsewhere = tmp_path / "elsewhere.so"
    shutil.move(lib, elsewhere)
    lib.symlink_to(elsewhere)
    second = _run(_VICTIM.format(prelude=""), {"ANYNUM_CACHE_DIR": str(cache)})
    assert _ran_right(second), second.stderr
    assert not lib.is_symlink()  # rebuilt as a file of its own


_BUILDER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    go = Path(os.environ["ANYNUM_TEST_GO"])
    while not go.exists():
        time.sleep(0.001)
    from anynum.kernels.nativelib import NativeSource, load
    src = NativeSource("race", "int anynum_race(int a) { return a * 3 + 1; }" + "/*" + "x" * 20000 + "*/")
    lib = load(src)
    print("RESULT", lib.anynum_race(14) if lib is not None else None)
    """
)


def test_two_concurrent_builders_both_load_a_whole_verified_library(tmp_path: Path) -> None:
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "ANYNUM_CACHE_DIR": str(cache), "ANYNUM_TEST_GO": str(go)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    time.sleep(0.5)
    go.touch()
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "RESULT 43" in out, err
        assert "could not build" not in err
    (lib,) = cache.glob("race-*.so")
    assert _manifest_matches(lib)
    assert not list(cache.glob(".race-*"))  # no temporary files left behind


def test_no_posix_checks_means_no_native_code(tmp_path: Path) -> None:
    prelude = "import os\ndel os.getuid"
    result = _run(_VICTIM.format(prelude=prelude), {"ANYNUM_CACHE_DIR": str(tmp_path / "c")})
    assert _ran_right(result, "NOT-LOADED"), result.stderr
    assert "POSIX" in result.stderr
    assert not (tmp_path / "c").exists()


def test_private_dir_rules(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    assert nativelib.check_private_dir(d) is None
    os.chmod(d, 0o770)
    assert "group or others can write" in (nativelib.check_private_dir(d) or "")
    os.chmod(d, 0o700)
    link = tmp_path / "link"
    link.symlink_to(d)
    assert "symbolic link" in (nativelib.check_private_dir(link) or "")
    # an ancestor that is world-writable but sticky (like /tmp) is fine; without the sticky bit it is not
    parent = tmp_path / "p"
    child = parent / "c"
    child.mkdir(parents=True, mode=0o700)
    os.chmod(parent, 0o1777)
    assert nativelib.check_private_dir(child) is None
    os.chmod(parent, 0o777)
    assert "an ancestor of" in (nativelib.check_private_dir(child) or "")
    os.chmod(parent, 0o755)


def test_inductor_cache_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    open_dir = tmp_path / "inductor"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(open_dir))
    assert "group or others can write" in (nativelib.inductor_cache_unsafe() or "")
    os.chmod(open_dir, 0o700)
    assert nativelib.inductor_cache_unsafe() is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "not-yet"))
    assert nativelib.inductor_cache_unsafe() is None  # created by Inductor, as this user


def test_unsafe_inductor_cache_means_eager(tmp_path: Path) -> None:
    """A compiled kernel is never built into (or loaded from) a cache others can write."""
    open_dir = tmp_path / "inductor"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    code = textwrap.dedent(
        """
        import warnings; warnings.simplefilter("always")
        import torch, anynum as an
        from anynum.kernels import ckernel, round_to_format
        ckernel.library = lambda: None  # the C kernels decline: the compiled kernel is next
        x = torch.randn(1000)
        y = an.quantize(x, an.Posit(8, 0))
        print("EQUAL" if torch.equal(y, round_to_format(an.Posit(8, 0), x, an.Rounding.NEAREST_EVEN,
              "saturate", None, None)) else "DIFFERENT")
        """
    )
    result = _run(code, {"TORCHINDUCTOR_CACHE_DIR": str(open_dir), "ANYNUM_COMPILE": "1"})
    assert "EQUAL" in result.stdout, result.stderr
    assert "not compiling kernels" in result.stderr
    assert not any(open_dir.iterdir())


def test_doc_source_registry() -> None:
    s = NativeSource("registry_probe", "int f(void) { return 0; }")
    assert s in nativelib.registered_sources()


def _wait_for(done: Callable[[], bool], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done()


def _zombie_children() -> list[int]:
    """This process's children that have exited and not been waited for (Linux's /proc)."""
    zombies = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process has gone meanwhile
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(stat_file.parent.name))
    return zombies


def test_load_soon_builds_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No caller waits for a first build: None at once, one background build, then the library;
    with the library in the cache, no build at all."""
    monkeypatch.setenv("ANYNUM_CACHE_DIR", str(tmp_path / "cache"))
    src = NativeSource(f"test_soon_{os.getpid()}", "int anynum_answer(void) { return 7; }")
    assert nativesoon.load_soon(src) is None  # gcc takes far longer than starting a process
    assert nativesoon.building(src)
    if Path("/proc/self/stat").exists():
        _wait_for(lambda: bool(_zombie_children()))  # the builder has exited, and no one has asked since
    else:
        _wait_for(lambda: not nativesoon.building(src))
    lib = nativesoon.load_soon(src)
    assert lib is not None and lib.anynum_answer() == 7
    assert _zombie_children() == []  # the finished builder was reaped when its library loaded
    assert not nativesoon.building(src)
    # another process finds it in the cache: loaded on the spot, no build
    code = textwrap.dedent(
        f"""
        from anynum.kernels import nativesoon
        from anynum.kernels.nativelib import NativeSource
        src = NativeSource({src.name!r}, {src.source!r})
        lib = nativesoon.load_soon(src)
        print(lib is not None and lib.anynum_answer(), nativesoon.building(src))
        """
    )
    env = {**os.environ, "ANYNUM_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["7", "False"]


def _logging_compiler(tmp_path: Path, *, fails: bool = False) -> tuple[Path, Path]:
    """A C compiler that records each call (and takes 5 s first), or one that always fails."""
    log = tmp_path / "compiles.log"
    cc = tmp_path / "logging-cc"
    real = shutil.which("cc") or shutil.which("gcc") or "cc"
    body = "exit 1" if fails else f'sleep 5\nexec {real} "$@"'
    cc.write_text(f'#!/bin/sh\necho "$$" >> {log}\n{body}\n')
    cc.chmod(0o700)
    return cc, log


def test_short_processes_build_once_and_the_build_outlives_them(tmp_path: Path) -> None:
    """Two processes that ask for a library and exit at once, one right after the other: the
    first's detached build finishes after it has gone, the second waits on that build's lock
    instead of compiling again (one compiler run in all), and a third process loads the result."""
    cc, log = _logging_compiler(tmp_path)
    env = {**os.environ, "ANYNUM_CACHE_DIR": str(tmp_path / "cache"), "CC": str(cc)}
    src = NativeSource(f"test_detached_{os.getpid()}", "int anynum_answer(void) { return 11; }")
    code = textwrap.dedent(
        f"""
        from anynum.kernels import nativesoon
        from anynum.kernels.nativelib import NativeSource
        src = NativeSource({src.name!r}, {src.source!r})
        lib = nativesoon.load_soon(src)
        print(lib is not None and lib.anynum_answer(), nativesoon.building(src))
        """
    )

    def ask() -> list[str]:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert ask() == ["False", "True"]
    assert ask() == ["False", "True"]  # the first build is still running (its compiler sleeps 5 s)
    _wait_for(lambda: ask() == ["11", "False"])
    time.sleep(0.5)  # the second builder, which waited on the lock, has gone too
    assert len(log.read_text().split()) == 1


def test_a_failed_detached_build_is_retried_here_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc, log = _logging_compiler(tmp_path, fails=True)
    monkeypatch.setenv("ANYNUM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(cc))
    nativelib.compiler.cache_clear()
    try:
        src = NativeSource(f"test_failing_{os.getpid()}", "int anynum_answer(void) { return 3; }")
        assert nativesoon.load_soon(src) is None
        _wait_for(lambda: not nativesoon.building(src))  # the detached build failed
        with pytest.warns(RuntimeWarning, match="could not build or load"):
            assert nativesoon.load_soon(src) is None  # built again in a thread here, which says why
            _wait_for(lambda: not nativesoon.building(src))
        assert nativesoon.load_soon(src) is None and not nativesoon.building(src)  # no third try
        assert len(log.read_text().split()) == 4  # -march=native, then without, in each build
    finally:
        nativelib.compiler.cache_clear()


def test_router_runs_the_reference_while_the_library_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a background build the native kernel answers with the eager reference (the same
    bits), never declining to the compiled route, whose own first compile would stall."""
    import torch

    import anynum as an
    from anynum.kernels import ckernel, fused, route
    from anynum.rounding import Rounding

    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    monkeypatch.setattr(ckernel, "library_soon", lambda: None)
    monkeypatch.setattr(ckernel, "building_library", lambda: True)
    monkeypatch.setattr(ckernel, "native_round", lambda *a, **k: pytest.fail("the C kernel ran"))
    monkeypatch.setattr(fused, "fused_round", lambda *a, **k: pytest.fail("the compiled route ran"))
    threads_seen: list[int] = []
    round_reference = ckernel.round_reference

    def reference(*args: object) -> torch.Tensor:  # the reference, on one core fewer than torch's
        threads_seen.append(torch.get_num_threads())
        return round_reference(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(ckernel, "round_reference", reference)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # any count above one: the compiler's core is taken from it
    try:
        an.quantize(torch.randn(100), an.E4M3FN, "rz")
    finally:
        torch.set_num_threads(threads)
    assert threads_seen == [2]
    x = torch.randn(1 << 20)
    for fmt in (an.E4M3FN, an.Posit(16, 1), an.NVFP4):
        for mode in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
            plan = route.plan_for(fmt, mode, fmt.default_overflow, None, torch.float32, "cpu", None)
            assert plan.kernel_names()[0] == "native"
            got = an.quantize(x, fmt, mode, seed=3 if mode is Rounding.STOCHASTIC else None)
            with monkeypatch.context() as m:
                m.setenv("ANYNUM_COMPILE", "0")
                want = an.quantize(x, fmt, mode, seed=3 if mode is Rounding.STOCHASTIC else None)
            assert torch.equal(got, want), (fmt, mode)


def test_cxx_sources_are_built_by_the_cxx_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """C++ (the pair node's language): $CXX first, the C++ standard, linker arguments after the
    source (a shared library listed before it would be dropped by --as-needed linkers)."""
    nativelib.compiler.cache_clear()
    monkeypatch.setenv("CXX", "my-c++")
    try:
        assert nativelib.compiler("c++") == "my-c++"
        monkeypatch.delenv("CXX")
        nativelib.compiler.cache_clear()
        if nativelib.compiler("c++") is None:
            pytest.skip("no C++ compiler here (c++, g++ or clang++): nothing C++ is built")
        monkeypatch.setenv("ANYNUM_CACHE_DIR", str(tmp_path / "cache"))
        source = 'extern "C" int anynum_cxx_probe() { return static_cast<int>(sizeof(bool)) + 41; }'
        src = NativeSource("cxx_probe", source, language="c++", libraries=("-lstdc++",))
        lib = nativelib.load(src)
        assert lib is not None and lib.anynum_cxx_probe() == 42
        c_twin = NativeSource("cxx_probe_as_c", source)
        assert nativelib.library_path(src, tmp_path) != nativelib.library_path(c_twin, tmp_path)
    finally:
        nativelib.compiler.cache_clear()
