"""Which rule each aten op follows under emulation: the op table.

Most ops follow the generic rule (`anynum.emulate.engine`): round the floating
inputs onto the grid, compute once in float64, round every floating output
once. This table names the exceptions:

- views and metadata ops pass through (a view of a tensor on the grid is on it);
- value-selecting ops (copies, concatenation, indexing, max/min, relu, padding ...)
  only move values that are already on the grid, so they run in the tensors' own
  dtype after the inputs are rounded, and their outputs are on the grid as they are;
- fused multi-op kernels that would skip intermediate roundings are refused with
  an AnynumError naming the op and the fix (mode entry switches off the oneDNN RNN
  and the attention fast paths, so ordinary models never reach them);
- fused attention is decomposed into its ops, each emulated.

Reductions and dot products with ``accumulate=``, and Block-format operands, are
handled in `anynum.emulate.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ArgInfo", "OpPlan", "plan_for"]

aten = torch.ops.aten

_TENSOR, _TENSOR_LIST, _SCALAR, _DTYPE, _OTHER = "tensor", "tensor_list", "scalar", "dtype", "other"

#: Ops that only move values: outputs hold input values, 0, or (rounded) scalar arguments.
_SELECT = {
    "clone", "copy_", "_to_copy", "cat", "stack", "index_select", "index", "gather", "where",
    "masked_fill", "masked_fill_", "constant_pad_nd", "max_pool2d_with_indices",
    "max_pool1d_with_indices", "max_pool3d_with_indices", "max", "min", "amax", "amin", "maximum",
    "minimum", "relu", "relu_", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max",
    "clamp_max_", "hardtanh", "hardtanh_", "threshold_backward", "abs", "abs_", "neg", "neg_",
    "sort", "topk", "flip", "roll", "repeat", "select_backward", "slice_backward", "narrow_copy",
    "slice_scatter", "select_scatter", "fill_", "fill", "zero_", "_local_scalar_dense", "equal",
    "embedding", "expand_copy", "permute_copy", "t_copy", "transpose_copy", "view_copy",
    "unsqueeze_copy", "squeeze_copy", "_unsafe_view", "alias_copy", "detach_copy", "zeros_like",
    "new_zeros", "tril", "triu", "diag_embed", "movedim", "unfold_copy",
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "signbit", "argmax", "argmin",
    "nonzero", "any", "all", "logical_not", "logical_and", "logical_or",
}

#: Ops that create or describe tensors without values, or whose values are never read.
_PASS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
    "lift_fresh_copy", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
    "_has_compatible_shallow_copy_type", "set_", "resize_", "resize_as_", "record_stream",
    "_record_function_enter_new", "_record_function_exit", "is_nonzero", "size", "stride",
    "is_contiguous", "dim", "numel", "_nested_tensor_from_mask_left_aligned",
}

#: Fused kernels that would compute several ops with a single rounding: refused, with the fix.
_DENY = {
    "_fused_adam_": "pass foreach=True (or foreach=False) to the optimizer: fused=True runs the whole "
    "update in one kernel",
    "_fused_adamw_": "pass foreach=True (or foreach=False) to the optimizer: fused=True runs the "
    "whole update in one kernel",
    "_fused_sgd_": "pass foreach=True (or foreach=False) to SGD: fused=True runs the whole update "
    "in one kernel",
    "_fused_adagrad_": "pass foreach=True (or foreach=False) to Adagrad",
    "mkldnn_rnn_layer": "leave torch.backends.mkldnn enabled=False inside an.emulate (the mode "
    "switches it off on entry) so the RNN runs op by op",
    "mkldnn_rnn_layer_backward": "leave torch.backends.mkldnn enabled=False inside an.emulate",
    "_transformer_encoder_layer_fwd": "call torch.backends.mha.set_fastpath_enabled(False) (the "
    "mode does on entry) or run the layer in training mode",
    "_native_multi_head_attention": "call torch.backends.mha.set_fastpath_enabled(False) (the "
    "mode does on entry)",
    "_thnn_fused_lstm_cell": "run on the CPU eager path (no fused cell)",
    "_thnn_fused_gru_cell": "run on the CPU eager path (no fused cell)",
    "_fused_moving_avg_obs_fq_helper": "emulate the model without fake-quantization observers",
    "_fused_dropout": "use nn.Dropout (bernoulli + mul) instead of the fused CUDA dropout",
}

#: Fused kernels replaced by their decomposition (each part emulated).
_DECOMPOSE = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
}


@dataclass(frozen=True)
class ArgInfo:
    """One schema argument: its name, position (None: keyword-only), kind and whether the op writes it."""

    name: str
    position: int | None
    kind: str
    write: bool


@dataclass(frozen=True)
class OpPlan:
    """How one op overload is emulated: its kind and what its arguments are."""

    kind: str  # "view" | "pass" | "select" | "compute" | "deny" | "decompose"
    name: str  # the packet name, e.g. "add_"
    args: tuple[ArgInfo, ...]
    writes: bool
    factory: bool  # no tensor arguments at all
    reason: str = ""
    seeded: bool = False  # draws random numbers (torch.Tag.nondeterministic_seeded)
    scalars: bool = False  # has Scalar arguments
    fresh: bool = False  # its results alias no argument (the schema says so): new tensors it owns


_PLANS: dict[object, OpPlan] = {}


def _arg_kind(type_str: str, real_type_str: str) -> str:
    if type_str in ("Tensor", "Optional[Tensor]"):
        return _TENSOR
    if type_str in ("List[Tensor]", "List[Optional[Tensor]]", "Optional[List[Tensor]]"):
        return _TENSOR_LIST
    if type_str in ("number", "Optional[number]"):
        return _SCALAR
    if real_type_str in ("ScalarType", "Optional[ScalarType]"):  # `type` says int
        return _DTYPE
    return _OTHER


def plan_for(func: torch._ops.OpOverload) -> OpPlan:
    """The (cached) `OpPlan` of an op overload."""
    plan = _PLANS.get(func)
    if plan is not None:
        return plan
    schema = func._schema
    args = []
    positional = 0
    for a in schema.arguments:
        pos = None
        if not a.kwarg_only:
            pos = positional
            positional += 1
        write = bool(a.alias_info is not None and a.alias_info.is_write)
        args.append(ArgInfo(a.name, pos, _arg_kind(str(a.type), str(a.real_type)), write))
    name = func.overloadpacket.__name__
    namespace = func.namespace
    factory = not any(a.kind in (_TENSOR, _TENSOR_LIST) for a in args)
    reason = ""
    if namespace == "profiler" or name in _PASS:
        kind = "pass"
    elif func.is_view:
        kind = "view"
    elif name in _DENY:
        kind, reason = "deny", _DENY[name]
    elif name in _DECOMPOSE:
        kind = "decompose"
    elif name in _SELECT:
        kind = "select"
    else:
        kind = "compute"
    seeded = torch.Tag.nondeterministic_seeded in func.tags
    scalars = any(a.kind == _SCALAR for a in args)
    fresh = all(r.alias_info is None for r in schema.returns)
    writes = any(a.write for a in args)
    plan = OpPlan(kind, name, tuple(args), writes, factory, reason, seeded, scalars, fresh)
    _PLANS[func] = plan
    return plan
