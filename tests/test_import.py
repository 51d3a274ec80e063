"""`import anynum` stays light: no jax, dask or matplotlib, and the heavy subpackages load lazily.

Checked in a fresh interpreter, since other tests may have imported these already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys
import anynum as an
heavy = ["jax", "dask", "matplotlib", "anynum.mc", "anynum.nn", "anynum.optim",
         "anynum.experiments", "anynum.compat", "anynum.cli"]
before = {m: m in sys.modules for m in heavy}
names = {"all": sorted(an.__all__), "dir": sorted(dir(an)), "version": an.__version__}
print(json.dumps({"before": before, "names": names}))
"""


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probe():
    return _run(PROBE)


def test_import_is_light(probe):
    loaded = [m for m, v in probe["before"].items() if v]
    assert not loaded, f"import anynum imported {loaded}"
    assert probe["names"]["version"]


def test_public_names_exist(probe):
    import anynum as an

    for name in probe["names"]["all"]:
        assert hasattr(an, name), name
    for name in ["quantize", "encode", "decode", "format", "list_formats", "Rounding",
                 "FloatFormat", "FixedPoint", "IntFormat", "FP32", "TF32", "FP16", "BF16", "E5M2",
                 "E4M3FN", "E4M3FNUZ", "E5M2FNUZ", "E4M3", "E3M4", "E3M2", "E2M3", "E2M1", "E8M0",
                 "quantize_int", "dequantize_int", "AnynumError"]:
        assert name in probe["names"]["all"], name


LAZY = r"""
import sys, json, anynum as an
subs = ["mc", "nn", "optim"]
res = {"before": {s: f"anynum.{s}" in sys.modules for s in subs}, "ok": {}}
for s in subs:
    try:
        res["ok"][s] = getattr(an, s).__name__ == f"anynum.{s}" and f"anynum.{s}" in sys.modules
    except ImportError as e:
        res["ok"][s] = "import error: " + str(e)
res["heavy"] = [m for m in ("jax", "dask", "matplotlib") if m in sys.modules]
print(json.dumps(res))
"""


def test_subpackages_load_on_first_access():
    res = _run(LAZY)
    assert not any(res["before"].values()), res
    assert all(v is True for v in res["ok"].values()), res
    assert res["heavy"] == [], res


def test_unknown_attribute_is_an_attribute_error():
    import anynum as an

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        an.nope  # noqa: B018
