"""Tables and the figure of a fault study: accuracy against bit error rate, per format and field."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from anynum.errors import AnynumError

__all__ = ["summarize", "table_markdown", "write_fault_plot", "write_fault_report"]


Stats = dict[tuple[str, str], dict[float, tuple[float, float, float, int]]]


def summarize(rows: Sequence[dict[str, Any]]) -> Stats:
    """``{(format, field): {ber: (mean, min, max, repeats)}}`` of the scores (NaN scores count as 0).

    >>> rows = [{"format": "e4m3fn", "field": "any", "ber": 0.01, "score": s} for s in (80.0, 90.0)]
    >>> summarize(rows)[("e4m3fn", "any")][0.01]
    (85.0, 80.0, 90.0, 2)
    """
    groups: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        score = r.get("score")
        groups[(r["format"], r["field"])][float(r["ber"])].append(0.0 if score is None else float(score))
    return {
        key: {ber: (sum(v) / len(v), min(v), max(v), len(v)) for ber, v in sorted(by_ber.items())}
        for key, by_ber in groups.items()
    }


def _baselines(rows: Sequence[dict[str, Any]]) -> tuple[float | None, dict[str, float]]:
    base = next((r["baseline_score"] for r in rows if r.get("baseline_score") is not None), None)
    clean: dict[str, float] = {}
    for r in rows:
        if r.get("clean_score") is not None:
            clean[r["format"]] = float(r["clean_score"])
    return base, clean


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table: one row per (format, field), one column per bit error rate (mean accuracy, %).

    >>> rows = [{"format": "int8", "field": "any", "ber": b, "score": s, "clean_score": 97.0,
    ...          "baseline_score": 97.5} for b, s in ((1e-4, 96.0), (1e-2, 40.0))]
    >>> print(table_markdown(rows))
    fp32 baseline: 97.5%
    <BLANKLINE>
    | format | field | no faults | 0.0001 | 0.01 |
    |---|---|---|---|---|
    | int8 | any | 97.0 | 96.0 | 40.0 |
    """
    stats = summarize(rows)
    bers = sorted({b for by_ber in stats.values() for b in by_ber})
    base, clean = _baselines(rows)
    lines = []
    if base is not None:
        lines += [f"fp32 baseline: {base:.1f}%", ""]
    lines.append("| format | field | no faults | " + " | ".join(f"{b:g}" for b in bers) + " |")
    lines.append("|" + "---|" * (3 + len(bers)))
    for (fmt, field), by_ber in stats.items():
        cells = [f"{by_ber[b][0]:.1f}" if b in by_ber else "" for b in bers]
        c = clean.get(fmt)
        lines.append(f"| {fmt} | {field} | {'' if c is None else f'{c:.1f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_fault_plot(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Accuracy against bit error rate (log scale): all bits of every format, then each format by field.

    Lines are means over repeats, bands span their minimum and maximum; the dashed
    line is the fp32 baseline. Needs matplotlib.

    >>> import tempfile, os
    >>> rows = [{"format": "int8", "field": f, "ber": b, "score": 90.0, "baseline_score": 95.0}
    ...         for f in ("any", "sign") for b in (1e-4, 1e-3)]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_fault_plot(rows, os.path.join(d, "f.png"))
    ...     os.path.getsize(os.path.join(d, "f.png")) > 1000
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarize(rows)
    formats = list(dict.fromkeys(f for f, _ in stats))
    base, _ = _baselines(rows)
    panels = 1 + len(formats)
    cols = min(panels, 3)
    rows_n = -(-panels // cols)
    fig, grid = plt.subplots(rows_n, cols, figsize=(4.4 * cols, 3.4 * rows_n), sharey=True, squeeze=False)
    flat = [ax for row in grid for ax in row]
    for ax in flat[panels:]:
        ax.set_visible(False)
    axes = flat[:panels]

    def draw(ax: Any, key: tuple[str, str], label: str) -> None:
        by_ber = stats[key]
        bers = list(by_ber)
        mean = [by_ber[b][0] for b in bers]
        ax.plot(bers, mean, marker="o", ms=3, label=label)
        ax.fill_between(bers, [by_ber[b][1] for b in bers], [by_ber[b][2] for b in bers], alpha=0.15)

    for fmt in formats:
        if (fmt, "any") in stats:
            draw(axes[0], (fmt, "any"), fmt)
    axes[0].set_title("every bit")
    for ax, fmt in zip(axes[1:], formats):
        for f, field in stats:
            if f == fmt:
                draw(ax, (f, field), field)
        ax.set_title(fmt)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("bit error rate")
        if base is not None:
            ax.axhline(base, color="gray", ls="--", lw=0.8)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for row in grid:
        row[0].set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_fault_report(rows: Sequence[dict[str, Any]], out_dir: str | os.PathLike[str],
                       title: str) -> tuple[str, list[Path]]:
    """Write ``table.md`` (and ``faults.png`` when matplotlib is there) beside the results; returns
    the table text and the paths of results.jsonl and what was written.

    >>> import tempfile
    >>> rows = [{"format": "int8", "field": "any", "ber": 0.01, "score": 90.0}]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     text, written = write_fault_report(rows, d, "demo")
    >>> [p.name for p in written][:2], text.splitlines()[0]
    (['results.jsonl', 'table.md'], '| format | field | no faults | 0.01 |')
    """
    out = Path(out_dir)
    text = table_markdown(rows)
    written = [out / "results.jsonl"]
    try:
        (out / "table.md").write_text(f"{title}\n\n{text}\n", encoding="utf-8")
        written.append(out / "table.md")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: no figure (pip install 'anynum[cli]')", file=sys.stderr)
        else:
            write_fault_plot(rows, out / "faults.png")
            written.append(out / "faults.png")
    except OSError as exc:
        raise AnynumError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    return text, written
