"""How rounding runs: the eager torch reference kernels, one module per format family.

Importing this package registers every family's kernel with `round_to_format`.
"""

from anynum.kernels.eager import apply_overflow, round_to_format, working_dtype

__all__ = ["apply_overflow", "round_to_format", "working_dtype"]
