"""The fault-injection study: accuracy against bit error rate, per format and field (``anynum faults``).

A trial takes the trained fp32 baseline of a bundled (dataset, model) pair,
stores its weights in a format (post-training; integer and fixed-point formats
with a symmetric per-tensor scale, amax / max, as int8 inference does), flips
each stored bit with probability ``ber`` within one field (`anynum.nn.FaultInjector`),
and evaluates. Trials are pure functions of their config (seeded, one thread),
run through the study runner (`anynum.experiments.runner.run_study`): JSONL
results, resumable, with a progress bar.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import anynum as an
from anynum.errors import InputError
from anynum.experiments.datasets import load_dataset
from anynum.experiments.runner import StudyResult, pairs_for, run_study
from anynum.experiments.training import evaluate, trial_environment
from anynum.experiments.trials import TrialConfig, digest, format_spec, train_baseline
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit

__all__ = [
    "DEFAULT_BERS",
    "DEFAULT_FAULT_FORMATS",
    "FAULT_VERSION",
    "FaultSpec",
    "FaultTrial",
    "fault_baseline_task",
    "fault_grid",
    "fault_trial_task",
    "fields_of",
    "run_fault_study",
    "run_fault_trial",
]

#: Bumped whenever the procedure changes (part of every trial id).
FAULT_VERSION = 1
#: The resilience comparison: OCP FP8, the standard's 8-bit posit, scaled int8, MXFP8.
DEFAULT_FAULT_FORMATS = ("e4m3fn", "posit(8,2)", "int8", "mxfp8_e4m3")
DEFAULT_BERS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
TARGETS = ("weight", "activation")


def fields_of(fmt: Format | str) -> tuple[str, ...]:
    """The fields a study sweeps for a format: every bit, then each field the format has.

    >>> fields_of("posit(8,2)")
    ('any', 'sign', 'regime', 'exponent', 'fraction')
    >>> fields_of("mxfp8_e4m3")
    ('any', 'element', 'scale')
    """
    f = an.format(fmt) if isinstance(fmt, str) else fmt
    if isinstance(f, Block):
        return ("any", "element", "scale")
    if isinstance(f, Posit):
        return ("any", "sign", "regime", "exponent", "fraction")
    if isinstance(f, FloatFormat):
        return ("any", *(["sign"] if f.signed else []), "exponent", *(["mantissa"] if f.man_bits else []))
    if isinstance(f, UniformFormat):
        frac = getattr(f, "frac_bits", 0)
        return ("any", *(["sign"] if f.signed else []), *(["integer", "fraction"] if frac else []))
    return ("any",)


def scale_of(fmt: Format) -> str | None:
    """Integer and fixed-point weights are stored with a per-tensor scale; the others as they are.

    >>> scale_of(an.format("int8")), scale_of(an.E4M3FN)
    ('tensor', None)
    """
    return "tensor" if isinstance(fmt, UniformFormat) else None


@dataclass(frozen=True)
class FaultTrial:
    """Everything that determines one fault trial's result.

    >>> t = FaultTrial("digits", "mlp", "e4m3fn", "exponent", 1e-3, 0)
    >>> t.trial_id == FaultTrial.from_dict(t.as_dict()).trial_id, t.label
    (True, 'digits/mlp e4m3fn exponent ber=0.001 #0')
    """

    dataset: str
    model: str
    format: str
    field: str
    ber: float
    repeat: int
    target: str = "weight"
    epochs: int = 10
    lr: float | None = None
    batch: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.field not in fields_of(self.format):
            raise InputError(
                f"field {self.field!r} is not swept for {self.format}; expected one of "
                f"{fields_of(self.format)}."
            )
        if not 0.0 <= self.ber <= 1.0:
            raise InputError(f"bit error rate must be in [0, 1], got {self.ber!r}.")
        if self.target not in TARGETS:
            raise InputError(f"target must be one of {TARGETS}, got {self.target!r}.")

    def baseline(self) -> TrialConfig:
        return TrialConfig("ptq", self.dataset, self.model, "fp32", "nearest", self.epochs, self.lr,
                           self.batch, self.seed)

    @property
    def baseline_id(self) -> str:
        return self.baseline().baseline_id

    @property
    def trial_id(self) -> str:
        key = {**self.baseline().baseline_key(), "study": "faults", "version": FAULT_VERSION,
               "format": format_spec(self.format), "field": self.field, "ber": self.ber,
               "repeat": self.repeat, "target": self.target}
        return digest(key)

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.model} {self.format} {self.field} ber={self.ber:g} #{self.repeat}"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FaultTrial:
        return cls(**d)


@dataclass
class FaultSpec:
    """A fault study grid: formats x fields x bit error rates x repeats on one (dataset, model)."""

    dataset: str = "digits"
    model: str = "mlp"
    formats: Sequence[str] = DEFAULT_FAULT_FORMATS
    fields: Sequence[str] | None = None  # None: every field of each format (`fields_of`)
    bers: Sequence[float] = DEFAULT_BERS
    repeats: int = 5
    target: str = "weight"
    epochs: int = 10
    batch: int = 32
    seed: int = 0


def fault_grid(spec: FaultSpec) -> list[FaultTrial]:
    """Every trial of `spec`; a field a format lacks is left out for that format.

    >>> len(fault_grid(FaultSpec(formats=["e4m3fn", "int8"], fields=["any", "sign"], bers=[1e-3], repeats=2)))
    8
    """
    pairs_for([spec.dataset], [spec.model])
    if spec.repeats < 1:
        raise InputError(f"repeats must be at least 1, got {spec.repeats}.")
    out = []
    for name in spec.formats:
        fields = fields_of(name) if spec.fields is None else [f for f in spec.fields if f in fields_of(name)]
        for field in fields:
            for ber in spec.bers:
                for r in range(spec.repeats):
                    out.append(FaultTrial(spec.dataset, spec.model, name, field, float(ber), r, spec.target,
                                          spec.epochs, None, spec.batch, spec.seed))
    return out


def _store_weights(model: nn.Module, fmt: Format, scale: str | None) -> None:
    """Round every weight and bias of the selected layers onto `fmt` (per-tensor scale for integers)."""
    from anynum.nn.convert import select_layers

    with torch.no_grad():
        for module, _ in select_layers(model, an.nn.Policy()).values():
            for p in module.parameters(recurse=False):
                x = p.detach().double()
                s = 1.0
                if scale == "tensor" and x.numel() and float(x.abs().max()) > 0:
                    s = float(x.abs().max()) / fmt.max
                p.copy_((an.quantize(x / s, fmt) * s).to(p.dtype))


def run_fault_trial(config: FaultTrial | dict[str, Any], cache_dir: str | os.PathLike[str] | None = None
                    ) -> dict[str, Any]:
    """Run one fault trial; returns its JSON-ready result row.

    The row holds the score with faults (`score`), the score of the stored
    model without faults (`clean_score`) and of the fp32 baseline, the bits
    flipped, how many weights became NaN or inf, the trial id and config,
    versions and timing.

    >>> row = run_fault_trial(FaultTrial("sequence", "mlp", "e4m3fn", "sign", 0.01, 0, epochs=1))
    >>> row["flips"] > 0, 0 <= row["score"] <= 100
    (True, True)
    """
    cfg = config if isinstance(config, FaultTrial) else FaultTrial.from_dict(config)
    start = time.perf_counter()
    fmt = an.format(cfg.format)
    data = load_dataset(cfg.dataset)
    model, base_score = train_baseline(cfg.baseline(), cache_dir)
    with trial_environment():
        scale = scale_of(fmt)
        _store_weights(model, fmt, scale)
        clean = evaluate(model, data)
        seed = (cfg.seed * 1_000_003 + cfg.repeat * 7919 + int(cfg.ber * 1e9)) % (2**62)
        with an.nn.FaultInjector(model, fmt, p=cfg.ber, field=cfg.field, target=cfg.target, scale=scale,
                                 seed=seed) as injector:
            score = evaluate(model, data)
            flips = sum(injector.flips.values())
            broken = sum(int((~torch.isfinite(p)).sum()) for p in model.parameters())
    return {
        "trial_id": cfg.trial_id,
        "baseline_id": cfg.baseline_id,
        "mode": "faults",
        "label": cfg.label,
        **cfg.as_dict(),
        "metric": data.metric,
        "score": None if math.isnan(score) else score,
        "clean_score": None if math.isnan(clean) else clean,
        "baseline_score": None if math.isnan(base_score) else base_score,
        "flips": flips,
        "nonfinite_weights": broken,
        "scale": scale,
        "format_spec": format_spec(fmt),
        "versions": {"anynum": an.__version__, "torch": torch.__version__},
        "seconds": round(time.perf_counter() - start, 4),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def fault_trial_task(config: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    """The runner's trial task for fault trials (module level: picklable for worker processes).

    >>> config = FaultTrial("sequence", "mlp", "int8", "any", 0.0, 0, epochs=1).as_dict()
    >>> fault_trial_task(config, "")["flips"]
    0
    """
    return run_fault_trial(config, cache_dir)


def fault_baseline_task(config: dict[str, Any], cache_dir: str) -> float:
    """The runner's baseline task: train (or load) the fp32 baseline of a fault trial; returns its score.

    >>> config = FaultTrial("sequence", "mlp", "int8", "any", 0.0, 0, epochs=1).as_dict()
    >>> 0 <= fault_baseline_task(config, "") <= 100
    True
    """
    return train_baseline(FaultTrial.from_dict(config).baseline(), cache_dir)[1]


def run_fault_study(spec: FaultSpec, out_dir: str | os.PathLike[str], *, jobs: int = 1,
                    progress: str = "auto") -> StudyResult:
    """Run every unfinished trial of `spec` into ``out_dir/results.jsonl`` (resumable), on the study runner.

    >>> import tempfile
    >>> spec = FaultSpec("sequence", "mlp", ["e4m3fn"], ["sign"], [0.01], repeats=1, epochs=1)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     first = run_fault_study(spec, d, progress="none")
    ...     again = run_fault_study(spec, d, progress="none")
    >>> first.new, again.new, again.skipped
    (1, 0, 1)
    """
    grid = fault_grid(spec)
    if not grid:
        raise InputError("the fault grid is empty: no format has any of the fields given.")
    return run_study(grid, out_dir, jobs=jobs, progress=progress, trial_task=fault_trial_task,
                     baseline_task=fault_baseline_task)
