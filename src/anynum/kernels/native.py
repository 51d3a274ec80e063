"""The shortcut where a native torch cast *is* the rounding: float32 -> (fp16, bf16, float8) -> float32.

For these (format, overflow) pairs, round-to-nearest-even on CPU float32
inputs, torch's cast round trip equals the reference kernel bit for bit
(tests/kernels/test_native_casts.py checks every float16/bfloat16 pattern,
random values and all special values). It is restricted to float32 CPU
inputs: torch casts float64 through float32 (double rounding), and CUDA
float8 casts treat overflow differently.

What torch's casts do is not assumed: torch 2.11's CPU cast to float8_e4m3fn sends
overflow to NaN, 2.13's saturates. Each pair is used only after its round trip of a
probe (`cast_agrees`: every bfloat16 pattern with the low bits that make the ties and
near-ties of every target, and the specials, in a large and a small tensor) equals the
reference bit for bit, once per process.
"""

from __future__ import annotations

import functools

import torch

from anynum.formats import floating as fl
from anynum.formats.base import Format
from anynum.kernels.eager import round_to_format
from anynum.kernels.route import Call, Kernel, register
from anynum.kernels.settings import compiles_at
from anynum.rounding import RandomSource, Rounding

__all__ = ["NativeCastKernel", "cast_agrees", "float32_cast_dtype", "native_cast_dtype", "native_round_trip"]


@functools.cache
def _candidates() -> dict[tuple[Format, str], torch.dtype]:
    """Each (format, overflow policy) whose rounding a torch cast might be; `cast_agrees` decides."""
    pairs = [(fl.FP16, "float16"), (fl.BF16, "bfloat16"), (fl.E4M3FN, "float8_e4m3fn")]
    pairs += [(fl.E5M2, "float8_e5m2"), (fl.E4M3FNUZ, "float8_e4m3fnuz"), (fl.E5M2FNUZ, "float8_e5m2fnuz")]
    table: dict[tuple[Format, str], torch.dtype] = {}
    for fmt, name in pairs:
        dtype = getattr(torch, name, None)
        if dtype is None:
            continue
        for overflow in fmt.overflow_policies:
            if (overflow != "inf" or fmt.has_inf) and (overflow != "nan" or fmt.has_nan):
                table[(fmt, overflow)] = dtype
    return table


def native_cast_dtype(fmt: Format, mode: Rounding, overflow: str, x: torch.Tensor) -> torch.dtype | None:
    """The torch dtype whose cast round trip of `x` equals rounding onto `fmt`, or None.

    >>> import anynum as an
    >>> native_cast_dtype(an.BF16, Rounding.NEAREST_EVEN, "inf", torch.ones(2))
    torch.bfloat16
    """
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    return float32_cast_dtype(fmt, mode, overflow)


def float32_cast_dtype(fmt: Format, mode: Rounding, overflow: str) -> torch.dtype | None:
    """`native_cast_dtype` for float32 CPU tensors.

    >>> import anynum as an
    >>> float32_cast_dtype(an.E5M2, Rounding.NEAREST_EVEN, "inf")
    torch.float8_e5m2
    """
    if mode is not Rounding.NEAREST_EVEN:
        return None
    key = (fmt, overflow)
    try:
        return _decided[key]  # one hash of the format per call, as before the probe
    except KeyError:
        dtype = _candidates().get(key)
        _decided[key] = dtype if dtype is not None and cast_agrees(fmt, overflow, dtype) else None
        return _decided[key]


_decided: dict[tuple[Format, str], torch.dtype | None] = {}  # float32_cast_dtype's answers


#: Low 16 bits joined to every high half: float16's ties (bit 12) with either parity of its
#: last kept bit (bit 13), bfloat16's (bit 15), and values just either side of them. Float8
#: ties and every overflow, subnormal and special lie in the high half itself.
_PROBE_LOW = (0x0000, 0x0FFF, 0x1000, 0x1001, 0x3000, 0x7FFF, 0x8000, 0x8001)


@functools.cache
def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    """The probe inputs: a large float32 tensor (vectorised loops) and a small one (scalar paths)."""
    high = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32) << 16
    low = torch.tensor(_PROBE_LOW, dtype=torch.int32)
    large = (high[:, None] | low[None, :]).reshape(-1).view(torch.float32)
    inf, big = float("inf"), torch.finfo(torch.float32).max
    small = torch.tensor([inf, -inf, float("nan"), big, -big, 1e5, -3e38, 464.0, 65520.0, -0.0, 2.0**-149])
    return large, small


@functools.cache
def cast_agrees(fmt: Format, overflow: str, dtype: torch.dtype) -> bool:
    """Whether this torch's float32 -> `dtype` -> float32 round trip is `fmt`'s nearest-even rounding.

    Checked on the probe against the reference kernel, bit for bit (NaN payloads aside),
    once per process and triple.

    >>> import anynum as an
    >>> cast_agrees(an.BF16, "inf", torch.bfloat16)
    True
    >>> cast_agrees(an.BF16, "saturate", torch.bfloat16)  # torch's cast overflows to inf
    False
    """
    for x in _probe():
        got = x.to(dtype).float()
        ref = round_to_format(fmt, x, Rounding.NEAREST_EVEN, overflow, None, None)
        same = (got.view(torch.int32) == ref.view(torch.int32)) | (got.isnan() & ref.isnan())
        if not bool(same.all()):
            return False
    return True


#: torch's float8 dtypes (those this torch build has).
_FLOAT8 = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


@functools.cache
def _float8_table(dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
    """Every code of float8 `dtype` widened by torch's own cast: the decode, as a 256-entry table."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(wide)


#: From this size on, float8 widens through a table (or float16) rather than torch's own cast;
#: below it the extra ops of those routes cost more than they save.
_FAST_WIDEN_MIN = 2048


def native_round_trip(x: torch.Tensor, native: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x.to(native).to(x.dtype)`` (into `out` if given), widening float8 the fast way.

    torch widens float8 to float32 one element at a time (about 3 ns per element on
    this CPU, five times its narrowing). Two routes give the same bits faster:
    e5m2 codes are the top byte of float16 codes, so they widen through float16
    (vectorised); other float8 codes widen by a gather from the table of torch's own
    widened codes (four to five times faster).

    >>> x = torch.tensor([0.3, -500.0, float("nan")])
    >>> native_round_trip(x, torch.float8_e4m3fn).tolist()
    [0.3125, -448.0, nan]
    """
    narrow = x.to(native)
    if native not in _FLOAT8 or x.numel() < _FAST_WIDEN_MIN:
        return narrow.to(x.dtype) if out is None else out.copy_(narrow)
    if native == torch.float8_e5m2:
        wide = (narrow.view(torch.uint8).to(torch.int16) << 8).view(torch.float16)
        return wide.to(x.dtype) if out is None else out.copy_(wide)
    table = _float8_table(native, x.dtype)
    codes = narrow.view(torch.uint8).long()
    if out is not None and out.is_contiguous():
        return torch.take(table, codes, out=out)
    y = torch.take(table, codes)
    return y if out is None else out.copy_(y)


class NativeCastKernel(Kernel):
    """Round to nearest even by torch's own cast round trip, where that cast is the rounding (`cast_agrees`).

    float32 CPU tensors onto fp16/bf16 (torch's vectorised casts, any size) and onto the
    float8 formats torch has (below the compiled kernels' size: torch converts float8 one
    element at a time, so large tensors go to a fused loop).
    """

    name = "native-cast"
    rank = 20

    def covers(self, call: Call) -> bool:
        return call.device == "cpu" and call.dtype == torch.float32 and _dtype_of(call) is not None

    def accepts(self, call: Call, numel: int) -> bool:
        return _dtype_of(call) in (torch.float16, torch.bfloat16) or not compiles_at(numel)

    def round(
        self, call: Call, x: torch.Tensor, rng: RandomSource | None, out: torch.Tensor | None
    ) -> torch.Tensor:
        native = _dtype_of(call)
        assert native is not None
        return native_round_trip(x, native, out)  # narrows into a new tensor first: out may be x


def _dtype_of(call: Call) -> torch.dtype | None:
    return float32_cast_dtype(call.fmt, call.mode, call.overflow)


register(NativeCastKernel())
