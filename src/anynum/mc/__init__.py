"""Multi-component high precision: `MCTensor`, error-free transforms, MC arithmetic,
functions, reductions, Ozaki-scheme matrix products, and learning (`mc.nn`, `mc.optim`).

A value is held as the unevaluated sum of ``nc`` floating-point tensors (float16,
bfloat16, float32 or float64).  With nc = 2 the relative error of each operation is
bounded by a small multiple of ``u**2`` (u = 2**-p), e.g. float16 components give about
22 significant bits, float32 about 48, float64 about 106.

>>> import torch
>>> from anynum import mc
>>> x = mc.MCTensor(torch.tensor([1.0], dtype=torch.float16), nc=2)
>>> y = x + 2.0**-16                    # below float16 resolution at 1.0, but kept
>>> (y - 1.0).item() == 2.0**-16
True
"""

from __future__ import annotations

from anynum.mc import eft, engine, nn, optim
from anynum.mc.eft import fast_two_sum, fma_available, split, two_prod, two_sum
from anynum.mc.engine import set_matmul_engine
from anynum.mc.ops import (
    abs,
    add,
    addmm,
    bmm,
    cat,
    div,
    dot,
    eq,
    exp,
    expm1,
    ge,
    gt,
    le,
    log,
    log_softmax,
    lt,
    matmul,
    maximum,
    mean,
    minimum,
    mm,
    mul,
    mv,
    ne,
    neg,
    pow,
    reciprocal,
    relu,
    sigmoid,
    softmax,
    sqrt,
    square,
    stack,
    sub,
    sum,
    tanh,
    where,
)
from anynum.mc.tensor import MCTensor

__all__ = [
    "MCTensor",
    "abs",
    "add",
    "addmm",
    "bmm",
    "cat",
    "div",
    "dot",
    "eft",
    "engine",
    "eq",
    "exp",
    "expm1",
    "fast_two_sum",
    "fma_available",
    "ge",
    "gt",
    "le",
    "log",
    "log_softmax",
    "lt",
    "matmul",
    "maximum",
    "mean",
    "minimum",
    "mm",
    "mul",
    "mv",
    "ne",
    "neg",
    "nn",
    "optim",
    "pow",
    "reciprocal",
    "relu",
    "set_matmul_engine",
    "sigmoid",
    "softmax",
    "split",
    "sqrt",
    "square",
    "stack",
    "sub",
    "sum",
    "tanh",
    "two_prod",
    "two_sum",
    "where",
]
