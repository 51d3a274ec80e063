"""Checkpoints of stochastic training: a resumed run is bit-identical to the uninterrupted one.

A model with stochastic rounding everywhere (weights, biases, activations, errors, BatchNorm
buffers, an LSTM's gates, a `Quantizer` module) and a `QuantizedOptimizer` with stochastic
gradients, momentum, second moments and master weights train 3 steps, checkpoint through
``torch.save`` to a file, train 3 more. The checkpoint is loaded with ``weights_only=True``
into a model and optimizer built anew - in this process after scrambling every global
random state, and in a fresh Python process - and trained the same 3 steps: every
parameter, buffer, optimizer state, master weight and the loss scale equal the
uninterrupted run's bit for bit.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import anynum as an
from anynum.nn.streams import STREAM_KEY, CounterStream, StreamWarning, load_stream_state, stream_state

pytestmark = pytest.mark.usefixtures("eager_only")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.q = an.Quantizer(forward="bf16", backward="e5m2", forward_rounding="sr", backward_rounding="sr")
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.conv(x)).transpose(1, 2)  # (batch, time, channels)
        out, _ = self.lstm(h)
        return self.q(self.fc(out[:, -1]))  # at the end: its inputs and errors are not on a grid yet


def build(seed: int | None, device: str = "cpu") -> tuple[nn.Module, an.optim.QuantizedOptimizer]:
    """Model and optimizer with stochastic rounding in every category.

    ``seed=None``: the policy and optimizer seeds are drawn from torch's global generator at
    construction, so a rebuilt model starts on *different* streams unless the checkpoint
    restores them (the seed entries are tested too).
    """
    sr = lambda fmt: (fmt, "sr")  # noqa: E731
    policy = an.nn.Policy(
        weight=sr("e4m3fn"), bias=sr("bf16"), activation=sr("e4m3fn"), error=sr("e5m2"),
        buffer=sr("bf16"), seed=seed,
    )
    torch.manual_seed(0)
    model = an.nn.convert(Net().to(device), policy)
    opt = an.optim.QuantizedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01),
        weight=sr("bf16"), grad=sr("e5m2"), momentum=sr("bf16"), second_moment=sr("fp16"),
        accumulator=sr("fp16"), grad_scale="dynamic", seed=None if seed is None else seed + 1,
    )
    return model, opt


def train(model: nn.Module, opt: an.optim.QuantizedOptimizer, steps: range) -> None:
    device = next(model.parameters()).device
    for step in steps:
        g = torch.Generator().manual_seed(step)  # the data of step k, whoever runs it
        x, y = torch.randn(8, 2, 6, generator=g).to(device), torch.randn(8, 2, generator=g).to(device)
        opt.zero_grad()
        opt.scale_loss(nn.functional.mse_loss(model(x), y)).backward()
        opt.step()


def snapshot(model: nn.Module, opt: an.optim.QuantizedOptimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the training state, flattened to one dict of clones."""
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, st in enumerate(opt.optimizer.state.values()):
        for k, v in st.items():
            out[f"state.{i}.{k}"] = torch.as_tensor(v).clone()
    for i, m in enumerate(opt.master.values()):
        out[f"master.{i}"] = m.clone()
    out["scale"] = torch.tensor(opt.scale, dtype=torch.float64)
    return out


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        if a[k].is_floating_point():  # bit patterns: -0.0 vs 0.0 and NaN payloads count
            assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) if a[k].dim() else (
                a[k].item().hex() == b[k].item().hex()
            ), k
        else:
            assert torch.equal(a[k], b[k]), k


def save_checkpoint(path: Path, model: nn.Module, opt: an.optim.QuantizedOptimizer) -> None:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)


def resume(path: Path, seed: int | None, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Build everything anew, load the checkpoint (weights_only) and train steps 3..5."""
    model, opt = build(seed, device)
    ck = torch.load(path, weights_only=True)
    model.load_state_dict(ck["model"])  # strict: the stream entries are known keys
    opt.load_state_dict(ck["opt"])
    train(model, opt, range(3, 6))
    return snapshot(model, opt)


def uninterrupted(path: Path, seed: int | None, device: str = "cpu") -> dict[str, torch.Tensor]:
    model, opt = build(seed, device)
    train(model, opt, range(3))
    save_checkpoint(path, model, opt)
    train(model, opt, range(3, 6))
    return snapshot(model, opt)


NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [None, 5])
def test_resumed_run_is_bit_identical_in_process(tmp_path, seed, device):
    path = tmp_path / "ck.pt"
    want = uninterrupted(path, seed, device)
    torch.manual_seed(12345)  # global state unlike the first run's: the checkpoint must carry it all
    got = resume(path, seed, device)
    assert_bitwise_equal(got, want)
    if device == "cuda":
        ck = torch.load(path, weights_only=True)
        assert any(k.endswith(".state.cuda:0") for k in ck["model"])


def test_resumed_run_is_bit_identical_in_a_fresh_process(tmp_path):
    path, out = tmp_path / "ck.pt", tmp_path / "resumed.pt"
    want = uninterrupted(path, None)
    env = {**os.environ, "ANYNUM_COMPILE": "0"}
    src = str(Path(an.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, __file__, str(path), str(out)], check=True, env=env, timeout=300)
    assert_bitwise_equal(torch.load(out, weights_only=True), want)


@pytest.mark.parametrize(
    "drop",
    ["everything", "q._anynum_rng", "lstm._anynum_rng.activation", "bn._anynum_rng.buffer",
     "fc._anynum_rng.weight", "opt:grad", "opt:momentum", "opt:accumulator"],
)
def test_without_a_stream_the_run_differs(tmp_path, drop):
    """The controls: a checkpoint missing all streams (an old checkpoint) or any one of them
    still loads, strictly, but the continued run is not the uninterrupted one - each stream
    matters, so the tests above can fail."""
    path = tmp_path / "ck.pt"
    want = uninterrupted(path, None)
    ck = torch.load(path, weights_only=True)
    if drop == "everything":
        ck["model"] = {k: v for k, v in ck["model"].items() if STREAM_KEY not in k}
        del ck["opt"]["rng"]
    elif drop.startswith("opt:"):
        ck["opt"]["rng"] = {k: v for k, v in ck["opt"]["rng"].items() if not k.startswith(drop[4:] + ".")}
    else:
        ck["model"] = {k: v for k, v in ck["model"].items() if not k.startswith(drop + ".")}
    model, opt = build(None)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    train(model, opt, range(3, 6))
    got = snapshot(model, opt)
    assert any(not torch.equal(got[k], want[k]) for k in want if got[k].is_floating_point())


def test_state_dict_entries_are_flat_tensors_and_match_the_policy():
    model, opt = build(3)
    train(model, opt, range(1))
    sd = model.state_dict()
    streams = {k: v for k, v in sd.items() if STREAM_KEY in k}
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    assert "conv._anynum_rng.activation.seed" in streams
    assert "fc._anynum_rng.error.state.cpu" in streams  # (conv: its input needs no gradient)
    assert "q._anynum_rng.forward.state.cpu" in streams and "q._anynum_rng.backward.seed" in streams
    assert streams["bn._anynum_rng.buffer.state.cpu"].dtype == torch.uint8
    rng = opt.state_dict()["rng"]
    assert {"grad.seed", "momentum.state.cpu", "accumulator.state.cpu"} <= set(rng)
    # deterministic categories draw nothing and save nothing
    det = an.nn.convert(nn.Linear(2, 2), an.nn.Policy(weight="bf16", activation="e4m3fn"))
    assert not any(STREAM_KEY in k for k in det.state_dict())
    # restore removes the hooks with everything else (the Quantizer module is the user's own)
    an.nn.restore(model)
    assert [k for k in model.state_dict() if STREAM_KEY in k] == [
        "q._anynum_rng.forward.seed", "q._anynum_rng.forward.state.cpu",
        "q._anynum_rng.backward.seed", "q._anynum_rng.backward.state.cpu",
    ]


def test_streams_survive_deepcopy_and_load_into_unconverted_shapes():
    model, opt = build(4)
    train(model, opt, range(2))
    twin = copy.deepcopy(model)
    x = torch.randn(4, 2, 6)
    assert torch.equal(model(x), twin(x))  # the copy's streams are at the same position
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))


def test_stream_categories_not_stochastic_in_the_target_are_ignored():
    src = an.Quantizer(forward="bf16", forward_rounding="sr", seed=1)
    src(torch.rand(10))
    dst = an.Quantizer(forward="bf16")  # nearest: nothing draws, the entries are ignored
    dst.load_state_dict(src.state_dict())
    assert dst.state_dict() == {}


def test_a_missing_device_warns_and_keeps_the_rest():
    r = an.nn.Rounder("bf16", "sr", seed=1)
    saved = {**stream_state({"g": r}), "g.state.cuda:7": torch.zeros(16, dtype=torch.uint8)}
    if torch.cuda.device_count() > 7:  # pragma: no cover - an eight-GPU machine
        pytest.skip("device cuda:7 exists here")
    with pytest.warns(StreamWarning, match="cuda:7"):
        load_stream_state({"g": r}, saved)


def test_a_rounder_refuses_a_state_for_a_device_this_machine_lacks():
    """torch builds a generator for cuda:7 on a one-GPU machine without complaint (seen on an
    H200), so the device count is checked first, here as on a machine without CUDA."""
    r = an.nn.Rounder("bf16", "sr", seed=1)
    state = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(an.AnynumError, match=r"expected a device this machine has"):
        r.load_state_dict({f"cuda:{torch.cuda.device_count()}": state})
    assert r.state_dict() == {}  # nothing half-loaded


def test_bad_stream_entries_raise():
    r = an.nn.Rounder("bf16", "sr", seed=1)
    with pytest.raises(an.AnynumError, match="cannot read the random-stream entry"):
        load_stream_state({"g": r}, {"g.bogus": torch.tensor(1)})
    with pytest.raises(an.AnynumError, match="uint8"):
        load_stream_state({"g": r}, {"g.state.cpu": torch.zeros(3)})
    with pytest.raises(an.AnynumError, match="integer"):
        load_stream_state({"g": r}, {"g.seed": torch.tensor(1.5)})
    opt = an.optim.QuantizedOptimizer(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))
    with pytest.raises(an.AnynumError, match=r"opt\.optimizer\.load_state_dict"):
        opt.load_state_dict(opt.optimizer.state_dict())


def test_old_optimizer_rng_layout_still_loads():
    """anynum 0.1 optimizers saved ``rng = {category: {device: state}}``."""
    a = an.nn.Rounder("e5m2", "sr", seed=1)
    a(torch.rand(5))
    b = an.nn.Rounder("e5m2", "sr", seed=2)
    load_stream_state({"grad": b}, {"grad": a.state_dict()})
    x = torch.rand(50)
    assert torch.equal(a(x), b(x))


def test_counter_stream_round_trip():
    s = CounterStream(9)
    s.advance()
    t = CounterStream(0)
    load_stream_state({"comm": t}, stream_state({"comm": s}))
    assert (t.seed, t.calls) == (9, 1) and t.derive("x", 2) == s.derive("x", 2) != s.derive("x", 3)


def test_seeds_beyond_int64_are_stored_mod_2_64():
    r = an.nn.Rounder("bf16", "sr", seed=2**63 + 5)
    x = torch.rand(20)
    saved = stream_state({"g": r})
    assert saved["g.seed"].dtype == torch.int64
    fresh = an.nn.Rounder("bf16", "sr", seed=1)
    load_stream_state({"g": fresh}, saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(fresh(x), r(x))  # torch reads seeds mod 2**64


def _main(path: str, out: str) -> None:
    """Run in a fresh process: resume from `path`, save the final state to `out`."""
    torch.manual_seed(999)
    torch.save(resume(Path(path), None), out)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
