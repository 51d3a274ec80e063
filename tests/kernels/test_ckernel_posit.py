"""The C posit kernel's fast path (csrc/posit.c, anynum.kernels.positparams) equals the eager reference.

The fast path finds the number of dropped bits from a binade's exponent and settles what lies below
minpos and above maxpos by comparing bits, so its edges are the binades and the bit patterns inside
them. Inputs: every binade of the working type (float32: all; float64: those around the posit's range
and each regime boundary, and a sample of the rest) with the fraction patterns that decide at every
width of the dropped bits (zero, one, below, at and above half, the last kept bit), subnormals,
inf and NaN; the values of the (n+1)-bit posit (the n-bit values and every tie on the code) with
their float neighbours; random bit patterns. Formats: n from 3 to 32, es up to 9, scale_exp, both
underflow rules, ties below minpos that are normal, subnormal or below the working type's range.
Every float16 and bfloat16 bit pattern goes through a few of them; tests/kernels/test_ckernel.py
has more formats on its general inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anynum as an
from anynum.kernels.clib import library
from anynum.kernels.cparams import call_params
from anynum.kernels.eager import working_dtype
from anynum.quantize.checks import check_representable
from anynum.rounding import CounterRandom, Rounding

_INFO = {torch.float32: (23, 127, np.uint32, np.float32), torch.float64: (52, 1023, np.uint64, np.float64)}


def _patterns(man: int) -> np.ndarray:
    """Fraction patterns deciding at every dropped width: 0, 1, half - 1, half, half + 1, the step
    and its neighbours, half with the last kept bit set, all ones."""
    pats = {0, 1, (1 << man) - 1}
    for pc in range(1, man + 1):
        step, half = 1 << pc, 1 << (pc - 1)
        pats |= {half - 1, half, half + 1, step - 1, step, step + 1, step | half, (step | half) + 1}
    return np.array(sorted(p for p in pats if p < 1 << man), dtype=np.uint64)


def binade_inputs(fmt: an.Posit, wdtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    man, bias, uint, flt = _INFO[wdtype]
    top = 2 * bias + 1  # inf and NaN
    exps = np.arange(top + 1)
    if wdtype == torch.float64:
        lo = fmt.emin - (2 << fmt.es) - 3 + bias
        hi = fmt.emax + 3 + bias
        bounds = (np.arange(-(fmt.n - 1), fmt.n) << fmt.es) - fmt.scale_exp + bias
        near = (bounds[:, None] + np.arange(-2, 3)).ravel()
        keep = ((exps >= lo) & (exps <= hi) & ((hi - lo < 400) | (exps % 7 == 0))) | np.isin(exps, near)
        exps = exps[keep | (exps % 61 == 0) | (exps == top)]
    bits = (exps.astype(np.uint64)[:, None] << np.uint64(man)) | _patterns(man)[None, :]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 1 << (man + 1 + (11 if man == 52 else 8) - 1), 20_000, dtype=np.uint64)
    x = np.concatenate([bits.ravel(), raw]).astype(uint).view(flt)
    return torch.from_numpy(np.concatenate([x, -x]))


def grid_inputs(fmt: an.Posit, wdtype: torch.dtype) -> torch.Tensor:
    """Values of the (n+1)-bit posit (n <= 16), minpos, maxpos and the tie below minpos, with float
    neighbours (the tie may be subnormal or below the working type's range: dropped there)."""
    flt = _INFO[wdtype][3]
    pts = [fmt.minpos, fmt.maxpos, np.ldexp(1.0, fmt.emin - (1 << fmt.es))]
    if fmt.n <= 16:
        try:
            finer = an.Posit(fmt.n + 1, fmt.es, scale_exp=fmt.scale_exp)
        except an.AnynumError:  # its range passes float64's: the ties are powers of two (binade_inputs)
            finer = fmt
        pts += finer.decode(torch.arange(1, 1 << (finer.n - 1))).double().tolist()  # the positive codes
    with np.errstate(over="ignore", under="ignore"):
        p = np.asarray(pts, dtype=np.float64)
        p = p[(p > 0) & (p.astype(flt).astype(np.float64) == p)].astype(flt)
        x = np.concatenate([p, np.nextafter(p, flt(0)), np.nextafter(p, flt(np.inf))])
    return torch.from_numpy(np.concatenate([x, -x]))


FORMATS = [
    an.Posit(3, 0), an.Posit(3, 2), an.Posit(4, 1, underflow="zero"), an.Posit(5, 3), an.Posit(8, 0),
    an.Posit(7, 4, underflow="zero"), an.Posit(8, 1, scale_exp=-7), an.Posit(16, 1),
    an.Posit(13, 3, scale_exp=20, underflow="zero"), an.Posit(16, 3, underflow="zero"),
    an.Posit(24, 2, scale_exp=-30), an.Posit(31, 0), an.Posit(32, 2, underflow="zero"),
    an.Posit(8, 2, scale_exp=100, underflow="zero"),  # float32: the tie below minpos is subnormal
    an.Posit(3, 5, scale_exp=94, underflow="zero"),  # float32: minpos 2**-126, the tie below 2**-149
    an.Posit(3, 6), an.Posit(9, 6, underflow="zero"), an.Posit(32, 3), an.Posit(32, 5, scale_exp=-40),
    an.Posit(3, 9, scale_exp=510, underflow="zero"),  # float64: minpos 2**-1022, the tie below 2**-1074
    an.Posit(5, 8, scale_exp=-100),
]  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_binades_bit_patterns_and_grid(fmt: an.Posit, cn) -> None:  # type: ignore[no-untyped-def]
    for dtype in (torch.float32, torch.float64):
        try:
            check_representable(fmt, dtype)
        except an.AnynumError:
            continue  # quantize refuses it: values this dtype cannot hold
        wdtype = working_dtype(fmt, dtype)
        params = call_params(fmt, Rounding.NEAREST_EVEN, "saturate", None, dtype)
        assert params is not None and params.struct.p.fast == 1, (fmt, dtype)
        x = torch.cat([binade_inputs(fmt, wdtype), grid_inputs(fmt, wdtype)])
        if wdtype != dtype:
            x = x[x.to(dtype).to(wdtype) == x].to(dtype)  # float32 inputs of a float64 working type
        cn.check(fmt, x.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "fmt",
    [an.Posit(8, 0), an.Posit(12, 2, scale_exp=5, underflow="zero"), an.Posit(5, 1, scale_exp=-9),
     an.Posit(16, 1, underflow="zero")],
    ids=repr,
)  # fmt: skip
def test_every_half_and_bfloat16_pattern(fmt: an.Posit, dtype: torch.dtype, cn) -> None:  # type: ignore[no-untyped-def]
    x = torch.arange(1 << 16, dtype=torch.int64).to(torch.int16).view(dtype)
    vals = torch.from_numpy(fmt.values())
    if bool((vals.to(dtype).double() != vals).any()):
        return  # quantize refuses this dtype for fmt (test_ckernel covers the refusal)
    cn.check(fmt, x)


def test_narrow_and_out_of_range_formats_keep_the_general_loop() -> None:
    """n = 2 has no regime to keep, and a posit of values float32 cannot hold works in float64."""
    for fmt, dtype, fast in ((an.Posit(2, 0), torch.float32, 0), (an.Posit(2, 3), torch.float64, 0),
                             (an.Posit(6, 6), torch.float32, 1)):  # fmt: skip
        params = call_params(fmt, Rounding.NEAREST_EVEN, "saturate", None, dtype)
        assert params is not None and params.struct.p.fast == fast
    wide = call_params(an.Posit(6, 6), Rounding.NEAREST_EVEN, "saturate", None, torch.float32)
    assert wide is not None and wide.wdtype == torch.float64


def test_exact_sr_hands_back_undecided_elements_of_geometric_binades(cn) -> None:  # type: ignore[no-untyped-def]
    """Exact SR's position is a float64 ratio where exponent bits are dropped: element i's position
    shares its first 53 bits with its draw k and has more (posit(8,2) between 2**16 and 2**18,
    float64 inputs), so the run holding it is redone with the ratio and i handed back."""
    fmt, seed, n = an.Posit(8, 2), 5, 1000
    bits = CounterRandom(seed).bits_at(torch.arange(n), 53, 0)
    i = int(torch.argmin(bits))
    k = int(bits[i])
    j = (3 * k) // 2 + 1  # the position j / 3 * 2**-52 lies in (k, k + 1) * 2**-53
    x = torch.full((n,), 1.0, dtype=torch.float64)
    x[i] = 2.0**16 * (1 + j * 2.0**-52)
    params = call_params(fmt, Rounding.STOCHASTIC, "saturate", None, torch.float64)
    lib = library()
    assert params is not None and lib is not None
    y = torch.empty_like(x)
    base = CounterRandom(seed).stream_base(0) & ((1 << 64) - 1)
    assert lib.anynum_round(x.data_ptr(), y.data_ptr(), n, params.address, base, 1, None) == 1
    assert float(y[i]) == float(x[i])  # handed back untouched
    want = cn.reference(fmt, Rounding.STOCHASTIC, "saturate", None, x, seed=seed)
    cn.assert_same(cn.native(fmt, Rounding.STOCHASTIC, "saturate", None, x, seed=seed), want, x, "refined")


def test_exact_sr_decides_at_its_own_draw(cn) -> None:  # type: ignore[no-untyped-def]
    """Inputs whose dropped bits meet the element's own 53-bit draw exactly, and one unit either
    side: up only below the draw's threshold. posit(8,0) keeps 5 fraction bits at 1 and float64
    drops the other 47, so a draw with its low 6 bits clear is a dropped pattern (random inputs
    meet one with probability 2**-53)."""
    fmt, n = an.Posit(8, 0), 1 << 14
    draws = CounterRandom(7).bits_at(torch.arange(n), 53, 0)
    idx = (draws % (1 << 6) == 0).nonzero().reshape(-1)
    assert idx.numel() >= 30
    x = torch.full((n,), 1.5, dtype=torch.float64)
    for off, part in zip((-1, 0, 1), idx.tensor_split(3)):
        x[part] = 1.0 + ((draws[part] >> 6) + off).double() * 2.0**-52  # dropped: d / 2**47
    want = cn.reference(fmt, Rounding.STOCHASTIC, "saturate", None, x)
    assert 0 < int((want[idx] > 1.0).sum()) < idx.numel()  # both sides of the draws are met
    cn.assert_same(cn.native(fmt, Rounding.STOCHASTIC, "saturate", None, x), want, x, "exact SR at the draw")
