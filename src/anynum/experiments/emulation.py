"""The posit thesis's LeNet-5, trained with every op in a format: what ``anynum emulate`` runs.

The thesis (Luz 2021, chapters 4-5) made posit16es2 a PyTorch dtype and trained
LeNet-5 (conv-avgpool-conv-avgpool-conv-fc-fc, tanh, 32x32 input) with Adam
(lr 1e-3, batch 32) entirely in posits. Here the same network and optimizer
run under `anynum.emulate` on scikit-learn's bundled digits, upscaled from 8x8
to 32x32 (bilinear), one row per arithmetic setting (`DEFAULT_CONFIGS`). The
forward pass, the backward pass, the optimizer step and the evaluation all run
inside the mode.

Rows are appended to ``OUT/results.jsonl`` as each setting finishes (one JSON
object: the setting, accuracy and loss per epoch, seconds); a rerun skips the
settings already there, so an interrupted study resumes. Everything is seeded:
the same initial weights and batch order for every row.

A row with ``optimizer_in_format=False`` runs the optimizer step outside the mode, on
float32 master weights (the usual FP8 recipe: with every op of Adam in e4m3, the squared
gradients and eps underflow to zero and the update divides by zero).

Loss scaling (``loss_scale=True``) multiplies the loss by a dynamic power of two
S before backward and skips the step when a gradient is not finite (halving S);
the scaled gradients go to Adam as they are, with eps scaled by S too: Adam's
update does not depend on the gradient's scale, and unscaling inside a narrow
format would flush the small gradients again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import anynum as an
from anynum.errors import InputError
from anynum.experiments.datasets import DATASET_VERSION, load_dataset
from anynum.experiments.models import LeNet5
from anynum.experiments.runner import read_results

__all__ = [
    "DEFAULT_CONFIGS",
    "EmulationConfig",
    "EmulationStudy",
    "digits32",
    "plot_accuracy",
    "run_emulation_study",
    "table_markdown",
    "train_setting",
]

#: Bumped whenever training or evaluation changes (part of every row id).
STUDY_VERSION = 1
RESULTS_FILE = "results.jsonl"


@dataclass(frozen=True)
class EmulationConfig:
    """One row of the study: the format (None: plain float32) and how it computes."""

    label: str
    fmt: str | None
    rounding: str = "nearest"
    accumulate: str | None = None
    order: str | int = "sequential"
    fma: bool = False
    loss_scale: bool = False
    #: False: the optimizer step runs outside the mode, on float32 master weights (the usual FP8
    #: recipe); the forward and backward passes still round every op, parameters included.
    optimizer_in_format: bool = True

    def row_id(self, epochs: int, batch: int, seed: int, lr: float, limit: int | None) -> str:
        fields = asdict(self)
        if self.optimizer_in_format:  # the field's default: rows recorded before it keep their ids
            del fields["optimizer_in_format"]
        blob = json.dumps(
            [fields, epochs, batch, seed, lr, limit, STUDY_VERSION, DATASET_VERSION],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def mode(self) -> Any:
        """The `an.emulate` context of this row (a null context for plain float32)."""
        if self.fmt is None:
            return contextlib.nullcontext()
        return an.emulate(
            self.fmt, self.rounding, accumulate=self.accumulate, order=self.order, fma=self.fma, seed=0
        )


DEFAULT_CONFIGS: tuple[EmulationConfig, ...] = (
    EmulationConfig("fp32", None),
    EmulationConfig("posit16es2", "posit(16,2)"),
    EmulationConfig("posit16es1", "posit(16,1)"),
    EmulationConfig("bf16", "bf16"),
    EmulationConfig("fp16, loss scaled", "fp16", loss_scale=True),
    EmulationConfig("e4m3fn, fp32 accumulation", "e4m3fn", accumulate="fp32", loss_scale=True),
    EmulationConfig("e4m3fn, fp32 accumulation and optimizer", "e4m3fn", accumulate="fp32", loss_scale=True,
                    optimizer_in_format=False),
    EmulationConfig("mxfp8_e4m3 operands", "mxfp8_e4m3"),
    EmulationConfig("posit8es0 + quire", "posit(8,0)", accumulate="quire"),
    EmulationConfig("posit8es0, no quire", "posit(8,0)", accumulate="posit(8,0)"),
    EmulationConfig("posit8es0 + quire, fp32 optimizer", "posit(8,0)", accumulate="quire",
                    optimizer_in_format=False),
)


def digits32(limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits (values in [0, 1], fixed 75/25 split) upscaled to 1x32x32 (bilinear).

    >>> xtr, ytr, xte, yte = digits32(limit=10)
    >>> tuple(xtr.shape), tuple(xte.shape)
    ((10, 1, 32, 32), (449, 1, 32, 32))
    """
    d = load_dataset("digits")

    def up(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x.view(-1, 1, 8, 8), size=(32, 32), mode="bilinear", align_corners=False)

    xtr, ytr = d.x_train, d.y_train
    if limit is not None:
        xtr, ytr = xtr[:limit], ytr[:limit]
    return up(xtr), ytr, up(d.x_test), d.y_test


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: EmulationConfig) -> float:
    correct = 0
    with torch.no_grad(), cfg.mode():
        for i in range(0, len(y), 150):
            out = model(x[i : i + 150])
            correct += int((out.argmax(1) == y[i : i + 150]).sum())
    return 100.0 * correct / max(len(y), 1)


def train_setting(
    cfg: EmulationConfig,
    *,
    epochs: int = 10,
    batch: int = 32,
    seed: int = 0,
    lr: float = 1e-3,
    limit: int | None = None,
    on_epoch: Callable[[int, float, float], None] | None = None,
) -> dict[str, Any]:
    """Train LeNet-5 on `digits32` under `cfg`; returns the result row (accuracy per epoch in %).

    >>> row = train_setting(EmulationConfig("bf16", "bf16"), epochs=1, limit=64)
    >>> len(row["accuracy"]), row["format"]
    (1, 'bf16')
    """
    xtr, ytr, xte, yte = digits32(limit)
    torch.manual_seed(seed)
    model = LeNet5()
    scale = 2.0**10 if cfg.loss_scale else 1.0
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8 * scale, foreach=False)
    order = torch.Generator().manual_seed(seed)
    accs: list[float] = []
    losses: list[float] = []
    skipped = 0
    good = 0
    start = time.perf_counter()
    mode = cfg.mode()
    for epoch in range(epochs):
        perm = torch.randperm(len(ytr), generator=order)
        total, count = 0.0, 0
        for i in range(0, len(ytr), batch):
            idx = perm[i : i + batch]
            with mode:
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
                (loss * scale if cfg.loss_scale else loss).backward()
                finite = all(
                    bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None
                )
                if finite and cfg.optimizer_in_format:
                    opt.step()
            if finite and not cfg.optimizer_in_format:
                opt.step()  # float32 master weights; every op that reads them rounds them first
            lv = float(loss.detach())
            if cfg.loss_scale:
                if not finite:
                    skipped += 1
                    scale /= 2
                    good = 0
                    for g in opt.param_groups:
                        g["eps"] = 1e-8 * scale
                    continue
                good += 1
                if good % 200 == 0:
                    scale *= 2
                    for g in opt.param_groups:
                        g["eps"] = 1e-8 * scale
            if lv == lv:  # skip NaN losses in the mean (they are reported through accuracy)
                total += lv * len(idx)
                count += len(idx)
        accs.append(_accuracy(model, xte, yte, cfg))
        losses.append(total / count if count else float("nan"))
        if on_epoch is not None:
            on_epoch(epoch, accs[-1], losses[-1])
    return {
        "label": cfg.label,
        "format": cfg.fmt or "fp32",
        "rounding": cfg.rounding,
        "accumulate": cfg.accumulate,
        "order": cfg.order,
        "fma": cfg.fma,
        "loss_scale": cfg.loss_scale,
        "epochs": epochs,
        "batch": batch,
        "seed": seed,
        "lr": lr,
        "limit": limit,
        "accuracy": accs,
        "loss": losses,
        "skipped_steps": skipped,
        "final_scale": scale,
        "seconds": round(time.perf_counter() - start, 2),
    }


@dataclass
class EmulationStudy:
    """What `run_emulation_study` did: the rows (in config order), counts, and the output directory."""

    rows: list[dict[str, Any]]
    new: int
    resumed: int
    out_dir: Path


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_emulation_study(
    out_dir: str | os.PathLike[str] = "anynum-emulate",
    configs: Sequence[EmulationConfig] = DEFAULT_CONFIGS,
    *,
    epochs: int = 10,
    batch: int = 32,
    seed: int = 0,
    lr: float = 1e-3,
    limit: int | None = None,
    threads: int | None = None,
    progress: bool = True,
) -> EmulationStudy:
    """Train every setting not yet in ``out_dir/results.jsonl``, appending one row each.

    >>> import tempfile
    >>> cfgs = [EmulationConfig("bf16", "bf16")]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     a = run_emulation_study(d, cfgs, epochs=1, limit=32, progress=False)
    ...     b = run_emulation_study(d, cfgs, epochs=1, limit=32, progress=False)
    >>> a.new, b.new, b.resumed
    (1, 0, 1)
    """
    if epochs < 1 or batch < 1:
        raise InputError(f"--epochs and --batch must be at least 1, got {epochs} and {batch}.")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write to output directory {str(out)!r}: {exc.strerror or exc}.") from None
    path = out / RESULTS_FILE
    done = read_results(path)
    ids = [c.row_id(epochs, batch, seed, lr, limit) for c in configs]
    new = 0

    def say(msg: str) -> None:
        if progress:
            print(msg, file=sys.stderr, flush=True)

    resumed = sum(i in done for i in ids)
    if resumed:
        say(f"resuming: {resumed} of {len(ids)} settings already in {path}")
    with _threads(threads), path.open("a", encoding="utf-8") as fh:
        for k, (cfg, rid) in enumerate(zip(configs, ids)):
            if rid in done:
                continue

            def on_epoch(e: int, acc: float, loss: float, cfg: EmulationConfig = cfg, k: int = k) -> None:
                say(
                    f"[{k + 1}/{len(configs)}] {cfg.label}: epoch {e + 1}/{epochs} accuracy {acc:.2f}% "
                    f"loss {loss:.4f}"
                )

            row = train_setting(
                cfg, epochs=epochs, batch=batch, seed=seed, lr=lr, limit=limit, on_epoch=on_epoch
            )
            row["trial_id"] = rid
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()
            done[rid] = row
            new += 1
    rows = [done[i] for i in ids if i in done]
    return EmulationStudy(rows, new, resumed, out)


def table_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Final and best test accuracy per setting, and the gap to the fp32 row (markdown).

    >>> print(table_markdown([{"label": "fp32", "accuracy": [90.0, 95.0], "seconds": 1.0}]))
    | setting | final accuracy % | best % | vs fp32 (points) | seconds |
    |---|---|---|---|---|
    | fp32 | 95.00 | 95.00 | +0.00 | 1.0 |
    """
    base = next((r["accuracy"][-1] for r in rows if r["label"] == "fp32"), None)
    lines = ["| setting | final accuracy % | best % | vs fp32 (points) | seconds |", "|---|---|---|---|---|"]
    for r in rows:
        acc = r["accuracy"]
        gap = f"{acc[-1] - base:+.2f}" if base is not None else "n/a"
        lines.append(f"| {r['label']} | {acc[-1]:.2f} | {max(acc):.2f} | {gap} | {r['seconds']:.1f} |")
    return "\n".join(lines)


def plot_accuracy(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """A PNG of test accuracy per epoch, one line per setting (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in rows:
        acc = r["accuracy"]
        ax.plot(range(1, len(acc) + 1), acc, marker="o", markersize=3, label=r["label"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("LeNet-5 on digits (32x32), every op in the format")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
