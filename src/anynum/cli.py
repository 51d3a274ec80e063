"""The ``anynum`` command: a thin layer over `anynum.formats` and `anynum.experiments`.

    anynum                      the default job: ``anynum study`` with its default grid
    anynum formats [--format markdown|csv|json] [--output FILE]
    anynum info NAME [--compare NAME ...] [--plot OUT.png]
    anynum study [grid options] [--out DIR] [--jobs N] [--shard i/n] [--dask-scheduler ADDR|local]
    anynum faults [--formats ...] [--fields ...] [--bers ...] [--repeats N] [--out DIR]
    anynum bench                quantization speed against native casts and peers
    anynum diagnose [model/data] [numbers] [--candidates ...] [--out DIR]   why a format fails, per layer
    anynum search [model/data] --formats F ... [--tolerance P] [--budget N]  a format per layer
    anynum emulate [--settings LABEL ...] [--epochs N] [--out DIR]   LeNet-5 trained with every op in a format

Errors are one line on stderr with exit code 2, never a traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from anynum.errors import AnynumError
from anynum.experiments.formattable import cell_text, format_rows, render_rows
from anynum.formats import format as lookup_format

__all__ = ["format_rows", "main"]

def _cmd_formats(args: argparse.Namespace) -> int:
    text = render_rows(format_rows(), args.format)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            raise AnynumError(f"cannot write {args.output}: {exc.strerror}") from None
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    names = [args.name, *(args.compare or [])]
    fmts = [lookup_format(n) for n in names]  # every name checked before any output
    if len(fmts) == 1:
        fmt = fmts[0]
        print(f"{args.name}: {fmt!r}")
        for key, value in vars(fmt.info).items():
            print(f"  {key:<19} {cell_text(value)}")
        if fmt.bits <= 6:
            print(f"  {'values':<19} {' '.join(cell_text(float(v)) for v in fmt.values())}")
    else:
        keys = list(vars(fmts[0].info))
        width = max(12, *(len(n) + 2 for n in names))
        print(f"{'':<19}" + "".join(f"{n:>{width}}" for n in names))
        for key in keys:
            cells = [cell_text(getattr(f.info, key)) for f in fmts]
            print(f"{key:<19}" + "".join(f"{c:>{width}}" for c in cells))
    if args.plot:
        from anynum.experiments.plots import plot_formats

        try:
            profiles = plot_formats(names, args.plot)
        except OSError as exc:
            raise AnynumError(f"cannot write {args.plot}: {exc.strerror or exc}") from None
        print(f"wrote {args.plot} ({', '.join(p.label for p in profiles)})")
    return 0


def _study_spec(args: argparse.Namespace) -> Any:
    from anynum.experiments.runner import (
        DEFAULT_PAIRS,
        DEFAULT_QAT_PAIRS,
        StudySpec,
        available_formats,
        pairs_for,
    )
    from anynum.rounding import parse_rounding

    for r in [*(args.roundings or []), *(args.qat_roundings or [])]:
        parse_rounding(r)
    for f in [*(args.formats or []), *(args.qat_formats or [])]:
        lookup_format(f)
    if args.datasets or args.models:
        from anynum.experiments.datasets import DATASETS
        from anynum.experiments.models import MODELS

        pairs = pairs_for(args.datasets or list(DATASETS), args.models or list(MODELS))
        qat_pairs = pairs
    else:
        pairs, qat_pairs = list(DEFAULT_PAIRS), list(DEFAULT_QAT_PAIRS)
    spec = StudySpec(epochs=args.epochs, batch=args.batch, seed=args.seed)
    spec.ptq_pairs = pairs if args.mode in ("ptq", "both") else []
    spec.qat_pairs = qat_pairs if args.mode in ("qat", "both") else []
    if args.formats:
        spec.formats = args.formats
    if args.roundings:
        spec.roundings = args.roundings
    if args.qat_formats:
        spec.qat_formats = available_formats(args.qat_formats)
    if args.qat_roundings:
        spec.qat_roundings = args.qat_roundings
    return spec


def _cmd_study(args: argparse.Namespace) -> int:
    from pathlib import Path

    from anynum.experiments.outdir import write_atomic
    from anynum.experiments.report import table_text, write_csv, write_heatmap
    from anynum.experiments.runner import expand_grid, parse_shard, run_study

    shard = parse_shard(args.shard) if args.shard is not None else None
    if args.jobs < 1:
        raise AnynumError(f"--jobs must be at least 1, got {args.jobs}.")
    grid = expand_grid(_study_spec(args))
    if not grid:
        raise AnynumError("the study grid is empty: give at least one format and rounding mode.")
    progress = "none" if args.quiet else "auto"
    result = run_study(
        grid, args.out, jobs=args.jobs, shard=shard, dask_scheduler=args.dask_scheduler, progress=progress
    )
    rows = result.rows
    out = Path(args.out)
    title = (
        f"anynum study: {len(rows)} trials ({result.new} new, {result.skipped} resumed) "
        f"in {result.seconds:.1f} s; test accuracy in % (R^2 in % for regression)"
    )
    try:
        from rich.console import Console

        Console(width=max(_terminal_width(), 120)).print(_render_rich(rows, title))
    except ImportError:
        print(title)
        print(table_text(rows))
    written = [out / "results.jsonl"]
    try:
        write_csv(rows, out / "results.csv")
        write_atomic(out / "table.md", f"{title}\n\n{table_text(rows)}\n")  # another study may write it too
        written += [out / "results.csv", out / "table.md"]
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: no heatmap (pip install 'anynum[cli]')", file=sys.stderr)
        else:
            if rows:
                write_heatmap(rows, out / "heatmap.png")
                written.append(out / "heatmap.png")
    except OSError as exc:
        raise AnynumError(f"cannot write the report into {args.out}: {exc.strerror or exc}") from None
    return _wrote(written, result.failures)


def _wrote(written: list[Any], failures: list[str]) -> int:
    """Say what a study wrote; failed trials (not recorded, retried on a rerun) make it an error."""
    print("wrote " + ", ".join(str(p) for p in written))
    if failures:
        raise AnynumError(
            f"{len(failures)} trial(s) failed and were not recorded (rerun to retry); first: {failures[0]}"
        )
    return 0


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((120, 24)).columns


def _render_rich(rows: list[dict[str, Any]], title: str) -> Any:
    from anynum.experiments.report import render_table

    return render_table(rows, title)


def _cmd_faults(args: argparse.Namespace) -> int:
    from anynum.experiments.fault_report import write_fault_report
    from anynum.experiments.faults import FaultSpec, run_fault_study

    for f in args.formats:
        lookup_format(f)
    spec = FaultSpec(args.dataset, args.model, args.formats, args.fields, args.bers, args.repeats,
                     args.target, args.epochs, args.batch, args.seed)
    result = run_fault_study(spec, args.out, jobs=args.jobs, progress="none" if args.quiet else "auto")
    title = (f"anynum faults: {len(result.rows)} trials ({result.new} new, {result.skipped} resumed) in "
             f"{result.seconds:.1f} s; {args.target} bit flips; test accuracy in %, mean of {args.repeats}")
    text, written = write_fault_report(result.rows, args.out, title)
    print(f"{title}\n{text}")
    return _wrote(written, result.failures)


def _cmd_emulate(args: argparse.Namespace) -> int:
    from anynum.experiments.emulation import (
        DEFAULT_CONFIGS,
        plot_accuracy,
        run_emulation_study,
        table_markdown,
    )

    labels = {c.label: c for c in DEFAULT_CONFIGS}
    if args.list:
        print("\n".join(labels))
        return 0
    chosen = [c for c in DEFAULT_CONFIGS if not args.settings or c.label in args.settings]
    unknown = sorted(set(args.settings or ()) - set(labels))
    if unknown:
        raise AnynumError(f"unknown --settings {unknown}; expected labels from `anynum emulate --list`: "
                          f"{sorted(labels)}.")
    study = run_emulation_study(args.out, chosen, epochs=args.epochs, batch=args.batch, seed=args.seed,
                                lr=args.lr, limit=args.limit, threads=args.threads, progress=not args.quiet)
    text = table_markdown(study.rows)
    print(text)
    out = Path(args.out)
    written: list[Any] = [out / "results.jsonl"]
    try:
        (out / "table.md").write_text(text + "\n", encoding="utf-8")
        written.append(out / "table.md")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: no plot (pip install 'anynum[cli]')", file=sys.stderr)
        else:
            plot_accuracy(study.rows, out / "accuracy.png")
            written.append(out / "accuracy.png")
    except OSError as exc:
        raise AnynumError(f"cannot write the report into {args.out}: {exc.strerror or exc}") from None
    return _wrote(written, [])


def _cmd_bench(args: argparse.Namespace) -> int:
    from anynum.experiments.bench import bench_report

    try:
        text = bench_report(
            args.sizes, args.repeats, args.threads, args.budget, with_first_calls=args.first_calls,
            json_path=args.json, plot_path=args.plot, progress=lambda m: print(m, file=sys.stderr),
        )
    except OSError as exc:
        raise AnynumError(f"cannot write {exc.filename}: {exc.strerror}") from None
    print(text)
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from anynum.experiments.nativebuild import build_all

    return 1 if build_all(lambda line: print(line, flush=True)) else 0


def _command(args: argparse.Namespace) -> str:
    import shlex

    return "anynum " + " ".join(shlex.quote(a) for a in args.argv)


def _show(table: Any, text: str, width: int = 120) -> None:
    try:
        from rich.console import Console
    except ImportError:
        print(text)
    else:
        Console(width=max(_terminal_width(), width)).print(table)


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from anynum.experiments.diagnosis import DiagnoseSpec, run_diagnose, write_diagnose

    fmt = args.format
    spec = DiagnoseSpec(
        dataset=args.dataset, model=args.model, data_file=args.data_file, model_file=args.model_file,
        trust_pickle=args.trust_pickle, mode=args.mode,
        weight=args.weight or fmt, activation=args.activation or fmt,
        error=args.error or (fmt if args.mode == "qat" else None),
        grad=args.grad or (fmt if args.mode == "qat" else None),
        momentum=args.momentum, opt_weight=args.opt_weight, accumulator=args.accumulator,
        rounding=args.rounding, grad_scale=_grad_scale(args.grad_scale), epochs=args.epochs, lr=args.lr,
        batch=args.batch, seeds=args.seed, candidates=args.candidates or [], min_sqnr=args.min_sqnr,
    )
    outcome = run_diagnose(spec, cache_dir=str(Path(args.out) / "cache"), progress=not args.quiet)
    rep = outcome.report
    what = f"{rep.steps} steps" if outcome.mode == "qat" else "one pass over the test set"
    _show(rep.rich_table(title=f"anynum diagnose: {outcome.mode.upper()} {outcome.label}, {what}"),
          rep.table_text(), width=140)
    for line in [*outcome.score_lines(), *(f"- {s}" for s in rep.suggestions)]:
        print(line)
    try:
        written = write_diagnose(outcome, args.out, _command(args))
    except OSError as exc:
        raise AnynumError(f"cannot write the report into {args.out}: {exc.strerror or exc}") from None
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _grad_scale(text: str) -> float | str:
    if text == "dynamic":
        return text
    try:
        return float(text)
    except ValueError:
        raise AnynumError(f"--grad-scale takes a number or 'dynamic', got {text!r}.") from None


def _cmd_search(args: argparse.Namespace) -> int:
    from anynum.experiments.formatsearch import SearchSpec, run_search, write_search

    spec = SearchSpec(
        formats=args.formats, dataset=args.dataset, model=args.model, data_file=args.data_file,
        model_file=args.model_file, trust_pickle=args.trust_pickle, tolerance=args.tolerance,
        budget=args.budget, sensitivity=args.sensitivity, categories=args.categories, rounding=args.rounding,
        epochs=args.epochs, lr=args.lr, batch=args.batch, seed=args.seed[0], steps=args.steps,
    )
    result, label = run_search(spec, cache_dir=str(Path(args.out) / "cache"), progress=not args.quiet)
    _show(result.rich_table(title=f"anynum search: {label}, tolerance {spec.tolerance:g} points"),
          result.table_text().rsplit("\n\n", 1)[0])
    print(result.summary())
    try:
        written = write_search(result, args.out, _command(args))
    except OSError as exc:
        raise AnynumError(f"cannot write the result into {args.out}: {exc.strerror or exc}") from None
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _model_arguments(p: argparse.ArgumentParser, out: str) -> None:
    g = p.add_argument_group("model and data (defaults: the bundled MLP on digits)")
    g.add_argument("--dataset", default="digits",
                   help="bundled data: digits breast_cancer classification regression sequence")
    g.add_argument("--model", default="mlp", help="bundled model: mlp cnn lstm")
    g.add_argument("--data-file", metavar="FILE", help=".pt or .npz with x, y (and x_test, y_test)")
    g.add_argument("--model-file", metavar="FILE",
                   help="a state_dict (with --model), a torch.export program, or a module (--trust-pickle)")
    g.add_argument("--trust-pickle", action="store_true",
                   help="allow a --model-file that is a pickled module")
    g.add_argument("--epochs", type=int, default=10, help="training epochs")
    g.add_argument("--lr", type=float, help="SGD learning rate (default: the study's for the model)")
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--seed", type=int, nargs="+", default=[0],
                   help="one seed, or several to average (diagnose)")
    g.add_argument("--rounding", default="nearest", help="rounding mode of every format")
    g.add_argument("--out", default=out, metavar="DIR", help="output directory")
    g.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``anynum: error: ...``, exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="anynum", description="Number formats for PyTorch, bit-exact.")
    sub = p.add_subparsers(dest="command")
    pf = sub.add_parser("formats", help="table of every preset format")
    pf.add_argument("--format", choices=("markdown", "csv", "json"), default="markdown")
    pf.add_argument("--output", "-o", help="write the table to this file")
    pf.set_defaults(func=_cmd_formats)
    pi = sub.add_parser("info", help="properties of one format")
    pi.add_argument("name", help="a format name, e.g. e4m3fn, 'fixed(8,4)', 'p3109(8,4)', 'posit(8,2)'")
    pi.add_argument("--compare", nargs="+", metavar="NAME", help="more formats to tabulate and overlay")
    pi.add_argument("--plot", metavar="OUT.png", help="plot value distribution and decimal accuracy here")
    pi.set_defaults(func=_cmd_info)
    ps = sub.add_parser("study", help="PTQ/QAT accuracy by format x rounding mode (the default job)")
    _study_arguments(ps)
    ps.set_defaults(func=_cmd_study)
    pfa = sub.add_parser("faults", help="accuracy against bit error rate, per format and field")
    _fault_arguments(pfa)
    pfa.set_defaults(func=_cmd_faults)
    sub.add_parser("build", help="build the native libraries now (else a first run does)").set_defaults(
        func=_cmd_build
    )
    pb = sub.add_parser("bench", help="quantization speed against native casts and peers")
    pb.add_argument("--sizes", type=int, nargs="+", default=[4096, 1 << 16, 1 << 20, 1 << 22, 1 << 24])
    pb.add_argument("--repeats", type=int, default=7)
    pb.add_argument("--threads", type=int, default=2)
    pb.add_argument("--budget", type=float, default=2.0, help="seconds a peer's cell may take (else skipped)")
    pb.add_argument("--json", default="bench-results/quantize.json")
    pb.add_argument("--plot", default="bench-results/quantize.png", help="throughput against size (PNG)")
    pb.add_argument("--first-calls", action="store_true", help="also time first calls in fresh processes")
    pb.set_defaults(func=_cmd_bench)
    pd = sub.add_parser("diagnose", help="per-layer numerics: overflow, underflow, SQNR, stagnation")
    n = pd.add_argument_group("numbers (--format F sets weight, activation, error and grad)")
    n.add_argument("--format", metavar="F")
    for flag, what in (("weight", "weights and biases as the layers see them"),
                       ("activation", "layer inputs"), ("error", "gradients of the activations"),
                       ("grad", "parameter gradients (optimizer)"),
                       ("momentum", "optimizer momentum states"),
                       ("opt-weight", "weights stored after each step (no master copy)"),
                       ("accumulator", "master weights (optimizer)")):
        n.add_argument(f"--{flag}", metavar="F", help=what)
    n.add_argument("--grad-scale", default="1", help="static loss scale, or 'dynamic' (default 1: none)")
    n.add_argument("--mode", choices=("qat", "ptq"), default="qat",
                   help="qat: train in these numbers; ptq: round a trained fp32 model")
    n.add_argument("--candidates", nargs="+", metavar="F",
                   help="formats to compare (narrowest-format advice)")
    n.add_argument("--min-sqnr", type=float, default=20.0, help="SQNR (dB) the advice asks of a format")
    _model_arguments(pd, "anynum-diagnose")
    pd.set_defaults(func=_cmd_diagnose)
    pq = sub.add_parser("search", help="choose a format per layer within an accuracy tolerance")
    pq.add_argument("--formats", nargs="+", metavar="F", required=True, help="candidate formats")
    pq.add_argument("--tolerance", type=float, default=0.5, help="accuracy points below fp32 allowed")
    pq.add_argument("--budget", type=int, help="most evaluations (reference and final check included)")
    pq.add_argument("--sensitivity", choices=("sqnr", "measured"), default="sqnr")
    pq.add_argument("--categories", nargs="+", default=["weight", "activation"],
                    choices=("weight", "bias", "activation"), help="what each chosen format applies to")
    pq.add_argument("--steps", type=int, default=10, help="training batches for the SQNR sensitivity")
    _model_arguments(pq, "anynum-search")
    pq.set_defaults(func=_cmd_search)
    pe = sub.add_parser("emulate", help="LeNet-5 trained with every op in a format (an.emulate)")
    pe.add_argument("--settings", nargs="+", metavar="LABEL", help="rows to run (default: all; see --list)")
    pe.add_argument("--list", action="store_true", help="print the setting labels and exit")
    pe.add_argument("--epochs", type=int, default=10)
    pe.add_argument("--batch", type=int, default=32)
    pe.add_argument("--lr", type=float, default=1e-3)
    pe.add_argument("--seed", type=int, default=0)
    pe.add_argument("--limit", type=int, help="use only the first N training images")
    pe.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    pe.add_argument("--out", default="anynum-emulate", metavar="DIR", help="results directory (resumable)")
    pe.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    pe.set_defaults(func=_cmd_emulate)
    return p


def _study_arguments(ps: argparse.ArgumentParser) -> None:
    g = ps.add_argument_group("grid (defaults: the default study)")
    g.add_argument("--formats", nargs="+", metavar="NAME", help="PTQ formats")
    g.add_argument("--roundings", nargs="+", metavar="MODE",
                   help="PTQ rounding modes (nearest ru rd rz sr ...)")
    g.add_argument("--qat-formats", nargs="+", metavar="NAME", help="QAT formats")
    g.add_argument("--qat-roundings", nargs="+", metavar="MODE", help="QAT rounding modes")
    g.add_argument("--datasets", nargs="+", metavar="NAME",
                   help="digits breast_cancer classification regression sequence")
    g.add_argument("--models", nargs="+", metavar="NAME",
                   help="mlp cnn lstm (incompatible pairs are skipped)")
    g.add_argument("--mode", choices=("ptq", "qat", "both"), default="both")
    g.add_argument("--epochs", type=int, default=10, help="training epochs (baseline and QAT)")
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--seed", type=int, default=0)
    r = ps.add_argument_group("running")
    r.add_argument("--out", default="anynum-results", metavar="DIR", help="results directory")
    r.add_argument("--jobs", "-j", type=int, default=2, help="parallel worker processes (1: in process)")
    r.add_argument("--shard", metavar="i/n", help="run only every n-th trial starting at i (0 <= i < n)")
    r.add_argument("--dask-scheduler", metavar="ADDRESS", help="a Dask scheduler address, or 'local'")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def _fault_arguments(p: argparse.ArgumentParser) -> None:
    from anynum.experiments.faults import DEFAULT_BERS, DEFAULT_FAULT_FORMATS

    g = p.add_argument_group("grid (defaults: e4m3fn, posit8, int8 and MXFP8 weights of the digits MLP)")
    g.add_argument("--formats", nargs="+", metavar="NAME", default=list(DEFAULT_FAULT_FORMATS))
    g.add_argument("--fields", nargs="+", metavar="FIELD", help="fields to sweep (default: each format's)")
    g.add_argument("--bers", nargs="+", type=float, metavar="P", default=list(DEFAULT_BERS),
                   help="bit error rates (probability that each stored bit flips)")
    g.add_argument("--repeats", type=int, default=5, help="independent fault draws per point")
    g.add_argument("--target", choices=("weight", "activation"), default="weight")
    g.add_argument("--dataset", default="digits")
    g.add_argument("--model", default="mlp")
    g.add_argument("--epochs", type=int, default=10, help="training epochs of the fp32 baseline")
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="anynum-faults", metavar="DIR", help="results directory")
    p.add_argument("--jobs", "-j", type=int, default=1, help="parallel worker processes (1: in process)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anynum`` command; returns the exit code.

    >>> main(["info", "e2m1"])  # doctest: +ELLIPSIS
    e2m1: E2M1
    ...
    0
    >>> main(["info", "e9m9x"])
    2
    """
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:  # the default job: the default study
        args = parser.parse_args(["study"])
    args.argv = argv
    try:
        return int(args.func(args))
    except AnynumError as exc:
        print(f"anynum: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("anynum: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
