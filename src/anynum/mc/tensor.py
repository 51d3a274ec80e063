"""`MCTensor`: an unevaluated sum of ``nc`` floating-point tensors of one dtype.

Design
------
* Storage: a tuple of ``nc`` tensors of identical shape, largest component first, kept
  normalised (``x_i = RN(x_i + x_{i+1})`` for nc = 2, nonoverlapping for nc > 2).
* ``torch.*`` functions and ``torch.nn.functional`` functions reach it through
  ``__torch_function__`` (it is a tensor-like, not a tensor subclass).
* Autograd: every arithmetic operation is one `torch.autograd.Function` whose forward runs
  the MC algorithm without building a graph and whose backward differentiates the native
  operation on the leading components.  Every component of an input receives the same
  gradient, the derivative with respect to the *value* (the sum of the components);
  ``x.grad`` is that gradient.  Structural operations (indexing, reshape, cat, ...) act on
  each component and are differentiated by torch directly.
* Mixing: MC with MC of different nc promotes to the larger nc; different component
  dtypes or devices raise `AnynumError`; plain tensors and Python numbers are converted to
  the MC dtype (exactly when they fit in nc components).
* NaN/inf: where the MC algorithm yields a non-finite leading component (NaN/inf inputs,
  overflow) or an input is outside a function's domain, the result is the native result
  of the leading components with zero lower components, so IEEE semantics carry over
  (``inf + 1 = inf``, ``log(-1) = nan``, ``sqrt(-0.0) = -0.0``...).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from anynum.errors import AnynumError
from anynum.mc import arith, functions, linalg
from anynum.mc._core import Comps, check_dtype, scalar_comps
from anynum.mc.convert import as_float_tensor, convert_comps, from_tensor, round_sum

__all__ = ["MCTensor", "set_matmul_engine"]

_HANDLED: dict[Callable[..., Any], Callable[..., Any]] = {}


def _implements(*funcs: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(impl: Callable[..., Any]) -> Callable[..., Any]:
        for f in funcs:
            _HANDLED[f] = impl
        return impl

    return deco


def set_matmul_engine(engine: str) -> None:
    """Choose the default GEMM engine of MC matrix products: ``"int8"``, ``"native"`` or ``"wide"``.

    ``"int8"`` (default) cuts the operands into 7-bit integer digits and multiplies them
    with exact int8 x int8 -> int32 GEMMs (``torch._int_mm``), never a wider float type;
    ``"native"`` runs every GEMM in the component dtype; ``"wide"`` uses float32 GEMMs for
    float16/bfloat16 components and float64 GEMMs for float32 components.

    >>> from anynum import mc
    >>> mc.set_matmul_engine("wide"); mc.set_matmul_engine("int8")
    """
    if engine not in linalg.ENGINES:
        raise AnynumError(f"matmul engine must be one of {linalg.ENGINES}, got {engine!r}")
    linalg._ENGINE[0] = engine


# ----------------------------------------------------------------- autograd bridge
class _MCFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fwd: Callable[..., Comps], native: Callable[..., torch.Tensor],
                sizes: tuple[int, ...], *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        groups = _regroup(flat, sizes)
        out = fwd(*groups)
        ids = {id(f) for f in flat}
        out = tuple(o.clone() if id(o) in ids else o for o in out)
        ctx.native = native
        ctx.sizes = sizes
        ctx.save_for_backward(*[g[0] for g in groups])
        return out

    @staticmethod
    def backward(ctx: Any, *gouts: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        g = gouts[0]
        leads = ctx.saved_tensors
        sizes = ctx.sizes
        needs = []
        pos = 3
        for s in sizes:
            needs.append(any(ctx.needs_input_grad[pos : pos + s]))
            pos += s
        with torch.enable_grad():
            vals = [v.detach().requires_grad_(n) for v, n in zip(leads, needs)]
            y = ctx.native(*vals)
            if g is None:
                g = torch.zeros_like(y)
            wanted = [v for v, n in zip(vals, needs) if n]
            grads = torch.autograd.grad(y, wanted, g.to(y.dtype), allow_unused=True)
        res: list[torch.Tensor | None] = [None, None, None]
        it = iter(grads)
        for s, n, v in zip(sizes, needs, vals):
            gi = next(it) if n else None
            if gi is None and n:
                gi = torch.zeros_like(v)
            res.extend([gi] * s)
        return tuple(res)


def _regroup(flat: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[Comps]:
    out, pos = [], 0
    for s in sizes:
        out.append(tuple(flat[pos : pos + s]))
        pos += s
    return out


def _fix(res: Comps, native: Callable[[], torch.Tensor], bad: torch.Tensor | None = None) -> Comps:
    """Replace entries whose MC result is not finite (or flagged bad) by the native result."""
    if bad is None:
        if bool(torch.isfinite(res[0].sum())):
            return res
        badm = ~torch.isfinite(res[0])
    else:
        badm = bad | ~torch.isfinite(res[0])
        if not bool(badm.any()):
            return res
    nat = native().to(res[0].dtype)
    badm = badm | ~torch.isfinite(nat)
    first = torch.where(badm, nat, res[0])
    return (first, *(torch.where(badm, torch.zeros_like(c), c) for c in res[1:]))


def _apply(fwd: Callable[..., Comps], native: Callable[..., torch.Tensor], *ops: Comps) -> MCTensor:
    flat = [c for op in ops for c in op]
    if torch.is_grad_enabled() and any(c.requires_grad for c in flat):
        out = _MCFunction.apply(fwd, native, tuple(len(o) for o in ops), *flat)
    else:
        with torch.no_grad():
            out = fwd(*ops)
    return MCTensor._wrap(tuple(out))


# ----------------------------------------------------------------- operand promotion
def _is_mc(x: Any) -> bool:
    return isinstance(x, MCTensor)


def _scalar_or_comps(v: Any, dtype: torch.dtype, nc: int, device: torch.device) -> Comps:
    if isinstance(v, MCTensor):
        return v._c
    if isinstance(v, torch.Tensor):
        if v.device != device:
            raise AnynumError(
                f"operands are on different devices ({device} and {v.device}); move one with .to()"
            )
        t = as_float_tensor(v)
        if t.dtype == dtype:
            return (t,)
        c = from_tensor(t, dtype, nc)
        if len(c) == 1:
            return c
        return c if bool(torch.stack([x != 0 for x in c[1:]]).any()) else (c[0],)
    if isinstance(v, (bool, int, float)):
        t = torch.tensor(float(v), dtype=dtype, device=device)
        if float(t.item()) == v or v != v:
            return (t,)
        return scalar_comps(v, dtype, nc, device)
    raise AnynumError(
        f"cannot combine an MCTensor with {type(v).__name__}; expected an MCTensor, a torch.Tensor "
        "or a Python number"
    )


def _promote(*args: Any) -> tuple[list[Comps], int, torch.dtype]:
    mcs = [a for a in args if _is_mc(a)]
    if not mcs:
        raise AnynumError("internal: no MCTensor operand")  # pragma: no cover
    dtype = mcs[0].dtype
    device = mcs[0].device
    for m in mcs[1:]:
        if m.dtype != dtype:
            raise AnynumError(
                f"MCTensor component dtypes differ ({dtype} and {m.dtype}); anynum does not "
                "promote between component dtypes. Convert one with x.to(dtype) first."
            )
        if m.device != device:
            raise AnynumError(
                f"MCTensors are on different devices ({device} and {m.device}); use .to(device)"
            )
    nc = max(m.nc for m in mcs)
    out = []
    for a in args:
        c = _scalar_or_comps(a, dtype, nc, device)
        if 1 < len(c) < nc:
            c = arith.pad(c, nc)
        out.append(c)
    return out, nc, dtype


def _as_mc(x: Any, like: MCTensor | None = None) -> MCTensor:
    if isinstance(x, MCTensor):
        return x
    if like is not None:
        return MCTensor._wrap(arith.pad(_scalar_or_comps(x, like.dtype, like.nc, like.device), like.nc))
    return MCTensor(x)


# ----------------------------------------------------------------- the class
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
            if not d0.is_floating_point:
                check_dtype(d0)
            check_dtype(d0)
            ts = torch.broadcast_tensors(*data)
            n = nc or len(ts)
            comps = tuple(ts) if len(ts) == 1 else arith.renormalize(list(ts), max(n, 1))
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
        if torch.is_grad_enabled() and any(c.requires_grad for c in self._c):
            return _ToTensor.apply(dtype, *self._c)
        with torch.no_grad():
            return round_sum(self._c, dtype)

    def to_mpmath(self) -> list[Any]:
        """Exact values as nested lists of ``mpmath.mpf`` (needs mpmath; for checking).

        >>> import torch
        >>> from anynum import mc
        >>> mc.MCTensor(torch.tensor([0.5])).to_mpmath()
        [mpf('0.5')]
        """
        try:
            import mpmath
        except ImportError as exc:  # pragma: no cover
            raise AnynumError("to_mpmath needs mpmath: pip install mpmath") from exc
        flat = [c.detach().to(torch.float64).reshape(-1).tolist() for c in self._c]
        with mpmath.workprec(2200):
            vals = [mpmath.fsum(mpmath.mpf(c[i]) for c in flat) for i in range(len(flat[0]))]
        if self.dim() == 0:
            return vals
        import numpy as np

        return np.array(vals, dtype=object).reshape(tuple(self.shape)).tolist()

    def item(self) -> float:
        """The value correctly rounded to a Python float (float64)."""
        return float(self.to_tensor(torch.float64).item())

    def tolist(self) -> Any:
        """Values correctly rounded to float64, as (nested) Python lists."""
        return self.to_tensor(torch.float64).tolist()

    def __repr__(self) -> str:
        val = self.detach().to_tensor(torch.float64)
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = repr(val).replace("tensor(", "", 1)
        if body.endswith(")"):
            body = body[:-1]
        body = body.replace(", dtype=torch.float64", "")
        return f"MCTensor({body}, nc={self.nc}, dtype={self.dtype}{grad})"

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

    def __setitem__(self, idx: Any, value: Any) -> None:
        if _is_mc(value) and value.dtype != self.dtype:
            raise AnynumError(f"cannot assign {value.dtype} components into {self.dtype} ones")
        v = _scalar_or_comps(value, self.dtype, self.nc, self.device)
        v = convert_comps(v, self.dtype, self.nc)
        for c, vi in zip(self._c, v):
            c[idx] = vi

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

    # ------------------------------------------------------------- torch dispatch
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        impl = _HANDLED.get(func)
        if impl is None:
            name = getattr(func, "__name__", repr(func))
            raise AnynumError(
                f"{name} is not supported on MCTensor; supported: "
                f"{', '.join(sorted({getattr(f, '__name__', '?') for f in _HANDLED}))}. "
                "Convert with x.to_tensor() to use it at plain precision."
            )
        return impl(*args, **kwargs)

    # ------------------------------------------------------------- operators
    def __add__(self, o: Any) -> MCTensor:
        return add(self, o)

    def __radd__(self, o: Any) -> MCTensor:
        return add(o, self)

    def __sub__(self, o: Any) -> MCTensor:
        return sub(self, o)

    def __rsub__(self, o: Any) -> MCTensor:
        return sub(o, self)

    def __mul__(self, o: Any) -> MCTensor:
        return mul(self, o)

    def __rmul__(self, o: Any) -> MCTensor:
        return mul(o, self)

    def __truediv__(self, o: Any) -> MCTensor:
        return div(self, o)

    def __rtruediv__(self, o: Any) -> MCTensor:
        return div(o, self)

    def __matmul__(self, o: Any) -> MCTensor:
        return matmul(self, o)

    def __rmatmul__(self, o: Any) -> MCTensor:
        return matmul(o, self)

    def __pow__(self, o: Any) -> MCTensor:
        return pow(self, o)

    def __neg__(self) -> MCTensor:
        return neg(self)

    def __pos__(self) -> MCTensor:
        return self

    def __abs__(self) -> MCTensor:
        return abs(self)

    def __lt__(self, o: Any) -> torch.Tensor:
        return lt(self, o)

    def __le__(self, o: Any) -> torch.Tensor:
        return le(self, o)

    def __gt__(self, o: Any) -> torch.Tensor:
        return gt(self, o)

    def __ge__(self, o: Any) -> torch.Tensor:
        return ge(self, o)

    def __eq__(self, o: Any) -> torch.Tensor:  # type: ignore[override]
        return eq(self, o)

    def __ne__(self, o: Any) -> torch.Tensor:  # type: ignore[override]
        return ne(self, o)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise AnynumError("the truth value of an MCTensor with more than one element is ambiguous")
        return bool(self.to_tensor(torch.float64).item())

    # method forms of the functions
    def add(self, o: Any) -> MCTensor:
        return add(self, o)

    def sub(self, o: Any) -> MCTensor:
        return sub(self, o)

    def mul(self, o: Any) -> MCTensor:
        return mul(self, o)

    def div(self, o: Any) -> MCTensor:
        return div(self, o)

    def matmul(self, o: Any) -> MCTensor:
        return matmul(self, o)

    def mm(self, o: Any) -> MCTensor:
        return mm(self, o)

    def mv(self, o: Any) -> MCTensor:
        return mv(self, o)

    def bmm(self, o: Any) -> MCTensor:
        return bmm(self, o)

    def dot(self, o: Any) -> MCTensor:
        return dot(self, o)

    def abs(self) -> MCTensor:
        return abs(self)

    def neg(self) -> MCTensor:
        return neg(self)

    def sqrt(self) -> MCTensor:
        return sqrt(self)

    def exp(self) -> MCTensor:
        return exp(self)

    def expm1(self) -> MCTensor:
        return expm1(self)

    def log(self) -> MCTensor:
        return log(self)

    def square(self) -> MCTensor:
        return square(self)

    def reciprocal(self) -> MCTensor:
        return reciprocal(self)

    def pow(self, o: Any) -> MCTensor:
        return pow(self, o)

    def relu(self) -> MCTensor:
        return relu(self)

    def sigmoid(self) -> MCTensor:
        return sigmoid(self)

    def tanh(self) -> MCTensor:
        return tanh(self)

    def softmax(self, dim: int) -> MCTensor:
        return softmax(self, dim)

    def log_softmax(self, dim: int) -> MCTensor:
        return log_softmax(self, dim)

    def sum(self, dim: Any = None, keepdim: bool = False) -> MCTensor:
        return sum(self, dim, keepdim)

    def mean(self, dim: Any = None, keepdim: bool = False) -> MCTensor:
        return mean(self, dim, keepdim)


class _ToTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *comps: torch.Tensor) -> torch.Tensor:
        ctx.dtypes = [c.dtype for c in comps]
        return round_sum(tuple(comps), dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *(g.to(d) for d in ctx.dtypes))


# ----------------------------------------------------------------- public functions
def _mc_args(*args: Any) -> tuple[list[Comps], int, torch.dtype]:
    if not any(_is_mc(a) for a in args):
        raise AnynumError("expected at least one MCTensor operand")
    return _promote(*args)


@_implements(torch.add, torch.Tensor.add)
def add(x: Any, y: Any, *, alpha: Any = 1) -> MCTensor:
    """``x + alpha*y`` in MC arithmetic (nc=2: AccurateDWPlusDW, <= 3u^2; DWPlusFP with a
    plain tensor, <= 2u^2).  NaN/inf: IEEE result of the leading components.

    >>> import torch
    >>> from anynum import mc
    >>> (mc.MCTensor(torch.tensor([1.0])) + 2.0**-40).components()[1].item() == 2.0**-40
    True
    """
    if alpha != 1:
        y = mul(y, alpha) if _is_mc(y) else y * alpha
    (a, b), nc, _ = _mc_args(x, y)
    return _apply(lambda p, q: _fix(arith.add(p, q, nc), lambda: p[0] + q[0]), torch.add, a, b)


@_implements(torch.sub, torch.subtract, torch.Tensor.sub)
def sub(x: Any, y: Any, *, alpha: Any = 1) -> MCTensor:
    """``x - alpha*y`` (same algorithms and bounds as :func:`add`).

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0])) + 2.0**-40
    >>> (x - 1.0).to_tensor().item() == 2.0**-40
    True
    """
    if alpha != 1:
        y = mul(y, alpha) if _is_mc(y) else y * alpha
    (a, b), nc, _ = _mc_args(x, y)
    return _apply(lambda p, q: _fix(arith.sub(p, q, nc), lambda: p[0] - q[0]), torch.sub, a, b)


@_implements(torch.mul, torch.multiply, torch.Tensor.mul)
def mul(x: Any, y: Any) -> MCTensor:
    """``x * y`` (nc=2: DWTimesDW3 <= 4u^2 with FMA, DWTimesDW1 <= 7u^2 without; with a
    plain tensor DWTimesFP, <= 2u^2).  NaN/inf: IEEE result of the leading components.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0 + 2.0**-20]))
    >>> (x * x).components()[1].item() == 2.0**-40
    True
    """
    (a, b), nc, _ = _mc_args(x, y)
    return _apply(lambda p, q: _fix(arith.mul(p, q, nc), lambda: p[0] * q[0]), torch.mul, a, b)


@_implements(torch.div, torch.true_divide, torch.divide, torch.Tensor.div)
def div(x: Any, y: Any, *, rounding_mode: str | None = None) -> MCTensor:
    """``x / y`` (nc=2: DWDivDW2 <= 15u^2; DWDivFP3 <= 3u^2 by a plain tensor).  Division by
    zero, NaN/inf: IEEE result of the leading components (``1/0 = inf``).

    >>> import torch
    >>> from anynum import mc
    >>> q = mc.MCTensor(torch.tensor([1.0])) / 3.0
    >>> -1e-14 < q.to_tensor(torch.float64).item() - 1 / 3 < 1e-14
    True
    """
    if rounding_mode is not None:
        raise AnynumError("MCTensor division supports only rounding_mode=None")
    (a, b), nc, _ = _mc_args(x, y)

    def fwd(p: Comps, q: Comps) -> Comps:
        q0 = q[0]
        bad = (q0 == 0) | ~torch.isfinite(q0) | ~torch.isfinite(p[0])
        if bool(bad.any()):
            lows = (torch.where(bad, torch.zeros_like(c), c) for c in q[1:])
            q = (torch.where(bad, torch.ones_like(q0), q0), *lows)
            return _fix(arith.div(p, q, nc), lambda: p[0] / q0, bad)
        return _fix(arith.div(p, q, nc), lambda: p[0] / q0)

    return _apply(fwd, torch.div, a, b)


@_implements(torch.neg, torch.negative, torch.Tensor.neg)
def neg(x: MCTensor) -> MCTensor:
    """``-x`` (exact).  NaN/inf: negated.

    >>> import torch
    >>> from anynum import mc
    >>> (-mc.MCTensor(torch.tensor([2.0]))).item()
    -2.0
    """
    return _apply(arith.neg, torch.neg, x._c)


@_implements(torch.abs, torch.absolute, torch.Tensor.abs)
def abs(x: Any) -> Any:
    """``|x|`` (exact; the sign of the value is that of the leading component).  NaN stays NaN.

    >>> import torch
    >>> from anynum import mc
    >>> abs(mc.MCTensor(torch.tensor([-2.0]))).item()
    2.0
    """
    if not _is_mc(x):
        return builtins.abs(x)

    def fwd(p: Comps) -> Comps:
        s = p[0] < 0
        return tuple(torch.where(s, -c, c) for c in p)

    return _apply(fwd, torch.abs, x._c)


def _unary(x: MCTensor, algo: Callable[[Comps, int], Comps], native: Callable[..., torch.Tensor],
           domain: Callable[[torch.Tensor], torch.Tensor] | None = None) -> MCTensor:
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        res = algo(p, nc) if nc > 1 else (native(p[0]),)
        bad = None if domain is None else ~domain(p[0])
        return _fix(arith.pad(res, nc), lambda: native(p[0]), bad)

    return _apply(fwd, native, x._c)


def _pos(v: torch.Tensor) -> torch.Tensor:
    return (v > 0) & torch.isfinite(v)


@_implements(torch.sqrt, torch.Tensor.sqrt)
def sqrt(x: MCTensor) -> MCTensor:
    """Square root to about MC precision (Newton in MC arithmetic, ~2u^2 for nc=2).
    ``sqrt(0) = 0`` (sign kept), ``sqrt(inf) = inf``, negative or NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> s = mc.sqrt(mc.MCTensor(torch.tensor([2.0], dtype=torch.float64)))
    >>> -1e-30 < float((s * s - 2.0).to_tensor()) < 1e-30
    True
    """
    return _unary(x, functions.sqrt, torch.sqrt, _pos)


@_implements(torch.exp, torch.Tensor.exp)
def exp(x: MCTensor) -> MCTensor:
    """Exponential to about MC precision.  Overflow -> inf, ``exp(-inf) = 0``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> e = mc.exp(mc.MCTensor(torch.tensor([1.0])))
    >>> -1e-13 < e.to_tensor(torch.float64).item() - 2.718281828459045 < 1e-13
    True
    """
    return _unary(x, functions.exp, torch.exp, torch.isfinite)


@_implements(torch.expm1, torch.special.expm1, torch.Tensor.expm1)
def expm1(x: MCTensor) -> MCTensor:
    """``exp(x) - 1`` with relative accuracy near 0.  inf -> inf, -inf -> -1, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.expm1(mc.MCTensor(torch.tensor([1e-10], dtype=torch.float64))).item() > 1e-10
    True
    """
    return _unary(x, functions.expm1, torch.expm1, torch.isfinite)


@_implements(torch.log, torch.Tensor.log)
def log(x: MCTensor) -> MCTensor:
    """Natural logarithm to about MC precision (absolute error ~u^nc where |log x| < 1).
    ``log(0) = -inf``, negative -> NaN, ``log(inf) = inf``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> -1e-13 < mc.log(mc.MCTensor(torch.tensor([2.0]))).item() - 0.6931471805599453 < 1e-13
    True
    """
    return _unary(x, functions.log, torch.log, _pos)


@_implements(torch.square, torch.Tensor.square)
def square(x: MCTensor) -> MCTensor:
    """``x * x`` (same bound as :func:`mul`).  NaN/inf: IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> mc.square(mc.MCTensor(torch.tensor([3.0]))).item()
    9.0
    """
    return mul(x, x)


@_implements(torch.reciprocal, torch.Tensor.reciprocal)
def reciprocal(x: MCTensor) -> MCTensor:
    """``1 / x`` (DWDivDW2, <= 15u^2).  ``1/0 = inf``, ``1/inf = 0``.

    >>> import torch
    >>> from anynum import mc
    >>> mc.reciprocal(mc.MCTensor(torch.tensor([4.0]))).item()
    0.25
    """
    return div(1.0, x)


@_implements(torch.pow, torch.Tensor.pow)
def pow(x: Any, y: Any) -> Any:
    """``x ** y``: binary powering for Python integers, ``exp(y log x)`` otherwise (x > 0;
    other bases follow the native result of the leading components, e.g. NaN for negative
    bases with fractional exponents).

    >>> import torch
    >>> from anynum import mc
    >>> (mc.MCTensor(torch.tensor([3.0])) ** 2).item()
    9.0
    """
    if not _is_mc(x) and not _is_mc(y):
        return builtins.pow(x, y)
    if _is_mc(x) and isinstance(y, int) and not isinstance(y, bool):
        nc = x.nc
        return _apply(lambda p: _fix(functions.powi(p, y, nc), lambda: p[0] ** y),
                      lambda v: v**y, x._c)
    (a, b), nc, _ = _mc_args(x, y)

    def fwd(p: Comps, q: Comps) -> Comps:
        if nc == 1:
            return (torch.pow(p[0], q[0]),)
        return _fix(functions.pow_general(p, q, nc), lambda: torch.pow(p[0], q[0]),
                    ~_pos(p[0]) | ~torch.isfinite(q[0]))

    return _apply(fwd, torch.pow, a, b)


@_implements(torch.relu, F.relu, torch.Tensor.relu)
def relu(x: MCTensor, inplace: bool = False) -> MCTensor:
    """``max(x, 0)`` (exact).  NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.relu(mc.MCTensor(torch.tensor([-1.0, 2.0]))).tolist()
    [0.0, 2.0]
    """
    def fwd(p: Comps) -> Comps:
        keep = (p[0] > 0) | torch.isnan(p[0])
        return tuple(torch.where(keep, c, torch.zeros_like(c)) for c in p)

    return _apply(fwd, torch.relu, x._c)


@_implements(torch.sigmoid, F.sigmoid, torch.Tensor.sigmoid)
def sigmoid(x: MCTensor) -> MCTensor:
    """``1 / (1 + exp(-x))`` to about MC precision.  ``±inf -> 1 / 0``, NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> mc.sigmoid(mc.MCTensor(torch.tensor([0.0]))).item()
    0.5
    """
    return _unary(x, functions.sigmoid, torch.sigmoid, torch.isfinite)


@_implements(torch.tanh, F.tanh, torch.Tensor.tanh)
def tanh(x: MCTensor) -> MCTensor:
    """Hyperbolic tangent to about MC precision (relative, also near 0).  ``±inf -> ±1``.

    >>> import torch
    >>> from anynum import mc
    >>> mc.tanh(mc.MCTensor(torch.tensor([0.0]))).item()
    0.0
    """
    return _unary(x, functions.tanh, torch.tanh, torch.isfinite)


def _cmp(x: Any, y: Any, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    (a, b), nc, _ = _mc_args(x, y)
    with torch.no_grad():
        d = arith.sub(tuple(c.detach() for c in a), tuple(c.detach() for c in b), nc)
        lead = op(a[0].detach(), b[0].detach())
        z = torch.zeros_like(d[0])
        res = op(d[0], z)
        fin = torch.isfinite(a[0]) & torch.isfinite(b[0])
        return torch.where(fin, res, lead)


@_implements(torch.lt, torch.less, torch.Tensor.lt)
def lt(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x < y`` on the values (sign of the MC difference); NaN compares False.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0])) + 2.0**-40
    >>> bool(x > 1.0), bool(x < 1.0)
    (True, False)
    """
    return _cmp(x, y, torch.lt)


@_implements(torch.le, torch.less_equal, torch.Tensor.le)
def le(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x <= y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.le)


@_implements(torch.gt, torch.greater, torch.Tensor.gt)
def gt(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x > y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.gt)


@_implements(torch.ge, torch.greater_equal, torch.Tensor.ge)
def ge(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x >= y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.ge)


@_implements(torch.eq, torch.Tensor.eq)
def eq(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x == y`` (see :func:`lt`); NaN is unequal to everything."""
    return _cmp(x, y, torch.eq)


@_implements(torch.ne, torch.not_equal, torch.Tensor.ne)
def ne(x: Any, y: Any) -> torch.Tensor:
    """Exact ``x != y`` (see :func:`lt`)."""
    return _cmp(x, y, torch.ne)


@_implements(torch.maximum, torch.max)
def maximum(x: Any, y: Any) -> MCTensor:
    """Elementwise maximum of the values (exact); NaN wins.

    >>> import torch
    >>> from anynum import mc
    >>> mc.maximum(mc.MCTensor(torch.tensor([1.0, 5.0])), 2.0).tolist()
    [2.0, 5.0]
    """
    (a, b), nc, _ = _mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    take_a = ge(MCTensor._wrap(a), MCTensor._wrap(b)) | torch.isnan(a[0])
    return MCTensor._wrap(tuple(torch.where(take_a, p, q) for p, q in zip(a, b)))


@_implements(torch.minimum, torch.min)
def minimum(x: Any, y: Any) -> MCTensor:
    """Elementwise minimum of the values (exact); NaN wins."""
    (a, b), nc, _ = _mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    take_a = le(MCTensor._wrap(a), MCTensor._wrap(b)) | torch.isnan(a[0])
    return MCTensor._wrap(tuple(torch.where(take_a, p, q) for p, q in zip(a, b)))


@_implements(torch.where)
def where(cond: torch.Tensor, x: Any, y: Any) -> MCTensor:
    """Elementwise selection (exact)."""
    (a, b), nc, _ = _mc_args(x, y)
    a, b = arith.pad(a, nc), arith.pad(b, nc)
    return MCTensor._wrap(tuple(torch.where(cond, p, q) for p, q in zip(a, b)))


# ----------------------------------------------------------------- reductions
def _dims(x: MCTensor, dim: Any) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        return [dim % max(x.dim(), 1)]
    return sorted({d % max(x.dim(), 1) for d in dim})


@_implements(torch.sum, torch.Tensor.sum)
def sum(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """Sum over `dim` (all by default) with a tree of MC additions (error <= about
    ``3 ceil(log2 n) u^2 sum|x|`` for nc=2).  NaN/inf propagate as in IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> x = mc.MCTensor(torch.tensor([1.0, 2.0**-30, -1.0]))
    >>> mc.sum(x).item() == 2.0**-30
    True
    """
    if not _is_mc(x):
        return builtins.sum(x) if dim is None else builtins.sum(x, dim)
    nc = x.nc
    dims = _dims(x, dim)

    def fwd(p: Comps) -> Comps:
        out = p
        if x.dim() == 0:
            return out
        for d in sorted(dims, reverse=True):
            out = linalg.tree_sum(out, d, nc, keepdim)
        native = p[0]
        return _fix(out, lambda: torch.sum(native, dim=tuple(dims), keepdim=keepdim))

    def native(v: torch.Tensor) -> torch.Tensor:
        return torch.sum(v, dim=tuple(dims), keepdim=keepdim) if v.dim() else v

    return _apply(fwd, native, x._c)


@_implements(torch.mean, torch.Tensor.mean)
def mean(x: MCTensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> MCTensor:
    """Mean over `dim`: MC sum divided by the count (exact count).  NaN/inf: IEEE.

    >>> import torch
    >>> from anynum import mc
    >>> mc.mean(mc.MCTensor(torch.tensor([1.0, 2.0]))).item()
    1.5
    """
    dims = _dims(x, dim)
    n = 1
    for d in dims:
        n *= x.shape[d] if x.dim() else 1
    return div(sum(x, dim, keepdim), float(n))


@_implements(torch.softmax, F.softmax, torch.Tensor.softmax)
def softmax(x: MCTensor, dim: int | None = None, *args: Any, **kwargs: Any) -> MCTensor:
    """Softmax along `dim` to about MC precision (shift by the max of the leading
    components, MC exp, MC sum, MC division).  NaN -> NaN; +inf entries -> NaN as in torch.

    >>> import torch
    >>> from anynum import mc
    >>> mc.softmax(mc.MCTensor(torch.tensor([0.0, 0.0])), 0).tolist()
    [0.5, 0.5]
    """
    if dim is None:
        raise AnynumError("softmax on MCTensor needs an explicit dim")
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        m = p[0].amax(dim=dim, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        z = arith.sub(p, (m,), nc) if nc > 1 else (p[0] - m,)
        e = functions.exp(z, nc) if nc > 1 else (torch.exp(z[0]),)
        e = _fix(e, lambda: torch.exp(z[0]))
        s = linalg.tree_sum(e, dim, nc, keepdim=True)
        r = arith.div(e, s, nc)
        return _fix(r, lambda: torch.softmax(p[0], dim))

    return _apply(fwd, lambda v: torch.softmax(v, dim), x._c)


@_implements(torch.log_softmax, F.log_softmax, torch.Tensor.log_softmax)
def log_softmax(x: MCTensor, dim: int | None = None, *args: Any, **kwargs: Any) -> MCTensor:
    """``x - logsumexp(x)`` along `dim` to about MC precision.  NaN -> NaN.

    >>> import torch
    >>> from anynum import mc
    >>> v = mc.log_softmax(mc.MCTensor(torch.tensor([0.0, 0.0])), 0).tolist()[0]
    >>> -1e-14 < v + 0.6931471805599453 < 1e-14
    True
    """
    if dim is None:
        raise AnynumError("log_softmax on MCTensor needs an explicit dim")
    nc = x.nc

    def fwd(p: Comps) -> Comps:
        m = p[0].amax(dim=dim, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        z = arith.sub(p, (m,), nc) if nc > 1 else (p[0] - m,)
        e = functions.exp(z, nc) if nc > 1 else (torch.exp(z[0]),)
        e = _fix(e, lambda: torch.exp(z[0]))
        s = linalg.tree_sum(e, dim, nc, keepdim=True)
        ls = functions.log(s, nc) if nc > 1 else (torch.log(s[0]),)
        r = arith.sub(z, ls, nc)
        return _fix(r, lambda: torch.log_softmax(p[0], dim))

    return _apply(fwd, lambda v: torch.log_softmax(v, dim), x._c)


# ----------------------------------------------------------------- matrix products
@_implements(torch.matmul, torch.Tensor.matmul)
def matmul(x: Any, y: Any, *, engine: str | None = None) -> MCTensor:
    """``x @ y`` (torch.matmul semantics) for MC x tensor, tensor x MC and MC x MC, with
    Ozaki error-free slicing into exact GEMMs (see `anynum.mc.linalg`).  `engine`
    ``"int8"`` (exact int8 GEMMs, default), ``"native"`` (component dtype GEMMs) or
    ``"wide"``.  NaN/inf anywhere in a row/column give the native result of the leading components there.

    >>> import torch
    >>> from anynum import mc
    >>> a = mc.MCTensor(torch.tensor([[1.0, 2.0**-30]]))
    >>> b = torch.tensor([[1.0], [1.0]])
    >>> (a @ b).item() == 1.0 + 2.0**-30
    True
    """
    if engine is not None and engine not in linalg.ENGINES:
        raise AnynumError(f"engine must be one of {linalg.ENGINES}, got {engine!r}")
    (a, b), nc, _ = _mc_args(x, y)
    if a[0].dim() == 0 or b[0].dim() == 0:
        raise AnynumError("matmul needs operands with at least one dimension")

    def fwd(p: Comps, q: Comps) -> Comps:
        if nc == 1:
            return (torch.matmul(p[0], q[0]),)
        # a finite sum proves every entry finite (one cheap pass); else check entrywise
        if bool(torch.isfinite(p[0].sum() + q[0].sum())):
            return linalg.matmul(p, q, nc, engine)
        fa = torch.isfinite(p[0])
        fb = torch.isfinite(q[0])
        p2 = tuple(torch.where(fa, c, torch.zeros_like(c)) for c in p)
        q2 = tuple(torch.where(fb, c, torch.zeros_like(c)) for c in q)
        res = linalg.matmul(p2, q2, nc, engine)
        nat = torch.matmul(p[0], q[0])
        bad = ~torch.isfinite(nat)
        return _fix(res, lambda: nat, bad)

    return _apply(fwd, torch.matmul, a, b)


@_implements(torch.mm, torch.Tensor.mm)
def mm(x: Any, y: Any) -> MCTensor:
    """2-D matrix product (see :func:`matmul`)."""
    if _shape(x).__len__() != 2 or len(_shape(y)) != 2:
        raise AnynumError("mm expects two 2-D operands")
    return matmul(x, y)


@_implements(torch.mv, torch.Tensor.mv)
def mv(x: Any, y: Any) -> MCTensor:
    """Matrix-vector product (see :func:`matmul`)."""
    if len(_shape(x)) != 2 or len(_shape(y)) != 1:
        raise AnynumError("mv expects a 2-D matrix and a 1-D vector")
    return matmul(x, y)


@_implements(torch.bmm, torch.Tensor.bmm)
def bmm(x: Any, y: Any) -> MCTensor:
    """Batched matrix product of 3-D operands (see :func:`matmul`)."""
    if len(_shape(x)) != 3 or len(_shape(y)) != 3:
        raise AnynumError("bmm expects two 3-D operands")
    return matmul(x, y)


@_implements(torch.dot, torch.inner, torch.Tensor.dot)
def dot(x: Any, y: Any) -> MCTensor:
    """Dot product of 1-D operands in MC precision (not a plain float sum).

    >>> import torch
    >>> from anynum import mc
    >>> a = mc.MCTensor(torch.tensor([1.0, 1e-9, -1.0]))
    >>> mc.dot(a, torch.ones(3)).item() == float(torch.tensor(1e-9))
    True
    """
    if len(_shape(x)) != 1 or len(_shape(y)) != 1:
        raise AnynumError("dot expects two 1-D operands")
    return matmul(x, y)


@_implements(torch.addmm, torch.Tensor.addmm)
def addmm(inp: Any, x: Any, y: Any, *, beta: Any = 1, alpha: Any = 1) -> MCTensor:
    """``beta * inp + alpha * (x @ y)`` in MC arithmetic (see :func:`matmul`)."""
    prod = matmul(x, y) if _is_mc(x) or _is_mc(y) else MCTensor(torch.mm(x, y))
    if alpha != 1:
        prod = mul(prod, alpha)
    if beta == 0:
        return prod
    if beta != 1:
        inp = mul(inp, beta) if _is_mc(inp) else inp * beta
    return add(prod, inp)


@_implements(F.linear)
def linear(inp: Any, weight: Any, bias: Any = None) -> MCTensor:
    """``inp @ weight.T + bias`` with MC weights and/or input (see :func:`matmul`).

    >>> import torch
    >>> from anynum import mc
    >>> w = mc.MCTensor(torch.ones(3, 2))
    >>> torch.nn.functional.linear(torch.ones(1, 2), w).tolist()
    [[2.0, 2.0, 2.0]]
    """
    wt = weight.mT if _is_mc(weight) else weight.transpose(-1, -2)
    out = matmul(inp, wt)
    if bias is not None:
        out = add(out, bias)
    return out


@_implements(F.embedding)
def embedding(inp: torch.Tensor, weight: MCTensor, *args: Any, **kwargs: Any) -> MCTensor:
    """Row lookup in an MC weight table (exact; per-component ``F.embedding``)."""
    if not _is_mc(weight):
        raise AnynumError("mc embedding expects an MCTensor weight")
    return MCTensor._wrap(tuple(F.embedding(inp, c, *args, **kwargs) for c in weight._c))


def _shape(x: Any) -> torch.Size:
    return x.shape


# ----------------------------------------------------------------- structural torch functions
def _comps_list(seq: Sequence[Any]) -> tuple[list[Comps], int]:
    mcs = [s for s in seq if _is_mc(s)]
    comps, nc, _ = _promote(*seq) if mcs else ([], 1, None)
    return [arith.pad(c, nc) for c in comps], nc


@_implements(torch.cat, torch.concat, torch.concatenate)
def cat(tensors: Sequence[Any], dim: int = 0) -> MCTensor:
    """Concatenate MC tensors (and plain tensors, converted) along `dim` (exact)."""
    comps, nc = _comps_list(tensors)
    return MCTensor._wrap(tuple(torch.cat([c[i] for c in comps], dim) for i in range(nc)))


@_implements(torch.stack)
def stack(tensors: Sequence[Any], dim: int = 0) -> MCTensor:
    """Stack MC tensors (and plain tensors, converted) along a new `dim` (exact)."""
    comps, nc = _comps_list(tensors)
    return MCTensor._wrap(tuple(torch.stack([c[i] for c in comps], dim) for i in range(nc)))


def _structural(name: str) -> Callable[..., MCTensor]:
    def impl(x: MCTensor, *args: Any, **kwargs: Any) -> MCTensor:
        return x._map(lambda c: getattr(torch, name)(c, *args, **kwargs))

    impl.__name__ = name
    return impl


for _name in ("reshape", "transpose", "permute", "flatten", "squeeze", "unsqueeze", "clone",
              "t", "flip", "roll", "narrow", "select", "movedim", "swapaxes", "diagonal",
              "tile", "repeat_interleave", "broadcast_to", "index_select", "gather", "tril",
              "triu"):
    _HANDLED[getattr(torch, _name)] = _structural(_name)


@_implements(torch.isfinite)
def isfinite(x: MCTensor) -> torch.Tensor:
    """Whether every component is finite."""
    out = torch.ones_like(x._c[0], dtype=torch.bool)
    for c in x._c:
        out = out & torch.isfinite(c)
    return out


@_implements(torch.isnan)
def isnan(x: MCTensor) -> torch.Tensor:
    """Whether the value is NaN."""
    return torch.isnan(x.to_tensor())


@_implements(torch.numel)
def numel(x: MCTensor) -> int:
    return x.numel()

