"""MC matrix products with torch.matmul semantics, dispatched to an Ozaki engine.

Engines (chosen by `anynum.mc.engine`): ``"int8"`` (`anynum.mc.ozaki_int8`, exact int8 digit
GEMMs), ``"float"`` (`anynum.mc.ozaki_float`, exact float64 slice GEMMs and one float64 tail
GEMM), and the classic ``"native"``/``"wide"`` slicing (`anynum.mc.ozaki_classic`).

The error bound shared by the int8 and float engines
-----------------------------------------------------
Notation: C = AB with A (m, k) and B (k, n) given as expansions of ``nA`` and ``nB``
components (1 for a plain tensor) of a dtype with precision p, ``u = 2**-p``; ``e_r`` is the
smallest integer with ``|a_rj^(i)| < 2**e_r`` for every component i and column j of row r
(so ``2**e_r <= 2 max_j,i |a_rj^(i)|``), ``f_c`` likewise for column c of B, and
``K_rc = k 2**(e_r + f_c)``.  Outputs are assumed free of overflow and of underflow (lower
output components in the subnormal range, e.g. float16 below about 2**-3, carry absolute
precision only; docs/mc.md).

**Theorem.** For nc = 2 and k <= 2**17, both engines return C' with, for every (r, c),

    |C'_rc - C_rc| <= 2 u^2 |C_rc| + 32 nA nB u^2 K_rc.

The bound is normwise per row and column; when the entries of a row (column) have similar
magnitudes it is a few ``u^2 (|A||B|)_rc``.  Both engines are tested against exact rational
arithmetic with this bound and with the tighter ``2 u^2 (|A||B|)_rc`` on random inputs, and
against each other (tests/mc/test_linalg.py).

*Proof, int8 engine.*  Each component is scaled by ``2**(7 - e_r)`` (exact) and cut into L
digits, ``q = trunc(r)``, ``r <- 128 frac(r)`` (exact, ``|q| <= 127``, all digits of a
component share its sign), with ``L = ceil((2p + 10) / 7)``, so ``2**-7L <= u^2 2**-10``; the
truncated rest of a component is below ``2**(e_r - 7L)``.  The engine sums exactly (int32 per
chunk of 2**17, int64 across chunks and diagonals) all digit pairs of level sum < L.  The
dropped pairs (level sum d >= L, at most L - 1 pairs per d and component pair) and the
truncated rests contribute at most ``(nA nB (L - 1) + nA + nB + 1) 2**-7L K_rc <=
0.07 nA nB u^2 K_rc`` (L <= 17 for float64).  The exact diagonal sums are combined exactly in
int64 (Horner in groups below 2**62), each group G split exactly into parts RN(G),
RN(G - RN(G)), ... of the work dtype (float32 for 16-bit components), scaled exactly, and the
N parts summed smallest first with DWPlusFP (JMP17 Alg. 4, error <= 2 u_w^2 of each exact
partial sum).  Since the digits of a component sum in magnitude to less than
``|a^(i)| 2**-e_r < 1``, the parts sum in magnitude to at most ``(1 + 3 u_w) nA nB K_rc``, so
the accumulation adds at most ``2 (N - 1)(1 + 4 u_w) u_w^2 nA nB K_rc``.  A group holds
``g >= 3`` diagonals when ``|diagonal sum| < 2**46`` (true for k <= 2**17: at most
``nA nB L k 127**2`` per diagonal), so N <= 3 ceil(L / 3) <= 9 parts for float32 (3 parts per
group) and N <= 2 ceil(17 / 3) = 12 for float64 (2 parts per group): at most
``22.1 nA nB u^2 K_rc``.  For float16/bfloat16 components ``u_w^2 <= 2**-26 u^2``, and the
final rounding of the float32 result to two components of the component dtype adds at most
``1.01 u^2 |C'_rc|``.  Total: within the bound.

*Proof, float engine.*  The operands become float64 expansions; an expansion of at most
49 bits (float32 nc = 2, and 16-bit components) is summed into one float64, changing each
entry by at most ``2**-53`` of its magnitude: at most ``2.01 2**-53 K_rc <= 2**-4 u^2 K_rc``
in all (p <= 24 there).  Rows are cut as in `anynum.mc.ozaki_float` with exact operations
(power-of-two scalings, ``q = round(x)`` and ``x - q``, which is exact); the level sums of
the first S slices are exact integer GEMMs (every partial sum an integer below 2**53), and the
tail GEMM, by the choice of S, errs by at most ``2**-(2p + 4) K_rc = u^2 K_rc / 16``.  The
S + 1 terms are summed smallest first with float64 DWPlusFP: at most
``2 S u_64^2 (1 + 2**-20) 2.3 nA nB K_rc``, where 2.3 bounds the magnitude sum of the terms
(rounded digits: ``|q_0| <= 2**beta + 1/2``, ``|q_s| <= 2**(beta-1) + 1/2`` after it).  For
16-bit and float32 components ``u_64^2 <= 2**-58 u^2``: negligible.  For float64 components
u_64 = u, S <= 6 for k <= 2**17 (`plan`): at most ``27.6 nA nB u^2 K_rc``.  Finally, for
components narrower than float64, the float64 double-word is rounded to two components of the
component dtype: at most ``1.01 u^2 |C'_rc|``.  Total: within the bound.  QED.

For nc >= 3 both engines end with an nc-term renormalisation (`anynum.mc.expansion`), whose
bound is measured, not proven (docs/mc.md); the truncation and exact-slice parts of the
proofs above hold with ``u^nc`` for ``u^2``.
"""

from __future__ import annotations

from anynum.mc import engine as engines
from anynum.mc._core import Comps
from anynum.mc.ozaki_classic import matmul_sliced
from anynum.mc.ozaki_float import matmul_float
from anynum.mc.ozaki_int8 import matmul_int8

__all__ = ["matmul"]


def matmul2(a: Comps, b: Comps, nc: int, engine: str | None = None) -> Comps:
    """MC matrix product of a (..., m, k) and b (..., k, n) component tuples."""
    chosen = engines.resolve(engine, a[0].device)
    if chosen == "int8":
        return matmul_int8(a, b, nc)
    if chosen == "float":
        return matmul_float(a, b, nc)
    return matmul_sliced(a, b, nc, wide=chosen == "wide")


def matmul(a: Comps, b: Comps, nc: int, engine: str | None = None) -> Comps:
    """torch.matmul semantics (1-D operands, broadcasting batch dims).

    >>> import torch
    >>> from anynum.mc import linalg
    >>> r = linalg.matmul((torch.tensor([1.0, 2.0**-30]), torch.zeros(2)), (torch.ones(2),), 2)
    >>> r[0].item(), r[1].item() == 2.0**-30
    (1.0, True)
    """
    a1 = a[0].dim() == 1
    b1 = b[0].dim() == 1
    if a1:
        a = tuple(c.unsqueeze(0) for c in a)
    if b1:
        b = tuple(c.unsqueeze(-1) for c in b)
    r = matmul2(a, b, nc, engine)
    if a1 and b1:
        return tuple(c[..., 0, 0] for c in r)
    if b1:
        return tuple(c.squeeze(-1) for c in r)
    if a1:
        return tuple(c.squeeze(-2) for c in r)
    return r
