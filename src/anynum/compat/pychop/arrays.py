"""What the Pychop facade needs to know about array types: picked by the input, never by a switch.

NumPy arrays, torch tensors, JAX and Dask arrays go to `anynum.quantize` as
they are (it returns the same kind); Python scalars, lists and tuples become
NumPy float64 (Pychop converts them the same way); integer and bool arrays
become the floating type of their kind.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import torch

__all__ = ["as_float", "is_complex", "kind", "namespace"]


def kind(x: Any) -> str:
    """ "torch", "numpy", "jax" or "dask" (by the array's type).

    >>> kind(np.zeros(2)), kind(torch.zeros(2))
    ('numpy', 'torch')
    """
    if isinstance(x, torch.Tensor):
        return "torch"
    root = type(x).__module__.split(".")[0]
    if root in ("jax", "jaxlib"):
        return "jax"
    if root == "dask":
        return "dask"
    return "numpy"


def namespace(x: Any) -> ModuleType:
    """The array module of `x`: torch, jax.numpy or numpy (also for Dask, through NumPy ufuncs)."""
    k = kind(x)
    if k == "torch":
        return torch
    if k == "jax":
        import jax.numpy as jnp

        return jnp
    return np


def as_float(x: Any) -> Any:
    """`x` as a floating (or complex) array of its own kind; scalars and sequences as NumPy float64.

    >>> as_float([1, 2]).dtype, as_float(torch.tensor([1])).dtype
    (dtype('float64'), torch.float32)
    """
    k = kind(x)
    if k == "torch":
        return x if (x.is_floating_point() or x.is_complex()) else x.to(torch.get_default_dtype())
    if k in ("jax", "dask"):
        return x if np.dtype(x.dtype).kind in "fc" else x.astype(np.float64 if k == "dask" else "float32")
    if isinstance(x, np.ndarray):
        return x if x.dtype.kind in "fc" else x.astype(np.float64)
    if isinstance(x, (np.floating, np.complexfloating)):
        return x
    arr = np.asarray(x)
    if arr.dtype.kind not in "fc":
        arr = arr.astype(np.float64)
    return arr if arr.ndim else arr[()]


def is_complex(x: Any) -> bool:
    """Whether `x` holds complex numbers (rounded part by part)."""
    if isinstance(x, torch.Tensor):
        return x.is_complex()
    return np.dtype(getattr(x, "dtype", np.float64)).kind == "c"
