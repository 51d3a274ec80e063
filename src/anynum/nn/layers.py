"""Quantized drop-in layers (Pychop Table 6 names): the torch constructor arguments plus ``policy=``.

Linear, convolutions, pools and normalizations are the torch classes with
quantization attached (`anynum.nn.hooks.attach`). The recurrent layers and
MultiheadAttention re-implement their forward so that quantization acts inside
the op: on every gate pre-activation, gate, cell and hidden state of every
time step, and on attention projections, the softmax input, the softmax output
and the attention context. Their parameters keep torch's names, so
``state_dict`` is interchangeable with the torch layer's.

>>> import torch, anynum as an
>>> lstm = an.nn.LSTM(8, 16, batch_first=True, policy=an.nn.Policy(weight="bf16", activation="bf16"))
>>> out, (h, c) = lstm(torch.randn(2, 5, 8))
>>> bool((out.bfloat16().float() == out).all())
True
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from anynum.errors import AnynumError
from anynum.nn.hooks import attach, layer_state
from anynum.nn.policy import Policy, ResolvedPolicy
from anynum.nn.quantizer import Rounder, apply_pair, round_weight

__all__ = [
    "GRU",
    "LSTM",
    "RNN",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "LayerNorm",
    "Linear",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MultiheadAttention",
    "quantized_replacement",
]


def _resolve(policy: Policy | ResolvedPolicy | None, name: str) -> ResolvedPolicy:
    if isinstance(policy, ResolvedPolicy):
        return policy
    if policy is None:
        policy = Policy()
    if not isinstance(policy, Policy):
        raise AnynumError(f"policy= must be an anynum.nn.Policy or None, got {type(policy).__name__}.")
    return policy.resolve(name)


def _hooked(base: type[nn.Module]) -> type[nn.Module]:
    """The torch layer `base` with ``policy=`` attached at construction."""

    def __init__(self: nn.Module, *args: Any, policy: Policy | None = None, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        attach(self, _resolve(policy, base.__name__))

    doc = (
        f"`torch.nn.{base.__name__}` with quantization: same arguments plus ``policy=`` "
        "(an `anynum.nn.Policy`; weight/bias through parametrization, activations and "
        "errors at the layer's inputs and/or outputs, buffers after training-mode forwards). "
        "NaN/inf follow each category's format (see `anynum.quantize`).\n\n"
        f">>> import torch, anynum as an\n"
        f">>> pol = an.nn.Policy(weight='e4m3fn')\n"
        f">>> layer = an.nn.{base.__name__}({_EXAMPLE_ARGS[base.__name__]}, policy=pol)\n"
        f">>> type(layer).__mro__[1].__name__\n'{base.__name__}'\n"
    )
    return type(base.__name__, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


_EXAMPLE_ARGS = {
    "Linear": "4, 3",
    "Conv1d": "1, 2, 3",
    "Conv2d": "1, 2, 3",
    "Conv3d": "1, 2, 3",
    "MaxPool1d": "2",
    "MaxPool2d": "2",
    "MaxPool3d": "2",
    "AvgPool1d": "2",
    "AvgPool2d": "2",
    "AvgPool3d": "2",
    "BatchNorm1d": "4",
    "BatchNorm2d": "4",
    "BatchNorm3d": "4",
    "LayerNorm": "4",
}

Linear = _hooked(nn.Linear)
Conv1d = _hooked(nn.Conv1d)
Conv2d = _hooked(nn.Conv2d)
Conv3d = _hooked(nn.Conv3d)
MaxPool1d = _hooked(nn.MaxPool1d)
MaxPool2d = _hooked(nn.MaxPool2d)
MaxPool3d = _hooked(nn.MaxPool3d)
AvgPool1d = _hooked(nn.AvgPool1d)
AvgPool2d = _hooked(nn.AvgPool2d)
AvgPool3d = _hooked(nn.AvgPool3d)
BatchNorm1d = _hooked(nn.BatchNorm1d)
BatchNorm2d = _hooked(nn.BatchNorm2d)
BatchNorm3d = _hooked(nn.BatchNorm3d)
LayerNorm = _hooked(nn.LayerNorm)


# --- layers whose quantization acts inside the op ---------------------------------------------


class _Inside:
    """Shared helpers of the layers that round inside their own forward."""

    def _pol(self) -> ResolvedPolicy:
        state = layer_state(self)  # type: ignore[arg-type]
        assert state is not None
        return state.policy

    def _q(self, t: torch.Tensor) -> torch.Tensor:
        pol = self._pol()
        return apply_pair(t, pol.activation, pol.error)

    def _param(self, name: str) -> torch.Tensor | None:
        p = getattr(self, name)
        if p is None:
            return None
        rounder: Rounder | None = self._pol().for_param(name)
        return round_weight(p, rounder)


class _Recurrent(_Inside):
    mode: str
    hidden_size: int
    num_layers: int
    bias: bool
    batch_first: bool
    dropout: float
    bidirectional: bool
    proj_size: int
    training: bool
    nonlinearity: str

    def _setup(self, policy: Policy | ResolvedPolicy | None) -> None:
        if self.proj_size:
            raise AnynumError(
                "quantized LSTM layers do not support proj_size > 0 yet; use proj_size=0 "
                "or quantize the torch layer's outputs only (Policy on an excluded layer)."
            )
        attach(self, _resolve(policy, type(self).__name__), params=False)  # type: ignore[arg-type]

    def _cell(
        self,
        gx: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor | None,
        w_hh: torch.Tensor,
        b_hh: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q = self._q
        gh = F.linear(h, w_hh, b_hh)
        if self.mode == "LSTM":
            assert c is not None
            i, f, g, o = q(gx + gh).chunk(4, 1)
            i, f, g, o = q(torch.sigmoid(i)), q(torch.sigmoid(f)), q(torch.tanh(g)), q(torch.sigmoid(o))
            c = q(f * c + i * g)
            return q(o * q(torch.tanh(c))), c
        if self.mode == "GRU":
            rx, zx, nx = gx.chunk(3, 1)
            rh, zh, nh = gh.chunk(3, 1)
            r = q(torch.sigmoid(q(rx + rh)))
            z = q(torch.sigmoid(q(zx + zh)))
            n = q(torch.tanh(q(nx + r * nh)))
            return q((1 - z) * n + z * h), None
        act = torch.tanh if self.mode == "RNN_TANH" else torch.relu
        return q(act(q(gx + gh))), None

    def _run(self, input: Any, hx: Any) -> tuple[torch.Tensor, Any]:
        if isinstance(input, PackedSequence):
            raise AnynumError(
                "quantized recurrent layers take padded tensors, not PackedSequence; "
                "pad with torch.nn.utils.rnn.pad_packed_sequence first."
            )
        lstm = self.mode == "LSTM"
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1 if not self.batch_first else 0)
        if self.batch_first:
            x = x.transpose(0, 1)
        steps, batch = x.shape[0], x.shape[1]
        dirs = 2 if self.bidirectional else 1
        shape = (self.num_layers * dirs, batch, self.hidden_size)
        if hx is None:
            h0 = x.new_zeros(shape)
            c0 = x.new_zeros(shape) if lstm else None
        else:
            h0, c0 = hx if lstm else (hx, None)
            if not batched:
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
        layer_input = x
        h_n: list[torch.Tensor] = []
        c_n: list[torch.Tensor] = []
        for layer in range(self.num_layers):
            outputs = []
            for d in range(dirs):
                sfx = "_reverse" if d else ""
                w_ih = self._param(f"weight_ih_l{layer}{sfx}")
                w_hh = self._param(f"weight_hh_l{layer}{sfx}")
                b_ih = self._param(f"bias_ih_l{layer}{sfx}") if self.bias else None
                b_hh = self._param(f"bias_hh_l{layer}{sfx}") if self.bias else None
                assert w_ih is not None and w_hh is not None
                gx_all = F.linear(layer_input, w_ih, b_ih)
                k = layer * dirs + d
                h = h0[k]
                c = c0[k] if c0 is not None else None
                seq: list[torch.Tensor] = [h] * steps
                order = range(steps - 1, -1, -1) if d else range(steps)
                for t in order:
                    h, c = self._cell(gx_all[t], h, c, w_hh, b_hh)
                    seq[t] = h
                outputs.append(torch.stack(seq))
                h_n.append(h)
                if c is not None:
                    c_n.append(c)
            layer_input = outputs[0] if dirs == 1 else torch.cat(outputs, dim=2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        out = layer_input.transpose(0, 1) if self.batch_first else layer_input
        hn = torch.stack(h_n)
        cn = torch.stack(c_n) if lstm else None
        if not batched:
            out = out.squeeze(1 if not self.batch_first else 0)
            hn = hn.squeeze(1)
            cn = cn.squeeze(1) if cn is not None else None
        return out, ((hn, cn) if lstm else hn)

    @classmethod
    def from_module(cls, module: nn.RNNBase, policy: Policy | ResolvedPolicy | None = None) -> Any:
        """A quantized layer that shares `module`'s Parameter objects (optimizers keep working)."""
        w = module.weight_ih_l0
        kwargs: dict[str, Any] = {
            "num_layers": module.num_layers,
            "bias": module.bias,
            "batch_first": module.batch_first,
            "dropout": module.dropout,
            "bidirectional": module.bidirectional,
            "dtype": w.dtype,
            "policy": policy,
        }
        if module.mode in ("RNN_TANH", "RNN_RELU"):
            kwargs["nonlinearity"] = "tanh" if module.mode == "RNN_TANH" else "relu"
        if module.mode == "LSTM":
            kwargs["proj_size"] = module.proj_size
        # Built on the meta device: no memory and no draw from the global RNG.
        with torch.device("meta"):
            new: Any = cls(module.input_size, module.hidden_size, **kwargs)  # type: ignore[call-arg]
        for name in module._flat_weights_names:
            setattr(new, name, getattr(module, name))
        new.train(module.training)
        return new


class RNN(_Recurrent, nn.RNN):
    """`torch.nn.RNN` with quantization at gate level: same arguments plus ``policy=``.

    Weights are rounded once per forward; the activation (and, backward, the
    error) number rounds every pre-activation and every hidden state of every
    step, so the recurrence itself runs on the grid. PackedSequence inputs are
    not supported. NaN/inf follow the formats' overflow policies.

    >>> import torch, anynum as an
    >>> rnn = an.nn.RNN(3, 4, policy=an.nn.Policy(activation="e4m3fn"))
    >>> out, h = rnn(torch.randn(5, 2, 3)); tuple(out.shape)
    (5, 2, 4)
    """

    def __init__(self, *args: Any, policy: Policy | ResolvedPolicy | None = None, **kwargs: Any) -> None:
        nn.RNN.__init__(self, *args, **kwargs)
        self._setup(policy)

    def forward(self, input: Any, hx: Any = None) -> Any:  # type: ignore[override]
        return self._run(input, hx)


class LSTM(_Recurrent, nn.LSTM):
    """`torch.nn.LSTM` with quantization at gate level: same arguments plus ``policy=``.

    Every step rounds the gate pre-activations, each gate (i, f, g, o), the
    cell state, tanh(cell) and the hidden state with the activation number,
    and their gradients with the error number. ``proj_size > 0`` and
    PackedSequence inputs raise AnynumError. NaN/inf follow the formats.

    >>> import torch, anynum as an
    >>> lstm = an.nn.LSTM(3, 4, policy=an.nn.Policy(activation="e4m3fn"))
    >>> out, (h, c) = lstm(torch.randn(5, 2, 3)); tuple(c.shape)
    (1, 2, 4)
    """

    def __init__(self, *args: Any, policy: Policy | ResolvedPolicy | None = None, **kwargs: Any) -> None:
        nn.LSTM.__init__(self, *args, **kwargs)
        self._setup(policy)

    def forward(self, input: Any, hx: Any = None) -> Any:  # type: ignore[override]
        return self._run(input, hx)


class GRU(_Recurrent, nn.GRU):
    """`torch.nn.GRU` with quantization at gate level: same arguments plus ``policy=``.

    Every step rounds the reset/update pre-activations and gates, the
    candidate state and the new hidden state. NaN/inf follow the formats.

    >>> import torch, anynum as an
    >>> gru = an.nn.GRU(3, 4, batch_first=True, policy=an.nn.Policy(activation="bf16"))
    >>> out, h = gru(torch.randn(2, 5, 3)); tuple(out.shape)
    (2, 5, 4)
    """

    def __init__(self, *args: Any, policy: Policy | ResolvedPolicy | None = None, **kwargs: Any) -> None:
        nn.GRU.__init__(self, *args, **kwargs)
        self._setup(policy)

    def forward(self, input: Any, hx: Any = None) -> Any:  # type: ignore[override]
        return self._run(input, hx)


class MultiheadAttention(_Inside, nn.MultiheadAttention):
    """`torch.nn.MultiheadAttention` with quantization inside: same arguments plus ``policy=``.

    Rounds the q/k/v projections, the attention scores (softmax input, before
    masks are applied so masked entries stay exactly -inf), the softmax output
    and the attention context with the activation number (errors backward);
    in_proj/out_proj weights and biases with the weight/bias numbers.
    ``add_bias_kv`` and ``add_zero_attn`` raise AnynumError.

    >>> import torch, anynum as an
    >>> mha = an.nn.MultiheadAttention(8, 2, batch_first=True, policy=an.nn.Policy(activation="bf16"))
    >>> x = torch.randn(3, 5, 8)
    >>> out, w = mha(x, x, x); tuple(out.shape), tuple(w.shape)
    ((3, 5, 8), (3, 5, 5))
    """

    def __init__(self, *args: Any, policy: Policy | ResolvedPolicy | None = None, **kwargs: Any) -> None:
        nn.MultiheadAttention.__init__(self, *args, **kwargs)
        if self.bias_k is not None or self.add_zero_attn:
            raise AnynumError(
                "quantized MultiheadAttention does not support add_bias_kv or add_zero_attn; "
                "construct it without them."
            )
        attach(self, _resolve(policy, "MultiheadAttention"), params=False)

    def _out_param(self, name: str) -> torch.Tensor | None:
        p = getattr(self.out_proj, name)
        return None if p is None else round_weight(p, self._pol().for_param(name))

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        q_ = self._q
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        tgt, bsz, embed = query.shape
        src = key.shape[0]
        heads, hd = self.num_heads, self.head_dim
        if self._qkv_same_embed_dim:
            w = self._param("in_proj_weight")
            assert w is not None
            w_q, w_k, w_v = w.chunk(3)
        else:
            w_q, w_k, w_v = (self._param(n) for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"))  # type: ignore[assignment]
        b = self._param("in_proj_bias")
        b_q, b_k, b_v = b.chunk(3) if b is not None else (None, None, None)
        q = q_(F.linear(query, w_q, b_q))
        k = q_(F.linear(key, w_k, b_k))
        v = q_(F.linear(value, w_v, b_v))
        q = q.reshape(tgt, bsz * heads, hd).transpose(0, 1)
        k = k.reshape(src, bsz * heads, hd).transpose(0, 1)
        v = v.reshape(src, bsz * heads, hd).transpose(0, 1)
        scores = q_(torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(hd)))  # softmax input
        mask = self._merged_mask(attn_mask, key_padding_mask, is_causal, bsz, tgt, src, scores.dtype)
        if mask is not None:
            scores = scores + mask
        attn = q_(torch.softmax(scores, dim=-1))  # softmax output
        if self.training and self.dropout > 0:
            attn = F.dropout(attn, self.dropout)
        ctx = q_(torch.bmm(attn, v))
        ctx = ctx.transpose(0, 1).reshape(tgt, bsz, embed)
        out = F.linear(ctx, self._out_param("weight"), self._out_param("bias"))  # type: ignore[arg-type]
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        weights = None
        if need_weights:
            weights = attn.view(bsz, heads, tgt, src)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights

    def _merged_mask(
        self,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        is_causal: bool,
        bsz: int,
        tgt: int,
        src: int,
        dtype: torch.dtype,
    ) -> torch.Tensor | None:
        def additive(m: torch.Tensor) -> torch.Tensor:
            if m.dtype == torch.bool:
                return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
            return m.to(dtype)

        if attn_mask is None and is_causal:
            attn_mask = torch.ones(tgt, src, dtype=torch.bool).triu(1)
        mask = None
        if attn_mask is not None:
            m = additive(attn_mask)
            mask = m.unsqueeze(0) if m.dim() == 2 else m
        if key_padding_mask is not None:
            kp = additive(key_padding_mask).view(bsz, 1, 1, src).expand(-1, self.num_heads, -1, -1)
            kp = kp.reshape(bsz * self.num_heads, 1, src)
            mask = kp if mask is None else mask + kp
        return mask

    @classmethod
    def from_module(
        cls, module: nn.MultiheadAttention, policy: Policy | ResolvedPolicy | None = None
    ) -> MultiheadAttention:
        """A quantized layer sharing `module`'s Parameter objects and its out_proj."""
        if module.bias_k is not None or module.add_zero_attn:
            raise AnynumError(
                "quantized MultiheadAttention does not support add_bias_kv or add_zero_attn; "
                "exclude this layer from the policy."
            )
        w = module.out_proj.weight
        with torch.device("meta"):
            new = cls(
                module.embed_dim,
                module.num_heads,
                dropout=module.dropout,
                bias=module.in_proj_bias is not None,
                kdim=module.kdim,
                vdim=module.vdim,
                batch_first=module.batch_first,
                dtype=w.dtype,
                policy=policy,
            )
        for name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            new._parameters[name] = module._parameters.get(name)  # type: ignore[assignment]
        new.out_proj = module.out_proj
        new.train(module.training)
        return new


_REPLACEMENTS: dict[type[nn.Module], Any] = {
    nn.RNN: RNN,
    nn.LSTM: LSTM,
    nn.GRU: GRU,
    nn.MultiheadAttention: MultiheadAttention,
}


def quantized_replacement(module: nn.Module, policy: ResolvedPolicy) -> nn.Module | None:
    """The inside-the-op quantized layer for `module` (sharing its parameters), or None if hooks suffice."""
    cls = _REPLACEMENTS.get(type(module))
    if cls is None:
        return None
    return cls.from_module(module, policy)  # type: ignore[no-any-return]
