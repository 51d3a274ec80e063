"""The environment switches of the kernels, read cheaply on every call.

``ANYNUM_COMPILE``: "0" keeps every call on the eager reference (no C loops, no
compiled kernels), "1" compiles for every size, unset or anything else ("auto")
lets the router pick by size. ``ANYNUM_COMPILE_MIN``: the size (elements) from
which "auto" compiles, default 262144.

>>> compile_mode() in ("0", "1", "auto")
True
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["Setting", "compile_min", "compile_mode", "compiles_at"]

_DEFAULT_MIN_ELEMENTS = 1 << 18


class Setting:
    """An environment variable, parsed once per value it takes.

    Rounding calls in a training loop read the switches many times per step;
    ``os.environ.get`` costs several Python frames each time, a read here is one lookup
    in the environment mapping's own dict (which ``os.environ[...] = ...`` and
    ``monkeypatch.setenv`` update), so changes still take effect at once.
    """

    def __init__(self, name: str, parse: Callable[[str | None], Any]) -> None:
        self.name, self.parse = name, parse
        self.data: dict[Any, Any] | None = getattr(os.environ, "_data", None)
        encodekey = getattr(os.environ, "encodekey", None)
        self.key = encodekey(name) if encodekey is not None else name
        self.raw: object = object()  # no value read yet
        self.value: Any = None

    def __call__(self) -> Any:
        raw = self.data.get(self.key) if self.data is not None else os.environ.get(self.name)
        if raw != self.raw:
            self.value = self.parse(os.environ.get(self.name))
            self.raw = raw
        return self.value


def _parse_mode(value: str | None) -> str:
    value = (value or "auto").strip().lower()
    return value if value in ("0", "1") else "auto"


_COMPILE_MODE = Setting("ANYNUM_COMPILE", _parse_mode)
_COMPILE_MIN = Setting("ANYNUM_COMPILE_MIN", lambda v: _DEFAULT_MIN_ELEMENTS if v is None else int(v))


def compile_mode() -> str:
    """'0' (never), '1' (always) or 'auto', from the ANYNUM_COMPILE environment variable."""
    mode: str = _COMPILE_MODE()
    return mode


def compile_min() -> int:
    """The size from which "auto" compiles: ``ANYNUM_COMPILE_MIN`` elements (default 262144)."""
    elements: int = _COMPILE_MIN()
    return elements


def compiles_at(numel: int) -> bool:
    """Whether a call of `numel` elements is one the compiled kernels take (by the switches alone).

    >>> compiles_at(10) == (compile_mode() == "1")
    True
    """
    mode = compile_mode()
    return mode == "1" or (mode == "auto" and numel >= compile_min())
