"""Small models for format studies: an MLP, a LeNet-style CNN and an LSTM.

`build_model` sizes a model for a `Dataset`; `compatible` says whether a model
can read a data set at all (a CNN needs images, an LSTM needs sequences).
"""

from __future__ import annotations

import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import Dataset

__all__ = ["CNN", "LSTM", "MLP", "MODELS", "build_model", "compatible"]

#: Names accepted by `build_model`.
MODELS = ("mlp", "cnn", "lstm")


class MLP(nn.Module):
    """Two hidden layers with ReLU.

    >>> MLP(4, 3)(torch.zeros(2, 4)).shape
    torch.Size([2, 3])
    """

    def __init__(self, n_in: int, n_out: int, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(nn.Module):
    """LeNet-style: two conv + max-pool stages, two linear layers (for 8x8 images).

    >>> CNN((1, 8, 8), 10)(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """

    def __init__(self, image_shape: tuple[int, int, int], n_out: int) -> None:
        super().__init__()
        c, h, w = image_shape
        self.image_shape = image_shape
        self.conv1 = nn.Conv2d(c, 8, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(16 * (h // 4) * (w // 4), 32)
        self.fc2 = nn.Linear(32, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, *self.image_shape)
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class LSTM(nn.Module):
    """One LSTM layer reading (steps, features); a linear head on the last hidden state.

    >>> LSTM((8, 8), 10)(torch.zeros(2, 64)).shape
    torch.Size([2, 10])
    """

    def __init__(self, seq_shape: tuple[int, int], n_out: int, hidden: int = 32) -> None:
        super().__init__()
        self.seq_shape = seq_shape
        self.lstm = nn.LSTM(seq_shape[1], hidden, batch_first=True)
        self.fc = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.reshape(-1, *self.seq_shape))
        return self.fc(out[:, -1])


def compatible(model: str, data: Dataset) -> bool:
    """Whether `model` can read `data` (MLP: always; CNN: images; LSTM: sequences).

    >>> from anynum.experiments.datasets import load_dataset
    >>> compatible("cnn", load_dataset("sequence")), compatible("lstm", load_dataset("sequence"))
    (False, True)
    """
    if model == "cnn":
        return data.image_shape is not None
    if model == "lstm":
        return data.seq_shape is not None
    return model == "mlp"


def build_model(model: str, data: Dataset) -> nn.Module:
    """A freshly initialised `model` (uses torch's global generator: seed it first).

    >>> from anynum.experiments.datasets import load_dataset
    >>> _ = torch.manual_seed(0)
    >>> type(build_model("cnn", load_dataset("digits"))).__name__
    'CNN'
    """
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}.")
    if not isinstance(data, Dataset):
        raise InputError(
            f"build_model needs an anynum Dataset (load_dataset(name)), got {type(data).__name__}."
        )
    if not compatible(model, data):
        raise InputError(f"model {model!r} cannot read dataset {data.name!r} (no image/sequence shape).")
    if model == "mlp":
        return MLP(data.n_features, data.n_outputs)
    if model == "cnn":
        assert data.image_shape is not None
        return CNN(data.image_shape, data.n_outputs)
    assert data.seq_shape is not None
    return LSTM(data.seq_shape, data.n_outputs)
