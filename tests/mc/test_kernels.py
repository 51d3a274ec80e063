"""The C loops, the compiled and the blocked double-word kernels give bit-for-bit the results
of the plain formulas.

`anynum.mc.arith` runs the nc = 2 algorithms as C loops (`anynum.mc.cloops`, the default), as
torch.compile'd loops (additions, ``ANYNUM_COMPILE=1``) or, with ``ANYNUM_COMPILE=0``, on
large tensors as fixed sequences of ``out=`` operations over cache-sized blocks, with reused
scratch buffers.  The reference
implementations below are the straightforward formulas of Joldes, Muller, Popescu (2017),
one fresh tensor per operation, exactly as the package computed them before; the results
must agree bit for bit (signed zeros and NaN positions included), on random, adversarial
and non-finite inputs, with several block sizes (ragged last block) and thread counts.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from anynum import mc
from anynum.kernels import fused
from anynum.mc import arith, blocked, cloops, compiled


# ----------------------------------------------------------------- reference formulas
def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


def ref_dw_plus_dw(xh, xl, yh, yl):  # AccurateDWPlusDW, Alg. 6
    sh, sl = _two_sum(xh, yh)
    th, tl = _two_sum(xl, yl)
    c = sl + th
    vh, vl = _fast_two_sum(sh, c)
    w = tl + vl
    return _fast_two_sum(vh, w)


def ref_dw_plus_fp(xh, xl, y):  # DWPlusFP, Alg. 4
    sh, sl = _two_sum(xh, y)
    v = xl + sl
    return _fast_two_sum(sh, v)


def ref_dw_times_fp(xh, xl, y):  # DWTimesFP3, Alg. 9 (addcmul is the verified FMA)
    ch = xh * y
    cl1 = torch.addcmul(-ch, xh, y)
    cl3 = torch.addcmul(cl1, xl, y)
    return _fast_two_sum(ch, cl3)


def ref_dw_times_dw(xh, xl, yh, yl):  # DWTimesDW3, Alg. 12
    ch = xh * yh
    cl1 = torch.addcmul(-ch, xh, yh)
    tl0 = xl * yl
    tl1 = torch.addcmul(tl0, xh, yl)
    cl2 = torch.addcmul(tl1, xl, yh)
    return _fast_two_sum(ch, cl1 + cl2)


def ref_dw_div_fp(xh, xl, y):  # DWDivFP3, Alg. 15 (FMA two_prod)
    th = xh / y
    ph = th * y
    pl = torch.addcmul(-ph, th, y)
    dh = xh - ph
    dt = dh - pl
    d = dt + xl
    tl = d / y
    return _fast_two_sum(th, tl)


def ref_dw_div_dw(xh, xl, yh, yl):  # DWDivDW2, Alg. 17 (with DWTimesFP1, FMA two_prod)
    th = xh / yh
    ch = yh * th
    cl1 = torch.addcmul(-ch, yh, th)
    cl2 = yl * th
    th2, tl1 = _fast_two_sum(ch, cl2)
    tl2 = tl1 + cl1
    rh, rl = _fast_two_sum(th2, tl2)
    ph, pl = _two_sum(xh, -rh)
    dh = xl - rl
    dl = pl + dh
    d = ph + dl
    tl = d / yh
    return _fast_two_sum(th, tl)


# ----------------------------------------------------------------- inputs
def _dw(hi: torch.Tensor, lo_scale: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A normalised double word (hi, lo) with |lo| <= ulp(hi)/2."""
    lo = (torch.rand(hi.shape, generator=g, dtype=torch.float64) - 0.5) * lo_scale
    lo = (lo * hi.double().abs()).to(hi.dtype)
    return _fast_two_sum(hi, lo)


def _operands(kind: str, dtype: torch.dtype, shape: tuple[int, ...], seed: int):
    g = torch.Generator().manual_seed(seed)
    eps = torch.finfo(dtype).eps
    n = 1
    for d in shape:
        n *= d
    if kind == "random":
        ex = torch.randint(-30, 31, shape, generator=g).double()
        xh = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(ex)).to(dtype)
        ey = torch.randint(-30, 31, shape, generator=g).double()
        yh = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp2(ey)).to(dtype)
        return (*_dw(xh, eps, g), *_dw(yh, eps, g))
    if kind == "cancel":  # y = -x up to the low component, exact zeros, signed zeros
        xh, xl = _dw(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype), eps, g)
        pert = _dw(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype), eps, g)[1]
        yh, yl = -xh, -xl + pert * 0.125
        flat = yl.view(-1)
        flat[::7] = -xl.view(-1)[::7]  # exact cancellation: +0 results
        flat[1::11] = 0.0
        xl.view(-1)[1::11] = 0.0
        xh.view(-1)[2::13] = -0.0
        yh.view(-1)[2::13] = -0.0
        xl.view(-1)[2::13] = -0.0
        yl.view(-1)[2::13] = -0.0
        return xh, xl, yh, yl
    if kind == "gaps":  # widely different exponents, subnormal low components, near overflow
        fi = torch.finfo(dtype)
        emax = int(torch.log2(torch.tensor(fi.max, dtype=torch.float64)).floor())
        emin = int(torch.log2(torch.tensor(fi.tiny, dtype=torch.float64)).floor())
        ex = torch.randint(emin + 2, emax - 2, shape, generator=g).double()
        ey = torch.randint(emin + 2, emax - 2, shape, generator=g).double()
        xh = (torch.rand(shape, generator=g, dtype=torch.float64) + 1.0).mul(torch.exp2(ex)).to(dtype)
        yh = -(torch.rand(shape, generator=g, dtype=torch.float64) + 1.0).mul(torch.exp2(ey)).to(dtype)
        return (*_dw(xh, eps, g), *_dw(yh, eps, g))
    if kind == "nonfinite":
        xh, xl, yh, yl = _operands("random", dtype, shape, seed)
        specials = torch.tensor([float("inf"), -float("inf"), float("nan"), torch.finfo(dtype).max,
                                 -torch.finfo(dtype).max, 0.0, -0.0], dtype=dtype)
        idx = torch.randint(0, n, (n // 50,), generator=g)
        xh.view(-1)[idx] = specials[torch.randint(0, len(specials), idx.shape, generator=g)]
        idx = torch.randint(0, n, (n // 50,), generator=g)
        yh.view(-1)[idx] = specials[torch.randint(0, len(specials), idx.shape, generator=g)]
        return xh, xl, yh, yl
    raise ValueError(kind)


def _same(got, want) -> None:
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b)
        ia = a.masked_fill(nan_a, 0).view(torch.int64 if a.dtype == torch.float64 else torch.int32)
        ib = b.masked_fill(nan_b, 0).view(torch.int64 if b.dtype == torch.float64 else torch.int32)
        assert torch.equal(ia, ib)  # bit patterns: signed zeros count


def _cases(xh, xl, yh, yl):
    return [
        (arith.dw_plus_dw(xh, xl, yh, yl), ref_dw_plus_dw(xh, xl, yh, yl)),
        (arith.dw_plus_fp(xh, xl, yh), ref_dw_plus_fp(xh, xl, yh)),
        (arith.dw_times_fp(xh, xl, yh, use_fma=True), ref_dw_times_fp(xh, xl, yh)),
        (arith.dw_times_dw(xh, xl, yh, yl, use_fma=True), ref_dw_times_dw(xh, xl, yh, yl)),
        (arith.dw_div_dw(xh, xl, yh, yl), ref_dw_div_dw(xh, xl, yh, yl)),
        (arith.dw_div_fp(xh, xl, yh), ref_dw_div_fp(xh, xl, yh)),
    ]


KINDS = ["random", "cancel", "gaps", "nonfinite"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [None, 4096, 5000])
def test_blocked_kernels_bit_identical(dtype, kind, block, monkeypatch):
    monkeypatch.setenv("ANYNUM_COMPILE", "0")  # the eager route
    if not mc.fma_available(dtype):
        pytest.skip("the product kernels are only used with a verified FMA")
    if block is not None:
        monkeypatch.setattr(blocked, "BLOCK", block)
    shape = (301, 419)  # > 2**15 elements (the pooled path), not a multiple of any block
    ops = _operands(kind, dtype, shape, seed=hash((kind, str(dtype))) % 2**31)
    with torch.no_grad():
        for got, want in _cases(*ops):
            _same(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_blocked_kernels_threads_and_layouts(threads, monkeypatch):
    monkeypatch.setenv("ANYNUM_COMPILE", "0")
    monkeypatch.setattr(blocked, "BLOCK", 1 << 14)  # blocks of threads * 2**14: ragged last block
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xh, xl, yh, yl = _operands("random", torch.float32, (160, 450), seed=5)
        with torch.no_grad():
            for got, want in _cases(xh, xl, yh, yl):
                _same(got, want)
            # non-contiguous and broadcast operands take the whole-tensor path
            t = [c.T for c in (xh, xl, yh, yl)]
            for got, want in _cases(*t):
                _same(got, want)
            row = yh[:1]
            _same(arith.dw_plus_fp(xh, xl, row), ref_dw_plus_fp(xh, xl, row))
    finally:
        torch.set_num_threads(old)


def _no_other_route(*args, **kwargs):
    raise AssertionError("an eager or compiled kernel ran instead of the C loop")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_c_loops_bit_identical(dtype, kind, monkeypatch):
    """By default (ANYNUM_COMPILE unset) the C loops run, at every size: same bits as the formulas."""
    monkeypatch.delenv("ANYNUM_COMPILE", raising=False)
    monkeypatch.setattr(blocked, "run", _no_other_route)
    monkeypatch.setattr(compiled, "run", _no_other_route)
    if not mc.fma_available(dtype):
        pytest.skip("the product kernels are only used with a verified FMA")
    for shape in [(1,), (7,), (1031,), (301, 419)]:
        ops = _operands(kind, dtype, shape, seed=hash((kind, str(dtype), shape)) % 2**31)
        assert cloops.available(*ops)  # no skip without a compiler: see tests/kernels/test_ckernel.py
        with torch.no_grad():
            for got, want in _cases(*ops):
                _same(got, want)


@pytest.mark.parametrize("threads", [1, 2])
def test_c_loops_threads(threads, monkeypatch):
    """Large tensors are cut into one chunk per thread (ragged last chunk): same bits."""
    monkeypatch.delenv("ANYNUM_COMPILE", raising=False)
    monkeypatch.setattr(cloops, "_CHUNK_MIN", 1000)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ops = _operands("random", torch.float64, (3001,), seed=11)
        with torch.no_grad():
            for got, want in _cases(*ops):
                _same(got, want)
    finally:
        torch.set_num_threads(old)


def test_c_loops_not_used_with_autograd_or_broadcast(monkeypatch):
    monkeypatch.delenv("ANYNUM_COMPILE", raising=False)
    monkeypatch.setattr(cloops, "run", _no_other_route)
    xh, xl, yh, yl = _operands("random", torch.float32, (50,), seed=2)
    arith.dw_plus_fp(xh, xl, yh[:1])  # broadcast: the formula
    xh.requires_grad_(True)
    z = arith.dw_plus_dw(xh, xl, yh, yl)  # autograd recording: the formula, differentiable
    assert z[0].requires_grad


def test_mc_add_matches_reference_and_components_independent():
    """Through MCTensor: same bits, and the two result components are separate tensors."""
    xh, xl, yh, yl = _operands("random", torch.float32, (300, 300), seed=9)
    z = mc.MCTensor._wrap((xh, xl)) + mc.MCTensor._wrap((yh, yl))
    _same(z.components(), ref_dw_plus_dw(xh, xl, yh, yl))
    zh, zl = z.components()
    before = zl.clone()
    zh.add_(1.0)
    assert torch.equal(zl, before)


# ----------------------------------------------------------------- compiled additions
def _eager_kernel_called(*args, **kwargs):
    raise AssertionError("the eager blocked kernel ran instead of the compiled one")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_additions_bit_identical(dtype, monkeypatch):
    """With ANYNUM_COMPILE=1 the sums run as one torch.compile'd loop: same bits as the formulas."""
    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    monkeypatch.setattr(fused, "_failed", set())
    monkeypatch.setattr(blocked, "run", _eager_kernel_called)
    for kind in KINDS:
        for shape in [(301, 419), (2**15 + 3,)]:
            xh, xl, yh, yl = _operands(kind, dtype, shape, seed=hash((kind, shape)) % 2**31)
            with torch.no_grad():
                _same(arith.dw_plus_dw(xh, xl, yh, yl), ref_dw_plus_dw(xh, xl, yh, yl))
                _same(arith.dw_plus_fp(xh, xl, yh), ref_dw_plus_fp(xh, xl, yh))
            if kind != "nonfinite":  # MCTensor patches non-finite entries afterwards
                x, y = mc.MCTensor._wrap((xh, xl)), mc.MCTensor._wrap((yh, yl))
                _same((x - y).components(), ref_dw_plus_dw(xh, xl, -yh, -yl))
                _same((x + yh).components(), ref_dw_plus_fp(xh, xl, yh))


def test_compile_failure_falls_back_to_eager(monkeypatch):
    def broken(name):
        raise RuntimeError("no compiler")

    monkeypatch.setenv("ANYNUM_COMPILE", "1")
    monkeypatch.setattr(fused, "_failed", set())
    monkeypatch.setattr(compiled, "_compiled", broken)
    xh, xl, yh, yl = _operands("random", torch.float32, (200, 200), seed=3)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="no compiler"):
        got = arith.dw_plus_dw(xh, xl, yh, yl)
    _same(got, ref_dw_plus_dw(xh, xl, yh, yl))
    with torch.no_grad(), warnings.catch_warnings():  # the failure is remembered: no second warning
        warnings.simplefilter("error")
        _same(arith.dw_plus_dw(xh, xl, yh, yl), ref_dw_plus_dw(xh, xl, yh, yl))
