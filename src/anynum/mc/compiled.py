"""The double-word additions compiled into one loop by torch.compile (Inductor).

Only sums: Inductor turns addcmul into a separately rounded multiply and add (no FMA), so the
product and quotient kernels would not be bit-identical compiled; additions and subtractions
are kept exactly (Inductor compiles them with -fno-unsafe-math-optimizations
-ffp-contract=off, pinned below, and does no algebraic rewriting of float expressions), which
tests/mc/test_kernels.py checks bit for bit, and which fails with the unsafe-math flag on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from anynum.kernels.fused import compile_mode, own_code, run_compiled
from anynum.mc._core import Comps

__all__ = ["run"]


@functools.cache
def _compiled(formula: Callable[..., Comps]) -> Callable[..., torch.Tensor]:
    def body(*ins: torch.Tensor) -> torch.Tensor:
        return torch.stack(formula(*ins))  # both components in one (2, n) allocation

    # Own code object per kernel, so each has its own dynamo cache; 1-D inputs of any length
    # share one compiled loop (dynamic size): one compile per kernel, dtype and thread count.
    # The float flags are pinned, whatever TORCHINDUCTOR_* variables the user has set:
    # reassociation or contraction would make the error terms vanish.
    options: dict[str, str | int | bool | Callable[..., Any]] = {
        "cpp.enable_unsafe_math_opt_flag": False,
        "cpp.enable_floating_point_contract_flag": "off",
    }
    return torch.compile(own_code(body), dynamic=True, fullgraph=True, options=options)


def run(formula: Callable[..., Comps], shape: torch.Size, *ins: torch.Tensor) -> Comps | None:
    """Run the sum `formula` as one compiled loop, or return None when the eager kernel applies.

    Used on the CPU for same-shape contiguous float32/float64 operands only when
    ``ANYNUM_COMPILE=1`` (by default the C loops of `anynum.mc.cloops` run instead: no
    compile stall).  The 20 passes of
    AccurateDWPlusDW then become one pass over memory; the bits are the same.

    >>> import torch
    >>> from anynum.mc import compiled
    >>> compiled.run(lambda a, b: (a + b, a - b), torch.Size((3,)), torch.ones(3), torch.ones(3)) is None
    True
    """
    x0 = ins[0]
    if (
        x0.device.type != "cpu"
        or compile_mode() != "1"
        or not all(t.shape == shape and t.is_contiguous() for t in ins)
    ):
        return None
    flat = [t.view(-1) for t in ins]
    name = formula.__name__
    out = run_compiled(("mc", name, x0.dtype), f"MCTensor {name}", lambda: _compiled(formula)(*flat))
    if out is None:
        return None
    zh, zl = out.reshape(2, *shape).unbind(0)
    return zh, zl
