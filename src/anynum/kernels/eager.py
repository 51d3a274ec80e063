"""The reference rounding kernels: plain eager PyTorch, written for clarity.

`round_to_format` is a single-dispatch function over format families; each
kernel receives the input already converted to its working dtype (float32 or
float64, chosen by `working_dtype`) and returns values on the format's grid in
that dtype. The posit, table and block families register their kernels from
their own modules. `EagerKernel` puts the reference into the router
(`anynum.kernels.route`) as the kernel that covers every call; every faster
kernel is tested bit for bit against it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from anynum._bits import layout
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.formats.table import Table
from anynum.kernels.route import Call, Kernel, register
from anynum.rounding import CounterRandom, RandomSource, Rounding, round_scaled

__all__ = [
    "EAGER_PIECE",
    "EagerKernel",
    "PieceRounder",
    "apply_overflow",
    "float_grid_step",
    "piece_rounder",
    "round_reference",
    "round_to_format",
    "working_dtype",
]


_FLOAT32_MAX = torch.finfo(torch.float32).max


@functools.singledispatch
def working_dtype(fmt: Format, dtype: torch.dtype) -> torch.dtype:
    """Working dtype in which rounding `dtype` inputs onto `fmt` is exact."""
    return torch.float64


@working_dtype.register
def _(fmt: FloatFormat, dtype: torch.dtype) -> torch.dtype:
    # float32 must hold the format's constants too: its max (exp_bits >= 9 exceeds float32's range)
    if dtype == torch.float64 or fmt.man_bits > 23 or fmt.max > _FLOAT32_MAX:
        return torch.float64
    return torch.float32


@working_dtype.register
def _(fmt: UniformFormat, dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64 or fmt.bits > 24 or not -100 <= fmt.step_exp <= 0:
        return torch.float64
    return torch.float32


@functools.singledispatch
def round_to_format(
    fmt: Format,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    """Round `x` (float32/float64 working dtype) onto `fmt`'s grid; see `anynum.quantize`."""
    raise NotImplementedError(f"no rounding kernel for {type(fmt).__name__}")


def apply_overflow(
    y: torch.Tensor, x: torch.Tensor, limit: float, mode: Rounding, overflow: str
) -> torch.Tensor:
    """Replace results with |y| > limit per the overflow policy (IEEE 754 rules).

    `y` must carry the sign of `x`. "saturate" gives ±limit. Under "inf" (and
    "nan", where NaN stands in for infinity), finite inputs that overflow go to
    ±inf (NaN) in round-to-nearest and stochastic modes and in the direction of
    a directed mode, and to ±limit otherwise (toward zero, odd, and the far
    side of up/down); ±inf inputs go to ±inf (NaN).
    """
    a = torch.abs(y)
    over = a > limit
    if overflow == "saturate":
        return torch.copysign(torch.where(over, limit, a), y)
    x_inf = torch.abs(x) == torch.inf  # not torch.isinf: that one does not vectorize in Inductor
    if mode is Rounding.TOWARD_ZERO or mode is Rounding.ODD:
        to_beyond = x_inf
    elif mode is Rounding.UP:
        to_beyond = x_inf | (x > 0)
    elif mode is Rounding.DOWN:
        to_beyond = x_inf | (x < 0)
    else:
        to_beyond = over
    beyond = torch.nan if overflow == "nan" else torch.inf  # NaN stands in for inf where there is none
    a = torch.where(over & to_beyond, beyond, torch.where(over, limit, a))
    return torch.copysign(a, y)


def float_grid_step(fmt: FloatFormat, a: torch.Tensor) -> torch.Tensor:
    """The grid step (a power of two) of `fmt` at magnitudes `a`, in a's float dtype.

    Read off the exponent bits (2**floor(log2 a) = a with its fraction bits
    cleared), so it is exact and fuses well. Below the working type's own
    resolution the step is clamped to that resolution: inputs there are already
    on the grid. ±inf/NaN give inf.
    """
    lay = layout(a.dtype)
    exp_mask = ((1 << lay.exp_bits) - 1) << lay.man_bits
    binade = (a.view(lay.int_dtype) & exp_mask).view(a.dtype)  # 0 for zero and subnormals
    if fmt.emin < lay.emin:
        # The format's binades continue below the working type's normal range: lift
        # subnormal inputs to read their exponent too.
        lift = 2.0 ** (lay.man_bits + 2)
        tiny_binade = ((a * lift).view(lay.int_dtype) & exp_mask).view(a.dtype) / lift
        binade = torch.where(a < 2.0**lay.emin, tiny_binade, binade)
    step = binade * 2.0**-fmt.man_bits
    step = torch.clamp_min(step, 2.0 ** max(fmt.emin - fmt.man_bits, lay.quantum_min))
    if not fmt.subnormals and fmt.emin >= lay.quantum_min:
        # Below the smallest normal the grid is {0, smallest_normal}: one step of that size.
        step = torch.where(a < fmt.smallest_normal, fmt.smallest_normal, step)
    return step


@round_to_format.register
def _round_float(
    fmt: FloatFormat,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    step = float_grid_step(fmt, torch.abs(x))
    r = round_scaled(x / step, mode, rng, rand_bits)  # x / step is exact: step is a power of two
    y = torch.where(torch.abs(x) == torch.inf, x, r * step)
    y = torch.copysign(y, x)  # keeps -0 for negatives rounded to zero
    if not fmt.zero:
        y = torch.copysign(torch.where(y == 0, fmt.smallest_normal, torch.abs(y)), x)
    y = apply_overflow(y, x, fmt.max, mode, overflow)
    if not fmt.has_negative_zero:
        y = torch.where(y == 0, 0.0, y)
    if not fmt.signed:  # -0 is zero; anything negative has no value here
        y = torch.where(x < 0, torch.nan, torch.abs(y))
    return y


@round_to_format.register
def _round_uniform(
    fmt: UniformFormat,
    x: torch.Tensor,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
) -> torch.Tensor:
    if overflow == "wrap":
        # Reduce modulo the format's span first (fmod is exact): integer shifts by an even
        # number of steps commute with every rounding mode, and the reduced x neither
        # overflows x / step nor loses the low digits that `r - code_min` would at 2**24.
        x = torch.fmod(x, float(1 << fmt.bits) * 2.0**fmt.step_exp)
    s = x * 2.0**-fmt.step_exp  # exact unless it underflows (steps above 1 only)
    if fmt.step_exp > 0:
        # Keep inputs that vanished nonzero so directed modes still see which side they are on.
        tiny = 2.0 ** layout(x.dtype).quantum_min
        s = torch.where((s == 0) & (x != 0), torch.copysign(torch.full_like(s, tiny), x), s)
    r = round_scaled(s, mode, rng, rand_bits)
    if overflow == "wrap":
        modulus = float(1 << fmt.bits)
        w = torch.fmod(r, modulus)  # exact; |r| <= modulus here, so the shifts below are exact too
        w = torch.where(w > fmt.code_max, w - modulus, w)
        r = torch.where(w < fmt.code_min, w + modulus, w)
    else:
        r = torch.clamp(r, fmt.code_min, fmt.code_max)
    y = r * 2.0**fmt.step_exp
    return torch.where(y == 0, 0.0, y)  # two's complement has no -0


#: Elements per piece where `round_reference` rounds a large CPU tensor piece by piece: the
#: reference's dozen or so temporaries of a piece (int64 counter bits among them) stay in the
#: cache. 4M elements of E4M3FN SR took 0.61 s whole and 0.19 s in pieces of 65,536 (tables
#: 1.23 s and 0.53 s, posits 0.87 s and 0.38 s): the calls made while the C library builds take
#: this path, as does every CPU call that reaches the reference kernel.
EAGER_PIECE = 1 << 16

#: The families whose every element rounds on its own (a block's elements share its scale).
_ELEMENTWISE = (FloatFormat, UniformFormat, Posit, Table)


def _pieces(fmt: Format, x: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """(elements per piece, the shape a whole piece is rounded in) where `x` may be rounded piece
    by piece, else None. Blocks may, where their elements are one run of whole blocks in memory
    order (the blocked axis last, or the tensor flattened, with no padding): the pieces then end
    on block boundaries, and an element's random bits are addressed by its index in that run, as
    in the whole tensor. A scale of the whole tensor (NVFP4's) is fixed first (`piece_rounder`)."""
    if isinstance(fmt, _ELEMENTWISE):
        return EAGER_PIECE, (-1,)
    if not isinstance(fmt, Block) or not fmt.block_size or x.dim() == 0:
        return None
    size = fmt.block_size
    shape: tuple[int, ...]
    if fmt.axis is None:
        run, shape = x.numel(), (-1,)
    elif fmt.resolve_axis(x.dim()) == x.dim() - 1:
        run, shape = x.shape[-1], (-1,) if x.dim() == 1 else (*([1] * (x.dim() - 2)), -1, size)
    else:
        return None
    piece = EAGER_PIECE - EAGER_PIECE % size
    return (piece, shape) if run % size == 0 and piece else None


#: A kernel with `round_to_format`'s arguments.
PieceRounder = Callable[[Format, torch.Tensor, Rounding, str, RandomSource | None, int | None], torch.Tensor]


@functools.singledispatch
def piece_rounder(fmt: Format, x: torch.Tensor) -> PieceRounder | None:
    """What rounds the pieces of `x` where part of `fmt`'s rule reads the whole tensor, with that
    part computed from all of `x` first; None where `round_to_format` rounds a piece as the whole
    tensor would. The block module registers NVFP4's tensor scale, which NaN and ±inf elements do
    not enter (their blocks come out NaN); NaN, inf and saturation otherwise as `round_to_format`.

    >>> import anynum as an
    >>> piece_rounder(an.NVFP4, torch.ones(32)) is not None, piece_rounder(an.MXFP8_E4M3, torch.ones(32))
    (True, None)
    """
    return None


class _Shifted(RandomSource):
    """The bits of `base` for elements `offset` on: a piece draws what the whole tensor would."""

    def __init__(self, base: RandomSource, offset: int) -> None:
        self.base, self.offset = base, offset

    def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
        return self.base.bits_at(index + self.offset, nbits, stream)

    def defer_undecided(self, excess: torch.Tensor) -> bool:
        return self.base.defer_undecided(excess)


def round_reference(call: Call, x: torch.Tensor, rng: RandomSource | None) -> torch.Tensor:
    """`round_to_format` for `call` on `x` in the working dtype, as a new tensor of x's dtype.

    A contiguous CPU tensor of an elementwise format larger than `EAGER_PIECE` is rounded piece
    by piece (one of a block format in whole blocks, where `_pieces` allows, a scale of the whole
    tensor computed first: `piece_rounder`), each piece drawing the whole tensor's bits for its
    elements (counter-based streams only: any other `RandomSource` gets the whole tensor, as its
    bits need not be a function of the index alone); the result is the same, bit for bit. NaN,
    inf and saturation as `round_to_format`.

    >>> import anynum as an
    >>> call = Call(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.float32, "cpu", None)
    >>> round_reference(call, torch.tensor([0.3, 1000.0, float("nan")]), None).tolist()
    [0.3125, 448.0, nan]
    """
    wdt = working_dtype(call.fmt, x.dtype)
    n = x.numel()
    pieces = _pieces(call.fmt, x) if x.is_cpu and x.is_contiguous() else None
    if (
        pieces is None
        or n <= pieces[0]
        or not (rng is None or type(rng) is CounterRandom)
    ):
        return round_to_format(call.fmt, x.to(wdt), call.mode, call.overflow, rng, call.rand_bits).to(x.dtype)
    (piece, shape), flat, y = pieces, x.view(-1), torch.empty_like(x)
    flat_y = y.view(-1)
    rounder = piece_rounder(call.fmt, x) or round_to_format
    for start in range(0, n, piece):
        part = flat[start : start + piece].to(wdt).view(shape)
        bits = None if rng is None else _Shifted(rng, start)
        flat_y[start : start + piece] = rounder(
            call.fmt, part, call.mode, call.overflow, bits, call.rand_bits
        ).view(-1)
    return y


class EagerKernel(Kernel):
    """The reference (`round_reference`): plain eager torch. Covers every call."""

    name = "eager"
    rank = 100

    def covers(self, call: Call) -> bool:
        return True

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        return round_reference(call, x, rng)

    def encode(self, fmt: Format, y: torch.Tensor) -> torch.Tensor:
        return fmt.encode_kernel(y.to(torch.float64))

    def decode(self, fmt: Format, codes: torch.Tensor) -> torch.Tensor:
        return fmt.decode_torch(codes)


register(EagerKernel())
