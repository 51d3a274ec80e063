"""Several study processes on one output directory: per-trial claims and whole-line appends.

* A trial runs only in the process that holds its **claim**: an exclusive ``flock`` on
  ``OUT/.claims/<trial id>``. The kernel drops the lock when its holder exits, SIGKILL
  included, so a dead process never blocks a trial. A process that finds a trial
  claimed leaves it to the holder and, once the holder lets go, reads its row (or
  runs the trial itself if the holder failed or died).
* A row is **appended** to ``results.jsonl`` under an exclusive ``flock`` of that file,
  in one ``write`` of the whole line. A tail left torn by a writer killed mid-write is
  cut off first, so the file never holds a torn, interleaved or duplicated line.

The locks are POSIX advisory locks (Linux, macOS; on NFS they need a lock daemon).
Where ``fcntl`` is missing (Windows), claims always succeed: run one study per
directory there.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CLAIMS_DIR", "TrialClaims", "append_line", "write_atomic"]

CLAIMS_DIR = ".claims"


def _lock(fd: int, blocking: bool) -> bool:
    if fcntl is None:  # pragma: no cover - Windows
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


class TrialClaims:
    """The claims this process holds in ``out/.claims`` (see the module docstring).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     a, b = TrialClaims(d), TrialClaims(d)
    ...     first, second = a.try_claim("t1"), b.try_claim("t1")
    ...     a.release("t1")
    ...     third = b.try_claim("t1"); b.release_all()
    >>> first, second, third
    (True, False, True)
    """

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.dir = Path(out) / CLAIMS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.held: dict[str, int] = {}

    def try_claim(self, trial_id: str) -> bool:
        """Claim `trial_id` without waiting; False if another process holds it."""
        if trial_id in self.held:
            return True
        path = self.dir / trial_id
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            if not _lock(fd, blocking=False):
                os.close(fd)
                return False
            # The previous holder unlinks the file before it lets go: a lock on an unlinked
            # file claims nothing, so check that `path` is still the file we locked.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
                self.held[trial_id] = fd
                return True
            os.close(fd)

    def wait(self, trial_id: str) -> None:
        """Block until no process holds `trial_id` (without claiming it)."""
        path = self.dir / trial_id
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # released already
        try:
            _lock(fd, blocking=True)
        finally:
            os.close(fd)

    def holder(self, trial_id: str) -> str:
        """``"host pid"`` of the process holding `trial_id` (for messages), or ``""``."""
        try:
            return (self.dir / trial_id).read_text().strip()
        except OSError:
            return ""

    def release(self, trial_id: str) -> None:
        """Let go of `trial_id` (its row, if any, must be appended first)."""
        fd = self.held.pop(trial_id, None)
        if fd is None:
            return
        try:
            os.unlink(self.dir / trial_id)  # while still locked: see try_claim
        except FileNotFoundError:
            pass
        os.close(fd)

    def release_all(self) -> None:
        for trial_id in list(self.held):
            self.release(trial_id)


def _cut_torn_tail(fd: int) -> None:
    """Make the file end with a complete line: drop a partial last line (a writer killed mid-write).

    A last line without its newline that still parses as a JSON object (written by hand,
    say) is kept and given its newline.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(0, size - (1 << 20))
    tail = os.pread(fd, size - start, start)
    cut = tail.rfind(b"\n") + 1  # 0 when the whole window is one line
    try:
        complete = isinstance(json.loads(tail[cut:]), dict)
    except ValueError:
        complete = False
    if complete:
        os.write(fd, b"\n")
    else:
        os.ftruncate(fd, start + cut)


def append_line(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append `row` as one JSON line to `path`, whole, even with other processes appending.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "r.jsonl"
    ...     _ = p.write_text('{"a": 1}\\n{"b": ')  # torn by a killed writer
    ...     append_line(p, {"c": 3})
    ...     p.read_text()
    '{"a": 1}\\n{"c": 3}\\n'
    """
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _lock(fd, blocking=True)  # released by close
        _cut_torn_tail(fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace `path` with `data` in one step: readers (and a concurrent study writing the same
    report) see the old file or the new one, never a mix.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_atomic(pathlib.Path(d) / "t.md", "hello\\n")
    ...     (pathlib.Path(d) / "t.md").read_text()
    'hello\\n'
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
