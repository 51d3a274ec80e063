"""Several ``anynum study`` processes on one output directory, and studies killed with SIGKILL.

Real processes throughout: each trial runs once (counted from the progress log lines of
every process), results.jsonl holds exactly one whole line per trial (no torn, interleaved or
duplicated line), and the rows equal a serial run's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import anynum as an
from anynum.cli import main
from anynum.experiments.outdir import TrialClaims, append_line
from anynum.experiments.runner import read_results

pytest.importorskip("sklearn")

GRID = ["--datasets", "sequence", "--models", "mlp", "--epochs", "1", "--mode", "ptq",
        "--formats", "fp32", "e2m1", "e3m2", "e4m3fn", "--roundings", "nearest", "sr", "rz"]
N_TRIALS = 12
STEP = re.compile(r"^\[\d+/\d+\] ", re.M)  # one progress line per trial a process ran


def _env() -> dict[str, str]:
    src = str(Path(an.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def _study(out: Path, *extra: str) -> subprocess.Popen:
    code = "import sys; from anynum.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, "study", *GRID, "--out", str(out), *extra],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def _lines(out: Path) -> list[dict]:
    raw = (out / "results.jsonl").read_text(encoding="utf-8")
    assert raw.endswith("\n")
    rows = [json.loads(line) for line in raw.splitlines()]  # every line whole
    ids = [r["trial_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a duplicated row"
    return rows


def _scores(rows: list[dict]) -> dict[str, tuple]:
    return {r["trial_id"]: (r["score"], r["model_sha256"]) for r in rows}


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> dict[str, tuple]:
    out = tmp_path_factory.mktemp("serial")
    assert main(["study", *GRID, "--quiet", "--out", str(out)]) == 0
    rows = _lines(out)
    assert len(rows) == N_TRIALS
    return _scores(rows)


@pytest.mark.parametrize("shards", [False, True])
def test_two_concurrent_studies_run_each_trial_once(tmp_path, serial, shards):
    """The same study started twice (or its two shards) at once on one directory."""
    extra = [["--shard", "0/2"], ["--shard", "1/2"]] if shards else [[], []]
    procs = [_study(tmp_path, *e) for e in extra]
    logs, outs = [], []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        logs.append(stderr)
        outs.append(stdout)
    ran = sum(len(STEP.findall(log)) for log in logs)
    assert ran == N_TRIALS, logs  # nobody ran a trial twice
    assert _scores(_lines(tmp_path)) == serial
    if not shards:  # both report the whole grid, whoever ran what
        assert all(f"anynum study: {N_TRIALS} trials" in out for out in outs), outs
    assert not any((tmp_path / ".claims").iterdir())  # every claim let go


def test_a_study_killed_with_sigkill_resumes_to_the_same_rows(tmp_path, serial):
    p = _study(tmp_path)
    results = tmp_path / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 3:
            break
        time.sleep(0.01)
    os.killpg(p.pid, signal.SIGKILL)  # the study and any helper process it started
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL
    before = len(read_results(results))
    assert 3 <= before < N_TRIALS
    with results.open("a", encoding="utf-8") as fh:  # as if killed in the middle of a line
        fh.write('{"trial_id": "torn", "sco')
    assert main(["study", *GRID, "--quiet", "--out", str(tmp_path)]) == 0
    rows = _lines(tmp_path)
    assert len(rows) == N_TRIALS  # the torn tail was cut, nothing else lost or repeated
    assert _scores(rows) == serial


def test_a_dead_claim_holder_does_not_block(tmp_path, serial):
    """A process killed while holding claims: the kernel drops its locks, the next study runs
    those trials."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from anynum.experiments.outdir import TrialClaims; "
         "c = TrialClaims(sys.argv[1]); [c.try_claim(t) for t in sys.argv[2:]]; "
         "print('held', flush=True); time.sleep(600)", str(tmp_path), *serial],
        env=_env(), stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        claims = TrialClaims(tmp_path)
        assert not any(claims.try_claim(t) for t in serial)  # all held by the other process
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        assert main(["study", *GRID, "--quiet", "--out", str(tmp_path)]) == 0
    finally:
        holder.kill()
        holder.wait()
    assert _scores(_lines(tmp_path)) == serial


def test_appends_from_many_processes_are_whole_lines(tmp_path):
    """Six processes append 300 long rows (two pages each) at once: 1,800 whole, distinct lines."""
    import anynum.experiments.outdir as outdir

    path = tmp_path / "r.jsonl"
    code = (  # loads outdir.py alone (standard library only), not torch: quick to start
        "import importlib.util as u, sys\n"
        "spec = u.spec_from_file_location('outdir', sys.argv[3]); m = u.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "for i in range(300):\n"
        "    m.append_line(sys.argv[1], {'trial_id': f'{sys.argv[2]}-{i}', 'pad': 'x' * 6000})"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), str(k), outdir.__file__]) for k in range(6)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 1800 and len({r["trial_id"] for r in rows}) == 1800


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"trial_id": "a"}')
    append_line(path, {"trial_id": "b"})
    assert path.read_text() == '{"trial_id": "a"}\n{"trial_id": "b"}\n'
