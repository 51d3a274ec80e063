"""A QAT trial interrupted (by SIGKILL, mid-training) resumes from its last epoch checkpoint and
ends bit-identical to the uninterrupted trial: same final parameters and buffers (SHA-256 of
their bytes), same score."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import anynum as an
from anynum.experiments.trials import TrialConfig, run_trial

pytest.importorskip("sklearn")

CFG = TrialConfig("qat", "digits", "mlp", "e4m3fn", "sr", epochs=8)


def _env() -> dict[str, str]:
    src = str(Path(an.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_qat_trial_killed_mid_training_resumes_bit_identically(tmp_path):
    cache = tmp_path / "cache"
    want = run_trial(CFG, cache)  # uninterrupted (also caches the fp32 baseline)
    assert want["resumed_at_epoch"] == 0
    ck = cache / "qat" / f"{CFG.trial_id}.pt"
    assert not ck.exists()  # removed when the trial ended

    code = (
        "from anynum.experiments.trials import *; "
        f"run_trial(TrialConfig(**{CFG.as_dict()!r}), {str(cache)!r})"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env())
    try:
        deadline = time.monotonic() + 120
        while not ck.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert ck.exists(), "the trial never wrote a checkpoint"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    got = run_trial(CFG, cache)
    assert 1 <= got["resumed_at_epoch"] < CFG.epochs  # it did resume, mid-training
    assert got["model_sha256"] == want["model_sha256"]
    assert got["score"] == want["score"]
    assert not ck.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("content", [b"not a checkpoint", b"\x80\x04torn"])
def test_foreign_or_torn_checkpoints_are_ignored(tmp_path, content):
    short = TrialConfig("qat", "digits", "mlp", "e4m3fn", "sr", epochs=2)
    ck = tmp_path / "qat" / f"{short.trial_id}.pt"
    ck.parent.mkdir(parents=True)
    ck.write_bytes(content)
    row = run_trial(short, tmp_path)
    assert row["resumed_at_epoch"] == 0 and not ck.exists()
    assert row["model_sha256"] == run_trial(short)["model_sha256"]  # same as without a cache
