"""``anynum emulate`` end to end on a tiny slice: rows, table, resume, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anynum.cli import main

pytest.importorskip("sklearn")

TINY = ["--epochs", "1", "--limit", "32", "--batch", "16", "--threads", "1", "--quiet"]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_rows_table_and_resume(tmp_path, capsys):
    out = tmp_path / "e"
    argv = ["emulate", "--settings", "fp32", "bf16", *TINY, "--out", str(out)]
    assert main(argv) == 0
    rows = rows_of(out)
    assert [r["label"] for r in rows] == ["fp32", "bf16"]
    assert all(len(r["accuracy"]) == 1 and 0 <= r["accuracy"][0] <= 100 for r in rows)
    assert rows[1]["format"] == "bf16" and rows[0]["format"] == "fp32"
    assert "| bf16 |" in (out / "table.md").read_text()
    capsys.readouterr()
    assert main(argv) == 0  # resumed: no new rows
    assert len(rows_of(out)) == 2


def test_list_and_unknown_setting(tmp_path, capsys):
    assert main(["emulate", "--list"]) == 0
    labels = capsys.readouterr().out.splitlines()
    assert "posit16es2" in labels and "posit8es0 + quire" in labels
    assert main(["emulate", "--settings", "posit99", "--out", str(tmp_path)]) == 2
    assert "unknown --settings" in capsys.readouterr().err
