"""Importing the peers (QPyTorch, Qtorch+, Pychop, ...) for comparisons and benchmarks."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["import_peer", "peer_extensions"]


@contextlib.contextmanager
def peer_extensions(module: str) -> Iterator[None]:
    """Inside, a peer package builds its torch C++ extension in a directory of its own.

    QPyTorch and Qtorch+ both build an extension named "quant_cpu" into torch's default
    extensions directory, where each build replaces the other's: importing the first again
    then loads the second's library (whose block_quantize differs). Keyed by the top-level
    package of `module`; other modules are imported as they are.

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
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(before or get_default_build_root(), package)
    try:
        yield
    finally:
        if before is None:
            del os.environ["TORCH_EXTENSIONS_DIR"]
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = before


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
