"""Run a format study: grid expansion, cached fp32 baselines, executors, resumable JSONL results.

`run_study` is what ``anynum study`` calls. Results go to ``OUT/results.jsonl``,
one JSON row per finished trial, appended as trials finish (never rewritten);
a rerun skips every trial id already there, so an interrupted study resumes
and a finished one only reprints its report. Several processes may share an
output directory: per-trial claims make each trial run once
(`anynum.experiments.outdir`). Executors: in process
(``jobs=1``), a process pool (``jobs>1``) or a Dask distributed cluster
(``dask_scheduler="local"`` starts a LocalCluster). Trials are pure functions
of their config, so every executor and every shard split gives the same rows.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anynum.errors import AnynumError, FormatError, InputError
from anynum.experiments.datasets import DATASETS, load_dataset
from anynum.experiments.models import MODELS, compatible
from anynum.experiments.outdir import TrialClaims, append_line
from anynum.experiments.trials import TrialConfig, run_trial, train_baseline
from anynum.formats.registry import format as lookup_format

__all__ = [
    "DEFAULT_FORMATS",
    "DEFAULT_QAT_FORMATS",
    "DEFAULT_QAT_ROUNDINGS",
    "DEFAULT_ROUNDINGS",
    "StudyResult",
    "StudySpec",
    "available_formats",
    "expand_grid",
    "pairs_for",
    "parse_shard",
    "read_results",
    "run_study",
]

#: PTQ formats of the default study (those not registered in this build are left out).
DEFAULT_FORMATS = ("fp32", "bf16", "fp16", "e5m2", "e4m3fn", "e3m2", "e2m1", "posit(8,2)", "mxfp8_e4m3")
#: Pychop Table 8's rounding modes (without the uniform stochastic variant).
DEFAULT_ROUNDINGS = ("nearest", "ru", "rd", "rz", "sr")
#: (dataset, model) pairs of the default PTQ study.
DEFAULT_PAIRS = (("digits", "mlp"), ("digits", "cnn"), ("digits", "lstm"), ("sequence", "lstm"))
#: The default QAT slice: the CNN on digits, trained in these formats and modes.
DEFAULT_QAT_PAIRS = (("digits", "cnn"),)
DEFAULT_QAT_FORMATS = ("fp32", "bf16", "e4m3fn", "e5m2", "posit(8,2)")
DEFAULT_QAT_ROUNDINGS = ("nearest", "sr")

RESULTS_FILE = "results.jsonl"


def available_formats(names: Iterable[str]) -> list[str]:
    """The names in `names` that this build of anynum knows (for optional defaults).

    >>> available_formats(["e4m3fn", "no_such_format"])
    ['e4m3fn']
    """
    out = []
    for n in names:
        try:
            lookup_format(n)
        except FormatError:
            continue
        out.append(n)
    return out


def pairs_for(datasets: Sequence[str], models: Sequence[str]) -> list[tuple[str, str]]:
    """Every compatible (dataset, model) pair; an unknown name raises `InputError`.

    >>> pairs_for(["digits", "breast_cancer"], ["cnn", "mlp"])
    [('digits', 'cnn'), ('digits', 'mlp'), ('breast_cancer', 'mlp')]
    """
    for d in datasets:
        if d not in DATASETS:
            raise InputError(f"unknown dataset {d!r}; expected one of {', '.join(DATASETS)}.")
    for m in models:
        if m not in MODELS:
            raise InputError(f"unknown model {m!r}; expected one of {', '.join(MODELS)}.")
    pairs = [(d, m) for d in datasets for m in models if compatible(m, load_dataset(d))]
    if not pairs and datasets and models:
        raise InputError(
            f"no model of {list(models)} can read a dataset of {list(datasets)} "
            "(cnn needs digits; lstm needs digits or sequence)."
        )
    return pairs


@dataclass
class StudySpec:
    """A study grid: PTQ formats x roundings on `ptq_pairs`, QAT likewise on `qat_pairs`.

    The defaults are the default study (about 200 trials, a few minutes on two cores).

    >>> spec = StudySpec(ptq_pairs=[("digits", "mlp")], formats=["e4m3fn"], roundings=["rz"], qat_pairs=[])
    >>> [t.format for t in expand_grid(spec)]
    ['e4m3fn']
    """

    ptq_pairs: Sequence[tuple[str, str]] = DEFAULT_PAIRS
    formats: Sequence[str] = field(default_factory=lambda: available_formats(DEFAULT_FORMATS))
    roundings: Sequence[str] = DEFAULT_ROUNDINGS
    qat_pairs: Sequence[tuple[str, str]] = DEFAULT_QAT_PAIRS
    qat_formats: Sequence[str] = field(default_factory=lambda: available_formats(DEFAULT_QAT_FORMATS))
    qat_roundings: Sequence[str] = DEFAULT_QAT_ROUNDINGS
    epochs: int = 10
    batch: int = 32
    seed: int = 0


def expand_grid(spec: StudySpec) -> list[TrialConfig]:
    """Every trial of `spec` in a stable order (PTQ first), duplicates (by trial id) dropped.

    Unknown formats, rounding modes, datasets or models raise `AnynumError`.

    >>> len(expand_grid(StudySpec(ptq_pairs=[("digits", "cnn")], formats=["fp16", "e2m1"],
    ...                           roundings=["nearest", "sr"], qat_pairs=[])))
    4
    """
    if not isinstance(spec, StudySpec):
        raise InputError(f"expand_grid takes a StudySpec, got {type(spec).__name__}.")
    for label in ("formats", "roundings", "qat_formats", "qat_roundings", "ptq_pairs", "qat_pairs"):
        value = getattr(spec, label)
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise InputError(f"StudySpec {label} must be a list, got {value!r} (write [{value!r}] for one).")
    for pair in [*spec.ptq_pairs, *spec.qat_pairs]:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise InputError(f"StudySpec pairs are (dataset, model) tuples, got {pair!r}.")
    for name in [*spec.formats, *spec.qat_formats]:
        lookup_format(name)
    out: list[TrialConfig] = []
    seen: set[str] = set()
    for mode, pairs, fmts, modes in (
        ("ptq", spec.ptq_pairs, spec.formats, spec.roundings),
        ("qat", spec.qat_pairs, spec.qat_formats, spec.qat_roundings),
    ):
        for dataset, model in pairs:
            pairs_for([dataset], [model])
            for f in fmts:
                for r in modes:
                    t = TrialConfig(mode, dataset, model, f, r, spec.epochs, None, spec.batch, spec.seed)
                    if t.trial_id not in seen:
                        seen.add(t.trial_id)
                        out.append(t)
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (0 <= i < n) to ``(i, n)``: this machine runs every n-th trial starting at i.

    >>> parse_shard("1/4")
    (1, 4)
    >>> parse_shard("4/4")
    Traceback (most recent call last):
    ...
    anynum.errors.InputError: malformed --shard '4/4': expected i/n with 0 <= i < n, e.g. 0/4.
    """
    if not isinstance(text, str):
        raise InputError(f"--shard takes 'i/n' as text, e.g. '0/4'; got {text!r}.")
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise InputError(f"malformed --shard {text!r}: expected i/n with 0 <= i < n, e.g. 0/4.")
    return int(m.group(1)), int(m.group(2))


def read_results(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Finished rows of a results file by trial id (a torn last line is ignored).

    >>> read_results("/nonexistent/results.jsonl")
    {}
    """
    rows: dict[str, dict[str, Any]] = {}
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"read_results takes a path, got {type(path).__name__}.")
    p = Path(path)
    if not p.exists():
        return rows
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "trial_id" in row:
                rows[row["trial_id"]] = row
    return rows


@dataclass
class StudyResult:
    """What `run_study` did: every row of the grid (in grid order), counts, failures, the out dir."""

    rows: list[dict[str, Any]]
    new: int
    skipped: int
    failures: list[str]
    out_dir: Path
    seconds: float


def _check_writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"cannot write to output directory {str(out)!r}: {exc.strerror or exc}.") from None


def _worker_init() -> None:
    import torch

    os.environ["ANYNUM_COMPILE"] = "0"
    torch.set_num_threads(1)


def _baseline_task(config: dict[str, Any], cache_dir: str) -> float:
    return train_baseline(TrialConfig.from_dict(config), cache_dir)[1]


def _trial_task(config: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    return run_trial(config, cache_dir)


Outcome = tuple[int, Any, BaseException | None]


def _execute(
    fn: Callable[..., Any], args: list[tuple[Any, ...]], jobs: int, dask_client: Any
) -> Iterator[Outcome]:
    """Run ``fn(*a)`` for each a; yields (index, result, exception) as they finish."""
    if dask_client is not None:
        import distributed

        futures = {dask_client.submit(fn, *a, pure=False): i for i, a in enumerate(args)}
        for fut in distributed.as_completed(list(futures)):
            try:
                yield futures[fut], fut.result(), None
            except Exception as exc:
                yield futures[fut], None, exc
        return
    if jobs <= 1 or len(args) <= 1:
        for i, a in enumerate(args):
            try:
                yield i, fn(*a), None
            except Exception as exc:
                yield i, None, exc
        return
    import concurrent.futures as cf
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
        pfut = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        for pf in cf.as_completed(pfut):
            error = pf.exception()
            yield pfut[pf], (None if error else pf.result()), error


@dataclass
class _Progress:
    total: int
    mode: str  # "bar" | "log" | "none"
    bar: Any = None
    done: int = 0

    def __post_init__(self) -> None:
        if self.mode == "bar":
            try:
                from tqdm import tqdm
            except ImportError:
                self.mode = "log"
            else:
                self.bar = tqdm(total=self.total, unit="trial", file=sys.stderr, dynamic_ncols=True)

    def note(self, message: str) -> None:
        if self.mode == "log":
            print(message, file=sys.stderr, flush=True)
        elif self.mode == "bar":
            self.bar.write(message, file=sys.stderr)

    def step(self, label: str) -> None:
        self.done += 1
        if self.mode == "bar":
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif self.mode == "log":
            print(f"[{self.done}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _label(row: dict[str, Any]) -> str:
    score = row.get("score")
    s = "nan" if score is None else f"{score:.2f}"
    if "label" in row:  # rows of other studies (anynum faults) say what they are
        return f"{row['label']}: {s}"
    return f"{row['mode']} {row['dataset']}/{row['model']} {row['format']} {row['rounding']}: {s}"


def _connect_dask(address: str, jobs: int) -> tuple[Any, Any]:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise AnynumError(
            "--dask-scheduler needs dask.distributed, which is not installed: pip install 'anynum[dask]'."
        ) from None
    if address == "local":
        cluster = LocalCluster(
            n_workers=max(jobs, 1), threads_per_worker=1, processes=True, dashboard_address=None
        )
        return Client(cluster), cluster
    try:
        return Client(address, timeout="10s"), None
    except (OSError, TimeoutError, ValueError) as exc:
        raise AnynumError(f"cannot reach the Dask scheduler at {address!r}: {exc}") from None


def _run_claimed(
    mine: list[Any],
    results_path: Path,
    cache_dir: str,
    claims: TrialClaims,
    jobs: int,
    client: Any,
    prog: _Progress,
    trial_task: Callable[[dict[str, Any], str], dict[str, Any]],
    baseline_task: Callable[[dict[str, Any], str], Any],
) -> tuple[dict[str, dict[str, Any]], list[Any], list[str]]:
    """Run the claimed trials: (new rows by id, trials that failed, failure messages)."""
    failures: list[str] = []
    failed: list[Any] = []
    # Phase 1: one fp32 baseline per (dataset, model, schedule, seed), trained in parallel.
    baselines = {t.baseline_id: t for t in mine}
    if baselines:
        prog.note(f"training {len(baselines)} fp32 baseline(s)")
        args = [(t.as_dict(), cache_dir) for t in baselines.values()]
        for _, _, exc in _execute(baseline_task, args, jobs, client):
            if exc is not None:
                failures.append(f"baseline: {exc}")
    # Phase 2: the trials; each row is appended the moment it arrives, then its claim released.
    new_rows: dict[str, dict[str, Any]] = {}
    args = [(t.as_dict(), cache_dir) for t in mine]
    for i, row, exc in _execute(trial_task, args, jobs, client):
        t = mine[i]
        if exc is not None:
            what = getattr(t, "label", None) or f"{t.mode} {t.dataset}/{t.model} {t.format} {t.rounding}"
            failures.append(f"{what}: {exc}")
            failed.append(t)
            prog.note(f"FAILED {what}: {exc}")
            prog.step(f"{getattr(t, 'label', None) or f'{t.format} {t.rounding}'} failed")
        else:
            append_line(results_path, row)
            new_rows[row["trial_id"]] = row
            prog.step(_label(row))
        claims.release(t.trial_id)
    return new_rows, failed, failures


def _is_trial(t: Any) -> bool:
    return isinstance(t, TrialConfig) or all(hasattr(t, a) for a in ("trial_id", "baseline_id", "as_dict"))


def run_study(
    trials: StudySpec | Sequence[Any],
    out_dir: str | os.PathLike[str] = "anynum-results",
    *,
    jobs: int = 1,
    shard: tuple[int, int] | None = None,
    dask_scheduler: str | None = None,
    progress: str = "auto",
    trial_task: Callable[[dict[str, Any], str], dict[str, Any]] = _trial_task,
    baseline_task: Callable[[dict[str, Any], str], Any] = _baseline_task,
) -> StudyResult:
    """Run every unfinished trial of a grid, appending rows to ``out_dir/results.jsonl``.

    Other studies reuse this runner with their own trials (objects with
    ``trial_id``, ``baseline_id`` and ``as_dict()``) and module-level
    ``trial_task(config_dict, cache_dir) -> row`` and ``baseline_task`` functions
    (picklable, for the process pool); a row may carry a ``label`` for the progress line.

    `progress`: ``"bar"`` (tqdm), ``"log"`` (one line per trial on stderr),
    ``"none"``, or ``"auto"`` (a bar when stdout is a terminal, else log lines).
    Failed trials are not recorded (a rerun retries them); their messages are
    in ``StudyResult.failures``.

    Several processes may share `out_dir` (shards, or the same study started twice):
    each trial runs once, in the process that claims it first; the others wait for
    its row and report it (`anynum.experiments.outdir`). A study killed at any
    moment, SIGKILL included, resumes to the same rows.

    >>> import tempfile
    >>> spec = StudySpec(ptq_pairs=[("sequence", "mlp")], formats=["e2m1"], roundings=["rz"],
    ...                  qat_pairs=[], epochs=1)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     first = run_study(spec, d, progress="none")
    ...     again = run_study(spec, d, progress="none")
    >>> first.new, again.new, again.skipped
    (1, 0, 1)
    """
    start = time.perf_counter()
    if isinstance(trials, StudySpec):
        grid = expand_grid(trials)
    elif isinstance(trials, (list, tuple)) and all(_is_trial(t) for t in trials):
        grid = list(trials)
    else:
        raise InputError(
            f"run_study takes a StudySpec or a list of trials (TrialConfig, or objects with "
            f"trial_id, baseline_id and as_dict()), got {type(trials).__name__}."
        )
    if shard is not None:
        ok = isinstance(shard, tuple) and len(shard) == 2 and all(type(v) is int for v in shard)
        if not ok or not 0 <= shard[0] < shard[1]:
            raise InputError(f"shard must be (i, n) with 0 <= i < n, got {shard!r}.")
        i, n = shard
        grid = grid[i::n]
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InputError(f"--jobs must be an integer of at least 1, got {jobs!r}.")
    if progress not in ("auto", "bar", "log", "none"):
        raise InputError(f"progress must be 'auto', 'bar', 'log' or 'none', got {progress!r}.")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise InputError(f"out_dir must be a path, got {type(out_dir).__name__}.")
    out = Path(out_dir)
    _check_writable(out)
    results_path = out / RESULTS_FILE
    cache_dir = str(out / "cache")
    done = read_results(results_path)
    pending = [t for t in grid if t.trial_id not in done]
    if progress == "auto":
        progress = "bar" if sys.stdout.isatty() and sys.stderr.isatty() else "log"
    prog = _Progress(len(pending), progress)
    if len(grid) > len(pending):
        prog.note(f"resuming: {len(grid) - len(pending)} of {len(grid)} trials already in {results_path}")
    failures: list[str] = []
    failed: set[str] = set()
    new_rows: dict[str, dict[str, Any]] = {}
    claims = TrialClaims(out)
    client = cluster = None
    try:
        while pending:
            mine = [t for t in pending if claims.try_claim(t.trial_id)]
            done = read_results(results_path)  # rows another process finished before our claim
            for t in mine:
                if t.trial_id in done:
                    claims.release(t.trial_id)
            mine = [t for t in mine if t.trial_id not in done]
            if mine:
                if dask_scheduler is not None and client is None:
                    client, cluster = _connect_dask(dask_scheduler, jobs)
                got, bad, msgs = _run_claimed(
                    mine, results_path, cache_dir, claims, jobs, client, prog, trial_task, baseline_task
                )
                new_rows.update(got)
                failed.update(t.trial_id for t in bad)
                failures += msgs
            busy = [t for t in pending if t not in mine and t.trial_id not in done]
            if busy:
                holders = sorted({claims.holder(t.trial_id) for t in busy} - {""})
                prog.note(
                    f"waiting for {len(busy)} trial(s) that another study process is running "
                    f"({', '.join(holders) or 'it just finished'}; pid on host)"
                )
                for t in busy:
                    claims.wait(t.trial_id)
            done = {**read_results(results_path), **new_rows}
            # What is still missing failed elsewhere (or its process died): ours to retry,
            # unless it failed here already.
            pending = [t for t in grid if t.trial_id not in done and t.trial_id not in failed]
    finally:
        claims.release_all()
        prog.close()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    rows = [done[t.trial_id] for t in grid if t.trial_id in done]
    return StudyResult(rows, len(new_rows), len(rows) - len(new_rows), failures, out,
                       time.perf_counter() - start)
