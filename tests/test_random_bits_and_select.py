"""The counter stream against SplitMix64 written out on Python ints, and `select` against `torch.where`.

`counter_bits` runs its int64 arithmetic in place (eagerly twice as fast); these tests hold it
to the generator's definition, written here from the published SplitMix64 finaliser, and check
that it leaves the caller's index tensor alone. `select` blends bit patterns on the CPU; it must
give `torch.where`'s bits for every mask, dtype and special value.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anynum._bits import select
from anynum.rounding import counter_bits

M64 = (1 << 64) - 1


def _finaliser(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _oracle(base: int, index: int, nbits: int) -> int:
    z = _finaliser((index ^ base) & M64)
    z = _finaliser(z ^ 0x9E3779B97F4A7C15)
    return z >> (64 - nbits)


@settings(max_examples=200, deadline=None)
@given(
    base=st.integers(-(2**63), 2**63 - 1),
    indices=st.lists(st.integers(0, 2**62), min_size=1, max_size=40),
    nbits=st.integers(1, 63),
)
def test_counter_bits_are_two_splitmix64_finalisers(base: int, indices: list[int], nbits: int) -> None:
    index = torch.tensor(indices, dtype=torch.int64)
    before = index.clone()
    got = counter_bits(base, index, nbits)
    assert got.tolist() == [_oracle(base, i, nbits) for i in indices]
    assert torch.equal(index, before)  # the arithmetic in place works on its own copy


def test_counter_bits_with_a_tensor_base_leave_both_inputs_alone() -> None:
    index, base = torch.arange(5), torch.tensor(-12345)
    kept = index.clone(), base.clone()
    got = counter_bits(base, index, 53)
    assert got.tolist() == [_oracle(-12345, i, 53) for i in range(5)]
    assert torch.equal(index, kept[0]) and torch.equal(base, kept[1])


SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -1.0, 3.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16])
def test_select_is_where_bit_for_bit(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)
    n = 4099
    if dtype.is_floating_point:
        a = torch.randn(n, generator=g).to(dtype)
        b = torch.randn(n, generator=g).to(dtype)
        a[: len(SPECIAL)] = torch.tensor(SPECIAL, dtype=dtype)
        b[len(SPECIAL) : 2 * len(SPECIAL)] = torch.tensor(SPECIAL, dtype=dtype)
    else:
        info = torch.iinfo(dtype)
        a = torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)
        b = torch.randint(info.min, info.max, (n,), generator=g, dtype=dtype)
    a.view(-1)[len(SPECIAL)] = b.view(-1)[len(SPECIAL)]
    masks = (torch.rand(n, generator=g) < 0.5, torch.zeros(n, dtype=torch.bool), torch.ones(n).bool())
    for mask in masks:
        got, want = select(mask, a, b), torch.where(mask, a, b)
        assert got.dtype == want.dtype and torch.equal(_bytes(got), _bytes(want))
        m2, a2, b2 = (t[:4096].view(64, 64).t() for t in (mask, a, b))  # strided 2-D views
        assert torch.equal(_bytes(select(m2, a2, b2)), _bytes(torch.where(m2, a2, b2)))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def test_select_falls_back_to_where_for_what_it_does_not_blend() -> None:
    a = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([True, False, True])
    assert select(mask, a, torch.tensor(0.5)).tolist() == [1.0, 0.5, 3.0]  # broadcast
    assert select(torch.tensor([1, 0, 2]).bool(), a, -a).tolist() == [1.0, -2.0, 3.0]
    assert select(mask, a, -a.double()).dtype == torch.float64  # promotion


def test_select_keeps_gradients_as_where_does() -> None:
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = select(torch.tensor([True, False, True]), a * 2, torch.zeros(3))
    y.sum().backward()
    assert a.grad is not None and a.grad.tolist() == [2.0, 0.0, 2.0]
