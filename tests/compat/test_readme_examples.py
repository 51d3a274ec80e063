"""Pychop's README quick starts, run with only the import lines changed, against Pychop where it is correct.

Each snippet is Pychop's README code with ``pychop`` replaced by
``anynum.compat.pychop`` (matrices shrunk from 5000 x 5000 to keep the test
short). Where Pychop is installed, the results are compared with it; the
values differ only where docs/compat.md says Pychop is wrong.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch


def _pychop():
    try:
        import pychop
    except ImportError:
        return None
    return pychop


X = np.random.default_rng(0).standard_normal((300, 300))


def test_floating_point_quick_start():
    import anynum.compat.pychop as pychop
    from anynum.compat.pychop import Chop

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pychop.backend("numpy", 1)
    pychop.get_backend()
    ch = Chop(exp_bits=5, sig_bits=10, rmode=3)  # half precision
    X_q = ch(X)
    assert X_q.shape == X.shape and (X_q <= X).all()
    peer = _pychop()
    if peer is not None:
        assert np.array_equal(peer.Chop(exp_bits=5, sig_bits=10, rmode=3)(X), X_q)


def test_faultchop_and_customs_quick_start():
    from anynum.compat.pychop import Customs, FaultChop

    ch = FaultChop("h", flip=True)
    X_q = ch(X)
    assert X_q.shape == X.shape
    ct1 = Customs(exp_bits=5, sig_bits=10)
    a = FaultChop(customs=ct1, rmode=3)(X)
    ct2 = Customs(emax=15, t=11)
    b = FaultChop(customs=ct2, rmode=3)(X)
    assert np.array_equal(a, b)
    peer = _pychop()
    if peer is not None:
        assert np.array_equal(peer.FaultChop(customs=peer.Customs(emax=15, t=11), rmode=3)(X.copy()), b)
        # Pychop turns Customs(exp_bits=5) into emax 31, so its half precision has no subnormals below
        # 2**-14 (and overflows at 2**32): equal only in the real format's normal range
        normal = np.abs(X) >= 2.0**-14
        c = peer.FaultChop(customs=peer.Customs(exp_bits=5, sig_bits=10), rmode=3)(X.copy())
        assert np.array_equal(c[normal], a[normal]) and not np.array_equal(c, a)


def test_quantized_layers_quick_start():
    import torch.nn as nn

    from anynum.compat.pychop import ChopSTE
    from anynum.compat.pychop.layers import QuantizedLinear

    class MLP(nn.Module):
        def __init__(self, chop=None):
            super().__init__()
            self.flatten = nn.Flatten()
            self.fc1 = QuantizedLinear(256, 256, chop=chop)
            self.relu1 = nn.ReLU()
            self.dropout = nn.Dropout(0.2)
            self.fc2 = QuantizedLinear(256, 10, chop=chop)

        def forward(self, x):
            x = self.flatten(x)
            x = self.fc1(x)
            x = self.relu1(x)
            x = self.dropout(x)
            return self.fc2(x)

    torch.manual_seed(0)
    chop = ChopSTE(exp_bits=5, sig_bits=10, rmode=1)
    model = MLP(chop)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16, 16), torch.randint(0, 10, (32,))
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    out = model.eval()(x)
    assert torch.equal(out, out.half().float())


def test_fixed_point_and_integer_quick_starts():
    from anynum.compat.pychop import Chopf, Chopi

    ch = Chopf(ibits=4, fbits=4)
    X_q = ch(X)
    assert np.array_equal(X_q * 16, np.round(X_q * 16))
    Xs = np.array([[0.1, -0.2], [0.3, 0.4]])
    chi = Chopi(bits=8, symmetric=False)
    X_qi = chi.quantize(Xs)  # convert to integers
    X_dq = chi.dequantize(X_qi)  # convert back to floating points
    assert X_qi.dtype == np.int8 and np.abs(X_dq - Xs).max() <= 0.6 / 255 / 2 + 1e-12
    peer = _pychop()
    if peer is not None:
        assert np.array_equal(peer.Chopf(ibits=4, fbits=4)(X), X_q)


def test_import_anynum_compat_in_a_fresh_interpreter():
    import subprocess
    import sys

    code = (
        "import sys, anynum, anynum.compat as c; "
        "assert 'anynum.compat.qtorch' not in sys.modules; "
        "from anynum.compat import qtorch, pychop; "
        "assert anynum.compat.qtorch is qtorch and anynum.compat is anynum.__getattr__('compat'); "
        "assert not any(m.split('.')[0] in ('jax', 'dask', 'qtorch', 'pychop') for m in sys.modules); "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize(
    "make",
    [
        lambda: __import__("anynum.compat.pychop", fromlist=["x"]).Chopf(4, 4),
        lambda: __import__("anynum.compat.pychop", fromlist=["x"]).FaultChop("h"),
        lambda: __import__("anynum.compat.pychop", fromlist=["x"]).Chopi(8),
    ],
    ids=["Chopf", "FaultChop", "Chopi"],
)
def test_every_chopper_returns_the_input_kind(make):
    jnp = pytest.importorskip("jax.numpy")
    ch = make()
    x = np.array([0.3, -1.2, 2.5], dtype=np.float32)
    want = np.asarray(ch(x))
    for arr, kind in ((x, np.ndarray), (torch.from_numpy(x), torch.Tensor)):
        y = ch(arr)
        assert isinstance(y, kind) and np.array_equal(np.asarray(y), want)
    y = ch(jnp.asarray(x))
    assert type(y).__module__.startswith("jax") and np.array_equal(np.asarray(y), want)
