"""mkdocs hook: render the doctest examples of docstrings (``>>>`` lines and their output) as code.

Google-style docstrings here carry their examples as plain doctest lines, which
Markdown would otherwise read as text (an output such as ``[1.0, 2.0]`` even as a
link). A Markdown preprocessor fences each run of doctest lines, up to the next
blank line, as a ``pycon`` code block; registered before the plugins configure
their Markdown, so the API reference (mkdocstrings) uses it too.
"""

from __future__ import annotations

from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor
from mkdocs.plugins import event_priority


class _FenceDoctests(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = False  # inside a ``` block already
        in_doctest = False
        indent = ""
        for line in lines:
            stripped = line.lstrip()
            if stripped.startswith("```"):
                fenced = not fenced
            if not fenced and not in_doctest and stripped.startswith(">>>"):
                indent = line[: len(line) - len(stripped)]
                out.append(f"{indent}```pycon")
                in_doctest = True
            elif in_doctest and not stripped:
                out.append(f"{indent}```")
                in_doctest = False
            out.append(line)
        if in_doctest:
            out.append(f"{indent}```")
        return out


class DoctestBlocks(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's API)
        md.preprocessors.register(_FenceDoctests(md), "anynum_doctest_blocks", 40)


@event_priority(100)  # before mkdocstrings copies the Markdown configuration
def on_config(config: Any) -> Any:
    config.markdown_extensions.append(DoctestBlocks())
    return config
