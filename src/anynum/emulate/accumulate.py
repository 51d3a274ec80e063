"""Accumulation: how sums and dot products add up (float64, a format, or the exact quire).

One engine serves `an.emulate`, `an.EmulatedTensor`, `an.matmul` (`anynum.emulate.matmul`) and the
``accumulate=`` reductions of ``an.ops``. Its inputs are values already on the
operand format's grid; its result is rounded once onto the result grid.

=====================  ==========================================================================
``accumulate=``        semantics
=====================  ==========================================================================
``None``               the sum in float64, rounded once (elementwise-correct; long sums are
                       float64-accurate, not exact: exact sums are the quire's job)
a Format ``fmt2``      each product rounded to fmt2 (``fma=True``: kept exact, one rounding per
                       multiply-add), each partial sum rounded to fmt2, in ``order``:
                       ``"sequential"`` (left to right along the reduction axis),
                       ``"pairwise"`` (a balanced tree: pairs of neighbours, level by level, a
                       lone last node passed up), or an int k (k exact products summed exactly,
                       that block sum added to the running sum with one rounding)
``"quire"``            (posits) the exact sum of the exact products, rounded once; exact for any
                       magnitudes and cancellation (integer accumulation, see `exact`)
=====================  ==========================================================================

The final result is rounded onto the result grid. ``bias`` (addmm, baddbmm,
convolution) is added to the accumulated value with that one final rounding:
``round(beta * bias + alpha * acc)``, exactly.

Using the engine (what ``an.ops`` reductions do)::

    acc = Accumulator(Accumulation.resolve("posit(16,1)", "pairwise"), Grid("posit(16,1)"))
    y = acc.sum(x64, dims=(1,), out=Grid("posit(16,1)"))     # float64 values on the out grid

Every function takes and returns float64 tensors; callers cast.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from anynum.emulate import native
from anynum.emulate.exact import add_tail, exact_dot, exact_sum
from anynum.emulate.grid import Grid
from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.block import Block
from anynum.formats.posit import Posit
from anynum.formats.registry import format as lookup_format
from anynum.mc.eft import two_prod, two_sum

__all__ = ["ORDERS", "Accumulation", "Accumulator", "native_sequential", "significant_bits"]

#: The named orders; an int k >= 1 is the third kind.
ORDERS = ("sequential", "pairwise")

_F64 = torch.float64

#: The native sequential kernel, ``f(a, b, grid, fma, exact) -> float64 tensor or None`` (None: the
#: torch loop, which is also the reference); tests swap it out to compare the two.
native_sequential: list[Callable[..., torch.Tensor | None] | None] = [native.sequential_dot]


@dataclass(frozen=True)
class Accumulation:
    """What ``accumulate=``, ``order=`` and ``fma=`` mean, validated (see the module docstring).

    ``kind`` is "float64", "format" or "quire"; ``fmt`` is the accumulator
    format for "format".

    >>> import anynum as an
    >>> Accumulation.resolve("bf16", 4)
    Accumulation(kind='format', fmt=BF16, order=4, fma=False)
    >>> Accumulation.resolve("quire", result_format=an.FP16)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    anynum.errors.AnynumError: accumulate='quire' is the posit standard's exact accumulator: ...
    """

    kind: str
    fmt: Format | None = None
    order: str | int = "sequential"
    fma: bool = False

    @classmethod
    def resolve(
        cls,
        accumulate: Format | str | None,
        order: str | int = "sequential",
        fma: bool = False,
        *,
        result_format: Format | None = None,
    ) -> Accumulation:
        """Validate the user's ``accumulate=``/``order=``/``fma=``; AnynumError names what is wrong."""
        if isinstance(order, bool) or not (order in ORDERS or isinstance(order, int)):
            raise AnynumError(
                f"order= expected 'sequential', 'pairwise' or an int k >= 1 (k exact products per "
                f"rounding), received {order!r}. Fix: pass one of those."
            )
        if isinstance(order, int) and order < 1:
            raise AnynumError(
                f"order= as an int is the number of exact products summed per rounding: expected "
                f"k >= 1, received {order}. Fix: pass k >= 1 (order=1 is sequential with fma=True)."
            )
        if not isinstance(fma, bool):
            raise AnynumError(f"fma= expected True or False, received {fma!r}.")
        if accumulate is None:
            return cls("float64", None, order, fma)
        if isinstance(accumulate, str) and accumulate.strip().lower() == "quire":
            if result_format is not None and not isinstance(result_format, Posit):
                raise AnynumError(
                    "accumulate='quire' is the posit standard's exact accumulator: expected a Posit "
                    f"result format, received {result_format.display_name()}. Fix: emulate a posit "
                    "(an.format('posit(16,2)')), or use accumulate=None (float64) or a format."
                )
            return cls("quire", None, order, fma)
        if not isinstance(accumulate, (Format, str)):
            raise AnynumError(
                "accumulate= expected None, 'quire' or a Format (or format name), received "
                f"{type(accumulate).__name__} {accumulate!r}. Fix: e.g. accumulate=an.FP32."
            )
        fmt = lookup_format(accumulate)
        if isinstance(fmt, Block):
            raise AnynumError(
                f"accumulate= expected an elementwise format for the partial sums, received the block "
                f"format {fmt.display_name()}. Fix: accumulate in its element or in FP32."
            )
        return cls("format", fmt, order, fma)


class Accumulator:
    """An `Accumulation` bound to a rounding mode and stream (the grid of its partial sums).

    Methods take float64 tensors whose values are on the operand grid and return
    float64 tensors rounded once onto the result grid `out`.

    >>> import torch, anynum as an
    >>> out = Grid(an.FP32)
    >>> acc = Accumulator(Accumulation.resolve(an.BF16), out)
    >>> x = torch.tensor([[1.0, 2.0**-9, 2.0**-9]], dtype=torch.float64)
    >>> acc.sum(x, (1,), out).tolist()    # 1 + 2**-9 rounds back to 1 in bf16, twice
    [1.0]
    >>> Accumulator(Accumulation.resolve(None), out).sum(x, (1,), out).tolist()
    [1.00390625]
    """

    def __init__(self, spec: Accumulation, rounding_from: Grid) -> None:
        self.spec = spec
        self._exact = True
        self._stochastic = rounding_from.stochastic
        self.grid: Grid | None = None
        if spec.kind == "format":
            assert spec.fmt is not None
            seed = rounding_from.next_seed() if rounding_from.stochastic else None
            self.grid = Grid(spec.fmt, rounding_from.mode, seed=seed)

    def __repr__(self) -> str:
        return f"Accumulator({self.spec})"

    @functools.cached_property
    def zero_terms_vanish(self) -> bool:
        """Whether a dot product may leave out terms that are exact zero products, split into
        several dot products (same result, and no random stream to keep in step).

        True for the quire in a deterministic mode (an exact sum, rounded once onto a posit grid,
        which has one zero), and for ``order="sequential"`` onto a grid in a deterministic mode
        that rounds both zeros to +0: a zero product rounds to +0 and a partial sum plus +0
        rounds to itself, so the terms left over give the same sum. Products with a non-finite
        factor are the caller's to exclude (0 * inf is NaN).
        """
        if self.spec.kind == "quire":
            return not self._stochastic
        g = self.grid
        if self.spec.kind != "format" or self.spec.order != "sequential" or g is None or g.stochastic:
            return False
        z = g.round(torch.tensor([0.0, -0.0], dtype=_F64))
        return bool((z == 0).all()) and not bool(torch.signbit(z).any())

    # --- dot products --------------------------------------------------------------------------
    def dot(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: Grid,
        *,
        bias: torch.Tensor | None = None,
        alpha: float = 1.0,
        beta: float = 1.0,
        operand_bits: int | None = None,
    ) -> torch.Tensor:
        """``round_out(beta * bias + alpha * (a @ b))`` with the products accumulated per the spec.

        `operand_bits`: the significant bits of the operands' grid, when known (products of
        grids of at most 26 bits are exact in float64); None measures them.

        `a` is [..., M, K], `b` [..., K, N] (batch dimensions broadcast); `bias`
        broadcasts to the result.
        """
        y, e = self.dot_pair(a, b, operand_bits=operand_bits)
        if bias is None and alpha == 1.0:
            return out.round_pair(y, e, force=self.spec.kind == "quire")
        y, e = _affine(y, e, alpha, bias, beta, exact=self.spec.kind != "float64")
        return out.round_pair(y, e, force=self.spec.kind != "float64")

    def dot_pair(
        self, a: torch.Tensor, b: torch.Tensor, *, operand_bits: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The accumulated ``a @ b`` before the final rounding, as ``(y, e)`` (e = 0 unless exact)."""
        a, b = a.to(_F64), b.to(_F64)
        kind = self.spec.kind
        if kind == "float64" or a.shape[-1] == 0:
            y = a @ b
            return y, torch.zeros_like(y)
        if kind == "quire":
            return exact_dot(a, b)
        assert self.grid is not None
        if operand_bits is not None and operand_bits <= 26:
            self._exact = True  # products of two values of at most 26 bits are exact in float64
        else:
            self._exact = significant_bits(a) + significant_bits(b) <= 53
        order = self.spec.order
        if order == "sequential":
            s = self._sequential(a, b)
        elif order == "pairwise":
            s = self._pairwise(a, b)
        else:
            s = self._blocked(a, b, int(order))
        return s, torch.zeros_like(s)

    def _product(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """a * b exactly, as a pair (the error is 0 where float64 holds the product)."""
        if self._exact:
            p = a * b
            return p, torch.zeros_like(p)
        return two_prod(*torch.broadcast_tensors(a, b))

    def _add(self, s: torch.Tensor | None, p: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
        """One step: ``round(s + p)`` (p already rounded) or ``round(s + p + pe)`` (fma)."""
        g = self.grid
        assert g is not None
        fma = self.spec.fma
        if s is None:
            return g.round_pair(p, pe, force=fma or not self._exact)
        y, e = two_sum(s, p)
        if fma:
            y, e = add_tail(y, e, pe)
        return g.round_pair(y, e, force=fma)

    def _leaf(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A product as it enters the accumulator: rounded to fmt2, or exact under fma."""
        p, pe = self._product(a, b)
        if self.spec.fma:
            return p, pe
        assert self.grid is not None
        return self.grid.round_pair(p, pe, force=not self._exact), torch.zeros_like(p)

    def _sequential(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Left to right along K, vectorised over the outputs (the torch reference loop)."""
        assert self.grid is not None
        native = native_sequential[0]
        if native is not None:
            res = native(a, b, self.grid, self.spec.fma, self._exact)
            if res is not None:
                return res
        s: torch.Tensor | None = None
        for k in range(a.shape[-1]):
            p, pe = (self._product if self.spec.fma else self._leaf)(
                a[..., :, k : k + 1], b[..., k : k + 1, :]
            )
            s = self._add(s, p, pe)
        assert s is not None
        return s

    def _pairwise(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """A balanced tree along K: neighbours summed level by level, a lone last node passed up."""
        g = self.grid
        assert g is not None
        p, pe = self._leaf(a.unsqueeze(-1), b.unsqueeze(-3))  # [..., M, K, N]
        force = self.spec.fma or not self._exact  # unrounded leaves may still be in the tree
        while p.shape[-2] > 1:
            k = p.shape[-2]
            even = k - k % 2
            y, e = two_sum(p[..., 0:even:2, :], p[..., 1:even:2, :])
            if force:
                y, e = add_tail(y, e, pe[..., 0:even:2, :] + pe[..., 1:even:2, :])
            s = g.round_pair(y, e, force=force)
            p = torch.cat([s, p[..., even:, :]], dim=-2)
            pe = torch.cat([torch.zeros_like(s), pe[..., even:, :]], dim=-2)
        if a.shape[-1] == 1 and self.spec.fma:  # a lone exact product is rounded at the root
            return g.round_pair(p[..., 0, :], pe[..., 0, :], force=True)
        return p[..., 0, :]

    def _blocked(self, a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
        """Blocks of k exact products summed exactly; each block sum added to the running sum, rounded."""
        assert self.grid is not None
        s: torch.Tensor | None = None
        for start in range(0, a.shape[-1], k):
            ab = a[..., :, start : start + k].unsqueeze(-1)
            bb = b[..., start : start + k, :].unsqueeze(-3)
            p, pe = two_prod(*torch.broadcast_tensors(ab, bb))  # [..., M, k, N], exact pairs
            terms = torch.cat([p, pe], dim=-2)
            if s is not None:
                terms = torch.cat([terms, s.unsqueeze(-2)], dim=-2)
            y, e = exact_sum(terms, dim=-2)  # the quire machinery, per output
            s = self.grid.round_pair(y, e, force=True)
        assert s is not None
        return s

    # --- reductions ----------------------------------------------------------------------------
    def sum(self, x: torch.Tensor, dims: Sequence[int], out: Grid, *, keepdim: bool = False) -> torch.Tensor:
        """``round_out(sum of x over dims)``, accumulated per the spec (row-major order over dims)."""
        y, e, shape = self._sum_pair(x, dims, keepdim)
        return out.round_pair(y, e, force=self.spec.kind == "quire").reshape(shape)

    def mean(self, x: torch.Tensor, dims: Sequence[int], out: Grid, *, keepdim: bool = False) -> torch.Tensor:
        """``round_out(sum / n)``: the accumulated sum divided exactly by the count, rounded once."""
        y, e, shape = self._sum_pair(x, dims, keepdim)
        n = math.prod(x.shape[d] for d in _dims(x, dims)) if x.dim() else 1
        if n == 0:
            return torch.full(shape, math.nan, dtype=_F64, device=x.device)
        q = y / n
        p, pe = two_prod(q, torch.full_like(q, float(n)))
        r = ((y - p) - pe + e) / n
        return out.round_pair(q, r, force=True).reshape(shape)

    def norm2(
        self, x: torch.Tensor, dims: Sequence[int], out: Grid, *, keepdim: bool = False
    ) -> torch.Tensor:
        """``round_out(sqrt(sum of x**2))``: squares are the dot product's terms, one final rounding."""
        x64, _, out_shape = _move_reduced(x.to(_F64), dims, keepdim)
        y, e = self.dot_pair(x64.unsqueeze(-2), x64.unsqueeze(-1))
        y, e = y[..., 0, 0], e[..., 0, 0]
        q = torch.sqrt(y)
        p, pe = two_prod(q, q)
        r = ((y - p) - pe + e) / (2 * q)
        r = torch.where(q > 0, r, torch.zeros_like(r))
        return out.round_pair(q, r, force=True).reshape(out_shape)

    def _sum_pair(
        self, x: torch.Tensor, dims: Sequence[int], keepdim: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
        x64, _, out_shape = _move_reduced(x.to(_F64), dims, keepdim)
        if self.spec.kind == "float64":
            y = x64.sum(-1)
            return y, torch.zeros_like(y), out_shape
        ones = torch.ones(x64.shape[-1], 1, dtype=_F64, device=x.device)
        y, e = self.dot_pair(x64.unsqueeze(-2), ones, operand_bits=1)  # x * 1 is exact
        return y[..., 0, 0], e[..., 0, 0], out_shape

    def cumsum(self, x: torch.Tensor, dim: int, out: Grid) -> torch.Tensor:
        """Prefix sums along `dim`; each prefix accumulated in order (sequential: the running partial
        sums; quire: each prefix exact; float64: torch's cumsum), then rounded once onto `out`.

        Orders "pairwise" and int k accumulate prefix sums sequentially (a prefix sum is a sequential
        scan by nature).
        """
        x64 = torch.movedim(x.to(_F64), dim, -1)
        kind = self.spec.kind
        if kind == "float64":
            res = out.round(torch.cumsum(x64, -1))
        elif kind == "quire":
            tri = torch.ones(x64.shape[-1], x64.shape[-1], dtype=_F64, device=x.device).triu()
            y, e = exact_dot(x64.unsqueeze(-2), tri)
            res = out.round_pair(y[..., 0, :], e[..., 0, :], force=True)
        else:
            assert self.grid is not None
            self._exact = True  # the terms are the values themselves
            s: torch.Tensor | None = None
            parts = []
            for k in range(x64.shape[-1]):
                p, pe = x64[..., k], torch.zeros_like(x64[..., k])
                if not self.spec.fma:
                    p = self.grid.round(p)
                s = self._add(s, p, pe)
                parts.append(s)
            res = out.round(torch.stack(parts, -1)) if parts else out.round(x64)
        return torch.movedim(res, -1, dim)

    def prod(self, x: torch.Tensor, dims: Sequence[int], out: Grid, *, keepdim: bool = False) -> torch.Tensor:
        """Product over dims: float64 and quire (which accumulates sums, not products) round the float64
        product once; a format rounds each factor and each partial product ("pairwise": a balanced
        tree; an int k and "sequential": left to right; fma does not apply)."""
        x64, _, out_shape = _move_reduced(x.to(_F64), dims, keepdim)
        if self.spec.kind != "format":
            return out.round(torch.prod(x64, -1)).reshape(out_shape)
        g = self.grid
        assert g is not None
        terms = g.round(x64)
        if terms.shape[-1] == 0:
            return out.round(torch.ones(out_shape, dtype=_F64, device=x.device))
        if self.spec.order == "pairwise":
            while terms.shape[-1] > 1:
                k = terms.shape[-1]
                even = k - k % 2
                y, e = two_prod(terms[..., 0:even:2], terms[..., 1:even:2])
                s = g.round_pair(y, e, force=True)
                terms = torch.cat([s, terms[..., even:]], -1)
            acc = terms[..., 0]
        else:
            acc = terms[..., 0]
            for k in range(1, terms.shape[-1]):
                y, e = two_prod(acc, terms[..., k])
                acc = g.round_pair(y, e, force=True)
        return out.round(acc).reshape(out_shape)


def significant_bits(x: torch.Tensor) -> int:
    """Significant bits of the widest finite element of x (0 for an all-zero or empty tensor).

    >>> significant_bits(torch.tensor([1.5, 0.75, 3.0]))
    2
    """
    if x.numel() == 0:
        return 0
    m, _ = torch.frexp(x[torch.isfinite(x)])
    if m.numel() == 0:
        return 0
    mm = (m.abs() * 2.0**53).to(torch.int64)
    mm = mm[mm != 0]
    if mm.numel() == 0:
        return 0
    lowbit = mm & (-mm)
    tz = int(torch.log2(lowbit.to(_F64)).round().min())
    return 53 - tz


def _affine(
    y: torch.Tensor, e: torch.Tensor, alpha: float, bias: torch.Tensor | None, beta: float, *, exact: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``alpha * (y + e) + beta * bias`` as a pair (exactly when `exact`, else in float64)."""
    if not exact:
        r = alpha * (y + e)
        if bias is not None:
            r = r + beta * bias.to(_F64)
        return r, torch.zeros_like(r)
    if alpha == 1.0 and beta == 1.0 and bias is not None:
        # y (a value of the accumulator's grid, or the quire's pair) plus a bias: TwoSum, then e
        yb, eb = two_sum(*torch.broadcast_tensors(y, bias.to(_F64)))
        # a zero e (sequential and blocked sums end on the grid) leaves the pair as it is: add_tail
        # would give (yb, eb + 0), the same pair up to the sign of a zero error, which no rounding reads
        return add_tail(yb, eb, e) if bool(e.any()) else (yb, eb)
    al = torch.full_like(y, float(alpha))
    p1, q1 = two_prod(al, y)
    terms = [p1, q1, al * e]
    if bias is not None:
        bb = bias.to(_F64).expand_as(y)
        p2, q2 = two_prod(torch.full_like(y, float(beta)), bb)
        terms += [p2, q2]
    return exact_sum(torch.stack(terms, dim=-1))


def _dims(x: torch.Tensor, dims: Sequence[int]) -> list[int]:
    if x.dim() == 0:
        return []
    return sorted({d % x.dim() for d in dims}) if dims else list(range(x.dim()))


def _move_reduced(
    x: torch.Tensor, dims: Sequence[int], keepdim: bool
) -> tuple[torch.Tensor, Any, torch.Size]:
    """x with the reduced dims flattened (row-major) into the last axis; and the result shape."""
    if x.dim() == 0:
        return x.reshape(1), None, torch.Size([])
    red = _dims(x, dims)
    keep = [d for d in range(x.dim()) if d not in red]
    moved = x.permute(*keep, *red).reshape(*[x.shape[d] for d in keep], -1)
    if keepdim:
        shape = torch.Size([1 if d in red else x.shape[d] for d in range(x.dim())])
    else:
        shape = torch.Size([x.shape[d] for d in keep])
    return moved, keep, shape
