"""Where a format's values lie and how accurate it is over its range (Qtorch+ Fig. 1b, posit thesis Fig 2.5).

For each format: the number of values in each binade [2^k, 2^(k+1)) and the
worst-case *decimal accuracy* of round-to-nearest between adjacent positive
values a < b. Decimal accuracy of x rounded to y is ``-log10|log10(y/x)|``
(Gustafson); between a and b it is smallest at the midpoint m = (a+b)/2, so
the curve is ``-log10(log10(m/a))``. Floats give a flat curve (dropping over
the subnormals), posits a tapered one peaking near 1.

Formats of up to 16 bits are enumerated exactly; wider ones are measured one
binade at a time; block formats (MX, NVFP4) are shown by their element format,
since each block's values are those scaled by the block's shared scale.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from anynum.errors import FormatError
from anynum.formats.base import MAX_ENUMERABLE_BITS, Format
from anynum.formats.registry import format as lookup_format

__all__ = ["FormatProfile", "format_profile", "plot_formats"]


@dataclass
class FormatProfile:
    """Value counts per binade and decimal accuracy between neighbours (positive half only).

    ``acc_edges`` has one more entry than ``accuracy``: interval i spans
    log2 values ``acc_edges[i]`` to ``acc_edges[i + 1]``.
    """

    label: str
    binades: np.ndarray
    counts: np.ndarray
    acc_edges: np.ndarray
    accuracy: np.ndarray


def _accuracy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    m = (a + b) / 2.0
    return -np.log10(np.log10(m / a))


def _enumerated(fmt: Format, label: str) -> FormatProfile:
    v = fmt.values()
    v = v[v > 0]
    if len(v) < 2:
        raise FormatError(f"{label} has fewer than two positive values; nothing to plot.")
    k = np.floor(np.log2(v)).astype(np.int64)
    binades, counts = np.unique(k, return_counts=True)
    return FormatProfile(label, binades, counts.astype(np.float64), np.log2(v), _accuracy(v[:-1], v[1:]))


def _sampled(fmt: Format, label: str) -> FormatProfile:
    from anynum.quantize import quantize

    if fmt.precision > 40:
        raise FormatError(f"{label} is too precise to measure in float64 (precision {fmt.precision} bits).")
    lo = math.floor(math.log2(fmt.smallest_subnormal))
    ks = np.arange(lo, fmt.emax + 1)
    a = np.ldexp(1.0, ks)
    up = quantize(torch.tensor(a * (1.0 + 2.0**-45), dtype=torch.float64), fmt, "ru", overflow="saturate")
    spacing = up.numpy() - a
    keep = spacing > 0
    ks, a, spacing = ks[keep], a[keep], spacing[keep]
    counts = np.maximum(a / spacing, 1.0)
    edges = np.append(ks, ks[-1] + 1).astype(np.float64)
    return FormatProfile(label, ks, counts, edges, _accuracy(a, a + spacing))


def format_profile(fmt: Format | str) -> FormatProfile:
    """The profile of `fmt` (a Format or name).

    >>> p = format_profile("e2m1")
    >>> p.binades.tolist(), p.counts.tolist()
    ([-1, 0, 1, 2], [1.0, 2.0, 2.0, 2.0])
    >>> round(float(format_profile("fp32").accuracy.max()), 2)
    7.59
    """
    f = lookup_format(fmt)
    label = f.display_name() if isinstance(fmt, Format) else str(fmt)
    element = getattr(f, "element", None)
    if isinstance(element, Format):  # block formats: the element grid (per-block scale aside)
        return format_profile_of(element, f"{label} (element {element.display_name()})")
    return format_profile_of(f, label)


def format_profile_of(f: Format, label: str) -> FormatProfile:
    """`format_profile` with an explicit label.

    >>> format_profile_of(lookup_format("e3m2"), "x").label
    'x'
    """
    return _enumerated(f, label) if f.bits <= MAX_ENUMERABLE_BITS else _sampled(f, label)


def plot_formats(names: Sequence[Format | str], path: str | os.PathLike[str]) -> list[FormatProfile]:
    """Write a PNG: value distribution per binade (top) and decimal accuracy (bottom), formats overlaid.

    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = plot_formats(["e4m3fn", "posit(8,2)"], pathlib.Path(d) / "f.png")
    ...     (pathlib.Path(d) / "f.png").stat().st_size > 1000
    True
    """
    profiles = [format_profile(n) for n in names]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8.0, 6.0), height_ratios=(1, 1.3))
    single = len(profiles) == 1
    for i, p in enumerate(profiles):
        color, style = f"C{i}", ("-", "--", ":", "-.")[i % 4]  # identical grids stay visible
        if single:
            top.bar(p.binades + 0.5, p.counts, width=0.9, color=color, alpha=0.7, label=p.label)
        else:
            edges = np.append(p.binades, p.binades[-1] + 1)
            # stairs wants contiguous bins: fill binades without values with zero
            full = np.arange(p.binades[0], p.binades[-1] + 1)
            counts = np.zeros(len(full))
            counts[p.binades - p.binades[0]] = p.counts
            edges = np.append(full, full[-1] + 1)
            top.stairs(counts, edges, color=color, linestyle=style, linewidth=1.6, label=p.label)
        bottom.stairs(p.accuracy, p.acc_edges, color=color, linestyle=style, linewidth=1.6, label=p.label)
    top.set_yscale("log")
    top.set_ylabel("values per binade")
    top.set_title("Distribution of positive values (log2 domain)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("decimal accuracy (digits)")
    bottom.set_xlabel("log2 |x|")
    bottom.set_title("Worst-case decimal accuracy of round-to-nearest")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return profiles
