"""diagnose and observe: every statistic against a hand computation, observers that change nothing
(bit for bit, random streams included), the loss-scale advice checked by applying it, bad input."""

from __future__ import annotations

import copy
import json
import math
from fractions import Fraction

import pytest
import torch
from torch import nn

import anynum as an
from anynum.nn.diagnose import predicted_underflow
from anynum.nn.hooks import layer_state
from anynum.nn.observe import Probe
from anynum.nn.stats import Stats

pytestmark = pytest.mark.usefixtures("eager_only")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def db(ratio: Fraction) -> float:
    return 10 * math.log10(ratio)


# --- Stats against hand computations ---------------------------------------------------------


def test_range_fractions_and_histogram_e5m2():
    # e5m2: smallest subnormal 2^-16, smallest normal 2^-14, max 57344, overflow to inf.
    x = torch.tensor([0.0, 2**-18, 2**-17, 1.5 * 2**-17, 2**-15, 2**-14, 3.0, -1e6, math.nan, math.inf])
    y = an.quantize(x, an.E5M2)
    # 2^-18 and the tie 2^-17 flush to zero; 1.5*2^-17 -> 2^-16 and 2^-15 are subnormal results.
    assert y[1:6].tolist() == [0.0, 0.0, 2**-16, 2**-15, 2**-14]
    s = Stats(an.E5M2)
    s.add(x, y)
    r = s.summary()
    assert (r["count"], r["nonzero"], r["nan"]) == (10, 8, 1)  # nonzero: neither 0 nor NaN
    assert r["overflow"] == 2 / 8  # -1e6 and inf are beyond 57344
    assert r["underflow"] == 2 / 8
    assert r["subnormal"] == 2 / 8
    assert r["max_abs"] == math.inf
    assert r["sqnr_db"] == -math.inf  # -1e6 became -inf: infinite noise
    assert r["log2_hist"] == {-18: 1, -17: 2, -15: 1, -14: 1, 1: 1, 19: 1}  # finite nonzero inputs


def test_sqnr_and_relative_error_formulas_with_given_results():
    s = Stats(an.E2M1)
    s.add(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]))
    s.add(torch.tensor([-2.0, 0.0]), torch.tensor([-1.5, 0.0]))  # folding two calls = one call
    r = s.summary()
    signal, noise = Fraction(1 + 9 + 4), Fraction(0 + 1, 1) + Fraction(1, 4)
    assert r["sqnr_db"] == pytest.approx(db(signal / noise), rel=1e-15)
    assert r["rel_err"] == pytest.approx(float((0 + Fraction(1, 3) + Fraction(1, 4)) / 3), rel=1e-15)
    assert (r["overflow"], r["underflow"], r["subnormal"]) == (0.0, 0.0, 0.0)
    assert r["sr_rel_var"] is None and r["stagnation"] is None


def test_exact_results_give_infinite_sqnr_and_all_zeros_no_signal():
    s = Stats(an.BF16)
    s.add(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))
    assert s.summary()["sqnr_db"] == math.inf
    z = Stats(an.BF16)
    z.add(torch.zeros(3), torch.zeros(3))
    assert math.isnan(z.summary()["sqnr_db"]) and z.summary()["nonzero"] == 0


def test_stochastic_rounding_variance_is_exact_from_the_neighbours():
    # e2m1 neighbours: 1.25 in [1, 1.5], 2.5 in [2, 3], 5 in [4, 6], 0.75 in [0.5, 1]; 1 is exact.
    x = torch.tensor([1.25, 2.5, 5.0, 0.75, 1.0])
    s = Stats(an.E2M1, "sr")
    s.add(x, an.quantize(x, an.E2M1, "sr", seed=0))
    var = Fraction(1, 16) + Fraction(1, 4) + 1 + Fraction(1, 16)
    signal = Fraction(25, 16) + Fraction(25, 4) + 25 + Fraction(9, 16) + 1
    assert var / signal == Fraction(1, 25)
    assert s.summary()["sr_rel_var"] == pytest.approx(0.04, rel=1e-15)


def test_stochastic_rounding_variance_matches_the_draws():
    # 1.125 in [1, 1.5] goes up with p = 1/4: E[(SR(x) - x)^2] = (x - lo)(hi - x) = 3/64.
    n = 40_000
    x = torch.full((n,), 1.125)
    y = an.quantize(x, an.E2M1, "sr", seed=1)
    sq = (y - x).double() ** 2
    exact = 3 / 64
    sd = math.sqrt(0.25 * 0.375**4 + 0.75 * 0.125**4 - exact**2)
    assert abs(float(sq.mean()) - exact) < 5 * sd / math.sqrt(n)
    s = Stats(an.E2M1, "sr")
    s.add(x, y)
    assert s.summary()["sr_rel_var"] == pytest.approx(exact / 1.125**2, rel=1e-12)


def test_candidate_sqnr():
    x = torch.tensor([1.25, 3.0])  # e2m1 round to nearest: 1.25 is a tie -> 1.0 (even code), 3.0 exact
    s = Stats(an.BF16, candidates=[("e2m1", an.E2M1), ("bf16", an.BF16)])
    s.add(x, x)
    c = s.summary()["candidates"]
    assert c["e2m1"] == pytest.approx(db(Fraction(169, 16) / Fraction(1, 16)), rel=1e-15)
    assert c["bf16"] == math.inf


def test_update_stagnation_and_lost_updates_bf16():
    # bf16 at 1: ulp 2^-7; at 4: ulp 2^-5. Weights off the grid before the step are not counted.
    before = torch.tensor([1.0, 1.0, 4.0, 2.0, 1 + 2**-12])
    u = torch.tensor([2**-10, 2**-7, 2**-6, 0.0, 2**-7])
    x = before + u
    y = an.quantize(x, an.BF16)
    # 1 + 2^-10 is lost (and below half an ulp); 4 + 2^-6 is a tie that rounds back to 4 (lost,
    # but not below half an ulp); 1 + 2^-7 survives; u = 0 is no update.
    assert y[:3].tolist() == [1.0, 1 + 2**-7, 4.0]
    s = Stats(an.BF16)
    s.add_update(before, x, y)
    r = s.summary()
    assert r["nonzero"] == 3
    assert r["stagnation"] == 1 / 3
    assert r["lost"] == 2 / 3
    signal = Fraction(1, 2**20) + Fraction(1, 2**14) + Fraction(1, 2**12)
    noise = Fraction(1, 2**20) + Fraction(1, 2**12)
    assert r["sqnr_db"] == pytest.approx(db(signal / noise), rel=1e-12)
    assert r["rel_err"] == pytest.approx(2 / 3, rel=1e-15)
    assert r["underflow"] is None and r["subnormal"] is None


def test_predicted_underflow_equals_the_measured_one_after_scaling():
    torch.manual_seed(0)
    x = torch.randn(4000) * torch.exp2(torch.randint(-30, 0, (4000,)).float())
    s = Stats(an.E5M2)
    s.add(x, an.quantize(x, an.E5M2))
    row = {
        **s.summary(),
        "format": "e5m2",
        "rounding": "nearest",
        "smallest_normal": 2.0**-14,
        "smallest_subnormal": 2.0**-16,
    }
    for k in (0, 3, 8, 13):
        scaled = x * 2.0**k
        measured = float(((scaled != 0) & (an.quantize(scaled, an.E5M2) == 0)).sum()) / float((x != 0).sum())
        assert predicted_underflow(row, k) == pytest.approx(measured, abs=1e-12)


# --- observers --------------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


POLICY = an.nn.Policy(weight="e4m3fn", activation=("e4m3fn", "sr"), error=("e5m2", "sr"), seed=3)


def _optimizer(params, **kw):
    return an.optim.QuantizedOptimizer(
        torch.optim.SGD(params, lr=0.05, momentum=0.9),
        grad=("e5m2", "sr"),
        momentum="bf16",
        weight=("e4m3fn", "sr"),
        seed=5,
        **kw,
    )


def _batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def _train(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        opt.scale_loss(nn.functional.cross_entropy(model(x), y)).backward()
        opt.step()


def test_observers_change_nothing_bit_for_bit_and_are_removed():
    plain = an.nn.convert(_model(), POLICY)
    watched = an.nn.convert(_model(), POLICY)
    opt_a, opt_b = _optimizer(plain.parameters()), _optimizer(watched.parameters())
    data = _batches()
    _train(plain, opt_a, data)
    with an.nn.observe(watched, opt_b, candidates=["e3m2", "bf16"]) as obs:
        _train(watched, opt_b, data)
    for (na, a), (nb, b) in zip(plain.state_dict().items(), watched.state_dict().items()):
        assert na == nb and torch.equal(a, b), na
    for a, b in zip(opt_a.optimizer.state.values(), opt_b.optimizer.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    x = torch.randn(5, 6)
    assert torch.equal(plain(x), watched(x))  # the streams advanced alike, too
    keys = {(r["layer"], r["category"]) for r in obs.rows()}
    assert {
        ("0", "weight"),
        ("2", "error"),
        ("4", "gradient"),
        ("4", "state:momentum_buffer"),
        ("0", "update"),
    } <= keys
    assert opt_b.observer is None
    for module in watched.modules():
        state = layer_state(module)
        hooks = state.hooks if state is not None else ()
        assert not any(isinstance(getattr(h, a, None), Probe) for h in hooks for a in ("fwd", "bwd"))


def test_observers_inside_lstm_and_attention_change_nothing():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 8, batch_first=True)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            h, _ = self.lstm(x)
            return self.attn(h, h, h)[0].sum()

    torch.manual_seed(1)
    base = Net()
    a = an.nn.convert(copy.deepcopy(base), POLICY)
    b = an.nn.convert(copy.deepcopy(base), POLICY)
    x = torch.randn(2, 5, 4)
    a(x).backward()
    with an.nn.observe(b) as obs:
        b(x).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters()))
    keys = {(r["layer"], r["category"]) for r in obs.rows()}
    assert {("lstm", "activation"), ("lstm", "error"), ("attn", "weight"), ("attn", "gradient")} <= keys


def test_gradient_rows_without_an_optimizer_format_measure_against_the_error_format():
    model = an.nn.convert(_model(), an.nn.Policy(error="e5m2"))
    reference = copy.deepcopy(model)
    x, y = _batches(1)[0]
    with an.nn.observe(model) as obs:
        (2.0**-9 * nn.functional.cross_entropy(model(x), y)).backward()
    (2.0**-9 * nn.functional.cross_entropy(reference(x), y)).backward()
    rows = {(r["layer"], r["category"]): r for r in obs.rows()}
    for layer in ("2", "4"):
        grads = torch.cat([p.grad.flatten() for p in reference[int(layer)].parameters()])
        flushed = (grads != 0) & (an.quantize(grads, an.E5M2) == 0)
        assert 0 < flushed.sum() < (grads != 0).sum()
        assert rows[(layer, "gradient")]["underflow"] == float(flushed.sum()) / float((grads != 0).sum())
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))


def test_observe_refuses_an_unconverted_or_doubly_observed_model():
    with pytest.raises(an.AnynumError, match="converted"):
        an.nn.observe(_model())
    m = an.nn.convert(_model(), POLICY)
    with an.nn.observe(m), pytest.raises(an.AnynumError, match="already observed"):
        an.nn.observe(m)


# --- diagnose ---------------------------------------------------------------------------------


def test_diagnose_leaves_the_model_and_the_random_streams_alone():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    policy, data = an.nn.Policy(weight="e4m3fn", error=("e5m2", "sr")), _batches()
    torch.manual_seed(123)
    rep = an.nn.diagnose(model, policy, data, loss_fn=nn.functional.cross_entropy, optimizer=_optimizer)
    after_rng = torch.rand(1)
    torch.manual_seed(123)
    assert torch.equal(after_rng, torch.rand(1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not an.nn.converted_layers(model)
    assert rep.steps == 4 and rep.row("4", "update")["format"] == "e4m3fn"


def test_the_suggested_loss_scale_brings_underflow_below_one_percent():
    model = _model()
    data = _batches(3)
    tiny = lambda out, y: 2.0**-12 * nn.functional.cross_entropy(out, y)  # noqa: E731
    pol = an.nn.Policy(error="e5m2")

    def frozen(scale):  # lr 0: every batch sees the same weights, so runs compare
        return lambda ps: an.optim.QuantizedOptimizer(
            torch.optim.SGD(ps, lr=0.0), grad="e5m2", grad_scale=scale
        )

    rep = an.nn.diagnose(model, pol, data, loss_fn=tiny, optimizer=frozen(1.0))
    back = [r for r in rep.rows if r["category"] in ("error", "gradient")]
    silent = [r for r in back if r["nonzero"] == 0]  # everything flushed further down the backward pass
    assert silent and all(r["underflow"] is None for r in silent)
    assert {s.layer for s in rep.suggestions if s.message.startswith("no gradient reaches")} == {
        r["layer"] for r in silent
    }
    assert max(r["underflow"] for r in back if r["nonzero"]) > 0.1
    scale = rep.suggested_loss_scale
    assert scale is not None and scale > 1 and math.log2(scale).is_integer()
    again = an.nn.diagnose(model, pol, data, loss_fn=tiny, optimizer=frozen(scale))
    back = [r for r in again.rows if r["category"] in ("error", "gradient")]
    assert all(r["nonzero"] > 0 and r["underflow"] < 0.01 for r in back)
    assert all(r["overflow"] == 0 for r in again.rows)
    assert again.suggestions[0].message.startswith("no loss scale needed")


def test_suggestions_name_layers_to_keep_and_stagnation_and_formats():
    model = _model()
    with torch.no_grad():
        model[4].weight.mul_(1000.0)  # outputs of no concern; the weights overflow e2m1 (max 6)
    rep = an.nn.diagnose(
        model,
        an.nn.Policy(weight="e2m1"),
        _batches(2),
        loss_fn=nn.functional.cross_entropy,
        optimizer=lambda ps: an.optim.QuantizedOptimizer(torch.optim.SGD(ps, lr=1e-4), weight="e2m1"),
        candidates=["e2m1", "e4m3fn", "bf16"],
    )
    assert "4" in rep.layers_to_keep
    kinds = {s.kind for s in rep.suggestions}
    assert {"keep", "stagnation", "format"} <= kinds
    picks = {s.layer: s.value for s in rep.suggestions if s.kind == "format"}
    assert picks["0"]["weight"] in ("e4m3fn", "bf16")


def test_forward_only_diagnosis_and_converted_models():
    model = an.nn.convert(_model(), an.nn.Policy(weight="e3m2", activation="e3m2"))
    rep = an.nn.diagnose(model, None, _batches(2))
    assert {r["category"] for r in rep.rows} == {"weight", "bias", "activation"}
    assert math.isnan(rep.losses[0])
    with pytest.raises(an.AnynumError, match="already converted"):
        an.nn.diagnose(model, "e4m3fn", _batches(1))


def test_report_renders_as_table_csv_json_and_pngs(tmp_path):
    rep = an.nn.diagnose(
        _model(), "e4m3fn", _batches(2), loss_fn=nn.functional.cross_entropy, candidates=["e2m1", "bf16"]
    )
    doc = json.loads(rep.to_json(tmp_path / "r.json"))
    assert doc["steps"] == 2 and len(doc["rows"]) == len(rep.rows)
    assert all(isinstance(r["candidates"]["bf16"], (float, str)) for r in doc["rows"])
    lines = rep.to_csv(tmp_path / "r.csv").splitlines()
    assert lines[0].startswith("layer,category,format,rounding") and len(lines) == len(rep.rows) + 1
    assert rep.rich_table().row_count == len(rep.rows)
    assert str(rep).count("\n|") == len(rep.rows) + 2  # heading, rule, rows
    for name, plot in (("h.png", rep.plot_heatmap), ("g.png", rep.plot_histograms)):
        plot(tmp_path / name)
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"data": torch.zeros(3)}, "iterable of"),
        ({"data": [torch.zeros(2, 6)]}, "pairs"),
        ({"steps": 0}, "steps"),
        ({"optimizer": lambda ps: torch.optim.SGD(ps, lr=0.1)}, "loss_fn"),
        ({"data": []}, "no batch"),
        ({"policy_or_format": 3}, "Policy"),
        ({"policy_or_format": "no_such_format"}, "no_such_format"),
    ],
)
def test_bad_input_is_an_anynum_error(kwargs, match):
    args = {"policy_or_format": "e4m3fn", "data": _batches(1), **kwargs}
    with pytest.raises(an.AnynumError, match=match):
        an.nn.diagnose(_model(), args.pop("policy_or_format"), args.pop("data"), **args)
    with pytest.raises(an.AnynumError, match="Module"):
        an.nn.diagnose("model", "e4m3fn", _batches(1))
