"""The work behind ``anynum diagnose`` and ``anynum search``: set up, run, write the outputs.

``diagnose`` in QAT mode trains the model from its seeded initialisation with the
policy's numbers and a `QuantizedOptimizer` (the studies' SGD, momentum 0.9),
watching every step of the first seed with `anynum.nn.observe`; it reports the test
score of every seed next to the same training in fp32. In PTQ mode it rounds a trained
fp32 model (the cached study baseline, or ``--model-file``) and watches one pass over
the test set. ``search`` runs `anynum.nn.search` on a trained fp32 model with the test
score as ``eval_fn``. Runs use one thread and the eager kernels, as study trials do, so
the figures are reproducible.
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import anynum as an
from anynum.errors import InputError
from anynum.experiments.datasets import DATASETS, Dataset, load_dataset
from anynum.experiments.models import build_model
from anynum.experiments.trials import (
    DEFAULT_LR,
    TrialConfig,
    batches,
    evaluate,
    fit,
    sgd,
    train_baseline,
    trial_environment,
)
from anynum.experiments.userfiles import load_data_file, load_model_file, quantizable_layers
from anynum.nn.diagnose import report_from
from anynum.nn.report import DiagnoseReport

__all__ = [
    "DiagnoseOutcome",
    "DiagnoseSpec",
    "SearchSpec",
    "Setup",
    "make_setup",
    "run_diagnose",
    "run_search",
    "write_diagnose",
    "write_search",
]


@dataclass
class Setup:
    """The data and a model factory (``make_model(seed)``) of a run."""

    data: Dataset
    make_model: Callable[[int], nn.Module]
    include: tuple[Any, ...] | None  # layer names for models of unknown layer types
    label: str
    pretrained: bool  # a --model-file (already trained)
    bundled: str | None  # the bundled dataset name, if any


def make_setup(
    dataset: str | None,
    model: str | None,
    data_file: str | None = None,
    model_file: str | None = None,
    trust_pickle: bool = False,
) -> Setup:
    """Data from a bundled name or a file; the model from a bundled name (fresh, seeded) or a file."""
    if data_file is not None:
        data = load_data_file(data_file)
        bundled = None
    else:
        if dataset not in DATASETS:
            raise InputError(
                f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)} or --data-file."
            )
        data, bundled = load_dataset(dataset), dataset
    if model_file is not None:
        loaded = load_model_file(model_file, model=model, data=data, trust_pickle=trust_pickle)
        try:
            with torch.no_grad():
                loaded(data.x_test[:2])
        except Exception as exc:  # the user's model and data do not fit together
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(
                f"the model in {model_file} cannot read this data (inputs of shape "
                f"{tuple(data.x_test.shape[1:])}): {first}"
            ) from None
        return Setup(
            data,
            lambda seed: copy.deepcopy(loaded),
            quantizable_layers(loaded),
            f"{data.name}/{Path(model_file).name}",
            True,
            bundled,
        )
    if model is None:
        raise InputError("name a bundled model with --model (mlp, cnn, lstm) or give --model-file.")
    if model == "mlp" and data.x_train.dim() != 2:
        raise InputError(
            f"the bundled mlp reads (samples, features); this data is {tuple(data.x_train.shape)}."
        )

    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return build_model(model, data)

    make(0)  # fail now on an incompatible pair
    return Setup(data, make, None, f"{data.name}/{model}", False, bundled)


def _copy(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():  # torch 2.13 warns about its own tree specs when copying exports
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(model)


class _Bar:
    """A tqdm bar on stderr when `enabled` and tqdm is installed; otherwise nothing."""

    def __init__(self, total: int | None, unit: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False)

    def tick(self, *_: Any) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- diagnose ---------------------------------------------------------------------------------


@dataclass
class DiagnoseSpec:
    """Everything ``anynum diagnose`` was asked (see docs/diagnose.md)."""

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
    """The report (first seed) and the test scores of every seed, quantized and fp32."""

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


def _trained(
    spec_epochs: int,
    lr: float | None,
    batch: int,
    model: str | None,
    setup: Setup,
    seed: int,
    cache_dir: str | None,
    tick: Callable[..., None],
) -> nn.Module:
    """A trained fp32 model: the file's, the cached study baseline, or trained here."""
    if setup.pretrained:
        return setup.make_model(seed)
    if setup.bundled is not None and model is not None:
        cfg = TrialConfig(
            "ptq", setup.bundled, model, "fp32", epochs=spec_epochs, lr=lr, batch=batch, seed=seed
        )
        trained, _ = train_baseline(cfg, cache_dir)
        return trained
    net = setup.make_model(seed)
    fit(
        net,
        setup.data,
        sgd(net, lr if lr is not None else DEFAULT_LR.get(model or "", 0.05)),
        epochs=spec_epochs,
        batch=batch,
        seed=seed,
        on_step=tick,
    )
    return net


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
    bar = _Bar(2 * steps * len(spec.seeds) if spec.mode == "qat" else len(spec.seeds), "step", progress)
    try:
        with trial_environment():
            for i, seed in enumerate(spec.seeds):
                if spec.mode == "qat":
                    score, ref, rep = _qat_seed(spec, setup, seed, i == 0, bar.tick)
                else:
                    base = _trained(
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
                            losses=[math.nan],
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


def _written(out: Path, files: dict[str, Callable[[Path], object]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name, write in files.items():
        write(out / name)
        done.append(out / name)
    return done


def _matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no PNGs (pip install 'anynum[cli]')", file=sys.stderr)
        return False
    return True


def write_diagnose(outcome: DiagnoseOutcome, out: str | Path, command: str = "") -> list[Path]:
    """report.json, report.csv, table.md, heatmap.png and histograms.png under `out`; returns the paths."""
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
    if _matplotlib():
        files["heatmap.png"] = rep.plot_heatmap
        files["histograms.png"] = rep.plot_histograms
    return _written(Path(out), files)


# --- search -----------------------------------------------------------------------------------


@dataclass
class SearchSpec:
    """Everything ``anynum search`` was asked."""

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
    for name in spec.formats:
        an.format(name)
    setup = make_setup(spec.dataset, spec.model, spec.data_file, spec.model_file, spec.trust_pickle)
    bar = _Bar(spec.budget, "eval", progress)

    def score(model: nn.Module) -> float:
        bar.tick()
        return evaluate(model, setup.data)

    try:
        with trial_environment():
            model = _trained(
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
    """search.json, table.md and search.png under `out`; returns the paths."""
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
    if _matplotlib():
        files["search.png"] = result.plot
    return _written(Path(out), files)
