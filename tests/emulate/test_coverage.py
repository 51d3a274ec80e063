"""Whole models under an.emulate: every floating result an op returns is on the grid (no float32 leak).

A recording TorchDispatchMode sits *inside* the emulation mode: it sees each op first, hands it
on (to the emulation mode, which computes it), and checks the floating outputs it gets back
with an independent rounding (an.quantize) before passing them on.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

import anynum as an
from anynum.experiments.models import LeNet5

pytestmark = pytest.mark.usefixtures("one_thread")


class OnGrid(TorchDispatchMode):
    """Checks that every floating output of every op is a value of `fmt`."""

    def __init__(self, fmt: an.Format):
        super().__init__()
        self.fmt = fmt
        self.ops: set[str] = set()
        self.off: list[str] = []
        self.checked = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket.__name__ in (
            "empty",
            "empty_like",
            "empty_strided",
            "new_empty",
        ):
            return out  # views compute nothing; empty is uninitialised memory, written before it is read
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                self.ops.add(str(func))
                self.checked += 1
                with _disable_current_modes():  # the check itself runs outside emulation
                    v = t.detach()
                    q = an.quantize(v.double(), self.fmt)
                    same = (q == v.double()) | torch.isnan(v)
                    if not bool(same.all()):
                        self.off.append(str(func))
        return out


def run(model: nn.Module, make_loss, fmt="posit(16,2)", opt=True, **kw) -> OnGrid:
    f = an.format(fmt)
    check = OnGrid(an.FP32 if isinstance(f, an.Block) else f)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) if opt else None
    with an.emulate(f, **kw), check:
        for _ in range(2):
            loss = make_loss()
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
    assert check.checked > 50
    assert not check.off, sorted(set(check.off))
    return check


def test_lenet5_forward_backward_adam():
    torch.manual_seed(0)
    m = LeNet5()
    x, y = torch.randn(4, 1, 32, 32), torch.randint(0, 10, (4,))
    check = run(m, lambda: F.cross_entropy(m(x), y))
    assert {
        "aten.convolution_backward.default",
        "aten.avg_pool2d_backward.default",
        "aten.tanh_backward.default",
        "aten.addcdiv_.default",
    } <= check.ops


@pytest.mark.parametrize("kw", [{"accumulate": "quire"}, {"accumulate": "posit(16,2)", "order": "pairwise"}])
def test_lenet5_with_accumulation(kw):
    torch.manual_seed(1)
    m = LeNet5()
    x, y = torch.randn(2, 1, 32, 32), torch.randint(0, 10, (2,))
    run(m, lambda: F.cross_entropy(m(x), y), **kw)


def test_transformer_encoder_layer():
    torch.manual_seed(2)
    m = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    x = torch.randn(2, 5, 16)
    run(m, lambda: m(x).square().mean(), fmt="bf16")


def test_lstm():
    torch.manual_seed(3)
    m = nn.LSTM(4, 8, num_layers=2, batch_first=True)
    x = torch.randn(3, 6, 4)
    run(m, lambda: m(x)[0].sum(), fmt="fp16")


def test_batchnorm_layernorm_cnn():
    torch.manual_seed(4)
    m = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.LayerNorm(36),
        nn.GELU(),
        nn.Dropout(0.2),
        nn.Linear(36, 3),
    )
    x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 3, (5,))
    check = run(m, lambda: F.cross_entropy(m(x), y), fmt="e4m3fn")
    assert {"aten.native_batch_norm_backward.default", "aten.native_layer_norm_backward.default"} <= check.ops
    # running statistics (buffers) are written under the mode too
    assert torch.equal(m[1].running_mean, an.quantize(m[1].running_mean, an.E4M3FN))


def test_block_format_cnn():
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(576, 3))
    x, y = torch.randn(3, 1, 14, 14), torch.randint(0, 3, (3,))
    run(m, lambda: F.cross_entropy(m(x), y), fmt="mxfp8_e4m3")


def test_gpt2_from_a_small_config():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
    m = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 50, (2, 8))
    check = run(m, lambda: m(input_ids=ids, labels=ids).loss, fmt="bf16")
    assert any("bmm" in op or "matmul" in op or "mm" in op for op in check.ops)
