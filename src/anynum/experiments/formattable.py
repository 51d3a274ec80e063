"""The properties of formats as rows and tables (``anynum formats``, ``anynum info``)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from anynum.formats import format as lookup_format
from anynum.formats import list_formats
from anynum.formats.base import Format

__all__ = ["cell_text", "format_rows", "render_rows"]

_COLUMNS = ("name", "bits", "max", "smallest_normal", "smallest_subnormal", "eps", "specials", "overflow")


def _specials(fmt: Format) -> str:
    parts = []
    if fmt.has_inf:
        parts.append("inf")
    if fmt.has_nan:
        parts.append("nan")
    if fmt.has_negative_zero:
        parts.append("-0")
    if not fmt.signed:
        parts.append("unsigned")
    return ",".join(parts) or "-"


def format_rows(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One dict of properties per format name (default: every preset).

    >>> format_rows(["e4m3fn"])[0]["max"]
    448.0
    """
    rows = []
    for name in names if names is not None else list_formats():
        fmt = lookup_format(name)
        rows.append(
            {
                "name": name,
                "bits": fmt.bits,
                "max": fmt.max,
                "smallest_normal": fmt.smallest_normal,
                "smallest_subnormal": fmt.smallest_subnormal,
                "eps": fmt.eps,
                "specials": _specials(fmt),
                "overflow": fmt.default_overflow,
            }
        )
    return rows


def cell_text(v: Any) -> str:
    """A table cell: floats to 6 significant digits, anything else as str.

    >>> cell_text(448.0), cell_text(0.1 + 0.2), cell_text("nan")
    ('448', '0.3', 'nan')
    """
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def render_rows(rows: list[dict[str, Any]], kind: str) -> str:
    """`format_rows` as a markdown table (kind "markdown"), CSV ("csv") or JSON ("json").

    >>> print(render_rows(format_rows(["e2m1"]), "markdown").splitlines()[2])
    | e2m1 | 4 | 6 | 1 | 0.5 | 0.5 | -0 | saturate |
    """
    if kind == "json":
        return json.dumps(rows, indent=2)
    if kind == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    header = "| " + " | ".join(_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    lines = [header, rule]
    lines += ["| " + " | ".join(cell_text(r[c]) for c in _COLUMNS) + " |" for r in rows]
    return "\n".join(lines)
