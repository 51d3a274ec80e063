"""The one place native code is built, cached and loaded: private directories, verified libraries.

anynum compiles small C kernels with the system compiler once per machine and
loads them with ctypes. Loading a shared library runs its code in this process,
so a library another local user could have written is arbitrary code execution
(and silently wrong results). Every library therefore comes through `load`,
which holds to these rules (docs/security.md states the threat model):

* **Private directory.** The cache directory (``$ANYNUM_CACHE_DIR``, else
  ``~/.cache/anynum``) must be owned by this user and writable by nobody else,
  and so must every ancestor up to the filesystem root, except ancestors owned
  by root or this user that are not writable by others, or that carry the
  sticky bit (``/tmp``: others cannot rename or delete our entries there).
  A directory that fails is never used: anynum warns once (path, owner, mode,
  fix) and builds into a fresh private directory for this process
  (``tempfile.mkdtemp``, mode 0700).
* **Integrity.** Each build writes the library and a manifest holding its
  SHA-256, both atomically (temporary file, then ``os.replace``), under a lock
  file so that concurrent builders do not interleave. A library is loaded only
  if its bytes hash to the manifest's value; a missing, truncated or corrupt
  library is rebuilt, never loaded.
* **Checked where opened.** The library is opened without following symlinks,
  its owner and mode are checked with ``fstat`` on that descriptor, the bytes
  read from it are hashed, and on Linux that same open file is loaded
  (``/proc/self/fd/N``), so nothing can be swapped in between check and load.
* **POSIX only.** Where these checks cannot be made (no ``os.getuid``: Windows),
  no native library is loaded; the pure-torch paths run, with a one-time note.

>>> import anynum.kernels.nativelib as nl
>>> src = NativeSource("doc_example", "int anynum_answer(void) { return 42; }")
>>> lib = nl.load(src)
>>> lib is None or lib.anynum_answer() == 42
True
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no native code is loaded there (see `cache_dir`)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "NativeSource",
    "build_request",
    "cache_dir",
    "check_private_dir",
    "compiler",
    "lasting",
    "library_path",
    "load",
    "registered_sources",
    "unsafe_reason",
]

_LOCK = threading.Lock()  # guards _LOCKS
_LOCKS: dict[str, threading.Lock] = {}  # one per library: a long build blocks only its own loads
_warned: set[str] = set()
_sources: dict[str, NativeSource] = {}
_open_libraries: list[int] = []  # descriptors of the loaded libraries (see `_load`)


@dataclass(frozen=True)
class NativeSource:
    """A library anynum builds: name, source, compiler flags, language ("c", or "c++" for
    `anynum.kernels.pairop`) and linker arguments (placed after the source).

    Building the same source twice gives the same cache entry. Each source is
    recorded when it is defined; `registered_sources` lists them, which the
    security tests use to plant hostile libraries under every name the project uses.
    """

    name: str
    source: str
    flags: tuple[str, ...] = field(default=())
    language: str = "c"
    libraries: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _sources.setdefault(self.name, self)


def registered_sources() -> list[NativeSource]:
    """Every `NativeSource` defined so far in this process (each is defined where its module is imported)."""
    return list(_sources.values())


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


# --- where -------------------------------------------------------------------------------------


def _describe(path: Path, st: os.stat_result) -> str:
    try:
        import pwd

        owner = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        owner = "?"
    mode = f"{stat.filemode(st.st_mode)} = {st.st_mode & 0o7777:o}"
    return f"{path} (owner uid {st.st_uid} [{owner}], mode {mode})"


def unsafe_reason(st: os.stat_result, *, ancestor: bool) -> str | None:
    """Why a directory with this `lstat` result may not hold our native code, or None if it may.

    The directory itself must be ours and writable only by us. An ancestor may also
    belong to root, and may be writable by others if its sticky bit is set (then
    others cannot rename or delete what we own inside it).

    >>> import os
    >>> unsafe_reason(os.stat("/"), ancestor=True) is None
    True
    """
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    owners = (uid, 0) if ancestor else (uid,)
    if st.st_uid not in owners:
        return "it belongs to another user"
    if st.st_mode & 0o022 and not (ancestor and st.st_mode & stat.S_ISVTX):
        return "group or others can write to it"
    return None


def check_private_dir(path: Path) -> str | None:
    """None if `path` and its ancestors are safe for native code (see the module docstring), else why not.

    The path must exist. Symbolic links among the ancestors are resolved and the
    targets checked; the directory itself must not be a link.
    """
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} cannot be examined ({exc})"
    why = unsafe_reason(st, ancestor=False)
    if why:
        return f"{_describe(path, st)}: {why}"
    for parent in Path(os.path.realpath(path.parent)).joinpath("x").parents:
        try:
            pst = os.stat(parent)
        except OSError as exc:
            return f"{parent} cannot be examined ({exc})"
        why = unsafe_reason(pst, ancestor=True)
        if why:
            return f"{_describe(parent, pst)}, an ancestor of {path}: {why}"
    return None


def _configured_dir() -> tuple[Path, str]:
    configured = os.environ.get("ANYNUM_CACHE_DIR")
    if configured:
        return Path(configured), "$ANYNUM_CACHE_DIR"
    return Path(os.path.expanduser("~")) / ".cache" / "anynum", "the default ~/.cache/anynum"


@functools.cache
def _private_temp_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="anynum-native-"))  # mode 0700, unique, this process's
    atexit.register(shutil.rmtree, path, ignore_errors=True)  # loaded libraries stay mapped
    return path


def cache_dir() -> Path | None:
    """The verified private directory native libraries live in, or None where none can be had.

    ``$ANYNUM_CACHE_DIR``, else ``~/.cache/anynum``, created with mode 0700 if
    missing (parents too). If it fails `check_private_dir`, a fresh private
    directory for this process is used instead, with a one-time warning that
    names the path, its owner and mode, and the fix.
    """
    if not hasattr(os, "getuid"):
        _warn_once(
            "posix",
            "anynum: native kernels need POSIX ownership checks, which this platform lacks; "
            "using the pure-torch paths.",
        )
        return None
    path, origin = _configured_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        why: str | None = f"{path} cannot be created ({exc})"
    else:
        why = check_private_dir(path)
    if why is None:
        return path
    private = _private_temp_dir()
    _warn_once(
        f"dir:{path}",
        f"anynum: not using {origin} for native code: {why}. Another user could plant code there. "
        f"Building in the private directory {private} for this process instead. Fix: "
        f"`chmod 700 {path}` if it is yours (and `chmod go-w` on the ancestor named), or point "
        "ANYNUM_CACHE_DIR at a directory only you can write.",
    )
    return private


def lasting(directory: Path) -> bool:
    """Whether `directory` (from `cache_dir`) outlives this process: the configured cache, not
    the private directory of this process that replaces an unsafe one."""
    return directory == _configured_dir()[0]


# --- how ---------------------------------------------------------------------------------------


_LANGUAGES = {  # language: (compiler variable, compilers to look for, default standard, suffix)
    "c": ("CC", ("cc", "gcc", "clang"), "-std=c99", ".c"),
    "c++": ("CXX", ("c++", "g++", "clang++"), "-std=c++17", ".cpp"),
}


@functools.cache
def compiler(language: str = "c") -> str | None:
    """C: ``$CC``, else the first of cc, gcc, clang on PATH (C++: $CXX, c++, g++, clang++); or None."""
    variable, names, _, _ = _LANGUAGES[language]
    return os.environ.get(variable) or next((c for c in names if shutil.which(c)), None)


@functools.cache
def _cpu_features() -> str:
    """What this CPU offers (Linux: its flags), so a library built for one CPU is not loaded on another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


_BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math")


def library_path(src: NativeSource, directory: Path) -> Path:
    """Where `src`'s library lives in `directory`: its name plus a hash of source, compiler, flags and CPU."""
    build = " ".join((str(compiler(src.language)), *src.flags, *src.libraries))
    identity = "|".join((src.source, build, platform.machine(), sys.platform, _cpu_features()))
    return directory / f"{src.name}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.so"


def _manifest_path(lib: Path) -> Path:
    return lib.with_suffix(".json")


def _open_private_file(path: Path) -> int | None:
    """A read-only descriptor of `path` if it is a regular file of ours writable by nobody else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # missing, or a symbolic link (ELOOP)
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _recorded_hash(lib: Path) -> str | None:
    fd = _open_private_file(_manifest_path(lib))
    if fd is None:
        return None
    try:
        record = json.loads(_read_fd(fd).decode())
        digest = record.get("sha256") if isinstance(record, dict) else None
        return digest if isinstance(digest, str) else None
    except (ValueError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _open_verified(lib: Path) -> int | None:
    """A descriptor of `lib` whose bytes hash to the manifest's value, or None (then rebuild)."""
    digest = _recorded_hash(lib)
    if digest is None:
        return None
    fd = _open_private_file(lib)
    if fd is None:
        return None
    if hashlib.sha256(_read_fd(fd)).hexdigest() != digest:
        os.close(fd)
        return None
    return fd


def _write_atomic(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _compile(src: NativeSource, cc: str) -> bytes:
    """The library's bytes, built in a private temporary directory (``-march=native`` if it works)."""
    _, _, standard, suffix = _LANGUAGES[src.language]
    with tempfile.TemporaryDirectory(prefix="anynum-build-") as tmp:
        c_file = Path(tmp) / f"{src.name}{suffix}"
        c_file.write_text(src.source)
        out = Path(tmp) / f"{src.name}.so"
        base = [*cc.split(), *_BASE_FLAGS, standard, *src.flags, str(c_file), "-o", str(out)]
        base += [*src.libraries, "-lm"]
        try:  # the library is keyed by this CPU's features, so -march=native is safe
            subprocess.run([*base, "-march=native"], check=True, capture_output=True, timeout=300)
        except subprocess.CalledProcessError:  # a compiler without -march=native
            subprocess.run(base, check=True, capture_output=True, timeout=300)
        return out.read_bytes()


@contextlib.contextmanager
def _locked(lock_file: Path) -> Iterator[None]:
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        assert fcntl is not None  # cache_dir() is None where fcntl is missing
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _dlopen(fd: int, lib: Path) -> ctypes.CDLL:
    proc = Path(f"/proc/self/fd/{fd}")
    if sys.platform.startswith("linux") and proc.exists():
        return ctypes.CDLL(str(proc))  # the very file we checked and hashed
    # Elsewhere (macOS) load by path: the directory is verified private, so only this user
    # could have replaced the file since we hashed it.
    return ctypes.CDLL(str(lib))


def load(src: NativeSource) -> ctypes.CDLL | None:
    """`src` as a loaded library, built once per user and machine; None (with a one-time warning) if
    there is no compiler, the build fails, or the platform cannot check ownership.

    The library comes from the private cache (`cache_dir`) only after its hash
    matched the manifest written by this user's build; otherwise it is rebuilt.
    Results are cached per process.
    """
    with _LOCK:
        lock = _LOCKS.setdefault(src.name, threading.Lock())
    with lock:
        return _load(src)


def build_request(request: dict[str, Any]) -> None:
    """The detached builder's work: build one library into the cache, as `load` would, and exit.

    It checks the directory again (its own process could see another one), builds under the
    same lock and writes the same verified files; a library another process built meanwhile
    is left as it is. Any failure exits non-zero, and the process that asked builds it again
    itself, with the warning that says why.
    """
    source = request["source"]
    src = NativeSource(source["name"], source["source"], tuple(source["flags"]), source["language"],
                       tuple(source["libraries"]))
    lib = Path(request["library"])
    why = check_private_dir(lib.parent)
    if why is not None:
        raise SystemExit(why)
    os.close(_built(src, request["compiler"], lib))


def _after_fork() -> None:
    """A child starts with no build threads: locks they held would never be released."""
    global _LOCK
    _LOCK = threading.Lock()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@functools.cache
def _load(src: NativeSource) -> ctypes.CDLL | None:
    directory = cache_dir()
    if directory is None:
        return None
    cc = compiler(src.language)
    lib = library_path(src, directory)
    try:
        fd = _open_verified(lib)
        if fd is None:
            if cc is None:
                variable, names, _, _ = _LANGUAGES[src.language]
                raise FileNotFoundError(f"no {src.language} compiler found (${variable}, {', '.join(names)})")
            fd = _built(src, cc, lib)
        # The descriptor stays open for the life of the process: dlopen knows a library by its
        # path, and a reused /proc/self/fd/N would otherwise name an earlier library.
        try:
            loaded = _dlopen(fd, lib)
        except OSError:
            os.close(fd)
            raise
        _open_libraries.append(fd)
        return loaded
    except Exception as exc:  # no compiler, a failed build, an unloadable library
        _warn_once(
            f"build:{src.name}",
            f"anynum: could not build or load the native kernel {src.name!r} "
            f"({type(exc).__name__}: {exc}); using the pure-torch paths (set ANYNUM_COMPILE=0 to silence).",
        )
        return None


def _built(src: NativeSource, cc: str, lib: Path) -> int:
    """A verified descriptor of `lib`, which is built first (once, under its lock) where it must be."""
    fd = _open_verified(lib)
    if fd is None:
        with _locked(lib.with_suffix(".lock")):  # one builder at a time, across processes
            fd = _open_verified(lib)  # another process may have built it meanwhile
            if fd is None:
                data = _compile(src, cc)
                _write_atomic(lib, data)
                record = {"sha256": hashlib.sha256(data).hexdigest(), "name": src.name}
                _write_atomic(_manifest_path(lib), json.dumps(record).encode())
                fd = _open_verified(lib)
    if fd is None:
        raise OSError(f"{lib} did not verify right after it was built")
    return fd


# --- torch.compile's cache ---------------------------------------------------------------------


def inductor_cache_dir() -> Path:
    """Where Inductor (torch.compile) caches kernels: ``$TORCHINDUCTOR_CACHE_DIR``, else
    Inductor's default, ``<tempdir>/torchinductor_<user>``."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(os.path.abspath(configured))
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir())


def inductor_cache_unsafe() -> str | None:
    """Why Inductor's cache could hold code another user planted, or None when it is private.

    Inductor loads compiled libraries from its cache without checking who wrote them,
    and its default lives in the shared temporary directory under a name every user
    can predict. anynum compiles its own kernels only where this returns None; a
    directory that does not exist yet is judged by its parent (Inductor creates it,
    owned by this user).
    """
    if not hasattr(os, "getuid"):
        return "ownership cannot be checked on this platform"
    path = inductor_cache_dir()
    if not path.exists():
        parent = Path(os.path.realpath(path.parent))
        try:
            pst = os.stat(parent)
        except OSError as exc:
            return f"{parent} cannot be examined ({exc})"
        why = unsafe_reason(pst, ancestor=True)
        return None if why is None else f"{_describe(parent, pst)}: {why}"
    return check_private_dir(path)
