"""Training and scoring shared by every study: the seeded batch order, the optimizer,
the loss, one fit loop and the test score.

Studies (format sweeps, diagnosis, format search, fault injection) all train through
these, so a trial's result is a function of its seed alone.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import Dataset

__all__ = ["batches", "evaluate", "fit", "loss_function", "mse_loss", "sgd", "trial_environment"]


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
    >>> from anynum.experiments.datasets import load_dataset
    >>> d = load_dataset("sequence")
    >>> _ = torch.manual_seed(0)
    >>> 0.0 <= evaluate(build_model("mlp", d), d) <= 100.0
    True
    """
    if not isinstance(model, nn.Module) or not isinstance(data, Dataset):
        raise InputError(
            f"evaluate(model, data) takes a torch.nn.Module and an anynum Dataset (load_dataset(name)), "
            f"got {type(model).__name__} and {type(data).__name__}."
        )
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
    return nn.functional.cross_entropy if data.task == "classification" else mse_loss


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

    >>> from anynum.experiments.models import build_model
    >>> from anynum.experiments.datasets import load_dataset
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


def mse_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error of a one-output regression model (the output is flattened first)."""
    return nn.functional.mse_loss(out.reshape(-1), y)
