"""`observe`: watch what rounding does to every (layer, category) of a converted model while it runs.

A `Probe` stands in for one `Rounder` of a converted model: in the weight
parametrizations, the activation/error hooks, the buffer hooks and the policies of the
layers that round inside their op. It calls the rounder exactly as before and hands
(value before rounding, value after) to the `Stats` of its (layer, category). A
`QuantizedOptimizer` is watched through its ``observer`` attribute, which sees each
group of gradients, states and weights between rounding and write-back. Nothing is
rounded twice and no tensor is kept (one temporary copy of the weights per step is
taken only to measure update stagnation), so the observed model computes exactly what
it computes unobserved, random streams included. `Observation.remove` puts every
rounder back.

Parameter gradients are measured where the optimizer rounds them (its ``grad``
format); without one, a gradient hook measures them against the layer's error format
with a private rounder, leaving the gradients themselves untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.nn.hooks import BufferHook, InputHook, OutputHook, WeightQuantization, layer_state
from anynum.nn.quantizer import Rounder
from anynum.nn.stats import Stats

__all__ = ["CATEGORIES", "Observation", "Probe", "observe"]

#: Row order of a diagnosis; optimizer states appear as ``"state:<name>"`` after "gradient".
CATEGORIES = ("weight", "bias", "activation", "error", "gradient", "buffer", "state", "update")


def category_rank(category: str) -> int:
    """Position of a category in `CATEGORIES` (``"state:exp_avg"`` ranks as ``"state"``).

    >>> category_rank("weight"), category_rank("state:exp_avg")
    (0, 6)
    """
    return CATEGORIES.index(category.split(":", 1)[0])


class Probe:
    """Calls a `Rounder` unchanged and records each (input, result) pair in a `Stats`.

    Every other attribute (``fmt``, ``mode``, ``is_identity_on`` ...) is the rounder's.

    >>> import torch, anynum as an
    >>> r = an.nn.Rounder(an.E4M3FN)
    >>> p = Probe(r, Stats(r.fmt, r.mode, r.overflow))
    >>> p(torch.tensor([500.0])).tolist(), p.stats.summary()["overflow"]
    ([448.0], 1.0)
    """

    def __init__(self, rounder: Rounder, stats: Stats) -> None:
        self.rounder = rounder
        self.stats = stats

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rounder(x)
        self.stats.add(x, y)
        return y

    def __getattr__(self, name: str) -> Any:
        if name in ("rounder", "stats"):  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.rounder, name)

    def __repr__(self) -> str:
        return f"Probe({self.rounder!r})"


def _param_name(name: str) -> str:
    """``fc1.parametrizations.weight.original`` -> ``fc1.weight`` (the name a user knows)."""
    head, sep, tail = name.partition("parametrizations.")
    if not sep:
        return name
    return head + tail.removesuffix(".original")


def param_owners(model: nn.Module, layers: Sequence[str]) -> dict[int, tuple[str, str, torch.Tensor]]:
    """``{id(stored parameter): (layer, "weight"|"bias", parameter)}`` for every parameter of `model`.

    A parameter belongs to the innermost of `layers` that contains it (so the projections
    inside a converted attention layer belong to it), else to the module that holds it.

    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    >>> [(layer, cat) for layer, cat, _ in param_owners(m, ["0"]).values()]
    [('0', 'weight')]
    """
    known = set(layers)
    out: dict[int, tuple[str, str, torch.Tensor]] = {}
    for raw, p in model.named_parameters():
        name = _param_name(raw)
        owner, _, leaf = name.rpartition(".")
        parts = owner.split(".") if owner else []
        layer = owner
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in known:
                layer = ".".join(parts[:k])
                break
        out[id(p)] = (layer, "bias" if "bias" in leaf else "weight", p)
    return out


class _OptimizerWatch:
    """The `QuantizedOptimizer.observer` of an Observation."""

    def __init__(self, obs: Observation, opt: Any) -> None:
        self.obs, self.opt = obs, opt
        self.prev: dict[int, torch.Tensor] = {}
        self.grads: dict[int, torch.Tensor] = {}

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.opt.param_groups for p in g["params"]]

    def _stores(self) -> str | None:
        """The category whose rounding stores the updated weights (where updates can be lost)."""
        if self.opt.master_weights:
            return "accumulator" if self.opt.accumulator is not None else None
        return "weight" if self.opt.weight is not None else None

    def step_started(self, opt: Any) -> None:
        params = [p for p in self._params() if p.grad is not None]
        self.grads = {id(p.grad): p for p in params}
        self.prev = {}
        if self._stores() is not None:
            with torch.no_grad():
                for p in params:
                    self.prev[id(p)] = self.opt.master.get(p, p).detach().clone()

    def rounded(self, category: str, before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
        owners = self.obs.owners
        if category == "grad":
            for x, y in zip(before, after):
                p = self.grads.get(id(x))
                if p is not None and id(p) in owners:
                    self.obs.stats_for(owners[id(p)][0], "gradient", self.opt.grad).add(x, y)
        elif category == "state":
            where = {
                id(v): (p, k)
                for p in self._params()
                for k, v in self.opt.state.get(p, {}).items()
                if isinstance(v, torch.Tensor)
            }
            for x, y in zip(before, after):
                if id(x) in where:
                    p, key = where[id(x)]
                    rounder = self.opt.state_rounder(key)
                    if rounder is not None and id(p) in owners:
                        self.obs.stats_for(owners[id(p)][0], f"state:{key}", rounder).add(x, y)
        elif category == self._stores():
            rounder = self.opt.accumulator if category == "accumulator" else self.opt.weight
            by_master = {id(m): p for p, m in self.opt.master.items()}
            for x, y in zip(before, after):
                p = by_master.get(id(x), x)
                prev = self.prev.get(id(p))
                if prev is not None and id(p) in owners:
                    stats = self.obs.stats_for(owners[id(p)][0], "update", rounder, candidates=False)
                    stats.add_update(prev, x, y)


class Observation:
    """Probes installed in a converted model (and its optimizer); `stats` fills as it runs.

    Use `observe` to make one (its example shows the use). ``stats`` maps (layer, category)
    to `Stats`, in the order rows were first seen; `rows` gives them as plain dicts in model
    order.
    """

    def __init__(
        self, model: nn.Module, optimizer: Any = None, candidates: Sequence[Format | str] = ()
    ) -> None:
        self.model = model
        self.candidates = [
            (str(c) if isinstance(c, str) else c.display_name(), lookup_format(c)) for c in candidates
        ]
        self.stats: dict[tuple[str, str], Stats] = {}
        self._undo: list[Callable[[], None]] = []
        self.layers = [name for name, m in model.named_modules() if layer_state(m) is not None]
        if not self.layers:
            raise AnynumError(
                "observe needs a converted model (anynum.nn.convert); this one has no quantized "
                "layer, so there is nothing to observe."
            )
        self.order = {name: i for i, (name, _) in enumerate(model.named_modules())}
        self.owners = param_owners(model, self.layers)
        try:
            for name in self.layers:
                self._probe_layer(name, model.get_submodule(name))
            self._watch_optimizer(optimizer)
        except BaseException:
            self.remove()
            raise

    def stats_for(self, layer: str, category: str, rounder: Any, *, candidates: bool = True) -> Stats:
        """The `Stats` of (layer, category), created on first use with `rounder`'s format and mode."""
        key = (layer, category)
        s = self.stats.get(key)
        if s is None:
            s = Stats(rounder.fmt, rounder.mode, rounder.overflow, self.candidates if candidates else ())
            self.stats[key] = s
        return s

    # --- installation ---------------------------------------------------------------------
    def _set(self, obj: Any, attr: str, value: Any) -> None:
        old = getattr(obj, attr)
        setattr(obj, attr, value)
        self._undo.append(lambda: setattr(obj, attr, old))

    def _probe_layer(self, name: str, module: nn.Module) -> None:
        state = layer_state(module)
        assert state is not None
        probes: dict[str, Probe] = {}

        def probe(category: str, rounder: Any) -> Any:
            if rounder is None:
                return None
            if isinstance(rounder, Probe):
                raise AnynumError("this model is already observed; remove the other observation first.")
            if category not in probes:
                probes[category] = Probe(rounder, self.stats_for(name, category, rounder))
            return probes[category]

        pol = state.policy
        new = dataclasses.replace(
            pol,
            weight=probe("weight", pol.weight),
            bias=probe("bias", pol.bias),
            activation=probe("activation", pol.activation),
            error=probe("error", pol.error),
            buffer=probe("buffer", pol.buffer),
        )
        self._set(state, "policy", new)  # the layers that round inside their op read it per call
        for leaf, plist in getattr(module, "parametrizations", {}).items():
            for par in plist:
                if isinstance(par, WeightQuantization):
                    self._set(par, "rounder", probe("bias" if "bias" in leaf else "weight", par.rounder))
        for hook in state.hooks:
            if isinstance(hook, (InputHook, OutputHook)):
                self._set(hook, "fwd", probe("activation", hook.fwd))
                self._set(hook, "bwd", probe("error", hook.bwd))
            elif isinstance(hook, BufferHook):
                self._set(hook, "rounder", probe("buffer", hook.rounder))

    def _watch_optimizer(self, opt: Any) -> None:
        quantized = opt is not None and hasattr(opt, "observer") and hasattr(opt, "state_rounder")
        if quantized:
            if opt.observer is not None:
                raise AnynumError("this optimizer is already observed; remove the other observation first.")
            self._set(opt, "observer", _OptimizerWatch(self, opt))
        if quantized and opt.grad is not None:
            return  # gradients are observed where the optimizer rounds them
        # No gradient format: measure each layer's parameter gradients against its error format.
        meters: dict[str, Rounder] = {}
        for layer, _, p in self.owners.values():
            if layer not in self.layers or not p.requires_grad:
                continue
            state = layer_state(self.model.get_submodule(layer))
            err = state.policy.error if state is not None else None
            if err is None:
                continue
            err = err.rounder if isinstance(err, Probe) else err
            if layer not in meters:  # a private stream: the model's own draws stay as they are
                meters[layer] = Rounder(err.fmt, err.mode, err.overflow, seed=0)
            handle = p.register_hook(self._gradient_hook(layer, meters[layer]))
            self._undo.append(handle.remove)

    def _gradient_hook(self, layer: str, meter: Rounder) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.stats_for(layer, "gradient", meter).add(grad, meter(grad))

        return hook

    # --- use ------------------------------------------------------------------------------
    def remove(self) -> None:
        """Put every rounder, hook and optimizer observer back as it was (idempotent)."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Observation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def keys(self) -> list[tuple[str, str]]:
        """(layer, category) of every row, in model order, categories in `CATEGORIES` order."""
        return sorted(
            self.stats, key=lambda k: (self.order.get(k[0], len(self.order)), category_rank(k[1]), k[1])
        )

    def rows(self) -> Iterator[dict[str, Any]]:
        """One dict per (layer, category): ``layer``, ``category``, ``format``, ``rounding`` and the
        statistics of `Stats.summary`."""
        for layer, category in self.keys():
            s = self.stats[(layer, category)]
            if s.sums is None:  # installed but never called (the input error of a first layer)
                continue
            yield {
                "layer": layer,
                "category": category,
                "format": s.fmt.display_name(),
                "rounding": s.mode.value,
                "smallest_subnormal": float(s.fmt.smallest_subnormal),
                "smallest_normal": s.smallest_normal,
                **s.summary(),
            }


def observe(
    model: nn.Module, optimizer: Any = None, *, candidates: Sequence[Format | str] = ()
) -> Observation:
    """Watch a converted `model` (and a `QuantizedOptimizer`) without changing what they compute.

    Returns an `Observation` (a context manager: leaving the block removes every probe).
    Each rounding the model or optimizer does adds to the statistics of its (layer,
    category); ``candidates`` also measures the SQNR other formats would give on the same
    tensors. `anynum.nn.diagnose` runs this on a copy of your model; call it yourself to
    watch your own training loop. NaN inputs are counted apart; inf inputs count as
    overflow; see `anynum.nn.stats` for every definition.

    >>> import torch, anynum as an
    >>> m = an.nn.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), an.nn.Policy(activation="e2m1"))
    >>> with an.nn.observe(m) as obs:
    ...     _ = m(torch.tensor([[0.1, 100.0]]))
    >>> [(r["layer"], r["category"], r["overflow"], r["underflow"]) for r in obs.rows()]
    [('0', 'activation', 0.5, 0.5)]
    """
    return Observation(model, optimizer, candidates)
