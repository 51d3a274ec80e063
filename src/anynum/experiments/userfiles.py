"""A user's own model and data for ``anynum diagnose`` and ``anynum search``, loaded without running them.

Model files (``--model-file``), by what they hold:

* a ``state_dict`` (``torch.save(model.state_dict(), path)``) plus a bundled model name
  (``--model mlp``): read with ``torch.load(weights_only=True)`` and loaded strictly;
* a ``torch.export`` program (``torch.export.save(torch.export.export(model, (x,),
  dynamic_shapes=...), path)``, the batch dimension dynamic): read with
  ``torch.export.load`` only after every pickled payload inside the archive has loaded with
  ``weights_only=True`` (``torch.export.load`` itself falls back to full unpickling for some
  payloads, which would run code from the file); then unflattened, so that its layers
  remain modules that hooks and parametrizations reach (layers are found by name: every
  module that holds parameters);
* a pickled whole module (``torch.save(model, path)``): only with ``trust_pickle=True``,
  since unpickling it runs code from the file.

Data files (``--data-file``): a ``.pt`` file (``torch.save`` of a dict of tensors, read with
``weights_only=True``) or a ``.npz`` file (``numpy.savez``, read without pickles), with
``x`` (inputs; the first axis indexes samples) and ``y`` (targets: integer class labels for
classification, floats for regression), and optionally ``x_test``/``y_test`` (otherwise a
fixed 75/25 split of x, y). Bundled models read ``x`` as (samples, features) for ``mlp``,
(samples, channels, height, width) for ``cnn`` and (samples, steps, features) for ``lstm``.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anynum.errors import InputError
from anynum.experiments.datasets import Dataset, split
from anynum.experiments.models import MODELS, build_model, compatible
from anynum.nn.policy import DEFAULT_LAYERS

__all__ = ["load_data_file", "load_model_file", "quantizable_layers"]

_TRUST = (
    "loading it runs code from the file; if you trust the file, add --trust-pickle (or save "
    "model.state_dict() and pass it with --model NAME)"
)


def _file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {str(path)!r} does not exist or is not a file.")
    return p


# --- data ------------------------------------------------------------------------------------


def _as_tensor(value: Any, key: str, path: Path) -> torch.Tensor:
    t = torch.as_tensor(value) if isinstance(value, np.ndarray) else value
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{path}: {key!r} must be an array or tensor, got {type(value).__name__}.")
    return t


def load_data_file(path: str | Path) -> Dataset:
    """The data set in a ``.pt`` or ``.npz`` file (see the module docstring for the layout).

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     f = pathlib.Path(d) / "data.npz"
    ...     np.savez(f, x=np.ones((8, 3), np.float32), y=np.arange(8) % 2)
    ...     ds = load_data_file(f)
    >>> ds.task, ds.n_outputs, tuple(ds.x_train.shape), tuple(ds.x_test.shape)
    ('classification', 2, (6, 3), (2, 3))
    """
    p = _file(path, "--data-file")
    if p.suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as z:
                raw: dict[str, Any] = {k: z[k] for k in z.files}
        except (ValueError, OSError, zipfile.BadZipFile) as exc:
            raise InputError(f"cannot read {p} as a .npz file without pickles: {exc}") from None
    elif p.suffix in (".pt", ".pth"):
        try:
            obj = torch.load(p, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as exc:
            raise InputError(
                f"{p} holds more than tensors ({_reason(exc)}); save a dict of tensors."
            ) from None
        except (RuntimeError, OSError, EOFError) as exc:
            raise InputError(f"cannot read {p} with torch.load: {_reason(exc)}") from None
        if isinstance(obj, (tuple, list)) and len(obj) == 2:
            obj = {"x": obj[0], "y": obj[1]}
        if not isinstance(obj, dict):
            raise InputError(
                f"{p} must hold a dict with 'x' and 'y' (or a pair (x, y)); got {type(obj).__name__}."
            )
        raw = obj
    else:
        raise InputError(f"--data-file must be a .pt or .npz file, got {p.name!r}.")
    missing = [k for k in ("x", "y") if k not in raw]
    if missing:
        raise InputError(f"{p} has no {' or '.join(map(repr, missing))}; it holds {sorted(raw)}.")
    t = {k: _as_tensor(v, k, p) for k, v in raw.items() if k in ("x", "y", "x_test", "y_test")}
    if ("x_test" in t) != ("y_test" in t):
        raise InputError(f"{p}: give both 'x_test' and 'y_test', or neither.")
    for xk, yk in (("x", "y"), ("x_test", "y_test")):
        if xk in t and (t[xk].dim() < 2 or t[xk].shape[0] != t[yk].shape[0] or t[yk].dim() != 1):
            raise InputError(
                f"{p}: {xk!r} must be (samples, ...) and {yk!r} (samples,) with the same number of "
                f"samples; got {tuple(t[xk].shape)} and {tuple(t[yk].shape)}."
            )
    classify = not t["y"].is_floating_point()
    x = t["x"].float()
    y = t["y"].long() if classify else t["y"].float()
    if "x_test" in t:
        xtr, ytr, xte = x, y, t["x_test"].float()
        yte = t["y_test"].long() if classify else t["y_test"].float()
    else:
        if len(y) < 4:
            raise InputError(f"{p} has {len(y)} samples; give at least 4 (or x_test/y_test).")
        xtr, ytr, xte, yte = split(x, y)
    n_out = int(max(int(ytr.max()), int(yte.max())) + 1) if classify else 1
    if classify and int(min(int(ytr.min()), int(yte.min()))) < 0:
        raise InputError(f"{p}: class labels in 'y' must be 0, 1, 2 ...; found negative labels.")
    shape = [int(d) for d in x.shape[1:]]
    image = (shape[0], shape[1], shape[2]) if x.dim() == 4 else None
    seq = (shape[0], shape[1]) if x.dim() == 3 else None
    task = "classification" if classify else "regression"
    return Dataset(p.stem, task, xtr, ytr, xte, yte, n_out, image, seq)


# --- models ----------------------------------------------------------------------------------


def _check_export_archive(p: Path) -> None:
    """Refuse a torch.export archive any of whose pickled payloads needs more than weights_only."""
    with zipfile.ZipFile(p) as z:
        names = z.namelist()
        pickled = [n for n in names if n.endswith((".pt", ".pkl"))]
        for cfg in (n for n in names if n.endswith("_config.json") and "/data/" in n):
            entries = json.loads(z.read(cfg)).get("config", {})
            folder = cfg.rsplit("/", 1)[0]
            for fqn, meta in entries.items():
                path = str(meta.get("path_name", ""))
                if path.startswith(("custom_obj", "opaque_obj")):
                    raise InputError(f"{p} holds a Python object constant ({fqn}); {_TRUST}.")
                if meta.get("use_pickle"):
                    pickled.append(f"{folder}/{path}")
        for name in pickled:
            try:
                torch.load(io.BytesIO(z.read(name)), weights_only=True, map_location="cpu")
            except Exception as exc:  # any failure: torch.export.load would unpickle it in full
                why = _reason(exc)
                raise InputError(
                    f"{p}: the payload {name} does not load with weights_only=True ({why}); {_TRUST}."
                ) from None


def _reason(exc: Exception) -> str:
    """The one informative line of a torch.load error (its messages run to a dozen lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "Unsupported" in line or "not an allowed global" in line:
            return line
    return lines[0] if lines else type(exc).__name__


def _is_export_archive(p: Path) -> bool:
    if not zipfile.is_zipfile(p):
        return False
    with zipfile.ZipFile(p) as z:
        return any(n.endswith("archive_format") for n in z.namelist()) and not any(
            n.endswith("data.pkl") for n in z.namelist()
        )


def _state_dict(obj: dict[str, Any]) -> dict[str, torch.Tensor]:
    for key in ("state_dict", "state", "model"):  # common checkpoint wrappers
        inner = obj.get(key)
        if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            return inner
    return obj


def load_model_file(
    path: str | Path, *, model: str | None = None, data: Dataset | None = None, trust_pickle: bool = False
) -> nn.Module:
    """The model in `path` (see the module docstring); `model` and `data` build a bundled model
    for a state_dict. Errors are `InputError` naming what the file holds and the fix.

    >>> import tempfile, pathlib
    >>> from anynum.experiments.datasets import load_dataset
    >>> d = load_dataset("sequence"); m = build_model("mlp", d)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     f = pathlib.Path(tmp) / "mlp.pt"; torch.save(m.state_dict(), f)
    ...     loaded = load_model_file(f, model="mlp", data=d)
    >>> torch.equal(loaded.fc1.weight, m.fc1.weight)
    True
    """
    p = _file(path, "--model-file")
    if _is_export_archive(p):
        if not trust_pickle:
            _check_export_archive(p)
        try:
            program = torch.export.load(p)
        except Exception as exc:
            raise InputError(f"cannot load {p} as a torch.export program: {_reason(exc)}") from None
        module = torch.export.unflatten(program)
        # The graphs' node metadata holds the fake tensors of tracing, which cannot be deep-copied
        # (diagnose and search work on copies); running the graph does not read it.
        for sub in module.modules():
            graph = getattr(sub, "graph", None)
            for node in getattr(graph, "nodes", ()):
                node.meta.clear()
        return module
    try:
        obj = torch.load(p, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        if not trust_pickle:
            raise InputError(f"{p} holds pickled Python objects (a whole module?); {_TRUST}.") from None
        obj = torch.load(p, weights_only=False, map_location="cpu")
    except (RuntimeError, OSError, EOFError) as exc:
        raise InputError(f"cannot read {p} with torch.load: {_reason(exc)}") from None
    if isinstance(obj, nn.Module):
        return obj
    if not isinstance(obj, dict):
        raise InputError(
            f"{p} holds a {type(obj).__name__}; expected a state_dict, an exported program or "
            "(with --trust-pickle) a module."
        )
    if model is None or data is None:
        raise InputError(
            f"{p} holds a state_dict: name the model it belongs to with --model "
            f"({', '.join(MODELS)}) and its data with --dataset or --data-file."
        )
    if not compatible(model, data) or (model == "mlp" and data.x_train.dim() != 2):
        raise InputError(
            f"the bundled {model!r} cannot read data of shape {tuple(data.x_train.shape[1:])} "
            "(mlp: features; cnn: channels x height x width; lstm: steps x features)."
        )
    net = build_model(model, data)
    try:
        net.load_state_dict(_state_dict(obj))
    except RuntimeError as exc:
        raise InputError(f"{p} does not fit the bundled {model!r} for this data: {_reason(exc)}") from None
    return net


def quantizable_layers(model: nn.Module) -> tuple[Any, ...] | None:
    """Layer names to quantize in a model whose layers are not torch's own classes (an unflattened
    export program): every module that holds parameters itself. None for ordinary models (the
    Policy's default layer types apply).

    >>> quantizable_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None
    True
    """
    mods = list(model.named_modules())
    if any(isinstance(m, DEFAULT_LAYERS) for _, m in mods):
        return None
    return tuple(n for n, m in mods if n and any(True for _ in m.parameters(recurse=False)))
