"""`anynum build`: every native library built now, so that no later run has a build window.

A run on a machine whose cache lacks a library builds it in the background and takes slower
paths meanwhile (docs/speed.md, "No call waits for the build"). Where that window is unwelcome
(a job whose first minute is timed, a container image, a cluster's shared home), this builds
them all beforehand, in parallel, and waits: through `anynum.kernels.nativelib`, as a run would
(the private cache, its lock, the verified hash), so a run that starts meanwhile waits on the
same lock rather than compiling again.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["build_all"]


def build_all(say: Callable[[str], object] = print) -> int:
    """Build every native library anynum uses into the private cache, waiting for each; the number
    of libraries that could not be built (each with nativelib's warning saying why).

    `say` gets a line when a library's build starts, and one per library as it is done: built
    (and how long it took), already in the cache, or not built. Where no private cache
    directory can be had, nothing is built.

    >>> lines = []
    >>> failed = build_all(lines.append)  # builds what the cache lacks, and waits
    >>> lines[0].startswith("native libraries, cache ")
    True
    >>> any(line.startswith("  anynum_round: ") for line in lines)
    True
    """
    import anynum
    from anynum.kernels import nativelib

    for info in pkgutil.walk_packages(anynum.__path__, "anynum."):  # each defines its NativeSources
        if info.name != "anynum.cli":
            importlib.import_module(info.name)

    directory = nativelib.cache_dir()
    if directory is None:
        say("no private cache directory here (see the warning above): nothing to build")
        return 1
    say(f"native libraries, cache {directory}:")

    def file_id(path: Path) -> tuple[int, int] | None:  # a build replaces the file: a new inode
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    lock = threading.Lock()  # one line at a time from the builds' threads

    def tell(line: str) -> None:
        with lock:
            say(line)

    def one(src: nativelib.NativeSource) -> bool:
        lib = nativelib.library_path(src, directory)
        before, t0 = file_id(lib), time.perf_counter()
        if before is None:
            tell(f"  {src.name}: building ...")  # its result, seconds later, is a line of its own
        ok = nativelib.load(src) is not None
        took = time.perf_counter() - t0
        cached = before is not None and file_id(lib) == before  # and verified: load checked it
        state = "not built" if not ok else "in the cache" if cached else f"built in {took:.1f} s"
        tell(f"  {src.name}: {state}")
        return ok

    sources = nativelib.registered_sources()
    with ThreadPoolExecutor(max_workers=max(1, min(len(sources), os.cpu_count() or 1))) as pool:
        done = list(pool.map(one, sources))
    return done.count(False)
