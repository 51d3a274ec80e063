"""The router sends CPU calls to the native kernels in "auto" mode, falls back cleanly without
them, and keeps everything on the eager reference under ANYNUM_COMPILE=0."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import anynum as an
from anynum.kernels import ckernel, round_to_format, route
from anynum.rounding import CounterRandom, RandomSource, Rounding

FORMATS = [
    an.E4M3FN,
    an.BF16,
    an.FixedPoint(4, 8),
    an.Posit(16, 1),
    an.Table.from_format(an.E2M1),
    an.MXFP8_E4M3,
]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the calls the native kernels ran (returned a result for)."""
    calls: list[int] = []
    real = ckernel.native_round

    def counting(params, call, x, rng, out=None):  # type: ignore[no-untyped-def]
        y = real(params, call, x, rng, out)
        if y is not None:
            calls.append(x.numel())
        return y

    monkeypatch.setattr(ckernel, "native_round", counting)
    return calls


def test_auto_mode_picks_the_native_kernels_for_cpu_calls(
    monkeypatch: pytest.MonkeyPatch,
    counted: list[int],
    cn,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    x = torch.randn(40, 100).t()  # non-contiguous
    for fmt in FORMATS:
        for dtype in (torch.float32, torch.float64):
            for mode in (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC):
                plan = route.plan_for(
                    fmt,
                    mode,
                    fmt.default_overflow,
                    None,
                    dtype,
                    "cpu",
                    "counter" if mode.is_stochastic else None,
                )
                assert plan.kernel_names()[0] == "native"
        before = len(counted)
        want = cn.reference(fmt, Rounding.STOCHASTIC, fmt.default_overflow, None, x, seed=3)
        cn.assert_same(an.quantize(x, fmt, "sr", seed=3), want, x, fmt)
        rounder = an.nn.Rounder(fmt)
        cn.assert_same(
            rounder(x), cn.reference(fmt, Rounding.NEAREST_EVEN, fmt.default_overflow, None, x), x, fmt
        )
        inplace = x.contiguous()
        rounder.round_into(inplace)
        cn.assert_same(inplace, rounder(x), x, fmt)
        assert counted[before:] == [4000] * 4


def test_without_the_library_the_other_kernels_run(
    monkeypatch: pytest.MonkeyPatch, counted: list[int], cn
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    monkeypatch.setattr(ckernel, "library", lambda: None)
    monkeypatch.setattr(ckernel, "library_soon", lambda: None)
    x = torch.randn(3000)
    for fmt in (an.E4M3FN, an.Posit(8, 2)):
        want = cn.reference(fmt, Rounding.TOWARD_ZERO, fmt.default_overflow, None, x)
        cn.assert_same(an.quantize(x, fmt, "rz"), want, x, fmt)
    assert counted == []


def test_compile_zero_keeps_the_eager_reference(monkeypatch: pytest.MonkeyPatch, counted: list[int]) -> None:
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    plan = route.plan_for(an.E4M3FN, Rounding.STOCHASTIC, "saturate", None, torch.float32, "cpu", "counter")
    assert plan.kernel_names() == ["eager"]
    an.quantize(torch.randn(100), an.E4M3FN, "sr", seed=1)
    an.nn.Rounder(an.Posit(8, 2))(torch.randn(100))
    assert counted == []


def test_what_the_native_kernels_leave_to_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    native = next(k for k in route.kernels() if k.name == "native")
    call = route.Call(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.float32, "cuda", None)
    assert not native.covers(call)  # other devices: the compiled kernels
    custom = route.Call(an.E4M3FN, Rounding.STOCHASTIC, "saturate", None, torch.float32, "cpu", "custom")
    assert not native.covers(custom)  # bits the loop cannot draw

    class Injected(RandomSource):  # not counter-based: the eager path draws from it
        def bits_at(self, index: torch.Tensor, nbits: int, stream: int) -> torch.Tensor:
            return CounterRandom(2).bits_at(index, nbits, stream)

    x = torch.randn(500)
    want = an.quantize(x, an.E5M2, "sr", seed=2)
    assert torch.equal(an.quantize(x, an.E5M2, "sr", generator=Injected()), want)


def test_no_compiler_warns_once_and_quantize_stays_right(tmp_path: Path) -> None:
    """A machine without a working C compiler: the eager path answers while the (background) build
    is tried, the failed build warns once, and the eager path goes on answering."""
    code = textwrap.dedent(
        """
        import warnings
        warnings.simplefilter("always")
        import torch, anynum as an
        from anynum.kernels import round_to_format
        from anynum.kernels.clib import library
        x = torch.linspace(-600.0, 600.0, 4001)
        ref = round_to_format(an.E4M3FN, x, an.Rounding.TOWARD_ZERO, "saturate", None, None)
        ok = torch.equal(an.quantize(x, an.E4M3FN, "rz"), ref)  # during the build attempt
        assert library() is None  # waits for the attempt: its warning is out by now
        for _ in range(2):
            ok = ok and torch.equal(an.quantize(x, an.E4M3FN, "rz"), ref)  # after it
        print("EQUAL" if ok else "DIFFERENT")
        """
    )
    env = {
        **os.environ,
        "ANYNUM_COMPILE": "auto",
        "CC": "false",
        "ANYNUM_CACHE_DIR": str(tmp_path / "c"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "EQUAL" in result.stdout.split()
    assert result.stderr.count("could not build or load the native kernel 'anynum_round'") == 1


def test_plans_follow_the_format_not_its_address():
    """The router's and the front door's per-call caches are keyed by the format object's
    identity: formats made and dropped in turn (CPython reuses freed addresses) must each get
    their own rounding, across the caches' clearing at 4096 entries."""
    x = torch.randn(256, generator=torch.Generator().manual_seed(0)) * 8
    for i in range(4200):
        fmt = an.FloatFormat(2 + i % 5, 1 + (i * 7) % 9)  # a new object each time
        want = round_to_format(fmt, x.double(), Rounding.NEAREST_EVEN, fmt.default_overflow, None, None)
        assert torch.equal(an.quantize(x, fmt), want.float()), (i, fmt)


def test_the_direct_path_hands_on_what_it_does_not_decide(monkeypatch: pytest.MonkeyPatch, cn) -> None:  # type: ignore[no-untyped-def]
    """`Plan.direct` (Rounder's lean path) returns None, having written nothing the caller sees,
    for an undecided exact-SR element, a strided input, a library not loaded yet; the full route
    then gives the reference's values."""
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    plan = route.plan_for(an.FP16, Rounding.STOCHASTIC, "inf", None, torch.float64, "cpu", "counter")
    assert plan.direct is not None
    x, _ = cn.self_tie(4096, seed=5)
    rng = CounterRandom(5)
    assert plan.direct(x, rng) is None
    cn.assert_same(
        plan.run(x, rng), cn.reference(an.FP16, Rounding.STOCHASTIC, "inf", None, x, seed=5), x, "tie"
    )
    y = torch.randn(64, 32).t()
    nearest = route.plan_for(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, torch.float32, "cpu", None)
    assert nearest.direct is not None and nearest.direct(y, None) is None
    want = cn.reference(an.E4M3FN, Rounding.NEAREST_EVEN, "saturate", None, y)
    cn.assert_same(an.nn.Rounder(an.E4M3FN)(y), want, y, "strided")
    z = y.contiguous()
    cn.assert_same(nearest.direct(z, None), want.contiguous(), z, "direct")
    monkeypatch.setattr(ckernel, "library_soon", lambda: None)
    assert nearest.direct(z, None) is None
    blocks = route.plan_for(
        an.MXFP8_E4M3, Rounding.NEAREST_EVEN, "saturate", None, torch.float32, "cpu", None
    )
    assert blocks.direct is None  # block formats keep their own route
