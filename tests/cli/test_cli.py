"""The ``anynum`` command end to end: formats, info --plot/--compare, study (resume, jobs, shards,
dask) and errors.

Studies here are tiny (one epoch of a small MLP on the generated sequence task)
so the whole file runs in well under a minute.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from anynum.cli import main

pytest.importorskip("sklearn")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--datasets", "sequence", "--models", "mlp", "--epochs", "1", "--quiet"]
TINY_GRID = [*TINY, "--formats", "fp32", "e2m1", "--roundings", "nearest", "sr",
             "--qat-formats", "e4m3fn", "--qat-roundings", "sr"]


def rows_of(out: Path) -> list[dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def scores(out: Path) -> dict[str, float]:
    return {r["trial_id"]: r["score"] for r in rows_of(out)}


def one_line_error(capsys, argv: list[str], needle: str) -> None:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("anynum: error:")
    assert needle in err, err
    assert "Traceback" not in captured.out + captured.err


# --- formats and info ---------------------------------------------------------------------


def test_formats_json_lists_every_preset(capsys):
    import anynum as an

    assert main(["formats", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == set(an.list_formats())
    assert by_name["e4m3fn"]["max"] == 448.0
    assert by_name["e5m2"]["specials"] == "inf,nan,-0"


def test_formats_csv_to_file(tmp_path, capsys):
    path = tmp_path / "f.csv"
    assert main(["formats", "--format", "csv", "--output", str(path)]) == 0
    rows = list(csv.DictReader(path.open()))
    assert any(r["name"] == "bf16" and r["bits"] == "16" for r in rows)


def test_info_plot_writes_png(tmp_path, capsys):
    path = tmp_path / "e4m3fn.png"
    assert main(["info", "e4m3fn", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "max" in out and "448" in out
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_info_compare_tabulates_and_overlays(tmp_path, capsys):
    path = tmp_path / "cmp.png"
    argv = ["info", "posit(8,2)", "--compare", "e4m3fn", "mxfp8_e4m3", "bf16", "--plot", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for name in ("posit(8,2)", "e4m3fn", "mxfp8_e4m3", "bf16"):
        assert name in header
    assert "mxfp8_e4m3 (element e4m3fn)" in out  # what the plot shows for a block format
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_profiles_flat_for_floats_tapered_for_posits():
    import numpy as np

    from anynum.experiments.plots import format_profile

    e4 = format_profile("e4m3fn")
    normal = e4.binades >= -6
    # 8 values per normal binade (3 mantissa bits); the top binade lacks its NaN code
    assert e4.counts[normal][:-1].tolist() == [8.0] * (int(normal.sum()) - 1)
    mid = (e4.acc_edges[:-1] >= -6) & (e4.acc_edges[:-1] < 7)
    # within every normal binade the worst case repeats: same accuracy at each binade's start
    starts = e4.accuracy[mid][::8]
    assert np.allclose(starts, starts[0])
    p = format_profile("posit(8,2)")
    centre = p.accuracy[np.abs(p.acc_edges[:-1]) < 1].min()
    assert centre > p.accuracy[p.acc_edges[:-1] > 12].max() + 0.5  # tapered accuracy
    assert centre > p.accuracy[p.acc_edges[:-1] < -12].max() + 0.5
    sub = format_profile("fp16")
    assert sub.accuracy[0] < sub.accuracy[-1] - 2  # subnormals lose accuracy


# --- study --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serial")
    assert main(["study", *TINY_GRID, "--jobs", "1", "--out", str(out)]) == 0
    return out


def test_study_writes_rows_table_csv_png(serial):
    rows = rows_of(serial)
    assert len(rows) == 5  # 2 formats x 2 roundings (PTQ) + 1 QAT trial
    assert len({r["trial_id"] for r in rows}) == 5
    for r in rows:
        assert set(r["versions"]) >= {"anynum", "torch", "numpy", "python"}
        assert r["device"]["type"] == "cpu" and r["seed"] == 0
        assert r["format_spec"]["family"] in {"FloatFormat"}
        assert 0.0 <= r["score"] <= 100.0
    fp32 = [r for r in rows if r["mode"] == "ptq" and r["format"] == "fp32"]
    assert all(r["score"] == r["baseline_score"] for r in fp32)  # fp32 PTQ is the identity
    e2m1 = {r["rounding"]: r for r in rows if r["format"] == "e2m1"}
    assert e2m1["nearest"]["format_spec"]["man_bits"] == 1
    lines = list(csv.DictReader((serial / "results.csv").open()))
    assert len(lines) == 5 and {line["metric"] for line in lines} == {"accuracy"}
    assert (serial / "heatmap.png").read_bytes().startswith(PNG_MAGIC)
    table = (serial / "table.md").read_text()
    assert "Round to nearest" in table and "Stochastic" in table and "QAT sequence/mlp |" in table


def test_study_prints_table(serial, capsys):
    assert main(["study", *TINY_GRID, "--jobs", "1", "--out", str(serial)]) == 0
    out = capsys.readouterr().out
    assert "Round to nearest" in out and "e2m1" in out and "Average" in out
    assert "0 new, 5 resumed" in out


def test_resume_adds_no_rows(serial, capsys):
    before = (serial / "results.jsonl").read_bytes()
    assert main(["study", *TINY_GRID, "--jobs", "1", "--out", str(serial)]) == 0
    assert (serial / "results.jsonl").read_bytes() == before


def test_resume_runs_only_missing_trials(tmp_path, capsys):
    argv = ["study", *TINY, "--formats", "e2m1", "--mode", "ptq", "--jobs", "1", "--out", str(tmp_path)]
    assert main([*argv, "--roundings", "nearest"]) == 0
    first = rows_of(tmp_path)
    assert main([*argv, "--roundings", "rz", "nearest"]) == 0
    rows = rows_of(tmp_path)
    assert [r["rounding"] for r in rows] == ["nearest", "rz"]
    assert rows[0] == first[0]  # append-only: the old row is untouched
    assert "1 new, 1 resumed" in capsys.readouterr().out


def test_trials_are_deterministic_and_ids_follow_the_config():
    from anynum.experiments.trials import TrialConfig, run_trial

    c = TrialConfig("ptq", "sequence", "mlp", "e3m2", "sr", epochs=1)
    a, b = run_trial(c), run_trial(c)
    assert a["score"] == b["score"] and a["trial_id"] == b["trial_id"]
    assert TrialConfig("ptq", "sequence", "mlp", "fp6_e3m2", "stochastic", epochs=1).trial_id == c.trial_id
    assert TrialConfig("ptq", "sequence", "mlp", "e3m2", "rz", epochs=1).trial_id != c.trial_id
    assert TrialConfig("ptq", "sequence", "mlp", "e3m2", "sr", epochs=1, seed=1).trial_id != c.trial_id


def test_jobs_2_matches_serial(serial, tmp_path, capsys):
    assert main(["study", *TINY_GRID, "--jobs", "2", "--out", str(tmp_path)]) == 0
    assert scores(tmp_path) == scores(serial)


def test_dask_local_matches_serial(serial, tmp_path, capsys):
    pytest.importorskip("distributed")
    argv = ["study", *TINY_GRID, "--jobs", "2", "--dask-scheduler", "local", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert scores(tmp_path) == scores(serial)


def test_shards_partition_the_grid(serial, tmp_path, capsys):
    for i in range(2):
        argv = ["study", *TINY_GRID, "--jobs", "1", "--shard", f"{i}/2", "--out", str(tmp_path / str(i))]
        assert main(argv) == 0
    a, b = scores(tmp_path / "0"), scores(tmp_path / "1")
    assert not set(a) & set(b)
    assert {**a, **b} == scores(serial)


def test_default_grid_has_every_default_format_and_a_qat_slice():
    from anynum.experiments.runner import (
        DEFAULT_FORMATS,
        DEFAULT_QAT_FORMATS,
        StudySpec,
        available_formats,
        expand_grid,
    )

    grid = expand_grid(StudySpec())
    ptq = {t.format for t in grid if t.mode == "ptq"}
    assert {"fp32", "bf16", "fp16", "e5m2", "e4m3fn", "e3m2", "e2m1"} <= ptq
    assert {t.model for t in grid} == {"mlp", "cnn", "lstm"}
    qat = [t for t in grid if t.mode == "qat"]
    assert {(t.dataset, t.model) for t in qat} == {("digits", "cnn")}
    assert len(qat) == 2 * len(available_formats(DEFAULT_QAT_FORMATS))
    assert len(grid) == len(qat) + 4 * 5 * len(available_formats(DEFAULT_FORMATS))


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["info", "e9m9x"], "unknown format 'e9m9x'"),
        (["info", "e4m3fn", "--compare", "nope"], "unknown format 'nope'"),
        (["study", "--formats", "e4m3fn", "bogus8"], "unknown format 'bogus8'"),
        (["study", "--roundings", "sideways"], "unknown rounding mode 'sideways'"),
        (["study", "--qat-roundings", "nearest", "upwards"], "unknown rounding mode 'upwards'"),
        (["study", "--shard", "3"], "malformed --shard '3'"),
        (["study", "--shard", "2/2"], "malformed --shard '2/2'"),
        (["study", "--shard", "a/b"], "malformed --shard 'a/b'"),
        (["study", "--datasets", "mnist"], "unknown dataset 'mnist'"),
        (["study", "--datasets", "breast_cancer", "--models", "cnn"], "can read a dataset"),
        (["study", "--jobs", "0"], "--jobs must be at least 1"),
        (["study", "--epochs", "x"], "invalid int value"),
        (["stduy"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, needle, capsys):
    if argv[0] == "stduy" or "--epochs" in argv:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err
        return
    one_line_error(capsys, argv, needle)


def test_unwritable_output_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    argv = ["study", *TINY, "--out", str(blocker / "sub")]
    one_line_error(capsys, argv, "cannot write to output directory")
    one_line_error(capsys, ["info", "e2m1", "--plot", str(blocker / "x.png")], "cannot write")


def test_errors_through_the_installed_command(tmp_path):
    exe = Path(sys.executable).with_name("anynum")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "anynum.cli"]
    res = subprocess.run([*cmd, "study", "--shard", "1-of-2"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["anynum: error: malformed --shard '1-of-2': expected i/n with "
                                               "0 <= i < n, e.g. 0/4."]
    assert res.stdout == ""


def test_cli_and_experiments_do_not_import_matplotlib_or_dask():
    code = ("import sys, anynum.cli, anynum.experiments.runner, anynum.experiments.report, "
            "anynum.experiments.plots; print([m for m in ('matplotlib', 'dask', 'distributed') "
            "if m in sys.modules])")
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert res.stdout.strip() == "[]"


def test_bench_prints_the_table_and_writes_json_and_plot(tmp_path, capsys):
    import json
    import os

    from anynum.cli import main

    js, png = tmp_path / "b" / "q.json", tmp_path / "b" / "q.png"
    backend = os.environ.get("chop_backend", "auto")  # Pychop's global switch; the bench sets its own
    assert main(["bench", "--sizes", "4096", "--repeats", "1", "--budget", "0.2",
                 "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "e4m3fn nearest" in out and f"wrote {js} and {png}" in out
    rows = json.loads(js.read_text())["rows"]
    copy = next(r for r in rows if r["impl"] == "copy_")
    assert copy["x_copy"] == 1.0 and png.stat().st_size > 0
    assert {r["case"] for r in rows if r["impl"] == "anynum"} >= {"e4m3fn nearest", "posit(16,1) nearest"}
    assert os.environ.get("chop_backend", "auto") == backend  # restored: later Pychop users see theirs
