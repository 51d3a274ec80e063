"""Bundled, offline data sets for format studies: nothing is downloaded.

Every data set is a pure function of its name (fixed generator seeds and a
fixed train/test split), so a trial that names it is reproducible anywhere.

==================  ==============  =======================================================
name                task            source
==================  ==============  =======================================================
``digits``          10 classes      scikit-learn's bundled 8x8 handwritten digits (1797)
``breast_cancer``   2 classes       scikit-learn's bundled Wisconsin breast cancer (569)
``classification``  4 classes       ``sklearn.datasets.make_classification`` (1200 x 20)
``regression``      regression      ``sklearn.datasets.make_friedman1`` (1200 x 10), R^2
``sequence``        4 classes       noisy sine waves of 4 frequencies, 24 steps (LSTM task)
==================  ==============  =======================================================

``digits`` also serves as a sequence task: an LSTM reads it as 8 rows of 8 pixels.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from anynum.errors import InputError

__all__ = ["DATASETS", "DATASET_VERSION", "Dataset", "load_dataset", "split"]

#: Bumped whenever a data set's contents change (part of every trial id).
DATASET_VERSION = 1

#: Names accepted by `load_dataset`.
DATASETS = ("digits", "breast_cancer", "classification", "regression", "sequence")


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train/test tensors plus the shapes models need.

    ``image_shape`` is set where a CNN can read a sample as an image (C, H, W);
    ``seq_shape`` where an LSTM can read it as (steps, features).
    """

    name: str
    task: str  # "classification" | "regression"
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_outputs: int
    image_shape: tuple[int, int, int] | None = None
    seq_shape: tuple[int, int] | None = None

    @property
    def n_features(self) -> int:
        """Width of one flattened sample."""
        return int(self.x_train.shape[1])

    @property
    def metric(self) -> str:
        """``"accuracy"`` (percent correct) or ``"r2"`` (coefficient of determination, percent)."""
        return "accuracy" if self.task == "classification" else "r2"


def split(x: torch.Tensor, y: torch.Tensor, test_fraction: float = 0.25) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test): a fixed shuffle (seed 0), the first `test_fraction` for testing.

    >>> [t.tolist() for t in split(torch.arange(4.0), torch.arange(4))][1:]
    [[1, 3, 2], [0.0], [0]]
    """
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    n_test = round(len(y) * test_fraction)
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def _standardize(xtr: torch.Tensor, xte: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = xtr.mean(0, keepdim=True)
    std = xtr.std(0, keepdim=True).clamp_min(1e-6)
    return (xtr - mean) / std, (xte - mean) / std


def _sklearn() -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputError(
            "format studies need scikit-learn for their bundled data: pip install 'anynum[cli]'."
        ) from None


def _sequence() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n, steps = 1200, 24
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(steps, dtype=torch.float64)
    phase = torch.rand(n, 1, generator=g, dtype=torch.float64) * 2 * math.pi
    freq = (y.to(torch.float64) + 1.0).unsqueeze(1) / steps * 2.0
    noise = torch.randn(n, steps, generator=g, dtype=torch.float64)
    x = torch.sin(2 * math.pi * freq * t + phase) + 0.3 * noise
    return x.float(), y


@functools.lru_cache(maxsize=8)
def load_dataset(name: str) -> Dataset:
    """The bundled data set `name` (see `DATASETS`), split 75/25 with a fixed seed.

    >>> d = load_dataset("sequence")
    >>> d.task, d.n_outputs, d.seq_shape, tuple(d.x_test.shape)
    ('classification', 4, (24, 1), (300, 24))
    """
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}.")
    image: tuple[int, int, int] | None = None
    seq: tuple[int, int] | None = None
    if name == "sequence":
        x, y = _sequence()
        task, n_out, seq = "classification", 4, (24, 1)
        xtr, ytr, xte, yte = split(x, y)
        return Dataset(name, task, xtr, ytr, xte, yte, n_out, None, seq)
    _sklearn()
    from sklearn import datasets as skd

    if name == "digits":
        d = skd.load_digits()
        x = torch.tensor(d.data, dtype=torch.float32) / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
        xtr, ytr, xte, yte = split(x, y)
        return Dataset(name, "classification", xtr, ytr, xte, yte, 10, (1, 8, 8), (8, 8))
    if name == "breast_cancer":
        d = skd.load_breast_cancer()
        x = torch.tensor(d.data, dtype=torch.float32)
        y = torch.tensor(d.target, dtype=torch.int64)
        task, n_out = "classification", 2
    elif name == "classification":
        xa, ya = skd.make_classification(
            n_samples=1200, n_features=20, n_informative=10, n_classes=4, random_state=0
        )
        x, y = torch.tensor(xa, dtype=torch.float32), torch.tensor(ya, dtype=torch.int64)
        task, n_out = "classification", 4
    else:  # regression
        xa, ya = skd.make_friedman1(n_samples=1200, n_features=10, noise=0.5, random_state=0)
        x, y = torch.tensor(xa, dtype=torch.float32), torch.tensor(ya, dtype=torch.float32)
        y = (y - y.mean()) / y.std()
        task, n_out = "regression", 1
    xtr, ytr, xte, yte = split(x, y)
    xtr, xte = _standardize(xtr, xte)
    return Dataset(name, task, xtr, ytr, xte, yte, n_out, image, seq)
