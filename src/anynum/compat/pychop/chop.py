"""Pychop's float choppers on anynum: ``Chop`` (= ``LightChop``), ``FaultChop`` and ``Bitchop``.

Every rounding is one `anynum.quantize` call (or, for rmode 0, a composition of
three), so it happens once, ties follow the mode, -0 stays -0, directed modes
overflow the IEEE way (toward zero and away from the direction saturate to
±max), and the input's array type and dtype come back. Stochastic modes draw
from a per-instance generator seeded by ``random_state``: two choppers with the
same seed give the same results, successive calls of one chopper differ.
Gradients pass straight through (torch and JAX) for every chopper.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import anynum as an
from anynum.compat.pychop.arrays import as_float, is_complex, kind, namespace
from anynum.compat.pychop.formats import Customs, Options, float_format, prec_format
from anynum.compat.pychop.math import MathMethods
from anynum.compat.pychop.rmodes import TIES_TO_ODD, RoundingSpec, parse_rmode
from anynum.compat.straight import straight_through
from anynum.errors import FormatError, InputError

__all__ = ["Bitchop", "Chop", "FaultChop", "LightChop", "round_array"]

_BFLOAT_NAMES = ("b", "bfloat16", "bf16")
#: Exponent bits of each container dtype (``explim=False`` keeps only the container's range).
_CONTAINER_EXP_BITS = {
    "float16": 5,
    "bfloat16": 8,
    "float32": 8,
    "float64": 11,
    "complex64": 8,
    "complex128": 11,
}


def round_array(x: Any, fmt: an.Format, mode: RoundingSpec, generator: Any = None) -> Any:
    """Round `x` (any array kind, real or complex) onto `fmt` with a Pychop rounding mode.

    Complex numbers are rounded part by part. Ties-to-odd (rmode 0) is the
    nearest-even result where `x` is not a tie and the round-to-odd one where it is.

    >>> round_array(np.array([0.3, -2.5]), an.IntFormat(8), an.Rounding.NEAREST_EVEN).tolist()
    [0.0, -2.0]
    >>> round_array(np.array([0.3, -2.5]), an.IntFormat(8), TIES_TO_ODD).tolist()
    [0.0, -3.0]
    """
    if is_complex(x):
        re = round_array(x.real, fmt, mode, generator)
        im = round_array(x.imag, fmt, mode, generator)
        if kind(x) == "torch":
            return torch.complex(re, im)
        return (re + 1j * im).astype(x.dtype)
    if mode == TIES_TO_ODD:
        xp = namespace(x)
        rna, rnz = an.quantize(x, fmt, "rna"), an.quantize(x, fmt, "rnz")
        return xp.where(rna != rnz, an.quantize(x, fmt, "ro"), an.quantize(x, fmt, "nearest"))
    assert isinstance(mode, an.Rounding)
    return an.quantize(x, fmt, mode, generator=generator if mode.is_stochastic else None)


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", "float64")).replace("torch.", "")


class Chop(MathMethods):
    """A float format and rounding mode, applied by calling the object (Pychop ``Chop``/``LightChop``).

    ``Chop(exp_bits, sig_bits, rmode=1, subnormal=True, chunk_size=800,
    random_state=42, verbose=0)`` as in Pychop, or ``Chop(prec="h")`` with a
    MATLAB-chop name ('q43', 'q52', 'b', 't', 'h', 's', 'd', ...), or
    ``Chop(customs=Customs(...))``. ``sig_bits`` counts the stored fraction bits.
    ``subnormal=False`` flushes subnormals to {0, smallest normal} (the default
    for bfloat16 names, as MATLAB chop). ``explim=False`` keeps the precision
    but the input dtype's exponent range. ``chunk_size`` is accepted and ignored
    (anynum needs no chunking).

    Results: IEEE semantics (NaN stays NaN, overflow to ±inf or ±max by mode,
    -0 kept), on the input's array type and dtype; lists and scalars give NumPy.

    >>> ch = Chop(exp_bits=5, sig_bits=10, rmode=1)
    >>> ch(np.array([1 / 3, 70000.0, -1e-9])).tolist()
    [0.333251953125, inf, -0.0]
    >>> Chop(prec="q43", rmode=4)(torch.tensor([1000.0])).tolist()   # toward zero saturates
    [240.0]
    """

    def __init__(
        self,
        exp_bits: int | str | None = None,
        sig_bits: int | None = None,
        rmode: Any = 1,
        subnormal: bool | None = None,
        chunk_size: int = 800,
        random_state: int | None = 42,
        verbose: int = 0,
        *,
        prec: str | None = None,
        customs: Customs | None = None,
        explim: bool = True,
    ) -> None:
        if isinstance(exp_bits, str):
            prec, exp_bits = exp_bits, None
        if subnormal is None:
            subnormal = not (prec is not None and str(prec).lower() in _BFLOAT_NAMES)
        if customs is not None:
            fmt = float_format(customs, bool(subnormal))
        elif prec is not None:
            fmt = prec_format(prec, bool(subnormal))
        elif exp_bits is not None and sig_bits is not None:
            fmt = an.FloatFormat(exp_bits, sig_bits, subnormals=bool(subnormal))
        else:
            raise FormatError("Chop needs exp_bits and sig_bits, prec= (e.g. 'h') or customs=.")
        self.fmt = fmt
        self.prec = prec
        self.exp_bits, self.sig_bits = fmt.exp_bits, fmt.man_bits
        self.t, self.emax = fmt.precision, fmt.emax
        self.u = 2.0**-self.t  # unit roundoff
        self.rmode, self.mode = parse_rmode(rmode)
        self.subnormal = bool(subnormal)
        self.explim = bool(explim)
        self.chunk_size = chunk_size
        self.random_state = random_state
        self.customs = customs
        self._rng = np.random.default_rng(random_state)
        self.verbose = verbose
        if verbose:
            print(f"The floating point format is with unit-roundoff of {self.u:e} (≈2^{-self.t}).")

    def format_for(self, x: Any) -> an.FloatFormat:
        """The format applied to `x`: `fmt`, or with ``explim=False`` the dtype's exponent range."""
        if self.explim:
            return self.fmt
        name = _dtype_name(x)
        if name not in _CONTAINER_EXP_BITS:
            raise InputError(f"explim=False needs a float input, got dtype {name}.")
        return an.FloatFormat(_CONTAINER_EXP_BITS[name], self.fmt.man_bits, subnormals=self.subnormal)

    @property
    def generator(self) -> np.random.Generator:
        """The instance's random stream (each stochastic call takes one seed from it)."""
        return self._rng

    def __call__(self, x: Any) -> Any:
        x = as_float(x)
        return round_array(x, self.format_for(x), self.mode, self._rng)

    def quantize(self, x: Any) -> Any:
        """Same as calling the chopper (Pychop's ``ChopSTE.quantize``)."""
        return self(x)

    def options(self) -> Options:
        """The settings, as MATLAB chop's ``options`` structure.

        >>> Chop(prec="h").options().t
        11
        """
        return Options(
            self.t,
            self.emax,
            self.prec,
            self.subnormal,
            self.rmode,
            bool(getattr(self, "flip", False)),
            self.explim,
            float(getattr(self, "p", 0.0)),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fmt.display_name()}, rmode={self.rmode})"


LightChop = Chop


class FaultChop(Chop):
    """MATLAB-chop style chopper with soft-error simulation (Pychop ``FaultChop``).

    ``FaultChop(prec='h', subnormal=None, rmode=1, flip=False, explim=1, p=0.5,
    randfunc=None, customs=None, random_state=0, verbose=0)``. With
    ``flip=True`` each element of the rounded result, with probability `p`, has
    one uniformly chosen bit of its stored significand flipped (finite values
    only), on the format's real encoding (`anynum.flip_bits` with ``count=1,
    field="significand"``).
    ``randfunc`` is not supported (stochastic rounding draws from
    ``random_state``); for flips on any field of any format see ``anynum.flip_bits``.

    >>> ch = FaultChop("h", flip=True, p=1.0, random_state=0)
    >>> y = ch(np.ones(4)); bool(((y != 1.0) & (abs(y - 1.0) < 1.0)).all())
    True
    """

    def __init__(
        self,
        prec: str = "h",
        subnormal: bool | None = None,
        rmode: Any = 1,
        flip: bool = False,
        explim: Any = 1,
        p: float = 0.5,
        randfunc: Any = None,
        customs: Customs | None = None,
        random_state: int | None = 0,
        verbose: int = 0,
    ) -> None:
        if randfunc is not None:
            raise InputError(
                "randfunc is not supported: stochastic rounding draws exact random bits from "
                "random_state; pass random_state= to choose the stream."
            )
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise InputError(f"p must be a probability in [0, 1], got {p!r}.")
        super().__init__(
            rmode=rmode,
            subnormal=subnormal,
            random_state=random_state,
            verbose=verbose,
            prec=None if customs is not None else prec,
            customs=customs,
            explim=bool(explim),
        )
        self.flip = bool(flip)
        self.p = float(p)
        self.randfunc = None

    def __call__(self, x: Any) -> Any:
        x = as_float(x)
        fmt = self.format_for(x)
        y = round_array(x, fmt, self.mode, self._rng)
        if not self.flip or self.p == 0 or fmt.man_bits == 0:
            return y
        if is_complex(y) or kind(y) == "dask":
            raise InputError("FaultChop flips need a real NumPy, torch or JAX array (call .compute() first).")
        return self._flip(x, y, fmt)

    def _flip(self, x: Any, y: Any, fmt: an.FloatFormat) -> Any:
        """Each finite element, with probability p, takes `anynum.flip_bits`' one-bit significand flip."""
        k = kind(y)
        seed = int(self._rng.integers(0, 2**62))
        hit = self._rng.random(tuple(np.shape(y))) < self.p
        if k == "torch":
            yd = y.detach()
            chosen = torch.from_numpy(hit).to(yd.device) & torch.isfinite(yd)
            out = yd.clone()
            out[chosen], _ = an.flip_bits(yd[chosen], fmt, count=1, field="significand", seed=seed)
            return straight_through(x, out)
        values = np.array(y)  # a writable NumPy copy (JAX arrays come back as JAX below)
        chosen = hit & np.isfinite(values)
        values[chosen], _ = an.flip_bits(values[chosen], fmt, count=1, field="significand", seed=seed)
        if k == "jax":
            import jax.numpy as jnp

            return jnp.asarray(values)
        return values if isinstance(y, np.ndarray) else values[()]


class Bitchop:
    """Rounds like `Chop` and exposes each result's bit fields (Pychop ``Bitchop``).

    After a call, ``sign``, ``exponent`` (biased field), ``significand``
    (stored fraction field) and ``is_denormal`` hold the fields of the format's
    real codes, shaped like the input; ``rounding_value`` is the result.
    ``device`` is accepted and ignored (the input's device is used).

    >>> bc = Bitchop(5, 10)
    >>> bc(np.array([1.5, -0.25])).tolist(), bc.sign.tolist(), bc.exponent.tolist(), bc.significand.tolist()
    ([1.5, -0.25], [0, 1], [15, 13], [512, 0])
    """

    def __init__(
        self,
        exp_bits: int,
        sig_bits: int,
        rmode: Any = "nearest_even",
        subnormal: bool = True,
        random_state: int | None = 42,
        device: Any = "cpu",
        verbose: int = 0,
    ) -> None:
        self._chop = Chop(exp_bits, sig_bits, rmode, subnormal, random_state=random_state)
        self.exp_bits, self.sig_bits = exp_bits, sig_bits
        self.rmode, self.subnormal = self._chop.rmode, subnormal
        self.u = self._chop.u
        if verbose:
            print(f"The floating point format is with unit-roundoff of {self.u:e} (≈2^{-self._chop.t}).")

    def __call__(self, values: Any) -> Any:
        x = as_float(values)
        y = self._chop(x)
        fmt = self._chop.fmt
        codes = an.encode(np.asarray(y) if kind(y) in ("jax", "dask") else y, fmt)
        if isinstance(codes, int):
            codes = np.asarray(codes)
        m, e = fmt.man_bits, fmt.exp_bits
        self.value, self.dtype, self.rounding_value = x, getattr(x, "dtype", None), y
        self.sign = (codes >> (e + m)) & 1
        self.exponent = (codes >> m) & ((1 << e) - 1)
        self.significand = codes & ((1 << m) - 1)
        self.is_denormal = (self.exponent == 0) & (self.significand != 0)
        return y
