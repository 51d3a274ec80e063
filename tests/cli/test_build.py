"""`anynum build`: every native library built into the private cache, waiting for each; a library
that cannot be built says so and makes the exit code 1. Oracle: the cache's files (the verified
loads of `anynum.kernels.nativelib`) and the compiler's own call log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anynum.cli import main
from anynum.experiments import nativebuild
from anynum.kernels import nativelib
from anynum.kernels.nativelib import NativeSource


@pytest.fixture
def one_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NativeSource:
    """A fresh cache directory and one small library as the only one the project has."""
    monkeypatch.setenv("ANYNUM_CACHE_DIR", str(tmp_path / "cache"))
    src = NativeSource(f"test_build_{os.getpid()}_{tmp_path.name}", "int anynum_answer(void) { return 5; }")
    monkeypatch.setattr(nativelib, "registered_sources", lambda: [src])
    return src


def test_build_compiles_once_then_finds_it_in_the_cache(
    one_source: NativeSource, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "cc.log"
    real = shutil.which("cc") or shutil.which("gcc") or "cc"
    cc = tmp_path / "logging-cc"
    cc.write_text(f'#!/bin/sh\necho "$$" >> {log}\nexec {real} "$@"\n')
    cc.chmod(0o700)
    monkeypatch.setenv("CC", str(cc))
    nativelib.compiler.cache_clear()
    try:
        lines: list[str] = []
        assert nativebuild.build_all(lines.append) == 0
        assert lines[0].startswith("native libraries, cache ") and str(tmp_path / "cache") in lines[0]
        assert lines[1] == f"  {one_source.name}: building ..."
        assert lines[2].startswith(f"  {one_source.name}: built in ")
        directory = nativelib.cache_dir()
        assert directory is not None and nativelib.library_path(one_source, directory).exists()
        assert len(log.read_text().split()) == 1  # one compiler run
        lines.clear()
        assert nativebuild.build_all(lines.append) == 0
        assert lines[1:] == [f"  {one_source.name}: in the cache"]
        assert len(log.read_text().split()) == 1  # and none the second time
    finally:
        nativelib.compiler.cache_clear()


def test_a_library_that_cannot_be_built_fails_the_command(
    one_source: NativeSource,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cc = tmp_path / "failing-cc"
    cc.write_text("#!/bin/sh\nexit 1\n")
    cc.chmod(0o700)
    monkeypatch.setenv("CC", str(cc))
    nativelib.compiler.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="could not build or load the native kernel"):
            assert main(["build"]) == 1
    finally:
        nativelib.compiler.cache_clear()
    assert f"  {one_source.name}: not built" in capsys.readouterr().out.splitlines()


def test_every_library_the_project_has_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command imports every module first, so each library is defined when it is asked for."""
    asked: list[str] = []

    def load(src: NativeSource) -> object:
        asked.append(src.name)
        return object()

    monkeypatch.setattr(nativelib, "load", load)
    assert nativebuild.build_all(lambda line: None) == 0
    assert {"anynum_round", "anynum_pairop", "mc", "emulate_seqdot", "diagnose_stats"} <= set(asked)


def test_a_library_that_fails_its_check_is_built_again_and_says_so(one_source: NativeSource) -> None:
    """A cached file whose hash no longer matches its manifest is not "in the cache": it is rebuilt."""
    code = (
        "import sys\nfrom anynum.kernels.nativelib import NativeSource, load\n"
        f"sys.exit(load(NativeSource({one_source.name!r}, {one_source.source!r})) is None)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)  # built by another process
    directory = nativelib.cache_dir()
    assert directory is not None
    lib = nativelib.library_path(one_source, directory)
    lib.write_bytes(lib.read_bytes() + b"\0")  # no longer the bytes the manifest records
    lines: list[str] = []
    assert nativebuild.build_all(lines.append) == 0
    assert lines[1].startswith(f"  {one_source.name}: built in ")
