"""The ops with their own rule when ``accumulate=`` is not None or the format is a Block: dot
products (mm, addmm, bmm, baddbmm, mv, addmv, dot, addbmm, convolution and its backward) and the
reductions sum, mean, cumsum, prod and linalg_vector_norm (p = 1, 2, inf).

Each rule rounds the inputs onto the grid, hands the work to the `Accumulator`
(`anynum.emulate.accumulate`), and stores the once-rounded result in the
dtype the op would produce. With a Block format the dot-product operands are
quantized in blocks along the reduction axis first (the OCP MX dot product);
Block reductions other than dot products follow the generic rule. In-place
(``addmm_``) and ``out=`` forms write the result into their target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from anynum.emulate.conv import conv_backward, conv_forward
from anynum.emulate.engine import SPECIAL, Emulator
from anynum.emulate.grid import check_float_container
from anynum.errors import AnynumError

__all__: list[str] = []

_F64 = torch.float64
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    if pos < len(args):
        return args[pos]
    return kwargs.get(name, default)


def _in(em: Emulator, t: torch.Tensor | None) -> torch.Tensor | None:
    """An input rounded onto the grid, as float64."""
    if t is None:
        return None
    return em.grid.round_input(t).to(_F64)


def _finish(em: Emulator, y: torch.Tensor, dtype: torch.dtype, target: torch.Tensor | None) -> torch.Tensor:
    """The float64 result (already on the grid) stored as `dtype`, or written into `target`."""
    check_float_container(em.grid, dtype if target is None else target.dtype)
    if target is not None:
        target.copy_(y)
        return em.grid.mark(target, written=True)
    return em.grid.mark(y.to(dtype))


def _target(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> torch.Tensor | None:
    if "out" in kwargs:
        return kwargs["out"]  # type: ignore[no-any-return]
    if func.overloadpacket.__name__.endswith("_"):
        return args[0]  # type: ignore[no-any-return]
    return None


def _dot(em: Emulator) -> Callable[..., torch.Tensor]:
    """``dot(a, b, bias=None)``: Block operands quantized along K, accumulated, rounded onto the grid."""

    def dot(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, alpha: float = 1.0,
            beta: float = 1.0) -> torch.Tensor:
        bits = em.grid.precision
        if em.block is not None:
            a = em.grid.round_blocks(a, em.block, -1)
            b = em.grid.round_blocks(b, em.block, -2)
            bits = em.block.element.precision
        return em.acc.dot(a, b, em.grid, bias=bias, alpha=alpha, beta=beta, operand_bits=bits)

    return dot


def _floats(*ts: Any) -> bool:
    return all(t is None or (isinstance(t, torch.Tensor) and t.dtype in _FLOATS) for t in ts)


def _dtype(*ts: torch.Tensor | None) -> torch.dtype:
    out: torch.dtype | None = None
    for t in ts:
        if t is not None:
            out = t.dtype if out is None else torch.promote_types(out, t.dtype)
    assert out is not None
    return out


# --- dot products --------------------------------------------------------------------------------


def _mm(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    a, b = args[0], args[1]
    if not _floats(a, b):
        return NotImplemented
    y = _dot(em)(_in(em, a), _in(em, b))
    return _finish(em, y, _dtype(a, b), _target(func, args, kwargs))


def _addmm(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    bias, a, b = args[0], args[1], args[2]
    if not _floats(bias, a, b):
        return NotImplemented
    beta = em.grid.round_scalar(float(_arg(args, kwargs, 3, "beta", 1.0)))
    alpha = em.grid.round_scalar(float(_arg(args, kwargs, 4, "alpha", 1.0)))
    bias64 = _in(em, bias) if beta != 0 else None
    y = _dot(em)(_in(em, a), _in(em, b), bias=bias64, alpha=alpha, beta=beta)
    return _finish(em, y, _dtype(bias, a, b), _target(func, args, kwargs))


def _mv(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    a, v = args[0], args[1]
    if not _floats(a, v):
        return NotImplemented
    y = _dot(em)(_in(em, a), _in(em, v).unsqueeze(-1)).squeeze(-1)  # type: ignore[union-attr]
    return _finish(em, y, _dtype(a, v), _target(func, args, kwargs))


def _addmv(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    bias, a, v = args[0], args[1], args[2]
    if not _floats(bias, a, v):
        return NotImplemented
    beta = em.grid.round_scalar(float(_arg(args, kwargs, 3, "beta", 1.0)))
    alpha = em.grid.round_scalar(float(_arg(args, kwargs, 4, "alpha", 1.0)))
    bias64 = _in(em, bias).unsqueeze(-1) if beta != 0 else None  # type: ignore[union-attr]
    y = _dot(em)(_in(em, a), _in(em, v).unsqueeze(-1), bias=bias64, alpha=alpha, beta=beta)  # type: ignore[union-attr]
    return _finish(em, y.squeeze(-1), _dtype(bias, a, v), _target(func, args, kwargs))


def _vdot(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    a, b = args[0], args[1]
    if not _floats(a, b):
        return NotImplemented
    y = _dot(em)(_in(em, a).unsqueeze(0), _in(em, b).unsqueeze(-1)).reshape(())  # type: ignore[union-attr]
    return _finish(em, y, _dtype(a, b), _target(func, args, kwargs))


def _addbmm(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    bias, a, b = args[0], args[1], args[2]
    if not _floats(bias, a, b):
        return NotImplemented
    beta = em.grid.round_scalar(float(_arg(args, kwargs, 3, "beta", 1.0)))
    alpha = em.grid.round_scalar(float(_arg(args, kwargs, 4, "alpha", 1.0)))
    a64, b64 = _in(em, a), _in(em, b)
    assert a64 is not None and b64 is not None
    n, m, k = a64.shape
    a2 = a64.permute(1, 0, 2).reshape(m, n * k)  # reduction over (batch, k), row-major
    b2 = b64.reshape(n * k, -1)
    bias64 = _in(em, bias) if beta != 0 else None
    y = _dot(em)(a2, b2, bias=bias64, alpha=alpha, beta=beta)
    return _finish(em, y, _dtype(bias, a, b), _target(func, args, kwargs))


def _skip_zeros(em: Emulator) -> bool:
    """Whether convolutions may leave out their zero padding terms (`Accumulator.zero_terms_vanish`;
    Block operands are quantized in blocks along the whole reduction axis, zeros included)."""
    return em.block is None and em.acc.zero_terms_vanish


def _convolution(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    x, w, bias = args[0], args[1], args[2]
    if not _floats(x, w, bias):
        return NotImplemented
    stride, padding, dilation, transposed, output_padding, groups = args[3:9]
    y = conv_forward(
        _in(em, x), _in(em, w), _in(em, bias), stride, padding, dilation,  # type: ignore[arg-type]
        transposed, output_padding, groups, _dot(em), skip_zeros=_skip_zeros(em),
    )
    return _finish(em, y, _dtype(x, w, bias), None)


def _convolution_backward(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    gy, x, w = args[0], args[1], args[2]
    if not _floats(gy, x, w):
        return NotImplemented
    stride, padding, dilation, transposed, output_padding, groups, mask = args[4:11]
    gy64, x64, w64 = _in(em, gy), _in(em, x), _in(em, w)

    def sum_over(t: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
        return _reduce_sum(em, t, dims, False)

    gi, gw, gb = conv_backward(
        gy64, x64, w64, stride, padding, dilation, transposed, output_padding, groups,  # type: ignore[arg-type]
        mask, _dot(em), sum_over, skip_zeros=_skip_zeros(em),
    )
    return tuple(
        None if r is None else _finish(em, r, like.dtype, None)
        for r, like in ((gi, x), (gw, w), (gb, gy))
    )


# --- reductions ------------------------------------------------------------------------------------


def _reduce_sum(em: Emulator, x64: torch.Tensor, dims: Sequence[int] | None, keepdim: bool) -> torch.Tensor:
    return em.acc.sum(x64, list(dims or []), em.grid, keepdim=keepdim)


def _reduction(em: Emulator, func: Any, args: tuple, kwargs: dict, op: str) -> Any:
    x = args[0]
    if em.spec.kind == "float64" or not _floats(x):
        return NotImplemented
    overload = func._overloadname
    if overload == "default":  # sum(x, dtype=None), mean(x, dtype=None), prod(x, dtype=None)
        dims: list[int] = []
        keepdim = False
        dtype = _arg(args, kwargs, 1, "dtype")
    else:
        dim = _arg(args, kwargs, 1, "dim")
        dims = [dim] if isinstance(dim, int) else list(dim or [])
        keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
        dtype = _arg(args, kwargs, 3, "dtype")
    if dtype is not None and dtype not in _FLOATS:
        return NotImplemented
    x64 = _in(em, x)
    assert x64 is not None
    if op == "sum":
        y = _reduce_sum(em, x64, dims, keepdim)
    elif op == "mean":
        y = em.acc.mean(x64, dims, em.grid, keepdim=keepdim)
    else:
        y = em.acc.prod(x64, dims, em.grid, keepdim=keepdim)
    return _finish(em, y, dtype or x.dtype, kwargs.get("out"))


def _cumsum(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    if em.spec.kind == "float64" or not _floats(x):
        return NotImplemented
    dim = int(_arg(args, kwargs, 1, "dim"))
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype not in _FLOATS:
        return NotImplemented
    x64 = _in(em, x)
    assert x64 is not None
    y = em.acc.cumsum(x64, dim if x64.dim() else 0, em.grid) if x64.dim() else x64
    return _finish(em, y, dtype or x.dtype, _target(func, args, kwargs))


def _vector_norm(em: Emulator, func: Any, args: tuple, kwargs: dict) -> Any:
    x = args[0]
    if em.spec.kind == "float64" or not _floats(x):
        return NotImplemented
    ord_ = float(_arg(args, kwargs, 1, "ord", 2))
    dim = _arg(args, kwargs, 2, "dim")
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    keepdim = bool(_arg(args, kwargs, 3, "keepdim", False))
    dtype = _arg(args, kwargs, 4, "dtype")
    x64 = _in(em, x)
    assert x64 is not None
    if ord_ == 2:
        y = em.acc.norm2(x64, dims, em.grid, keepdim=keepdim)
    elif ord_ == 1:
        y = _reduce_sum(em, x64.abs(), dims, keepdim)
    elif math.isinf(ord_):
        return NotImplemented  # max/min of |x|: values of the grid, the generic rule is exact
    else:
        raise AnynumError(
            f"{func} with ord={ord_} under accumulate={em.spec.kind}: expected ord 1, 2 or inf "
            "(their sums follow the accumulation). Fix: accumulate=None, or exclude='linalg_vector_norm'."
        )
    return _finish(em, y, dtype or x.dtype, kwargs.get("out"))


for _name in ("mm", "bmm"):
    SPECIAL[_name] = _mm
for _name in ("addmm", "addmm_", "baddbmm", "baddbmm_"):
    SPECIAL[_name] = _addmm
SPECIAL["mv"] = _mv
SPECIAL["addmv"] = SPECIAL["addmv_"] = _addmv
SPECIAL["dot"] = SPECIAL["vdot"] = _vdot
SPECIAL["addbmm"] = SPECIAL["addbmm_"] = _addbmm
SPECIAL["convolution"] = _convolution
SPECIAL["convolution_backward"] = _convolution_backward
SPECIAL["sum"] = lambda em, f, a, k: _reduction(em, f, a, k, "sum")
SPECIAL["mean"] = lambda em, f, a, k: _reduction(em, f, a, k, "mean")
SPECIAL["prod"] = lambda em, f, a, k: _reduction(em, f, a, k, "prod")
SPECIAL["cumsum"] = SPECIAL["cumsum_"] = _cumsum
SPECIAL["linalg_vector_norm"] = _vector_norm
