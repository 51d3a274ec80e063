"""The ``anynum`` command: a thin layer over `anynum.formats` and `anynum.experiments`.

    anynum                      the default job: ``anynum study`` with its default grid
    anynum formats [--format markdown|csv|json] [--output FILE]
    anynum info NAME [--compare NAME ...] [--plot OUT.png]
    anynum study [grid options] [--out DIR] [--jobs N] [--shard i/n] [--dask-scheduler ADDR|local]
    anynum bench                quantization speed against native casts and peers

Errors are one line on stderr with exit code 2, never a traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from anynum.errors import AnynumError
from anynum.formats import format as lookup_format
from anynum.formats import list_formats
from anynum.formats.base import Format

__all__ = ["format_rows", "main"]

_COLUMNS = ("name", "bits", "max", "smallest_normal", "smallest_subnormal", "eps", "specials", "overflow")


def _specials(fmt: Format) -> str:
    parts = []
    if fmt.has_inf:
        parts.append("inf")
    if fmt.has_nan:
        parts.append("nan")
    if fmt.has_negative_zero:
        parts.append("-0")
    if not fmt.signed:
        parts.append("unsigned")
    return ",".join(parts) or "-"


def format_rows(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One dict of properties per format name (default: every preset).

    >>> format_rows(["e4m3fn"])[0]["max"]
    448.0
    """
    rows = []
    for name in names if names is not None else list_formats():
        fmt = lookup_format(name)
        rows.append(
            {
                "name": name,
                "bits": fmt.bits,
                "max": fmt.max,
                "smallest_normal": fmt.smallest_normal,
                "smallest_subnormal": fmt.smallest_subnormal,
                "eps": fmt.eps,
                "specials": _specials(fmt),
                "overflow": fmt.default_overflow,
            }
        )
    return rows


def _fmt_cell(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _render(rows: list[dict[str, Any]], kind: str) -> str:
    if kind == "json":
        return json.dumps(rows, indent=2)
    if kind == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    header = "| " + " | ".join(_COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in _COLUMNS) + "|"
    lines = [header, rule]
    lines += ["| " + " | ".join(_fmt_cell(r[c]) for c in _COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def _cmd_formats(args: argparse.Namespace) -> int:
    text = _render(format_rows(), args.format)
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
            print(f"  {key:<19} {_fmt_cell(value)}")
        if fmt.bits <= 6:
            print(f"  {'values':<19} {' '.join(_fmt_cell(float(v)) for v in fmt.values())}")
    else:
        keys = list(vars(fmts[0].info))
        width = max(12, *(len(n) + 2 for n in names))
        print(f"{'':<19}" + "".join(f"{n:>{width}}" for n in names))
        for key in keys:
            cells = [_fmt_cell(getattr(f.info, key)) for f in fmts]
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
        (out / "table.md").write_text(f"{title}\n\n{table_text(rows)}\n", encoding="utf-8")
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
    print("wrote " + ", ".join(str(p) for p in written))
    if result.failures:
        raise AnynumError(
            f"{len(result.failures)} trial(s) failed and were not recorded (rerun to retry); "
            f"first: {result.failures[0]}"
        )
    return 0


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((120, 24)).columns


def _render_rich(rows: list[dict[str, Any]], title: str) -> Any:
    from anynum.experiments.report import render_table

    return render_table(rows, title)


def _cmd_bench(args: argparse.Namespace) -> int:
    import os

    from anynum.experiments.bench import (
        first_calls,
        first_calls_table,
        main_table,
        plot_throughput,
        run_benchmark,
        write_json,
    )

    result = run_benchmark(
        args.sizes, args.repeats, args.threads, args.budget, progress=lambda m: print(m, file=sys.stderr)
    )
    if args.first_calls:
        result["first_calls"] = first_calls(args.threads)
    print(main_table(result))
    if args.first_calls:
        print(first_calls_table(result["first_calls"]))
    try:
        for path in (args.json, args.plot):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_json(result, args.json)
        plot_throughput(result, args.plot)
    except OSError as exc:
        raise AnynumError(f"cannot write {exc.filename}: {exc.strerror}") from None
    print(f"wrote {args.json} and {args.plot}")
    return 0


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
    pb = sub.add_parser("bench", help="quantization speed against native casts and peers")
    pb.add_argument("--sizes", type=int, nargs="+", default=[4096, 1 << 16, 1 << 20, 1 << 22, 1 << 24])
    pb.add_argument("--repeats", type=int, default=7)
    pb.add_argument("--threads", type=int, default=2)
    pb.add_argument("--budget", type=float, default=2.0, help="seconds a peer's cell may take (else skipped)")
    pb.add_argument("--json", default="bench-results/quantize.json")
    pb.add_argument("--plot", default="bench-results/quantize.png", help="throughput against size (PNG)")
    pb.add_argument("--first-calls", action="store_true", help="also time first calls in fresh processes")
    pb.set_defaults(func=_cmd_bench)
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
    args = parser.parse_args(argv)
    if args.command is None:  # the default job: the default study
        args = parser.parse_args(["study"])
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
