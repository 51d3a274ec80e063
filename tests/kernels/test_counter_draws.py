"""The C kernels' batched counter bits (common.c counter_draws) against SplitMix64 in Python ints.

counter_draws takes shortcuts the element-wise definition does not: four vector chains, and for
consecutive indices a first round read from a table that holds within aligned blocks of 32 and
changes at multiples of 2**30. Tensors of the tests elsewhere never reach 2**30 elements, so these
tests call it directly at the indices where the shortcuts change: unaligned starts, block and
2**30 boundaries, the wrap at 2**64, strided indices, every draw width.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anynum.kernels.clib import library
from anynum.rounding import counter_bits, splitmix64

_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def oracle(base: int, index: int, nbits: int) -> int:
    """counter_bits from its definition: two SplitMix64 finaliser rounds of index ^ base, top bits."""
    return splitmix64(splitmix64((index ^ base) & _M64) ^ _GOLDEN) >> (64 - nbits)


def draws(base: int, index0: int, step: int, m: int, nbits: int) -> np.ndarray:
    """What the library writes for m draws, checked not to write past m rounded up to 32."""
    lib = library()
    if lib is None:
        pytest.skip("no C compiler: the native kernels are not built")
    room = (m + 31) // 32 * 32
    out = np.full(room + 8, 0xA5A5A5A5A5A5A5A5, dtype=np.uint64)
    lib.anynum_counter_draws(out.ctypes.data_as(ctypes.c_void_p), base, index0, step, m, nbits)
    assert (out[room:] == 0xA5A5A5A5A5A5A5A5).all(), "wrote past its blocks"
    return out[:m]


def check(base: int, index0: int, step: int, m: int, nbits: int) -> None:
    got = draws(base, index0, step, m, nbits)
    want = [oracle(base, (index0 + j * step) & _M64, nbits) for j in range(m)]
    bad = [j for j in range(m) if int(got[j]) != want[j]]
    assert not bad, (base, index0, step, m, nbits, bad[:5])


_BASES = [0, _M64, 0x0123456789ABCDEF, 0xFFFFFFFFC0000000, 0x000000003FFFFFFF]
_STARTS = [0, 5, 31, 32, 1000, (1 << 30) - 32, (1 << 30) - 17, (1 << 30) - 1, 31 << 30, (1 << 35) - 40,
           (0x1F << 30) - 3, _M64 - 100, _M64 - 31, (1 << 63) - 7]


@pytest.mark.parametrize("base", _BASES)
@pytest.mark.parametrize("index0", _STARTS)
def test_consecutive_indices_across_blocks_and_2_30_boundaries(base: int, index0: int) -> None:
    for nbits in (1, 31, 32, 53, 64):
        check(base, index0, 1, 256, nbits)


@pytest.mark.parametrize("step", [2, 3, 32, 33, (1 << 30) + 1, 1 << 40, _M64])
def test_strided_indices(step: int) -> None:
    for index0 in (0, 7, (1 << 30) - 5):
        check(0x0123456789ABCDEF, index0, step, 100, 53)


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(0, _M64),
    index0=st.one_of(st.integers(0, _M64), st.integers(0, 1 << 36), st.integers(-300, 300)),
    boundary=st.integers(0, (1 << 34) - 1),
    step=st.one_of(st.just(1), st.integers(0, _M64)),
    m=st.integers(1, 300),
    nbits=st.integers(1, 64),
)
def test_any_arguments(base: int, index0: int, boundary: int, step: int, m: int, nbits: int) -> None:
    # a small index0 is taken as an offset from a multiple of 2**30, where the table changes
    start = (boundary << 30) + index0 if abs(index0) <= 300 else index0
    check(base, start & _M64, step, m, nbits)


def test_agrees_with_the_tensor_reference() -> None:
    # the eager reference the kernels must equal bit for bit, on indices near 2**30
    base = 0x0123456789ABCDEF
    index = torch.arange((1 << 30) - 70, (1 << 30) + 70, dtype=torch.int64)
    want = counter_bits(torch.tensor(base), index, 53)
    got = draws(base, (1 << 30) - 70, 1, 140, 53)
    assert torch.equal(torch.from_numpy(got.astype(np.int64)), want)
