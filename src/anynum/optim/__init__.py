"""Quantized optimizers: `QuantizedOptimizer` wraps any torch optimizer; Pychop-style convenience classes.

Loss scaling is static (`StaticLossScale`, Qtorch+ ``grad_scaling``) or dynamic
(`DynamicLossScale`, overflow-skip-and-backoff as AMP's GradScaler).
"""

from anynum.optim.convenience import (
    QuantizedAdadelta,
    QuantizedAdagrad,
    QuantizedAdam,
    QuantizedAdamW,
    QuantizedRMSprop,
    QuantizedSGD,
)
from anynum.optim.optimizer import MOMENTUM_STATES, SECOND_MOMENT_STATES, QuantizedOptimizer
from anynum.optim.scaling import DynamicLossScale, LossScale, StaticLossScale

__all__ = [
    "MOMENTUM_STATES",
    "SECOND_MOMENT_STATES",
    "DynamicLossScale",
    "LossScale",
    "QuantizedAdadelta",
    "QuantizedAdagrad",
    "QuantizedAdam",
    "QuantizedAdamW",
    "QuantizedOptimizer",
    "QuantizedRMSprop",
    "QuantizedSGD",
    "StaticLossScale",
]
