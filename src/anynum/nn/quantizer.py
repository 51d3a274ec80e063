"""Activation/error quantization: the `Quantizer` module, its functional form, and `Rounder`.

A `Rounder` is one number category resolved once (format, rounding, overflow,
random stream), so the training loop pays no name lookups or validation per
call. `Quantizer` applies one rounder to a tensor in the forward pass and
another to the gradient flowing back through it (QPyTorch's "activation" and
"error" numbers).

Training rounds the same small tensors thousands of times, below the size at
which `anynum.quantize` compiles its fused kernel. Rounders therefore count the
elements each kernel (format, mode, overflow, dtype) has rounded on the eager
path in this process; once that total reaches ``ANYNUM_COMPILE_MIN`` (the size
at which one `quantize` call compiles), later calls use the fused kernel, which
is bit-identical and 5 to 20 times faster on the eager-only modes (stochastic
rounding above all). ``ANYNUM_COMPILE=0`` keeps everything eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.formats.fixed import UniformFormat
from anynum.formats.floating import FloatFormat
from anynum.formats.posit import Posit
from anynum.formats.registry import format as lookup_format
from anynum.formats.table import Table
from anynum.kernels import compile_mode, fused_round, use_fused, working_dtype
from anynum.kernels.cfloat import cfloat_params, cfloat_round
from anynum.kernels.fused import compile_min
from anynum.kernels.native import native_cast_dtype, native_round_trip
from anynum.nn.checks import check_seed, check_tensor
from anynum.nn.streams import register_stream_hooks
from anynum.quantize import _quantize_tensor, check_representable, quantize
from anynum.rounding import Rounding, RoundingLike, make_random_source, parse_rounding

__all__ = ["NumberLike", "Quantizer", "Rounder", "quantizer", "resolve_number", "round_weight"]

#: How a number category is given: a Format or name, ``(fmt, rounding)`` or
#: ``(fmt, rounding, overflow)``, a ready `Rounder`, or None (not quantized).
NumberLike = Union[Format, str, tuple, "Rounder", None]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Elements rounded on the eager path so far, per kernel, as a one-item list that every
#: Rounder of that kernel shares (see the module docstring).
_eager_elements: dict[tuple[Any, ...], list[int]] = {}
#: Families whose rounding is elementwise, so a flattened tensor rounds the same (Block is not).
_ELEMENTWISE = (FloatFormat, UniformFormat, Posit, Table)
#: Tensor attribute holding the `_grid_tag` of the last `Rounder.mark_on_grid`.
_ON_GRID_ATTR = "_anynum_on_grid"


def _grid_tag(t: torch.Tensor, rounder: Rounder) -> tuple[Any, ...]:
    """What `Rounder.mark_on_grid` records: the grid, and the tensor's state as autograd tracks it.

    The version counter moves with every in-place write; the storage address and dtype move
    when the tensor is given new data (``p.data = ...``, ``module.half()``), which keeps the
    version.
    """
    return (rounder.fmt, rounder.overflow, t._version, t.data_ptr(), t.dtype)


class _Route:
    """How one Rounder rounds tensors of one dtype on one device type, resolved on first use."""

    __slots__ = ("cfloat", "eager", "native", "working")

    def __init__(self, rounder: Rounder, x: torch.Tensor) -> None:
        fmt, mode, overflow = rounder.fmt, rounder.mode, rounder.overflow
        rounder.check_dtype(x.dtype)
        self.native = native_cast_dtype(fmt, mode, overflow, x)  # a torch cast that is this rounding
        cpu = x.device.type == "cpu"
        self.cfloat = cfloat_params(fmt, mode, overflow, x.dtype) if cpu else None  # the C loop
        key = (fmt, mode, overflow, rounder.rand_bits, x.dtype, x.device.type)
        # compiled kernels are for elementwise formats only: a flattened tensor rounds the same
        self.eager = _eager_elements.setdefault(key, [0]) if isinstance(fmt, _ELEMENTWISE) else None
        self.working = working_dtype(fmt, x.dtype)

    def compiled_is_due(self, numel: int) -> bool:
        """Whether a call of `numel` elements should run compiled (and count it if not)."""
        if self.eager is None or numel < 2 or compile_mode() != "auto":  # "1": quantize compiles itself
            return False
        if self.eager[0] >= compile_min():
            return True
        self.eager[0] += numel
        return False


class Rounder:
    """One number category, resolved once: format, rounding mode, overflow and random stream.

    Calling it rounds a tensor onto the grid without autograd (the result is a
    new tensor of the input's dtype). Stochastic modes draw from a private
    `torch.Generator` per device, seeded from `seed` (or, when neither seed nor
    generator is given, from torch's global generator at construction, so
    `torch.manual_seed` makes training reproducible); the stream advances on
    every call, so successive calls are independent.

    Results equal `anynum.quantize` with the same arguments bit for bit (the
    call skips its argument checks, done once here). Special values: NaN stays
    NaN, ±inf and overflow follow `overflow` (the format's default when None:
    inf if it has infinities, else saturate).

    >>> import torch, anynum as an
    >>> r = Rounder(an.E4M3FN)
    >>> r(torch.tensor([0.1, 500.0, float("inf")])).tolist()
    [0.1015625, 448.0, 448.0]
    """

    def __init__(
        self,
        fmt: Format | str,
        rounding: RoundingLike = "nearest",
        overflow: str | None = None,
        *,
        rand_bits: int | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        self.fmt = lookup_format(fmt)
        self.mode = parse_rounding(rounding)
        self.overflow = self.fmt.check_overflow(overflow)
        if rand_bits is not None:
            from anynum.quantize import _check_rand_bits  # the one validator of rand_bits

            _check_rand_bits(rand_bits, self.mode)
        self.rand_bits = rand_bits
        if generator is not None and seed is not None:
            raise AnynumError("pass either generator= or seed=, not both.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise AnynumError(f"generator must be a torch.Generator, got {type(generator).__name__}.")
        if self.mode.is_stochastic and generator is None and seed is None:
            seed = int(torch.randint(0, 2**62, (1,)))
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        if generator is not None:
            self._generators[generator.device] = generator
        self._checked: set[torch.dtype] = set()
        self._routes: dict[tuple[torch.dtype, str], _Route] = {}  # by (dtype, device type)

    def __repr__(self) -> str:
        return f"Rounder({self.fmt.display_name()}, {self.mode.name}, overflow={self.overflow!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rounder) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self.fmt, self.mode, self.overflow, self.rand_bits, self.seed)

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator that feeds stochastic rounding on `device` (created on first use)."""
        g = self._generators.get(device)
        if g is None:
            if self.seed is None:
                raise AnynumError(
                    f"this Rounder was built with a generator on another device; got a tensor on {device}."
                )
            g = torch.Generator(device=device)
            g.manual_seed(self.seed + len(self._generators))
            self._generators[device] = g
        return g

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise a clear AnynumError when tensors of `dtype` cannot hold this format's values."""
        if dtype in self._checked:
            return
        if dtype not in _FLOATS:
            raise AnynumError(
                f"{self.fmt.display_name()} quantizes float16/bfloat16/float32/float64 tensors, "
                f"got {dtype}; convert it first (x.float())."
            )
        with torch.device("cpu"):  # callers may be building modules under torch.device("meta")
            check_representable(self.fmt, dtype)
        self._checked.add(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # What `quantize` would do, minus the argument checks this object did once at construction.
        route = self._routes.get((x.dtype, x.device.type))
        if route is None:
            route = self._routes[(x.dtype, x.device.type)] = _Route(self, x)
        x = x.detach()
        fmt, mode, overflow = self.fmt, self.mode, self.overflow
        if route.cfloat is not None and compile_mode() == "auto" and not use_fused(x, None, "auto"):
            y = cfloat_round(x, route.cfloat)
            if y is not None:
                return y
            route.cfloat = None  # no C compiler here: the other paths from now on
        if route.native is not None and not use_fused(x, None):
            return native_round_trip(x, route.native)
        # The generator hands out one fresh seed per call, so successive calls are independent.
        rng = make_random_source(self.generator(x.device), None, x.device) if mode.is_stochastic else None
        if route.compiled_is_due(x.numel()):
            # Flattened, so that every shape shares one dynamic-size compiled kernel; the random
            # bits are addressed by row-major index, which flattening keeps. detach() makes the
            # view a plain tensor: dynamo guards on a view's base strides and recompiles per shape.
            xw = x.to(route.working).reshape(-1).detach()
            torch._dynamo.maybe_mark_dynamic(xw, 0)  # compile for any size at once, not per size first
            return fused_round(fmt, xw, mode, overflow, rng, self.rand_bits).view(x.shape).to(x.dtype)
        return _quantize_tensor(x, fmt, mode, overflow, rng, self.rand_bits, None)

    def round_into(self, x: torch.Tensor) -> None:
        """Round `x` in place (the values of ``self(x)``, written without a second buffer where a
        torch cast is the rounding).

        >>> import torch, anynum as an
        >>> x = torch.tensor([0.3, 1000.0]); Rounder(an.E4M3FN).round_into(x); x.tolist()
        [0.3125, 448.0]
        """
        route = self._routes.get((x.dtype, x.device.type))
        if route is None or use_fused(x, None):
            x.copy_(self(x))
        elif route.cfloat is not None and compile_mode() == "auto":
            if cfloat_round(x, route.cfloat, x) is None:  # elementwise: read before written
                x.copy_(self(x))
        elif route.native is not None and x.is_contiguous():
            native_round_trip(x, route.native, out=x)  # narrows into a new tensor first: no overlap
        else:
            x.copy_(self(x))

    # --- tensors known to be on the grid -----------------------------------------------------
    # Rounding a value of the grid gives it back, so a tensor that this grid's rounder has just
    # written needs no second rounding until it changes. "Changes" is read from the tensor's
    # version counter, the one autograd uses to detect in-place modification; like autograd it
    # cannot see writes through ``.data``.
    def mark_on_grid(self, t: torch.Tensor) -> None:
        """Record that `t`, as it is now, holds only values this rounder can produce.

        Call it right after writing this rounder's result into `t`. Only elementwise
        formats are recorded (re-rounding a block format can pick another scale).
        """
        if isinstance(self.fmt, _ELEMENTWISE):
            setattr(t, _ON_GRID_ATTR, _grid_tag(t, self))

    def is_identity_on(self, t: torch.Tensor) -> bool:
        """Whether rounding `t` now would return it unchanged because it is marked on this grid.

        True only for deterministic modes (a stochastic call would also advance the stream),
        the same format and overflow as the marking rounder, and an unmodified tensor.

        >>> import torch, anynum as an
        >>> r, w = Rounder(an.BF16), torch.tensor([1.0, 2.0])
        >>> r.mark_on_grid(w); r.is_identity_on(w)
        True
        >>> _ = w.add_(1e-3); r.is_identity_on(w)
        False
        """
        tag = getattr(t, _ON_GRID_ATTR, None)
        return tag is not None and not self.mode.is_stochastic and tag == _grid_tag(t, self)

    def on_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Boolean mask: True where `x` is a value of the format (NaN counts if the format has NaN)."""
        self.check_dtype(x.dtype)
        xd = x.detach()
        ok: torch.Tensor = quantize(xd, self.fmt, Rounding.NEAREST_EVEN, overflow=self.overflow) == xd
        if self.fmt.has_nan:
            ok |= torch.isnan(xd)
        return ok

    # Generators are plain state; pickling/deepcopy keep the stream position. Routes are caches.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_routes": {}}

    def state_dict(self) -> dict[str, Any]:
        return {str(d): g.get_state() for d, g in self._generators.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for d, s in state.items():
            self.generator(torch.device(d)).set_state(s)


def resolve_number(
    value: NumberLike, rounding: RoundingLike = "nearest", seed: int | None = None
) -> Rounder | None:
    """Turn a `NumberLike` into a `Rounder` (None stays None).

    >>> import anynum as an
    >>> resolve_number(("e5m2", "sr"), seed=0)
    Rounder(e5m2, STOCHASTIC, overflow='inf')
    """
    if value is None or isinstance(value, Rounder):
        return value
    if isinstance(value, (Format, str)):
        return Rounder(value, rounding, seed=seed)
    if isinstance(value, tuple) and 1 <= len(value) <= 3:
        fmt, *rest = value
        mode = rest[0] if rest else rounding
        overflow = rest[1] if len(rest) > 1 else None
        return Rounder(fmt, mode, overflow, seed=seed)
    raise AnynumError(
        "a number category must be a Format, a format name, (fmt, rounding), "
        f"(fmt, rounding, overflow), a Rounder or None; got {value!r}."
    )


class _QuantizeFn(torch.autograd.Function):
    """Forward: round the activation. Backward: round the error (the incoming gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Rounder | None, bwd: Rounder | None) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        return fwd(x) if fwd is not None else x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        bwd = ctx.bwd
        return (bwd(grad) if bwd is not None else grad), None, None


def apply_pair(x: torch.Tensor, fwd: Rounder | None, bwd: Rounder | None) -> torch.Tensor:
    """Round `x` with `fwd` and, if `x` takes part in autograd, its gradient with `bwd`."""
    if bwd is not None and x.requires_grad and torch.is_grad_enabled():
        return _QuantizeFn.apply(x, fwd, bwd)
    if fwd is None:
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return _QuantizeFn.apply(x, fwd, None)
    return fwd(x)


def round_weight(w: torch.Tensor, rounder: Rounder | None) -> torch.Tensor:
    """A parameter as a layer should see it: rounded by `rounder`, gradient straight through.

    A weight that `rounder`'s grid already holds unmodified (marked by
    `QuantizedOptimizer` after its step) is returned as it is: rounding it again
    would change nothing, and it is the common case in training.

    >>> import torch, anynum as an
    >>> round_weight(torch.tensor([0.3]), Rounder(an.E4M3FN)).tolist()
    [0.3125]
    """
    if rounder is None or rounder.is_identity_on(w):
        return w
    return apply_pair(w, rounder, None)


def quantizer(
    forward: NumberLike = None,
    backward: NumberLike = None,
    forward_rounding: RoundingLike = "nearest",
    backward_rounding: RoundingLike = "nearest",
    *,
    forward_overflow: str | None = None,
    backward_overflow: str | None = None,
    forward_rand_bits: int | None = None,
    backward_rand_bits: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Functional form of `Quantizer`: returns ``f(x)`` that rounds x forward and its gradient backward.

    Either format may be None (that direction passes unchanged). Stochastic
    modes use `generator` or `seed` (the backward stream is seeded with seed+1).
    NaN/inf follow `anynum.quantize` with the given overflow policies.

    >>> import torch, anynum as an
    >>> q = an.nn.quantizer(forward=an.E4M3FN, backward=an.E5M2)
    >>> x = torch.tensor([0.3, 3.3], requires_grad=True)
    >>> y = q(x); y.detach().tolist()
    [0.3125, 3.25]
    >>> y.backward(torch.tensor([0.1, 1000.0])); x.grad.tolist()
    [0.09375, 1024.0]
    """
    check_seed(seed, "anynum.nn.quantizer")
    fwd = _direction(forward, forward_rounding, forward_overflow, forward_rand_bits, generator, seed)
    bwd_seed = None if seed is None else seed + 1
    bwd_gen = None
    if generator is not None:
        bwd_gen = generator  # one stream shared by both directions keeps draws ordered
    bwd = _direction(backward, backward_rounding, backward_overflow, backward_rand_bits, bwd_gen, bwd_seed)

    def f(x: torch.Tensor) -> torch.Tensor:
        return apply_pair(check_tensor(x, "anynum.nn.quantizer(...)"), fwd, bwd)

    return f


def _direction(
    value: NumberLike,
    rounding: RoundingLike,
    overflow: str | None,
    rand_bits: int | None,
    generator: torch.Generator | None,
    seed: int | None,
) -> Rounder | None:
    if value is None or isinstance(value, Rounder):
        return value
    if isinstance(value, tuple):
        return resolve_number(value, rounding, seed)
    return Rounder(value, rounding, overflow, rand_bits=rand_bits, generator=generator, seed=seed)


class Quantizer(nn.Module):
    """Rounds activations in the forward pass and errors (their gradients) in the backward pass.

    Drop it between layers (QPyTorch/Qtorch+ `Quantizer`). `forward` and
    `backward` are Formats or names (or None to pass that direction through),
    each with its own rounding and overflow policy; stochastic modes draw from
    `generator` or a stream seeded by `seed` (default: drawn once from torch's
    global generator, so `torch.manual_seed` fixes it). The module has no
    parameters or buffers; its ``state_dict`` holds the positions of its
    stochastic streams (``_anynum_rng.forward.*``, ``_anynum_rng.backward.*``),
    so a resumed run repeats the uninterrupted one bit for bit
    (`anynum.nn.streams`); a checkpoint without them still loads.

    NaN stays NaN; overflow follows the format's default (inf where the format
    has infinities, else saturation to ±max) unless `*_overflow` says otherwise.

    >>> import torch, anynum as an
    >>> q = an.Quantizer(forward="bf16", backward="e5m2", backward_rounding="sr", seed=0)
    >>> x = torch.tensor([1.0 + 2**-10], requires_grad=True)
    >>> q(x).detach().tolist()
    [1.0]
    """

    def __init__(
        self,
        forward: NumberLike = None,
        backward: NumberLike = None,
        forward_rounding: RoundingLike = "nearest",
        backward_rounding: RoundingLike = "nearest",
        *,
        forward_overflow: str | None = None,
        backward_overflow: str | None = None,
        forward_rand_bits: int | None = None,
        backward_rand_bits: int | None = None,
        generator: torch.Generator | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        check_seed(seed, "anynum.Quantizer")
        self.fwd = _direction(forward, forward_rounding, forward_overflow, forward_rand_bits, generator, seed)
        self.bwd = _direction(
            backward,
            backward_rounding,
            backward_overflow,
            backward_rand_bits,
            generator,
            None if seed is None else seed + 1,
        )
        register_stream_hooks(self, _quantizer_streams)  # state_dict saves the random streams

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x) is not torch.Tensor:  # (the common case skips the full check)
            check_tensor(x, "anynum.Quantizer")
        return apply_pair(x, self.fwd, self.bwd)

    def extra_repr(self) -> str:
        return f"forward={self.fwd}, backward={self.bwd}"


def _quantizer_streams(module: nn.Module) -> dict[str, Rounder | None]:
    """The random streams of a `Quantizer` (saved by its state_dict, see anynum.nn.streams)."""
    return {"forward": getattr(module, "fwd", None), "backward": getattr(module, "bwd", None)}
