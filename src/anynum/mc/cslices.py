"""C kernels of the float engine (`anynum.mc.ozaki_float`), in the mc native library (`anynum.mc.native`).

* ``slice``: the row slicing of an operand whose entries are one float64 value each (a float32
  expansion of at most two components summed in float64, or a plain float64 tensor): per row
  the exponent e of the largest magnitude, then per entry ``x = v 2**(beta - e)`` and, per
  slice, ``q = nearbyint(x)`` (round half to even, as ``torch.round``), ``x = x - q``,
  ``x = x 2**beta``: the same IEEE operations as the torch path, so the same bits (tested),
  in two passes over the operand instead of about nine.
* ``mv``: a matrix-vector product fused with the slicing of the matrix: the exact level sums
  and the tail dot product are accumulated on the fly, so the matrix is read twice and nothing
  is written: a memory-bound product at about twice the cost of a float64 one.  The level sums
  are exact in any order (integers below 2**53); the tail is summed in eight interleaved
  float64 partial sums, which the error bound of the tail (any summation order) covers.

* ``mm_narrow``: the last step of a product with float32 components and nc = 2: the raw
  slice products are scaled, summed in float64 double-word arithmetic and narrowed to two
  float32 components (with the non-finite handling of the narrowing) in one pass, with the
  operations of `_Scale`, `sum_terms` and `anynum.mc.convert` in their order: the same bits
  (tested), writing the two result components and nothing else.

Compiled with the double-word loops, ``-ffp-contract=off`` and without fast-math.  No
compiler: the torch path runs.
"""

from __future__ import annotations

import torch

from anynum.kernels.settings import compile_mode
from anynum.mc.native import library, run_parallel

__all__ = ["EPI_MAX_S", "MV_MAX_S", "available", "mm_narrow", "mv", "slice_rows"]

MV_MAX_S = 8  # the fused matrix-vector kernel keeps at most 8 level sums per row
EPI_MAX_S = 32  # mm_narrow takes at most 32 level sums (EPI_MAX_S in the C source)

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CHUNK_MIN = 1 << 16  # elements per thread below which one call is cheaper than a thread hand-off


def available(comps: tuple[torch.Tensor, ...]) -> bool:
    """Whether the C kernels take this operand: one or two float32 components (or one float64),
    2-D CPU tensors of one shape and strides, ``ANYNUM_COMPILE`` "auto", a compiler here.

    >>> import torch
    >>> from anynum.mc import cslices
    >>> cslices.available((torch.ones(2, 2, dtype=torch.float16),))
    False
    """
    c0 = comps[0]
    if (c0.device.type != "cpu" or c0.dim() != 2 or compile_mode() != "auto"
            or not ((len(comps) <= 2 and c0.dtype == torch.float32)
                    or (len(comps) == 1 and c0.dtype == torch.float64))):
        return False
    if any(c.dtype != c0.dtype or c.shape != c0.shape or c.stride() != c0.stride() for c in comps):
        return False
    return library() is not None


def slice_rows(comps: tuple[torch.Tensor, ...], S: int, beta: int,
               q: tuple[torch.Tensor, int, int] | None, t: tuple[torch.Tensor, int, int, int],
               tmask: int, e: torch.Tensor) -> None:
    """Slice the rows of the (R, k) operand (see the module doc) into float64 buffers.

    Slice s of row r, element j goes to ``q[0]`` at ``s q[2] + r q[1] + j`` (element offsets);
    the remainder after m slices (for each bit m set in `tmask`) to ``t[0]`` at
    ``t[1] + m t[3] + r t[2] + j``; `e` (R,) int64 receives the row exponents.
    """
    lib = library()
    assert lib is not None
    c0 = comps[0]
    R, k = c0.shape
    rs, cs = c0.stride()
    a1 = comps[1].data_ptr() if len(comps) > 1 else None
    fn = getattr(lib, f"anynum_mc_slice_{_SUFFIX[c0.dtype]}")
    q_ptr, q_row, q_plane = (q[0].data_ptr(), q[1], q[2]) if q is not None else (0, 0, 0)
    buf, off, t_row, t_plane = t
    t_ptr = buf.data_ptr() + 8 * off
    size = c0.element_size()
    calls = []
    for r0, n in _chunks(R, k):  # rows in parallel: disjoint outputs
        calls.append([c0.data_ptr() + r0 * rs * size, a1 + r0 * rs * size if a1 else None, n, k,
                      rs, cs, S, beta, q_ptr + 8 * r0 * q_row if q_ptr else None, q_row, q_plane,
                      t_ptr + 8 * r0 * t_row, t_row, t_plane, tmask, e.data_ptr() + 8 * r0])
    run_parallel(fn, calls)


def mv(comps: tuple[torch.Tensor, ...], S: int, beta: int, bq: torch.Tensor | None,
       bt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused slicing and product with a sliced vector: (level sums (S, R), tail (R,), e (R,)).

    `bq` (S, k) holds the vector's slices, `bt` (S + 1, k) its remainders
    ``[RB_S, ..., RB_1, 2**beta RB_0]`` (both contiguous float64); S <= 8.
    """
    lib = library()
    assert lib is not None and S <= MV_MAX_S
    c0 = comps[0]
    R, k = c0.shape
    rs, cs = c0.stride()
    a1 = comps[1].data_ptr() if len(comps) > 1 else None
    lev = torch.empty(max(S, 1), R, dtype=torch.float64)
    tail = torch.empty(R, dtype=torch.float64)
    e = torch.empty(R, dtype=torch.int64)
    fn = getattr(lib, f"anynum_mc_mv_{_SUFFIX[c0.dtype]}")
    size = c0.element_size()
    bq_ptr = bq.data_ptr() if bq is not None else None
    calls = [[c0.data_ptr() + r0 * rs * size, a1 + r0 * rs * size if a1 else None, n, k, rs, cs,
              S, beta, bq_ptr, bt.data_ptr(), lev.data_ptr() + 8 * r0, R, tail.data_ptr() + 8 * r0,
              e.data_ptr() + 8 * r0] for r0, n in _chunks(R, k)]
    run_parallel(fn, calls)
    return lev[:S], tail, e


def mm_narrow(tail: torch.Tensor, lev: torch.Tensor | None, S: int, beta: int, e: torch.Tensor,
              f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The product's two float32 components from its raw float64 slice products.

    `tail` (m, n) and `lev` (S, m, n) (None when S = 0) hold the unscaled tail product and
    level sums (unit column stride), `e` (m,) and `f` (n,) the int64 row and column exponents
    (contiguous).  The components share one (2, m, n) allocation.
    """
    lib = library()
    assert lib is not None and S <= EPI_MAX_S
    m, n = tail.shape
    assert tail.stride(1) == 1 and (lev is None or lev.stride(2) == 1)
    assert e.is_contiguous() and f.is_contiguous() and e.dtype == f.dtype == torch.int64
    o0, o1 = torch.empty(2, m, n, dtype=torch.float32).unbind(0)
    t_row = tail.stride(0)
    l_row, l_plane = (lev.stride(1), lev.stride(0)) if lev is not None else (0, 0)
    lev_ptr = lev.data_ptr() if lev is not None else None
    c0, c1 = o0.data_ptr(), o1.data_ptr()
    calls = [[tail.data_ptr() + 8 * r0 * t_row, t_row,
              lev_ptr + 8 * r0 * l_row if lev_ptr is not None else None, l_row, l_plane, S, beta,
              rows, n, e.data_ptr() + 8 * r0, f.data_ptr(), c0 + 4 * r0 * n, c1 + 4 * r0 * n, n]
             for r0, rows in _chunks(m, n * (S + 1))]
    run_parallel(lib.anynum_mc_mm_narrow_f32, calls)
    return o0, o1


def _chunks(R: int, k: int) -> list[tuple[int, int]]:
    """Row ranges (start, count): one per intra-op thread when there is enough work."""
    parts = max(1, min(torch.get_num_threads(), R * k // _CHUNK_MIN, R))
    step = -(-R // parts)
    return [(r0, min(step, R - r0)) for r0 in range(0, R, step)]
