"""The op table reads dtype arguments as dtypes, so emulation widens them with the tensors.

The schema's ``type`` of a dtype argument says ``int``; only ``real_type`` says ScalarType. A
floating dtype argument left at float32 beside float64 tensors is accepted by CPU kernels and
refused by CUDA ones (the backward of log_softmax: "expected input and grad types to match");
emulation cannot be observed from below on the mode stack (it computes with the modes off), so
this checks the table here and tests/cuda/test_device_parity.py runs the GPU itself.
"""

from __future__ import annotations

import pytest
import torch

from anynum.emulate.optable import plan_for

aten = torch.ops.aten


@pytest.mark.parametrize(("op", "name"), [
    (aten._log_softmax_backward_data.default, "input_dtype"),
    (aten._softmax_backward_data.default, "input_dtype"),
    (aten._to_copy.default, "dtype"),
    (aten.sum.dim_IntList, "dtype"),
    (aten.full.default, "dtype"),
])
def test_dtype_arguments_are_read_as_dtypes(op, name) -> None:
    kinds = {a.name: a.kind for a in plan_for(op).args}
    assert kinds[name] == "dtype"


def test_integer_arguments_stay_integers() -> None:
    kinds = {a.name: a.kind for a in plan_for(aten._log_softmax_backward_data.default).args}
    assert kinds["dim"] == "other"
