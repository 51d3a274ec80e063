"""Arithmetic emulation: every op of a model computed in a number format.

``emulate`` (a TorchDispatchMode), ``EmulatedTensor``/``as_format`` (packed
storage) and ``matmul`` with accumulation formats and the posit quire. See
docs/emulate.md.
"""

from anynum.emulate.accumulate import Accumulation, Accumulator, matmul
from anynum.emulate.mode import EmulateMode, emulate

__all__ = ["Accumulation", "Accumulator", "EmulateMode", "emulate", "matmul"]
