"""One trial of a format study: a pure function of its `TrialConfig`.

A trial trains (or loads from the on-disk cache) the fp32 baseline of its
(dataset, model, schedule, seed), then either

* ``ptq``: rounds the trained weights, biases and every layer's input activations to
  the format with the rounding mode (`anynum.nn.post_quantize`) and evaluates, or
* ``qat``: trains from the same initialisation with weights, activations, errors,
  gradients and momentum in the format (fp32 master weights, dynamic loss scaling)
  and evaluates; it checkpoints every epoch and resumes bit-identically.

Everything is seeded and runs on one CPU thread with the eager kernels, so the
same config gives bit-identical scores in any process, on any executor. The
trial id is a hash of the config (with the format's full parameters rather than
its name, so aliases share results).
"""

from __future__ import annotations

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import DATASET_VERSION, DATASETS, Dataset, load_dataset
from anynum.experiments.models import MODELS, build_model
from anynum.experiments.training import evaluate, loss_function, sgd, trial_environment
from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.rounding import parse_rounding

__all__ = [
    "DEFAULT_LR",
    "TRIAL_VERSION",
    "TrialConfig",
    "digest",
    "format_spec",
    "run_trial",
    "train_baseline",
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
        if self.dataset not in DATASETS:
            raise InputError(f"unknown dataset {self.dataset!r}; expected one of {', '.join(DATASETS)}.")
        if self.model not in MODELS:
            raise InputError(f"unknown model {self.model!r}; expected one of {', '.join(MODELS)}.")
        if not isinstance(self.format, str):
            raise InputError(f"a trial's format is a name (e.g. 'e4m3fn'), got {self.format!r}.")
        object.__setattr__(self, "rounding", parse_rounding(self.rounding).value)
        lookup_format(self.format)  # fail early on an unknown name
        for label in ("epochs", "batch", "seed"):
            v = getattr(self, label)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(f"a trial's {label} must be an integer, got {v!r}.")
        if self.epochs < 1 or self.batch < 1:
            raise InputError(f"epochs and batch must be positive, got {self.epochs} and {self.batch}.")
        lr = self.lr
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0
                               or not math.isfinite(lr)):
            raise InputError(
                f"a trial's lr must be a positive number or None (the model's default), got {lr!r}."
            )

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
        if not isinstance(d, dict):
            raise InputError(
                f"a trial config is a TrialConfig or a dict of its fields, got {type(d).__name__}."
            )
        names = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - names
        if extra:
            raise InputError(f"unknown trial config keys {sorted(extra)}.")
        missing = [n for n in ("mode", "dataset", "model", "format") if n not in d]
        if missing:
            raise InputError(
                f"a trial config needs the keys mode, dataset, model and format; got {sorted(d)}, "
                f"without {missing}."
            )
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


def _load_checkpoint(path: Path | None, trial_id: str) -> dict[str, Any] | None:
    """The saved epoch state of trial `trial_id`, or None (absent, torn, foreign or from another version)."""
    if path is None or not path.exists():
        return None
    try:
        saved = torch.load(path, weights_only=True)  # never executes the file's content
    except Exception:  # a torn file (killed mid-write cannot happen: os.replace) or a foreign one
        return None
    if not isinstance(saved, dict):
        return None
    if saved.get("trial_id") != trial_id or saved.get("version") != TRIAL_VERSION:
        return None
    return saved


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a reader sees the previous checkpoint or this one, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _fit(
    model: nn.Module,
    data: Dataset,
    cfg: TrialConfig,
    fmt: Format | None,
    checkpoint: Path | None = None,
) -> int:
    """Train `model` per `cfg` (quantized when `fmt` is given); returns the epoch it started from.

    With `checkpoint`, the state after each epoch (model, optimizer with its random
    streams, data order) is saved there, and a later call resumes from it: the result is
    bit-identical to an uninterrupted run.
    """
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
    loss_fn = loss_function(data)
    # the order generator of `batches`, one permutation per epoch, so a resumed run sees
    # exactly the batches an uninterrupted `fit` would
    g = torch.Generator().manual_seed(cfg.seed + 1)
    x, y = data.x_train, data.y_train
    start = 0
    saved = _load_checkpoint(checkpoint, cfg.trial_id)
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        g.set_state(saved["order"])
        start = int(saved["epoch"])
    scaled = hasattr(opt, "scale_loss")
    for epoch in range(start, cfg.epochs):
        if checkpoint is not None and epoch > start:
            _save_checkpoint(
                checkpoint,
                {
                    "trial_id": cfg.trial_id,
                    "version": TRIAL_VERSION,
                    "epoch": epoch,
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "order": g.get_state(),
                },
            )
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), cfg.batch):
            idx = perm[i : i + cfg.batch]
            loss = loss_fn(model(x[idx]), y[idx])
            opt.zero_grad()
            (opt.scale_loss(loss) if scaled else loss).backward()
            opt.step()
    return start


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
    if not isinstance(cfg, TrialConfig):
        raise InputError(f"train_baseline needs a TrialConfig, got {type(cfg).__name__}.")
    with trial_environment():
        key_json = json.dumps(cfg.baseline_key(), sort_keys=True)
        state, score = _baseline_cached(key_json, None if cache_dir is None else str(cache_dir))
        model = build_model(cfg.model, load_dataset(cfg.dataset))
        model.load_state_dict(copy.deepcopy(state))
    return model, score


def _state_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter and buffer's bytes, in state_dict order (bit-exact fingerprint)."""
    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        if "_anynum_rng" in key:
            continue  # the streams' positions are not the model
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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
    and the fp32 baseline's score (both in percent), the seed, the SHA-256 of the
    final model's parameters and buffers (``model_sha256``: equal rows are equal
    bit for bit), the library versions, the device and the wall time.

    A QAT trial with a `cache_dir` saves its state after every epoch in
    ``cache_dir/qat/<trial id>.pt`` (model, optimizer and random streams, data
    order; written atomically, read with ``weights_only=True``). Interrupted, even
    by SIGKILL, it resumes from there (``resumed_at_epoch`` says where) and ends
    bit-identical to an uninterrupted run; the file is removed when the trial ends.

    >>> row = run_trial(TrialConfig("ptq", "sequence", "mlp", "e2m1", "rz", epochs=1))
    >>> row["metric"], row["score"] <= row["baseline_score"] + 5, row["format_spec"]["family"]
    ('accuracy', True, 'FloatFormat')
    """
    cfg = config if isinstance(config, TrialConfig) else TrialConfig.from_dict(config)
    start = time.perf_counter()
    ck: Path | None = None
    resumed = 0
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
            ck = Path(cache_dir) / "qat" / f"{cfg.trial_id}.pt" if cache_dir is not None else None
            resumed = _fit(model, data, cfg, fmt, ck)
        score = evaluate(model, data)
        digest = _state_digest(model)
    if cfg.mode == "qat" and ck is not None:
        ck.unlink(missing_ok=True)  # done: a rerun of this trial starts over (and gives this row)
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
        "model_sha256": digest,
        "resumed_at_epoch": resumed,
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
