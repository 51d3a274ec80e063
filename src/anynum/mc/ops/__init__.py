"""The torch-facing ops of `MCTensor`, each registered in the op table (`anynum.mc.optable`).

Importing this package registers them all; `anynum.mc` does so on import.

* `arithmetic`: + - * / neg abs square reciprocal pow
* `elementary`: sqrt exp expm1 log relu sigmoid tanh
* `compare`: < <= > >= == != maximum minimum where
* `reductions`: sum mean softmax log_softmax
* `products`: matmul mm mv bmm dot addmm F.linear F.embedding
* `structure`: cat stack, views and index functions, item assignment, isfinite isnan numel
* `rule`: the generic rule they share (promotion, autograd bridge, NaN/inf patching)
"""

from __future__ import annotations

from anynum.mc.ops.arithmetic import abs, add, div, mul, neg, pow, reciprocal, square, sub
from anynum.mc.ops.compare import eq, ge, gt, le, lt, maximum, minimum, ne, where
from anynum.mc.ops.elementary import exp, expm1, log, relu, sigmoid, sqrt, tanh
from anynum.mc.ops.products import addmm, bmm, dot, embedding, linear, matmul, mm, mv
from anynum.mc.ops.reductions import log_softmax, mean, softmax, sum
from anynum.mc.ops.structure import cat, isfinite, isnan, numel, setitem, stack

__all__ = [
    "abs", "add", "addmm", "bmm", "cat", "div", "dot", "embedding", "eq", "exp", "expm1", "ge",
    "gt", "isfinite", "isnan", "le", "linear", "log", "log_softmax", "lt", "matmul", "maximum",
    "mean", "minimum", "mm", "mul", "mv", "ne", "neg", "numel", "pow", "reciprocal", "relu",
    "setitem", "sigmoid", "softmax", "sqrt", "square", "stack", "sub", "sum", "tanh", "where",
]
