"""an.EmulatedTensor / an.as_format: packed storage, ops, optimizers, state_dict round trips."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import anynum as an
from anynum.experiments.models import LeNet5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    ("fmt", "dtype", "per_element"),
    [
        ("posit(16,2)", torch.int16, 2.0),
        ("bf16", torch.int16, 2.0),
        ("e4m3fn", torch.uint8, 1.0),
        ("posit(8,0)", torch.uint8, 1.0),
        ("e2m1", torch.uint8, 0.5),
        ("int4", torch.uint8, 0.5),
        ("posit(32,2)", torch.int32, 4.0),
        ("fp32", torch.int32, 4.0),
        ("e3m2", torch.uint8, 1.0),
    ],
)
def test_storage_dtypes_and_bytes(fmt, dtype, per_element):
    x = torch.randn(6, 10)
    t = an.as_format(x, fmt)
    assert t.codes.dtype == dtype
    assert t.codes.element_size() * t.codes.numel() == int(per_element * x.numel())
    assert torch.equal(t.float(), an.quantize(x.double(), fmt).to(t.dtype).float())


def test_block_format_stores_elements_and_scales():
    x = torch.randn(4, 64)
    t = an.as_format(x, "mxfp4_e2m1")
    assert t.codes.dtype == torch.uint8 and t.codes.numel() == 4 * 64 // 2  # two e2m1 codes per byte
    assert t.scales is not None and t.scales.numel() == 4 * 2  # one E8M0 scale per 32 elements
    assert t.nbytes_stored == 4 * 64 // 2 + 8
    assert torch.equal(t.float(), an.quantize(x, an.MXFP4_E2M1))
    n = an.as_format(x, "nvfp4")
    assert n.nbytes_stored == 4 * 64 // 2 + 4 * 4 + 4  # elements, UE4M3 per 16, FP32 tensor scale


def test_model_memory_halves_for_posit16_and_eighths_for_e2m1():
    fp32 = sum(p.numel() * 4 for p in LeNet5().parameters())
    p16 = an.as_format(LeNet5(), "posit(16,2)")
    assert sum(p.nbytes_stored for p in p16.parameters()) == fp32 // 2
    e2 = an.as_format(LeNet5(), "e2m1")
    held = sum(p.nbytes_stored for p in e2.parameters())
    assert held <= fp32 // 8 + len(list(e2.parameters()))  # odd sizes pad one nibble
    mx = an.as_format(LeNet5(), "mxfp4_e2m1")
    held_mx = sum(p.nbytes_stored for p in mx.parameters())
    assert fp32 // 8 < held_mx < fp32 // 4  # plus one scale byte per block


def test_ops_stay_in_the_format_and_match_emulate():
    a = an.as_format(torch.randn(3, 5), "posit(16,2)")
    b = torch.randn(5, 2)  # a plain tensor: the result takes a's format
    y = F.relu(a @ b) + 1
    assert isinstance(y, an.EmulatedTensor) and y.format == an.Posit(16, 2)
    with an.emulate("posit(16,2)"):
        want = F.relu(a.float() @ b) + 1
    assert torch.equal(y.float(), want)
    assert not isinstance(a.float(), an.EmulatedTensor) and a.double().dtype == torch.float64
    assert a.format.canonical_name in repr(a) and "posit16" in repr(a)


def test_views_share_codes_and_inplace_writes_through():
    t = an.as_format(torch.zeros(4, 4), "bf16")
    row = t[1]
    row.add_(1.5)
    assert t.float()[1].tolist() == [1.5] * 4 and t.float()[0].tolist() == [0.0] * 4
    assert isinstance(t.T, an.EmulatedTensor) and t.T.codes.data_ptr() == t.codes.data_ptr()


def test_mixing_formats_is_refused():
    a = an.as_format(torch.ones(2), "bf16")
    b = an.as_format(torch.ones(2), "fp16")
    with pytest.raises(an.AnynumError, match="mixes"):
        torch.add(a, b)


def _train(model, steps=3, opt_cls=torch.optim.Adam, **kw):
    torch.manual_seed(1)
    opt = opt_cls(model.parameters(), lr=1e-2, **kw)
    x, y = torch.randn(4, 1, 32, 32), torch.randint(0, 10, (4,))
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.SGD])
def test_optimizer_updates_parameters_in_the_format(opt_cls):
    torch.manual_seed(0)
    m = an.as_format(LeNet5(), "posit(16,2)")
    before = [p.float().clone() for p in m.parameters()]
    kw = {"momentum": 0.9} if opt_cls is torch.optim.SGD else {}
    opt = _train(m, opt_cls=opt_cls, **kw)
    for p, b in zip(m.parameters(), before):
        assert isinstance(p, an.EmulatedTensor) and isinstance(p, nn.Parameter)
        assert isinstance(p.grad, an.EmulatedTensor)
        assert not torch.equal(p.float(), b)
    for state in opt.state.values():
        for v in state.values():
            if v.is_floating_point() and v.dim():
                assert isinstance(v, an.EmulatedTensor)


def test_as_format_training_equals_emulate_training():
    """The thesis's model.type(posit16es2) and the emulation mode compute the same numbers."""
    torch.manual_seed(0)
    a = LeNet5()
    b = LeNet5()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        for p in b.parameters():
            p.copy_(an.quantize(p, "posit(16,2)"))
    an.as_format(a, "posit(16,2)")
    _train(a, opt_cls=torch.optim.SGD)
    with an.emulate("posit(16,2)"):
        _train(b, opt_cls=torch.optim.SGD)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa.float(), pb.detach())


def test_state_dict_and_optimizer_round_trip_bit_exact():
    torch.manual_seed(0)
    m = an.as_format(LeNet5(), "posit(16,2)")
    opt = _train(m)
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)  # format records are name strings: no pickled classes
    assert isinstance(sd["model"]["features.0.weight"], an.EmulatedTensor)
    assert sd["model"]["features.0.weight"].format == an.Posit(16, 2)
    m2 = an.as_format(LeNet5(), "posit(16,2)")
    m2.load_state_dict(sd["model"])
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    opt2.load_state_dict(sd["opt"])
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p.codes, q.codes)
    for s1, s2 in zip(opt.state.values(), opt2.state.values()):
        for k in s1:
            assert isinstance(s2[k], type(s1[k])) and torch.equal(s1[k].float(), s2[k].float())
    x, y = torch.randn(4, 1, 32, 32), torch.randint(0, 10, (4,))
    for model, o in ((m, opt), (m2, opt2)):  # both continue identically
        o.zero_grad()
        F.cross_entropy(model(x), y).backward()
        o.step()
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p.codes, q.codes)


def test_buffers_convert_and_integers_stay():
    m = nn.BatchNorm1d(3)
    an.as_format(m, "bf16")
    assert isinstance(m.running_mean, an.EmulatedTensor)
    assert m.num_batches_tracked.dtype == torch.int64 and not isinstance(
        m.num_batches_tracked, an.EmulatedTensor
    )


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: an.as_format(torch.ones(2), "fp64"), "at most 32 bits"),
        (lambda: an.as_format(torch.ones(2, dtype=torch.int64), "bf16"), "floating tensor"),
        (lambda: an.as_format([1.0], "bf16"), "torch tensor or nn.Module"),
        (lambda: an.as_format(torch.ones(2), 16), "Format or format name"),
        (lambda: an.as_format(torch.ones(2), "posit(8,0)", accumulate="quire", order=0), "k >= 1"),
        (lambda: an.as_format(torch.ones(2), "bf16", accumulate="quire"), "Posit"),
    ],
)
def test_bad_input(call, needle):
    with pytest.raises(an.AnynumError, match=needle):
        call()
