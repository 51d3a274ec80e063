"""Convolutions as dot products, so that accumulation formats and Block operands apply to them.

A 1-d or 2-d convolution (forward, transposed, and both backward products)
becomes ``unfold`` (im2col) plus one batched matrix product whose reduction axis
is spelled out here, because ``order="sequential"`` follows it:

================  =============================================================================
product           reduction axis, in order (row-major)
================  =============================================================================
forward           (input channel of the group, kernel row, kernel column)
grad_weight       (batch, output row, output column)
grad_input        (output channel of the group, kernel row, kernel column), kernel reversed
grad_bias         (batch, output row, output column)
================  =============================================================================

grad_input is the transposed convolution: the output gradient with ``stride - 1``
zeros inserted between its elements, padded, and convolved with the flipped,
transposed kernel. Zeros add nothing to a sum (a partial sum plus an exact zero
rounds to itself), so the inserted zeros do not change any accumulation.

Where the caller says so (``skip_zeros``: sequential accumulation in a deterministic
mode onto a grid that rounds both zeros to +0, so that a zero product and the
partial sum plus it are exactly what came before), the transposed convolution
leaves those zero terms out instead of materialising them: output rows (and
columns) are grouped by the kernel taps that meet a real input element, and each
group is one product over just those taps, in the same order. The second
convolution's grad_input in LeNet-5 (1x1 outputs padded to 9x9) has 25 times fewer
terms that way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from anynum.errors import AnynumError

__all__ = ["conv_backward", "conv_forward"]

#: ``dot(a [..., M, K], b [..., K, N], bias=None) -> [..., M, N]``, accumulated and rounded.
Dot = Callable[..., torch.Tensor]


def _pair(v: Sequence[int], one: int) -> tuple[int, int]:
    return (one, int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _as_2d(x: torch.Tensor, spatial: int) -> torch.Tensor:
    return x.unsqueeze(-2) if spatial == 1 else x


def _check(spatial: int) -> None:
    if spatial not in (1, 2):
        raise AnynumError(
            f"accumulate= and Block formats support 1-d and 2-d convolutions, received a {spatial}-d one. "
            "Fix: accumulate=None (float64, rounded once) for this model, or exclude='convolution'."
        )


def _patches(
    x: torch.Tensor, kernel: tuple[int, int], groups: int, stride: tuple[int, int], padding: tuple[int, int],
    dilation: tuple[int, int],
) -> torch.Tensor:
    """im2col as a strided view: [N, g, C/g, H_out, W_out, kh, kw] (no copy).

    torch's F.unfold (im2col) copies float64 patches 10 to 75 times slower than this view
    plus one permuted copy by the caller.
    """
    n, c = x.shape[:2]
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0])) if any(padding) else x
    v = xp.unfold(2, dilation[0] * (kernel[0] - 1) + 1, stride[0])
    v = v.unfold(3, dilation[1] * (kernel[1] - 1) + 1, stride[1])  # [N, C, Ho, Wo, span_h, span_w]
    v = v[..., :: dilation[0], :: dilation[1]]
    return v.reshape(n, groups, c // groups, *v.shape[2:])


def _conv(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    dot: Dot,
) -> torch.Tensor:
    """conv2d(x, w) with the reduction (channel, kernel row, kernel column) done by `dot`."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    g = groups
    v = _patches(x, (kh, kw), g, stride, padding, dilation)  # [N, g, cg, Ho, Wo, kh, kw]
    hout, wout = v.shape[3], v.shape[4]
    k = cg * kh * kw
    b = v.permute(1, 2, 5, 6, 0, 3, 4).reshape(g, k, n * hout * wout)  # [g, K, N*L]
    a = w.reshape(g, o // g, k)
    bias_g = bias.reshape(g, o // g, 1) if bias is not None else None
    y = dot(a, b, bias=bias_g)  # [g, O/g, N*L]
    return y.view(o, n, hout, wout).transpose(0, 1)


def _dilate(x: torch.Tensor, stride: tuple[int, int]) -> torch.Tensor:
    """x with stride - 1 zeros inserted between neighbours along both spatial axes."""
    if stride == (1, 1):
        return x
    n, c, h, w = x.shape
    out = x.new_zeros(n, c, (h - 1) * stride[0] + 1, (w - 1) * stride[1] + 1)
    out[:, :, :: stride[0], :: stride[1]] = x
    return out


def _tap_groups(
    n_out: int, n_in: int, taps: int, dilation: int, stride: int, before: int
) -> dict[tuple[int, ...], list[int]]:
    """Output positions along one axis of a transposed convolution, grouped by their kernel taps
    (flipped kernel) that meet a real input element rather than padding or an inserted zero.

    Output position y and tap i read position ``y + i * dilation - before`` of the input dilated
    by `stride`; a real element when that is in range and a multiple of `stride`.

    >>> _tap_groups(4, 2, 3, 1, 1, 2)   # 2 inputs, kernel 3, full padding: 4 outputs
    {(2,): [0], (1, 2): [1], (0, 1): [2], (0,): [3]}
    """
    span = (n_in - 1) * stride + 1
    out: dict[tuple[int, ...], list[int]] = {}
    for y in range(n_out):
        hit = tuple(
            i for i in range(taps)
            if 0 <= y + i * dilation - before < span and (y + i * dilation - before) % stride == 0
        )
        out.setdefault(hit, []).append(y)
    return out


def _affine(idx: list[list[int]]) -> tuple[int, int, int] | None:
    """(base, du, dv) with ``idx[u][v] == base + du * u + dv * v`` for all u, v, or None.

    >>> _affine([[3, 5], [4, 6]]), _affine([[0, 1], [2, 2]])
    ((3, 1, 2), None)
    """
    base = idx[0][0] if idx and idx[0] else 0
    du = idx[1][0] - base if len(idx) > 1 and idx[0] else 0
    dv = idx[0][1] - base if idx and len(idx[0]) > 1 else 0
    ok = all(v == base + du * i + dv * j for i, row in enumerate(idx) for j, v in enumerate(row))
    return (base, du, dv) if ok else None


def _axis_view(
    t: torch.Tensor, dim: int, idx: list[list[int]]
) -> torch.Tensor:
    """`t` with axis `dim` replaced by two axes [u, v] reading ``t[..., idx[u][v], ...]``: a strided
    view where the indices are affine (always so for stride 1), else a gather."""
    aff = _affine(idx)
    if aff is not None and aff[1] >= 0 and aff[2] >= 0:
        base, du, dv = aff
        st = t.stride()
        shape = (*t.shape[:dim], len(idx), len(idx[0]), *t.shape[dim + 1 :])
        strides = (*st[:dim], du * st[dim], dv * st[dim], *st[dim + 1 :])
        return t.as_strided(shape, strides, t.storage_offset() + base * st[dim])
    i = torch.tensor(idx, dtype=torch.int64, device=t.device)
    return t.index_select(dim, i.reshape(-1)).unflatten(dim, tuple(i.shape))


def _spaced(pos: list[int]) -> slice | None:
    """`pos` as a slice where it is evenly spaced and increasing, else None.

    >>> _spaced([2, 4, 6]), _spaced([5]), _spaced([1, 2, 4])
    (slice(2, 7, 2), slice(5, 6, 1), None)
    """
    aff = _affine([pos])
    if aff is None or not pos:
        return None
    step = aff[2] if len(pos) > 1 else 1
    return slice(pos[0], pos[-1] + 1, step) if step > 0 else None


def _positions(t: torch.Tensor, dim: int, pos: list[int]) -> torch.Tensor:
    """The positions `pos` of axis `dim` of `t`: a view where they are evenly spaced, else a copy."""
    sl = _spaced(pos)
    if sl is not None:
        return t[(slice(None),) * dim + (sl,)]
    return t.index_select(dim, torch.tensor(pos, dtype=torch.int64, device=t.device))


def _conv_transpose_sparse(
    x: torch.Tensor,
    flipped: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    dilation: tuple[int, int],
    before: tuple[int, int],
    out_hw: tuple[int, int],
    groups: int,
    dot: Dot,
) -> torch.Tensor:
    """`_conv_transpose` without its zero terms: one product per group of output rows and columns
    that share their real taps (`_tap_groups`), over (channel, tap row, tap column) in order."""
    n, _, h, w = x.shape
    o, cg, kh, kw = flipped.shape
    g = groups
    og = o // g
    xg = x.contiguous().view(n, g, cg, h, w)
    fl = flipped.reshape(g, og, cg, kh, kw)
    bias_g = bias.reshape(g, og, 1) if bias is not None else None
    out = x.new_empty(n, o, *out_hw)
    rows = _tap_groups(out_hw[0], h, kh, dilation[0], stride[0], before[0])
    cols = _tap_groups(out_hw[1], w, kw, dilation[1], stride[1], before[1])
    for taps_h, ys in rows.items():
        src_h = [[(y + i * dilation[0] - before[0]) // stride[0] for i in taps_h] for y in ys]
        xr = _axis_view(xg, 3, src_h) if taps_h else None  # [N, g, cg, ny, th, W]
        a_h = _positions(fl, 3, list(taps_h)) if taps_h else None
        for taps_w, xs in cols.items():
            k = cg * len(taps_h) * len(taps_w)
            if k:
                src_w = [[(c + j * dilation[1] - before[1]) // stride[1] for j in taps_w] for c in xs]
                patch = _axis_view(xr, 5, src_w)  # type: ignore[arg-type]  # [N, g, cg, ny, th, nx, tw]
                b = patch.permute(1, 2, 4, 6, 0, 3, 5).reshape(g, k, n * len(ys) * len(xs))
                a = _positions(a_h, 4, list(taps_w)).reshape(g, og, k)  # type: ignore[arg-type]
            else:  # no real term: the empty sum (plus the bias), as the dense sum of zeros gives
                b = x.new_zeros(g, 0, n * len(ys) * len(xs))
                a = x.new_zeros(g, og, 0)
            y = dot(a, b, bias=bias_g).view(o, n, len(ys), len(xs)).transpose(0, 1)
            sy, sx = _spaced(ys), _spaced(xs)
            if sy is not None and sx is not None:
                out[:, :, sy, sx] = y
            else:
                yi = torch.tensor(ys, dtype=torch.int64, device=x.device)
                xi = torch.tensor(xs, dtype=torch.int64, device=x.device)
                out[:, :, yi[:, None], xi[None, :]] = y
    return out


def _conv_transpose(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    extra: tuple[int, int],
    groups: int,
    dot: Dot,
    skip_zeros: bool = False,
) -> torch.Tensor:
    """conv_transpose2d(x, w) with w [C_in, C_out/g, kh, kw]; `extra` rows/columns at the end."""
    cin, og, kh, kw = w.shape
    g = groups
    flipped = w.flip(-1, -2).view(g, cin // g, og, kh, kw).transpose(1, 2).reshape(g * og, cin // g, kh, kw)
    if skip_zeros and bool(torch.isfinite(w).all()):  # 0 * inf would not vanish
        before = (dilation[0] * (kh - 1) - padding[0], dilation[1] * (kw - 1) - padding[1])
        out_hw = (
            (x.shape[2] - 1) * stride[0] + 1 + 2 * before[0] + extra[0] - dilation[0] * (kh - 1),
            (x.shape[3] - 1) * stride[1] + 1 + 2 * before[1] + extra[1] - dilation[1] * (kw - 1),
        )
        return _conv_transpose_sparse(x, flipped, bias, stride, dilation, before, out_hw, g, dot)
    xd = _dilate(x, stride)
    p0 = dilation[0] * (kh - 1) - padding[0]
    p1 = dilation[1] * (kw - 1) - padding[1]
    xd = F.pad(xd, (p1, p1 + extra[1], p0, p0 + extra[0]))
    return _conv(xd, flipped, bias, (1, 1), (0, 0), dilation, g, dot)


def conv_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    dot: Dot,
    skip_zeros: bool = False,
) -> torch.Tensor:
    """``aten.convolution`` (1-d or 2-d, plain or transposed), float64 in and out.

    `skip_zeros`: zero terms may be left out of the sums (see the module docstring)."""
    spatial = x.dim() - 2
    _check(spatial)
    s, p, d = _pair(stride, 1), _pair(padding, 0), _pair(dilation, 1)
    x2, w2 = _as_2d(x, spatial), _as_2d(w, spatial)
    if transposed:
        y = _conv_transpose(x2, w2, bias, s, p, d, _pair(output_padding, 0), groups, dot, skip_zeros)
    else:
        y = _conv(x2, w2, bias, s, p, d, groups, dot)
    return y.squeeze(-2) if spatial == 1 else y


def _grad_weight(
    gy: torch.Tensor, x: torch.Tensor, wshape: torch.Size, s: tuple[int, int], p: tuple[int, int],
    d: tuple[int, int], groups: int, dot: Dot,
) -> torch.Tensor:
    """sum over (batch, output position) of gy[n, o, l] * patches(x)[n, (c, kh, kw), l]."""
    o, cg, kh, kw = wshape
    n = x.shape[0]
    g = groups
    v = _patches(x, (kh, kw), g, s, p, d)  # [N, g, cg, Ho, Wo, kh, kw]
    length = v.shape[3] * v.shape[4]
    k = cg * kh * kw
    b = v.permute(1, 0, 3, 4, 2, 5, 6).reshape(g, n * length, k)  # [g, N*L, K]
    a = gy.reshape(n, g, o // g, length).permute(1, 2, 0, 3).reshape(g, o // g, n * length)
    return dot(a, b).reshape(o, cg, kh, kw)


def conv_backward(
    gy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    mask: Sequence[bool],
    dot: Dot,
    sum_over: Callable[[torch.Tensor, Sequence[int]], torch.Tensor],
    skip_zeros: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward``: (grad_input, grad_weight, grad_bias) as `mask` asks.

    `skip_zeros`: zero terms may be left out of the sums (see the module docstring)."""
    spatial = x.dim() - 2
    _check(spatial)
    s, p, d = _pair(stride, 1), _pair(padding, 0), _pair(dilation, 1)
    gy2, x2, w2 = _as_2d(gy, spatial), _as_2d(x, spatial), _as_2d(w, spatial)
    gi = gw = gb = None
    if mask[0]:
        if transposed:
            gi = _conv(gy2, w2, None, s, p, d, groups, dot)
        else:
            # the adjoint of conv2d(., w) is conv_transpose2d(., w), same weight tensor
            ks = w2.shape[-2:]
            extra = ((x2.shape[2] + 2 * p[0] - d[0] * (ks[0] - 1) - 1) % s[0],
                     (x2.shape[3] + 2 * p[1] - d[1] * (ks[1] - 1) - 1) % s[1])
            gi = _conv_transpose(gy2, w2, None, s, p, d, extra, groups, dot, skip_zeros)
        gi = gi.squeeze(-2) if spatial == 1 else gi
    if mask[1]:
        if transposed:  # w [C_in, C_out/g, kh, kw]: the roles of x and gy swap
            gw = _grad_weight(x2, gy2, w2.shape, s, p, d, groups, dot)
        else:
            gw = _grad_weight(gy2, x2, w2.shape, s, p, d, groups, dot)
        gw = gw.squeeze(-2) if spatial == 1 else gw
    if mask[2]:
        gb = sum_over(gy, [0, *range(2, gy.dim())])
    return gi, gw, gb
