"""How rounding runs: the eager torch reference kernels (and, later, fused paths and adapters)."""

from anynum.kernels.eager import apply_overflow, round_to_format, working_dtype

__all__ = ["apply_overflow", "round_to_format", "working_dtype"]
