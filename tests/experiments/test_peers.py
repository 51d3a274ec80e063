"""Peers' torch extension builds: one at a time, and never stuck behind a killed build's lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from anynum.experiments.peers import builds_one_at_a_time, peer_extensions

fcntl = pytest.importorskip("fcntl")  # the OS lock is POSIX; elsewhere nothing is guarded


def _torch_lock(root: Path) -> Path:
    """Where torch's cpp_extension marks a build of "quant_cpu" in progress (its FileBaton)."""
    (root / "quant_cpu").mkdir(parents=True, exist_ok=True)
    return root / "quant_cpu" / "lock"


def test_a_killed_builds_lock_is_removed(tmp_path: Path) -> None:
    # A build killed midway: the process that made the lock file is gone.
    code = (
        "import os, sys\n"
        "from torch.utils.file_baton import FileBaton\n"
        "baton = FileBaton(sys.argv[1])\n"
        "assert baton.try_acquire()\n"
        "os._exit(0)  # no release, as a SIGKILL leaves it\n"
    )
    lock = _torch_lock(tmp_path)
    subprocess.run([sys.executable, "-c", code, str(lock)], check=True)
    assert lock.exists()
    with builds_one_at_a_time(str(tmp_path)):
        assert not lock.exists()


def test_a_live_build_is_waited_for_and_its_lock_kept(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    lock = _torch_lock(tmp_path)
    with open(tmp_path / "anynum.flock", "a") as held:  # another import, building now
        fcntl.flock(held, fcntl.LOCK_EX)
        lock.touch()
        seen: list[bool] = []

        def second() -> None:
            with builds_one_at_a_time(str(tmp_path)):
                seen.append(lock.exists())

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive() and not seen  # still waiting: the live build's lock stays
        assert lock.exists()
        lock.unlink()  # the build finishes: torch removes its lock, then the OS lock goes
        fcntl.flock(held, fcntl.LOCK_UN)
        waiter.join(timeout=10)
    assert seen == [False]
    assert "waiting for another process's build" in capfd.readouterr().err


def test_the_peers_build_directory_is_guarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _torch_lock(tmp_path / "qtorch")
    lock.touch()  # a killed build's
    with peer_extensions("qtorch.quant"):
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "qtorch")
        assert not lock.exists()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)
    lock.touch()
    with peer_extensions("pychop"):  # no C++ build: nothing touched
        assert lock.exists()


def test_nested_use_in_one_process_does_not_wait_on_itself(tmp_path: Path) -> None:
    done = threading.Event()

    def nested() -> None:
        with builds_one_at_a_time(str(tmp_path)), builds_one_at_a_time(str(tmp_path)):
            done.set()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    assert done.wait(timeout=10)
