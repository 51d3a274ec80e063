"""How rounding runs: every kernel, and the router that picks one (`anynum.kernels.route`).

Importing this package registers every kernel with the router, in one place:
the eager reference of each format family (float and uniform in `eager`, then
`posit`, `table`, `block`), the native C kernels of every family (`ckernel`, the
first choice on CPU), torch's native casts (`native`) and the torch.compile'd
kernels (`fused`, for other devices and for calls the C kernels decline).
"""

from anynum.kernels import block as _block  # noqa: F401  (registers the block kernel)
from anynum.kernels import ckernel as _ckernel  # noqa: F401  (registers the C kernels)
from anynum.kernels import customop as _customop  # noqa: F401  (defines the anynum:: torch ops)
from anynum.kernels import native as _native  # noqa: F401  (registers torch's casts)
from anynum.kernels import posit as _posit  # noqa: F401  (registers the posit kernel)
from anynum.kernels import table as _table  # noqa: F401  (registers the table kernel)
from anynum.kernels.eager import apply_overflow, round_to_format, working_dtype
from anynum.kernels.fused import fused_round, use_fused
from anynum.kernels.route import plan_for, round_tensor
from anynum.kernels.settings import compile_min, compile_mode

__all__ = [
    "apply_overflow",
    "compile_min",
    "compile_mode",
    "fused_round",
    "plan_for",
    "round_tensor",
    "round_to_format",
    "use_fused",
    "working_dtype",
]
