"""Study reports: a Pychop-Table-8-style table (score by format x rounding mode), CSV and a PNG heatmap.

Rows are the dicts `run_trial` returns. Each (mode, dataset, model) is one
block of the table and one panel of the heatmap, with formats down and
rounding modes across, and an ``Average`` row per block as in Pychop.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from typing import Any

from anynum.errors import InputError
from anynum.experiments.outdir import write_atomic
from anynum.rounding import Rounding

__all__ = [
    "ROUNDING_LABELS", "check_rows", "pivot", "render_table", "table_text", "write_csv", "write_heatmap"
]

#: Column headings, in the order columns appear.
ROUNDING_LABELS = {
    Rounding.NEAREST_EVEN.value: "Round to nearest",
    Rounding.NEAREST_AWAY.value: "Nearest (away)",
    Rounding.NEAREST_ZERO.value: "Nearest (to zero)",
    Rounding.UP.value: "Round up",
    Rounding.DOWN.value: "Round down",
    Rounding.TOWARD_ZERO.value: "Toward zero",
    Rounding.ODD.value: "Round to odd",
    Rounding.STOCHASTIC.value: "Stochastic",
    Rounding.STOCHASTIC_UNIFORM.value: "Stochastic (uniform)",
}

Block = tuple[str, str, str, str]  # mode, dataset, model, metric
CSV_COLUMNS = (
    "trial_id", "mode", "dataset", "model", "format", "rounding", "metric", "score", "baseline_score",
    "delta", "seed", "seconds",
)


_ROW_KEYS = ("mode", "dataset", "model", "metric", "format", "rounding", "score")


def check_rows(rows: Any) -> None:
    """InputError unless `rows` is a list of result rows (dicts with the keys a report reads)."""
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"a report takes a list of result rows (dicts), got {type(rows).__name__}.")
    for r in rows:
        missing = [k for k in _ROW_KEYS if k not in r]
        if missing:
            raise InputError(f"a result row lacks {missing}: {str(r)[:80]}")


def pivot(rows: Sequence[dict[str, Any]]) -> dict[Block, dict[str, dict[str, float | None]]]:
    """``{(mode, dataset, model, metric): {format: {rounding: score}}}`` in first-seen order.

    >>> rows = [{"mode": "ptq", "dataset": "d", "model": "m", "metric": "accuracy",
    ...          "format": "e2m1", "rounding": "rz", "score": 50.0}]
    >>> pivot(rows)
    {('ptq', 'd', 'm', 'accuracy'): {'e2m1': {'rz': 50.0}}}
    """
    check_rows(rows)
    out: dict[Block, dict[str, dict[str, float | None]]] = {}
    for r in rows:
        block = (r["mode"], r["dataset"], r["model"], r["metric"])
        out.setdefault(block, {}).setdefault(r["format"], {})[r["rounding"]] = r["score"]
    return out


def _columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    present = {r["rounding"] for r in rows}
    return [m for m in ROUNDING_LABELS if m in present]


def _cell(v: float | None) -> str:
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _average(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _table_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[list[str]]]]:
    check_rows(rows)
    cols = _columns(rows)
    blocks = []
    for (mode, dataset, model, metric), fmts in pivot(rows).items():
        label = f"{mode.upper()} {dataset}/{model}" + ("" if metric == "accuracy" else f" ({metric})")
        lines = []
        for i, (fmt, scores) in enumerate(fmts.items()):
            cells = [_cell(scores[c]) if c in scores else "" for c in cols]
            lines.append([label if i == 0 else "", fmt, *cells])
        avg = [_average([s.get(c) for s in fmts.values() if c in s]) for c in cols]
        lines.append(["", "Average"] + [_cell(a) if any(c in s for s in fmts.values()) else ""
                                         for a, c in zip(avg, cols)])
        blocks.append(lines)
    return ["Study", "Format"] + [ROUNDING_LABELS[c] for c in cols], blocks


def table_text(rows: Sequence[dict[str, Any]]) -> str:
    """The table as GitHub markdown (what `render_table` shows, without rich).

    >>> rows = [{"mode": "ptq", "dataset": "digits", "model": "mlp", "metric": "accuracy",
    ...          "format": "e2m1", "rounding": r, "score": s} for r, s in (("nearest", 80.0), ("rz", 20.0))]
    >>> print(table_text(rows))
    | Study | Format | Round to nearest | Toward zero |
    |---|---|---|---|
    | PTQ digits/mlp | e2m1 | 80.00 | 20.00 |
    |  | Average | 80.00 | 20.00 |
    """
    header, blocks = _table_rows(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for block in blocks:
        lines += ["| " + " | ".join(r) + " |" for r in block]
    return "\n".join(lines)


def render_table(rows: Sequence[dict[str, Any]], title: str = "Score by format and rounding mode") -> Any:
    """A `rich.table.Table` of the rows (needs rich: the ``cli`` extra).

    >>> rows = [{"mode": "qat", "dataset": "digits", "model": "cnn", "metric": "accuracy",
    ...          "format": "bf16", "rounding": "sr", "score": 97.0}]
    >>> render_table(rows).row_count
    2
    """
    from rich.table import Table

    header, blocks = _table_rows(rows)
    table = Table(title=title, title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i < 2 else "right", no_wrap=i < 2)
    for k, block in enumerate(blocks):
        if k:
            table.add_section()
        for j, r in enumerate(block):
            table.add_row(*r, style="bold" if j == len(block) - 1 else None)
    return table


def write_csv(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """One line per trial: ids, config, score, fp32 baseline score and their difference.

    >>> import tempfile, pathlib
    >>> rows = [{"trial_id": "t", "mode": "ptq", "dataset": "d", "model": "m", "format": "e2m1",
    ...          "rounding": "rz", "metric": "accuracy", "score": 50.0, "baseline_score": 90.0,
    ...          "seed": 0, "seconds": 0.1}]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_csv(rows, pathlib.Path(d) / "r.csv")
    ...     print((pathlib.Path(d) / "r.csv").read_text().splitlines()[1])
    t,ptq,d,m,e2m1,rz,accuracy,50.0,90.0,-40.0,0,0.1
    """
    check_rows(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        s, b = r.get("score"), r.get("baseline_score")
        w.writerow({**r, "delta": None if s is None or b is None else round(s - b, 6)})
    write_atomic(path, buf.getvalue())


_SHORT = {"nearest": "RN", "rna": "RNA", "rnz": "RNZ", "ru": "RU", "rd": "RD", "rz": "RZ", "ro": "RO",
          "sr": "SR", "sr_uniform": "SRU"}


def write_heatmap(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """A PNG: one panel per (mode, dataset, model), formats down, rounding modes across, score annotated.

    >>> import tempfile, pathlib
    >>> rows = [{"mode": "ptq", "dataset": "d", "model": "m", "metric": "accuracy",
    ...          "format": f, "rounding": "nearest", "score": s} for f, s in (("bf16", 97.0), ("e2m1", 60.0))]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_heatmap(rows, pathlib.Path(d) / "h.png")
    ...     (pathlib.Path(d) / "h.png").stat().st_size > 1000
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    blocks = pivot(rows)
    cols = _columns(rows)
    n = max(len(blocks), 1)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    max_formats = max((len(f) for f in blocks.values()), default=1)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(1.0 + (0.6 * len(cols) + 1.6) * ncols, 1.0 + (0.3 * max_formats + 0.6) * nrows),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for ax, ((mode, dataset, model, metric), fmts) in zip(axes.flat, blocks.items()):
        names = list(fmts)
        grid = np.full((len(names), len(cols)), np.nan)
        for i, f in enumerate(names):
            for j, c in enumerate(cols):
                v = fmts[f].get(c)
                if v is not None:
                    grid[i, j] = v
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0.0, vmax=100.0, aspect="auto")
        for i in range(len(names)):
            for j in range(len(cols)):
                if not np.isnan(grid[i, j]):
                    v = grid[i, j]
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                            color="black" if v > 60 else "white")
        ax.set_xticks(range(len(cols)), [_SHORT.get(c, c) for c in cols], fontsize=8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{mode.upper()} {dataset}/{model} ({'accuracy' if metric == 'accuracy' else 'R^2'} %)",
                     fontsize=9)
    for ax in list(axes.flat)[len(blocks):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="score (%)")
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, png.getvalue())
