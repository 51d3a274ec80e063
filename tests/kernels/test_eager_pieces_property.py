"""Property: the eager reference rounded piece by piece (`anynum.kernels.eager.round_reference`, pieces
of `EAGER_PIECE` elements) gives the bits of `round_to_format` on the whole tensor at once.

Hypothesis draws the format (Block configurations of every scale rule, with and without NVFP4's
tensor scale, blocked along the last axis, a positive axis, the first axis or flattened; the MX and
NVFP4 presets; elementwise formats), a shape of 1-3 dims, an input dtype the front door accepts for
that format, the layout (contiguous, a transposed or a strided view), the rounding mode and overflow
policy, the values (log-uniform magnitudes over a drawn window, NaN, ±inf, ±0, huge and tiny
values, all-zero runs) and a small piece size, so that tensors of a few thousand elements are
rounded in many pieces. Besides the bits, it checks that the pieces are really taken: where a cut
is allowed (an independent statement of `_pieces`' rule) the tensor goes to the kernel in pieces
of the expected sizes, and otherwise whole.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import assume, event, given, note, settings
from hypothesis import strategies as st

import anynum as an
from anynum.errors import AnynumError
from anynum.formats.block import UE4M3
from anynum.formats.fixed import UniformFormat
from anynum.kernels import eager
from anynum.kernels.eager import EagerKernel, round_to_format, working_dtype
from anynum.kernels.representable import check_overflow_fits, check_representable
from anynum.kernels.route import Call
from anynum.rounding import CounterRandom, Rounding

ELEMENTS = [an.E2M1, an.E4M3FN, an.FixedPoint(4, 3), an.IntFormat(8), an.Posit(8, 0)]
ELEMENTWISE = [
    an.E4M3FN,
    an.E5M2,
    an.E2M1,
    an.BF16,
    an.FixedPoint(4, 8),
    an.IntFormat(8),
    an.Posit(8, 0),
    an.Table.from_format(an.E2M1),
]
PRESETS = [an.MXFP8_E4M3, an.MXFP4_E2M1, an.MXINT8, an.NVFP4]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BLOCK_SIZES = (4, 8, 16, 32)
MAX_NUMEL = 4096
#: Special and extreme values, injected at drawn positions (converted to the input dtype, where
#: the large ones may become inf and the tiny ones zero).
SPECIALS = (
    math.nan,
    -math.nan,
    math.inf,
    -math.inf,
    0.0,
    -0.0,
    65504.0,
    -448.0,
    6.0,
    5e3,
    1e30,
    -3.4028234663852886e38,
    1.7e308,
    2.0**-24,
    -(2.0**-126),
    2.0**-133,
    2.0**-149,
    -1e-40,
    5e-324,
)
#: Examples per run: 15 times the project's profile (tests/conftest.py), as an example takes ~10 ms.
EXAMPLES = 15 * settings().max_examples


class Case(NamedTuple):
    fmt: an.Format
    x: torch.Tensor
    mode: Rounding
    overflow: str
    rand_bits: int | None
    seed: int
    piece: int
    layout: str

    def __repr__(self) -> str:
        x = self.x
        return (
            f"Case(fmt={self.fmt!r}, shape={tuple(x.shape)}, stride={x.stride()}, dtype={x.dtype}, "
            f"layout={self.layout}, mode={self.mode.name}, overflow={self.overflow!r}, "
            f"rand_bits={self.rand_bits}, seed={self.seed}, EAGER_PIECE={self.piece}, "
            f"x={x.tolist() if x.numel() <= 64 else '...'})"
        )


@st.composite
def block_formats(draw: Any, ndim: int, size: int) -> an.Block:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(PRESETS))
    element = draw(st.sampled_from(ELEMENTS))
    block_size = draw(st.sampled_from([size] * 7 + [None]))  # None: one block per axis, never cut
    axis = draw(st.sampled_from(["-1", "none", "last", "first"]))
    # "amax" twice: it has the most variants, and NVFP4's tensor scale (read from the whole tensor
    # before the pieces are rounded) is the one rule a piece cannot work out alone
    rule = draw(st.sampled_from(["floor", "ceil", "even", "amax", "amax"]))
    scale, tensor_scale = an.E8M0, None
    if rule == "amax":
        scale = draw(st.sampled_from([an.E8M0, UE4M3]))
        tensor_scale = draw(st.sampled_from([None, an.FP32, an.FP32]))
    symmetric = isinstance(element, UniformFormat) and draw(st.booleans())
    try:
        return an.Block(
            element,
            block_size,
            axis={"-1": -1, "none": None, "last": ndim - 1, "first": 0}[axis],
            scale=scale,
            scale_rule=rule,
            tensor_scale=tensor_scale,
            symmetric=symmetric,
        )
    except AnynumError:
        assume(False)
        raise  # pragma: no cover - assume(False) does not return


@st.composite
def shapes(draw: Any, size: int) -> tuple[int, ...]:
    """1-3 dims, at most MAX_NUMEL elements; the last dim often whole blocks of `size`."""
    ndim = draw(st.integers(1, 3))
    if draw(st.booleans()):
        last = size * draw(st.integers(1, 24 if ndim == 1 else 12))
    else:
        last = draw(st.integers(1, 200 if ndim > 1 else MAX_NUMEL))
    last = min(last, MAX_NUMEL)
    if ndim == 1:
        if last < 64:  # a 1-d tensor of whole blocks: make it long enough to cut
            last = size * draw(st.integers(1, MAX_NUMEL // size))
        return (last,)
    room = MAX_NUMEL // last
    first = draw(st.integers(1, max(1, min(room, 64))))
    if ndim == 2:
        return (first, last)
    return (first, draw(st.integers(1, max(1, room // first))), last)


def fill(draw: Any, shape: tuple[int, ...], dtype: torch.dtype, run: int) -> torch.Tensor:
    """float64 values of `shape`, then converted to `dtype`: random magnitudes over a drawn window
    of binades, random signs, specials at drawn positions and all-zero runs of `run` elements (whole
    blocks where the blocks lie in memory order)."""
    n = math.prod(shape)
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lo = draw(st.integers(-40, 20))
    hi = lo + draw(st.integers(0, 40))
    exps = torch.randint(lo, hi + 1, (n,), generator=g, dtype=torch.float64)
    sig = 1.0 + torch.rand(n, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    x = sign * sig * torch.exp2(exps)
    for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIALS)), max_size=12)):
        x[i] = v
    for start in draw(st.lists(st.integers(0, n - 1), max_size=3)):  # a whole block, where blocks run
        x[start - start % run : start - start % run + run] = draw(st.sampled_from([0.0, -0.0]))
    return x.view(shape).to(dtype)


def front_door_accepts(fmt: an.Format, overflow: str, dtype: torch.dtype) -> bool:
    try:
        check_representable(fmt, dtype)
        check_overflow_fits(fmt, overflow, dtype)
    except AnynumError:
        return False
    return True


@st.composite
def cases(draw: Any) -> Case:
    size = draw(st.sampled_from(BLOCK_SIZES))
    shape = draw(shapes(size))
    ndim = len(shape)
    if draw(st.integers(0, 3)):
        fmt: an.Format = draw(block_formats(ndim, size))
    else:
        fmt = draw(st.sampled_from(ELEMENTWISE))
    policies = (fmt.element if isinstance(fmt, an.Block) else fmt).overflow_policies
    overflow = draw(st.sampled_from(policies))
    try:
        overflow = fmt.check_overflow(overflow)
    except AnynumError:
        assume(False)
    # the dtypes the front door (anynum.quantize) accepts for this format and policy: the reference
    # never sees the others (blocks with a tensor scale refuse float16 and bfloat16, for one)
    dtypes = [dtype for dtype in DTYPES if front_door_accepts(fmt, overflow, dtype)]
    assume(dtypes)
    dtype = draw(st.sampled_from(dtypes))
    mode = draw(st.sampled_from(list(Rounding)))
    rand_bits = draw(st.sampled_from([None, 3])) if mode is Rounding.STOCHASTIC else None
    layout = draw(st.sampled_from(["contiguous"] * 4 + ["transposed", "strided"]))
    if layout == "transposed" and ndim >= 2:
        swapped = (*shape[:-2], shape[-1], shape[-2])
        x = fill(draw, swapped, dtype, size).transpose(-1, -2)
    elif layout == "strided":
        x = fill(draw, (*shape[:-1], 2 * shape[-1]), dtype, size)[..., ::2]
    else:
        layout = "contiguous"
        x = fill(draw, shape, dtype, size)
    piece = draw(st.integers(64, 1000))
    return Case(fmt, x, mode, overflow, rand_bits, draw(st.integers(0, 2**62)), piece, layout)


def cuttable(fmt: an.Format, x: torch.Tensor) -> bool:
    """`_pieces`' rule, stated on its own: contiguous, and elementwise or blocks that are one run of
    whole blocks in memory (blocked axis last or flattened, its length a multiple of block_size)."""
    if not x.is_contiguous():
        return False
    if not isinstance(fmt, an.Block):
        return True
    if fmt.block_size is None:
        return False
    if fmt.axis is None:
        run = x.numel()
    elif fmt.axis % x.dim() == x.dim() - 1:
        run = x.shape[-1]
    else:
        return False
    return run % fmt.block_size == 0


def expected_sizes(fmt: an.Format, x: torch.Tensor, piece: int) -> list[int]:
    """The sizes of the tensors the reference hands the kernel, in order."""
    n = x.numel()
    if isinstance(fmt, an.Block) and fmt.block_size:
        piece -= piece % fmt.block_size
    if not cuttable(fmt, x) or n <= piece:
        return [n]
    return [piece] * (n // piece) + ([n % piece] if n % piece else [])


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases())
def test_pieces_round_the_whole_tensors_bits(case: Case, cn: Any) -> None:
    fmt, x, mode, overflow, rand_bits = case.fmt, case.x, case.mode, case.overflow, case.rand_bits
    rng = CounterRandom(case.seed) if mode.is_stochastic else None
    want = round_to_format(fmt, x.to(working_dtype(fmt, x.dtype)), mode, overflow, rng, rand_bits)
    want = want.to(x.dtype)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(eager, "EAGER_PIECE", case.piece)
        sizes: list[int] = cn.count_pieces(mp)  # the tensors the reference rounds, in order
        cut = eager._pieces(fmt, x) if x.is_contiguous() else None
        call = Call(fmt, mode, overflow, rand_bits, x.dtype, "cpu", "counter" if rng is not None else None)
        got = EagerKernel().round(call, x, rng, None)

    want_sizes = expected_sizes(fmt, x, case.piece)
    if len(want_sizes) > 1:
        event("in pieces")
    elif cuttable(fmt, x):
        event("whole: n <= piece")
    else:
        event(f"whole: {'no cut' if x.is_contiguous() else 'not contiguous'}")
    event(f"format: {type(fmt).__name__}{' + tensor scale' if getattr(fmt, 'tensor_scale', None) else ''}")
    note(f"cut={cut}, sizes={sizes}")
    cn.assert_same(got, want, x, case)
    assert (cut is not None) == cuttable(fmt, x), (cut, case)
    assert sizes == want_sizes, case
