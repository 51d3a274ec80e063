"""`MCTensor`: an unevaluated sum of ``nc`` floating-point tensors of one dtype.

Design
------
* Storage: a tuple of ``nc`` tensors of identical shape, largest component first, kept
  normalised (``x_i = RN(x_i + x_{i+1})`` for nc = 2, nonoverlapping for nc > 2).
* This module holds the type: construction, shape and structure (views act on every
  component), autograd attributes, conversion and printing (delegated to
  `anynum.mc.convert`).  Arithmetic and every other torch function live in `anynum.mc.ops`
  and are found through the op table (`anynum.mc.optable`): ``torch.*`` and
  ``torch.nn.functional`` functions reach an MCTensor through ``__torch_function__`` (it is
  a tensor-like, not a tensor subclass), and the operators and method forms (``x + y``,
  ``x.sum()``) look up the same table.
* Autograd: every arithmetic operation is one `torch.autograd.Function` whose forward runs
  the MC algorithm without building a graph and whose backward differentiates the native
  operation on the leading components (`anynum.mc.ops.rule`).  Every component of an input
  receives the same gradient, the derivative with respect to the *value* (the sum of the
  components); ``x.grad`` is that gradient.  Structural operations (indexing, reshape, cat,
  ...) act on each component and are differentiated by torch directly.
* Mixing: MC with MC of different nc promotes to the larger nc; different component
  dtypes or devices raise `AnynumError`; plain tensors and Python numbers are converted to
  the MC dtype (exactly when they fit in nc components).
* NaN/inf: where the MC algorithm yields a non-finite leading component (NaN/inf inputs,
  overflow) or an input is outside a function's domain, the result is the native result
  of the leading components with zero lower components, so IEEE semantics carry over
  (``inf + 1 = inf``, ``log(-1) = nan``, ``sqrt(-0.0) = -0.0``...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc._core import Comps, check_dtype
from anynum.mc.convert import comps_repr, convert_comps, from_tensor, to_mpmath, to_tensor
from anynum.mc.expansion import renormalize
from anynum.mc.optable import lookup

__all__ = ["MCTensor", "wrap"]


def _op(func: Callable[..., Any]) -> Callable[..., Any]:
    """A method that runs the op table's implementation of `func` with self first."""

    def method(self: MCTensor, *args: Any, **kwargs: Any) -> Any:
        return lookup(func)(self, *args, **kwargs)

    method.__name__ = getattr(func, "__name__", "op")
    method.__doc__ = f"Same as ``{method.__name__}(self, ...)`` (see `anynum.mc.ops`)."
    return method


def _rop(func: Callable[..., Any]) -> Callable[..., Any]:
    """A reflected operator method: `func(other, self)`."""

    def method(self: MCTensor, other: Any) -> Any:
        return lookup(func)(other, self)

    method.__name__ = "r" + getattr(func, "__name__", "op")
    return method


class MCTensor:
    """A multi-component tensor: the exact, unevaluated sum of ``nc`` float tensors.

    ``MCTensor(t, nc=2)`` wraps a float tensor exactly (components of ``t.dtype``, lower
    components zero); with ``dtype=`` it re-expresses ``t`` in that component dtype using
    up to ``nc`` components (exact if ``t`` fits, otherwise nearest).  A tuple or list of
    tensors is taken as components and renormalised.  Python numbers and lists use
    ``dtype`` (default ``torch.get_default_dtype()``) and are converted exactly when they
    fit.  Integer component dtypes raise `AnynumError`.

    NaN/inf: stored as given; a non-finite leading component determines the value.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0, 2.0]), nc=2)
    >>> y = x + 2.0**-40                     # kept, although far below float32 eps
    >>> (y - x).tolist() == [2.0**-40, 2.0**-40]
    True
    >>> x.nc, x.dtype, tuple(x.shape)
    (2, torch.float32, (2,))
    """

    __slots__ = ("_c",)
    _c: Comps

    def __init__(self, data: Any, nc: int | None = None, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, requires_grad: bool = False) -> None:
        if nc is not None and (not isinstance(nc, int) or isinstance(nc, bool) or nc < 1):
            raise AnynumError(f"nc must be a positive integer, got {nc!r}")
        if dtype is not None:
            if not isinstance(dtype, torch.dtype):
                raise AnynumError(f"dtype must be a torch.dtype, got {dtype!r}")
            check_dtype(dtype)
        if isinstance(data, MCTensor):
            comps = data._c
            tgt = dtype or data.dtype
            comps = convert_comps(comps, tgt, nc or data.nc)
        elif isinstance(data, (tuple, list)) and data and all(isinstance(d, torch.Tensor) for d in data):
            dts = {d.dtype for d in data}
            if len(dts) != 1:
                raise AnynumError(f"components must share one dtype, got {sorted(map(str, dts))}")
            d0 = data[0].dtype
            check_dtype(d0)
            ts = torch.broadcast_tensors(*data)
            n = nc or len(ts)
            comps = tuple(ts) if len(ts) == 1 else renormalize(list(ts), max(n, 1))
            if n != len(comps):
                comps = convert_comps(comps, d0, n)
            if dtype is not None and dtype != d0:
                comps = convert_comps(comps, dtype, n)
        else:
            if isinstance(data, torch.Tensor):
                t = data
                if not t.is_floating_point() and dtype is None:
                    raise AnynumError(
                        f"MCTensor components must be floating point; got a {t.dtype} tensor. "
                        "Pass dtype=torch.float32 (or another float dtype) to convert it."
                    )
            else:
                try:
                    t = torch.tensor(data, dtype=torch.float64)
                except Exception as exc:
                    raise AnynumError(
                        f"cannot build an MCTensor from {type(data).__name__}; expected a tensor, "
                        "a tuple of component tensors, or numbers"
                    ) from exc
                dtype = dtype or torch.get_default_dtype()
            tgt = dtype or t.dtype
            check_dtype(tgt)
            comps = from_tensor(t, tgt, nc or 2)
        if device is not None:
            comps = tuple(c.to(device) for c in comps)
        if requires_grad:
            comps = tuple(c.detach().requires_grad_(True) for c in comps)
        self._c = tuple(comps)

    @classmethod
    def _wrap(cls, comps: Comps) -> MCTensor:
        obj = cls.__new__(cls)
        obj._c = tuple(comps)
        return obj

    # ------------------------------------------------------------- basics
    @property
    def nc(self) -> int:
        """Number of components."""
        return len(self._c)

    @property
    def dtype(self) -> torch.dtype:
        """Component dtype."""
        return self._c[0].dtype

    @property
    def device(self) -> torch.device:
        return self._c[0].device

    @property
    def shape(self) -> torch.Size:
        return self._c[0].shape

    def size(self, dim: int | None = None) -> Any:
        return self._c[0].size() if dim is None else self._c[0].size(dim)

    def dim(self) -> int:
        return self._c[0].dim()

    @property
    def ndim(self) -> int:
        return self._c[0].dim()

    def numel(self) -> int:
        return self._c[0].numel()

    def __len__(self) -> int:
        return len(self._c[0])

    def components(self) -> Comps:
        """The ``nc`` component tensors, largest first (they share autograd history).

        >>> import torch
        >>> from anynum import mc
        >>> hi, lo = (mc.MCTensor(torch.tensor([1.0])) + 2.0**-30).components()
        >>> hi.item(), lo.item() == 2.0**-30
        (1.0, True)
        """
        return self._c

    # ------------------------------------------------------------- conversion and printing
    def to_tensor(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The value rounded once, to nearest-even, to `dtype` (default: component dtype).

        Differentiable: the gradient flows to every component.  NaN/inf: a non-finite
        component gives the IEEE sum of the components (inf stays inf, NaN stays NaN).

        >>> import torch
        >>> from anynum import mc
        >>> x = mc.MCTensor(torch.tensor([1.0], dtype=torch.float64), nc=2, dtype=torch.float16)
        >>> x.to_tensor(torch.float64).item()
        1.0
        """
        dtype = dtype or self.dtype
        check_dtype(dtype)
        return to_tensor(self._c, dtype)

    def to_mpmath(self) -> list[Any]:
        """Exact values as nested lists of ``mpmath.mpf`` (needs mpmath; for checking).

        >>> import torch
        >>> from anynum import mc
        >>> mc.MCTensor(torch.tensor([0.5])).to_mpmath()
        [mpf('0.5')]
        """
        return to_mpmath(self._c)

    def item(self) -> float:
        """The value correctly rounded to a Python float (float64)."""
        return float(self.to_tensor(torch.float64).item())

    def tolist(self) -> Any:
        """Values correctly rounded to float64, as (nested) Python lists."""
        return self.to_tensor(torch.float64).tolist()

    def __repr__(self) -> str:
        return comps_repr(self._c, self.requires_grad)

    def to(self, *args: Any, **kwargs: Any) -> MCTensor:
        """Move to a device and/or change the *component* dtype (the result stays MC).

        Use :meth:`to_tensor` for a plain tensor.
        """
        dtype = kwargs.pop("dtype", None)
        rest = []
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            else:
                rest.append(a)
        out = self
        if rest or kwargs:
            out = out._map(lambda c: c.to(*rest, **kwargs))
        if dtype is not None and dtype != self.dtype:
            check_dtype(dtype)
            out = MCTensor._wrap(convert_comps(out._c, dtype, out.nc))
        return out

    def cpu(self) -> MCTensor:
        return self._map(lambda c: c.cpu())

    def with_nc(self, nc: int) -> MCTensor:
        """The same value with `nc` components (rounded if nc shrinks)."""
        return MCTensor(self, nc)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise AnynumError("the truth value of an MCTensor with more than one element is ambiguous")
        return bool(self.to_tensor(torch.float64).item())

    # ------------------------------------------------------------- autograd
    @property
    def requires_grad(self) -> bool:
        return any(c.requires_grad for c in self._c)

    def requires_grad_(self, requires_grad: bool = True) -> MCTensor:
        for c in self._c:
            c.requires_grad_(requires_grad)
        return self

    @property
    def grad(self) -> torch.Tensor | None:
        """Gradient of the loss with respect to the value (a plain tensor), or None."""
        return self._c[0].grad

    @property
    def is_leaf(self) -> bool:
        return all(c.is_leaf for c in self._c)

    def detach(self) -> MCTensor:
        return MCTensor._wrap(tuple(c.detach() for c in self._c))

    def backward(self, gradient: torch.Tensor | None = None, **kw: Any) -> None:
        """Backpropagate from the value (``self.to_tensor()``)."""
        self.to_tensor().backward(gradient, **kw)

    def zero_grad_(self) -> None:
        for c in self._c:
            c.grad = None

    # ------------------------------------------------------------- structure
    def _map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> MCTensor:
        return MCTensor._wrap(tuple(f(c) for c in self._c))

    def clone(self) -> MCTensor:
        return self._map(torch.clone)

    def contiguous(self) -> MCTensor:
        return self._map(lambda c: c.contiguous())

    def reshape(self, *shape: Any) -> MCTensor:
        return self._map(lambda c: c.reshape(*shape))

    def view(self, *shape: Any) -> MCTensor:
        return self._map(lambda c: c.view(*shape))

    def permute(self, *dims: Any) -> MCTensor:
        return self._map(lambda c: c.permute(*dims))

    def transpose(self, d0: int, d1: int) -> MCTensor:
        return self._map(lambda c: c.transpose(d0, d1))

    def t(self) -> MCTensor:
        return self._map(lambda c: c.t())

    @property
    def T(self) -> MCTensor:
        return self._map(lambda c: c.permute(*range(c.dim() - 1, -1, -1)))

    @property
    def mT(self) -> MCTensor:
        return self._map(lambda c: c.transpose(-2, -1))

    def unsqueeze(self, d: int) -> MCTensor:
        return self._map(lambda c: c.unsqueeze(d))

    def squeeze(self, *d: Any) -> MCTensor:
        return self._map(lambda c: c.squeeze(*d))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> MCTensor:
        return self._map(lambda c: c.flatten(start_dim, end_dim))

    def expand(self, *shape: Any) -> MCTensor:
        return self._map(lambda c: c.expand(*shape))

    def expand_as(self, other: Any) -> MCTensor:
        return self.expand(other.shape)

    def __getitem__(self, idx: Any) -> MCTensor:
        return self._map(lambda c: c[idx])

    __setitem__ = _op(torch.Tensor.__setitem__)

    # ------------------------------------------------------------- torch functions
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return lookup(func)(*args, **(kwargs or {}))

    # ------------------------------------------------------------- operators (the op table)
    __add__, __radd__ = _op(torch.add), _rop(torch.add)
    __sub__, __rsub__ = _op(torch.sub), _rop(torch.sub)
    __mul__, __rmul__ = _op(torch.mul), _rop(torch.mul)
    __truediv__, __rtruediv__ = _op(torch.div), _rop(torch.div)
    __matmul__, __rmatmul__ = _op(torch.matmul), _rop(torch.matmul)
    __pow__ = _op(torch.pow)
    __neg__ = _op(torch.neg)
    __abs__ = _op(torch.abs)
    __lt__, __le__ = _op(torch.lt), _op(torch.le)
    __gt__, __ge__ = _op(torch.gt), _op(torch.ge)
    __eq__, __ne__ = _op(torch.eq), _op(torch.ne)  # type: ignore[assignment]
    __hash__ = object.__hash__

    def __pos__(self) -> MCTensor:
        return self

    # method forms of the functions
    add, sub, mul, div = (_op(torch.Tensor.add), _op(torch.Tensor.sub), _op(torch.Tensor.mul),
                          _op(torch.Tensor.div))
    matmul, mm, mv = _op(torch.Tensor.matmul), _op(torch.Tensor.mm), _op(torch.Tensor.mv)
    bmm, dot = _op(torch.Tensor.bmm), _op(torch.Tensor.dot)
    abs, neg, square = _op(torch.Tensor.abs), _op(torch.Tensor.neg), _op(torch.Tensor.square)
    sqrt, exp, expm1, log = (_op(torch.Tensor.sqrt), _op(torch.Tensor.exp), _op(torch.Tensor.expm1),
                             _op(torch.Tensor.log))
    reciprocal, pow = _op(torch.Tensor.reciprocal), _op(torch.Tensor.pow)
    relu, sigmoid, tanh = _op(torch.Tensor.relu), _op(torch.Tensor.sigmoid), _op(torch.Tensor.tanh)
    softmax, log_softmax = _op(torch.Tensor.softmax), _op(torch.Tensor.log_softmax)
    sum, mean = _op(torch.Tensor.sum), _op(torch.Tensor.mean)


def wrap(comps: Sequence[torch.Tensor]) -> MCTensor:
    """Wrap normalised component tensors as an MCTensor, without checks or renormalisation.

    For the package's ops, whose results are normalised; users call
    ``MCTensor(tuple_of_components)``, which checks and renormalises.

    >>> import torch
    >>> from anynum.mc.tensor import wrap
    >>> wrap((torch.tensor([1.0]), torch.tensor([2.0**-30]))).nc
    2
    """
    return MCTensor._wrap(tuple(comps))
