"""`an.EmulatedTensor` and `an.as_format`: tensors whose storage is the format's packed codes.

An EmulatedTensor is a wrapper tensor subclass: to PyTorch it has the shape and
a floating dtype (float32, or float64 where float32 cannot hold the format's
values), but it stores codes (`anynum.emulate.packing`). Every op decodes its
EmulatedTensor arguments, computes under the rules of `an.emulate`
(`anynum.emulate.engine`) and encodes floating results into EmulatedTensors of
the same format. The short list of ops with their own rule:

==================================  ==========================================================
op                                  rule
==================================  ==========================================================
views (view, t, transpose, ...)     on the codes, sharing them, for formats of 5 to 32 bits;
                                    for 4-bit and Block formats a view is a copy
detach, alias                       share the codes (any format)
clone, to(device)                   copy / move the codes
to(dtype), float(), double()        decode: a plain tensor of that dtype
in-place and out= (foreach too)     compute, then encode into the target's codes in place
empty_like, new_empty               zeros of the format
==================================  ==========================================================

Promotion: an op mixing EmulatedTensors and plain tensors returns
EmulatedTensors of the emulated operand's format; mixing two formats (or two
arithmetic settings) is an AnynumError. Inside ``an.emulate(...)`` an
EmulatedTensor still computes in its own format.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from anynum.emulate import rules as _rules  # noqa: F401  (registers the dot/reduction rules)
from anynum.emulate.engine import Emulator
from anynum.emulate.grid import elementwise_format
from anynum.emulate.optable import plan_for
from anynum.emulate.packing import Packed, pack, storage_dtype, unpack_values
from anynum.errors import AnynumError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.quantize import check_representable
from anynum.rounding import RoundingLike, parse_rounding

__all__ = ["EmulatedTensor", "as_format"]

aten = torch.ops.aten

#: (format name, rounding, accumulate name or None, order, fma, seed): what an EmulatedTensor records.
Config = tuple[str, str, Any, Any, bool, Any]

_EMULATORS: dict[Config, Emulator] = {}
_SHARE = {"detach", "alias", "lift_fresh"}
_ZEROS = {"empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty"}


def _emulator(config: Config) -> Emulator:
    em = _EMULATORS.get(config)
    if em is None:
        name, rounding, acc, order, fma, seed = config
        with _disable_current_modes():  # building it runs torch ops; an enclosing mode must not see them
            em = Emulator(name, rounding, accumulate=acc, order=order, fma=fma, seed=seed)
        _EMULATORS[config] = em
    return em


def value_dtype(fmt: Format) -> torch.dtype:
    """float32 if it holds every value of `fmt` (its elementwise grid for Block formats), else float64."""
    try:
        check_representable(elementwise_format(fmt) if isinstance(fmt, Block) else fmt, torch.float32)
    except RepresentabilityError:
        return torch.float64
    return torch.float32


class EmulatedTensor(torch.Tensor):
    """A tensor of format values stored as packed codes; see the module docstring and `as_format`.

    Build it with `as_format`. ``t.codes`` is the storage (and ``t.scales`` the
    block scales of a Block format), ``t.format`` the format, ``t.nbytes_stored``
    the bytes held. NaN and ±inf follow the format (NaR for posits; formats
    without NaN cannot hold NaN and raise when asked to).

    >>> import torch, anynum as an
    >>> t = an.as_format(torch.tensor([1.0, 0.3, -2.0]), "posit(16,2)")
    >>> t.codes.dtype, t.tolist()
    (torch.int16, [1.0, 0.300048828125, -2.0])
    >>> (t * 3).format == t.format
    True
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    tensor_scale: torch.Tensor | None
    _config: Config
    _fmt: Format
    _direct: bool

    @staticmethod
    def __new__(
        cls,
        packed: Packed,
        config: Config,
        shape: torch.Size,
        dtype: torch.dtype,
        requires_grad: bool = False,
    ) -> EmulatedTensor:
        fmt = lookup_format(config[0])
        direct = not isinstance(fmt, Block) and fmt.bits > 4
        kwargs: dict[str, Any] = {
            "dtype": dtype,
            "device": packed.codes.device,
            "requires_grad": requires_grad,
        }
        if direct:
            kwargs["strides"] = packed.codes.stride()
            kwargs["storage_offset"] = packed.codes.storage_offset()
        t = torch.Tensor._make_wrapper_subclass(cls, shape, **kwargs)  # type: ignore[attr-defined]
        t.codes = packed.codes
        t.scales = packed.scales
        t.tensor_scale = packed.tensor_scale
        t._config = config
        t._fmt = fmt
        t._direct = direct
        return t  # type: ignore[no-any-return]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    # --- what it holds ------------------------------------------------------------------------
    @property
    def format(self) -> Format:
        """The format of the values."""
        return self._fmt  # type: ignore[no-any-return]

    @property
    def packed(self) -> Packed:
        return Packed(self.codes, self.scales, self.tensor_scale)

    @property
    def nbytes_stored(self) -> int:
        """Bytes of storage: codes, plus block scales for Block formats."""
        return self.packed.nbytes()

    def values(self) -> torch.Tensor:  # type: ignore[override]
        """The decoded values as a plain tensor of this tensor's dtype."""
        with _no_modes():  # decoding is bookkeeping, never emulated arithmetic
            return unpack_values(self.packed, self._fmt, self.shape).to(self.dtype)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"EmulatedTensor({self.values()!r}, format={self._config[0]!r})"

    # --- decoding: torch skips these when the dtype already matches, so they are spelled out ---
    def float(self) -> torch.Tensor:  # type: ignore[override]
        """The values as a plain float32 tensor."""
        return self.values().float()

    def double(self) -> torch.Tensor:  # type: ignore[override]
        """The values as a plain float64 tensor."""
        return self.values().double()

    def half(self) -> torch.Tensor:  # type: ignore[override]
        return self.values().half()

    def bfloat16(self) -> torch.Tensor:  # type: ignore[override]
        return self.values().bfloat16()

    def tolist(self) -> Any:  # type: ignore[override]
        return self.values().tolist()

    def to(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """With another dtype: the decoded values as a plain tensor; else moved codes.

        ``t.to(t.dtype)`` returns t, as torch does (optimizers' load_state_dict relies on it).
        """
        device, dtype, *_ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != self.dtype:
            return self.values().to(device=device or self.device, dtype=dtype)
        return super().to(*args, **kwargs)

    # --- tracing and saving -------------------------------------------------------------------
    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        names = ["codes"]
        if self.scales is not None:
            names.append("scales")
        if self.tensor_scale is not None:
            names.append("tensor_scale")
        return names, (self._config, self.dtype)

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: Any, outer_size: Any, outer_stride: Any
    ) -> EmulatedTensor:
        config, dtype = ctx
        packed = Packed(inner["codes"], inner.get("scales"), inner.get("tensor_scale"))
        return EmulatedTensor(packed, config, torch.Size(outer_size), dtype)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (
            _rebuild_emulated,
            (
                self.codes,
                self.scales,
                self.tensor_scale,
                self._config,
                tuple(self.shape),
                self.dtype,
                self.requires_grad,
            ),
        )

    # --- dispatch -----------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if torch._C._len_torch_dispatch_stack() > 0:
            with _disable_current_modes():  # an EmulatedTensor computes in its own format
                return cls._dispatch(func, args, kwargs)
        return cls._dispatch(func, args, kwargs)

    @classmethod
    def _dispatch(cls, func: Any, args: tuple, kwargs: dict) -> Any:
        ets = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, EmulatedTensor)]
        first = ets[0]
        config = first._config
        for e in ets[1:]:
            if e._config != config:
                raise AnynumError(
                    f"{func} mixes EmulatedTensors of {first._config[0]} ({first._config[1:]}) and "
                    f"{e._config[0]} ({e._config[1:]}): expected one format and setting. Fix: convert one "
                    "with an.as_format(t.float(), fmt) first."
                )
        name = func.overloadpacket.__name__
        if name in _SHARE:
            return EmulatedTensor(first.packed, config, first.shape, first.dtype)
        if name == "clone":
            p = first.packed
            copy = Packed(p.codes.clone(), _clone(p.scales), _clone(p.tensor_scale))
            return EmulatedTensor(copy, config, first.shape, first.dtype)
        if name == "_to_copy":
            return _to_copy(first, config, kwargs)
        if func is aten._has_compatible_shallow_copy_type.default:
            return type(args[0]) is type(args[1])
        plan = plan_for(func)
        if plan.kind == "view" and all(e._direct for e in ets):
            out = func(
                *pytree.tree_map_only(EmulatedTensor, lambda t: t.codes, args),
                **pytree.tree_map_only(EmulatedTensor, lambda t: t.codes, kwargs),
            )
            return pytree.tree_map_only(
                torch.Tensor,
                lambda c: EmulatedTensor(Packed(c, None, None), config, c.shape, first.dtype),
                out,
            )
        em = _emulator(config)
        stand_in: dict[int, EmulatedTensor] = {}
        passed_plain: set[int] = set()

        def unwrap(t: Any) -> Any:
            if isinstance(t, EmulatedTensor):
                v = em.grid.mark(t.values())
                stand_in[id(v)] = t
                return v
            if isinstance(t, torch.Tensor):
                passed_plain.add(id(t))
            return t

        uargs = pytree.tree_map(unwrap, args)
        ukwargs = pytree.tree_map(unwrap, kwargs)
        out = em.dispatch(func, uargs, ukwargs)
        for info in plan.args:  # written EmulatedTensors take their new values
            if not info.write:
                continue
            value = (
                uargs[info.position]
                if info.position is not None and info.position < len(uargs)
                else ukwargs.get(info.name)
            )
            for v in value if isinstance(value, (list, tuple)) else [value]:
                target = stand_in.get(id(v)) if isinstance(v, torch.Tensor) else None
                if target is not None:
                    target._store(v)
        zero = name in _ZEROS

        def wrap(o: Any) -> Any:
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in stand_in:
                return stand_in[id(o)]
            if id(o) in passed_plain or not o.is_floating_point():
                return o
            if zero:
                o = torch.zeros_like(o)
            return _wrap_values(o, config, first.dtype)

        return pytree.tree_map(wrap, out)

    def _store(self, values: torch.Tensor) -> None:
        """Encode `values` (on the grid) into this tensor's codes, in place."""
        with _no_modes():
            self._store_codes(pack(values.to(torch.float64), self._fmt))

    def _store_codes(self, p: Packed) -> None:
        self.codes.copy_(p.codes)
        if self.scales is not None and p.scales is not None:
            self.scales.copy_(p.scales)
        if self.tensor_scale is not None and p.tensor_scale is not None:
            self.tensor_scale.copy_(p.tensor_scale)


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _to_copy(t: EmulatedTensor, config: Config, kwargs: dict) -> Any:
    dtype = kwargs.get("dtype")
    device = kwargs.get("device")
    if dtype is not None and dtype != t.dtype:  # .float(), .double(), .half(), .to(dtype): decode
        v = t.values()
        return v.to(dtype=dtype, device=device if device is not None else v.device)
    p = t.packed
    if device is None:
        moved = Packed(p.codes.clone(), _clone(p.scales), _clone(p.tensor_scale))
    else:
        moved = Packed(
            p.codes.to(device),
            None if p.scales is None else p.scales.to(device),
            None if p.tensor_scale is None else p.tensor_scale.to(device),
        )
        if moved.codes is p.codes:
            moved = Packed(p.codes.clone(), _clone(p.scales), _clone(p.tensor_scale))
    return EmulatedTensor(moved, config, t.shape, t.dtype)


def _wrap_values(values: torch.Tensor, config: Config, dtype: torch.dtype) -> EmulatedTensor:
    fmt = lookup_format(config[0])
    with _no_modes():
        packed = pack(values.to(torch.float64), fmt)
    return EmulatedTensor(packed, config, values.shape, dtype)


def _no_modes() -> Any:
    """A context without dispatch modes (a null context when none is active)."""
    if torch._C._len_torch_dispatch_stack() > 0:
        return _disable_current_modes()
    return contextlib.nullcontext()


def _rebuild_emulated(
    codes: torch.Tensor,
    scales: torch.Tensor | None,
    tensor_scale: torch.Tensor | None,
    config: Config,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    requires_grad: bool,
) -> EmulatedTensor:
    """Unpickle an EmulatedTensor (torch.load(weights_only=True) allows it once anynum.emulate is loaded)."""
    return EmulatedTensor(
        Packed(codes, scales, tensor_scale),
        tuple(config),
        torch.Size(shape),
        dtype,  # type: ignore[arg-type]
        requires_grad,
    )


torch.serialization.add_safe_globals([_rebuild_emulated])


def _config(
    fmt: Format,
    rounding: RoundingLike,
    accumulate: Format | str | None,
    order: str | int,
    fma: bool,
    seed: int | None,
) -> Config:
    acc = accumulate
    if isinstance(acc, Format):
        acc = acc.canonical_name
    cfg: Config = (fmt.canonical_name, parse_rounding(rounding).value, acc, order, bool(fma), seed)
    _emulator(cfg)  # validates accumulate/order/fma now, at the user's call
    return cfg


def _convert(t: torch.Tensor, cfg: Config, fmt: Format) -> EmulatedTensor:
    if not isinstance(t, torch.Tensor):
        raise AnynumError(
            f"an.as_format expected a torch tensor or nn.Module, received {type(t).__name__}. "
            "Fix: torch.as_tensor(x) first."
        )
    if isinstance(t, EmulatedTensor):
        t = t.values()
    if not t.is_floating_point():
        raise AnynumError(
            f"an.as_format expected a floating tensor, received dtype {t.dtype} (integer and bool tensors "
            "hold no format values). Fix: t.float() first."
        )
    storage_dtype(fmt.element.bits if isinstance(fmt, Block) else fmt.bits)
    em = _emulator(cfg)
    with torch.no_grad(), _no_modes():
        x = t.detach().to(torch.float64)
        if isinstance(fmt, Block):
            values = em.grid.round_blocks(x, fmt, fmt.axis if fmt.axis is not None else -1)
        else:
            values = em.grid.round(x)
    out = EmulatedTensor(pack(values, fmt), cfg, t.shape, value_dtype(fmt))
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def as_format(
    t_or_module: Any,
    fmt: Format | str,
    *,
    rounding: RoundingLike = "nearest",
    accumulate: Format | str | None = None,
    order: str | int = "sequential",
    fma: bool = False,
    seed: int | None = None,
) -> Any:
    """A tensor as an `EmulatedTensor` of `fmt`, or a module's parameters and buffers converted in place.

    The values are rounded onto `fmt` (``rounding``) and stored as codes: uint8
    for formats of up to 8 bits (two codes per byte up to 4 bits), int16 up to
    16, int32 up to 32; Block formats add their scales. Ops on the result
    compute as under ``an.emulate(fmt, rounding, accumulate=..., order=..., fma=...)``.
    For a module (the thesis's ``model.type(torch.posit16es2)``) floating
    parameters become ``nn.Parameter(EmulatedTensor)`` and floating buffers
    EmulatedTensors; the module is returned. Integer and bool buffers stay.

    NaN and ±inf follow the format (posits: NaR; a format without NaN raises on
    NaN); overflow follows the format's default policy.

    >>> import torch, anynum as an
    >>> lin = an.as_format(torch.nn.Linear(4, 2), "posit(16,2)")
    >>> type(lin.weight).__name__, lin.weight.codes.dtype, isinstance(lin.weight, torch.nn.Parameter)
    ('EmulatedTensor', torch.int16, True)
    >>> an.as_format(torch.zeros(3), an.E2M1).codes.numel()   # two 4-bit codes per byte
    2
    """
    resolved = lookup_format(fmt) if isinstance(fmt, (Format, str)) else None
    if resolved is None:
        raise AnynumError(
            f"an.as_format expected a Format or format name, received {type(fmt).__name__} {fmt!r}. "
            "Fix: an.as_format(t, 'posit(16,2)')."
        )
    storage_dtype(resolved.element.bits if isinstance(resolved, Block) else resolved.bits)
    cfg = _config(resolved, rounding, accumulate, order, fma, seed)
    if isinstance(t_or_module, nn.Module):
        for module in t_or_module.modules():
            for pname, param in list(module._parameters.items()):
                if param is not None and param.is_floating_point():
                    module._parameters[pname] = nn.Parameter(
                        _convert(param.detach(), cfg, resolved), requires_grad=param.requires_grad
                    )
            for bname, buf in list(module._buffers.items()):
                if buf is not None and buf.is_floating_point():
                    module._buffers[bname] = _convert(buf, cfg, resolved)
        return t_or_module
    return _convert(t_or_module, cfg, resolved)
