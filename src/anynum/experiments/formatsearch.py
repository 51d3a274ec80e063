"""The work behind ``anynum search``: `anynum.nn.search` on a trained fp32 model, scored on the test set."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

import anynum as an
from anynum.experiments.setup import ProgressBar, have_matplotlib, make_setup, trained_model, write_files
from anynum.experiments.training import batches, evaluate, trial_environment
from anynum.nn.search import check_arguments

__all__ = ["SearchSpec", "run_search", "write_search"]


@dataclass
class SearchSpec:
    """Everything ``anynum search`` was asked (see `run_search`)."""

    formats: list[str]
    dataset: str | None = "digits"
    model: str | None = "mlp"
    data_file: str | None = None
    model_file: str | None = None
    trust_pickle: bool = False
    tolerance: float = 0.5
    budget: int | None = None
    sensitivity: str = "sqnr"
    categories: list[str] = field(default_factory=lambda: ["weight", "activation"])
    rounding: str = "nearest"
    epochs: int = 10
    lr: float | None = None
    batch: int = 32
    seed: int = 0
    steps: int = 10


def run_search(
    spec: SearchSpec, *, cache_dir: str | None = None, progress: bool = False
) -> tuple[an.nn.SearchResult, str]:
    """Run ``anynum search``; returns the result and a label of what was searched.

    >>> res, label = run_search(SearchSpec(["e2m1", "e4m3fn"], dataset="sequence", epochs=1, tolerance=2))
    >>> label, res.verified
    ('sequence/mlp', True)
    """
    check_arguments(spec.formats, spec.tolerance, spec.budget, spec.categories, spec.sensitivity)
    setup = make_setup(spec.dataset, spec.model, spec.data_file, spec.model_file, spec.trust_pickle)
    bar = ProgressBar(spec.budget, "eval", progress)

    def score(model: nn.Module) -> float:
        bar.tick()
        return evaluate(model, setup.data)

    try:
        with trial_environment():
            model = trained_model(
                spec.epochs, spec.lr, spec.batch, spec.model, setup, spec.seed, cache_dir, lambda *_: None
            )
            data = batches(setup.data.x_train, setup.data.y_train, spec.batch, spec.seed + 1)
            first: Sequence[Any] = [b for _, b in zip(range(spec.steps), data)]
            result = an.nn.search(
                model,
                first,
                score,
                formats=spec.formats,
                tolerance=spec.tolerance,
                budget=spec.budget,
                categories=spec.categories,
                sensitivity=spec.sensitivity,
                rounding=spec.rounding,
                layers=setup.include,
            )
    finally:
        bar.close()
    return result, setup.label


def write_search(result: an.nn.SearchResult, out: str | Path, command: str = "") -> list[Path]:
    """search.json, table.md and search.png under `out`; returns the paths.

    >>> import tempfile
    >>> res, _ = run_search(SearchSpec(["e4m3fn"], dataset="sequence", epochs=1, tolerance=5))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     sorted(p.name for p in write_search(res, d))
    ['search.json', 'search.png', 'table.md']
    """
    import json

    files: dict[str, Callable[[Path], object]] = {
        "search.json": lambda p: p.write_text(
            json.dumps({"command": command, **result.to_dict()}, indent=1, allow_nan=False) + "\n",
            encoding="utf-8",
        ),
        "table.md": lambda p: p.write_text(
            (f"{command}\n\n" if command else "") + result.table_text() + "\n", encoding="utf-8"
        ),
    }
    if have_matplotlib():
        files["search.png"] = result.plot
    return write_files(Path(out), files)
