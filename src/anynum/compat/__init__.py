"""Drop-in facades of the peers' public APIs, backed by anynum.

A script written for QPyTorch / Qtorch+ or Pychop changes only its import
prefix and runs on anynum's kernels, with the peers' names, signatures and
defaults, and with correct results where the peers are wrong (docs/compat.md
lists every difference with an example):

* ``anynum.compat.qtorch``: ``qtorch`` and ``qtorch_plus`` (``.quant``,
  ``.optim``, ``.auto_low``, the number classes, posit and table quantizers).
* ``anynum.compat.pychop``: ``pychop`` (``Chop``, ``LightChop``, ``FaultChop``,
  ``Chopf``, ``Chopi``, the chopped math functions, ``.layers``,
  ``.optimizers``, ``.ptq``).

The facades load on first attribute access, so ``import anynum.compat`` is cheap.

>>> from anynum.compat import qtorch, pychop
>>> qtorch.__name__, pychop.__name__
('anynum.compat.qtorch', 'anynum.compat.pychop')
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["pychop", "qtorch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = importlib.import_module(f"anynum.compat.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'anynum.compat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
