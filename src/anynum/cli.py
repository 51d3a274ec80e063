"""The ``anynum`` command: a thin layer over `anynum.formats` (and, later, experiments).

    anynum                      the default job (the formats table)
    anynum formats [--format markdown|csv|json] [--output FILE]
    anynum info NAME            one format's properties
    anynum bench                quantization speed against native casts and peers

Errors are one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

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
    fmt = lookup_format(args.name)
    print(f"{args.name}: {fmt!r}")
    for key, value in vars(fmt.info).items():
        print(f"  {key:<19} {_fmt_cell(value)}")
    if fmt.bits <= 6:
        print(f"  {'values':<19} {' '.join(_fmt_cell(float(v)) for v in fmt.values())}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import os

    from anynum.experiments.bench import main_table, run_benchmark, write_json

    result = run_benchmark(
        args.sizes, args.repeats, args.threads, progress=lambda m: print(m, file=sys.stderr)
    )
    print(main_table(result))
    try:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        write_json(result, args.json)
    except OSError as exc:
        raise AnynumError(f"cannot write {args.json}: {exc.strerror}") from None
    print(f"wrote {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anynum", description="Number formats for PyTorch, bit-exact.")
    sub = p.add_subparsers(dest="command")
    pf = sub.add_parser("formats", help="table of every preset format")
    pf.add_argument("--format", choices=("markdown", "csv", "json"), default="markdown")
    pf.add_argument("--output", "-o", help="write the table to this file")
    pf.set_defaults(func=_cmd_formats)
    pi = sub.add_parser("info", help="properties of one format")
    pi.add_argument("name", help="a format name, e.g. e4m3fn, 'fixed(8,4)', 'p3109(8,4)'")
    pi.set_defaults(func=_cmd_info)
    pb = sub.add_parser("bench", help="quantization speed against native casts and peers")
    pb.add_argument("--sizes", type=int, nargs="+", default=[1 << 16, 1 << 20, 1 << 22, 1 << 24])
    pb.add_argument("--repeats", type=int, default=7)
    pb.add_argument("--threads", type=int, default=2)
    pb.add_argument("--json", default="bench-results/quantize.json")
    pb.set_defaults(func=_cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``anynum`` command; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:  # the default job
        args = parser.parse_args(["formats"])
    try:
        return int(args.func(args))
    except AnynumError as exc:
        print(f"anynum: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
