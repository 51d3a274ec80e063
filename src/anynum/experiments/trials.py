"""One trial of a format study: a pure function of its `TrialConfig`.

A trial trains (or loads from the on-disk cache) the fp32 baseline of its
(dataset, model, schedule, seed), then either

* ``ptq``: rounds the trained weights, biases and every layer's input activations to
  the format with the rounding mode (`anynum.nn.post_quantize`) and evaluates, or
* ``qat``: trains from the same initialisation with weights, activations, errors,
  gradients and momentum in the format (fp32 master weights, dynamic loss scaling)
  and evaluates.

Everything is seeded and runs on one CPU thread with the eager kernels, so the
same config gives bit-identical scores in any process, on any executor. The
trial id is a hash of the config (with the format's full parameters rather than
its name, so aliases share results).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import DATASET_VERSION, Dataset, load_dataset
from anynum.experiments.models import build_model
from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.rounding import parse_rounding

__all__ = [
    "DEFAULT_LR",
    "TRIAL_VERSION",
    "TrialConfig",
    "batches",
    "digest",
    "evaluate",
    "fit",
    "format_spec",
    "loss_function",
    "run_trial",
    "sgd",
    "train_baseline",
    "trial_environment",
]

#: Bumped whenever the training or evaluation procedure changes (part of every trial id).
TRIAL_VERSION = 1

#: SGD learning rate (momentum 0.9) per model when a config leaves ``lr`` unset.
DEFAULT_LR = {"mlp": 0.05, "cnn": 0.03, "lstm": 0.2}

_MODES = ("ptq", "qat")


def _strip_names(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_names(v) for k, v in value.items() if k != "name"}
    if isinstance(value, (list, tuple)):
        return [_strip_names(v) for v in value]
    return value


def format_spec(fmt: Format | str) -> dict[str, Any]:
    """Every parameter of a format (family plus dataclass fields, names dropped), JSON-ready.

    >>> format_spec("fp8_e4m3fn") == format_spec("e4m3fn")
    True
    >>> format_spec("e2m1")["family"], format_spec("e2m1")["man_bits"]
    ('FloatFormat', 1)
    """
    f = lookup_format(fmt)
    fields = _strip_names(dataclasses.asdict(f)) if dataclasses.is_dataclass(f) else {"repr": repr(f)}
    return {"family": type(f).__name__, **fields}


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able object (trial and baseline ids)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TrialConfig:
    """Everything that determines a trial's result.

    `format` is any name `anynum.format` understands (kept for display; the id
    uses the format's parameters); `rounding` any alias `parse_rounding`
    understands (stored canonically). `lr=None` means `DEFAULT_LR[model]`.

    >>> c = TrialConfig("ptq", "digits", "mlp", "fp8_e4m3fn", "rne")
    >>> c.rounding, c.trial_id == TrialConfig("ptq", "digits", "mlp", "e4m3fn", "nearest").trial_id
    ('nearest', True)
    """

    mode: str
    dataset: str
    model: str
    format: str
    rounding: str = "nearest"
    epochs: int = 10
    lr: float | None = None
    batch: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise InputError(f"unknown trial mode {self.mode!r}; expected 'ptq' or 'qat'.")
        object.__setattr__(self, "rounding", parse_rounding(self.rounding).value)
        lookup_format(self.format)  # fail early on an unknown name
        if self.epochs < 1 or self.batch < 1:
            raise InputError(f"epochs and batch must be positive, got {self.epochs} and {self.batch}.")

    @property
    def learning_rate(self) -> float:
        """`lr`, or the model's default."""
        return float(self.lr) if self.lr is not None else DEFAULT_LR.get(self.model, 0.05)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what `from_dict` reads back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialConfig:
        """Inverse of `as_dict`; unknown keys are an error.

        >>> c = TrialConfig("qat", "digits", "cnn", "bf16", "sr", epochs=2)
        >>> TrialConfig.from_dict(c.as_dict()) == c
        True
        """
        names = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - names
        if extra:
            raise InputError(f"unknown trial config keys {sorted(extra)}.")
        return cls(**d)

    def baseline_key(self) -> dict[str, Any]:
        """What determines the fp32 baseline this trial starts from."""
        return {
            "version": TRIAL_VERSION,
            "data_version": DATASET_VERSION,
            "dataset": self.dataset,
            "model": self.model,
            "epochs": self.epochs,
            "lr": self.learning_rate,
            "batch": self.batch,
            "seed": self.seed,
        }

    @property
    def baseline_id(self) -> str:
        """Hash of `baseline_key` (file name of the cached baseline)."""
        return digest(self.baseline_key())

    @property
    def trial_id(self) -> str:
        """Hash of everything that determines the result (format by parameters, not name)."""
        key = {**self.baseline_key(), "mode": self.mode, "format": format_spec(self.format)}
        key["rounding"] = self.rounding
        return digest(key)


@contextlib.contextmanager
def trial_environment() -> Iterator[None]:
    """One thread and eager kernels (deterministic, no compile latency); restored afterwards."""
    threads = torch.get_num_threads()
    compile_env = os.environ.get("ANYNUM_COMPILE")
    torch.set_num_threads(1)
    os.environ["ANYNUM_COMPILE"] = "0"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if compile_env is None:
            os.environ.pop("ANYNUM_COMPILE", None)
        else:
            os.environ["ANYNUM_COMPILE"] = compile_env


def evaluate(model: nn.Module, data: Dataset) -> float:
    """Test-set score in percent: accuracy (classification) or R^2 (regression); NaN if non-finite.

    >>> from anynum.experiments.models import build_model
    >>> d = load_dataset("sequence")
    >>> _ = torch.manual_seed(0)
    >>> 0.0 <= evaluate(build_model("mlp", d), d) <= 100.0
    True
    """
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(data.x_test)
    model.train(was_training)
    if data.task == "classification":
        score = (out.argmax(1) == data.y_test).double().mean().item()
    else:
        pred = out.reshape(-1).double()
        y = data.y_test.double()
        sse = ((pred - y) ** 2).sum().item()
        sst = ((y - y.mean()) ** 2).sum().item()
        score = 1.0 - sse / sst
    return 100.0 * score if math.isfinite(score) else math.nan


def batches(
    x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, epochs: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Shuffled mini-batches of (x, y): `epochs` passes, each in a new order drawn from a
    generator seeded with `seed` (the last batch of a pass may be smaller).

    >>> [b[1].tolist() for b in batches(torch.zeros(5, 1), torch.arange(5), 2, seed=0)]
    [[4, 0], [1, 3], [2]]
    """
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), batch):
            idx = perm[i : i + batch]
            yield x[idx], y[idx]


def loss_function(data: Dataset) -> Any:
    """Cross-entropy for classification, mean squared error for regression."""
    return nn.functional.cross_entropy if data.task == "classification" else _mse


def sgd(model: nn.Module, lr: float) -> torch.optim.SGD:
    """The studies' optimizer: SGD with momentum 0.9 over `model`'s parameters."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def fit(
    model: nn.Module,
    data: Dataset,
    opt: Any,
    *,
    epochs: int,
    batch: int,
    seed: int,
    on_step: Any = None,
) -> list[float]:
    """Train `model` on ``data``'s training split with `opt`; returns the loss of every step.

    `opt` is a torch optimizer or an `anynum.optim.QuantizedOptimizer` (then the loss goes
    through its ``scale_loss``). Batches come from `batches` with seed ``seed + 1``.
    ``on_step(loss)`` is called after every step (progress bars).

    >>> d = load_dataset("sequence")
    >>> _ = torch.manual_seed(0); m = build_model("mlp", d)
    >>> losses = fit(m, d, sgd(m, 0.05), epochs=1, batch=64, seed=0)
    >>> len(losses), losses[-1] < losses[0]
    (15, True)
    """
    loss_fn = loss_function(data)
    scaled = hasattr(opt, "scale_loss")
    losses = []
    for x, y in batches(data.x_train, data.y_train, batch, seed + 1, epochs):
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        (opt.scale_loss(loss) if scaled else loss).backward()
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(losses[-1])
    return losses


def _fit(model: nn.Module, data: Dataset, cfg: TrialConfig, fmt: Format | None) -> None:
    from anynum.optim import QuantizedOptimizer

    opt: Any = sgd(model, cfg.learning_rate)
    if fmt is not None:
        opt = QuantizedOptimizer(
            opt,
            weight=fmt,
            grad=fmt,
            momentum=fmt,
            rounding=cfg.rounding,
            master_weights=True,
            grad_scale="dynamic",
            seed=cfg.seed,
        )
    fit(model, data, opt, epochs=cfg.epochs, batch=cfg.batch, seed=cfg.seed)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.reshape(-1), y)


@functools.lru_cache(maxsize=16)
def _baseline_cached(key_json: str, cache_dir: str | None) -> tuple[dict[str, torch.Tensor], float]:
    key = json.loads(key_json)
    cfg = TrialConfig("ptq", key["dataset"], key["model"], "fp32", "nearest", key["epochs"], key["lr"],
                      key["batch"], key["seed"])
    path = Path(cache_dir) / "baselines" / f"{cfg.baseline_id}.pt" if cache_dir else None
    if path is not None and path.exists():
        try:
            saved = torch.load(path, weights_only=True)
            return saved["state"], float(saved["score"])
        except Exception:  # a torn or foreign file: retrain and overwrite
            pass
    data = load_dataset(cfg.dataset)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data)
    _fit(model, data, cfg, None)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    score = evaluate(model, data)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"state": state, "score": score, "key": key}, tmp)
        os.replace(tmp, path)  # atomic: concurrent workers write identical files
    return state, score


def train_baseline(
    cfg: TrialConfig, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[nn.Module, float]:
    """The trained fp32 model for `cfg` and its test score; cached in ``cache_dir/baselines/``.

    >>> cfg = TrialConfig("ptq", "sequence", "mlp", "fp32", epochs=1)
    >>> model, score = train_baseline(cfg)
    >>> score > 30.0
    True
    """
    with trial_environment():
        key_json = json.dumps(cfg.baseline_key(), sort_keys=True)
        state, score = _baseline_cached(key_json, None if cache_dir is None else str(cache_dir))
        model = build_model(cfg.model, load_dataset(cfg.dataset))
        model.load_state_dict(copy.deepcopy(state))
    return model, score


def _versions() -> dict[str, str]:
    import anynum

    v = {
        "anynum": anynum.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    sk = sys.modules.get("sklearn")
    if sk is not None:
        v["scikit-learn"] = getattr(sk, "__version__", "?")
    return v


def run_trial(
    config: TrialConfig | dict[str, Any], cache_dir: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Run one trial; returns its JSON-ready result row.

    The row holds the trial id, the config, the format's full spec, the score
    and the fp32 baseline's score (both in percent), the seed, the library
    versions, the device and the wall time.

    >>> row = run_trial(TrialConfig("ptq", "sequence", "mlp", "e2m1", "rz", epochs=1))
    >>> row["metric"], row["score"] <= row["baseline_score"] + 5, row["format_spec"]["family"]
    ('accuracy', True, 'FloatFormat')
    """
    cfg = config if isinstance(config, TrialConfig) else TrialConfig.from_dict(config)
    start = time.perf_counter()
    fmt = lookup_format(cfg.format)
    data = load_dataset(cfg.dataset)
    baseline, base_score = train_baseline(cfg, cache_dir)
    with trial_environment():
        import anynum.nn as ann

        policy = ann.Policy(weight=fmt, activation=fmt, rounding=cfg.rounding, seed=cfg.seed)
        if cfg.mode == "ptq":
            model = ann.post_quantize(baseline, policy)
        else:
            torch.manual_seed(cfg.seed)
            model = build_model(cfg.model, data)
            model = ann.convert(model, policy.replace(error=fmt))
            _fit(model, data, cfg, fmt)
        score = evaluate(model, data)
    return {
        "trial_id": cfg.trial_id,
        "baseline_id": cfg.baseline_id,
        "mode": cfg.mode,
        "dataset": cfg.dataset,
        "model": cfg.model,
        "format": cfg.format,
        "rounding": cfg.rounding,
        "metric": data.metric,
        "score": None if math.isnan(score) else score,
        "baseline_score": None if math.isnan(base_score) else base_score,
        "seed": cfg.seed,
        "config": cfg.as_dict(),
        "format_spec": format_spec(fmt),
        "format_repr": repr(fmt),
        "versions": _versions(),
        "device": {
            "type": "cpu",
            "threads": 1,
            "machine": platform.machine(),
            "host": platform.node(),
            "pid": os.getpid(),
        },
        "seconds": round(time.perf_counter() - start, 4),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
