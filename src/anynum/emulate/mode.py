"""`an.emulate`: a TorchDispatchMode under which every floating aten op computes in a format.

Autograd runs above the dispatch mode, so the backward pass and the optimizer
step, when they run inside the context, are emulated too. The rules of one op
are in `anynum.emulate.engine`; which ops need their own rule in
`anynum.emulate.optable` and `anynum.emulate.rules`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from anynum.emulate import rules as _rules  # noqa: F401  (registers the dot/reduction rules)
from anynum.emulate.engine import Emulator
from anynum.emulate.tensor import EmulatedTensor
from anynum.errors import AnynumError
from anynum.formats.base import Format
from anynum.rounding import RoundingLike

__all__ = ["EmulateMode", "emulate"]

F = TypeVar("F", bound=Callable[..., Any])


def _op_names(value: Iterable[Any] | None, arg: str) -> set[str] | None:
    """Op filters as packet names ('tanh') or overload names ('aten.add.Tensor')."""
    if value is None:
        return None
    if isinstance(value, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        value = [value]
    names = set()
    for v in value:
        if isinstance(v, torch._ops.OpOverload):
            names.add(str(v))
            continue
        if isinstance(v, torch._ops.OpOverloadPacket):
            names.add(v.__name__)
            continue
        if not isinstance(v, str):
            raise AnynumError(
                f"{arg}= expected op names ('tanh', 'aten.add.Tensor') or torch.ops.aten ops, "
                f"received {type(v).__name__} {v!r}."
            )
        name = v.strip()
        parts = name.split(".")
        if parts[0] == "aten":
            parts = parts[1:]
        if not parts or not hasattr(torch.ops.aten, parts[0]):
            raise AnynumError(
                f"{arg}= expected aten op names, received {v!r}, which is not an aten op. "
                "Fix: use the name torch.ops.aten knows, e.g. 'tanh', 'convolution', 'aten.add.Tensor'."
            )
        names.add(f"aten.{'.'.join(parts)}" if len(parts) > 1 else parts[0])
    return names


class EmulateMode(TorchDispatchMode):
    """The context manager (and decorator) that `emulate` returns; see `emulate`.

    ``state_dict()`` / ``load_state_dict()`` save and restore the stochastic
    rounding streams (plain ints), so a resumed run continues the same stream.
    """

    def __init__(self, emulator: Emulator) -> None:
        super().__init__()
        self.emulator = emulator
        self._saved: list[tuple[bool, bool]] = []

    def __repr__(self) -> str:
        return f"emulate({self.emulator.fmt.display_name()}, {self.emulator.grid.mode.name})"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if any(issubclass(t, EmulatedTensor) for t in types):
            return NotImplemented  # an EmulatedTensor computes in its own format
        if torch._C._len_torch_dispatch_stack() > 0:
            with _disable_current_modes():  # the innermost emulation computes everything itself
                return self.emulator.dispatch(func, args, kwargs)
        return self.emulator.dispatch(func, args, kwargs)

    def __enter__(self) -> EmulateMode:
        # Fused oneDNN RNN kernels and the attention fast path compute many ops at once; off
        # inside the mode, so LSTMs and transformers run (and are rounded) op by op.
        self._saved.append((bool(torch.backends.mkldnn.enabled), torch.backends.mha.get_fastpath_enabled()))
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            super().__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        mkldnn, fastpath = self._saved.pop()
        torch.backends.mkldnn.enabled = mkldnn  # type: ignore[assignment]
        torch.backends.mha.set_fastpath_enabled(fastpath)

    def __call__(self, fn: F) -> F:
        """Use the mode as a decorator: the function runs inside it."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        """The random-stream positions (plain ints; loads with ``torch.load(weights_only=True)``)."""
        return self.emulator.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the streams from a `state_dict`."""
        self.emulator.load_state_dict(state)


def emulate(
    fmt: Format | str,
    rounding: RoundingLike = "nearest",
    *,
    accumulate: Format | str | None = None,
    order: str | int = "sequential",
    fma: bool = False,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    include: Iterable[Any] | None = None,
    exclude: Iterable[Any] | None = None,
) -> EmulateMode:
    """Compute every floating aten op in `fmt`: a context manager and decorator.

    Inside it, each op's floating inputs are rounded onto `fmt` (a no-op for
    values already on the grid, so tensors made outside count), the op's exact
    result is rounded once (float64 working precision where that makes the one
    rounding correct, the TwoSum/TwoProduct error term where it does not), and
    its floating outputs are on the grid, stored in the dtype the op would
    produce. This covers forward, backward and optimizer steps run inside,
    factories (zeros, randn, arange ...), in-place and ``out=`` forms and
    foreach optimizer kernels. Views and integer/bool ops pass through. Fused
    kernels that would skip roundings (``fused=True`` optimizers) raise an
    AnynumError naming the op; nothing is silently computed in float32.

    Args:
        fmt: the format (or its name). A Block format (MX, NVFP4) quantizes the
            operands of matmul/linear/convolution in blocks along the reduction
            axis and rounds every other result to FP32.
        rounding: a `Rounding` mode or alias; stochastic modes draw from a
            counter-based stream fixed by `seed` (or one draw of `generator`, or
            of torch's global generator when neither is given).
        accumulate: None (float64, rounded once), a Format (partial sums rounded
            to it, see `order` and `fma`), or "quire" (posits: exact, rounded once).
            Applies to mm/addmm/bmm/matmul/linear/convolution (forward and
            backward), sum/mean/cumsum/prod and vector norms.
        order: "sequential", "pairwise" or an int k (k exact products per rounding).
        fma: with a format `accumulate`, keep products exact (one rounding per multiply-add).
        include: aten op names ('tanh', 'aten.add.Tensor') to emulate only.
        exclude: aten op names to leave in the tensors' own precision.

    NaN stays NaN (NaR for posits); ±inf and overflow follow the format's
    default policy (inf where the format has infinities, else saturation to
    ±max); -0 is kept where the format has it. Leaving the context, also by an
    exception, restores normal execution; nested contexts: the innermost decides.

    >>> import torch, anynum as an
    >>> x = torch.tensor([1.0, 3.0])
    >>> with an.emulate("bf16"):
    ...     y = x / 3 + 2**-9
    >>> y.tolist()          # 1/3 rounded to bf16, then the sum rounded again
    [0.3359375, 1.0]
    >>> with an.emulate("posit(8,0)", accumulate="quire"):
    ...     s = torch.tensor([4.0, 0.0625, -4.0]).sum()
    >>> s.item()
    0.0625
    """
    if generator is not None and seed is not None:
        raise AnynumError("an.emulate expected generator= or seed=, received both. Fix: pass one.")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise AnynumError(
                f"an.emulate(generator=) expected a torch.Generator, received {type(generator).__name__}."
            )
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    if not isinstance(fmt, (Format, str)):
        raise AnynumError(
            f"an.emulate expected a Format or format name, received {type(fmt).__name__} {fmt!r}. "
            "Fix: an.emulate(an.format('posit(16,2)')) or an.emulate('bf16')."
        )
    with _disable_current_modes():  # building it runs torch ops; an enclosing mode must not see them
        em = Emulator(fmt, rounding, accumulate=accumulate, order=order, fma=fma, seed=seed)
    em.include = _op_names(include, "include")
    em.exclude = _op_names(exclude, "exclude") or set()
    return EmulateMode(em)
