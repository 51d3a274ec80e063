"""Optimizers that keep parameters and their state in MC precision: `MCSGD`, `MCAdam`.

For an `anynum.mc.nn.MCParameter` the gradient with respect to the value (``p.grad[0]``)
is combined with the MC parameter and MC state (momentum, Adam moments) in MC
arithmetic, and the learning rate itself is held to nc components, so updates far below
the resolution of the component dtype are not lost.  Plain parameters get the ordinary
update in their own dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from anynum.errors import AnynumError
from anynum.mc import arith, functions
from anynum.mc._core import Comps, scalar_comps
from anynum.mc.nn import MCParameter

__all__ = ["MCSGD", "MCAdam"]


def _const(v: float, p: torch.Tensor, nc: int) -> Comps:
    c = scalar_comps(v, p.dtype, nc, p.device)
    return c if nc > 1 else c[:1]


def _comps(t: torch.Tensor) -> Comps:
    return tuple(t.unbind(0))


class MCSGD(torch.optim.Optimizer):
    """SGD (momentum, dampening, Nesterov, weight decay) with MC parameters and state.

    Follows ``torch.optim.SGD``'s update rule.  NaN/inf gradients propagate into the
    parameters as they would with ``torch.optim.SGD``.

    >>> import torch
    >>> from anynum import mc
    >>> layer = mc.nn.MCLinear(2, 1, nc=2, dtype=torch.float16)
    >>> opt = mc.optim.MCSGD(layer.parameters(), lr=1e-3, momentum=0.9)
    >>> layer(torch.ones(1, 2)).to_tensor().sum().backward()
    >>> before = layer.weight.detach().clone(); opt.step()
    >>> bool((layer.weight.detach() != before).any())
    True
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise AnynumError(
                f"invalid MCSGD settings lr={lr}, momentum={momentum}, weight_decay={weight_decay}"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise AnynumError("Nesterov momentum requires momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mom, damp = group["lr"], group["momentum"], group["dampening"]
            wd, nest = group["weight_decay"], group["nesterov"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not isinstance(p, MCParameter):
                    d = p.grad
                    if wd:
                        d = d.add(p, alpha=wd)
                    if mom:
                        st = self.state[p]
                        if "momentum_buffer" not in st:
                            st["momentum_buffer"] = d.clone()
                        else:
                            st["momentum_buffer"].mul_(mom).add_(d, alpha=1 - damp)
                        buf = st["momentum_buffer"]
                        d = d.add(buf, alpha=mom) if nest else buf
                    p.add_(d, alpha=-lr)
                    continue
                nc = p.shape[0]
                x = _comps(p.data)
                dc: Comps = (p.grad[0],)
                if wd:
                    dc = arith.add(arith.mul(x, _const(wd, p, nc), nc), dc, nc)
                if mom:
                    st = self.state[p]
                    if "momentum_buffer" not in st:
                        buf = arith.pad(dc, nc)
                    else:
                        old = _comps(st["momentum_buffer"])
                        buf = arith.mul(old, _const(mom, p, nc), nc)
                        scaled = dc if damp == 0 else arith.mul(dc, _const(1 - damp, p, nc), nc)
                        buf = arith.add(buf, scaled, nc)
                    st["momentum_buffer"] = torch.stack(arith.pad(buf, nc))
                    dc = arith.add(dc, arith.mul(buf, _const(mom, p, nc), nc), nc) if nest else buf
                new = arith.sub(x, arith.mul(dc, _const(lr, p, nc), nc), nc)
                p.data.copy_(torch.stack(arith.pad(new, nc)))
        return loss


class MCAdam(torch.optim.Optimizer):
    """Adam (``torch.optim.Adam`` rule, optional L2 weight decay) with MC parameters and
    MC first/second moments.

    Low-precision caveat: with float16 components the second moment ``g*g`` underflows
    for ``|g| < 2**-12`` and ``eps=1e-8`` is below float16's range; use float32/bfloat16
    components for Adam or a larger ``eps``.  NaN/inf gradients propagate.

    >>> import torch
    >>> from anynum import mc
    >>> layer = mc.nn.MCLinear(2, 1, nc=2, dtype=torch.float32)
    >>> opt = mc.optim.MCAdam(layer.parameters(), lr=1e-3)
    >>> layer(torch.ones(1, 2)).to_tensor().sum().backward(); opt.step()
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise AnynumError(f"invalid MCAdam settings lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st["step"] = st.get("step", 0) + 1
                t = st["step"]
                bc1, bc2 = 1 - b1**t, 1 - b2**t
                if not isinstance(p, MCParameter):
                    gp = p.grad if not wd else p.grad.add(p, alpha=wd)
                    if "exp_avg" not in st:
                        st["exp_avg"] = torch.zeros_like(p)
                        st["exp_avg_sq"] = torch.zeros_like(p)
                    st["exp_avg"].mul_(b1).add_(gp, alpha=1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(gp, gp, value=1 - b2)
                    den = (st["exp_avg_sq"] / bc2).sqrt_().add_(eps)
                    p.addcdiv_(st["exp_avg"], den, value=-lr / bc1)
                    continue
                nc = p.shape[0]
                x = _comps(p.data)
                g: Comps = (p.grad[0],)
                if wd:
                    g = arith.add(arith.mul(x, _const(wd, p, nc), nc), g, nc)
                if "exp_avg" not in st:
                    st["exp_avg"] = torch.zeros_like(p.data)
                    st["exp_avg_sq"] = torch.zeros_like(p.data)
                m = arith.add(arith.mul(_comps(st["exp_avg"]), _const(b1, p, nc), nc),
                              arith.mul(g, _const(1 - b1, p, nc), nc), nc)
                g2 = arith.mul(g, g, nc)
                v = arith.add(arith.mul(_comps(st["exp_avg_sq"]), _const(b2, p, nc), nc),
                              arith.mul(g2, _const(1 - b2, p, nc), nc), nc)
                st["exp_avg"] = torch.stack(arith.pad(m, nc))
                st["exp_avg_sq"] = torch.stack(arith.pad(v, nc))
                vh = arith.div(v, _const(bc2, p, nc), nc)
                ok = vh[0] > 0
                sq = functions.sqrt(vh, nc) if nc > 1 else (torch.sqrt(vh[0]),)
                sq = tuple(torch.where(ok, c, torch.zeros_like(c)) for c in sq)
                den = arith.add(sq, _const(eps, p, nc), nc)
                step = arith.div(m, den, nc)
                step = arith.mul(step, _const(lr / bc1, p, nc), nc)
                new = arith.sub(x, step, nc)
                p.data.copy_(torch.stack(arith.pad(new, nc)))
        return loss
