"""Up-front argument checks of the public nn/optim/experiments entry points.

Each raises `AnynumError` naming what was expected, what was received and the fix, before any
work starts (an int passed as a model fails here, not as an AttributeError deep inside).

>>> check_module(42, "anynum.nn.convert")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
anynum.errors.AnynumError: anynum.nn.convert needs a torch.nn.Module as its model, got int (42); ...
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError, InputError

__all__ = ["check_flag", "check_module", "check_seed", "check_tensor"]

_SEED_LIMIT = 1 << 63


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} ({text if len(text) <= 40 else text[:37] + '...'})"


def check_module(model: Any, where: str) -> nn.Module:
    """`model` if it is a torch.nn.Module, else AnynumError.

    >>> type(check_module(nn.Linear(1, 1), "anynum.nn.convert")).__name__
    'Linear'
    """
    if not isinstance(model, nn.Module):
        raise AnynumError(
            f"{where} needs a torch.nn.Module as its model, got {_shown(model)}; "
            f"pass the model itself, e.g. {where}(model, policy)."
        )
    return model


def check_seed(seed: Any, where: str) -> int | None:
    """None, or an int seed in [0, 2**63) (what torch generators take, with room for offsets).

    >>> check_seed(7, "anynum.Quantizer"), check_seed(None, "anynum.Quantizer")
    (7, None)
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_LIMIT:
        raise AnynumError(
            f"{where}: seed must be an integer in [0, 2**63) or None, got {_shown(seed)}; "
            "e.g. seed=0."
        )
    return seed


def check_flag(value: Any, name: str, where: str) -> bool:
    """`value` if it is a bool (True/False), else AnynumError (a string such as 'no' is truthy).

    >>> check_flag("no", "copy_model", "post_quantize")
    Traceback (most recent call last):
    ...
    anynum.errors.AnynumError: post_quantize: copy_model must be True or False, got str ('no').
    """
    if not isinstance(value, bool):
        raise AnynumError(f"{where}: {name} must be True or False, got {_shown(value)}.")
    return value


def check_tensor(x: Any, where: str) -> torch.Tensor:
    """`x` if it is a floating torch tensor, else InputError.

    >>> check_tensor(torch.ones(2), "anynum.Quantizer").tolist()
    [1.0, 1.0]
    """
    if not isinstance(x, torch.Tensor):
        raise InputError(
            f"{where} rounds torch tensors, got {_shown(x)}; convert it first "
            "(torch.as_tensor(x)), or use anynum.quantize, which also takes NumPy, JAX and Dask arrays."
        )
    if not x.is_floating_point():
        raise InputError(
            f"{where} rounds float16/bfloat16/float32/float64 tensors, got dtype {x.dtype}; "
            "convert it first (x.float())."
        )
    return x
