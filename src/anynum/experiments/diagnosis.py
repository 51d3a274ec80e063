"""The work behind ``anynum diagnose``: QAT or PTQ runs watched by `anynum.nn.observe`, and their outputs.

In QAT mode the model is trained from its seeded initialisation with the policy's numbers
and a `QuantizedOptimizer` (the studies' SGD, momentum 0.9); every step of the first seed
is watched, and the test score of every seed is reported next to the same training in
fp32. In PTQ mode a trained fp32 model (the cached study baseline, or ``--model-file``)
is rounded and one pass over the test set is watched. Runs use one thread and the eager
kernels, as study trials do, so the figures are reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

import anynum as an
from anynum.errors import InputError
from anynum.experiments.setup import (
    ProgressBar,
    Setup,
    have_matplotlib,
    make_setup,
    trained_model,
    write_files,
)
from anynum.experiments.training import evaluate, fit, sgd, trial_environment
from anynum.experiments.trials import DEFAULT_LR
from anynum.nn.diagnose import report_from
from anynum.nn.report import DiagnoseReport

__all__ = ["DiagnoseOutcome", "DiagnoseSpec", "run_diagnose", "write_diagnose"]


@dataclass
class DiagnoseSpec:
    """Everything ``anynum diagnose`` was asked (see docs/diagnose.md).

    >>> DiagnoseSpec(weight="e4m3fn").policy(None, 0).weight
    'e4m3fn'
    """

    dataset: str | None = "digits"
    model: str | None = "mlp"
    data_file: str | None = None
    model_file: str | None = None
    trust_pickle: bool = False
    mode: str = "qat"
    weight: str | None = None
    activation: str | None = None
    error: str | None = None
    grad: str | None = None
    momentum: str | None = None
    opt_weight: str | None = None
    accumulator: str | None = None
    rounding: str = "nearest"
    grad_scale: float | str = 1.0
    epochs: int = 10
    lr: float | None = None
    batch: int = 32
    seeds: list[int] = field(default_factory=lambda: [0])
    candidates: list[str] = field(default_factory=list)
    min_sqnr: float = 20.0
    underflow_target: float = 0.01

    def policy(self, include: tuple[Any, ...] | None, seed: int) -> an.nn.Policy:
        extra: dict[str, Any] = {} if include is None else {"include": include}
        return an.nn.Policy(
            weight=self.weight,
            activation=self.activation,
            error=self.error,
            rounding=self.rounding,
            seed=seed,
            **extra,
        )

    def optimizer(self, model: nn.Module, lr: float, seed: int) -> Any:
        return an.optim.QuantizedOptimizer(
            sgd(model, lr),
            weight=self.opt_weight,
            grad=self.grad,
            momentum=self.momentum,
            accumulator=self.accumulator,
            rounding=self.rounding,
            grad_scale=self.grad_scale,
            seed=seed,
        )

    def check(self) -> None:
        if self.mode not in ("qat", "ptq"):
            raise InputError(f"--mode must be qat or ptq, got {self.mode!r}.")
        forward = (self.weight, self.activation)
        backward = (self.error, self.grad, self.momentum, self.opt_weight, self.accumulator)
        if not any(forward + backward):
            raise InputError(
                "give the numbers to diagnose: --format F, or some of --weight, --activation, "
                "--error, --grad, --momentum, --opt-weight, --accumulator."
            )
        if self.mode == "ptq" and any(backward):
            raise InputError(
                "--error, --grad, --momentum, --opt-weight and --accumulator are training "
                "numbers; use --mode qat (PTQ runs forward passes only)."
            )
        if self.epochs < 1 or self.batch < 1 or not self.seeds:
            raise InputError("--epochs and --batch must be positive and --seed needs at least one value.")


@dataclass
class DiagnoseOutcome:
    """The report (first seed) and the test scores of every seed, quantized and fp32 (see `run_diagnose`)."""

    report: DiagnoseReport
    scores: list[float]
    references: list[float]
    seeds: list[int]
    metric: str
    label: str
    mode: str

    def score_lines(self) -> list[str]:
        def fmt(vals: list[float]) -> str:
            finite = [v for v in vals if math.isfinite(v)]
            mean = sum(finite) / len(finite) if finite else math.nan
            each = " ".join(f"{v:.2f}" for v in vals)
            return f"{mean:.2f}" + (f" (seeds: {each})" if len(vals) > 1 else "")

        what = "accuracy" if self.metric == "accuracy" else "R^2"
        return [
            f"{self.mode.upper()} {self.label}: test {what} (%) in these numbers {fmt(self.scores)}; "
            f"fp32 {fmt(self.references)}"
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "mode": self.mode,
            "metric": self.metric,
            "seeds": self.seeds,
            "scores": self.scores,
            "references": self.references,
            **self.report.to_dict(),
        }


def _qat_seed(
    spec: DiagnoseSpec, setup: Setup, seed: int, watch: bool, tick: Callable[..., None]
) -> tuple[float, float, DiagnoseReport | None]:
    lr = spec.lr if spec.lr is not None else DEFAULT_LR.get(spec.model or "", 0.05)
    ref_model = setup.make_model(seed)
    fit(
        ref_model,
        setup.data,
        sgd(ref_model, lr),
        epochs=spec.epochs,
        batch=spec.batch,
        seed=seed,
        on_step=tick,
    )
    reference = evaluate(ref_model, setup.data)
    model = an.nn.convert(setup.make_model(seed), spec.policy(setup.include, seed))
    opt = spec.optimizer(model, lr, seed)
    report = None
    if watch:
        with an.nn.observe(model, opt, candidates=spec.candidates) as obs:
            losses = fit(
                model, setup.data, opt, epochs=spec.epochs, batch=spec.batch, seed=seed, on_step=tick
            )
        report = report_from(
            obs, optimizer=opt, losses=losses, min_sqnr=spec.min_sqnr, underflow_target=spec.underflow_target
        )
    else:
        fit(model, setup.data, opt, epochs=spec.epochs, batch=spec.batch, seed=seed, on_step=tick)
    return evaluate(model, setup.data), reference, report


def run_diagnose(
    spec: DiagnoseSpec, *, cache_dir: str | None = None, progress: bool = False
) -> DiagnoseOutcome:
    """Run ``anynum diagnose`` (see the module docstring).

    >>> spec = DiagnoseSpec(dataset="sequence", mode="ptq", weight="e2m1", activation="e2m1", epochs=1)
    >>> out = run_diagnose(spec)
    >>> [r["category"] for r in out.report.rows][:3], out.scores[0] <= out.references[0] + 5
    (['weight', 'bias', 'activation'], True)
    """
    spec.check()
    for name in (
        spec.weight,
        spec.activation,
        spec.error,
        spec.grad,
        spec.momentum,
        spec.opt_weight,
        spec.accumulator,
        *spec.candidates,
    ):
        if name is not None:
            an.format(name)
    setup = make_setup(spec.dataset, spec.model, spec.data_file, spec.model_file, spec.trust_pickle)
    scores, refs = [], []
    report: DiagnoseReport | None = None
    steps = spec.epochs * math.ceil(len(setup.data.y_train) / spec.batch)
    bar = ProgressBar(
        2 * steps * len(spec.seeds) if spec.mode == "qat" else len(spec.seeds), "step", progress
    )
    try:
        with trial_environment():
            for i, seed in enumerate(spec.seeds):
                if spec.mode == "qat":
                    score, ref, rep = _qat_seed(spec, setup, seed, i == 0, bar.tick)
                else:
                    base = trained_model(
                        spec.epochs, spec.lr, spec.batch, spec.model, setup, seed, cache_dir, bar.tick
                    )
                    ref = evaluate(base, setup.data)
                    q = an.nn.post_quantize(base, spec.policy(setup.include, seed), copy_model=True)
                    rep = None
                    if i == 0:
                        with an.nn.observe(q, candidates=spec.candidates) as obs:
                            score = evaluate(q, setup.data)
                        rep = report_from(
                            obs,
                            steps=1,
                            min_sqnr=spec.min_sqnr,
                            underflow_target=spec.underflow_target,
                        )
                    else:
                        score = evaluate(q, setup.data)
                    bar.tick()
                scores.append(score)
                refs.append(ref)
                report = report or rep
    finally:
        bar.close()
    assert report is not None
    return DiagnoseOutcome(report, scores, refs, list(spec.seeds), setup.data.metric, setup.label, spec.mode)


def write_diagnose(outcome: DiagnoseOutcome, out: str | Path, command: str = "") -> list[Path]:
    """report.json, report.csv, table.md, heatmap.png and histograms.png under `out`; returns the paths.

    >>> import tempfile
    >>> out = run_diagnose(DiagnoseSpec(dataset="sequence", mode="ptq", weight="e3m2", epochs=1))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     sorted(p.name for p in write_diagnose(out, d))[:3]
    ['heatmap.png', 'histograms.png', 'report.csv']
    """
    import json

    rep = outcome.report
    text = "\n".join(
        [
            f"{command}\n" if command else "",
            *outcome.score_lines(),
            "",
            rep.table_text(),
            "",
            *(f"- {s}" for s in rep.suggestions),
        ]
    )
    files: dict[str, Callable[[Path], object]] = {
        "report.json": lambda p: p.write_text(
            json.dumps({"command": command, **outcome.to_dict()}, indent=1, allow_nan=False) + "\n",
            encoding="utf-8",
        ),
        "report.csv": lambda p: rep.to_csv(p),
        "table.md": lambda p: p.write_text(text.lstrip() + "\n", encoding="utf-8"),
    }
    if have_matplotlib():
        files["heatmap.png"] = rep.plot_heatmap
        files["histograms.png"] = rep.plot_histograms
    return write_files(Path(out), files)
