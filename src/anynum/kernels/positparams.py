"""Parameters of the C posit kernel (``csrc/posit.c``), with the constants of its fast path.

Between minpos and maxpos every binade ``[2**E, 2**(E+1))`` of the working type W keeps the same
number of bits after the regime, so the posit's bit string after the regime is the float's own
bit string, rebased: ``z = (bits + zoff) & zmask`` (the es exponent bits of ``E + scale_exp``,
then the fraction), and rounding drops the low ``pc`` bits of z, ``pc = max(es + M - m, 0)`` with
m the bits kept after the regime of ``k = (E + scale_exp) >> es``, a function of E alone. The two
neighbours are ``bits - dropped`` and that plus ``1 << pc`` (as `Posit.locate` finds them, a carry
into the next regime included), and the mode decides from the dropped bits, the parity of the last
kept bit and the sign. Below minpos and above maxpos the kernel compares the input's bits with
those of minpos, maxpos and the tie point below minpos (minpos / useed, the value of the (n+1)-bit
code 1, where rounding goes up to minpos under ``underflow="zero"``) instead: all three are powers
of two, and the bits of positive floats order like their values, subnormals included, so subnormal
inputs need no lift.

The fast path covers the deterministic modes and stochastic uniform rounding of posits whose every
value is a normal number of W (the exact and ``rand_bits`` stochastic modes read the dropped bits
below minpos, and keep the general loop).

>>> import anynum as an, torch
>>> p = posit_params(an.Posit(16, 1), torch.float32)
>>> p.fast, hex(p.min_bits), hex(p.max_bits), hex(p.tie_bits), hex(p.zmask), hex(p.zoff)
(1, '0x31800000', '0x4d800000', '0x30800000', '0xffffff', '0x800000')
"""

from __future__ import annotations

import ctypes

import torch

from anynum._bits import layout
from anynum.formats.posit import Posit

__all__ = ["PositParams", "posit_params"]


class PositParams(ctypes.Structure):
    """Mirror of ``any_posit`` (csrc/common.c)."""

    _fields_ = [
        ("maxpos", ctypes.c_double),
        ("minpos", ctypes.c_double),
        *(
            (name, ctypes.c_int32)
            for name in ("n", "es", "scale_exp", "lift", "underflow_zero", "one", "fast", "pad")
        ),
        *((name, ctypes.c_int64) for name in ("zoff", "zmask", "min_bits", "max_bits", "tie_bits")),
    ]


def _pow2_bits(e: int, wdtype: torch.dtype) -> int:
    """The bits of 2**e in W: normal, subnormal, or 0 below W's smallest subnormal.

    >>> [hex(_pow2_bits(e, torch.float32)) for e in (0, -126, -149, -150)]
    ['0x3f800000', '0x800000', '0x1', '0x0']
    """
    lay = layout(wdtype)
    if e >= lay.emin:
        return (e + lay.bias) << lay.man_bits
    return 1 << (e - lay.quantum_min) if e >= lay.quantum_min else 0


def posit_params(fmt: Posit, wdtype: torch.dtype) -> PositParams:
    """The C kernel's view of `fmt` in working dtype `wdtype` (float32 or float64).

    ``fast`` says whether the fast path applies: a regime to keep (n >= 3), every value a normal
    number of W, and the bit string after the regime with its carry inside W's signed integers.
    """
    lay = layout(wdtype)
    params = PositParams(
        maxpos=fmt.maxpos,
        minpos=fmt.minpos,
        n=fmt.n,
        es=fmt.es,
        scale_exp=fmt.scale_exp,
        # as in Posit.locate: the tie point below minpos may be subnormal in the working type,
        # and with underflow="zero" the dropped bits of any tiny input matter
        lift=int(fmt.emin - (1 << fmt.es) < lay.emin or fmt.underflow == "zero"),
        underflow_zero=int(fmt.underflow == "zero"),
        one=1,  # an opaque 1 for the kernel's shifts (see csrc/posit.c)
    )
    width = 1 + lay.exp_bits + lay.man_bits
    if fmt.n < 3 or fmt.emin < lay.emin or fmt.emax > lay.emax or fmt.es + lay.man_bits > width - 3:
        return params
    params.fast = 1
    params.zmask = (1 << (fmt.es + lay.man_bits)) - 1
    params.zoff = ((fmt.scale_exp - lay.bias) << lay.man_bits) & params.zmask  # only its low bits count
    params.min_bits = _pow2_bits(fmt.emin, wdtype)
    params.max_bits = _pow2_bits(fmt.emax, wdtype)
    params.tie_bits = _pow2_bits(fmt.emin - (1 << fmt.es), wdtype)
    return params
