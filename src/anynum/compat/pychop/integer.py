"""Pychop's integer quantizer ``Chopi(bits, symmetric, per_channel, axis)`` on `anynum.quantize_int`.

``quantize(x)`` calibrates a scale (and zero point) from `x`, per tensor or per
channel along `axis`, and returns integer codes (int8/int16/int32 for 8, 16,
32 bits, else int64) of the input's array kind; ``dequantize(codes)`` maps them
back with the stored scale; calling the object does both (fake quantization,
gradients straight through). The rules are anynum's, identical on every array
kind (Pychop's NumPy and torch backends give different codes):

* symmetric: ``scale = max|x| / (2**(bits-1) - 1)``, codes in ``±(2**(bits-1) - 1)``,
  zero point 0 (Pychop divides the full range max - min by 2**bits - 1 and then
  clips half of it away when the data are one-sided);
* asymmetric: ``[min(x, 0), max(x, 0)]`` onto the whole signed code range with an
  integer zero point, so 0.0 is exact (Pychop uses only ``[0, 2**(bits-1) - 1]``).

NaN or ±inf in `x` raises (no scale represents it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import anynum as an
from anynum.compat.pychop.arrays import as_float, kind
from anynum.compat.straight import straight_through
from anynum.errors import InputError
from anynum.quantize import IntQuantized

__all__ = ["Chopi"]

_INT_TYPES = {8: torch.int8, 16: torch.int16, 32: torch.int32}


def _to_torch(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.array(x))


def _back(t: torch.Tensor, like: Any) -> Any:
    k = kind(like)
    if k == "torch":
        return t
    arr = t.detach().cpu().numpy()
    if k == "jax":
        import jax.numpy as jnp

        return jnp.asarray(arr)
    return arr


class Chopi:
    """Integer quantization: ``quantize`` to codes, ``dequantize`` back, call for both.

    >>> ch = Chopi(bits=8, symmetric=True)
    >>> q = ch.quantize(np.array([-1.0, 0.5, 2.0])); q.tolist(), q.dtype
    ([-64, 32, 127], dtype('int8'))
    >>> [round(v, 4) for v in ch.dequantize(q).tolist()]
    [-1.0079, 0.5039, 2.0]
    """

    def __init__(
        self, bits: int = 8, symmetric: bool = False, per_channel: bool = False, axis: int = 0
    ) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 53:
            raise InputError(f"Chopi bits must be an integer in 2..53, got {bits!r}.")
        self.bits, self.symmetric, self.per_channel, self.axis = (
            bits,
            bool(symmetric),
            bool(per_channel),
            axis,
        )
        self.fmt = an.IntFormat(bits)
        self.qmin, self.qmax = (
            (-(2 ** (bits - 1)) + 1 if symmetric else -(2 ** (bits - 1))),
            2 ** (bits - 1) - 1,
        )
        self.int_dtype = _INT_TYPES.get(bits, torch.int64)
        self.scale: Any = None
        self.zero_point: Any = None
        self._last: IntQuantized | None = None

    def calibrate(self, x: Any) -> None:
        """Compute and store the scale and zero point of `x` (``quantize`` does this on every call)."""
        self.quantize(x)

    def quantize(self, x: Any) -> Any:
        """Integer codes of `x` (the input's array kind), after calibrating on `x`."""
        xf = as_float(x)
        if np.dtype(str(getattr(xf, "dtype", "float64")).replace("torch.", "")).kind == "c":
            raise InputError("Chopi quantizes real arrays, got a complex one.")
        t = _to_torch(xf).detach()
        q = an.quantize_int(
            t, self.fmt, symmetric=self.symmetric, axis=self.axis if self.per_channel else None
        )
        self._last = q
        self.scale, self.zero_point = _back(q.scale, xf), _back(q.zero_point, xf)
        return _back(q.codes.to(self.int_dtype), xf)

    def dequantize(self, q: Any) -> Any:
        """``(codes - zero_point) * scale`` with the stored calibration (the scale's dtype)."""
        if self._last is None:
            raise InputError("Chopi must quantize (calibrate) before it can dequantize.")
        codes = _to_torch(q).to(torch.int64)
        last = self._last
        values = an.dequantize_int(IntQuantized(codes, last.scale, last.zero_point, last.fmt, last.axis))
        return _back(values, q)

    def __call__(self, x: Any) -> Any:
        """Fake quantization, ``dequantize(quantize(x))``; torch gradients pass straight through."""
        xf = as_float(x)
        y = self.dequantize(self.quantize(xf))
        if kind(xf) == "torch":
            return straight_through(xf, y.to(xf.dtype))
        return y.astype(xf.dtype) if hasattr(y, "astype") else y

    def __repr__(self) -> str:
        return (
            f"Chopi(bits={self.bits}, symmetric={self.symmetric}, "
            f"per_channel={self.per_channel}, axis={self.axis})"
        )
