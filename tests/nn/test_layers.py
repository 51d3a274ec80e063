"""Quantized layers: unquantized they equal torch's; quantized, every inner value is on the grid."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import anynum as an

# Eager kernels: in auto mode, training loops here would reach ANYNUM_COMPILE_MIN elements per
# kernel and compile it (routing: tests/nn/test_quantizer.py; fused = eager: tests/kernels).
pytestmark = pytest.mark.usefixtures("eager_only")


def on_grid(t: torch.Tensor, dtype: torch.dtype) -> bool:
    t = t.detach()
    return bool(torch.equal(t, t.to(dtype).float()))


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_recurrent_without_policy_equals_torch(cls, batch_first):
    torch.manual_seed(0)
    ref = getattr(nn, cls)(3, 5, num_layers=2, bidirectional=True, batch_first=batch_first)
    ours = getattr(an.nn, cls).from_module(ref)
    assert all(p is q for p, q in zip(ref.parameters(), ours.parameters()))
    x = torch.randn(4, 6, 3)
    if cls == "LSTM":
        hx = (torch.randn(4, 4 if batch_first else 6, 5), torch.randn(4, 4 if batch_first else 6, 5))
    else:
        hx = torch.randn(4, 4 if batch_first else 6, 5)
    a, ha = ref(x, hx)
    b, hb = ours(x, hx)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for u, v in zip(ha if cls == "LSTM" else (ha,), hb if cls == "LSTM" else (hb,)):
        torch.testing.assert_close(v, u, rtol=1e-5, atol=1e-6)
    b.sum().backward()
    assert ref.weight_hh_l1_reverse.grad is not None


def test_unbatched_input():
    torch.manual_seed(0)
    ref = nn.GRU(3, 4)
    ours = an.nn.GRU.from_module(ref)
    x = torch.randn(5, 3)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])


def test_lstm_quantization_acts_inside_the_recurrence():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 8)
    pol = an.nn.Policy(weight="e4m3fn", activation="e4m3fn")
    ours = an.nn.LSTM.from_module(ref, pol)
    x = torch.randn(6, 2, 4)
    out, (_, c) = ours(x)
    assert on_grid(out, torch.float8_e4m3fn) and on_grid(c, torch.float8_e4m3fn)
    # Rounding only the inputs, weights and outputs of the torch layer gives something else.
    q = lambda t: t.detach().to(torch.float8_e4m3fn).float()  # noqa: E731
    with torch.no_grad():
        outside = nn.LSTM(4, 8)
        for name, p in ref.named_parameters():
            getattr(outside, name).copy_(q(p))
        outer = q(outside(q(x))[0])
    assert not torch.equal(outer, out)


def test_error_quantization_inside_the_recurrence():
    torch.manual_seed(0)
    lstm = an.nn.LSTM(3, 4, policy=an.nn.Policy(error="e5m2"))
    x = torch.randn(5, 2, 3, requires_grad=True)
    lstm(x)[0].sum().backward()
    assert on_grid(x.grad, torch.float8_e5m2)


def test_proj_size_and_packed_sequences_raise():
    with pytest.raises(an.AnynumError, match="proj_size"):
        an.nn.LSTM(3, 4, proj_size=2)
    lstm = an.nn.LSTM(3, 4)
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 3), [5, 3])
    with pytest.raises(an.AnynumError, match="PackedSequence"):
        lstm(packed)


@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_without_policy_equals_torch(batch_first):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(8, 2, batch_first=batch_first, kdim=6, vdim=5)
    ours = an.nn.MultiheadAttention.from_module(ref)
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 7, 6), torch.randn(3, 7, 5)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[0, -2:] = True
    mask = torch.randn(4, 7)
    for kwargs in ({}, {"key_padding_mask": kpm, "attn_mask": mask}, {"average_attn_weights": False}):
        a, wa = ref(q, k, v, **kwargs)
        b, wb = ours(q, k, v, **kwargs)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(wb, wa, rtol=1e-5, atol=1e-6)


def test_attention_softmax_input_and_output_are_rounded():
    torch.manual_seed(0)
    pol = an.nn.Policy(weight="bf16", activation="e4m3fn")
    mha = an.nn.MultiheadAttention(8, 2, policy=pol)
    x = torch.randn(5, 3, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    _, w = mha(x, x, x, attn_mask=mask, average_attn_weights=False)
    assert on_grid(w, torch.float8_e4m3fn)
    assert bool((w[..., mask] == 0).all())  # masked entries stay exactly masked
    seen = []
    orig = torch.softmax

    def spy(t, dim):
        seen.append(t.detach())
        return orig(t, dim=dim)

    torch.softmax = spy
    try:
        mha(x, x, x)
    finally:
        torch.softmax = orig
    assert on_grid(seen[0], torch.float8_e4m3fn)


def test_add_bias_kv_raises():
    with pytest.raises(an.AnynumError, match="add_bias_kv"):
        an.nn.MultiheadAttention(4, 2, add_bias_kv=True)


@pytest.mark.parametrize(
    ("cls", "args", "shape"),
    [
        ("Linear", (4, 3), (2, 4)),
        ("Conv1d", (2, 3, 3), (2, 2, 9)),
        ("Conv2d", (2, 3, 3), (2, 2, 6, 6)),
        ("Conv3d", (2, 3, 3), (2, 2, 5, 5, 5)),
        ("BatchNorm1d", (4,), (3, 4)),
        ("BatchNorm2d", (2,), (3, 2, 4, 4)),
        ("BatchNorm3d", (2,), (3, 2, 3, 3, 3)),
        ("LayerNorm", (4,), (3, 4)),
        ("MaxPool1d", (2,), (2, 2, 8)),
        ("MaxPool2d", (2,), (2, 2, 8, 8)),
        ("MaxPool3d", (2,), (2, 2, 4, 4, 4)),
        ("AvgPool1d", (2,), (2, 2, 8)),
        ("AvgPool2d", (2,), (2, 2, 8, 8)),
        ("AvgPool3d", (2,), (2, 2, 4, 4, 4)),
    ],
)
def test_drop_in_layers_equal_torch_on_rounded_numbers(cls, args, shape):
    torch.manual_seed(0)
    pol = an.nn.Policy(weight="bf16", activation="bf16", activation_at="both")
    ours = getattr(an.nn, cls)(*args, policy=pol)
    torch.manual_seed(0)
    ref = getattr(nn, cls)(*args)
    assert isinstance(ours, getattr(nn, cls))
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.bfloat16().float())
    x = torch.randn(shape)
    y = ours(x)
    assert torch.equal(y, ref(x.bfloat16().float()).bfloat16().float())
    assert set(ours.state_dict()) >= {
        k.replace("weight", "parametrizations.weight.original") for k in ref.state_dict() if k == "weight"
    }
