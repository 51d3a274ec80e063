"""Modules with multi-component parameters: `MCParameter`, `MCLinear`, `MCEmbedding`,
`ToTensor` and `MCSequential`.

An `MCParameter` is an ``nn.Parameter`` holding the ``nc`` components stacked along a
leading dimension (shape ``(nc, *shape)``), so ``state_dict`` save/load, ``.to()`` and
optimizers see one ordinary tensor.  ``p.mc`` is the `MCTensor` view used in forward;
its components are views of the parameter, so autograd accumulates the gradient into
``p.grad`` (every component slice receives the gradient with respect to the value).
Unlike the original MCTensor code (whose ``.T`` detached the weights), these parameters
do get gradients.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from anynum.errors import AnynumError
from anynum.mc._core import check_dtype
from anynum.mc.tensor import MCTensor, wrap

__all__ = ["MCEmbedding", "MCLinear", "MCParameter", "MCSequential", "ToTensor"]


class MCParameter(nn.Parameter):
    """An ``nn.Parameter`` storing an MC value as stacked components ``(nc, *shape)``.

    >>> import torch
    >>> from anynum import mc
    >>> p = mc.nn.MCParameter(mc.MCTensor(torch.ones(3), nc=2))
    >>> tuple(p.shape), p.nc, p.mc.nc
    ((2, 3), 2, 2)
    """

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> MCParameter:
        if isinstance(data, MCTensor):
            data = torch.stack([c.detach() for c in data.components()])
        if data is None or not isinstance(data, torch.Tensor) or data.dim() < 1:
            raise AnynumError("MCParameter needs an MCTensor (or stacked components (nc, ...))")
        check_dtype(data.dtype)
        return super().__new__(cls, data, requires_grad)  # type: ignore[return-value]

    @property
    def nc(self) -> int:
        """Number of components (the leading dimension)."""
        return int(self.shape[0])

    @property
    def mc(self) -> MCTensor:
        """The `MCTensor` value; its components are views of this parameter."""
        return wrap(tuple(self.unbind(0)))

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return f"MCParameter(nc={self.nc}, shape={tuple(self.shape[1:])}, dtype={self.dtype})"


def _init_uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator | None) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator)


class MCLinear(nn.Module):
    """``y = x W^T + b`` with MC weight and bias; returns an `MCTensor`.

    The input may be a plain tensor (any float dtype; converted to the component dtype
    exactly where it fits) or an `MCTensor` (MC x MC product).  Initialisation follows
    ``nn.Linear`` (uniform in ``±1/sqrt(in_features)``), rounded to the component dtype,
    lower components zero, so an MC layer starts exactly where a plain layer of that
    dtype would.

    >>> import torch
    >>> from anynum import mc
    >>> layer = mc.nn.MCLinear(3, 2, nc=2, dtype=torch.float16)
    >>> y = layer(torch.ones(4, 3))
    >>> y.to_tensor().sum().backward()
    >>> layer.weight.grad is not None
    True
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, nc: int = 2,
                 dtype: torch.dtype = torch.float32, device: Any = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_dtype(dtype)
        self.in_features, self.out_features, self.nc = in_features, out_features, nc
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        w = _init_uniform((out_features, in_features), bound, generator).to(dtype)
        self.weight = MCParameter(MCTensor(w.to(device) if device else w, nc))
        if bias:
            b = _init_uniform((out_features,), bound, generator).to(dtype)
            self.bias: MCParameter | None = MCParameter(MCTensor(b.to(device) if device else b, nc))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Any) -> MCTensor:
        bias = self.bias.mc if self.bias is not None else None
        fn: Any = torch.nn.functional.linear
        return fn(x, self.weight.mc, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, nc={self.nc}, dtype={self.weight.dtype}")


class MCEmbedding(nn.Module):
    """Embedding table with MC rows; ``forward(ids)`` returns an `MCTensor`.

    Initialised like ``nn.Embedding`` (standard normal) rounded to the component dtype,
    or from ``init`` (a float tensor, split exactly into nc components when it fits).

    >>> import torch
    >>> from anynum import mc
    >>> emb = mc.nn.MCEmbedding(10, 4, nc=2, dtype=torch.float64)
    >>> emb(torch.tensor([1, 2])).shape
    torch.Size([2, 4])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, nc: int = 2,
                 dtype: torch.dtype = torch.float32, init: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        check_dtype(dtype)
        if init is None:
            init = torch.randn(num_embeddings, embedding_dim, dtype=torch.float64,
                               generator=generator).to(dtype)
        elif tuple(init.shape) != (num_embeddings, embedding_dim):
            raise AnynumError(
                f"init must have shape {(num_embeddings, embedding_dim)}, got {tuple(init.shape)}"
            )
        self.num_embeddings, self.embedding_dim, self.nc = num_embeddings, embedding_dim, nc
        self.weight = MCParameter(MCTensor(init, nc, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> MCTensor:
        fn: Any = torch.nn.functional.embedding
        return fn(ids, self.weight.mc)


class ToTensor(nn.Module):
    """Convert an `MCTensor` to a plain tensor (correctly rounded); tensors pass through.

    >>> import torch
    >>> from anynum import mc
    >>> mc.nn.ToTensor()(mc.MCTensor(torch.ones(2))).tolist()
    [1.0, 1.0]
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: Any) -> torch.Tensor:
        return x.to_tensor(self.dtype) if isinstance(x, MCTensor) else x


class MCSequential(nn.Sequential):
    """``nn.Sequential`` for mixed MC/plain layers (activations such as ``nn.ReLU`` accept
    MCTensors through ``__torch_function__``; insert `ToTensor` to leave MC precision).

    >>> import torch
    >>> from anynum import mc
    >>> net = mc.nn.MCSequential(mc.nn.MCLinear(2, 3), torch.nn.ReLU(), mc.nn.ToTensor())
    >>> net(torch.ones(1, 2)).shape
    torch.Size([1, 3])
    """
