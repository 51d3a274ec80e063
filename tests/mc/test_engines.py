"""The int8 and float matrix-product engines: the shared proven bound against an exact oracle,
agreement with each other, the float engine's plan and native/torch paths, and the engine choice.

The bound (proven in `anynum.mc.linalg`): for nc = 2 and k <= 2**17, without overflow or
underflow, ``|C' - C| <= 2 u^2 |C| + 32 nA nB u^2 k 2**(e_r + f_c)`` per entry, with e_r the
smallest integer above every component of row r of A (``|a| < 2**e_r``), f_c likewise for
column c of B.  Underflowing lower components (float16) get an absolute slack of one smallest
subnormal per component, as documented.  The oracle is exact rational arithmetic on the raw
components; nothing here calls anynum to compute an expected value.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from oracle import DTYPES, PREC, exact, tiny

from anynum import mc
from anynum.errors import AnynumError
from anynum.mc import cslices, engine, ozaki_float

ENGINES = ("int8", "float")


# ----------------------------------------------------------------- inputs
def _values(kind: str, shape: tuple[int, int], dtype: torch.dtype, g: torch.Generator,
            side: str) -> torch.Tensor:
    """float64 values of one operand for the input kinds of the brief."""
    v = torch.randn(*shape, dtype=torch.float64, generator=g)
    if kind == "random":
        return v * torch.exp2(torch.randint(-4, 5, shape, generator=g).double())
    if kind == "spread":  # exponents spread over a wide range inside every row and column
        span = {torch.float16: 6, torch.bfloat16: 40, torch.float32: 40, torch.float64: 300}[dtype]
        return v * torch.exp2(torch.randint(-span, span + 1, shape, generator=g).double())
    if kind == "cancel":  # A's rows come in +/- pairs of columns: the products cancel almost fully
        if side == "a":
            half = v[:, : shape[1] // 2]
            out = torch.cat([half, -half * (1 + 2.0**-20)], dim=1)
            return out[:, : shape[1]] if out.shape[1] >= shape[1] else torch.cat([out, v[:, -1:]], 1)
        return torch.ones(shape, dtype=torch.float64) + 2.0**-10 * v
    if kind == "subnormal":  # A's entries near the bottom of the range, B's large
        lo = {torch.float16: -20, torch.bfloat16: -130, torch.float32: -140, torch.float64: -1060}[dtype]
        hi = {torch.float16: 4, torch.bfloat16: 100, torch.float32: 100, torch.float64: 900}[dtype]
        e = lo if side == "a" else hi
        return v * torch.exp2(torch.tensor(float(e)) + torch.randint(-3, 4, shape, generator=g).double())
    raise ValueError(kind)


def _operands(kind: str, dtype: torch.dtype, nb: int, seed: int, m: int = 6, k: int = 40, n: int = 5):
    g = torch.Generator().manual_seed(seed)
    a = mc.MCTensor(_values(kind, (m, k), dtype, g, "a"), 2, dtype=dtype)
    bv = _values(kind, (k, n), dtype, g, "b")
    b = mc.MCTensor(bv, 2, dtype=dtype) if nb == 2 else bv.to(dtype)
    return a, b


def _rows(x) -> list[list[list[Fraction]]]:
    """Exact component values, [row][col][component]."""
    comps = x.components() if isinstance(x, mc.MCTensor) else (x,)
    r, c = comps[0].shape
    vals = [c_.detach().double().reshape(-1).tolist() for c_ in comps]
    return [[[Fraction(v[i * c + j]) for v in vals] for j in range(c)] for i in range(r)]


def _exp_above(vals) -> int:
    """Smallest integer e with |v| < 2**e for every v (0 if all are zero)."""
    mx = max((abs(v) for v in vals), default=Fraction(0))
    if mx == 0:
        return 0
    e = mx.numerator.bit_length() - mx.denominator.bit_length()
    while Fraction(2) ** e <= mx:
        e += 1
    while e > -2000 and Fraction(2) ** (e - 1) > mx:
        e -= 1
    return e


def _check_bound(a, b, got, dtype) -> float:
    """Assert the proven bound entrywise; return the worst error in units of the bound."""
    A, B = _rows(a), _rows(b)
    m, k, n = len(A), len(B), len(B[0])
    na, nb = len(A[0][0]), len(B[0][0])
    u2 = Fraction(1, 2 ** (2 * PREC[dtype]))
    er = [_exp_above([c for row in A[i] for c in row]) for i in range(m)]
    fc = [_exp_above([c for t in range(k) for c in B[t][j]]) for j in range(n)]
    gv = exact(got.components())
    worst = 0.0
    for i in range(m):
        for j in range(n):
            want = sum(sum(A[i][t]) * sum(B[t][j]) for t in range(k))
            bound = (2 * u2 * abs(want) + 32 * na * nb * u2 * k * Fraction(2) ** (er[i] + fc[j])
                     + 2 * tiny(dtype))
            err = abs(gv[i * n + j] - want)
            assert err <= bound, (i, j, float(err / bound))
            worst = max(worst, float(err / bound))
    return worst


# ----------------------------------------------------------------- the shared bound
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["random", "cancel", "spread", "subnormal"])
@pytest.mark.parametrize("nb", [1, 2])
def test_engines_within_the_shared_bound_and_agree(dtype, kind, nb):
    a, b = _operands(kind, dtype, nb, seed=hash((kind, str(dtype), nb)) % 2**31)
    res = {e: mc.matmul(a, b, engine=e) for e in ENGINES}
    for e in ENGINES:
        _check_bound(a, b, res[e], dtype)
    # against each other: both within the bound of the exact product, so within twice of each other
    d = (res["int8"] - res["float"]).to_tensor(torch.float64).abs()
    assert torch.isfinite(d).all()


def test_engines_exact_on_integer_products():
    """Small integers: every product and sum is exact, so both engines return the exact result."""
    g = torch.Generator().manual_seed(4)
    A = torch.randint(-1000, 1000, (7, 64), generator=g).double()
    B = torch.randint(-1000, 1000, (64, 3), generator=g).double()
    want = A @ B  # exact in float64 (|entries| < 2**27)
    for dtype in (torch.float32, torch.float64):
        for e in ENGINES:
            r = mc.matmul(mc.MCTensor(A, 2, dtype=dtype), B.to(dtype), engine=e)
            assert torch.equal(r.to_tensor(torch.float64), want), (dtype, e)


@pytest.mark.parametrize("e", ENGINES)
def test_engines_nc3_against_oracle(e):
    """nc = 3: the renormalised result, against exact rationals (measured bound, docs/mc.md)."""
    g = torch.Generator().manual_seed(5)
    A = torch.randn(4, 30, dtype=torch.float64, generator=g)
    B = torch.randn(30, 3, dtype=torch.float64, generator=g)
    a, b = mc.MCTensor(A, 3, dtype=torch.float32), mc.MCTensor(B, 3, dtype=torch.float32)
    got = exact(mc.matmul(a, b, engine=e).components())
    Ar, Br = _rows(a), _rows(b)
    u3 = Fraction(1, 2**72)
    for i in range(4):
        for j in range(3):
            want = sum(sum(Ar[i][t]) * sum(Br[t][j]) for t in range(30))
            scale = sum(abs(sum(Ar[i][t]) * sum(Br[t][j])) for t in range(30))
            assert abs(got[i * 3 + j] - want) <= 8 * u3 * scale


# ----------------------------------------------------------------- the float engine
@pytest.mark.parametrize("k", [1, 7, 200, 4096, 1 << 17, 1 << 22])
@pytest.mark.parametrize("na,nb", [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("target", [22, 48, 106])
def test_float_engine_plan(k, na, nb, target):
    """Exact level sums fit in 53 bits; the tail bound meets the target; S is the smallest such."""
    S, beta, kb = ozaki_float.plan(k, na, nb, target)
    assert 1 <= kb <= k
    assert max(S, 1) * kb * na * nb * 2.0 ** (2 * beta) <= 2.0**53
    tail = 2 * (S + 1) ** 2 * kb * na * nb * max(na, nb) * 2.0 ** (-53 - S * beta)
    assert tail <= 2.0 ** (-target - 4)
    if S and kb == k:  # one slice fewer would not do
        b2 = (53 - math.ceil(math.log2(max(S - 1, 1) * kb * na * nb))) // 2
        assert 2 * S**2 * kb * na * nb * max(na, nb) * 2.0 ** (-53 - (S - 1) * b2) > 2.0 ** (-target - 4)


def test_float_engine_blocked_inner_dimension(monkeypatch):
    """With at most S = 0 allowed the inner dimension is cut into blocks: still within the bound."""
    monkeypatch.setattr(ozaki_float, "_S_MAX", 0)
    a, b = _operands("random", torch.float32, 2, seed=8, k=23)
    assert ozaki_float.plan(23, 1, 1, 48)[2] < 23
    _check_bound(a, b, mc.matmul(a, b, engine="float"), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_engine_native_and_torch_slicing_identical(dtype, monkeypatch):
    """The C slicer writes the torch slicer's bits (rows with zeros, subnormals, strides, k > 512)."""
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")  # CI runs with "0"; the C kernels are what is tested
    g = torch.Generator().manual_seed(9)
    for k in (5, 300, 1100):
        v = torch.randn(7, k, dtype=torch.float64, generator=g)
        v = v * torch.exp2(torch.randint(-30, 30, (7, k), generator=g).double())
        v[0] = 0
        v[1, :3] = 2.0**-1070 if dtype == torch.float64 else 2.0**-140
        comps = mc.MCTensor(v, 2, dtype=dtype).components() if dtype == torch.float32 else (v,)
        for cc in (comps, tuple(c.T.contiguous().T for c in comps)):
            assert cslices.available(cc)
            as64 = tuple(ozaki_float._as_f64(cc, PREC[dtype]))
            for S in (0, 1, 2, 4):
                native_ = (*ozaki_float._slice_left(cc, True, S, 20),
                           *ozaki_float._slice_right(cc, True, S, 20))
                torch_ = (*ozaki_float._slice_left(as64, False, S, 20),
                          *ozaki_float._slice_right(as64, False, S, 20))
                for x, y in zip(native_, torch_):
                    assert (x is None and y is None) or torch.equal(x.view(torch.int64), y.view(torch.int64))


def test_float_engine_native_and_torch_products(monkeypatch):
    """GEMM path: same slices, same GEMMs, same bits; the fused matrix-vector kernel sums the
    tail in another order: within the bound."""
    a, b = _operands("random", torch.float32, 2, seed=10)
    v = mc.MCTensor(torch.randn(40, 1, dtype=torch.float64), 2, dtype=torch.float32)
    native_mm, native_mv = mc.matmul(a, b, engine="float"), mc.matmul(a, v, engine="float")
    monkeypatch.setenv("ANYNUM_COMPILE", "0")  # the torch paths
    torch_mm, torch_mv = mc.matmul(a, b, engine="float"), mc.matmul(a, v, engine="float")
    for x, y in zip(native_mm.components(), torch_mm.components()):
        assert torch.equal(x, y)
    _check_bound(a, v, native_mv, torch.float32)
    _check_bound(a, v, torch_mv, torch.float32)


# ----------------------------------------------------------------- the engine choice
@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.setattr(engine, "_DECIDED", {})
    monkeypatch.setattr(engine, "_SETTING", ["auto"])
    monkeypatch.delenv(engine.ENV, raising=False)
    calls = []

    def fake(times):
        def probe(device):
            calls.append(device)
            return times
        monkeypatch.setattr(engine, "probe", probe)

    return fake, calls


def test_choice_probe_fast_int8(fresh_choice):
    fake, calls = fresh_choice
    fake((0.001, 0.040))  # int8 GEMM 40x faster than float64: AMX-like
    cpu = torch.device("cpu")
    assert engine.resolve(None, cpu) == "int8"
    assert engine.resolve(None, cpu) == "int8" and len(calls) == 1  # decided once per process
    assert engine.decide(cpu).int8_ms == 1.0


def test_choice_probe_slow_int8(fresh_choice):
    fake, _ = fresh_choice
    fake((0.001, 0.008))  # 8x: VNNI-like, and slower int8 (AVX2-only machines) likewise
    assert engine.resolve(None, torch.device("cpu")) == "float"
    a, b = _operands("random", torch.float32, 2, seed=11)
    _check_bound(a, b, mc.matmul(a, b), torch.float32)  # the automatic path runs that engine


def test_choice_threshold_and_devices(fresh_choice):
    fake, _ = fresh_choice
    fake((1.0, engine.INT8_ADVANTAGE))  # exactly at the threshold: float
    assert engine.decide(torch.device("cpu")).engine == "float"
    assert engine.decide(torch.device("cuda")).engine == "float"  # CUDA takes the same probe
    assert engine.decide(torch.device("meta")).engine == "native"


def test_choice_probe_without_int8_gemm(fresh_choice, monkeypatch):
    def broken(device):
        raise RuntimeError("_int_mm not implemented")

    monkeypatch.setattr(engine, "probe", broken)
    assert engine.decide(torch.device("cpu")).engine == "float"


def test_forcing_precedence(fresh_choice, monkeypatch):
    fake, calls = fresh_choice
    fake((0.001, 0.040))
    cpu = torch.device("cpu")
    monkeypatch.setenv(engine.ENV, "float")
    assert engine.resolve(None, cpu) == "float" and not calls  # env forces, no probe
    assert engine.report()["reason"] == f"forced ({engine.ENV})"
    mc.set_matmul_engine("wide")
    assert engine.resolve(None, cpu) == "wide"  # set_matmul_engine over the environment
    assert engine.resolve("int8", cpu) == "int8"  # engine= over both
    mc.set_matmul_engine("auto")
    monkeypatch.setenv(engine.ENV, "auto")
    assert engine.resolve(None, cpu) == "int8"


def test_bad_engine_names(fresh_choice, monkeypatch):
    monkeypatch.setenv(engine.ENV, "fast")
    with pytest.raises(AnynumError, match=engine.ENV):
        engine.resolve(None, torch.device("cpu"))
    monkeypatch.delenv(engine.ENV)
    with pytest.raises(AnynumError, match="auto"):
        mc.set_matmul_engine("int4")
    a = mc.MCTensor(torch.ones(2, 2))
    with pytest.raises(AnynumError, match="engine"):
        mc.matmul(a, torch.ones(2, 2), engine="gpu")


def test_real_probe_and_report():
    t_int8, t_f64 = engine.probe(torch.device("cpu"))
    assert t_int8 > 0 and t_f64 > 0
    rep = engine.report()
    assert rep["engine"] in ("int8", "float", "native", "wide")
    assert set(rep["cpu_flags"]) <= {"avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                                     "amx_int8", "amx_bf16", "asimd", "i8mm", "sve"}


@pytest.mark.parametrize("n", [1, 4])
def test_float_engine_row_chunks_across_threads_identical(n, monkeypatch):
    """Rows are sliced (and, for vectors, multiplied) in chunks, one per thread: same bits."""
    a, _ = _operands("spread", torch.float32, 1, seed=12, m=37, k=50)
    b = torch.randn(50, n, dtype=torch.float64).float()
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mc.matmul(a, b, engine="float").components()
        monkeypatch.setattr(cslices, "_CHUNK_MIN", 64)
        torch.set_num_threads(2)
        assert len(cslices._chunks(37, 50)) == 2
        two = mc.matmul(a, b, engine="float").components()
    finally:
        torch.set_num_threads(old)
    for x, y in zip(one, two):
        assert torch.equal(x, y)


# ----------------------------------------------------------------- the fused last step (mm_narrow)
def _float_mm(x, y, monkeypatch, *, mode: str = "auto", fused: bool = True):
    """mc.matmul on the float engine with ANYNUM_COMPILE=`mode`; `fused=False` keeps the C
    slicer but runs the unfused last step (_Scale, sum_terms, convert_comps) in torch."""
    with monkeypatch.context() as mp:
        mp.setenv("ANYNUM_COMPILE", mode)
        if not fused:
            mp.setattr(cslices, "EPI_MAX_S", -1)
        return mc.matmul(x, y, engine="float")


def _same_bits(r1, r2) -> None:
    c1 = r1.components() if isinstance(r1, mc.MCTensor) else r1
    c2 = r2.components() if isinstance(r2, mc.MCTensor) else r2
    assert len(c1) == len(c2)
    for x, y in zip(c1, c2):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32))


def _fused_cases():
    """(name, a, b) float32 operands: MC x tensor and MC x MC, every input kind, the shapes that
    take each route (GEMMs, matrix-vector kernel, vector-matrix by transposition, k = 1 where
    S = 0, columns past one 256-column segment), batches and non-contiguous views."""
    shapes = [(6, 40, 5), (1, 9, 8), (8, 9, 1), (5, 1, 4), (3, 30, 300)]
    for kind in ("random", "cancel", "spread", "subnormal"):
        for m, k, n in shapes:
            for nb in (1, 2):
                seed = hash((kind, m, k, n, nb)) % 2**31
                a, b = _operands(kind, torch.float32, nb, seed=seed, m=m, k=k, n=n)
                yield f"{kind}-{m}x{k}x{n}-nb{nb}", a, b
    g = torch.Generator().manual_seed(21)
    A = torch.randn(4, 3, 16, dtype=torch.float64, generator=g)
    B = torch.randn(16, 7, dtype=torch.float64, generator=g)
    a3, b = mc.MCTensor(A, 2, dtype=torch.float32), mc.MCTensor(B, 2, dtype=torch.float32)
    yield "batched-left", a3, b
    yield "batched-both", a3, mc.MCTensor(torch.randn(4, 16, 7, dtype=torch.float64, generator=g), 2,
                                         dtype=torch.float32)
    yield "batched-right", mc.MCTensor(A[0], 2, dtype=torch.float32), B.expand(2, 16, 7).float()
    big = torch.randn(30, 50, dtype=torch.float64, generator=g)
    at = mc.MCTensor(big, 2, dtype=torch.float32)
    at_t = mc.MCTensor(tuple(c.T for c in at.components()))  # transposed views (50, 30)
    yield "transposed-left", at_t, torch.randn(30, 6, generator=g)
    yield "strided-right", mc.MCTensor(big[:, :20], 2, dtype=torch.float32), big.float().T[::2, ::3][:20]
    yield "tensor-left", big.float().T[:7], at
    over = torch.randn(5, 8, dtype=torch.float64, generator=g) * 1e30
    yield "overflow", mc.MCTensor(over, 2, dtype=torch.float32), torch.full((8, 3), 3e9)


@pytest.mark.parametrize("case", list(_fused_cases()), ids=lambda c: c[0])
def test_fused_last_step_bit_identical(case, monkeypatch):
    """The fused C step writes the bits of the unfused steps and of the eager path (the matrix-
    vector kernel, which also takes vector-matrix products, sums its tail in another order than
    the eager GEMM: compared unfused only)."""
    _, a, b = case
    fused = _float_mm(a, b, monkeypatch)
    _same_bits(fused, _float_mm(a, b, monkeypatch, fused=False))
    if a.shape[-2] != 1 and b.shape[-1] != 1:
        _same_bits(fused, _float_mm(a, b, monkeypatch, mode="0"))


@pytest.mark.parametrize("kind", ["random", "cancel", "spread", "subnormal"])
@pytest.mark.parametrize("nb", [1, 2])
def test_fused_last_step_within_the_bound(kind, nb, monkeypatch):
    """The fused route against exact rationals (the proven bound of `anynum.mc.linalg`), and
    against the int8 engine on the same (native) route: both within the bound, so within twice
    the bound of each other."""
    a, b = _operands(kind, torch.float32, nb, seed=hash((kind, nb, "fused")) % 2**31, m=7, k=60, n=6)
    fused = _float_mm(a, b, monkeypatch)
    _check_bound(a, b, fused, torch.float32)
    with monkeypatch.context() as mp:
        mp.setenv("ANYNUM_COMPILE", "auto")
        int8 = mc.matmul(a, b, engine="int8")
    _check_bound(a, b, int8, torch.float32)
    v = b[:, :1] if nb == 1 else mc.MCTensor(tuple(c[:, :1] for c in b.components()))
    _check_bound(a, v, _float_mm(a, v, monkeypatch), torch.float32)


def test_fused_last_step_nonfinite_zero_and_empty(monkeypatch):
    """inf/NaN inputs (the native result there), zero rows and columns, empty operands: the
    fused route returns the eager route's bits."""
    g = torch.Generator().manual_seed(22)
    A = torch.randn(9, 12, dtype=torch.float64, generator=g)
    B = torch.randn(12, 7, dtype=torch.float64, generator=g)
    A[1, 3], A[4, 0], B[5, 2] = float("inf"), float("nan"), float("-inf")
    A[6] = 0.0
    B[:, 4] = 0.0
    a, b = mc.MCTensor(A, 2, dtype=torch.float32), mc.MCTensor(B, 2, dtype=torch.float32)
    for y in (b, B.float()):
        got = _float_mm(a, y, monkeypatch)
        _same_bits(got, _float_mm(a, y, monkeypatch, mode="0"))
        c0, c1 = got.components()
        nat = A.float() @ B.float()
        bad = ~torch.isfinite(nat)
        assert bad.any() and torch.equal(torch.isnan(c0), torch.isnan(nat))
        assert torch.equal(c0[bad & ~torch.isnan(nat)], nat[bad & ~torch.isnan(nat)])
        assert (c1[bad] == 0).all()
        assert (c0[6][~bad[6]] == 0).all() and (c1[6] == 0).all()  # 0 * inf is NaN, as native
        assert (c0[:, 4][~bad[:, 4]] == 0).all() and (c1[:, 4] == 0).all()
    zero = mc.MCTensor(torch.zeros(4, 5), 2)
    _same_bits(_float_mm(zero, torch.zeros(5, 3), monkeypatch), (torch.zeros(4, 3), torch.zeros(4, 3)))
    for m, k, n in ((0, 4, 3), (3, 0, 2), (3, 4, 0)):
        x = mc.MCTensor(torch.randn(m, k, dtype=torch.float64), 2, dtype=torch.float32)
        r = _float_mm(x, torch.randn(k, n), monkeypatch)
        assert r.shape == (m, n) and r.dtype == torch.float32
        assert all(bool((c == 0).all()) for c in r.components())


@pytest.mark.parametrize("n", [1, 6, 300])
def test_fused_last_step_threads_identical(n, monkeypatch):
    """Output rows in chunks, one per thread (1 and 2 threads): same bits."""
    monkeypatch.setenv("ANYNUM_COMPILE", "auto")
    a, _ = _operands("spread", torch.float32, 1, seed=23, m=37, k=50)
    b = torch.randn(50, n, dtype=torch.float64).float()
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mc.matmul(a, b, engine="float")
        monkeypatch.setattr(cslices, "_CHUNK_MIN", 64)
        torch.set_num_threads(2)
        assert len(cslices._chunks(37, 50 * 2)) == 2
        two = mc.matmul(a, b, engine="float")
    finally:
        torch.set_num_threads(old)
    _same_bits(one, two)


def test_fused_last_step_used(monkeypatch):
    """The float32 nc = 2 product takes the fused step when the C library is here, and not
    with ANYNUM_COMPILE=0, nc = 3 or float64 components."""
    calls = []
    real = cslices.mm_narrow

    def spy(*args):
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(cslices, "mm_narrow", spy)
    a, b = _operands("random", torch.float32, 2, seed=24)
    _float_mm(a, b, monkeypatch)
    from anynum.mc import native

    assert len(calls) == (1 if native.library() is not None else 0)
    _float_mm(a, b, monkeypatch, mode="0")
    _float_mm(mc.MCTensor(a.to_tensor(torch.float64), 3, dtype=torch.float32), b, monkeypatch)
    _float_mm(mc.MCTensor(a.to_tensor(torch.float64), 2), b.to(torch.float64), monkeypatch)
    assert len(calls) == (1 if native.library() is not None else 0)


def test_fused_last_step_scratch_reuse(monkeypatch):
    """Products large enough for the scratch pool: buffers reused across calls of one shape
    never leak into results (the eager route's bits, call after call; results independent)."""
    g = torch.Generator().manual_seed(25)
    ops = [mc.MCTensor(torch.randn(200, 100, dtype=torch.float64, generator=g), 2, dtype=torch.float32)
           for _ in range(2)]
    b = torch.randn(100, 180, generator=g)
    want = [_float_mm(x, b, monkeypatch, mode="0") for x in ops]
    first = _float_mm(ops[0], b, monkeypatch)
    for _ in range(2):
        for x, w in zip(ops, want):
            _same_bits(_float_mm(x, b, monkeypatch), w)
    _same_bits(first, want[0])  # not overwritten by the later calls


@pytest.mark.parametrize("S", [2, 3, 5])
def test_fused_last_step_more_slices(S, monkeypatch):
    """Plans with S > 1 (long inner dimensions; forced here with narrower slices): the fused
    step sums the S + 1 terms as sum_terms does, bit for bit, and stays within the bound."""
    real_plan = ozaki_float.plan

    def plan(k, na, nb, target):
        kb = real_plan(k, na, nb, target)[2]
        return S, (53 - math.ceil(math.log2(S * kb * na * nb))) // 2 - 3, kb

    monkeypatch.setattr(ozaki_float, "plan", plan)
    for nb in (1, 2):
        a, b = _operands("spread", torch.float32, nb, seed=26 + S, m=9, k=70, n=11)
        fused = _float_mm(a, b, monkeypatch)
        _same_bits(fused, _float_mm(a, b, monkeypatch, fused=False))
        _same_bits(fused, _float_mm(a, b, monkeypatch, mode="0"))
        _check_bound(a, b, fused, torch.float32)
