"""Model, data, progress and output files shared by ``anynum diagnose`` and ``anynum search``.

A run's data is a bundled data set or a ``--data-file``; its model a bundled one (built
fresh from a seed) or a ``--model-file`` (see `anynum.experiments.userfiles`).
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import DATASETS, Dataset, load_dataset
from anynum.experiments.models import build_model
from anynum.experiments.training import fit, sgd
from anynum.experiments.trials import DEFAULT_LR, TrialConfig, train_baseline
from anynum.experiments.userfiles import load_data_file, load_model_file, quantizable_layers

__all__ = ["ProgressBar", "Setup", "have_matplotlib", "make_setup", "trained_model", "write_files"]


@dataclass
class Setup:
    """The data and a model factory (``make_model(seed)``) of a run; see `make_setup`."""

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
    """Data from a bundled name or a file; the model from a bundled name (fresh, seeded) or a file.

    Raises `InputError` for unknown names, unreadable files, or a model that cannot read the data.

    >>> s = make_setup("sequence", "mlp")
    >>> s.label, s.pretrained, type(s.make_model(0)).__name__
    ('sequence/mlp', False, 'MLP')
    """
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


class ProgressBar:
    """A tqdm bar on stderr when `enabled` and tqdm is installed; otherwise nothing.

    >>> bar = ProgressBar(3, "step", enabled=False); bar.tick(); bar.close()
    """

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


def trained_model(
    spec_epochs: int,
    lr: float | None,
    batch: int,
    model: str | None,
    setup: Setup,
    seed: int,
    cache_dir: str | None,
    tick: Callable[..., None],
) -> nn.Module:
    """A trained fp32 model: the file's, the cached study baseline, or trained here.

    >>> m = trained_model(1, None, 64, "mlp", make_setup("sequence", "mlp"), 0, None, lambda *_: None)
    >>> type(m).__name__
    'MLP'
    """
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


def write_files(out: Path, files: dict[str, Callable[[Path], object]]) -> list[Path]:
    """Create `out` and call each writer with its path; returns the paths.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [p.name for p in write_files(Path(d), {"a.txt": lambda p: p.write_text("a")})]
    ['a.txt']
    """
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name, write in files.items():
        write(out / name)
        done.append(out / name)
    return done


def have_matplotlib() -> bool:
    """Whether matplotlib imports (else one line on stderr says how to get the PNGs).

    >>> have_matplotlib() in (True, False)
    True
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no PNGs (pip install 'anynum[cli]')", file=sys.stderr)
        return False
    return True
