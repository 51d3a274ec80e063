"""The MCTensor paper's experiments on bundled scikit-learn data, with anynum.mc.

Run:  python examples/mc_paper_experiments.py [--quick] [--parts mlp,digits,...] [--epochs N]

Prints final losses / accuracies for plain float16/float32/float64 models and MC
float16 models (nc = 1, 2, 3).  The hyperbolic part (Poincare half-space model, float64
against MC float64) has three pieces: the error of the distance against mpmath as two
points move away from the origin; training float64 and MC nc=2 embeddings of a generated
tree (how far do the points drift, and does float64 degrade?); and a tree embedding
constructed in mpmath at growing edge lengths, stored in float64 / MC nc=2 / nc=3, with a
few training epochs from it.  --quick uses fewer epochs; --epochs overrides the epoch count
of every selected part (for hyperbolic: the training piece).
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
        wv = layer.weight.mc.to_tensor(torch.float64).detach()
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
# Poincare upper half-space model: points (x_1, ..., x_n) with x_n > 0 and
#   d(x, y) = arcosh(1 + |x - y|^2 / (2 x_n y_n)).
# A float represents x_1 to a relative precision u, i.e. to u |x_1| / x_n units of hyperbolic
# length: once |x_1| / x_n exceeds ~1/u (a point ~37 units from the origin (0, 1) in float64)
# two points closer than that can no longer be told apart (Yu & De Sa, NeurIPS 2019/2021).
# The three parts below measure that regime against mpmath, check whether training gets
# there, and show what happens to an embedding that lives there.
def _tree(branching: int, depth: int):
    """Complete tree: node count, parent->child edges, transitive closure (child, ancestor)."""
    edges, frontier, n = [], [0], 1
    for _ in range(depth):
        nxt = []
        for p in frontier:
            for _ in range(branching):
                edges.append((p, n))
                nxt.append(n)
                n += 1
        frontier = nxt
    parent = dict((c, p) for p, c in edges)
    closure = []
    for c in range(n):
        a = parent.get(c)
        while a is not None:
            closure.append((c, a))
            a = parent.get(a)
    return n, edges, closure


def _halfspace_dist(x, y):
    """arcosh(1 + |x-y|^2 / (2 x_n y_n)) entirely in the arithmetic of x and y (MC or plain)."""
    diff = x - y
    num = (diff * diff).sum(-1)
    den = x[..., -1] * y[..., -1] * 2.0
    z = num / den + 1.0
    if isinstance(z, mc.MCTensor):
        return mc.log(z + mc.sqrt(z * z - 1.0))
    return torch.log(z + torch.sqrt(z * z - 1.0))


def _dist(x, y, guard: bool = False):
    """The half-space distance with x - y (and the stored coordinates) in the points' own
    arithmetic, MC or float64, and the rest in float64.

    Representation and the difference x - y are where precision is lost far from the origin;
    once they are accurate, the rest of the formula is well conditioned in float64 for the
    distances that occur here (checked against `_halfspace_dist` in full MC below).  It keeps
    the MC runs fast, and float64 and MC runs use the same float64 formula after x - y.
    `guard` clamps the arcosh argument to >= 1 + 2^-40, the usual fix for the infinite
    derivative of arcosh at 1 (distinct points stored as the same float give NaN gradients).
    """
    diff, xn, yn = x - y, x[..., -1], y[..., -1]
    if isinstance(diff, mc.MCTensor):
        diff, xn, yn = diff.to_tensor(), xn.to_tensor(), yn.to_tensor()
    z = (diff * diff).sum(-1) / (xn * yn * 2.0) + 1.0
    if guard:
        z = z.clamp(min=1.0 + 2.0**-40)
    return torch.log(z + torch.sqrt(z * z - 1.0))


def _dist_matrix(X, n: int) -> torch.Tensor:
    idx = torch.arange(n)
    with torch.no_grad():
        return torch.stack([_dist(X[torch.full((n,), i)], X[idx]) for i in range(n)])


def _mean_ap(D: torch.Tensor, pos: torch.Tensor) -> float:
    """Mean average precision of ranking every other node by distance (closure pairs = hits)."""
    n = D.shape[0]
    D = torch.nan_to_num(D.clone(), nan=math.inf)
    D.fill_diagonal_(math.inf)
    order = torch.argsort(D, dim=1, stable=True)[:, :-1]
    hits = torch.gather(pos, 1, order).double()
    prec = hits.cumsum(1) / torch.arange(1, n, dtype=torch.float64)
    return float(((prec * hits).sum(1) / hits.sum(1).clamp(min=1)).mean())


def _beyond_float64(h: torch.Tensor, xn: torch.Tensor) -> float:
    """Fraction of points whose horizontal float64 resolution u|x_1|/x_n exceeds 1 unit."""
    return float((h.abs().amax(-1) / xn > 2.0**53).double().mean())


def _mp_expansion(v, nc: int) -> list[float]:
    """Greedy nc-term float64 expansion of an mpmath number (nc=1: round to nearest)."""
    import mpmath

    out = []
    for _ in range(nc):
        out.append(float(v))
        v = v - mpmath.mpf(out[-1])
    return out


def _points(coords, nc: int):
    """mpmath points -> float64 tensor (nc=1) or MC float64 nc-component MCTensor."""
    comps = [[[_mp_expansion(c, nc)[k] for c in p] for p in coords] for k in range(nc)]
    ts = tuple(torch.tensor(c, dtype=torch.float64) for c in comps)
    return ts[0] if nc == 1 else mc.MCTensor(ts)


def hyperbolic_precision() -> None:
    """Distance error against mpmath for two points 0.96 apart, moved away from the origin."""
    import mpmath

    mpmath.mp.prec = 600
    c = mpmath.mpf(1) / 3
    print("half-space distance precision vs mpmath: points (1/3, e^-D), (1/3 + e^-D, e^-D), "
          "true distance arcosh(3/2) = 0.9624; relative error of the computed distance")
    print(f"  {'D':>4s} {'d(origin)':>9s} {'float64':>9s} {'MC nc=2':>9s} {'MC nc=3':>9s}")
    for D in (5, 10, 20, 30, 35, 40, 50, 60, 70, 80, 100, 120):
        h = mpmath.exp(-D)
        p, q = (c, h), (c + h, h)
        true = mpmath.acosh(1 + ((p[0] - q[0]) ** 2 + (p[1] - q[1]) ** 2) / (2 * p[1] * q[1]))
        errs = []
        for nc in (1, 2, 3):
            X = _points([p, q], nc)
            d = _halfspace_dist(X[0], X[1])  # the paper's formula, entirely in that arithmetic
            parts = d.components() if isinstance(d, mc.MCTensor) else (d,)
            got = sum((mpmath.mpf(float(t)) for t in parts), mpmath.mpf(0))
            errs.append(float(abs(got - true) / true))
        dist0 = float(mpmath.acosh(1 + (c**2 + (h - 1) ** 2) / (2 * h)))
        print(f"  {D:4d} {dist0:9.1f} " + " ".join(f"{e:9.1e}" for e in errs))


def _train(n, closure, init, nc: int, epochs: int, lr: float, nneg: int, log_every: int,
           guard: bool = False):
    """Full-batch Riemannian SGD on the softmax-over-negatives loss (Nickel & Kiela 2017).

    nc=1: float64 coordinates; nc>=2: MC float64 coordinates (kept and updated in MC).
    The loss is summed over closure pairs and each point's Riemannian step (its Euclidean
    gradient scaled by x_n^2) is clipped to one unit of hyperbolic length, then applied with
    the retraction x_i -= x_n v_i, x_n *= exp(-v_n) (first-order exact; keeps x_n > 0).
    Returns (coordinates, the 1-based epoch whose loss or gradient was not finite, or None).
    """
    rel = torch.tensor(closure)
    u = rel[:, 0]
    if nc == 1:
        X = init.clone() if isinstance(init, torch.Tensor) else init
    else:
        X = init if isinstance(init, mc.MCTensor) else mc.MCTensor(init, nc)
    gen = torch.Generator().manual_seed(1)
    target = torch.zeros(len(rel), dtype=torch.long)
    for ep in range(epochs):
        negs = torch.randint(0, n, (len(rel), nneg), generator=gen)
        negs = torch.where(negs == u[:, None], (negs + 1) % n, negs)  # d(u, u) = 0: arcosh' = inf
        cand = torch.cat([rel[:, 1:], negs], 1)
        leaf = X.detach().requires_grad_(True)
        d = _dist(leaf[u].unsqueeze(1), leaf[cand], guard)
        loss = torch.nn.functional.cross_entropy(-d, target, reduction="sum")
        loss.backward()
        grad = leaf.grad  # an MCTensor's .grad is the gradient with respect to its value
        if not (torch.isfinite(loss) and torch.isfinite(grad).all()):
            return X, ep + 1
        with torch.no_grad():
            xn = X[:, -1] if nc == 1 else X[:, -1].to_tensor()
            v = lr * xn[:, None] * grad
            v = v * (1.0 / v.norm(dim=-1, keepdim=True)).clamp(max=1.0).nan_to_num(1.0)
            step_h, scale_n = xn[:, None] * v[:, :-1], torch.exp(-v[:, -1:])
            X = torch.cat([X[:, :-1] - step_h, X[:, -1:] * scale_n], -1)
        if log_every and (ep + 1) % log_every == 0:
            h, xn = (X[:, :-1], X[:, -1]) if nc == 1 else (X[:, :-1].to_tensor(), X[:, -1].to_tensor())
            print(f"    epoch {ep + 1:5d}  loss/pair {float(loss.detach()) / len(rel):.4f}  "
                  f"max d(origin) {float(_origin_dist(X).max()):6.1f}  "
                  f"beyond float64 resolution {_beyond_float64(h, xn) * 100:5.1f} %", flush=True)
    return X, None


def _origin_dist(X) -> torch.Tensor:
    X = X.to_tensor() if isinstance(X, mc.MCTensor) else X
    with torch.no_grad():
        return torch.acosh(1 + ((X[:, :-1] ** 2).sum(-1) + (X[:, -1] - 1) ** 2) / (2 * X[:, -1]))


def hyperbolic_training(epochs: int, branching: int = 2, depth: int = 8, lr: float = 1.0,
                        nneg: int = 10) -> None:
    """Train float64 and MC nc=2 embeddings from the same small initialisation (2 dimensions)."""
    n, _, closure = _tree(branching, depth)
    rel = torch.tensor(closure)
    pos = torch.zeros(n, n, dtype=torch.bool)
    pos[rel[:, 0], rel[:, 1]] = pos[rel[:, 1], rel[:, 0]] = True
    print(f"half-space embedding (2-d) of a {branching}-ary tree of depth {depth}: {n} nodes, "
          f"{len(closure)} closure pairs, {nneg} negatives, full-batch RSGD lr {lr}, {epochs} epochs")
    g = torch.Generator().manual_seed(0)
    init = torch.rand(n, 2, dtype=torch.float64, generator=g) * 1e-3
    init[:, -1] += 1.0
    for nc in (1, 2):
        tag = "float64" if nc == 1 else f"MC float64 nc={nc}"
        print(f"  {tag}:")
        X, nan_ep = _train(n, closure, init, nc, epochs, lr, nneg, max(1, epochs // 4))
        D = _dist_matrix(X, n)
        h, xn = (X[:, :-1], X[:, -1]) if nc == 1 else (X[:, :-1].to_tensor(), X[:, -1].to_tensor())
        x1 = torch.sort(h[:, 0]).values
        gap = float(((x1[1:] - x1[:-1]) / torch.maximum(x1[1:].abs(), x1[:-1].abs())).min())
        print(f"    MAP {_mean_ap(D, pos) * 100:.2f} %, "
              f"{'NaN at epoch ' + str(nan_ep) if nan_ep is not None else 'no NaN'}, "
              f"{_beyond_float64(h, xn) * 100:.1f} % of the points beyond float64 resolution; "
              f"closest horizontal neighbours {gap:.1e} apart relative to |x_1| (float64 "
              f"resolves 1.1e-16)")
        if nc > 1:  # would float64 storage have damaged this embedding?
            D64 = _dist_matrix(X.to_tensor(), n)
            off = ~torch.eye(n, dtype=torch.bool)
            err = ((D64 - D).abs() / D)[off]
            rows = torch.arange(0, n, 32)
            full = torch.stack([_halfspace_dist(X[torch.full((n,), int(i))], X).to_tensor() for i in rows])
            ferr = ((full - D[rows]).abs() / D[rows])[off[rows]]
            print(f"    the same points rounded to float64: MAP {_mean_ap(D64, pos) * 100:.2f} %, "
                  f"max relative change of a distance {float(err.max()):.1e}; "
                  f"full-MC distance formula vs _dist: max relative difference {float(ferr.max()):.1e}")


def hyperbolic_construction(taus=(2, 4, 6, 8, 12, 16), branching: int = 2, depth: int = 8,
                            finetune: int = 30) -> None:
    """A tree embedding built in mpmath, stored in float64 / MC nc=2 / nc=3 (Sala et al. 2018).

    Node (c, h) has children (c + (j - (b-1)/2) h, h e^-tau): edges ~tau long, siblings ~2 tau
    apart, the deepest nodes ~depth*tau from the origin.  MAP from exact (mpmath) distances and
    from distances computed on the stored points; then `finetune` epochs of training from there.
    """
    import mpmath

    mpmath.mp.prec = 400
    n, edges, closure = _tree(branching, depth)
    rel = torch.tensor(closure)
    pos = torch.zeros(n, n, dtype=torch.bool)
    pos[rel[:, 0], rel[:, 1]] = pos[rel[:, 1], rel[:, 0]] = True
    off = ~torch.eye(n, dtype=torch.bool)
    print(f"constructed half-space embedding of the same tree ({n} nodes), edge length tau: MAP, "
          "max relative distance error vs mpmath, pairs of distinct nodes at distance 0")
    print(f"  {'tau':>3s} {'deepest':>7s} {'exact':>7s} | {'float64':^27s} | {'MC nc=2':^27s} | "
          f"{'MC nc=3':^27s}")
    stored = {}
    for tau in taus:
        pts = [(mpmath.mpf(0), mpmath.mpf(1))]
        count: dict[int, int] = {}
        for p, _ in edges:
            j = count[p] = count.get(p, -1) + 1
            x, h = pts[p]
            pts.append((x + (j - mpmath.mpf(branching - 1) / 2) * h, h * mpmath.exp(-tau)))
        exact = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            xi, hi = pts[i]
            for j in range(i + 1, n):
                xj, hj = pts[j]
                exact[i, j] = exact[j, i] = float(
                    mpmath.acosh(1 + ((xi - xj) ** 2 + (hi - hj) ** 2) / (2 * hi * hj)))
        cols = []
        for nc in (1, 2, 3):
            X = _points(pts, nc)
            stored[tau, nc] = X
            D = _dist_matrix(X, n)
            err = float(((D - exact).abs() / exact)[off].max())
            zeros = int((D[off] == 0).sum()) // 2
            cols.append(f"{_mean_ap(D, pos) * 100:6.2f} % {err:8.1e} {zeros:5d}")
        print(f"  {tau:3d} {float(_origin_dist(stored[tau, 1]).max()):7.1f} "
              f"{_mean_ap(exact, pos) * 100:5.2f} % | " + " | ".join(cols), flush=True)
    if finetune:
        tau = next((t for t in taus if t >= 8), taus[-1])
        print(f"  {finetune} training epochs starting from the tau={tau} embedding (lr 0.1):")
        for nc, guard in ((1, False), (1, True), (2, False)):
            X, nan_ep = _train(n, closure, stored[tau, nc], nc, finetune, 0.1, 10, 0, guard)
            tag = "float64" + (" + guard" if guard else "") if nc == 1 else f"MC float64 nc={nc}"
            state = f"NaN at epoch {nan_ep}" if nan_ep is not None else "no NaN"
            print(f"    {tag:18s} {state}, MAP {_mean_ap(_dist_matrix(X, n), pos) * 100:.2f} %")


def hyperbolic(epochs: int) -> None:
    hyperbolic_precision()
    hyperbolic_training(epochs)
    hyperbolic_construction()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="linreg,logistic,mlp,digits,hyperbolic",
                    help="comma-separated subset of linreg,logistic,mlp,digits,hyperbolic")
    ap.add_argument("--engine", default="auto", choices=["auto", "int8", "float", "native", "wide"],
                    help="MC matmul engine (auto: the one anynum.mc.engine picks for this machine)")
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
        hyperbolic(ep(500, 2000))


if __name__ == "__main__":
    main()
