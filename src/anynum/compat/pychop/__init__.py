"""Drop-in Pychop on anynum: change ``pychop`` to ``anynum.compat.pychop`` in the imports.

Pychop's names, signatures and defaults (``Chop``, ``LightChop``,
``FaultChop``, ``Bitchop``, ``Chopf``, ``Chopi``, ``float_params``,
``Customs``, ``Options``, the STE choppers, the chopped math functions,
``.layers``, ``.optimizers``, ``.ptq``) with anynum's correct results: one
rounding everywhere, rmode 7/8 right for negative numbers, rmode 9 keeping
exact values, -0 kept, IEEE overflow in directed modes, straight-through
gradients for every chopper, reproducible ``random_state``. The array type of
the input picks the implementation (NumPy, torch, JAX, Dask); there is no
global backend, and `backend` only checks its argument. docs/compat.md lists
every difference from Pychop with an example.

>>> import numpy as np
>>> from anynum.compat.pychop import Chop
>>> Chop(exp_bits=5, sig_bits=10, rmode=1)(np.array([3.14159])).tolist()
[3.140625]
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from anynum.compat.pychop.chop import Bitchop, Chop, FaultChop, LightChop
from anynum.compat.pychop.fixed import Chopf
from anynum.compat.pychop.formats import Customs, Options, float_params
from anynum.compat.pychop.functions import *  # noqa: F403  (Pychop's math_func names)
from anynum.compat.pychop.functions import __all__ as _FUNCTIONS
from anynum.compat.pychop.integer import Chopi
from anynum.compat.pychop.layers import ChopfSTE, ChopiSTE, ChopSTE
from anynum.errors import InputError

__version__ = "0.6.2"  # the Pychop release whose API this facade follows

_BACKENDS = ("numpy", "jax", "torch", "tensorflow", "tf", "auto")
_warned = False


def backend(lib: str = "auto", verbose: int = 0) -> None:
    """Accepted for compatibility and ignored: the input's array type picks the implementation.

    ``lib`` is checked (Pychop's names), and the first call with a library
    other than "auto" warns once that nothing changes.

    >>> backend("auto")
    """
    global _warned
    if lib not in _BACKENDS:
        raise InputError(f"Unsupported backend {lib!r}; must be one of {_BACKENDS}.")
    if lib != "auto" and not _warned:
        _warned = True
        warnings.warn(
            f"anynum.compat.pychop.backend({lib!r}) has no effect: every function works on NumPy, "
            "torch, JAX and Dask inputs by their type and returns the same type.",
            stacklevel=2,
        )
    if verbose:
        print("Backend selection is automatic (by input type).")


def get_backend() -> str:
    """Always "auto" (the input's type decides).

    >>> get_backend()
    'auto'
    """
    return "auto"


__all__ = [
    "Bitchop",
    "Chop",
    "ChopSTE",
    "Chopf",
    "ChopfSTE",
    "Chopi",
    "ChopiSTE",
    "Customs",
    "FaultChop",
    "LightChop",
    "Options",
    "backend",
    "float_params",
    "get_backend",
    *_FUNCTIONS,
]

_SUBMODULES = ("layers", "optimizers", "ptq")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"anynum.compat.pychop.{name}")
    raise AttributeError(f"module 'anynum.compat.pychop' has no attribute {name!r}")
