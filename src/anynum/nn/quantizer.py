"""Activation/error quantization: the `Quantizer` module and its functional form.

`Quantizer` applies one `Rounder` (`anynum.quantize.rounder`: a number category
resolved once) to a tensor in the forward pass and another to the gradient
flowing back through it (QPyTorch's "activation" and "error" numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Union

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.kernels.settings import compile_mode
from anynum.nn.checks import check_seed, check_tensor
from anynum.nn.streams import register_stream_hooks
from anynum.quantize.rounder import Rounder, pair_plan, round_pair
from anynum.rounding import RoundingLike

__all__ = ["NumberLike", "PairPoint", "Quantizer", "Rounder", "quantizer", "resolve_number", "round_weight"]

#: How a number category is given: a Format or name, ``(fmt, rounding)`` or
#: ``(fmt, rounding, overflow)``, a ready `Rounder`, or None (not quantized).
NumberLike = Union[Format, str, tuple, "Rounder", None]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

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
    """Round `x` with `fwd` and, if `x` takes part in autograd, its gradient with `bwd`.

    On CPU the pair is one native autograd node where it can be (`round_pair`), else the
    Python Function `_QuantizeFn`: the same bits and the same random streams either way. A
    tensor outside autograd (a model's first input, inference) is rounded by the node's
    forward alone where it can be, else by `fwd` itself.
    """
    if x.requires_grad and torch.is_grad_enabled() and (fwd is not None or bwd is not None):
        y = round_pair(x, fwd, bwd)
        return y if y is not None else _QuantizeFn.apply(x, fwd, bwd)
    if fwd is None:
        return x
    y = round_pair(x, fwd, None)  # (no gradient to round: the node's forward alone, no graph)
    return y if y is not None else fwd(x)


class _Plan(NamedTuple):
    """A `PairPoint`'s planned call: what it was made for, and `pair_plan`'s op and sides."""

    fwd: Rounder | None
    bwd: Rounder | None
    dtype: torch.dtype
    op: Any
    fwd_side: list[int]
    bwd_side: list[int]
    mode: str


class PairPoint:
    """A point where `fwd` rounds a tensor and `bwd` its gradient (`apply_pair`), the native
    call planned once per pair and dtype (`anynum.quantize.rounder.pair_plan`).

    A training step reaches each activation point once, with its caches cold from the layers
    in between; there `apply_pair`'s checks (five Python frames) cost about 5 us a point, the
    planned call one frame. The plan is remade whenever `fwd`, `bwd`, the dtype or the compile
    mode differ from what it was made for (an observer swapping the rounders, say), and it is
    not copied or pickled with the point. NaN/inf follow each rounder's format.

    >>> import torch, anynum as an
    >>> point = PairPoint(Rounder(an.E4M3FN), Rounder(an.E5M2))
    >>> x = torch.tensor([0.3, 3.3], requires_grad=True)
    >>> [point.round(x).detach().tolist() for _ in range(2)]
    [[0.3125, 3.25], [0.3125, 3.25]]
    """

    def __init__(self, fwd: Rounder | None, bwd: Rounder | None) -> None:
        self.fwd, self.bwd = fwd, bwd
        self._plan: _Plan | None = None

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """`x` rounded by `fwd`, and its gradient by `bwd` if `x` takes part in autograd."""
        plan = self._plan
        if (
            plan is not None
            and plan.fwd is self.fwd
            and plan.bwd is self.bwd
            and plan.dtype is x.dtype
            and type(x) is torch.Tensor
            and x.is_cpu
            and plan.mode == compile_mode()
            and not torch.compiler.is_compiling()
        ):
            grad = x.requires_grad and torch.is_grad_enabled()
            y: torch.Tensor = plan.op(x, plan.fwd_side, plan.bwd_side if grad else [], 0, None)
            return y
        y = apply_pair(x, self.fwd, self.bwd)
        made = pair_plan(self.fwd, self.bwd, x.dtype)
        self._plan = None if made is None else _Plan(self.fwd, self.bwd, x.dtype, *made)
        return y

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plan": None}


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
