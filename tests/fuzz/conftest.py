"""The fuzz suite: every test here carries the ``fuzz`` marker, and the session ends with how many
examples each check ran (single process: in the terminal summary; any process: appended as a JSON
line to ``$ANYNUM_FUZZ_REPORT`` when set)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/fuzz/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.fuzz)


def _counts() -> dict[str, int]:
    import sys

    lib = sys.modules.get("fuzzlib")
    return dict(getattr(lib, "COUNTS", {}))


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("ANYNUM_FUZZ_REPORT")
    counts = _counts()
    if path and counts:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"pid": os.getpid(), "seed": os.environ.get("ANYNUM_FUZZ_SEED"), **counts}) + "\n"
            )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    counts = _counts()
    if counts:
        terminalreporter.write_line(
            "fuzz examples run: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
