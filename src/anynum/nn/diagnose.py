"""`diagnose`: why a format fails, per layer and number category, with suggestions in numbers.

`diagnose` deep-copies the model, converts the copy with the policy, runs forward
(and, with a loss, backward and optimizer) steps on the user's batches under
`anynum.nn.observe`, and returns a `DiagnoseReport`: one row per (layer, category)
and suggestions computed from the rows (`suggest`):

* **loss scale**: the smallest power of two that brings the underflow of every error and
  gradient row below `underflow_target` without pushing any of them past the format's
  largest value, predicted from the histogram of log2|x| each row keeps (when none does,
  the one with the least underflow that keeps `HEADROOM`);
* **narrowest format**: per row, the narrowest of `candidates` whose SQNR on the same
  tensors is at least `min_sqnr` dB;
* **keep in higher precision**: layers whose weights, biases or activations lose more
  than that (SQNR below `min_sqnr`, or more than `underflow_target` of the values beyond
  the format's range);
* **stagnation**: layers where more than `STAGNATION_WARN` of the weight updates are below
  half an ulp of the weight.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.nn.convert import convert, converted_layers
from anynum.nn.observe import Observation, observe
from anynum.nn.policy import Policy
from anynum.nn.report import DiagnoseReport, Suggestion
from anynum.rounding import Rounding

__all__ = [
    "HEADROOM",
    "STAGNATION_WARN",
    "diagnose",
    "flush_threshold",
    "predicted_underflow",
    "report_from",
    "suggest",
]

#: Fraction of stagnating weight updates above which a layer gets a suggestion.
STAGNATION_WARN = 0.1
#: When no loss scale brings underflow below the target, the suggested one keeps the largest
#: scaled value this many times below the format's maximum (later steps may see larger values).
HEADROOM = 4.0


def _policy(policy_or_format: Policy | Format | str | None) -> Policy | None:
    if policy_or_format is None or isinstance(policy_or_format, Policy):
        return policy_or_format
    if isinstance(policy_or_format, (Format, str)):
        fmt = lookup_format(policy_or_format)
        return Policy(weight=fmt, activation=fmt, error=fmt)
    raise AnynumError(
        "diagnose(policy_or_format=...) takes an anynum.nn.Policy, a Format or a format name "
        f"(or None for a model that is already converted); got {type(policy_or_format).__name__}."
    )


def _batches(data: Iterable[Any], steps: int | None) -> Iterable[tuple[Any, Any]]:
    if isinstance(data, torch.Tensor) or not hasattr(data, "__iter__"):
        raise AnynumError(
            "diagnose(data=...) takes an iterable of (input, target) batches, such as a DataLoader "
            f"or a list of pairs; got {type(data).__name__}. Wrap a single batch as [(x, y)]."
        )
    for i, item in enumerate(data):
        if steps is not None and i >= steps:
            return
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            size = f" of length {len(item)}" if isinstance(item, (tuple, list)) else ""
            raise AnynumError(
                f"diagnose(data=...) must yield (input, target) pairs; batch {i} is a "
                f"{type(item).__name__}{size}."
            )
        yield item[0], item[1]


def _forward(model: nn.Module, x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return model(*x)
    if isinstance(x, dict):
        return model(**x)
    return model(x)


def diagnose(
    model: nn.Module,
    policy_or_format: Policy | Format | str | None,
    data: Iterable[Any],
    *,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None,
    steps: int | None = None,
    candidates: Sequence[Format | str] = (),
    min_sqnr: float = 20.0,
    underflow_target: float = 0.01,
) -> DiagnoseReport:
    """Run `model` in `policy_or_format` on `data` and report where the numbers go wrong.

    Args:
        model: any torch module; it is deep-copied and never changed (nor are its
            optimizers or random streams).
        policy_or_format: an `anynum.nn.Policy`; a format (or name) means
            ``Policy(weight=f, activation=f, error=f)``; None diagnoses a model that
            `convert` has already converted, as it is.
        data: an iterable of ``(input, target)`` batches (a DataLoader, a list). The input
            goes to ``model(input)`` (a tuple is unpacked, a dict passed as keywords).
        loss_fn: ``loss_fn(output, target) -> scalar``. Without it only forward passes run
            (weights, biases, activations); with it, backward too (errors, gradients).
        optimizer: a factory ``optimizer(params) -> optimizer`` called with the copy's
            parameters, e.g. ``lambda ps: an.optim.QuantizedOptimizer(torch.optim.SGD(ps,
            lr=0.1), grad="e5m2")``; each batch is then a training step of the copy, and a
            `QuantizedOptimizer` adds gradient, optimizer-state and update rows (its loss
            scale is applied with ``scale_loss``). Needs `loss_fn`.
        steps: at most this many batches (default: all of `data`).
        candidates: formats whose SQNR on the same tensors is also measured, for the
            narrowest-format suggestion.
        min_sqnr: the SQNR (dB) the suggestions ask of a format.
        underflow_target: the largest acceptable fraction of values flushed to zero (and
            of values beyond the format's range).

    Returns a `DiagnoseReport` (rows, suggestions, table, CSV/JSON, PNGs). Every statistic is
    defined in `anynum.nn.stats`: NaN inputs are counted apart, infinite inputs count as
    overflow, a value rounded to inf or NaN makes that row's SQNR -inf.

    >>> import torch, anynum as an
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> data = [(torch.randn(16, 4), torch.randint(0, 2, (16,))) for _ in range(3)]
    >>> rep = an.nn.diagnose(model, an.nn.Policy(weight="e4m3fn", error="e5m2"), data,
    ...                      loss_fn=torch.nn.functional.cross_entropy)
    >>> [(r["layer"], r["category"]) for r in rep.rows]  # no error at the input: x needs no gradient
    ... # doctest: +NORMALIZE_WHITESPACE
    [('0', 'weight'), ('0', 'bias'), ('0', 'gradient'),
     ('2', 'weight'), ('2', 'bias'), ('2', 'error'), ('2', 'gradient')]
    >>> rep.steps, rep.row("2", "error")["format"], rep.row("0", "weight")["overflow"]
    (3, 'e5m2', 0.0)
    """
    policy = _policy(policy_or_format)
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise AnynumError(f"diagnose(steps=...) must be a positive integer or None, got {steps!r}.")
    if optimizer is not None and loss_fn is None:
        raise AnynumError("diagnose(optimizer=...) trains the copy and needs loss_fn= to do so.")
    if optimizer is not None and not callable(optimizer):
        raise AnynumError(
            "diagnose(optimizer=...) takes a factory called with the copy's parameters, e.g. "
            f"lambda params: torch.optim.SGD(params, lr=0.1); got {type(optimizer).__name__}."
        )
    if not isinstance(model, nn.Module):
        raise AnynumError(f"diagnose(model=...) takes a torch.nn.Module, got {type(model).__name__}.")
    # The user's random streams stay where they were: rounders without a seed draw theirs
    # from torch's global generator, and so may the model (dropout).
    with torch.random.fork_rng():
        return _run(model, policy, data, loss_fn, optimizer, steps, candidates, min_sqnr, underflow_target)


def _run(
    model: nn.Module,
    policy: Policy | None,
    data: Iterable[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    optimizer: Callable[[list[torch.nn.Parameter]], Any] | None,
    steps: int | None,
    candidates: Sequence[Format | str],
    min_sqnr: float,
    underflow_target: float,
) -> DiagnoseReport:
    work = copy.deepcopy(model)
    if policy is not None:
        if converted_layers(work):
            raise AnynumError(
                "this model is already converted: pass policy_or_format=None to diagnose it as it "
                "is, or anynum.nn.restore it first."
            )
        work = convert(work, policy)
    opt = optimizer(list(work.parameters())) if optimizer is not None else None
    losses: list[float] = []
    with observe(work, opt, candidates=candidates) as obs:
        for x, y in _batches(data, steps):
            if loss_fn is None:
                with torch.no_grad():
                    _forward(work, x)
                losses.append(math.nan)
                continue
            loss = loss_fn(_forward(work, x), y)
            if opt is not None:
                opt.zero_grad()
            else:
                work.zero_grad(set_to_none=True)
            scaled = opt.scale_loss(loss) if opt is not None and hasattr(opt, "scale_loss") else loss
            scaled.backward()
            if opt is not None:
                opt.step()
            losses.append(float(loss.detach()))
        if not losses:
            raise AnynumError("diagnose(data=...) yielded no batch; give at least one (input, target) pair.")
        return report_from(
            obs, optimizer=opt, losses=losses, min_sqnr=min_sqnr, underflow_target=underflow_target
        )


def report_from(
    observation: Observation,
    *,
    optimizer: Any = None,
    steps: int | None = None,
    losses: Sequence[float] = (),
    min_sqnr: float = 20.0,
    underflow_target: float = 0.01,
) -> DiagnoseReport:
    """The `DiagnoseReport` of an `Observation` you ran yourself (your own training loop).

    `optimizer` is the one observed (its loss scale enters the loss-scale suggestion);
    `steps` is how many steps ran (default: one per entry of `losses`).

    >>> import torch, anynum as an
    >>> m = an.nn.convert(torch.nn.Sequential(torch.nn.Linear(2, 2)), an.nn.Policy(weight="e2m1"))
    >>> with an.nn.observe(m, candidates=["e3m2"]) as obs:
    ...     _ = m(torch.ones(1, 2))
    >>> rep = report_from(obs, steps=1)
    >>> rep.steps, [r["category"] for r in rep.rows]
    (1, ['weight', 'bias'])
    """
    rows = list(observation.rows())
    scale_state = getattr(optimizer, "loss_scale", None)
    scale = float(getattr(scale_state, "scale", 1.0))
    dynamic = bool(getattr(scale_state, "dynamic", False))
    suggestions = suggest(
        rows,
        candidates=[name for name, _ in observation.candidates],
        min_sqnr=min_sqnr,
        underflow_target=underflow_target,
        loss_scale=scale,
        dynamic=dynamic,
    )
    return DiagnoseReport(
        rows=rows,
        suggestions=suggestions,
        steps=len(losses) if steps is None else steps,
        losses=list(losses),
        loss_scale=scale,
        min_sqnr=min_sqnr,
        underflow_target=underflow_target,
    )


# --- suggestions -------------------------------------------------------------------------------


def flush_threshold(row: dict[str, Any]) -> float | None:
    """Magnitude below which a row's format rounds to zero (None: it never does, or it moves per block).

    Round to nearest flushes below half the smallest subnormal; the other modes are taken
    to flush below the smallest subnormal (conservative). Posits saturate to minpos.

    >>> flush_threshold({"format": "e5m2", "rounding": "nearest", "smallest_normal": 2.0**-14,
    ...                  "smallest_subnormal": 2.0**-16}) == 2.0**-17
    True
    """
    fmt = lookup_format(row["format"])
    if row["smallest_normal"] is None or getattr(fmt, "underflow", "zero") == "minpos":
        return None
    tiny = float(row["smallest_subnormal"])
    return tiny / 2 if Rounding.parse(row["rounding"]).is_nearest else tiny


def predicted_underflow(row: dict[str, Any], k: int) -> float:
    """Fraction of a row's nonzero values that would flush to zero after scaling by 2**k.

    Counts every histogram bin [2^e, 2^(e+1)) whose lower edge, scaled, lies below the flush
    threshold: exact when the threshold is a power of two (every float format) but for values
    exactly at it (a tie, which round-half-even sends to zero), an upper bound otherwise.

    >>> row = {"format": "e5m2", "rounding": "nearest", "smallest_normal": 2.0**-14,
    ...        "smallest_subnormal": 2.0**-16, "nonzero": 4, "log2_hist": {-20: 1, -17: 1, 0: 2}}
    >>> predicted_underflow(row, 0), predicted_underflow(row, 2), predicted_underflow(row, 3)
    (0.25, 0.25, 0.0)
    """
    t = flush_threshold(row)
    if t is None or not row["nonzero"]:
        return 0.0
    flushed = sum(c for e, c in row["log2_hist"].items() if math.ldexp(1.0, int(e) + k) < t)
    return flushed / row["nonzero"]


def _pct(v: float) -> str:
    return f"{100 * v:.3g}%"


def _loss_scale(rows: list[dict[str, Any]], target: float, scale: float, dynamic: bool) -> list[Suggestion]:
    back = [r for r in rows if r["category"] in ("error", "gradient") and r["nonzero"]]
    if not back:
        return []
    worst = max(back, key=lambda r: r["underflow"])
    over = [r for r in back if r["overflow"] > 0]
    if worst["underflow"] < target and not over:
        return [
            Suggestion(
                "loss_scale",
                f"no loss scale needed: error and gradient underflow is at most "
                f"{_pct(worst['underflow'])} ({worst['layer']} {worst['category']}).",
                value=scale,
            )
        ]
    if dynamic:
        return [
            Suggestion(
                "note",
                f"dynamic loss scaling is on (scale {scale:g} at the end); the worst "
                f"underflow seen is {_pct(worst['underflow'])} ({worst['layer']} "
                f"{worst['category']}).",
            )
        ]

    def fits(k: int, room: float = 1.0) -> bool:
        return all(r["max_abs"] * 2.0**k * room <= r["format_max"] for r in back)

    def worst_after(k: int) -> float:
        return max(predicted_underflow(r, k) for r in back)

    ks = sorted(range(-64, 65), key=abs)
    good = [k for k in ks if fits(k) and worst_after(k) < target]
    if good:
        k = good[0]
    else:  # no scale does both: the least underflow that keeps HEADROOM (or overflows no more than now)
        fitting = [k for k in ks if fits(k, HEADROOM) or (k == 0 and fits(0))]
        fitting = fitting or [k for k in ks if fits(k)]
        k = min(fitting, key=lambda k: (worst_after(k), abs(k))) if fitting else -64
    new = scale * 2.0**k
    label = f"2^{round(math.log2(new))} ({new:g})" if math.log2(new).is_integer() else f"{new:g}"
    after = max(back, key=lambda r: predicted_underflow(r, k))
    top = max(back, key=lambda r: r["max_abs"] / r["format_max"])
    if k == 0:
        msg = (
            f"the loss scale {scale:g} is as good as a power of two gets: underflow stays at "
            f"{_pct(worst_after(0))} ({after['layer']} {after['category']})."
        )
    else:
        msg = (
            f"loss scale {label}: error/gradient underflow goes from "
            f"{_pct(worst['underflow'])} ({worst['layer']} {worst['category']}) to "
            f"{_pct(worst_after(k))} ({after['layer']} {after['category']}); the largest value "
            f"becomes {top['max_abs'] * 2.0**k:.3g} of {top['format']}'s {top['format_max']:g} "
            f"({top['layer']} {top['category']})."
        )
        if not good:
            msg += (
                f" No power of two brings every row below {_pct(target)} without overflow; this one "
                f"keeps the largest value {HEADROOM:g}x below the format's maximum."
            )
    return [Suggestion("loss_scale", msg, value=new)]


def _narrowest(
    rows: list[dict[str, Any]], candidates: Sequence[Format | str], min_sqnr: float
) -> list[Suggestion]:
    if not candidates:
        return []
    names = [c if isinstance(c, str) else c.display_name() for c in candidates]
    order = sorted(names, key=lambda n: (lookup_format(n).bits, names.index(n)))
    out = []
    for layer in dict.fromkeys(r["layer"] for r in rows):
        picks: dict[str, str | None] = {}
        parts = []
        for r in rows:
            sq = r.get("candidates") or {}
            if r["layer"] != layer or not sq:
                continue
            ok = [n for n in order if n in sq and sq[n] >= min_sqnr]
            picks[r["category"]] = ok[0] if ok else None
            if ok:
                parts.append(f"{r['category']} {ok[0]} ({sq[ok[0]]:.1f} dB)")
            else:
                best = max(sq, key=lambda n: sq[n])
                parts.append(f"{r['category']} none (best {best}, {sq[best]:.1f} dB)")
        if parts:
            out.append(
                Suggestion(
                    "format",
                    f"{layer}: narrowest candidates with SQNR >= {min_sqnr:g} dB: " + ", ".join(parts) + ".",
                    layer=layer,
                    value=picks,
                )
            )
    return out


def _keep(rows: list[dict[str, Any]], min_sqnr: float, target: float) -> list[Suggestion]:
    out = []
    for layer in dict.fromkeys(r["layer"] for r in rows):
        reasons = []
        for r in rows:
            if r["layer"] != layer or r["category"] not in ("weight", "bias", "activation"):
                continue
            if r["sqnr_db"] < min_sqnr:  # NaN (no signal) compares False
                reasons.append(f"{r['category']} SQNR {r['sqnr_db']:.1f} dB < {min_sqnr:g} dB")
            if (r["overflow"] or 0.0) > target:
                reasons.append(
                    f"{r['category']} {_pct(r['overflow'])} beyond {r['format']}'s max "
                    f"(max|x| {r['max_abs']:.3g} > {r['format_max']:g})"
                )
        if reasons:
            out.append(
                Suggestion("keep", f"keep {layer} in higher precision: {'; '.join(reasons)}.", layer=layer)
            )
    return out


def _stagnation(rows: list[dict[str, Any]]) -> list[Suggestion]:
    out = []
    for r in rows:
        if r["category"] == "update" and r["stagnation"] is not None and r["stagnation"] > STAGNATION_WARN:
            out.append(
                Suggestion(
                    "stagnation",
                    f"{r['layer']}: {_pct(r['stagnation'])} of the weight updates are below half an ulp "
                    f"of the weight in {r['format']} ({_pct(r['lost'])} were lost); keep master weights "
                    "(QuantizedOptimizer accumulator='fp32') or round the weights stochastically.",
                    layer=r["layer"],
                    category="update",
                    value=r["stagnation"],
                )
            )
    return out


def _silent(rows: list[dict[str, Any]]) -> list[Suggestion]:
    """One note per layer whose errors or gradients were all zero: nothing reached it."""
    silent: dict[str, list[str]] = {}
    for r in rows:
        if r["category"] in ("error", "gradient") and r.get("count") and not r["nonzero"]:
            silent.setdefault(r["layer"], []).append(f"{r['count']:,} {r['category']} values")
    return [
        Suggestion(
            "note",
            f"no gradient reaches {layer}: all its {' and '.join(what)} were zero (look for underflow "
            "in the layers after it).",
            layer=layer,
        )
        for layer, what in silent.items()
    ]


def suggest(
    rows: list[dict[str, Any]],
    *,
    candidates: Sequence[Format | str] = (),
    min_sqnr: float = 20.0,
    underflow_target: float = 0.01,
    loss_scale: float = 1.0,
    dynamic: bool = False,
) -> list[Suggestion]:
    """The suggestions of a diagnosis from its rows (see the module docstring).

    >>> row = {"layer": "fc1", "category": "error", "format": "e5m2", "rounding": "nearest",
    ...        "smallest_normal": 2.0**-14, "smallest_subnormal": 2.0**-16, "nonzero": 100,
    ...        "underflow": 0.3, "overflow": 0.0, "max_abs": 0.01, "format_max": 57344.0,
    ...        "log2_hist": {-25: 30, -10: 70}}
    >>> [s.value for s in suggest([row])]
    [256.0]
    """
    return [
        *_loss_scale(rows, underflow_target, loss_scale, dynamic),
        *_silent(rows),
        *_keep(rows, min_sqnr, underflow_target),
        *_stagnation(rows),
        *_narrowest(rows, candidates, min_sqnr),
    ]
