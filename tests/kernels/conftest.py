"""Helpers of the native-kernel tests, as a fixture (test folders have no __init__.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.kernels.ckernel import native_round
from anynum.kernels.cparams import call_params
from anynum.kernels.eager import round_to_format, working_dtype
from anynum.kernels.route import Call
from anynum.rounding import CounterRandom, Rounding

MODES = list(Rounding)
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_INT = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal bits (so equal zero signs), or NaN on both sides."""
    bits = a.contiguous().view(_INT[a.dtype]) == b.contiguous().view(_INT[b.dtype])
    return bits | (a.isnan() & b.isnan())


def assert_same(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: object) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    ok = same(got, want)
    if not bool(ok.all()):
        bad = (~ok).reshape(-1).nonzero().reshape(-1)[:5].tolist()
        rows = [(float(x.reshape(-1)[i]), float(want.reshape(-1)[i]), float(got.reshape(-1)[i])) for i in bad]
        raise AssertionError(f"{what}: {int((~ok).sum())} differ, (x, want, got): {rows}")


def reference(
    fmt: an.Format, mode: Rounding, overflow: str, rand_bits: int | None, x: torch.Tensor, seed: int = 7
) -> torch.Tensor:
    rng = CounterRandom(seed) if mode.is_stochastic else None
    wdt = working_dtype(fmt, x.dtype)
    return round_to_format(fmt, x.to(wdt), mode, overflow, rng, rand_bits).to(x.dtype)


def native(
    fmt: an.Format,
    mode: Rounding,
    overflow: str,
    rand_bits: int | None,
    x: torch.Tensor,
    seed: int = 7,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    params = call_params(fmt, mode, overflow, rand_bits, x.dtype)
    assert params is not None, (fmt, mode, x.dtype)
    rng = CounterRandom(seed) if mode.is_stochastic else None
    call = Call(fmt, mode, overflow, rand_bits, x.dtype, "cpu", "counter" if rng else None)
    y = native_round(params, call, x, rng, out)
    assert y is not None, "the native library did not build (is there a C compiler?)"
    return y


def check(
    fmt: an.Format, x: torch.Tensor, modes: list[Rounding] = MODES, rand_bits: tuple = (None, 3)
) -> None:
    """Every mode (stochastic ones with and without rand_bits) and overflow policy of `fmt`."""
    for mode in modes:
        for overflow in fmt.overflow_policies:
            for rb in rand_bits if mode is Rounding.STOCHASTIC else (None,):
                want = reference(fmt, mode, overflow, rb, x)
                assert_same(native(fmt, mode, overflow, rb, x), want, x, (fmt, mode.name, overflow, rb))


def grid_inputs(fmt: an.Format, dtype: torch.dtype, probe_points) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Grid points, midpoints and their float neighbours (formats of at most 12 bits), as `dtype`."""
    if fmt.bits > 12:
        return torch.empty(0, dtype=dtype)
    values = fmt.values()
    values = values[np.isfinite(values)]
    key = "float64" if dtype == torch.float64 else "float32"
    pts = torch.from_numpy(probe_points(values)[key].copy())
    return pts.to(dtype)


def self_tie(n: int, seed: int) -> tuple[torch.Tensor, int]:
    """float64 inputs for FP16 whose scaled fraction at element i ties its own first 53 random bits.

    f = k * 2**-53 + 2**-(53 + spare) shares its first 53 fraction bits with the draw k and has
    one more bit below them (test_fused_equivalence builds the same element).
    """
    bits = CounterRandom(seed).bits_at(torch.arange(n), 53, 0)
    i = int(torch.argmin(bits))
    k = int(bits[i])
    spare = 53 - k.bit_length()
    assert spare >= 6
    x = torch.full((n,), 0.75 * 2.0**-24, dtype=torch.float64)
    x[i] = (k * 2.0**-53 + 2.0 ** -(53 + spare)) * 2.0**-24  # the FP16 step below 2**-14 is 2**-24
    return x, i


def count_pieces(mp: pytest.MonkeyPatch) -> list[int]:
    """Counts, while `mp` holds, the sizes of the tensors the eager reference rounds (one per piece),
    in order, by `round_to_format` or by the piece rounder a format registers (`piece_rounder`)."""
    from anynum.kernels import eager

    sizes: list[int] = []

    def counted(kernel):  # type: ignore[no-untyped-def]
        def counting(fmt, part, *args):  # type: ignore[no-untyped-def]
            sizes.append(part.numel())
            return kernel(fmt, part, *args)

        return counting

    real_rounder = eager.piece_rounder

    def rounder(fmt, whole):  # type: ignore[no-untyped-def]
        kernel = real_rounder(fmt, whole)
        return None if kernel is None else counted(kernel)

    mp.setattr(eager, "round_to_format", counted(eager.round_to_format))
    mp.setattr(eager, "piece_rounder", rounder)
    return sizes


class NativeCheck:
    """The comparisons of tests/kernels/test_ckernel*.py: native kernels against the eager reference."""

    MODES = MODES
    same = staticmethod(same)
    assert_same = staticmethod(assert_same)
    reference = staticmethod(reference)
    native = staticmethod(native)
    check = staticmethod(check)
    grid_inputs = staticmethod(grid_inputs)
    self_tie = staticmethod(self_tie)
    count_pieces = staticmethod(count_pieces)


@pytest.fixture(scope="session")
def cn() -> type[NativeCheck]:
    """`NativeCheck`: reference, native, check, assert_same, same, grid_inputs, self_tie, count_pieces."""
    return NativeCheck
