"""Drop-in QPyTorch and Qtorch+ on anynum: change ``qtorch`` / ``qtorch_plus`` to ``anynum.compat.qtorch``.

The module layout is QPyTorch's: number classes here, ``.quant`` (quantize
functions, ``quantizer``, ``Quantizer``, Qtorch+'s posit and table functions),
``.optim`` (``OptimLP``), ``.auto_low`` (``lower``, ``sequential_lower``);
plus Qtorch+'s top-level posit tanh modules and its ``prepare_model``.
Results are anynum's correct roundings; docs/compat.md lists every difference
from the peers, each with an example.

>>> import torch
>>> from anynum.compat.qtorch import FloatingPoint
>>> from anynum.compat.qtorch.quant import Quantizer
>>> q = Quantizer(forward_number=FloatingPoint(exp=5, man=2), forward_rounding="nearest")
>>> q(torch.tensor([3.14159, 1e6])).tolist()
[3.0, inf]
"""

from __future__ import annotations

import importlib
from typing import Any

from anynum.compat.qtorch.activation import PositTanhModule, PositTanhModuleEnhanced, RefTanhModule
from anynum.compat.qtorch.inference import prepare_model
from anynum.compat.qtorch.number import BlockFloatingPoint, FixedPoint, FloatingPoint, Number, Posit

__all__ = [
    "BlockFloatingPoint",
    "FixedPoint",
    "FloatingPoint",
    "Number",
    "Posit",
    "PositTanhModule",
    "PositTanhModuleEnhanced",
    "RefTanhModule",
    "prepare_model",
]

_SUBMODULES = ("quant", "optim", "auto_low", "number")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"anynum.compat.qtorch.{name}")
    raise AttributeError(f"module 'anynum.compat.qtorch' has no attribute {name!r}")
