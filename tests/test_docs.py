"""Docs that cannot rot: every ```python block of README.md and docs/*.md runs.

Each page runs as one script, its blocks in order, in a fresh interpreter inside a
temporary directory (so files an example writes land there). A page must define
what it uses. Blocks meant as text use ```text, ```bash or ```pycon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Every tutorial page (the API reference pages under docs/reference/ are generated from docstrings,
#: whose examples run as doctests).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python blocks of a Markdown page, in order."""
    return [m.group(1) for m in _BLOCK.finditer(text)]


def test_block_extraction() -> None:
    page = "x\n```python\na = 1\n```\ntext\n```bash\nls\n```\n```python title\nb = a\n```\n"
    assert python_blocks(page) == ["a = 1\n", "b = a\n"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} has no runnable example: the pages teach by examples"
    script = "\n".join(
        f"# --- block {i + 1} of {page.name}\n{block}" for i, block in enumerate(blocks)
    )
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{page.name} examples failed:\n{result.stderr[-4000:]}"
