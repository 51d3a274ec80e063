"""How rounding runs: the eager torch reference kernels, one module per format family.

Importing this package registers every family's kernel with `round_to_format`.
"""

from anynum.kernels import block as _block  # noqa: F401  (registers the block kernel)
from anynum.kernels import posit as _posit  # noqa: F401  (registers the posit kernel)
from anynum.kernels import table as _table  # noqa: F401  (registers the table kernel)
from anynum.kernels.eager import apply_overflow, round_to_format, working_dtype
from anynum.kernels.fused import compile_mode, fused_round, use_fused

__all__ = [
    "apply_overflow",
    "compile_mode",
    "fused_round",
    "round_to_format",
    "use_fused",
    "working_dtype",
]
