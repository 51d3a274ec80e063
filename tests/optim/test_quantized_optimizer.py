"""QuantizedOptimizer: step semantics against a hand-written reference, states, scaling, checkpoints."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import anynum as an

# Eager kernels: in auto mode, training loops here would reach ANYNUM_COMPILE_MIN elements per
# kernel and compile it (routing: tests/nn/test_quantizer.py; fused = eager: tests/kernels).
pytestmark = pytest.mark.usefixtures("eager_only")

bf16 = lambda t: t.bfloat16().float()  # noqa: E731
e5m2 = lambda t: t.to(torch.float8_e5m2).float()  # noqa: E731
fp16 = lambda t: t.half().float()  # noqa: E731


def test_sgd_momentum_step_matches_a_hand_written_reference():
    torch.manual_seed(0)
    w0 = torch.randn(50)
    w = nn.Parameter(w0.clone())
    opt = an.optim.QuantizedOptimizer(
        torch.optim.SGD([w], lr=0.1, momentum=0.9), weight="bf16", grad="e5m2", momentum="fp16"
    )
    ref_w, buf = w0.clone(), None
    for _ in range(3):
        g = torch.randn(50)
        w.grad = g.clone()
        opt.step()
        gq = e5m2(g)
        # The same fp32 primitives torch's SGD uses; the rounding points are what is tested:
        # the step uses the fresh buffer, which is stored rounded after the step (as OptimLP).
        raw = gq.clone() if buf is None else buf.mul(0.9).add(gq)
        ref_w = bf16(ref_w.add(raw, alpha=-0.1))
        buf = fp16(raw)
        assert torch.equal(w.detach(), ref_w)
        assert torch.equal(opt.state[w]["momentum_buffer"], buf)


@pytest.mark.parametrize(
    "cls",
    [
        "QuantizedSGD",
        "QuantizedAdam",
        "QuantizedAdamW",
        "QuantizedRMSprop",
        "QuantizedAdagrad",
        "QuantizedAdadelta",
    ],
)
def test_every_state_tensor_and_weight_lands_on_its_grid(cls):
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    kwargs = {"lr": 0.01}
    if cls == "QuantizedSGD":
        kwargs["momentum"] = 0.9
    if cls == "QuantizedRMSprop":
        kwargs.update(momentum=0.5, centered=True)
    if cls == "QuantizedAdam":
        kwargs["amsgrad"] = True
    opt = getattr(an.optim, cls)(model.parameters(), fmt="bf16", formats={"second_moment": "fp16"}, **kwargs)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        opt.step()
    states = [k for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert states
    checks = list(opt.grid_checks())
    assert {name.split(".")[-1] for name, kind, *_ in checks if kind == "optimizer state"} == set(states)
    for name, _, tensor, rounder in checks:
        assert bool(rounder.on_grid(tensor).all()), name
        expected = bf16 if rounder.fmt == an.BF16 else fp16
        assert torch.equal(tensor, expected(tensor)), name


def test_unknown_state_tensor_raises_with_the_fix():
    w = nn.Parameter(torch.ones(3))
    opt = an.optim.QuantizedOptimizer(torch.optim.ASGD([w], lr=0.1), momentum="bf16")
    w.grad = torch.ones(3)
    with pytest.raises(an.AnynumError, match=r"state=\{'(eta|mu|ax)'"):
        opt.step()
    ok = an.optim.QuantizedOptimizer(
        torch.optim.ASGD([w], lr=0.1), momentum="bf16", state={"eta": None, "mu": None, "ax": "bf16"}
    )
    ok.step()
    assert torch.equal(ok.state[w]["ax"], bf16(ok.state[w]["ax"]))


def test_master_weights_accumulate_small_updates():
    w_plain = nn.Parameter(torch.ones(4))
    w_master = nn.Parameter(torch.ones(4))
    plain = an.optim.QuantizedOptimizer(torch.optim.SGD([w_plain], lr=1e-3), weight="e4m3fn")
    master = an.optim.QuantizedOptimizer(
        torch.optim.SGD([w_master], lr=1e-3), weight="e4m3fn", accumulator="fp32"
    )
    for _ in range(40):
        w_plain.grad = torch.ones(4)
        w_master.grad = torch.ones(4)
        plain.step()
        master.step()
    assert torch.equal(w_plain.detach(), torch.ones(4))  # each update is below half an e4m3 step
    assert torch.equal(w_master.detach(), torch.full((4,), 0.9375))  # 1 - 0.04 rounds to 0.9375
    assert torch.allclose(master.master[w_master], torch.full((4,), 0.96), atol=1e-6)


def test_static_loss_scaling_unscales_exactly_and_requires_scale_loss():
    torch.manual_seed(0)
    x = torch.randn(8, 5)
    results = []
    for scale in (1.0, 2.0**10):
        torch.manual_seed(1)
        m = nn.Linear(5, 2)
        opt = an.optim.QuantizedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), grad_scale=scale)
        opt.scale_loss(m(x).pow(2).mean()).backward()
        opt.step()
        results.append(m.weight.detach().clone())
    assert torch.equal(results[0], results[1])
    m.weight.grad = torch.ones_like(m.weight)
    with pytest.raises(an.AnynumError, match="scale_loss"):
        opt.step()


def test_static_scaling_rescues_gradients_below_the_grad_format():
    w = nn.Parameter(torch.zeros(3))
    plain = an.optim.QuantizedOptimizer(torch.optim.SGD([w], lr=1.0), grad="e4m3fn")
    w.grad = torch.full((3,), 1e-4)  # below e4m3fn's smallest subnormal (2**-9)
    plain.scale_loss(torch.tensor(1.0))
    plain.step()
    assert torch.equal(w.detach(), torch.zeros(3))
    scaled = an.optim.QuantizedOptimizer(torch.optim.SGD([w], lr=1.0), grad="e4m3fn", grad_scale=2.0**12)
    w.grad = torch.full((3,), 1e-4) * 2.0**12
    scaled.scale_loss(torch.tensor(1.0))
    scaled.step()
    assert torch.allclose(w.detach(), torch.full((3,), -1e-4), rtol=0.07)


def test_dynamic_scaling_skips_and_backs_off_also_for_saturating_formats():
    w = nn.Parameter(torch.ones(3))
    scaler = an.optim.DynamicLossScale(init=2.0**4, interval=2)
    opt = an.optim.QuantizedOptimizer(torch.optim.SGD([w], lr=0.1), grad="e4m3fn", grad_scale=scaler)
    for grad, skipped, scale in (
        (float("inf"), True, 8.0),  # non-finite
        (500.0, True, 4.0),  # finite, but beyond e4m3fn's max 448: would saturate
        (4.0, False, 4.0),
        (4.0, False, 8.0),  # two clean steps: grow
    ):
        w.grad = torch.full((3,), grad)
        opt.scale_loss(torch.tensor(0.0))
        before = w.detach().clone()
        opt.step()
        assert opt.skipped_last_step is skipped
        assert torch.equal(w.detach(), before) is skipped
        assert opt.scale == scale
    assert scaler.skipped == 2


def test_checkpoint_round_trip_is_bit_exact_with_stochastic_rounding():
    def make():
        torch.manual_seed(0)
        m = an.nn.convert(
            nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
            an.nn.Policy(weight="bf16", activation="bf16", error="e5m2"),
        )
        o = an.optim.QuantizedOptimizer(
            torch.optim.Adam(m.parameters(), lr=0.01),
            weight="bf16",
            grad=("e5m2", "sr"),
            momentum="bf16",
            accumulator="fp16",
            grad_scale="dynamic",
            seed=9,
        )
        return m, o

    def steps(m, o, n, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(n):
            o.zero_grad()
            o.scale_loss(m(torch.randn(16, 4, generator=g)).pow(2).mean()).backward()
            o.step()

    a, oa = make()
    steps(a, oa, 3, 0)
    buf = io.BytesIO()
    torch.save({"model": a.state_dict(), "opt": oa.state_dict()}, buf)
    steps(a, oa, 2, 1)
    buf.seek(0)
    ck = torch.load(buf, weights_only=False)
    b, ob = make()
    b.load_state_dict(ck["model"])
    ob.load_state_dict(ck["opt"])
    steps(b, ob, 2, 1)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    assert oa.scale == ob.scale
    for p, q in zip(oa.master.values(), ob.master.values()):
        assert torch.equal(p, q)


def test_wrapping_a_non_optimizer_and_bad_scales_raise():
    with pytest.raises(an.AnynumError, match=r"torch\.optim\.Optimizer"):
        an.optim.QuantizedOptimizer(object())
    w = [nn.Parameter(torch.ones(1))]
    with pytest.raises(an.AnynumError, match="grad_scale"):
        an.optim.QuantizedOptimizer(torch.optim.SGD(w, lr=0.1), grad_scale=-1.0)
    with pytest.raises(an.AnynumError, match="categories"):
        an.optim.QuantizedSGD(w, lr=0.1, formats={"velocity": "bf16"})


def test_round_in_place_rounds_one_concatenated_stream_whatever_the_layout():
    """Mixed shapes, a transposed and a channels-last tensor, stochastic rounding: every tensor gets
    the values of one quantize call over the row-major concatenation (one random stream)."""
    from anynum.nn.quantizer import Rounder
    from anynum.optim.optimizer import round_in_place

    g = torch.Generator().manual_seed(1)
    tensors = [
        torch.randn(5, 7, generator=g).t(),  # non-contiguous
        torch.randn(2, 3, 4, 4, generator=g).to(memory_format=torch.channels_last),
        torch.randn(9, generator=g),
        torch.randn(0, generator=g),  # empty: skipped
        torch.randn(3, 1, generator=g, dtype=torch.float64),  # its own group (dtype)
    ]
    rounder = Rounder("e4m3fn", "sr", seed=3)
    state = torch.Generator()
    state.set_state(rounder.generator(torch.device("cpu")).get_state())
    flat = torch.cat([t.reshape(-1) for t in tensors[:3]])
    expected = an.quantize(flat, "e4m3fn", "sr", generator=state).split([t.numel() for t in tensors[:3]])
    expected_f64 = an.quantize(tensors[4], "e4m3fn", "sr", generator=state)
    strides = [t.stride() for t in tensors]
    originals = [t.clone() for t in tensors]
    round_in_place(tensors, rounder)
    for t, e in zip(tensors[:3], expected):
        assert torch.equal(t.reshape(-1), e)
    assert torch.equal(tensors[4], expected_f64)
    assert [t.stride() for t in tensors] == strides  # rounded in place, layout kept
    # A reused staging buffer (as QuantizedOptimizer keeps) gives the same values call after call.
    staging: dict = {}
    for _ in range(2):
        for t, o in zip(tensors, originals):
            t.copy_(o)
        state.set_state(rounder.generator(torch.device("cpu")).get_state())
        again = an.quantize(flat, "e4m3fn", "sr", generator=state).split([t.numel() for t in tensors[:3]])
        round_in_place(tensors, rounder, staging)
        assert all(torch.equal(t.reshape(-1), e) for t, e in zip(tensors[:3], again))
    assert len(staging) == 1
