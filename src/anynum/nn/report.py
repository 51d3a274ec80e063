"""`DiagnoseReport`: the rows and suggestions of `anynum.nn.diagnose`, as tables, CSV/JSON and PNGs.

The table has one row per (layer, category) with the columns of `COLUMNS`; the PNGs
are a heatmap (rows x metrics, coloured by how bad each value is) and histograms of
log2|x| drawn against the format's range (subnormals, normals, flush threshold,
overflow), the picture practitioners draw by hand. rich and matplotlib are imported
only when a table or a figure is asked for.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from anynum.nn.observe import category_rank

__all__ = ["COLUMNS", "DiagnoseReport", "Suggestion", "cell"]

#: (key, heading) of the table columns, in order.
COLUMNS = (
    ("layer", "layer"),
    ("category", "category"),
    ("format", "format"),
    ("max_abs", "max|x|"),
    ("format_max", "fmt max"),
    ("overflow", "overflow"),
    ("underflow", "underflow"),
    ("subnormal", "subnormal"),
    ("sqnr_db", "SQNR dB"),
    ("rel_err", "rel err"),
    ("stagnation", "stagnant"),
    ("lost", "lost"),
    ("sr_rel_var", "SR var"),
)
_FRACTIONS = {"overflow", "underflow", "subnormal", "stagnation", "lost"}
#: Columns of the CSV file (the table's, plus counts and the rounding mode).
CSV_COLUMNS = (
    "layer",
    "category",
    "format",
    "rounding",
    "count",
    "nonzero",
    "nan",
    "max_abs",
    "format_max",
    "overflow",
    "underflow",
    "subnormal",
    "sqnr_db",
    "rel_err",
    "stagnation",
    "lost",
    "sr_rel_var",
)


def cell(key: str, value: Any) -> str:
    """One table cell: fractions in percent, floats to 3-4 significant digits, None as "-".

    >>> cell("underflow", 0.2345), cell("sqnr_db", 31.46), cell("max_abs", 448.0), cell("lost", None)
    ('23.4%', '31.5', '448', '-')
    """
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if key in _FRACTIONS:
        return "0" if value == 0 else f"{100 * value:.3g}%"
    if key == "sqnr_db":
        return f"{value:.1f}" if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _json_value(v: Any) -> Any:
    """JSON has no inf/NaN: +-inf become the strings "inf"/"-inf", NaN becomes null."""
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    return v


@dataclass
class Suggestion:
    """One suggestion: `kind` is "loss_scale", "keep", "stagnation", "format" or "note"; `value` is
    the number or format it proposes (the loss scale, a format name, a fraction).

    >>> str(Suggestion("loss_scale", "loss scale 2^8 (256)", value=256.0))
    'loss scale 2^8 (256)'
    """

    kind: str
    message: str
    layer: str | None = None
    category: str | None = None
    value: Any = None

    def __str__(self) -> str:
        return self.message


@dataclass
class DiagnoseReport:
    """What `anynum.nn.diagnose` found: ``rows`` (one dict per (layer, category), keys as in
    `anynum.nn.stats` plus layer, category, format, rounding) and ``suggestions``.

    ``str(report)`` is a markdown table followed by the suggestions; `rich_table`,
    `to_csv`, `to_json`, `plot_heatmap` and `plot_histograms` give the other forms.

    >>> rep = DiagnoseReport(rows=[{"layer": "fc", "category": "weight", "format": "e2m1",
    ...     "max_abs": 3.0, "format_max": 6.0, "overflow": 0.0, "underflow": 0.25, "subnormal": 0.0,
    ...     "sqnr_db": 14.2, "rel_err": 0.1, "stagnation": None, "lost": None, "sr_rel_var": None}],
    ...     suggestions=[Suggestion("note", "fine")], steps=1)
    >>> print(rep.table_text().splitlines()[2])
    | fc | weight | e2m1 | 3 | 6 | 0 | 25% | 0 | 14.2 | 0.1 | - | - | - |
    """

    rows: list[dict[str, Any]]
    suggestions: list[Suggestion]
    steps: int
    losses: list[float] = field(default_factory=list)
    loss_scale: float = 1.0
    min_sqnr: float = 20.0
    underflow_target: float = 0.01

    def row(self, layer: str, category: str) -> dict[str, Any]:
        """The row of (layer, category); KeyError names the rows there are."""
        for r in self.rows:
            if r["layer"] == layer and r["category"] == category:
                return r
        have = ", ".join(f"{r['layer']}/{r['category']}" for r in self.rows)
        raise KeyError(f"no row for layer {layer!r}, category {category!r}; the rows are {have}")

    @property
    def suggested_loss_scale(self) -> float | None:
        """The loss scale the report suggests (None when it suggests none)."""
        for s in self.suggestions:
            if s.kind == "loss_scale":
                return float(s.value)
        return None

    @property
    def layers_to_keep(self) -> list[str]:
        """Layers the report suggests keeping in higher precision."""
        return [s.layer for s in self.suggestions if s.kind == "keep" and s.layer is not None]

    # --- text ---------------------------------------------------------------------------------
    def table_text(self) -> str:
        """The rows as a GitHub markdown table."""
        lines = [
            "| " + " | ".join(h for _, h in COLUMNS) + " |",
            "|" + "|".join("---" for _ in COLUMNS) + "|",
        ]
        for r in self.rows:
            lines.append("| " + " | ".join(cell(k, r.get(k)) for k, _ in COLUMNS) + " |")
        return "\n".join(lines)

    def __str__(self) -> str:
        text = [f"anynum diagnose: {self.steps} steps, {len(self.rows)} rows", "", self.table_text(), ""]
        text += [f"- {s}" for s in self.suggestions]
        return "\n".join(text)

    def rich_table(self, title: str | None = None) -> Any:
        """A `rich.table.Table` of the rows (needs rich: the ``cli`` extra); bad cells in red."""
        from rich.table import Table

        table = Table(title=title or f"anynum diagnose: {self.steps} steps", title_justify="left")
        for i, (_, heading) in enumerate(COLUMNS):
            table.add_column(heading, justify="left" if i < 3 else "right", no_wrap=i < 3)
        previous = None
        for r in self.rows:
            if previous is not None and r["layer"] != previous:
                table.add_section()
            previous = r["layer"]
            table.add_row(*(self._styled(k, r) for k, _ in COLUMNS))
        return table

    def _styled(self, key: str, row: dict[str, Any]) -> str:
        text = cell(key, row.get(key))
        v = row.get(key)
        bad = (
            (key in ("overflow", "underflow") and v is not None and v > self.underflow_target)
            or (key == "sqnr_db" and v is not None and v < self.min_sqnr)
            or (key == "stagnation" and v is not None and v > 0.1)
        )
        return f"[red]{text}[/red]" if bad else text

    # --- files --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (inf as "inf", NaN as null)."""
        return _json_value(
            {
                "steps": self.steps,
                "losses": self.losses,
                "loss_scale": self.loss_scale,
                "min_sqnr": self.min_sqnr,
                "underflow_target": self.underflow_target,
                "rows": self.rows,
                "suggestions": [asdict(s) for s in self.suggestions],
            }
        )

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The report as JSON text (also written to `path` if given)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        return text

    def to_csv(self, path: str | os.PathLike[str] | None = None) -> str:
        """One CSV line per row (`CSV_COLUMNS`; fractions as fractions, not percent)."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in self.rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})
        if path is not None:
            with open(path, "w", encoding="utf-8", newline="") as fh:
                fh.write(buf.getvalue())
        return buf.getvalue()

    # --- figures ------------------------------------------------------------------------------
    def _badness(self, key: str, v: Any) -> float:
        """0 (fine) .. 1 (bad): overflow, underflow and SR variance saturate at 10 %, relative error at
        25 %, SQNR at 0 dB (fine from 2 x min_sqnr); subnormal, stagnant and lost count linearly
        (subnormals lose precision, not values)."""
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return math.nan
        if key == "sqnr_db":
            return min(max(1.0 - v / (2 * self.min_sqnr), 0.0), 1.0) if self.min_sqnr > 0 else 0.0
        gain = {"rel_err": 4.0, "subnormal": 1.0, "stagnation": 1.0, "lost": 1.0}.get(key, 10.0)
        return min(max(gain * v, 0.0), 1.0)

    def plot_heatmap(self, path: str | os.PathLike[str]) -> None:
        """PNG: (layer, category) down, metrics across, coloured by how bad each value is, annotated."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        keys = [k for k, _ in COLUMNS[5:] if any(r.get(k) is not None for r in self.rows)]
        heads = dict(COLUMNS)
        grid = np.array([[self._badness(k, r.get(k)) for k in keys] for r in self.rows], dtype=float)
        fig, ax = plt.subplots(
            figsize=(1.6 + 1.0 * len(keys), 1.2 + 0.32 * len(self.rows)), layout="constrained"
        )
        image = ax.imshow(
            np.ma.masked_invalid(grid.reshape(len(self.rows), len(keys))),
            cmap="Reds",
            vmin=0.0,
            vmax=1.0,
            aspect="auto",
        )
        for i, r in enumerate(self.rows):
            for j, k in enumerate(keys):
                if r.get(k) is not None:
                    ax.text(
                        j,
                        i,
                        cell(k, r[k]),
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if grid[i, j] > 0.6 else "black",
                    )
        ax.set_xticks(range(len(keys)), [heads[k] for k in keys], fontsize=8)
        ax.set_yticks(
            range(len(self.rows)),
            [f"{r['layer']} {r['category']} ({r['format']})" for r in self.rows],
            fontsize=7,
        )
        ax.set_title(f"anynum diagnose: {self.steps} steps (red: worse)", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.6, label="badness")
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def plot_histograms(self, path: str | os.PathLike[str]) -> None:
        """PNG: per (layer, category), the histogram of log2|x| over the format's range.

        Green: normal range; yellow: subnormals; red: beyond the largest value; the dashed
        line is where round to nearest flushes to zero. Update rows are left out (their
        values are steps, not numbers in the format).
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r["category"] != "update" and r.get("log2_hist")]
        layers = list(dict.fromkeys(r["layer"] for r in rows))
        cats = sorted(dict.fromkeys(r["category"] for r in rows), key=lambda c: (category_rank(c), c))
        fig, axes = plt.subplots(
            max(len(layers), 1),
            max(len(cats), 1),
            squeeze=False,
            figsize=(2.6 * max(len(cats), 1), 1.9 * max(len(layers), 1)),
            layout="constrained",
        )
        for ax in axes.flat:
            ax.axis("off")
        for r in rows:
            ax = axes[layers.index(r["layer"])][cats.index(r["category"])]
            ax.axis("on")
            hist = {int(e): c for e, c in r["log2_hist"].items()}
            es = sorted(hist)
            top = math.log2(r["format_max"]) if r["format_max"] > 0 else 0.0
            tiny = math.log2(r["smallest_subnormal"]) if r["smallest_subnormal"] > 0 else min(es)
            lo = min(es[0], math.floor(tiny)) - 2
            hi = max(es[-1] + 1, math.ceil(top)) + 2
            ax.axvspan(tiny, top, color="tab:green", alpha=0.12, lw=0)
            if r.get("smallest_normal"):
                ax.axvspan(tiny, math.log2(r["smallest_normal"]), color="gold", alpha=0.25, lw=0)
                ax.axvline(tiny - 1, color="tab:red", ls="--", lw=0.8)
            ax.axvspan(top, hi, color="tab:red", alpha=0.12, lw=0)
            ax.bar([e + 0.5 for e in es], [hist[e] for e in es], width=0.9, color="tab:blue")
            ax.set_xlim(lo, hi)
            ax.tick_params(labelsize=6)
            ax.set_title(
                f"{r['layer']} {r['category']} ({r['format']}): "
                f"{cell('underflow', r.get('underflow'))} flushed",
                fontsize=7,
            )
        fig.supxlabel("log2 |x|", fontsize=8)
        fig.savefig(path, dpi=110)
        plt.close(fig)
