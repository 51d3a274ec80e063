"""`QuantizedOptimizer`: any torch optimizer with its numbers on chosen grids (QPyTorch `OptimLP`).

One step: (loss scaling check) -> round the scaled gradients onto the grad
format -> unscale -> (load master weights) -> the wrapped optimizer's step ->
round each state tensor onto its category's format -> (store master weights
on the accumulator format) -> round the weights onto the weight format.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._utils import _unflatten_dense_tensors

from anynum.errors import AnynumError
from anynum.nn.checks import check_flag, check_seed
from anynum.nn.quantizer import NumberLike, Rounder, resolve_number
from anynum.nn.streams import load_stream_state, stream_state
from anynum.optim.scaling import LossScale, make_loss_scale
from anynum.quantize.rounder import round_each_native
from anynum.rounding import RoundingLike

__all__ = ["MOMENTUM_STATES", "SECOND_MOMENT_STATES", "QuantizedOptimizer"]

#: First-moment state tensors of the torch optimizers (the "momentum" category).
MOMENTUM_STATES = frozenset({"momentum_buffer", "exp_avg", "grad_avg"})
#: Second-moment and other accumulated state tensors (the "second_moment" category).
SECOND_MOMENT_STATES = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum", "acc_delta"})
_COUNTERS = frozenset({"step"})
_SAME = "same as momentum"


#: Flat buffers by tensor layout, reused across steps (see `round_in_place`).
Staging = dict[Any, tuple[torch.Tensor, list[torch.Tensor]]]


#: ``observe(before, after)``: the tensors of a group and their rounded values, at the moment
#: both exist (before the rounded values are written back).
Observe = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


def round_in_place(
    tensors: list[torch.Tensor],
    rounder: Rounder,
    staging: Staging | None = None,
    observe: Observe | None = None,
) -> None:
    """Round every tensor onto `rounder`'s grid in place, one quantize call per dtype and device.

    The tensors of a group are rounded as their row-major concatenation (one call, and for
    stochastic modes one random stream): by the native kernel in one pass over the tensors
    themselves where it can (`Rounder.round_each_into`), else in a flat buffer. `staging`
    keeps that buffer of each layout between calls, so a training loop copies in and out
    with two `_foreach_copy_` calls instead of building and splitting a new one each step.
    `observe`, when given, sees each group's tensors and their rounded values just before
    the write-back (no extra copy or rounding: what it sees is what is stored).
    """
    if observe is None and tensors and round_each_native(tensors, rounder):
        return  # one group, rounded where it lies
    groups = _by_dtype_and_device(tensors)
    for ts in groups:
        dtype, device = ts[0].dtype, ts[0].device
        if len(ts) == 1:
            y = rounder(ts[0])
            if observe is not None:
                observe(ts, [y])
            ts[0].copy_(y)
            continue

        def stage(dtype: torch.dtype = dtype, device: torch.device = device, ts: list[torch.Tensor] = ts
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
            key = (dtype, device, *(t.shape for t in ts))
            entry = staging.get(key) if staging is not None else None
            if entry is None:
                flat = torch.empty(sum(t.numel() for t in ts), dtype=dtype, device=device)
                entry = (flat, _unflatten_dense_tensors(flat, ts))  # views of flat shaped like ts
                if staging is not None:
                    staging[key] = entry
            return entry

        if observe is None:
            rounder.round_each_into(ts, stage)
            continue
        flat, views = stage()
        torch._foreach_copy_(views, ts)
        rounder.round_into(flat)
        observe(ts, list(views))
        torch._foreach_copy_(ts, views)


def _by_dtype_and_device(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The non-empty tensors grouped by (dtype, device), each group in the order given."""
    first = tensors[0] if tensors else None
    if first is not None:
        dtype, where = first.dtype, first.get_device()  # (an int: cheaper than .device)
        if all(t.dtype is dtype and t.get_device() == where and t.numel() for t in tensors):
            return [tensors]  # the common case: one group, as given
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


class QuantizedOptimizer:
    """Wraps a torch optimizer so that gradients, states and weights live on chosen number grids.

    Args:
        optimizer: any `torch.optim.Optimizer` (SGD, Adam, AdamW, RMSprop,
            Adagrad, Adadelta and others whose states are listed below).
        weight: format of the weights after each step.
        grad: format of the gradients before the step (rounded while still
            loss-scaled, so small gradients survive; then unscaled).
        momentum: first-moment states (``momentum_buffer``, ``exp_avg``, ``grad_avg``).
        second_moment: ``exp_avg_sq``, ``max_exp_avg_sq``, ``square_avg``, ``sum``,
            ``acc_delta`` (default: the momentum format, as QPyTorch's OptimLP).
        accumulator: format of the master weights (QPyTorch ``acc_quant``);
            giving it turns master weights on.
        state: ``{state_name: NumberLike}`` for further (or overriding) state
            tensors; None there keeps a state in full precision.
        rounding: default rounding of every category (each may also be
            ``(fmt, rounding)``).
        master_weights: keep a high-precision copy that the wrapped optimizer
            updates (default: on iff `accumulator` is given); the model holds
            the weight-format copy.
        grad_scale: 1.0 (none), a static scale, ``"dynamic"`` or a
            `DynamicLossScale`. With any scale other than 1, call
            ``opt.scale_loss(loss).backward()``; dynamic scaling skips steps whose
            scaled gradients are non-finite or beyond the grad format's largest
            value (so saturating formats such as posits back off too).
        seed: seeds the streams of stochastic categories (else drawn from
            torch's global generator once).

    ``observer`` (attribute, default None) lets a diagnostic watch the numbers of each
    step without changing them (`anynum.nn.observe` sets it): an object with
    ``step_started(optimizer)``, called when a step is about to update (after the
    loss-scale check), and ``rounded(category, before, after)``, called for every group
    of tensors rounded in place, with category ``"grad"``, ``"state"``, ``"accumulator"``
    or ``"weight"``, the tensors before rounding and their rounded values.

    Every state tensor must belong to a category when any state category is
    set; an unknown one raises AnynumError naming it (add it to `state=`).
    NaN/inf follow each format (see `anynum.quantize`). For LR schedulers pass
    ``opt.optimizer`` (it shares ``param_groups``).

    >>> import torch, anynum as an
    >>> w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    >>> opt = an.optim.QuantizedOptimizer(torch.optim.SGD([w], lr=0.1, momentum=0.9),
    ...                                   weight="bf16", grad="e5m2", momentum="fp16")
    >>> w.grad = torch.tensor([0.3, -0.3]); opt.step()
    >>> w.tolist()
    [0.96875, 2.03125]
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        weight: NumberLike = None,
        grad: NumberLike = None,
        momentum: NumberLike = None,
        second_moment: Any = _SAME,
        accumulator: NumberLike = None,
        *,
        state: Mapping[str, NumberLike] | None = None,
        rounding: RoundingLike = "nearest",
        master_weights: bool | None = None,
        grad_scale: float | str | LossScale = 1.0,
        seed: int | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise AnynumError(
                f"QuantizedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}."
            )
        self.optimizer = optimizer
        check_seed(seed, "QuantizedOptimizer")
        if state is not None and not isinstance(state, Mapping):
            raise AnynumError(
                f"QuantizedOptimizer state= takes a dict {{state_name: format or None}}, got "
                f"{type(state).__name__}; e.g. state={{'exp_avg': 'bf16'}}."
            )
        if master_weights is not None:
            check_flag(master_weights, "master_weights", "QuantizedOptimizer")

        def r(value: NumberLike, k: int) -> Rounder | None:
            return resolve_number(value, rounding, None if seed is None else seed + k)

        self.weight = r(weight, 0)
        self.grad = r(grad, 1)
        self.momentum = r(momentum, 2)
        self.second_moment = self.momentum if second_moment is _SAME else r(second_moment, 3)
        self.accumulator = r(accumulator, 4)
        self.state_rounders: dict[str, Rounder | None] = {
            name: r(v, 5 + i) for i, (name, v) in enumerate((state or {}).items())
        }
        self.master_weights = accumulator is not None if master_weights is None else bool(master_weights)
        if accumulator is not None and not self.master_weights:
            raise AnynumError("accumulator= is the master-weight format; it needs master_weights=True.")
        self.loss_scale = make_loss_scale(grad_scale)
        self.master: dict[torch.Tensor, torch.Tensor] = {}
        self.skipped_last_step = False
        self._scaled = False
        self._staging: Staging = {}  # see round_in_place
        self.observer: Any = None  # see the class docstring

    # --- delegation -----------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(group)

    def __repr__(self) -> str:
        cats = {k: getattr(self, k) for k in ("weight", "grad", "momentum", "second_moment", "accumulator")}
        body = ", ".join(f"{k}={v}" for k, v in cats.items() if v is not None)
        return f"QuantizedOptimizer({type(self.optimizer).__name__}, {body}, scale={self.loss_scale.scale})"

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    # --- loss scaling ---------------------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``: call ``.backward()`` on this so errors and gradients are scaled."""
        self._scaled = True
        return loss * self.loss_scale.scale

    @property
    def scale(self) -> float:
        """The current loss scale."""
        return self.loss_scale.scale

    def _overflowed(self, grads: list[torch.Tensor]) -> bool:
        limit = self.grad.fmt.max if self.grad is not None else math.inf
        amax = torch.stack([g.detach().abs().amax().float() for g in grads if g.numel()]).amax()
        return not bool(amax <= limit)  # NaN compares False: counted as overflow

    # --- states ---------------------------------------------------------------------------
    def _any_state_format(self) -> bool:
        return any(x is not None for x in (self.momentum, self.second_moment, *self.state_rounders.values()))

    def state_rounder(self, name: str) -> Rounder | None:
        """The rounder of optimizer state `name`; raises AnynumError for an unknown state."""
        if name in self.state_rounders:
            return self.state_rounders[name]
        if name in MOMENTUM_STATES:
            return self.momentum
        if name in SECOND_MOMENT_STATES:
            return self.second_moment
        if not self._any_state_format():
            return None
        raise AnynumError(
            f"{type(self.optimizer).__name__} keeps a state tensor {name!r} that QuantizedOptimizer "
            f"does not know; say how to store it with state={{{name!r}: fmt}} "
            f"(or state={{{name!r}: None}} to keep it in full precision)."
        )

    def _state_tensors(self) -> list[tuple[int, str, torch.Tensor]]:
        """(parameter index, state name, tensor) of every floating state tensor but counters."""
        state = self.optimizer.state  # (a list by comprehension: this runs every step)
        return [
            (i, key, value)
            for i, p in enumerate(self._params())
            if (entry := state.get(p))
            for key, value in entry.items()
            if isinstance(value, torch.Tensor) and key not in _COUNTERS and value.is_floating_point()
        ]

    # --- the step -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One quantized optimizer step; returns the closure's loss (if any).

        A dynamic-scaling step that overflows changes nothing but the scale and
        sets ``skipped_last_step``.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scale = self.loss_scale.scale
        if scale != 1.0 and not self._scaled:
            raise AnynumError(
                f"this optimizer scales losses by {scale}; call opt.scale_loss(loss).backward() "
                "instead of loss.backward() before opt.step()."
            )
        self._scaled = False
        params = [p for p in self._params() if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        if any(g.is_sparse for g in grads):
            raise AnynumError("QuantizedOptimizer does not support sparse gradients.")
        self.skipped_last_step = False
        if self.loss_scale.dynamic and grads and self._overflowed(grads):
            self.loss_scale.update(True)
            self.skipped_last_step = True
            return loss
        if self.observer is not None:
            self.observer.step_started(self)
        if self.grad is not None:
            self._round(grads, self.grad, "grad")
        if scale != 1.0:
            torch._foreach_mul_(grads, 1.0 / scale)
        if self.master_weights:
            for p in params:
                m = self.master.get(p)
                if m is None:
                    self.master[p] = m = p.detach().clone()
                p.copy_(m)
        self.optimizer.step()
        self._round_states()
        if self.master_weights:
            masters = [self.master[p] for p in params]
            for p, m in zip(params, masters):
                m.copy_(p)
            if self.accumulator is not None:
                self._round(masters, self.accumulator, "accumulator")
            for p, m in zip(params, masters):
                p.copy_(m)
        if self.weight is not None:
            self._round(params, self.weight, "weight")
            # so that the model's own weight rounding skips them (round_weight)
            self.weight.mark_on_grid(*params)
        self.loss_scale.update(False)
        return loss

    def _round_states(self) -> None:
        # By rounder identity (hashing a Rounder hashes its format), state_rounder looked up
        # once per state name and step.
        groups: dict[int, tuple[Rounder, list[torch.Tensor]]] = {}
        rounders: dict[str, Rounder | None] = {}
        for _, key, value in self._state_tensors():
            if key in rounders:
                rounder = rounders[key]
            else:
                rounder = rounders[key] = self.state_rounder(key)
            if rounder is not None:
                entry = groups.get(id(rounder))
                if entry is None:
                    groups[id(rounder)] = entry = (rounder, [])
                entry[1].append(value)
        for rounder, tensors in groups.values():
            self._round(tensors, rounder, "state")

    def _round(self, tensors: list[torch.Tensor], rounder: Rounder, category: str) -> None:
        observer = self.observer
        if observer is None:
            round_in_place(tensors, rounder, self._staging)
            return

        def observe(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
            observer.rounded(category, before, after)

        round_in_place(tensors, rounder, self._staging, observe)

    # --- audit ----------------------------------------------------------------------------
    def grid_checks(self) -> Iterator[tuple[str, str, torch.Tensor, Rounder]]:
        """(name, kind, tensor, declared rounder) of every tensor this optimizer keeps on a grid."""
        for i, p in enumerate(self._params()):
            if self.weight is not None:
                yield f"param[{i}]", "parameter", p, self.weight
            m = self.master.get(p)
            if m is not None and self.accumulator is not None:
                yield f"master[{i}]", "master weight", m, self.accumulator
        for i, key, value in self._state_tensors():
            rounder = self.state_rounder(key)
            if rounder is not None:
                yield f"state[{i}].{key}", "optimizer state", value, rounder

    # --- checkpoints ----------------------------------------------------------------------
    def _rounders(self) -> dict[str, Rounder]:
        named = {
            "weight": self.weight,
            "grad": self.grad,
            "momentum": self.momentum,
            "second_moment": self.second_moment,
            "accumulator": self.accumulator,
            **{f"state.{k}": v for k, v in self.state_rounders.items()},
        }
        return {k: v for k, v in named.items() if v is not None}

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state plus master weights, loss scale and random streams.

        Tensors, numbers and strings only (loads with ``torch.load(weights_only=True)``);
        the streams of stochastic categories sit under ``"rng"`` as
        ``"<category>.<field>"`` entries (`anynum.nn.streams`), so a resumed run is
        bit-identical to the uninterrupted one.
        """
        return {
            "optimizer": self.optimizer.state_dict(),
            "master": [self.master.get(p) for p in self._params()],
            "loss_scale": self.loss_scale.state_dict(),
            "rng": stream_state(self._rounders()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved, bit for bit.

        A state without ``"rng"`` (written before streams were saved) leaves the
        streams where they are: the run continues reproducibly, but not bit for bit
        like the uninterrupted one.
        """
        if not isinstance(state, Mapping) or "optimizer" not in state:
            got = f"a dict with keys {sorted(state)}" if isinstance(state, Mapping) else type(state).__name__
            raise AnynumError(
                "QuantizedOptimizer.load_state_dict expects what QuantizedOptimizer.state_dict() "
                f"returns (a dict with 'optimizer', 'master', 'loss_scale', 'rng'), got {got}; "
                "to load a plain torch optimizer state, call opt.optimizer.load_state_dict(state)."
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.master = {}
        for p, m in zip(self._params(), state.get("master", [])):
            if m is not None:
                self.master[p] = m.detach().clone().to(device=p.device, dtype=p.dtype)
        if "loss_scale" in state:
            self.loss_scale.load_state_dict(state["loss_scale"])
        load_stream_state(self._rounders(), state.get("rng", {}), "QuantizedOptimizer.load_state_dict")
