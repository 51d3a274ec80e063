"""MC matrix products with torch.matmul semantics, dispatched to an Ozaki engine.

Engines: ``"int8"`` (`anynum.mc.ozaki_int8`, exact int8 digit GEMMs, the default),
``"native"`` and ``"wide"`` (`anynum.mc.ozaki_classic`, floating-point slices).

Error bound: the result differs from the exact product by at most about
``(c_pairs + 2) u^2 * k * max_j |a_rj| * max_j |b_jc|`` for nc = 2, i.e. the bound is
relative to row/column maxima (normwise per row/column) rather than to ``|A| |B|``
entrywise; it is ``~u^2 (|A||B|)_rc`` when entries of a row/column have similar magnitudes.
"""

from __future__ import annotations

from anynum.errors import AnynumError
from anynum.mc._core import Comps
from anynum.mc.ozaki_classic import matmul_sliced
from anynum.mc.ozaki_int8 import matmul_int8

__all__ = ["ENGINES", "default_engine", "matmul", "set_matmul_engine"]

ENGINES = ("int8", "native", "wide")
_ENGINE = ["int8"]


def set_matmul_engine(engine: str) -> None:
    """Choose the default GEMM engine of MC matrix products: ``"int8"``, ``"native"`` or ``"wide"``.

    ``"int8"`` (default) cuts the operands into 7-bit integer digits and multiplies them
    with exact int8 x int8 -> int32 GEMMs (``torch._int_mm``), never a wider float type;
    ``"native"`` runs every GEMM in the component dtype; ``"wide"`` uses float32 GEMMs for
    float16/bfloat16 components and float64 GEMMs for float32 components.

    >>> from anynum import mc
    >>> mc.set_matmul_engine("wide"); mc.set_matmul_engine("int8")
    """
    if engine not in ENGINES:
        raise AnynumError(f"matmul engine must be one of {ENGINES}, got {engine!r}")
    _ENGINE[0] = engine


def default_engine() -> str:
    """The engine used when ``engine=None``.

    >>> from anynum.mc import linalg
    >>> linalg.default_engine() in linalg.ENGINES
    True
    """
    return _ENGINE[0]


def matmul2(a: Comps, b: Comps, nc: int, engine: str | None = None) -> Comps:
    """MC matrix product of a (..., m, k) and b (..., k, n) component tuples."""
    engine = engine or _ENGINE[0]
    if engine == "int8":
        return matmul_int8(a, b, nc)
    return matmul_sliced(a, b, nc, wide=engine == "wide")


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
