#!/usr/bin/env python3
"""Write tests/data/stock_gat/reference.safetensors: the stock_gat model's
forward, loss and gradients computed with PyTorch in float64, and its
evaluation metrics computed with NumPy, for plugins/models/stock_gat/test_stock_gat.c.

Everything is re-typed here from the formulas' sources, not from the C code:
  - LSTM: torch.nn.LSTM(batch_first=True) itself, the last step's output;
  - GATConv: PyTorch Geometric's GATConv (torch_geometric/nn/conv/gat_conv.py,
    Velickovic et al. 2018) with add_self_loops=False (the graph is used as
    the loader builds it, self loops included), concat=True, bias, LeakyReLU
    0.2, softmax over the edges into each node, written out with index_add_
    (torch_geometric is not needed);
  - RevIN: ts-kim/RevIN RevIN.py (Kim et al., ICLR 2022): statistics over the
    window, detached; norm (x - mean) / sqrt(var + eps) * w + b; denorm
    (y - b_c) / (w_c + eps^2) * stdev_c + mean_c on one input channel c;
  - the rank loss: mean over days of 1 - sum(pc * rn) / sqrt(sum(pc^2) + 1e-8),
    pc = pred - the day's mean, rn = the day's average ranks of y, centered,
    scaled to unit norm (0 for a constant day);
  - the metrics (NumPy): average ranks by counting (rank = #less + (#equal + 1) / 2),
    Spearman = np.corrcoef of the ranks (0 when a side is constant or a day has
    one stock), long/short = mean(expm1(ret)) of the top L minus the bottom L
    by np.argsort(kind="stable") (ties: lower stock index lower), L = min(long_short,
    n // 2), 0 for a constant score; ic mean, std (ddof 1), t = mean / std * sqrt(days),
    sharpe = mean / std (ddof 1) * sqrt(252) of the daily long/short returns.

Model batch: 2 days x 4 stocks (node d*4 + s), window W=5, F=3 features with
per-feature levels (so RevIN matters), per day 2 in-edges per node by target
then one self loop per node (hdf5_panel's layout); y has a tie.
Cases (metadata "<case>.ini" is the model section the test builds):
  full   : revin (channel 1), 2 LSTM layers, graph with 2 GAT layers, MLP head, rank loss 0.7
  graph  : 1 LSTM layer, graph with 1 GAT layer, linear head, rank loss 0.3
  plain  : 1 LSTM layer, no graph, linear head, mse only
Per case: "<case>/param/<name>" (the plugin's parameter names), "<case>/pred" [n],
"<case>/loss" [1], "<case>/mse" [1], "<case>/grad/<name>".

Metric batch "metrics/*": 7 days (6 of 10 stocks, one of 4), long_short 3,
2 factors; day 1 has tied predictions, day 2 tied returns, day 3 a constant
prediction (IC 0, no position), day 4 ties across the long/short cut, day 5
constant returns (IC 0), day 6 four stocks (L = 2); factor 1 is constant on
day 2. "metrics/expected" f64 [3, 5]: rows pred, factor 0, factor 1; columns
ic, ic_std, ic_t, sharpe, days. "metrics/daily_ic", "metrics/daily_ls" [3, 7].

Usage: python3 tools/gen_stock_gat_reference.py  (from any directory)
"""
import os

import numpy as np
import torch
import torch.nn.functional as Fn
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "stock_gat",
                   "reference.safetensors")
D, S, W, F, H, HEADS, C = 2, 4, 5, 3, 4, 2, 3
N = D * S
RANK_EPS = 1e-8
REVIN_EPS = 1e-5

CASES = {
    "full": dict(encoder_layers=2, graph=True, gat_layers=2, head_hidden=3, revin=True,
                 revin_channel=1, rank_loss_weight=0.7),
    "graph": dict(encoder_layers=1, graph=True, gat_layers=1, head_hidden=0, revin=False,
                  revin_channel=0, rank_loss_weight=0.3),
    "plain": dict(encoder_layers=1, graph=False, gat_layers=1, head_hidden=0, revin=False,
                  revin_channel=0, rank_loss_weight=0.0),
}


def ini(c):
    b = lambda v: "true" if v else "false"
    return ("hidden = %d\nencoder_layers = %d\ngraph = %s\ngat_layers = %d\nheads = %d\n"
            "gat_hidden = %d\nhead_hidden = %d\nrevin = %s\nrevin_channel = %d\n"
            "rank_loss_weight = %g\ndropout = 0\nattn_dropout = 0\n" %
            (H, c["encoder_layers"], b(c["graph"]), c["gat_layers"], HEADS, C, c["head_hidden"],
             b(c["revin"]), c["revin_channel"], c["rank_loss_weight"]))


def edges():
    # in-edges (sources) of each stock within a day, then self loops
    day_in = [[[1, 2], [3, 0], [0, 3], [2, 1]], [[2, 3], [0, 2], [1, 3], [0, 1]]]
    src, dst = [], []
    for d in range(D):
        for i in range(S):
            for j in day_in[d][i]:
                src.append(d * S + j)
                dst.append(d * S + i)
        for i in range(S):
            src.append(d * S + i)
            dst.append(d * S + i)
    return np.array(src, np.int64), np.array(dst, np.int64)


def avg_rank(v):
    v = np.asarray(v, np.float64)
    less = (v[None, :] < v[:, None]).sum(1)
    eq = (v[None, :] == v[:, None]).sum(1)
    return less + (eq + 1) / 2.0


def params_of(c, g):
    """Parameters in the plugin's names and shapes, uniform(-0.5, 0.5) (RevIN weight 1 +- 0.3)."""
    u = lambda *shape: (torch.rand(*shape, generator=g, dtype=torch.float64) - 0.5)
    p = {}
    if c["revin"]:
        p["revin.affine_weight"] = 1 + 0.6 * u(F)
        p["revin.affine_bias"] = u(F)
    for l in range(c["encoder_layers"]):
        inp = F if l == 0 else H
        p["encoder.weight_ih_l%d" % l] = u(4 * H, inp)
        p["encoder.weight_hh_l%d" % l] = u(4 * H, H)
        p["encoder.bias_ih_l%d" % l] = u(4 * H)
        p["encoder.bias_hh_l%d" % l] = u(4 * H)
    if c["graph"]:
        inp = H
        for l in range(c["gat_layers"]):
            p["gat.layers.%d.lin.weight" % l] = u(HEADS * C, inp)
            p["gat.layers.%d.att_src" % l] = u(HEADS, C)
            p["gat.layers.%d.att_dst" % l] = u(HEADS, C)
            p["gat.layers.%d.bias" % l] = u(HEADS * C)
            inp = HEADS * C
        p["gat_proj.weight"] = u(H, HEADS * C)
        p["gat_proj.bias"] = u(H)
    if c["head_hidden"]:
        p["head.0.weight"] = u(c["head_hidden"], H)
        p["head.0.bias"] = u(c["head_hidden"])
        p["head.1.weight"] = u(1, c["head_hidden"])
        p["head.1.bias"] = u(1)
    else:
        p["head.0.weight"] = u(1, H)
        p["head.0.bias"] = u(1)
    for t in p.values():
        t.requires_grad_(True)
    return p


def gat_conv(x, p, l, src, dst):
    """PyG GATConv(in, C, heads, concat=True, add_self_loops=False), eval mode."""
    n = x.shape[0]
    z = (x @ p["gat.layers.%d.lin.weight" % l].T).view(n, HEADS, C)
    a_src = (z * p["gat.layers.%d.att_src" % l]).sum(-1)
    a_dst = (z * p["gat.layers.%d.att_dst" % l]).sum(-1)
    e = Fn.leaky_relu(a_src[src] + a_dst[dst], 0.2)  # [E, heads]
    ex = torch.exp(e - e.max(0).values)  # softmax per target node is shift-invariant
    den = torch.zeros(n, HEADS, dtype=e.dtype).index_add(0, dst, ex)
    alpha = ex / (den[dst] + 1e-16)  # torch_geometric.utils.softmax
    out = torch.zeros(n, HEADS, C, dtype=e.dtype).index_add(0, dst, z[src] * alpha[..., None])
    return out.reshape(n, HEADS * C) + p["gat.layers.%d.bias" % l]


def lstm_last(x, p, layers):
    """torch.nn.LSTM equations (gate order i, f, g, o), written out so the
    gradient reaches the parameter tensors; checked against nn.LSTM itself."""
    seq = x
    for l in range(layers):
        w_ih, w_hh = p["encoder.weight_ih_l%d" % l], p["encoder.weight_hh_l%d" % l]
        b = p["encoder.bias_ih_l%d" % l] + p["encoder.bias_hh_l%d" % l]
        hs = []
        h = torch.zeros(x.shape[0], H, dtype=x.dtype)
        cell = torch.zeros_like(h)
        for t in range(seq.shape[1]):
            i, f, g, o = (seq[:, t] @ w_ih.T + h @ w_hh.T + b).chunk(4, dim=1)
            cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(cell)
            hs.append(h)
        seq = torch.stack(hs, 1)
    ref = torch.nn.LSTM(x.shape[2], H, layers, batch_first=True).double()
    with torch.no_grad():
        for name, t in ref.named_parameters():
            t.copy_(p["encoder." + name])
        assert torch.allclose(ref(x.detach())[0], seq.detach(), atol=1e-12)
    return seq[:, -1]


def forward(c, p, x, src, dst):
    xn = x
    if c["revin"]:
        mean = x.mean(1, keepdim=True).detach()
        stdev = torch.sqrt(torch.var(x, dim=1, keepdim=True, unbiased=False) + REVIN_EPS).detach()
        xn = (x - mean) / stdev * p["revin.affine_weight"] + p["revin.affine_bias"]
    h = lstm_last(xn, p, c["encoder_layers"])  # [n, H]
    if c["graph"]:
        g = h
        for l in range(c["gat_layers"]):
            g = Fn.elu(gat_conv(g, p, l, src, dst))
        h = h + g @ p["gat_proj.weight"].T + p["gat_proj.bias"]
    if c["head_hidden"]:
        h = Fn.elu(h @ p["head.0.weight"].T + p["head.0.bias"])
        pred = (h @ p["head.1.weight"].T + p["head.1.bias"]).reshape(-1)
    else:
        pred = (h @ p["head.0.weight"].T + p["head.0.bias"]).reshape(-1)
    if c["revin"]:
        ch = c["revin_channel"]
        pred = (pred - p["revin.affine_bias"][ch]) / (p["revin.affine_weight"][ch] + REVIN_EPS ** 2)
        pred = pred * stdev[:, 0, ch] + mean[:, 0, ch]
    return pred


def rank_loss(pred, y, day):
    terms = []
    for d in range(int(day.max()) + 1):
        sel = np.nonzero(day == d)[0]
        r = avg_rank(y[sel])
        rc = r - r.mean()
        norm = np.sqrt((rc ** 2).sum())
        rn = torch.tensor(rc / norm if norm > 0 else np.zeros_like(rc))
        pc = pred[sel] - pred[sel].mean()
        terms.append(1 - (pc * rn).sum() / torch.sqrt((pc ** 2).sum() + RANK_EPS))
    return torch.stack(terms).mean()


def model_cases(out, meta):
    g = torch.Generator().manual_seed(20)
    levels = torch.tensor([0.5, -2.0, 4.0], dtype=torch.float64)
    x = (torch.randn(N, W, F, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.3, 2.0])
         + levels).float().double()
    y = torch.randn(N, generator=g, dtype=torch.float64).float().double()
    y[2] = y[1]  # a tie in day 0: average ranks
    ret = (0.01 * torch.randn(N, generator=g, dtype=torch.float64)).float().double()
    src, dst = edges()
    day = np.repeat(np.arange(D), S).astype(np.int64)
    out["batch/x"] = x.numpy().astype(np.float32)
    out["batch/y"] = y.numpy().astype(np.float32)
    out["batch/ret"] = ret.numpy().astype(np.float32)
    out["batch/edge_src"] = src
    out["batch/edge_dst"] = dst
    out["batch/batch"] = day
    ts, td = torch.tensor(src), torch.tensor(dst)
    for name, c in CASES.items():
        p = params_of(c, g)
        # float32-representable parameters: the plugin stores f32
        with torch.no_grad():
            for t in p.values():
                t.copy_(t.float().double())
        pred = forward(c, p, x, ts, td)
        mse = ((pred - y) ** 2).mean()
        loss = mse + (c["rank_loss_weight"] * rank_loss(pred, y.numpy(), day)
                      if c["rank_loss_weight"] > 0 else 0)
        loss.backward()
        meta[name + ".ini"] = ini(c)
        out[name + "/pred"] = pred.detach().numpy().astype(np.float32)
        out[name + "/loss"] = np.array([loss.item()], np.float64)
        out[name + "/mse"] = np.array([mse.item()], np.float64)
        for k, t in p.items():
            out["%s/param/%s" % (name, k)] = t.detach().numpy().astype(np.float32)
            out["%s/grad/%s" % (name, k)] = t.grad.numpy().astype(np.float32)


# ---- metrics (NumPy) -----------------------------------------------------------

def spearman(a, b):
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return 0.0
    return float(np.corrcoef(avg_rank(a), avg_rank(b))[0, 1])


def long_short(score, ret, L):
    L = min(L, len(score) // 2)
    if L == 0 or np.all(score == score[0]):
        return 0.0
    idx = np.argsort(score, kind="stable")
    r = np.expm1(ret.astype(np.float64))
    return float(r[idx[-L:]].mean() - r[idx[:L]].mean())


def stats(score, ret, day, L):
    ic, ls = [], []
    for d in range(int(day.max()) + 1):
        sel = day == d
        if not sel.any():
            continue
        ic.append(spearman(score[sel].astype(np.float64), ret[sel].astype(np.float64)))
        ls.append(long_short(score[sel], ret[sel], L))
    ic, ls = np.array(ic), np.array(ls)
    sd = ic.std(ddof=1)
    lsd = ls.std(ddof=1)
    row = [ic.mean(), sd, ic.mean() / sd * np.sqrt(len(ic)) if sd > 0 else 0.0,
           ls.mean() / lsd * np.sqrt(252) if lsd > 0 else 0.0, len(ic)]
    return row, ic, ls


def metric_case(out, meta):
    rng = np.random.default_rng(7)
    L = 3
    sizes = [10, 10, 10, 10, 10, 10, 4]
    day = np.concatenate([np.full(s, d) for d, s in enumerate(sizes)]).astype(np.int64)
    n = len(day)
    pred = rng.standard_normal(n).astype(np.float32)
    ret = (0.02 * rng.standard_normal(n)).astype(np.float32)
    fac = rng.standard_normal((n, 2)).astype(np.float32)
    o = np.cumsum([0] + sizes)
    pred[o[1]:o[2]] = np.round(pred[o[1]:o[2]] * 2) / 2  # day 1: tied predictions
    ret[o[2]:o[3]] = np.round(ret[o[2]:o[3]] * 100) / 100  # day 2: tied returns
    pred[o[3]:o[4]] = 0.25  # day 3: constant prediction
    pred[o[4]:o[5]] = np.array([0.3, -0.1, 0.7, -0.1, 0.2, 0.9, -0.1, 0.5, 0.9, 0.4], np.float32)
    ret[o[5]:o[6]] = 0.01  # day 5: constant returns
    fac[:, 0] = np.round(fac[:, 0] * 2) / 2  # factor 0: ties everywhere
    fac[o[2]:o[3], 1] = -1.5  # factor 1 constant on day 2
    out["metrics/pred"] = pred
    out["metrics/ret"] = ret
    out["metrics/factors"] = fac
    out["metrics/batch"] = day
    rows, ics, lss = [], [], []
    for score in [pred, fac[:, 0], fac[:, 1]]:
        row, ic, ls = stats(score, ret, day, L)
        rows.append(row)
        ics.append(ic)
        lss.append(ls)
    out["metrics/expected"] = np.array(rows, np.float64)
    out["metrics/daily_ic"] = np.array(ics, np.float64)
    out["metrics/daily_ls"] = np.array(lss, np.float64)
    meta["metrics.long_short"] = str(L)
    meta["metrics.days"] = str(len(sizes))


def main():
    out, meta = {}, {"generator": "tools/gen_stock_gat_reference.py"}
    model_cases(out, meta)
    metric_case(out, meta)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, OUT, metadata=meta)
    print("wrote %s (%d tensors)" % (os.path.normpath(OUT), len(out)))


if __name__ == "__main__":
    main()
