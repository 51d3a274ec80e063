"""The MCTensor paper's experiments on bundled scikit-learn data, with anynum.mc.

Run:  python examples/mc_paper_experiments.py [--quick] [--parts mlp,digits,...] [--epochs N]

Prints final losses / accuracies for plain float16/float32/float64 models and MC
float16 models (nc = 1, 2, 3), plus a Poincare half-space embedding of a generated tree
with float64 vs MC float64 (nc = 2, 3).  --quick uses fewer epochs; --epochs overrides the
epoch count of every selected part.
"""

from __future__ import annotations

import argparse
import math

import torch
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from anynum import mc

F16 = torch.float16


def _split(X, y, seed=0):
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=seed)
    sc = StandardScaler().fit(Xtr)
    return (torch.tensor(sc.transform(Xtr)), torch.tensor(sc.transform(Xte)),
            torch.tensor(ytr), torch.tensor(yte))


# ------------------------------------------------------------------ linear regression
def linear_regression(epochs: int) -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(10000, 2, dtype=torch.float64, generator=g) * 0.5 - 0.5
    w_true = torch.randn(1, 2, dtype=torch.float64, generator=g) * 0.5 - 0.5
    y = X @ w_true.T
    w0 = torch.randn(1, 2, dtype=torch.float64, generator=g) * 0.1
    print("linear regression (Table 6), final MSE:")
    for dt in (torch.float16, torch.float32, torch.float64):
        w = torch.nn.Parameter(w0.to(dt))
        opt = torch.optim.SGD([w], lr=0.05)
        Xd, yd = X.to(dt), y.to(dt)
        for _ in range(epochs):
            opt.zero_grad()
            loss = ((Xd @ w.T - yd) ** 2).mean()
            loss.backward()
            opt.step()
        print(f"  torch {dt!s:15s} {float(((X @ w.detach().double().T - y) ** 2).mean()):.3e}")
    for nc in (1, 2, 3):
        layer = mc.nn.MCLinear(2, 1, bias=False, nc=nc, dtype=F16)
        with torch.no_grad():
            layer.weight.copy_(torch.stack(mc.MCTensor(w0.to(F16), nc).components()))
        opt = mc.optim.MCSGD(layer.parameters(), lr=0.05)
        Xd = X.to(F16)
        for _ in range(epochs):
            opt.zero_grad()
            out = layer(Xd)
            loss = ((out - y).to_tensor(torch.float32) ** 2).mean()
            loss.backward()
            opt.step()
        wv = layer.weight.mc.to_tensor(torch.float64)
        print(f"  MC float16 nc={nc}          {float(((X @ wv.T - y) ** 2).mean()):.3e}")


# ------------------------------------------------------------------ logistic regression
def logistic(name: str, X, y, lr: float, momentum: float, epochs: int) -> None:
    Xtr, Xte, ytr, yte = _split(X, y)
    ytr_f, yte_f = ytr.double(), yte.double()
    print(f"logistic regression on {name}: final train BCE / test accuracy")
    torch.manual_seed(0)
    init = torch.nn.Linear(Xtr.shape[1], 1).double()

    def report(tag, logits_tr, logits_te):
        p = torch.sigmoid(logits_tr.double()).clamp(1e-12, 1 - 1e-12)
        bce = float(-(ytr_f * p.log() + (1 - ytr_f) * (1 - p).log()).mean())
        acc = float(((logits_te.double() > 0).double() == yte_f).double().mean()) * 100
        print(f"  {tag:22s} loss {bce:.4f}  acc {acc:.2f}%")

    for dt in (torch.float16, torch.float32, torch.float64):
        lin = torch.nn.Linear(Xtr.shape[1], 1).to(dt)
        lin.load_state_dict({k: v.to(dt) for k, v in init.state_dict().items()})
        opt = torch.optim.SGD(lin.parameters(), lr=lr, momentum=momentum)
        Xd, yd = Xtr.to(dt), ytr_f.to(dt).unsqueeze(1)
        for _ in range(epochs):
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(lin(Xd).float(), yd.float())
            loss.backward()
            opt.step()
        with torch.no_grad():
            report(f"torch {dt}", lin(Xtr.to(dt)).squeeze(1), lin(Xte.to(dt)).squeeze(1))
    for nc in (1, 2, 3):
        lin = mc.nn.MCLinear(Xtr.shape[1], 1, nc=nc, dtype=F16)
        with torch.no_grad():
            lin.weight.copy_(torch.stack(mc.MCTensor(init.weight.detach().to(F16), nc).components()))
            lin.bias.copy_(torch.stack(mc.MCTensor(init.bias.detach().to(F16), nc).components()))
        opt = mc.optim.MCSGD(lin.parameters(), lr=lr, momentum=momentum)
        Xd, yd = Xtr.to(F16), ytr_f.float().unsqueeze(1)
        for _ in range(epochs):
            opt.zero_grad()
            logits = lin(Xd).to_tensor(torch.float32)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, yd)
            loss.backward()
            opt.step()
        with torch.no_grad():
            report(f"MC float16 nc={nc}", lin(Xtr.to(F16)).to_tensor(torch.float64).squeeze(1),
                   lin(Xte.to(F16)).to_tensor(torch.float64).squeeze(1))


# ------------------------------------------------------------------ MLP
def mlp(name: str, X, y, hidden: int, lr: float, momentum: float, epochs: int, batch: int | None):
    Xtr, Xte, ytr, yte = _split(X, y)
    ncls = int(y.max()) + 1
    print(f"MLP on {name}: final train NLL / test accuracy")
    torch.manual_seed(0)
    ref = [torch.nn.Linear(Xtr.shape[1], hidden), torch.nn.Linear(hidden, hidden),
           torch.nn.Linear(hidden, ncls)]

    def batches(n):
        if batch is None:
            yield torch.arange(n)
            return
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
        for i in range(0, n, batch):
            yield perm[i : i + batch]

    def run(layers, params, opt, to_in, fwd_out):
        for _ in range(epochs):
            for idx in batches(len(Xtr)):
                opt.zero_grad()
                h = to_in(Xtr[idx])
                for i, layer in enumerate(layers):
                    h = fwd_out(layer(h))
                    if i < len(layers) - 1:
                        h = torch.relu(h)
                loss = torch.nn.functional.cross_entropy(h.float(), ytr[idx])
                loss.backward()
                opt.step()
        with torch.no_grad():
            def predict(Xs):
                h = to_in(Xs)
                for i, layer in enumerate(layers):
                    h = fwd_out(layer(h))
                    if i < len(layers) - 1:
                        h = torch.relu(h)
                return h.float()
            nll = float(torch.nn.functional.cross_entropy(predict(Xtr), ytr))
            acc = float((predict(Xte).argmax(1) == yte).double().mean()) * 100
        return nll, acc

    for dt in (torch.float16, torch.float32, torch.float64):
        layers = [torch.nn.Linear(r.in_features, r.out_features).to(dt) for r in ref]
        for lay, r in zip(layers, ref):
            lay.load_state_dict({k: v.to(dt) for k, v in r.state_dict().items()})
        params = [p for lay in layers for p in lay.parameters()]
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
        nll, acc = run(layers, params, opt, lambda v, dt=dt: v.to(dt), lambda h: h)
        print(f"  torch {dt!s:16s} loss {nll:.4f}  acc {acc:.2f}%")
    for nc in (1, 2, 3):
        layers = [mc.nn.MCLinear(r.in_features, r.out_features, nc=nc, dtype=F16) for r in ref]
        with torch.no_grad():
            for lay, r in zip(layers, ref):
                lay.weight.copy_(torch.stack(mc.MCTensor(r.weight.detach().to(F16), nc).components()))
                lay.bias.copy_(torch.stack(mc.MCTensor(r.bias.detach().to(F16), nc).components()))
        params = [p for lay in layers for p in lay.parameters()]
        opt = mc.optim.MCSGD(params, lr=lr, momentum=momentum)
        nll, acc = run(layers, params, opt, lambda v: v.to(F16), lambda h: h.to_tensor())
        print(f"  MC float16 nc={nc}       loss {nll:.4f}  acc {acc:.2f}%")


# ------------------------------------------------------------------ hyperbolic embedding
def _tree(branching: int, depth: int):
    edges, nodes, frontier = [], [0], [0]
    for _ in range(depth):
        nxt = []
        for p in frontier:
            for _ in range(branching):
                c = len(nodes)
                nodes.append(c)
                edges.append((p, c))
                nxt.append(c)
        frontier = nxt
    parent = dict((c, p) for p, c in edges)
    closure = []
    for c in nodes:
        a = parent.get(c)
        while a is not None:
            closure.append((c, a))
            a = parent.get(a)
    return len(nodes), closure


def _halfspace_dist(x, y):
    """arcosh(1 + |x-y|^2 / (2 x_n y_n)) for MC or plain tensors (last coord is x_n)."""
    diff = x - y
    num = (diff * diff).sum(-1)
    den = x[..., -1] * y[..., -1] * 2.0
    z = num / den + 1.0
    if isinstance(z, mc.MCTensor):
        return mc.log(z + mc.sqrt(z * z - 1.0))
    return torch.log(z + torch.sqrt(z * z - 1.0))


def hyperbolic(epochs: int, dim: int = 2) -> None:
    n, rel = _tree(3, 5)
    rel_t = torch.tensor(rel)
    pos = {}
    for c, a in rel:
        pos.setdefault(c, set()).add(a)
        pos.setdefault(a, set()).add(c)
    print(f"Poincare half-space embedding of a 3-ary tree, {n} nodes, {len(rel)} closure pairs")
    g = torch.Generator().manual_seed(0)
    init = torch.rand(n, dim, dtype=torch.float64, generator=g) * 1e-3
    init[:, -1] = 1.0 + init[:, -1]
    nneg = 20

    def train(use_mc: bool, nc: int = 2):
        if use_mc:
            emb = mc.nn.MCEmbedding(n, dim, nc=nc, dtype=torch.float64, init=init.clone())
            opt: torch.optim.Optimizer = mc.optim.MCSGD(emb.parameters(), lr=0.3)
        else:
            w = torch.nn.Parameter(init.clone())
            opt = torch.optim.SGD([w], lr=0.3)
        gen = torch.Generator().manual_seed(1)
        nan_epoch = None
        for ep in range(epochs):
            opt.zero_grad()
            u = rel_t[:, 0]
            negs = torch.randint(0, n, (len(rel), nneg), generator=gen)
            # a node is never its own negative: d(u, u) = 0 is where arcosh' is infinite (NaN grads)
            negs = torch.where(negs == u[:, None], (negs + 1) % n, negs)
            cand = torch.cat([rel_t[:, 1:], negs], 1)
            if use_mc:
                eu = emb(u).unsqueeze(1)
                ec = emb(cand)
                d = _halfspace_dist(eu, ec).to_tensor()
            else:
                d = _halfspace_dist(w[u].unsqueeze(1), w[cand])
            loss = torch.nn.functional.cross_entropy(-d, torch.zeros(len(rel), dtype=torch.long))
            if not torch.isfinite(loss):
                nan_epoch = ep
                break
            loss.backward()
            with torch.no_grad():  # Riemannian SGD: the half-space metric scales gradients by x_n^2
                if use_mc:
                    xn = emb.weight.data[0, :, -1]
                    emb.weight.grad.mul_((xn * xn)[:, None])
                else:
                    w.grad.mul_((w.data[:, -1] ** 2)[:, None])
            opt.step()
            with torch.no_grad():  # keep points in the upper half space
                if use_mc:
                    p = emb.weight.data
                    p[0, :, -1].clamp_(min=1e-300)
                else:
                    w.data[:, -1].clamp_(min=1e-300)
        with torch.no_grad():
            if use_mc:
                full = emb.weight.mc
                dist = torch.stack([_halfspace_dist(full[i].unsqueeze(0), full).to_tensor()
                                    for i in range(n)])
            else:
                dist = torch.stack([_halfspace_dist(w[i].unsqueeze(0), w) for i in range(n)])
        aps = []
        for i, ps in pos.items():
            if not torch.isfinite(dist[i]).all():
                aps.append(float("nan"))
                continue
            order = torch.argsort(dist[i])
            order = order[order != i]
            hits, precs = 0, []
            for rank, j in enumerate(order.tolist(), 1):
                if j in ps:
                    hits += 1
                    precs.append(hits / rank)
            aps.append(sum(precs) / len(ps))
        mean_ap = sum(aps) / len(aps)
        return mean_ap, nan_epoch

    for tag, use_mc, nc in (("float64", False, 1), ("MC float64 nc=2", True, 2),
                            ("MC float64 nc=3", True, 3)):
        mean_ap, nan_ep = train(use_mc, nc)
        nan_txt = f"NaN at epoch {nan_ep}" if nan_ep is not None else "no NaN"
        print(f"  {tag:18s} MAP {mean_ap * 100 if not math.isnan(mean_ap) else float('nan'):.2f}%  "
              f"({nan_txt})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="linreg,logistic,mlp,digits,hyperbolic",
                    help="comma-separated subset of linreg,logistic,mlp,digits,hyperbolic")
    ap.add_argument("--engine", default="int8", choices=["int8", "native", "wide"],
                    help="MC matmul engine (int8: exact int8 GEMMs, the default and fastest on CPU)")
    ap.add_argument("--epochs", type=int, default=None,
                    help="override the number of epochs of every selected part")
    args = ap.parse_args()
    mc.set_matmul_engine(args.engine)
    q = args.quick

    def ep(quick: int, full: int) -> int:
        return args.epochs if args.epochs is not None else (quick if q else full)

    parts = set(args.parts.split(","))
    if "linreg" in parts:
        linear_regression(ep(300, 2000))
    if "logistic" in parts:
        Xs, ys = make_classification(1000, 2, n_informative=1, n_redundant=0, n_clusters_per_class=1,
                                     random_state=0)
        logistic("make_classification", Xs, ys, 3e-3, 0.0, ep(500, 4000))
        bc = load_breast_cancer()
        logistic("breast cancer", bc.data, bc.target, 1e-4, 0.9, ep(500, 3000))
    if "mlp" in parts:
        bc = load_breast_cancer()
        mlp("breast cancer", bc.data, bc.target, 150, 6e-3, 0.0, ep(200, 1000), None)
    if "digits" in parts:
        dg = load_digits()
        mlp("digits", dg.data, dg.target, 50, 2e-3, 0.8, ep(10, 100), 128)
    if "hyperbolic" in parts:
        hyperbolic(ep(50, 300))


if __name__ == "__main__":
    main()
