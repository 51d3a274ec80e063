"""search: the known answer (a layer fed values beyond the narrow format's range stays wide), the
tolerance and the budget hold, the returned policy reproduces the verified score, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import anynum as an

pytestmark = pytest.mark.usefixtures("eager_only")


class Gain(nn.Module):
    """Multiplies by 3000 (no parameters, so it is not searched)."""

    def forward(self, x):
        return 3000.0 * x


def _model():
    """Layer "0" sees inputs of about 1 (fine in e4m3fn); after the gain, layer "2" sees inputs far
    beyond e4m3fn's largest value (448) but well inside bf16's range."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), Gain(), nn.Linear(8, 3))
    with torch.no_grad():
        m[2].weight.div_(3000.0)
    return m


X = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))


def _score(reference: nn.Module):
    """100 minus the relative error of the outputs against the unquantized model, in percent."""
    with torch.no_grad():
        ref = reference(X)

    def score(model: nn.Module) -> float:
        with torch.no_grad():
            return 100.0 * (1.0 - float((model(X) - ref).norm() / ref.norm()))

    return score


def test_a_layer_fed_out_of_range_values_stays_wide():
    model = _model()
    with torch.no_grad():
        assert float(model[1](model[0](X)).abs().max()) > 448 * 4  # really beyond e4m3fn's range
    counter = {"n": 0}
    score = _score(model)

    def counted(m):
        counter["n"] += 1
        return score(m)

    res = an.nn.search(model, [(X[:64], None)], counted, formats=["e4m3fn", "bf16"], tolerance=10.0)
    assert res.formats() == {"0": "e4m3fn", "2": "bf16"}
    assert res.evaluations == counter["n"] == len(res.log)
    assert res.verified and res.score >= res.reference - 10.0
    assert [r["bits_saved"] for r in res.table] == [(32 - 8) * 40, (32 - 16) * 27]
    # the policy, applied anew, gives the verified score
    q = an.nn.convert(copy.deepcopy(model), res.policy)
    assert score(q) == res.score
    # and layer "2" in e4m3fn is indeed out of tolerance
    bad = an.nn.convert(
        copy.deepcopy(model), an.nn.Policy(weight="e4m3fn", activation="e4m3fn", include=("2",))
    )
    assert score(bad) < res.reference - 10.0


def test_measured_sensitivity_finds_the_same_answer():
    model = _model()
    res = an.nn.search(
        model, None, _score(model), formats=["e4m3fn", "bf16"], tolerance=10.0, sensitivity="measured"
    )
    assert res.formats() == {"0": "e4m3fn", "2": "bf16"}
    assert all(r["sqnr_db"] is None for r in res.table)


@pytest.mark.parametrize("budget", [2, 3, 4])
def test_the_budget_counts_every_evaluation(budget):
    model = _model()
    calls = []
    score = _score(model)
    res = an.nn.search(
        model,
        [(X, None)],
        lambda m: calls.append(1) or score(m),
        formats=["e2m1", "e4m3fn", "bf16"],
        tolerance=10.0,
        budget=budget,
    )
    assert len(calls) == res.evaluations <= budget
    assert res.log[0]["purpose"] == "reference" and res.log[-1]["purpose"] == "final"
    assert res.verified  # stopping early still returns a checked policy (possibly quantizing nothing)


def test_zero_tolerance_keeps_every_lossy_layer_wide():
    model = _model()
    res = an.nn.search(model, [(X, None)], _score(model), formats=["e2m1", "e4m3fn"], tolerance=0.0)
    assert res.formats() == {"0": None, "2": None} and res.bits_saved == 0
    assert res.score == res.reference


def test_result_renders(tmp_path):
    model = _model()
    res = an.nn.search(model, [(X, None)], _score(model), formats=["e4m3fn", "bf16"], tolerance=10.0)
    assert "| 2 | 27 | 2 | bf16 | 16 |" in res.table_text()
    assert res.rich_table().row_count == 2
    assert '"formats"' in res.to_json(tmp_path / "s.json")
    res.plot(tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"formats": []}, "non-empty"),
        ({"formats": "e4m3fn"}, "list"),
        ({"tolerance": -1.0}, "tolerance"),
        ({"budget": 1}, "budget"),
        ({"categories": ("gradient",)}, "categories"),
        ({"sensitivity": "magic"}, "sensitivity"),
        ({"layers": ["nope"]}, "nope"),
        ({"formats": ["no_such_format"]}, "no_such_format"),
    ],
)
def test_bad_input_is_an_anynum_error(kwargs, match):
    model = _model()
    args = {"formats": ["e4m3fn"], **kwargs}
    with pytest.raises(an.AnynumError, match=match):
        an.nn.search(model, [(X, None)], _score(model), **args)


def test_eval_fn_must_return_a_number_and_models_must_be_plain():
    model = _model()
    with pytest.raises(an.AnynumError, match="number"):
        an.nn.search(model, [(X, None)], lambda m: "high", formats=["e4m3fn"])
    with pytest.raises(an.AnynumError, match="not converted"):
        an.nn.search(
            an.nn.convert(_model(), an.nn.Policy(weight="bf16")),
            [(X, None)],
            _score(model),
            formats=["e4m3fn"],
        )
