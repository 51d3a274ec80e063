"""Exact power-of-two arithmetic on float tensors by reading and writing exponent bits.

These are the few primitives every rounding kernel builds on. They avoid
``torch.frexp``/``torch.ldexp`` because those either fail under torch.compile
(frexp) or are not exact outside the normal range (ldexp multiplies by a
rounded ``2.0**n``).
"""

from __future__ import annotations

import torch

__all__ = ["FloatLayout", "floor_log2", "layout", "ldexp", "pow2", "select"]


class FloatLayout:
    """Bit layout of a torch floating dtype used as a working type."""

    def __init__(self, dtype: torch.dtype, int_dtype: torch.dtype, man_bits: int, exp_bits: int):
        self.dtype = dtype
        self.int_dtype = int_dtype
        self.man_bits = man_bits
        self.exp_bits = exp_bits
        self.bias = (1 << (exp_bits - 1)) - 1
        self.emin = 1 - self.bias  # exponent of the smallest normal
        self.emax = self.bias  # exponent of the largest finite binade
        self.quantum_min = self.emin - man_bits  # exponent of the smallest subnormal


_LAYOUTS = {
    torch.float32: FloatLayout(torch.float32, torch.int32, 23, 8),
    torch.float64: FloatLayout(torch.float64, torch.int64, 52, 11),
    torch.float16: FloatLayout(torch.float16, torch.int16, 10, 5),
    torch.bfloat16: FloatLayout(torch.bfloat16, torch.int16, 7, 8),
}


def layout(dtype: torch.dtype) -> FloatLayout:
    """The `FloatLayout` of a torch float dtype."""
    return _LAYOUTS[dtype]


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) as int32 for positive finite float32/float64 `a`, subnormals included.

    Zero, negative, inf and NaN entries give meaningless values: mask them.

    >>> floor_log2(torch.tensor([1.0, 3.0, 0.25, 1e-45])).tolist()
    [0, 1, -2, -149]
    """
    lay = _LAYOUTS[a.dtype]
    lift = lay.man_bits + 2  # multiplying subnormals by 2**lift makes them normal
    tiny = a < 2.0**lay.emin
    a = torch.where(tiny, a * 2.0**lift, a)
    bits = a.view(lay.int_dtype)
    e = ((bits >> lay.man_bits) & ((1 << lay.exp_bits) - 1)).to(torch.int32) - lay.bias
    return e - tiny.to(torch.int32) * lift


def pow2(n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Exactly 2**n for integer tensor `n` within the normal exponent range of `dtype`.

    >>> pow2(torch.tensor([-3, 0, 10]), torch.float32).tolist()
    [0.125, 1.0, 1024.0]
    """
    lay = _LAYOUTS[dtype]
    biased = (n.to(lay.int_dtype) + lay.bias) << lay.man_bits
    return biased.view(dtype)


def ldexp(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """x * 2**n, exact whenever the result is representable (two exact power-of-two steps).

    `n` must lie within twice the dtype's normal exponent range.

    >>> ldexp(torch.tensor([3.0]), torch.tensor([-149])).tolist()  # a float32 subnormal
    [4.203895392974451e-45]
    """
    half = torch.div(n, 2, rounding_mode="floor")
    return x * pow2(half, x.dtype) * pow2(n - half, x.dtype)


_SAME_SIZE_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.int32: torch.int32,
                  torch.int64: torch.int64}  # fmt: skip


def select(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, a, b)``, bit for bit, for `a` and `b` of one shape and dtype.

    On the CPU outside torch.compile it blends the bit patterns: torch's CPU `where`
    branches on each element, which costs about 5 ns an element where the mask is random
    (65,536 float64: 0.31 ms against the blend's 0.13 ms), and rounding decisions are
    random masks. Elsewhere, for other shapes or dtypes and for inputs that need gradients,
    it is `torch.where`. NaN payloads, infinities and signed zeros are kept as they are.

    >>> a, b = torch.tensor([1.0, -0.0]), torch.tensor([2.0, float("inf")])
    >>> select(torch.tensor([True, False]), a, b).tolist()
    [1.0, inf]
    """
    int_dtype = _SAME_SIZE_INT.get(a.dtype)
    if (
        int_dtype is None
        or not a.is_cpu
        or a.dtype != b.dtype
        or mask.dtype != torch.bool
        or a.shape != b.shape
        or mask.shape != a.shape
        or a.requires_grad
        or b.requires_grad
        or torch.compiler.is_compiling()
    ):
        return torch.where(mask, a, b)
    ai, bi = a.view(int_dtype), b.view(int_dtype)
    ones_where_a = mask.to(int_dtype).neg_()
    return (ai ^ bi).bitwise_and_(ones_where_a).bitwise_xor_(bi).view(a.dtype)
