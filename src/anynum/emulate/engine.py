"""The emulation engine: one op call computed in a format (shared by `emulate` and `EmulatedTensor`).

The generic rule, for every op the table (`anynum.emulate.optable`) does not
name otherwise:

1. floating tensor inputs are rounded onto the grid (skipped for tensors this
   engine has marked as on the grid and not written since), and so are
   ``Scalar`` arguments (not the ``exponent`` of pow, not those of factories,
   whose values size the result);
2. the op runs once in float64 (a ``dtype=`` argument asks for float64);
3. every floating output is rounded once onto the grid and stored in the dtype
   the op would have produced (checked to hold the grid), and marked;
4. arguments the op writes (in-place, ``out=``, foreach lists) receive the
   rounded result, and the op returns them, as it would.

For ``+ - * fma`` (add, sub, mul, addcmul, rsub) under directed, odd and
stochastic modes, or on grids of more than 25 bits, step 2 carries the
TwoSum/TwoProduct error term and step 3 rounds the exact value
(`Grid.round_pair`). Transcendentals take the float64 libm result, rounded once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from anynum.emulate import native
from anynum.emulate.accumulate import Accumulation, Accumulator
from anynum.emulate.exact import add_tail, exact_sum
from anynum.emulate.grid import Grid, check_float_container, elementwise_format
from anynum.emulate.optable import OpPlan, plan_for
from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.registry import format as lookup_format
from anynum.mc.eft import two_prod, two_sum
from anynum.rounding import RoundingLike

__all__ = ["Emulator"]

_F64 = torch.float64
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Special rules (dot products and reductions); filled in by `anynum.emulate.rules`.
SPECIAL: dict[str, Callable[..., Any]] = {}


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in _FLOATS


class Emulator:
    """A resolved emulation configuration and the op-by-op engine.

    >>> import torch, anynum as an
    >>> em = Emulator("bf16")
    >>> x = torch.tensor([1.0, 2.0**-9])
    >>> em.dispatch(torch.ops.aten.add.Tensor, (x, x), {}).tolist()
    [2.0, 0.00390625]
    """

    def __init__(
        self,
        fmt: Format | str,
        rounding: RoundingLike = "nearest",
        *,
        accumulate: Format | str | None = None,
        order: str | int = "sequential",
        fma: bool = False,
        seed: int | None = None,
    ) -> None:
        self.fmt = lookup_format(fmt)
        self.block = self.fmt if isinstance(self.fmt, Block) else None
        self.grid = Grid(elementwise_format(self.fmt), rounding, seed=seed)
        if float(self.grid.round(torch.zeros(1, dtype=_F64))[0]) != 0.0:
            raise AnynumError(
                f"emulation expected a format that holds 0, received {self.fmt.display_name()} "
                "(every model computes zeros). Fix: emulate a signed format with zero."
            )
        self.spec = Accumulation.resolve(accumulate, order, fma, result_format=self.fmt)
        self.acc = Accumulator(self.spec, self.grid)
        # dot products and reductions need their own rules only when they differ from float64-once
        self.special = self.spec.kind != "float64" or self.block is not None
        self.fma = fma
        self.inplace = False  # set per call for the exact + - x rules
        self._include: set[str] | None = None
        self._exclude: set[str] = set()
        self._selected: dict[torch._ops.OpOverload, bool] = {}

    def __repr__(self) -> str:
        return f"Emulator({self.fmt.display_name()}, {self.grid.mode.name}, {self.spec})"

    # --- the stream -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Random-stream positions as plain ints (for checkpoints)."""
        state: dict[str, Any] = {"grid": self.grid.state_dict()}
        if self.acc.grid is not None:
            state["accumulator"] = self.acc.grid.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.grid.load_state_dict(state["grid"])
        if self.acc.grid is not None and "accumulator" in state:
            self.acc.grid.load_state_dict(state["accumulator"])

    # --- dispatch ---------------------------------------------------------------------------
    @property
    def include(self) -> set[str] | None:
        """Op names to emulate only (None: every op); see `an.emulate(include=)`."""
        return self._include

    @include.setter
    def include(self, names: set[str] | None) -> None:
        self._include = names
        self._selected.clear()

    @property
    def exclude(self) -> set[str]:
        """Op names left in the tensors' own precision; see `an.emulate(exclude=)`."""
        return self._exclude

    @exclude.setter
    def exclude(self, names: set[str]) -> None:
        self._exclude = names
        self._selected.clear()

    def selected(self, func: torch._ops.OpOverload) -> bool:
        """Whether `func` is emulated under the include/exclude filters (decided once per op)."""
        sel = self._selected.get(func)
        if sel is None:
            name, full = func.overloadpacket.__name__, str(func)
            if name in self._exclude or full in self._exclude:
                sel = False
            else:
                sel = self._include is None or name in self._include or full in self._include
            self._selected[func] = sel
        return sel

    def dispatch(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """Run one op call under emulation (the caller has disabled dispatch modes)."""
        plan = plan_for(func)
        kind = plan.kind
        if kind == "pass" or (kind != "deny" and not self.selected(func)):
            return func(*args, **kwargs)
        if kind == "view":
            out = func(*args, **kwargs)
            src = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if src is not None and self.grid.is_marked(src):
                _each_float(out, self.grid.mark)
            return out
        if kind == "deny":
            raise AnynumError(
                f"{func} cannot be emulated faithfully: it is one fused kernel computing several ops "
                f"with a single rounding. Expected op-by-op execution; fix: {plan.reason}."
            )
        if kind == "decompose":
            from torch._decomp import decomposition_table

            decomp = decomposition_table.get(func)
            if decomp is None:
                raise AnynumError(f"{func} has no decomposition to emulate op by op; expected one.")
            return decomp(*args, **kwargs)
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor) and a.is_complex():
                raise AnynumError(
                    f"{func} received a complex tensor: emulation expected real floating tensors. "
                    "Fix: compute with real and imaginary parts, or leave this op out (exclude=)."
                )
        if self.special:
            rule = SPECIAL.get(plan.name)
            if rule is not None:
                res = rule(self, func, args, kwargs)
                if res is not NotImplemented:
                    return res
        if kind == "compute" and not plan.seeded and not self.grid.stochastic:
            # one pass rounds and widens the inputs (stochastic modes keep `_round_args`' order of
            # roundings, written arguments last, which fixes their random stream)
            return self._compute(func, plan, args, kwargs, rounded=False)
        args, kwargs = self._round_args(plan, args, kwargs)
        if plan.seeded:
            # random draws run in the tensors' own dtype, so a seed gives the same numbers with or
            # without emulation; the draws are then rounded (in place where the op writes)
            out = func(*args, **kwargs)
            for a in _written(plan, args, kwargs):
                _each_float(a, lambda t: self.grid.mark(t.copy_(self.grid.round(t)), written=True))
            written = {id(a) for a in _written(plan, args, kwargs)}

            def rounded(t: torch.Tensor) -> torch.Tensor:
                return t if id(t) in written else self.grid.mark(self.grid.round(t))

            return _map_float(out, rounded)
        if kind == "select" and any(_is_float(a) for a in _tensors(args, kwargs)):
            out = func(*args, **kwargs)
            _each_float(out, self._mark_checked)
            for a in _written(plan, args, kwargs):
                _each_float(a, lambda t: self._mark_checked(t, written=True))
            return out
        return self._compute(func, plan, args, kwargs)

    def _mark_checked(self, t: torch.Tensor, written: bool = False) -> None:
        check_float_container(self.grid, t.dtype)
        self.grid.mark(t, written=written)

    def _round_args(self, plan: OpPlan, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Floating tensors and Scalars rounded onto the grid (marked tensors kept as they are).

        Written arguments stay the caller's objects: the result is written into them later.
        """
        grid = self.grid
        new_args = list(args)
        new_kwargs = dict(kwargs)
        # Scalars are values of the computation only next to floating tensors (not in int ops)
        scalars = any(_is_float(t) for t in _tensors(args, kwargs))
        for info in plan.args:
            if info.position is not None and info.position < len(args):
                value, store, key = args[info.position], new_args, info.position
            elif info.name in kwargs:
                value, store, key = kwargs[info.name], new_kwargs, info.name  # type: ignore[assignment]
            else:
                continue
            if info.kind == "scalar":
                if scalars and _is_value_scalar(info, value):
                    store[key] = grid.round_scalar(float(value))  # type: ignore[index]
            elif info.write:
                continue
            elif info.kind == "tensor" and _is_float(value):
                store[key] = grid.round_input(value)  # type: ignore[index]
            elif info.kind == "tensor_list" and value is not None:
                store[key] = [grid.round_input(v) if _is_float(v) else v for v in value]  # type: ignore[index]
        return tuple(new_args), new_kwargs

    def _compute(
        self, func: torch._ops.OpOverload, plan: OpPlan, args: tuple, kwargs: dict, rounded: bool = True
    ) -> Any:
        """The generic rule; `rounded=False`: the inputs are rounded here (one pass over the
        arguments instead of two; deterministic modes, where the order of roundings is free)."""
        grid = self.grid
        written: list[tuple[torch.Tensor, torch.Tensor]] = []  # (float64 stand-in, caller's tensor)
        float_dtypes: list[tuple[int, torch.dtype]] = []
        new_args = list(args)
        new_kwargs = dict(kwargs)
        # Scalars are values of the computation only next to floating tensors (not in int ops)
        scalars = not rounded and plan.scalars and any(_is_float(t) for t in _tensors(args, kwargs))

        def widen(v: Any, write: bool) -> Any:
            if not _is_float(v):
                return v
            float_dtypes.append((0 if v.dim() == 0 else 1, v.dtype))
            if write:
                w = grid.round_input(v).to(_F64, copy=True)
                written.append((w, v))
                return w
            if rounded or grid.is_marked(v):
                return grid.wide(v)
            return grid.wide_rounded(v)

        for info in plan.args:
            if info.position is not None and info.position < len(args):
                value, store, key = args[info.position], new_args, info.position
            elif info.name in kwargs:
                value, store, key = kwargs[info.name], new_kwargs, info.name  # type: ignore[assignment]
            else:
                continue
            if info.kind == "tensor":
                store[key] = widen(value, info.write)  # type: ignore[index]
            elif info.kind == "tensor_list" and value is not None:
                store[key] = [widen(v, info.write) for v in value]  # type: ignore[index]
            elif info.kind == "dtype" and value in _FLOATS:
                # every floating dtype the op is told (dtype=, the backward ops' input_dtype)
                # becomes the working dtype: CUDA kernels refuse a mismatch that CPU ones accept
                store[key] = _F64  # type: ignore[index]
            elif scalars and info.kind == "scalar" and _is_value_scalar(info, value):
                store[key] = grid.round_scalar(float(value))  # type: ignore[index]
        natural = _natural_dtype(float_dtypes, kwargs)
        pair = _PAIR_RULES.get(plan.name) if float_dtypes else None
        out = NotImplemented
        if pair is not None:
            self.inplace = plan.name.endswith("_")
            out = pair(self, new_args, new_kwargs)
        if out is NotImplemented:
            out = func(*new_args, **new_kwargs)
            if not float_dtypes and _has_float(out):
                # integer inputs, floating result (int / int): recompute from exact float64 copies
                ints = [a.to(_F64) if isinstance(a, torch.Tensor) and a.dtype != torch.bool else a
                        for a in new_args]
                out = func(*ints, **new_kwargs)
        stand_ins = {id(w): v for w, v in written}
        for w, v in written:
            grid.write_kept(v, grid.round(w))

        def finish(o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                orig = stand_ins.get(id(o))
                if orig is not None:
                    return orig
                if o.dtype in _FLOATS:
                    return grid.round_to_kept(o, natural if o.dtype == _F64 else o.dtype, owned=plan.fresh)
            return o

        if isinstance(out, (tuple, list)):
            return type(out)(finish(o) if not isinstance(o, list) else [finish(x) for x in o] for o in out)
        return finish(out)


def _is_value_scalar(info: Any, value: Any) -> bool:
    """Whether a Scalar argument is a value of the computation, rounded onto the grid (not pow's
    exponent, not a bool)."""
    return info.name != "exponent" and isinstance(value, (int, float)) and not isinstance(value, bool)


def _natural_dtype(float_dtypes: list[tuple[int, torch.dtype]], kwargs: dict) -> torch.dtype:
    """The floating dtype the op would produce: ``dtype=``, else promotion of the inputs (tensors
    of one or more dimensions before 0-d ones, as torch's type promotion), else the default."""
    d = kwargs.get("dtype")
    if d in _FLOATS:
        return d  # type: ignore[no-any-return]
    for rank in (1, 0):
        dts = [dt for r, dt in float_dtypes if r == rank]
        if dts:
            out = dts[0]
            for dt in dts[1:]:
                out = torch.promote_types(out, dt)
            return out
    return torch.get_default_dtype()


def _has_float(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.dtype in _FLOATS
    if isinstance(out, (tuple, list)):
        return any(_has_float(o) for o in out)
    return False


def _each_float(out: Any, fn: Callable[[torch.Tensor], Any]) -> None:
    if isinstance(out, torch.Tensor):
        if out.dtype in _FLOATS:
            fn(out)
    elif isinstance(out, (tuple, list)):
        for o in out:
            _each_float(o, fn)


def _map_float(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out) if out.dtype in _FLOATS else out
    if isinstance(out, (tuple, list)):
        return type(out)(_map_float(o, fn) for o in out)
    return out


def _tensors(args: tuple, kwargs: dict) -> list[Any]:
    out: list[Any] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _written(plan: OpPlan, args: tuple, kwargs: dict) -> list[Any]:
    out = []
    for info in plan.args:
        if not info.write:
            continue
        if info.position is not None and info.position < len(args):
            out.append(args[info.position])
        elif info.name in kwargs:
            out.append(kwargs[info.name])
    return out


# --- + - x fma with their exact error terms -------------------------------------------------------


def _get(args: list, kwargs: dict, pos: int, name: str, default: Any) -> Any:
    if pos < len(args):
        return args[pos]
    return kwargs.get(name, default)


def _as64(v: Any, like: torch.Tensor) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v.to(_F64)
    return torch.tensor(float(v), dtype=_F64, device=like.device)


def _scaled(v: torch.Tensor, s: float) -> tuple[torch.Tensor, torch.Tensor]:
    if s == 1.0:
        return v, torch.zeros_like(v)
    return two_prod(*torch.broadcast_tensors(v, torch.tensor(s, dtype=_F64, device=v.device)))


def _sum_pairs(*pairs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sum of two pairs (value, TwoProduct error) as a pair whose remainder has the exact
    sign: TwoSum of the values, then the errors as tails (`add_tail`); more pairs, or two
    nonzero errors, go through `exact_sum`."""
    if len(pairs) == 2 and not bool(pairs[0][1].any()):
        (a, _), (b, be) = pairs
        y, e = two_sum(*torch.broadcast_tensors(a, b))
        return add_tail(y, e, be) if bool(be.any()) else (y, e)
    terms = torch.broadcast_tensors(*(t for pair in pairs for t in pair))
    return exact_sum(torch.stack(terms, dim=-1))


def _round_sum(em: Emulator, a: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``a + q`` (float64s, each exact) rounded once: `native.add_round` in one C pass where it
    applies, else TwoSum and `Grid.round_pair` (the same rounding)."""
    r = native.add_round(a, q, em.grid)
    if r is not None:
        return r
    y, e = two_sum(*torch.broadcast_tensors(a, q))
    return em.grid.round_pair(y, e, force=True)


def _add_pair(em: Emulator, args: list, kwargs: dict, *, sign: float = 1.0, reverse: bool = False) -> Any:
    alpha = float(_get(args, kwargs, 2, "alpha", 1.0))
    if alpha == 1.0 and not em.grid.needs_pair:
        return NotImplemented  # a sum of two grid values: float64 then one rounding is exact
    a = _as64(args[0], _first_tensor(args))
    b = _as64(_get(args, kwargs, 1, "other", 0.0), a)
    if reverse:  # rsub: other - alpha * self
        a, b = b, a
    s = sign * alpha
    if abs(s) == 1.0 or em.grid.products_exact(2):  # alpha * b exact: a sum of two floats
        return _finish_rounded(em, args, kwargs, _round_sum(em, a, b if s == 1.0 else b * s))
    y, e = _sum_pairs((a, torch.zeros_like(a)), _scaled(b, s))
    return _finish_pair(em, args, kwargs, y, e)


def _mul_pair(em: Emulator, args: list, kwargs: dict) -> Any:
    if not em.grid.needs_pair:
        return NotImplemented  # a product of two grid values of at most 25 bits is exact in float64
    a = _as64(args[0], _first_tensor(args))
    b = _as64(_get(args, kwargs, 1, "other", 1.0), a)
    y, e = two_prod(*torch.broadcast_tensors(a, b))
    return _finish_pair(em, args, kwargs, y, e)


def _addcmul_pair(em: Emulator, args: list, kwargs: dict) -> Any:
    # a + v * b * c: the sum of a grid value and a product of up to 2p bits, so float64 can
    # round twice even in the nearest modes: always exact
    a = _as64(args[0], _first_tensor(args))
    t1, t2 = _as64(args[1], a), _as64(args[2], a)
    value = float(_get(args, kwargs, 3, "value", 1.0))
    if em.grid.products_exact(2 if value == 1.0 else 3):  # v * b * c exact: a sum of two floats
        q = t1 * t2 if value == 1.0 else t1 * t2 * value
        return _finish_rounded(em, args, kwargs, _round_sum(em, a, q))
    p, pe = two_prod(*torch.broadcast_tensors(t1, t2))
    pairs = [(a, torch.zeros_like(a))]
    if value == 1.0:
        pairs.append((p, pe))
    elif not bool(pe.any()):  # b * c exact (grids of at most 26 bits): v * (b * c) as one pair
        pairs.append(_scaled(p, value))
    else:
        q, qe = _scaled(p, value)
        pairs += [(q, qe), _scaled(pe, value)]
    y, e = _sum_pairs(*pairs)
    return _finish_pair(em, args, kwargs, y, e)


def _first_tensor(args: list) -> torch.Tensor:
    return next(a for a in args if isinstance(a, torch.Tensor))


def _finish_pair(em: Emulator, args: list, kwargs: dict, y: torch.Tensor, e: torch.Tensor) -> Any:
    """Round the exact pair once; in-place and out= forms write into their (float64) target."""
    return _finish_rounded(em, args, kwargs, em.grid.round_pair(y, e, force=True))


def _finish_rounded(em: Emulator, args: list, kwargs: dict, r: torch.Tensor) -> Any:
    """The rounded result `r`, written into the (float64) target of in-place and out= forms."""
    target = kwargs.get("out")
    if target is None and em.inplace:
        target = args[0]
    if target is not None:
        target.copy_(r)
        return target
    return r


_PAIR_RULES: dict[str, Callable[..., Any]] = {}
for _inplace in ("", "_"):
    _PAIR_RULES["add" + _inplace] = _add_pair
    _PAIR_RULES["sub" + _inplace] = lambda em, a, k: _add_pair(em, a, k, sign=-1.0)
    _PAIR_RULES["mul" + _inplace] = _mul_pair
    _PAIR_RULES["addcmul" + _inplace] = _addcmul_pair
_PAIR_RULES["rsub"] = lambda em, a, k: _add_pair(em, a, k, sign=-1.0, reverse=True)
