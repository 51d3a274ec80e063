"""``anynum faults`` end to end: rows, table, figure, resume, determinism, errors (tiny grids)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anynum.cli import main
from anynum.experiments.faults import FaultSpec, FaultTrial, fault_grid, fields_of, run_fault_trial

pytest.importorskip("sklearn")

TINY = ["--dataset", "sequence", "--model", "mlp", "--epochs", "1", "--repeats", "2", "--quiet"]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_study_rows_table_figure_and_resume(tmp_path, capsys):
    out = tmp_path / "f"
    argv = ["faults", *TINY, "--formats", "e4m3fn", "int8", "--fields", "any", "exponent", "sign",
            "--bers", "0.001", "0.1", "--out", str(out)]
    assert main(argv) == 0
    rows = rows_of(out)
    # e4m3fn: any, exponent, sign; int8: any, sign (no exponent field) -> 5 x 2 BERs x 2 repeats
    assert len(rows) == 20 and {r["format"] for r in rows} == {"e4m3fn", "int8"}
    assert all(0 <= r["score"] <= 100 or r["score"] is None for r in rows)
    assert all(r["flips"] >= 0 and r["clean_score"] is not None for r in rows)
    heavy = [r for r in rows if r["ber"] == 0.1]
    assert sum(r["flips"] for r in heavy) > 10 * sum(r["flips"] for r in rows if r["ber"] == 0.001)
    text = (out / "table.md").read_text()
    assert "| e4m3fn | exponent |" in text and "| int8 | sign |" in text
    if (out / "faults.png").exists():
        assert (out / "faults.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(argv) == 0  # resume: nothing new, the same rows
    assert "0 new, 20 resumed" in capsys.readouterr().out
    assert rows_of(out) == rows


def test_trials_are_deterministic():
    t = FaultTrial("sequence", "mlp", "posit(8,2)", "regime", 0.01, 1, epochs=1)
    a, b = run_fault_trial(t), run_fault_trial(t)
    assert (a["score"], a["flips"]) == (b["score"], b["flips"]) and a["trial_id"] == b["trial_id"]
    other = run_fault_trial(FaultTrial("sequence", "mlp", "posit(8,2)", "regime", 0.01, 2, epochs=1))
    assert other["trial_id"] != a["trial_id"]


def test_grid_and_fields():
    assert fields_of("e4m3fn") == ("any", "sign", "exponent", "mantissa")
    assert fields_of("int8") == ("any", "sign")
    assert fields_of("fixed(4,4)") == ("any", "sign", "integer", "fraction")
    grid = fault_grid(FaultSpec(formats=["mxfp8_e4m3"], bers=[1e-4, 1e-3], repeats=3))
    assert len(grid) == 3 * 2 * 3 and {t.field for t in grid} == {"any", "element", "scale"}


@pytest.mark.parametrize(("argv", "needle"), [
    (["faults", "--formats", "nosuchformat"], "unknown"),
    (["faults", "--dataset", "nope"], "unknown dataset"),
    (["faults", "--formats", "int8", "--fields", "regime"], "fault grid is empty"),
    (["faults", "--repeats", "0"], "repeats must be"),
])
def test_bad_arguments(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("anynum: error:") and needle in err and "\n" not in err
