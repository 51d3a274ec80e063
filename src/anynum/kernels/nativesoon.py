"""Native libraries built in the background: a first call on a new machine never waits for a compiler.

`load_soon` answers at once: the library where the private cache holds it, else None while
a build runs in a detached process of its own. That process outlives the one that started
it, so short scripts run one after another on a new machine build the library once, and
later runs load it; a thread in this process builds it only where no such process can run.
Every build goes through `anynum.kernels.nativelib` (private directory, lock, verified hash).

>>> from anynum.kernels.nativelib import NativeSource
>>> building(NativeSource("doc_never_asked", "int f(void) { return 0; }"))
False
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from anynum.kernels import nativelib
from anynum.kernels.nativelib import NativeSource

__all__ = ["building", "load_soon"]

_LOCK = threading.Lock()  # guards _builders
_builders: dict[str, threading.Thread | subprocess.Popen[bytes]] = {}  # the builds load_soon started


def load_soon(src: NativeSource) -> ctypes.CDLL | None:
    """`src` loaded if that takes no compiler; otherwise None at once, while a background build
    runs, so that a first call on a new machine never waits for the build.

    The build runs in a detached process of its own (`_spawn_builder`): it finishes and fills
    the cache even when this process ends first, and a second process that starts meanwhile
    waits on the build's lock instead of compiling again. Where that cannot be (no private
    cache directory that outlives this process, or the detached build failed) it runs in a
    thread of this process, which is `nativelib.load`. Callers run their pure-torch path meanwhile
    (`building` says why the library is missing) and pick the library up on a later call.
    Where it is in the cache already, or cannot be built at all, this is `nativelib.load`.

    >>> src = NativeSource("doc_example", "int anynum_answer(void) { return 42; }")
    >>> lib = load_soon(src) or nativelib.load(src)  # the doctest waits for it
    >>> lib is None or lib.anynum_answer() == 42
    True
    """
    directory = nativelib.cache_dir()
    cc = None if directory is None else nativelib.compiler(src.language)
    if directory is None or cc is None or nativelib.library_path(src, directory).exists():
        _forget_finished(src.name)
        return nativelib.load(src)  # fast: a verified load, or a None with its warning
    with _LOCK:
        builder = _builders.get(src.name)
        if builder is None and nativelib.lasting(directory):
            builder = _spawn_builder(src, cc, nativelib.library_path(src, directory))
        if builder is None or (isinstance(builder, subprocess.Popen) and builder.poll() not in (None, 0)):
            # build here, where a failure gets its one-time warning with the reason
            name = f"anynum-build-{src.name}"
            builder = threading.Thread(target=nativelib.load, args=(src,), name=name, daemon=True)
            builder.start()
        _builders[src.name] = builder
    return None if _running(builder) else nativelib.load(src)  # a finished build: its result (or None)


def building(src: NativeSource) -> bool:
    """Whether a background build of `src` started by `load_soon` is still running."""
    builder = _builders.get(src.name)
    return builder is not None and _running(builder)


def _forget_finished(name: str) -> None:
    """Drops a build that has finished; a detached builder's exit status is collected here (which
    `subprocess` does on a poll), or it would stay in the process table until this process ends."""
    with _LOCK:
        builder = _builders.get(name)
        if builder is not None and not _running(builder):
            del _builders[name]


def _running(builder: threading.Thread | subprocess.Popen[bytes]) -> bool:
    return builder.is_alive() if isinstance(builder, threading.Thread) else builder.poll() is None


#: What the detached builder runs: `anynum.kernels.nativelib`'s file, loaded by path (it needs nothing but the
#: standard library, so the builder never imports torch), then `build_request` on its stdin.
_BUILDER = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.spec_from_file_location('_anynum_nativelib_builder', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = module\n"
    "spec.loader.exec_module(module)\n"
    "module.build_request(json.load(sys.stdin))\n"
)


def _spawn_builder(src: NativeSource, cc: str, lib: Path) -> subprocess.Popen[bytes] | None:
    """A detached process (its own session) that builds `src` into `lib`, or None where none can start."""
    if not sys.executable:
        return None
    request = {"source": {"name": src.name, "source": src.source, "flags": list(src.flags),
                          "language": src.language, "libraries": list(src.libraries)},
               "compiler": cc, "library": str(lib)}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BUILDER, os.path.abspath(nativelib.__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives this process, and its terminal's Ctrl-C
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except OSError:
        return None
    return proc


def _after_fork() -> None:
    """A child starts with no builds of its own: it must not wait on its parent's."""
    global _LOCK
    _LOCK = threading.Lock()
    _builders.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
