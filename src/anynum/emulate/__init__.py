"""Arithmetic emulation: every op of a model computed in a number format.

``emulate`` (a TorchDispatchMode), ``EmulatedTensor``/``as_format`` (packed
storage) and ``matmul`` with accumulation formats and the posit quire. See
docs/emulate.md.
"""

from anynum.emulate.accumulate import Accumulation, Accumulator, matmul
from anynum.emulate import rules as _rules  # noqa: F401  (registers the dot/reduction rules)
from anynum.emulate.mode import EmulateMode, emulate
from anynum.emulate.native import install as _install_native
from anynum.emulate.tensor import EmulatedTensor, as_format

_install_native()

__all__ = ["Accumulation", "Accumulator", "EmulateMode", "EmulatedTensor", "as_format", "emulate", "matmul"]
