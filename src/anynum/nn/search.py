"""`search`: choose a format per layer that saves the most bits within an accuracy tolerance.

The search is greedy and every step is measured:

1. the reference score ``eval_fn(model)`` (one evaluation);
2. per-layer sensitivity, either ``"sqnr"`` (no evaluation: `diagnose` measures, on the
   user's batches, the SQNR each candidate format would give each layer's weights and
   inputs) or ``"measured"`` (one evaluation per layer, that layer alone in the narrowest
   format);
3. layers from the least to the most sensitive: each tries the candidate formats from the
   narrowest up, with the layers already placed kept in theirs, and takes the first whose
   score stays within `tolerance` of the reference (a layer no format satisfies stays in
   the model's own precision);
4. a final evaluation of the chosen policy.

Every call of `eval_fn` counts against `budget`; the last one is kept for the final
evaluation, so the search stops early rather than leave the result unverified.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.registry import format as lookup_format
from anynum.nn.convert import convert, converted_layers, restore, select_layers
from anynum.nn.diagnose import diagnose
from anynum.nn.policy import Policy

__all__ = ["SearchResult", "check_arguments", "format_cost", "search"]

_CATEGORIES = ("weight", "bias", "activation", "error")
_DTYPE_FORMATS = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}


def format_cost(fmt: Format | str) -> float:
    """Bits per element: the code width, plus a block format's shared scale spread over its block.

    >>> format_cost("e4m3fn"), format_cost("mxfp8_e4m3")
    (8, 8.25)
    """
    f = lookup_format(fmt)
    scale, size = getattr(f, "scale", None), getattr(f, "block_size", None)
    if isinstance(scale, Format) and size:
        return f.bits + scale.bits / size
    return f.bits


@dataclass
class SearchResult:
    """What `search` chose. ``policy`` converts the model (`anynum.nn.convert`); ``table`` has
    one dict per searched layer: ``layer``, ``params``, ``order`` (when it was placed, least
    sensitive first), ``format`` (None: left in the model's precision), ``bits`` (per
    element), ``dtype_bits``, ``bits_saved``, ``sqnr_db`` (of the chosen format, or of the
    narrowest when none was chosen; None with measured sensitivity), ``score`` (after the
    layer was placed). ``log`` lists every evaluation.

    >>> import torch, anynum as an
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2)); x = torch.ones(4, 2)
    >>> res = an.nn.search(m, [(x, None)], lambda q: 100.0, formats=["e2m1"], tolerance=0)
    >>> res.formats(), res.evaluations, res.verified
    ({'0': 'e2m1'}, 3, True)
    """

    policy: Policy
    table: list[dict[str, Any]]
    reference: float
    score: float
    tolerance: float
    evaluations: int
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Whether the final evaluation is within the tolerance of the reference."""
        return self.score >= self.reference - self.tolerance

    @property
    def bits_saved(self) -> float:
        """Parameter bits saved over the whole model."""
        return float(sum(r["bits_saved"] for r in self.table))

    @property
    def total_bits(self) -> float:
        """Parameter bits of the searched layers in the model's own precision."""
        return float(sum(r["params"] * r["dtype_bits"] for r in self.table))

    def formats(self) -> dict[str, str | None]:
        """``{layer: chosen format name or None}``."""
        return {r["layer"]: r["format"] for r in self.table}

    def summary(self) -> str:
        """One line: scores, bits saved, evaluations."""
        pct = 100 * self.bits_saved / self.total_bits if self.total_bits else 0.0
        return (
            f"reference {self.reference:.2f}, chosen policy {self.score:.2f} (tolerance {self.tolerance:g}, "
            f"{'verified' if self.verified else 'NOT within tolerance'}); {self.bits_saved:,.0f} of "
            f"{self.total_bits:,.0f} parameter bits saved ({pct:.1f}%); {self.evaluations} evaluations"
        )

    #: Column headings of the table: "order" is when the layer was placed (least sensitive first).
    HEADINGS = ("layer", "params", "order", "format", "bits", "bits saved", "SQNR dB", "score")

    def cells(self) -> list[list[str]]:
        """The table's cells as text, one list per layer (see `HEADINGS`)."""
        out = []
        for r in self.table:
            sq, sc = r["sqnr_db"], r["score"]
            out.append([
                r["layer"], str(r["params"]), str(r["order"]), r["format"] or f"(keep {r['dtype_bits']}-bit)",
                f"{r['bits']:g}", f"{r['bits_saved']:,.0f}", "-" if sq is None else f"{sq:.1f}",
                "-" if sc is None else f"{sc:.2f}",
            ])  # fmt: skip
        return out

    def table_text(self) -> str:
        """The table as GitHub markdown, with the summary line below it."""
        lines = ["| " + " | ".join(self.HEADINGS) + " |", "|" + "|".join("---" for _ in self.HEADINGS) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.cells()]
        return "\n".join(lines) + "\n\n" + self.summary()

    def __str__(self) -> str:
        return self.table_text()

    def rich_table(self, title: str | None = None) -> Any:
        """A `rich.table.Table` (needs rich: the ``cli`` extra); `summary` is the line to print below it."""
        from rich.table import Table

        table = Table(title=title or "anynum search", title_justify="left")
        for h in self.HEADINGS:
            table.add_column(h, justify="left" if h in ("layer", "format") else "right")
        for row in self.cells():
            table.add_row(*row)
        return table

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: scores, table, formats per layer, the evaluation log."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return v

        return {
            "reference": self.reference,
            "score": self.score,
            "tolerance": self.tolerance,
            "verified": self.verified,
            "evaluations": self.evaluations,
            "bits_saved": self.bits_saved,
            "total_bits": self.total_bits,
            "formats": self.formats(),
            "table": [{k: clean(v) for k, v in r.items()} for r in self.table],
            "log": [{k: clean(v) for k, v in r.items()} for r in self.log],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The result as JSON text (also written to `path` if given)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        return text

    def plot(self, path: str | os.PathLike[str]) -> None:
        """PNG: bits per element chosen for each layer (bar height), annotated with format and score."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(self.table), 3.2), layout="constrained")
        xs = range(len(self.table))
        ax.bar(xs, [r["dtype_bits"] for r in self.table], color="lightgray", label="model precision")
        ax.bar(xs, [r["bits"] for r in self.table], color="tab:blue", label="chosen")
        for i, r in enumerate(self.table):
            ax.text(i, r["bits"] + 0.5, r["format"] or "keep", ha="center", fontsize=7)
        ax.set_xticks(list(xs), [r["layer"] for r in self.table], fontsize=8, rotation=30)
        ax.set_ylabel("bits per parameter")
        ax.set_title(f"anynum search: {self.score:.2f} vs reference {self.reference:.2f}", fontsize=9)
        ax.legend(fontsize=7)
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _layer_policy(categories: Sequence[str], fmt: Format | str, rounding: str) -> Policy:
    cats: dict[str, Any] = {c: fmt for c in categories}  # a bias follows its weight unless named
    return Policy(**cats, rounding=rounding)


def check_arguments(
    formats: Sequence[Format | str],
    tolerance: float,
    budget: int | None,
    categories: Sequence[str],
    sensitivity: str,
) -> list[tuple[str, Format]]:
    """Check `search`'s arguments (AnynumError on bad ones); the candidates as (name, format), narrowest
    first.

    >>> [n for n, _ in check_arguments(["bf16", "e4m3fn"], 0.5, None, ("weight",), "sqnr")]
    ['e4m3fn', 'bf16']
    """
    if isinstance(formats, (str, Format)) or not formats:
        raise AnynumError(
            f"search(formats=...) takes a non-empty list of candidate formats, got {formats!r}."
        )
    named = [(f if isinstance(f, str) else f.display_name(), lookup_format(f)) for f in formats]
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise AnynumError(f"search(tolerance=...) is in score points and must be >= 0, got {tolerance!r}.")
    if budget is not None and (not isinstance(budget, int) or budget < 2):
        raise AnynumError(
            f"search(budget=...) counts evaluations, the reference and the final check included, so it "
            f"must be an integer >= 2 (or None for no limit); got {budget!r}."
        )
    bad = [c for c in categories if c not in _CATEGORIES]
    if bad or not categories:
        raise AnynumError(f"search(categories=...) takes some of {_CATEGORIES}; got {list(categories)!r}.")
    if sensitivity not in ("sqnr", "measured"):
        raise AnynumError(f"search(sensitivity=...) is 'sqnr' or 'measured', got {sensitivity!r}.")
    order = sorted(range(len(named)), key=lambda i: (format_cost(named[i][1]), i))
    return [named[i] for i in order]


def search(
    model: nn.Module,
    data: Iterable[Any],
    eval_fn: Callable[[nn.Module], float],
    *,
    formats: Sequence[Format | str],
    tolerance: float = 0.5,
    budget: int | None = None,
    categories: Sequence[str] = ("weight", "activation"),
    sensitivity: str = "sqnr",
    rounding: str = "nearest",
    steps: int | None = None,
    layers: Sequence[str] | None = None,
) -> SearchResult:
    """A per-layer format assignment that saves the most parameter bits within `tolerance` of the reference.

    Args:
        model: a torch module (not converted); it is deep-copied and never changed.
        data: an iterable of ``(input, target)`` batches for the SQNR sensitivity (forward
            passes only; at most `steps` batches). Unused with ``sensitivity="measured"``.
        eval_fn: ``eval_fn(model) -> score``, higher is better, e.g. test accuracy in percent.
            It must not change the model.
        formats: candidate formats; they are tried narrowest first (by `format_cost`).
        tolerance: how far below the reference score the result may fall, in the units of
            the score (points of accuracy for a percentage).
        budget: the most calls of `eval_fn` (reference and final check included); None: no limit.
        categories: what each chosen format applies to (default weights, with their biases,
            and layer inputs).
        sensitivity: ``"sqnr"`` (from `diagnose`, no evaluation) or ``"measured"`` (one
            evaluation per layer).
        rounding: the rounding mode of the chosen formats.
        layers: names of the layers to search (default: see below).

    Searched layers are the layers `Policy` selects by default (linear, conv, recurrent,
    attention, norm, embedding) that hold parameters. Returns a `SearchResult`; its
    ``policy`` quantizes exactly the layers given a format. NaN scores count as failures.

    >>> import torch, anynum as an
    >>> _ = torch.manual_seed(0)
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    >>> x = torch.randn(64, 4); ref = m(x).detach()
    >>> def score(model):  # 100 minus the relative error of the outputs, in percent
    ...     with torch.no_grad():
    ...         return 100 * (1 - float((model(x) - ref).norm() / ref.norm()))
    >>> res = an.nn.search(m, [(x, None)], score, formats=["e2m1", "e4m3fn", "bf16"], tolerance=5)
    >>> res.formats(), res.verified
    ({'0': 'bf16', '2': 'e4m3fn'}, True)
    """
    ordered = check_arguments(formats, tolerance, budget, categories, sensitivity)
    if not isinstance(model, nn.Module) or converted_layers(model):
        raise AnynumError(
            "search(model=...) takes a torch.nn.Module that is not converted (restore it first)."
        )
    work = copy.deepcopy(model)
    if layers is None:
        chosen = select_layers(work, Policy())
        layers = [n for n, (m, _) in chosen.items() if n and any(True for _ in m.parameters())]
    else:
        layers = list(layers)
        select_layers(work, Policy(include=tuple(layers)))  # unknown names raise, with suggestions
    if not layers:
        raise AnynumError(
            "search found no layer to quantize (no linear, conv, recurrent, norm ... layer with "
            "parameters); name them with layers=."
        )
    params = {n: sum(p.numel() for p in work.get_submodule(n).parameters()) for n in layers}
    dtype = next(work.get_submodule(layers[0]).parameters()).dtype
    dtype_bits = torch.finfo(dtype).bits
    log: list[dict[str, Any]] = []

    def policy_for(assign: dict[str, str]) -> Policy:
        per = {n: _layer_policy(categories, f, rounding) for n, f in assign.items()}
        return Policy(include=(), per_layer=per)

    def evaluate(assign: dict[str, str], purpose: str) -> float:
        quantized = bool(assign)
        if quantized:
            convert(work, policy_for(assign))
        try:
            value = eval_fn(work)
        finally:
            if quantized:
                restore(work)
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise AnynumError(
                f"search(eval_fn=...) must return a number, got {type(value).__name__}."
            ) from None
        log.append({"purpose": purpose, "formats": dict(assign), "score": score})
        return score

    def left() -> bool:
        return budget is None or len(log) < budget - 1

    reference = evaluate({}, "reference")
    if math.isnan(reference):
        raise AnynumError("search: eval_fn returned NaN for the unquantized model; it needs a real score.")
    target = reference - tolerance
    narrowest = ordered[0][0]
    sqnr: dict[tuple[str, str], float] = {}
    if sensitivity == "sqnr":
        dt_fmt = _DTYPE_FORMATS.get(dtype, "fp32")
        probe_policy = Policy(
            include=(), per_layer={n: _layer_policy(categories, dt_fmt, "nearest") for n in layers}
        )
        rep = diagnose(work, probe_policy, data, steps=steps, candidates=[f for _, f in ordered])
        names = {f.display_name(): n for n, f in ordered}
        for row in rep.rows:
            for cand, value in row["candidates"].items():
                if math.isnan(value):  # no signal (all zeros): nothing to lose
                    continue
                key = (row["layer"], names.get(cand, cand))
                sqnr[key] = min(sqnr.get(key, math.inf), value)
        robust = {n: sqnr.get((n, narrowest), math.inf) for n in layers}
    else:
        robust = {}
        for n in layers:
            if not left():
                break
            robust[n] = evaluate({n: narrowest}, f"sensitivity of {n}")
        for n in layers:
            robust.setdefault(n, -math.inf)
    order = sorted(layers, key=lambda n: (-robust[n], -params[n]))
    assign: dict[str, str] = {}
    scores: dict[str, float] = {}
    position = {n: i + 1 for i, n in enumerate(order)}
    for n in order:
        for name, _ in ordered:
            if not left():
                break
            s = evaluate({**assign, n: name}, f"{n} in {name}")
            if s >= target:
                assign[n], scores[n] = name, s
                break
    final = evaluate(assign, "final")
    table = []
    for n in layers:
        f = assign.get(n)
        bits = format_cost(f) if f is not None else dtype_bits
        sq = sqnr.get((n, f if f is not None else narrowest)) if sqnr else None
        table.append(
            {
                "layer": n,
                "params": params[n],
                "format": f,
                "bits": bits,
                "dtype_bits": dtype_bits,
                "bits_saved": (dtype_bits - bits) * params[n],
                "sqnr_db": sq,
                "score": scores.get(n),
                "order": position[n],
            }
        )
    return SearchResult(policy_for(assign), table, reference, final, float(tolerance), len(log), log)
