"""``anynum diagnose`` and ``anynum search`` end to end on tiny settings, user model and data files
(state_dict, torch.export program, pickled module), and one-line errors for bad input, hostile
files included."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from anynum.cli import main
from anynum.experiments.datasets import load_dataset
from anynum.experiments.models import build_model

pytest.importorskip("sklearn")
pytestmark = pytest.mark.usefixtures("eager_only")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--dataset", "sequence", "--model", "mlp", "--epochs", "1", "--batch", "128", "--quiet"]


def one_line_error(capsys, argv: list[str], needle: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("anynum: error:"), err
    assert needle in err, err
    return err


def test_diagnose_qat_writes_every_output(tmp_path, capsys):
    out = tmp_path / "d"
    argv = [
        "diagnose",
        *TINY,
        "--weight",
        "e4m3fn",
        "--activation",
        "e4m3fn",
        "--error",
        "e5m2",
        "--grad",
        "e4m3fn",
        "--opt-weight",
        "e4m3fn",
        "--candidates",
        "e2m1",
        "bf16",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "test accuracy (%) in these numbers" in text and "fp32" in text
    report = json.loads((out / "report.json").read_text())
    assert report["command"].startswith("anynum diagnose --dataset sequence")
    cats = {(r["layer"], r["category"]) for r in report["rows"]}
    assert {("fc1", "weight"), ("fc2", "error"), ("fc3", "gradient"), ("fc1", "update")} <= cats
    assert report["steps"] == len(report["losses"]) > 0 and len(report["scores"]) == 1
    assert (out / "report.csv").read_text().startswith("layer,category,format")
    assert "| fc1 | weight | e4m3fn |" in (out / "table.md").read_text()
    for png in ("heatmap.png", "histograms.png"):
        assert (out / png).read_bytes().startswith(PNG_MAGIC)


def test_diagnose_ptq_several_seeds(tmp_path, capsys):
    out = tmp_path / "p"
    assert (
        main(["diagnose", *TINY, "--mode", "ptq", "--format", "e3m2", "--seed", "0", "1", "--out", str(out)])
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "ptq" and len(report["scores"]) == len(report["references"]) == 2
    assert {r["category"] for r in report["rows"]} == {"weight", "bias", "activation"}


def test_search_end_to_end_within_budget(tmp_path, capsys):
    out = tmp_path / "s"
    argv = [
        "search",
        *TINY,
        "--formats",
        "e2m1",
        "e4m3fn",
        "bf16",
        "--tolerance",
        "2",
        "--budget",
        "5",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    res = json.loads((out / "search.json").read_text())
    assert res["evaluations"] <= 5 and res["verified"]
    assert set(res["formats"]) == {"fc1", "fc2", "fc3"}
    assert (out / "search.png").read_bytes().startswith(PNG_MAGIC)
    assert "| layer | params | order | format |" in (out / "table.md").read_text()


# --- user files -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained():
    data = load_dataset("sequence")
    torch.manual_seed(0)
    return build_model("mlp", data), data


def test_state_dict_with_a_bundled_model_name(tmp_path, capsys, trained):
    model, _ = trained
    path = tmp_path / "mlp.pt"
    torch.save(model.state_dict(), path)
    assert (
        main(
            [
                "diagnose",
                *TINY,
                "--mode",
                "ptq",
                "--format",
                "e4m3fn",
                "--model-file",
                str(path),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    one_line_error(
        capsys,
        [
            "diagnose",
            *TINY,
            "--model",
            "cnn",
            "--format",
            "e4m3fn",
            "--model-file",
            str(path),
            "--out",
            str(tmp_path / "o"),
        ],
        "cannot read data",
    )


def test_export_program_runs_and_a_pickled_module_needs_trust(tmp_path, capsys, trained):
    model, data = trained
    ep = torch.export.export(model, (data.x_test[:4],), dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}})
    path = tmp_path / "mlp.pt2"
    torch.export.save(ep, path)
    assert (
        main(
            [
                "diagnose",
                *TINY,
                "--mode",
                "ptq",
                "--format",
                "e4m3fn",
                "--model-file",
                str(path),
                "--out",
                str(tmp_path / "e"),
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "e" / "report.json").read_text())["rows"]
    assert {r["layer"] for r in rows} == {"fc1", "fc2", "fc3"}  # the exported layers are found by name
    assert (
        main(
            ["search", *TINY, "--formats", "e4m3fn", "--model-file", str(path), "--out", str(tmp_path / "es")]
        )
        == 0
    )
    pickled = tmp_path / "whole.pt"
    torch.save(model, pickled)
    one_line_error(
        capsys, ["diagnose", *TINY, "--format", "e4m3fn", "--model-file", str(pickled)], "--trust-pickle"
    )
    assert (
        main(
            [
                "diagnose",
                *TINY,
                "--mode",
                "ptq",
                "--format",
                "e4m3fn",
                "--model-file",
                str(pickled),
                "--trust-pickle",
                "--out",
                str(tmp_path / "t"),
            ]
        )
        == 0
    )


class _Hostile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_hostile_export_archive_is_refused_without_running_it(tmp_path, capsys, trained):
    model, data = trained
    ep = torch.export.export(model, (data.x_test[:4],), dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}})
    good = tmp_path / "good.pt2"
    torch.export.save(ep, good)
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(evil, "w") as dst:
        for name in src.namelist():
            payload = src.read(name)
            if name.endswith(
                "sample_inputs/model.pt"
            ):  # torch.export.load falls back to full unpickling here
                buf = io.BytesIO()
                torch.save(_Hostile(marker), buf)
                payload = buf.getvalue()
            dst.writestr(name, payload)
    one_line_error(
        capsys, ["diagnose", *TINY, "--format", "e4m3fn", "--model-file", str(evil)], "weights_only"
    )
    assert not marker.exists()


def test_data_files_npz_and_pt(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    assert (
        main(
            [
                "diagnose",
                "--data-file",
                str(tmp_path / "d.npz"),
                "--epochs",
                "1",
                "-q",
                "--format",
                "e4m3fn",
                "--out",
                str(tmp_path / "n"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "n" / "report.json").read_text())
    assert report["label"] == "d/mlp" and report["metric"] == "accuracy"
    torch.save(
        {
            "x": torch.tensor(x),
            "y": torch.tensor(x[:, 1]),
            "x_test": torch.tensor(x[:8]),
            "y_test": torch.tensor(x[:8, 1]),
        },
        tmp_path / "r.pt",
    )
    assert (
        main(
            [
                "diagnose",
                "--data-file",
                str(tmp_path / "r.pt"),
                "--epochs",
                "1",
                "-q",
                "--format",
                "bf16",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "r" / "report.json").read_text())["metric"] == "r2"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--format", "no_such_format"], "no_such_format"),
        ([], "give the numbers"),
        (["--format", "e4m3fn", "--grad-scale", "lots"], "--grad-scale"),
        (["--mode", "ptq", "--error", "e5m2"], "--mode qat"),
        (["--format", "e4m3fn", "--model-file", "/no/such/file.pt"], "does not exist"),
        (["--format", "e4m3fn", "--data-file", "/no/such/file.npz"], "does not exist"),
        (["--format", "e4m3fn", "--candidates", "e9x"], "e9x"),
    ],
)
def test_diagnose_bad_input_is_one_line(tmp_path, capsys, extra, needle):
    one_line_error(capsys, ["diagnose", *TINY, *extra, "--out", str(tmp_path)], needle)
    assert not any(tmp_path.iterdir())  # refused before anything ran


def test_bad_data_file_and_search_input(tmp_path, capsys):
    np.savez(tmp_path / "nox.npz", y=np.arange(8))
    one_line_error(
        capsys, ["diagnose", "--data-file", str(tmp_path / "nox.npz"), "--format", "e4m3fn", "-q"], "'x'"
    )
    (tmp_path / "data.csv").write_text("1,2\n")
    one_line_error(
        capsys, ["diagnose", "--data-file", str(tmp_path / "data.csv"), "--format", "e4m3fn"], ".pt or .npz"
    )
    out = tmp_path / "s"
    for extra, needle in ((["--budget", "1"], "budget"), (["--tolerance", "-1"], "tolerance")):
        one_line_error(capsys, ["search", *TINY, "--formats", "e4m3fn", *extra, "--out", str(out)], needle)
    assert not out.exists()  # refused before any training
