"""Importing the peers (QPyTorch, Qtorch+, Pychop, ...) for comparisons and benchmarks."""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["builds_one_at_a_time", "import_peer", "peer_extensions"]

_HELD: set[str] = set()  # the build roots whose OS lock this process holds


@contextlib.contextmanager
def peer_extensions(module: str) -> Iterator[None]:
    """Inside, a peer package builds its torch C++ extension in a directory of its own.

    QPyTorch and Qtorch+ both build an extension named "quant_cpu" into torch's default
    extensions directory, where each build replaces the other's: importing the first again
    then loads the second's library (whose block_quantize differs). Keyed by the top-level
    package of `module`; other modules are imported as they are. Builds there run one at a
    time, past any stale lock a killed build left (`builds_one_at_a_time`).

    >>> import os
    >>> with peer_extensions("qtorch_plus.quant"):
    ...     os.environ["TORCH_EXTENSIONS_DIR"].endswith("qtorch_plus")
    True
    """
    package = module.split(".")[0]
    if package not in ("qtorch", "qtorch_plus"):
        yield
        return
    from torch.utils.cpp_extension import get_default_build_root

    before = os.environ.get("TORCH_EXTENSIONS_DIR")
    root = os.path.join(before or get_default_build_root(), package)
    os.environ["TORCH_EXTENSIONS_DIR"] = root
    try:
        with builds_one_at_a_time(root):
            yield
    finally:
        if before is None:
            del os.environ["TORCH_EXTENSIONS_DIR"]
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = before


@contextlib.contextmanager
def builds_one_at_a_time(root: str) -> Iterator[None]:
    """Inside, this process alone builds or loads torch extensions under `root`, and no stale lock
    of a killed build stands in its way.

    torch marks a build in progress with a ``lock`` file in the extension's directory and makes
    every other process wait until that file goes; a build killed midway (a test run stopped by
    hand, a CI job cancelled) leaves it behind, and every later import of the peer then waits
    forever. Here each import holds an OS lock on ``root/anynum.flock`` (``fcntl.flock``: the
    kernel releases it when its process dies), so a ``lock`` file found while holding it belongs
    to no live build of ours and is removed. A second process waits for the first (a line on
    stderr says so) and then loads its build. Where ``fcntl`` does not exist (Windows), nothing
    is locked or removed.

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(root, "quant_cpu"))
    >>> open(os.path.join(root, "quant_cpu", "lock"), "w").close()  # a killed build's
    >>> with builds_one_at_a_time(root):
    ...     os.path.exists(os.path.join(root, "quant_cpu", "lock"))
    False
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock alone
        yield
        return
    if root in _HELD:  # nested in this process: a second descriptor's flock would wait on the first
        yield
        return
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "anynum.flock"), "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"anynum: waiting for another process's build of a peer's extension in {root}",
                  file=sys.stderr, flush=True)
            fcntl.flock(held, fcntl.LOCK_EX)
        _HELD.add(root)
        try:
            for stale in glob.glob(os.path.join(root, "*", "lock")):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(stale)
            yield
        finally:
            _HELD.discard(root)
            fcntl.flock(held, fcntl.LOCK_UN)


def import_peer(name: str) -> Any | None:
    """Module `name` of a peer, imported (its C++ build kept apart), or None if it cannot be.

    >>> import_peer("no_such_peer") is None
    True
    """
    try:
        with peer_extensions(name):
            return importlib.import_module(name)
    except Exception:
        return None
