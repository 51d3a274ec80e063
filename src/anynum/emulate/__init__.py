"""Arithmetic emulation: every op of a model computed in a number format (docs/emulate.md).

``an.emulate(fmt, ...)`` (this package is callable: calling it is
`anynum.emulate.mode.emulate`, the TorchDispatchMode), ``an.EmulatedTensor`` /
``an.as_format`` (values stored as packed codes) and ``an.matmul`` with
accumulation formats and the posit quire.

>>> import torch, anynum as an
>>> with an.emulate("posit(16,2)"):
...     y = torch.tensor([1.0]) / 3
>>> y.item()
0.3333740234375
"""

import inspect
import sys
import types
from typing import Any

from anynum.emulate import rules as _rules  # noqa: F401  (registers the dot/reduction rules)
from anynum.emulate.accumulate import Accumulation, Accumulator
from anynum.emulate.matmul import matmul
from anynum.emulate.mode import EmulateMode, emulate
from anynum.emulate.tensor import EmulatedTensor, as_format

__all__ = ["Accumulation", "Accumulator", "EmulateMode", "EmulatedTensor", "as_format", "emulate", "matmul"]


class _CallablePackage(types.ModuleType):
    """``anynum.emulate`` is both this package and the function `emulate` (DESIGN section 3)."""

    __signature__ = inspect.signature(emulate)

    def __call__(self, *args: Any, **kwargs: Any) -> EmulateMode:
        return emulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
