"""The op table: torch functions, Tensor methods and operators reach the MC ops through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from anynum import mc
from anynum.errors import AnynumError
from anynum.mc import optable


def test_unknown_function_names_itself_and_the_way_out():
    x = mc.MCTensor(torch.ones(3))
    with pytest.raises(AnynumError) as err:
        torch.fft.fft(x)
    msg = str(err.value)
    assert "fft_fft is not supported on MCTensor" in msg and "to_tensor()" in msg
    assert "matmul" in msg  # the supported functions are listed
    with pytest.raises(AnynumError, match="cumsum"):
        torch.cumsum(x, 0)


def test_functions_methods_and_operators_share_one_implementation():
    for fn in (torch.add, torch.Tensor.add, torch.mul, torch.Tensor.mul, torch.matmul,
               torch.Tensor.matmul, torch.sum, torch.Tensor.sum, torch.softmax, F.softmax,
               torch.Tensor.softmax, torch.Tensor.__setitem__, F.linear, torch.cat):
        assert fn in optable.HANDLED
    assert optable.lookup(torch.add) is optable.lookup(torch.Tensor.add) is mc.add
    x = mc.MCTensor(torch.tensor([1.0, 2.0])) + 2.0**-40
    y = mc.MCTensor(torch.tensor([3.0, 4.0]))
    ref = mc.add(x, y)
    for z in (x + y, torch.add(x, y), x.add(y), y.__radd__(x)):
        assert all(torch.equal(p, q) for p, q in zip(z.components(), ref.components()))
    assert torch.equal((1.0 - x).to_tensor(torch.float64), torch.sub(1.0, x).to_tensor(torch.float64))
    assert x.sum().item() == mc.sum(x).item() == torch.sum(x).item()
    assert torch.equal(x.softmax(0).to_tensor(), F.softmax(x, 0).to_tensor())


def test_registering_a_new_op_touches_only_its_own_code(monkeypatch):
    monkeypatch.setattr(optable, "HANDLED", dict(optable.HANDLED))

    @optable.implements(torch.cumsum)
    def cumsum(x, dim):
        return mc.MCTensor(torch.cumsum(x.to_tensor(torch.float64), dim))

    assert torch.cumsum(mc.MCTensor(torch.ones(3)), 0).tolist() == [1.0, 2.0, 3.0]
    assert "cumsum" in optable.supported()
