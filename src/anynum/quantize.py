"""The front door: `quantize`, `encode`, `decode`, and scale/zero-point integer quantization.

Dispatches on the array type (torch tensors natively; NumPy arrays through a
zero-copy torch view), validates every argument, picks an exact working dtype,
and wires the straight-through gradient.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch

from anynum.errors import InputError, RepresentabilityError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.fixed import IntFormat
from anynum.formats.registry import format as lookup_format
from anynum.kernels import fused_round, round_to_format, use_fused, working_dtype
from anynum.kernels.arrays import is_dask_array, is_jax_array, is_jax_tracer, quantize_dask, quantize_jax
from anynum.kernels.cfloat import cfloat_round_auto
from anynum.kernels.fused import fused_decode, fused_encode
from anynum.kernels.native import native_cast_dtype, native_round_trip
from anynum.rounding import (
    RandomSource,
    Rounding,
    RoundingLike,
    make_random_source,
    parse_rounding,
    round_scaled,
)

__all__ = ["IntQuantized", "decode", "dequantize_int", "encode", "quantize", "quantize_int"]

_TORCH_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# --- argument checks -----------------------------------------------------------------------


def _as_format(fmt: Format | str) -> Format:
    return lookup_format(fmt)


def _check_rand_bits(rand_bits: int | None, mode: Rounding) -> None:
    if rand_bits is None:
        return
    if isinstance(rand_bits, bool) or not isinstance(rand_bits, (int, np.integer)):
        raise InputError(f"rand_bits must be an integer in 1..52 or None, got {rand_bits!r}.")
    if not 1 <= rand_bits <= 52:
        raise InputError(
            f"rand_bits must be in 1..52 (random bits added below the last kept bit), got {rand_bits}."
        )
    if mode is not Rounding.STOCHASTIC:
        raise InputError(
            f"rand_bits applies to rounding='stochastic' only, not {mode.name}; drop rand_bits."
        )


def _check_tensor(x: torch.Tensor) -> None:
    if x.dtype not in _TORCH_FLOATS:
        kind = "complex" if x.is_complex() else "integer/bool" if not x.is_floating_point() else "unsupported"
        raise InputError(
            f"quantize needs a float16, bfloat16, float32 or float64 tensor, got a {kind} tensor of "
            f"dtype {x.dtype}; convert it first, e.g. x.float()."
        )


def _in_dtype(v: float, dtype: torch.dtype) -> bool:
    return float(torch.tensor(v, dtype=torch.float64).to(dtype)) == v


def _on_grid(fmt: Format, v: float) -> bool:
    x = torch.tensor([v], dtype=torch.float64)
    policy = "saturate" if "saturate" in fmt.overflow_policies else fmt.default_overflow
    y = round_to_format(fmt, x, Rounding.NEAREST_EVEN, policy, None, None)
    return float(y[0]) == v


@functools.lru_cache(maxsize=512)
def check_representable(fmt: Format, dtype: torch.dtype) -> None:
    """Raise RepresentabilityError if rounding `dtype` values onto `fmt` can give values `dtype` cannot hold.

    The result of rounding x onto a grid is one of x's two grid neighbours. On
    16-bit dtypes every input is checked exhaustively (round up and down); on
    float32/float64 the grid's ends are checked: the largest value (or the
    dtype's largest, which then must be on the grid) and the smallest positive one.
    """
    if dtype in (torch.float16, torch.bfloat16):
        allx = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype).to(torch.float32)
        allx = allx[torch.isfinite(allx)]
        wdt = working_dtype(fmt, dtype)
        sat = "saturate" if "saturate" in fmt.overflow_policies else fmt.default_overflow
        for mode in (Rounding.UP, Rounding.DOWN):
            y = round_to_format(fmt, allx.to(wdt), mode, sat, None, None)
            y = y[torch.isfinite(y)]
            bad = y.to(dtype).to(y.dtype) != y
            if bool(bad.any()):
                example = float(y[bad][0])
                raise RepresentabilityError(
                    f"{fmt.display_name()} produces values such as {example!r} that {dtype} cannot "
                    f"hold exactly; quantize a float32 tensor instead (x.float()) to avoid double rounding."
                )
        return
    dmax = torch.finfo(dtype).max
    problems = []
    if fmt.max > dmax:
        if not _on_grid(fmt, dmax):
            problems.append(f"{dtype}'s largest value {dmax!r} is not on the grid and would round past it")
    elif not _in_dtype(fmt.max, dtype):
        problems.append(f"its largest value {fmt.max!r} is not a {dtype} value")
    tiny = fmt.smallest_subnormal
    info = torch.finfo(dtype)
    reachable = tiny >= info.smallest_normal * info.eps or not _on_grid(fmt, 0.0)
    if reachable and not _in_dtype(tiny, dtype):
        problems.append(f"its smallest positive value {tiny!r} is not a {dtype} value")
    elif tiny < info.smallest_normal * info.eps and not isinstance(fmt, Block):
        # Values below the dtype's resolution are unreachable only if tiny inputs can round to
        # zero; posits (underflow="minpos") round the dtype's smallest value down to minpos.
        sat = "saturate" if "saturate" in fmt.overflow_policies else fmt.default_overflow
        x = torch.tensor([info.smallest_normal * info.eps], dtype=torch.float64)
        lowest = float(round_to_format(fmt, x, Rounding.DOWN, sat, None, None)[0])
        if lowest > 0 and not _in_dtype(lowest, dtype):
            problems.append(
                f"it rounds {dtype}'s smallest positive value down to {lowest!r}, not a {dtype} value"
            )
    if problems:
        raise RepresentabilityError(
            f"{fmt.display_name()} cannot be held exactly in {dtype}: {'; '.join(problems)}. "
            "Quantize a float64 tensor instead."
        )


# --- autograd -------------------------------------------------------------------------------


class _StraightThrough(torch.autograd.Function):
    """Forward: the rounded values. Backward: the incoming gradient unchanged (STE)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None


# --- the front door -------------------------------------------------------------------------


def _can_write_in_loop(x: torch.Tensor, out: torch.Tensor, mode: Rounding, rand_bits: int | None) -> bool:
    """Whether the fused loop may store into `out` while it reads `x`.

    Not when they overlap other than element for element (a shifted view would read
    overwritten inputs), nor in place under exact stochastic rounding, whose rare
    undecided elements are redone from the input on the eager path.
    """
    if out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
        return True
    same_view = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
    return same_view and not (mode is Rounding.STOCHASTIC and rand_bits is None)


def _quantize_tensor(
    x: torch.Tensor,
    fmt: Format,
    mode: Rounding,
    overflow: str,
    rng: RandomSource | None,
    rand_bits: int | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    _check_tensor(x)
    check_representable(fmt, x.dtype)
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != x.shape
        or out.dtype != x.dtype
        or out.device != x.device
    ):
        raise InputError(
            "out= must be a tensor of the input's shape, dtype and device; got "
            f"{getattr(out, 'shape', None)}/{getattr(out, 'dtype', None)}/{getattr(out, 'device', None)} "
            f"for input {tuple(x.shape)}/{x.dtype}/{x.device}."
        )
    wdt = working_dtype(fmt, x.dtype)
    native = native_cast_dtype(fmt, mode, overflow, x)
    with torch.no_grad():
        xw = x.detach().to(wdt)
        fused = use_fused(xw, rng)
        into = out is not None and out.dtype == wdt and _can_write_in_loop(xw, out, mode, rand_bits)
        # The C loop, where it applies (float formats, deterministic modes, float32 CPU, small).
        y = None if fused else cfloat_round_auto(fmt, xw, mode, overflow, out if into else None)
        if y is not None:
            if y is out:
                return out
        # torch's float8 casts are slower than our fused kernel; its fp16/bf16 casts are not.
        elif native is not None and (not fused or native in (torch.float16, torch.bfloat16)):
            if out is not None and out.dtype == wdt:
                return native_round_trip(xw, native, out)  # widens while it writes: no temporary
            y = native_round_trip(xw, native)
        elif fused:
            if into:
                return fused_round(fmt, xw, mode, overflow, rng, rand_bits, out)
            y = fused_round(fmt, xw, mode, overflow, rng, rand_bits)
        else:
            y = round_to_format(fmt, xw, mode, overflow, rng, rand_bits)
        y = y.to(x.dtype)
        if out is not None:
            out.copy_(y)
            return out
    if x.requires_grad and torch.is_grad_enabled():
        return _StraightThrough.apply(x, y)
    return y


def _quantize_foreign(
    x: Any,
    fmt: Format,
    mode: Rounding,
    policy: str,
    generator: Any,
    seed: int | None,
    rand_bits: int | None,
    out: Any,
) -> Any:
    """JAX and Dask arrays, through `anynum.kernels.arrays`."""
    kind = "JAX" if is_jax_array(x) else "Dask"
    if out is not None:
        raise InputError(
            f"out= takes torch tensors and NumPy arrays; {kind} arrays are returned, not written."
        )
    name = str(x.dtype)
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise InputError(
            f"quantize needs a float16/bfloat16/float32/float64 {kind} array, got dtype {name}; "
            "convert it first, e.g. x.astype('float32')."
        )
    if kind == "Dask" and isinstance(fmt, Block):
        raise InputError(
            "Block formats share scales across chunk borders and pad rows, so they are not applied "
            "chunk by chunk; quantize x.compute() (or map_blocks over whole-block chunks yourself)."
        )
    traced_x, traced_key = is_jax_tracer(x), is_jax_tracer(generator)
    if mode.is_stochastic and (traced_key or (traced_x and generator is None and seed is None)):
        raise InputError(
            "stochastic rounding under jax.jit/vmap needs a concrete seed= or PRNG key passed from "
            "outside the traced function: a seed drawn while tracing would be reused on every call."
        )
    if generator is not None and is_jax_array(generator):  # a JAX PRNG key: its bits are the seed
        import jax

        with jax.ensure_compile_time_eval():  # a concrete key stays concrete inside jit
            words = [int(w) for w in np.asarray(jax.random.key_data(generator)).reshape(-1)]
        generator, seed = None, sum(w << (32 * i) for i, w in enumerate(reversed(words))) & ((1 << 62) - 1)
    rng = make_random_source(generator, seed, torch.device("cpu")) if mode.is_stochastic else None

    def run(t: torch.Tensor, block_rng: RandomSource | None) -> torch.Tensor:
        return _quantize_tensor(t, fmt, mode, policy, block_rng, rand_bits, None)

    return quantize_jax(x, run, rng) if kind == "JAX" else quantize_dask(x, run, rng)


def quantize(
    x: Any,
    fmt: Format | str,
    rounding: RoundingLike = "nearest",
    *,
    overflow: str | None = None,
    generator: Any = None,
    seed: int | None = None,
    rand_bits: int | None = None,
    out: Any = None,
) -> Any:
    """Round every element of `x` onto `fmt`'s grid; returns the input's array type and dtype.

    Args:
        x: torch tensor (float16/bfloat16/float32/float64, any shape, strides and
            device), NumPy array (float16/float32/float64), JAX array (also inside
            ``jax.jit``; gradients pass straight through) or Dask array (lazy, chunk by
            chunk; stochastic results do not depend on the chunking).
        fmt: a Format or a name understood by `anynum.format`.
        rounding: a `Rounding` member or alias ("nearest", "rz", "sr", ...).
        overflow: "saturate", "inf", "nan" (floats) or "saturate", "wrap" (fixed
            point, integers); None uses the format's default ("inf" if it has
            infinities, else "saturate").
        generator, seed: the random stream for stochastic modes (torch or NumPy
            Generator, a JAX PRNG key, or an int seed); results depend only on these and `x`.
        rand_bits: hardware-style stochastic rounding with this many random bits (1..52).
        out: write the result here (same type, shape, dtype, device) and return it.

    Special values: NaN stays NaN; ±inf follows the overflow policy (saturate:
    ±max; inf: ±inf; nan: NaN); -0 is kept where the format has it. Negative
    inputs to unsigned float formats give NaN. With autograd the gradient passes
    straight through. Raises `RepresentabilityError` if the format's values do
    not fit the input dtype (no silent double rounding).

    >>> import anynum as an, torch
    >>> an.quantize(torch.tensor([1.0 + 2**-11, 70000.0, -1e-9]), "fp16").tolist()
    [1.0, inf, -0.0]
    >>> an.quantize(torch.tensor([70000.0]), an.FP16, overflow="saturate").tolist()
    [65504.0]
    >>> an.quantize(torch.tensor([0.3] * 4), an.E2M1, "sr", seed=0).tolist()  # 0.5 w.p. 0.6
    [0.0, 0.5, 0.5, 0.5]
    """
    fmt = _as_format(fmt)
    mode = parse_rounding(rounding)
    policy = fmt.check_overflow(overflow)
    _check_rand_bits(rand_bits, mode)
    if isinstance(x, torch.Tensor):
        rng = make_random_source(generator, seed, x.device) if mode.is_stochastic else None
        return _quantize_tensor(x, fmt, mode, policy, rng, rand_bits, out)
    if is_jax_array(x) or is_dask_array(x):
        return _quantize_foreign(x, fmt, mode, policy, generator, seed, rand_bits, out)
    if isinstance(x, np.ndarray) or np.isscalar(x):
        arr = np.asarray(x)
        if arr.dtype not in _NUMPY_FLOATS:
            raise InputError(
                f"quantize needs a float16/float32/float64 NumPy array, got dtype {arr.dtype}; "
                "convert it first, e.g. x.astype(np.float32)."
            )
        t = torch.from_numpy(arr if arr.ndim == 0 else np.ascontiguousarray(arr))
        rng = make_random_source(generator, seed, t.device) if mode.is_stochastic else None
        if out is not None:
            if not isinstance(out, np.ndarray) or out.shape != arr.shape or out.dtype != arr.dtype:
                raise InputError("out= must be a NumPy array of the input's shape and dtype.")
            overlaps = np.may_share_memory(out, arr) and not (
                out.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
                and out.strides == arr.strides
            )  # torch cannot see that two arrays share memory: a shifted view goes through a copy
            if out.flags.c_contiguous and out.flags.writeable and out.ndim > 0 and not overlaps:
                _quantize_tensor(t, fmt, mode, policy, rng, rand_bits, torch.from_numpy(out))
            else:
                np.copyto(out, _quantize_tensor(t, fmt, mode, policy, rng, rand_bits, None).numpy())
            return out
        values = _quantize_tensor(t, fmt, mode, policy, rng, rand_bits, None).numpy()
        return values if isinstance(x, np.ndarray) else values[()]
    raise InputError(
        f"quantize accepts torch tensors and NumPy arrays, got {type(x).__module__}.{type(x).__name__}."
    )


def encode(
    x: Any, fmt: Format | str, rounding: RoundingLike = "nearest", **kwargs: Any
) -> Any:
    """Round `x` onto `fmt` and return the integer codes (int64) of its real bit layout.

    NaN maps to the format's NaN code; a format without one raises `FormatError`.

    >>> import anynum as an, torch
    >>> an.encode(torch.tensor([1.0, -2.0, 448.0]), an.E4M3FN).tolist()
    [56, 192, 126]
    """
    fmt = _as_format(fmt)
    if is_jax_array(x) or is_dask_array(x):
        raise InputError(
            "encode takes torch tensors and NumPy arrays; convert first "
            "(np.asarray(x), torch.from_dlpack(x) or x.compute())."
        )
    y = quantize(x, fmt, rounding, **kwargs)
    t = y.detach() if isinstance(y, torch.Tensor) else torch.from_numpy(np.asarray(y))
    if isinstance(fmt, Block) or not use_fused(t, None):
        codes = fmt._encode_torch(t.to(torch.float64))
    else:
        codes = fmt._checked_codes(fused_encode(fmt, t))
    if isinstance(y, torch.Tensor):
        return codes
    return codes.numpy() if isinstance(y, np.ndarray) else int(codes.item())


def decode(codes: Any, fmt: Format | str) -> Any:
    """float64 values of integer `codes` (torch, NumPy or int); NaN codes give NaN.

    >>> import anynum as an, torch
    >>> an.decode(torch.tensor([56, 192, 127]), an.E4M3FN).tolist()
    [1.0, -2.0, nan]
    """
    fmt = _as_format(fmt)
    if isinstance(codes, torch.Tensor):
        t = codes
    else:
        arr = np.asarray(codes)
        if arr.dtype.kind not in "iu":
            raise InputError(f"decode needs integer codes, got dtype {arr.dtype}.")
        t = torch.from_numpy(arr.astype(np.int64))
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise InputError(f"decode needs integer codes, got dtype {t.dtype}.")
    t = t.to(torch.int64)
    if t.numel() and not 0 <= int((mm := torch.aminmax(t)).min) <= int(mm.max) < (1 << fmt.bits):
        raise InputError(f"codes of {fmt.display_name()} lie in [0, 2**{fmt.bits}); got values outside.")
    fast = use_fused(t, None) and not isinstance(fmt, Block)
    values = fused_decode(fmt, t) if fast else fmt._decode_torch(t)
    if isinstance(codes, torch.Tensor):
        return values
    return float(values.item()) if np.isscalar(codes) else values.numpy()


# --- scale / zero-point integer quantization --------------------------------------------------


class IntQuantized(NamedTuple):
    """Integer codes with the scale and zero point that map them back: x ≈ (codes - zero_point) * scale."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor
    fmt: IntFormat
    axis: int | None


def quantize_int(
    x: torch.Tensor,
    fmt: IntFormat | str | int = 8,
    *,
    symmetric: bool = True,
    axis: int | None = None,
    rounding: RoundingLike = "nearest",
    generator: Any = None,
    seed: int | None = None,
) -> IntQuantized:
    """Scale/zero-point integer quantization, per tensor (`axis=None`) or per channel along `axis`.

    Symmetric: ``scale = amax / qmax`` and codes in [-qmax, qmax] (the code -2**(b-1)
    is unused so that the grid is sign-symmetric), zero point 0. Asymmetric: the
    range [min(x, 0), max(x, 0)] maps onto [qmin, qmax] with an integer zero point
    ``qmin - round(min / scale)``, so 0.0 is exactly representable. ``x / scale``
    is computed in float64 before rounding. An all-zero slice gets scale 1.
    NaN or inf in `x` raises (no scale can represent it). Differences from Pychop
    Chopi: Chopi's asymmetric range is [0, 2**(b-1)-1] and its zero point is not
    an integer; ours uses the whole code range and an integer zero point.

    >>> import torch, anynum as an
    >>> q = an.quantize_int(torch.tensor([-1.0, 0.5, 2.0]), 8)
    >>> q.codes.tolist(), round(float(q.scale) * 127, 6)
    ([-64, 32, 127], 2.0)
    >>> [round(v, 4) for v in an.dequantize_int(q).tolist()]
    [-1.0079, 0.5039, 2.0]
    """
    int_fmt: Format | int = fmt if not isinstance(fmt, str) else lookup_format(fmt)
    if isinstance(int_fmt, int) and not isinstance(int_fmt, bool):
        int_fmt = IntFormat(int_fmt)
    if not isinstance(int_fmt, IntFormat):
        raise InputError(f"quantize_int needs an IntFormat (or bit width), got {fmt!r}.")
    fmt = int_fmt
    if not isinstance(x, torch.Tensor):
        raise InputError(f"quantize_int needs a torch tensor, got {type(x).__name__}.")
    _check_tensor(x)
    mode = parse_rounding(rounding)
    if symmetric and not fmt.signed:
        raise InputError("symmetric quantization needs a signed IntFormat; use symmetric=False for unsigned.")
    xd = x.detach().to(torch.float64)
    if not bool(torch.isfinite(xd).all()):
        raise InputError("quantize_int needs finite inputs; the tensor holds NaN or inf.")
    if axis is None:
        reduce_dims: list[int] = list(range(xd.dim()))
    else:
        if not -xd.dim() <= axis < max(xd.dim(), 1):
            raise InputError(f"axis {axis} is out of range for a {xd.dim()}-d tensor.")
        axis = axis % xd.dim()
        reduce_dims = [d for d in range(xd.dim()) if d != axis]

    def _reduce(t: torch.Tensor, op: str) -> torch.Tensor:
        if t.numel() == 0:
            shape = [1 if d in reduce_dims else n for d, n in enumerate(t.shape)]
            return torch.zeros(shape, dtype=t.dtype)
        if not reduce_dims:
            return t
        if op == "amax":
            return t.amax(dim=reduce_dims, keepdim=True)
        return t.amin(dim=reduce_dims, keepdim=True)

    qmin, qmax = float(fmt.code_min), float(fmt.code_max)
    if symmetric:
        qmin = -qmax
        amax = _reduce(xd.abs(), "amax")
        scale = amax / qmax
        zero_point = torch.zeros_like(scale)
    else:
        hi = torch.clamp(_reduce(xd, "amax"), min=0.0)
        lo = torch.clamp(_reduce(xd, "amin"), max=0.0)
        scale = (hi - lo) / (qmax - qmin)
        zero_point = qmin - torch.round(lo / torch.where(scale > 0, scale, torch.ones_like(scale)))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    rng = make_random_source(generator, seed, x.device) if mode.is_stochastic else None
    codes = round_scaled(xd / scale, mode, rng) + zero_point
    codes = torch.clamp(codes, qmin, qmax).to(torch.int64)
    return IntQuantized(codes, scale.to(x.dtype), zero_point.to(torch.int64), fmt, axis)


def dequantize_int(q: IntQuantized, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values ``(codes - zero_point) * scale`` of an `IntQuantized` (in `dtype`, default the scale's)."""
    dtype = dtype or q.scale.dtype
    return ((q.codes - q.zero_point).to(torch.float64) * q.scale.to(torch.float64)).to(dtype)
