"""Stock-graph workload (configs/gat_stocks.ini, issue 20): training days/s of
`pipeline run` beside the same network in PyTorch, and the cost of building
the day-graphs once against rebuilding them for every batch (the reports'
bug), on the same machine in the same run.

PyTorch side, as users write it: the panel read with h5py, features
standardized with the training days' statistics, the target z-scored per day,
every day's graph built once with NumPy (top-k |corr| of the last
`graph_lookback` daily returns, self loops), batches of `batch_size` days
(node = day * S + stock); torch.nn.LSTM -> GATConv (PyG's formulas written
with index_add_, since torch_geometric is not installed here) -> ELU ->
Linear back to H + residual -> Linear head; AdamW (and OneCycleLR per
optimizer step and `accumulate_grad_batches` when the INI has them, as
--config configs/gat_stocks_recipe.ini does). Same shapes, batch, optimizer
and epochs as the INI. Both report the training days/s of the epochs after the first (the
first pays one-time costs), and the validation IC of the last epoch as a
sanity check that both learned.

Graphs: `data.graphs=once` against `data.graphs=per_batch`, pipeline both
times: seconds per epoch, data-wait fraction (from summary.json) and the
graph-building time the loader reports; and the PyTorch program with its
graphs rebuilt in NumPy for every batch (the reports' bug as it was written)
against built once.

--device cuda: both sides on the GPU (PyTorch: each batch built in NumPy and
moved over, in the step's time; the graph comparison stays on the CPU);
--compile: PyTorch also with the network under torch.compile(mode=
"reduce-overhead") (nn.LSTM a graph break, as users get it), timed the same
way (the first epoch, with compilation, apart); --no-graph-compare: only the
throughput line.

usage: python3 bench/stocks/bench_stocks.py [--epochs 4] [--threads 1] [--config configs/gat_stocks.ini]
                                            [--device cpu|cuda] [--compile] [--no-graph-compare]
"""
import argparse
import datetime as dt
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

CONFIG = "configs/gat_stocks.ini"


def day_seconds(s):
    return (dt.date.fromisoformat(s) - dt.date(1970, 1, 1)).days * 86400


def spearman(a, b):
    def rank(v):
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        u, inv = np.unique(v, return_inverse=True)
        s, c = np.zeros(len(u)), np.zeros(len(u))
        np.add.at(s, inv, r)
        np.add.at(c, inv, 1)
        return (s / c)[inv]
    ra, rb = rank(a), rank(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def torch_run(cfg, epochs, threads, rebuild=False, device="cpu", mode="eager"):
    import h5py
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    np.random.seed(0)
    d, m, o = cfg["data"], cfg["model"], cfg["optimizer"]
    W, L, K = int(d["window"]), int(d["graph_lookback"]), int(d["graph_top_k"])
    B = int(d["batch_size"])
    H, heads, C = int(m["hidden"]), int(m["heads"]), int(m["gat_hidden"])
    p_drop = float(m["dropout"])
    accum = int(cfg["trainer"].get("accumulate_grad_batches", "1"))
    with h5py.File(os.path.join(common.ROOT, d["path"])) as f:
        X = f["features"][:].astype(np.float64)
        tgt = f["target"][:].astype(np.float64)
        tt = f["target_time"][:]
    T, S, Fn = X.shape
    usable = np.arange(T) >= max(W, L) - 1
    tr = usable & (tt <= day_seconds(d["train_end"]))
    va = usable & (tt > day_seconds(d["train_end"])) & (tt <= day_seconds(d["val_end"]))
    flat = X[tr].reshape(-1, Fn)
    Xs = ((X - flat.mean(0)) / flat.std(0, ddof=1)).astype(np.float32)
    y = ((tgt - tgt.mean(1, keepdims=True)) / tgt.std(1, ddof=1, keepdims=True)).astype(np.float32)
    def build(t):
        c = np.nan_to_num(np.corrcoef(X[t - L + 1:t + 1, :, 0].T))
        a = np.abs(c)
        np.fill_diagonal(a, -1.0)
        src, dst = [], []
        for i in range(S):
            nb = np.argsort(-a[i], kind="stable")[:K]
            src += list(nb)
            dst += [i] * K
        src += list(range(S))
        dst += list(range(S))
        return np.array(src), np.array(dst)

    t0 = time.time()
    edges = {t: build(t) for t in np.where(usable)[0]}
    graph_s = time.time() - t0
    build_s = [0.0]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(Fn, H, batch_first=True)
            self.lin = torch.nn.Linear(H, heads * C, bias=False)
            self.att_src = torch.nn.Parameter(torch.empty(heads, C))
            self.att_dst = torch.nn.Parameter(torch.empty(heads, C))
            torch.nn.init.xavier_uniform_(self.att_src)
            torch.nn.init.xavier_uniform_(self.att_dst)
            self.bias = torch.nn.Parameter(torch.zeros(heads * C))
            self.proj = torch.nn.Linear(heads * C, H)
            self.head = torch.nn.Linear(H, 1)

        def forward(self, x, src, dst):
            n = x.shape[0]
            _, (h, _) = self.lstm(x)
            h = h[-1]
            z = self.lin(F.dropout(h, p_drop, self.training)).view(n, heads, C)
            e = F.leaky_relu((z * self.att_src).sum(-1)[src] + (z * self.att_dst).sum(-1)[dst], 0.2)
            e = torch.exp(e - e.max())
            den = torch.zeros(n, heads, device=x.device).index_add_(0, dst, e)
            alpha = e / den[dst]
            g = torch.zeros(n, heads, C, device=x.device).index_add_(0, dst, alpha.unsqueeze(-1) * z[src])
            g = F.elu(g.reshape(n, -1) + self.bias)
            zz = h + self.proj(g)
            return self.head(F.dropout(zz, p_drop, self.training)).squeeze(-1)

    def batch(days):
        xs, ss, ds = [], [], []
        for k, t in enumerate(days):
            xs.append(Xs[t - W + 1:t + 1].transpose(1, 0, 2))
            if rebuild:  # the reports' bug: the day's graph built again for every batch
                t1 = time.time()
                s_, d_ = build(t)
                build_s[0] += time.time() - t1
            else:
                s_, d_ = edges[t]
            ss.append(s_ + k * S)
            ds.append(d_ + k * S)
        return (torch.from_numpy(np.ascontiguousarray(np.concatenate(xs))).to(device),
                torch.from_numpy(np.concatenate(ss)).to(device), torch.from_numpy(np.concatenate(ds)).to(device))

    net = Net().to(device)
    fwd = common.compiled(net, mode)
    opt = torch.optim.AdamW(net.parameters(), lr=float(o["lr"]), weight_decay=float(o["weight_decay"]))
    days_tr = np.where(tr)[0]
    steps = epochs * ((len(days_tr) + B - 1) // B + accum - 1) // accum
    sched = None
    if cfg.has_section("scheduler") and cfg["scheduler"].get("plugin") == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=float(o["lr"]), total_steps=steps + 1,
            pct_start=float(cfg["scheduler"].get("pct_start", "0.3")))
    epoch_s, steps = [], []
    for ep in range(epochs):
        net.train()
        perm = np.random.permutation(days_tr)
        common.sync(device)
        t0 = time.time()
        t_prev = time.perf_counter()
        for b, i in enumerate(range(0, len(perm), B)):
            common.step_begin(mode)
            days = perm[i:i + B]
            x, s_, d_ = batch(days)
            loss = F.mse_loss(fwd(x, s_, d_), torch.from_numpy(y[days].reshape(-1)).to(device)) / accum
            loss.backward()
            if (b + 1) % accum == 0 or i + B >= len(perm):
                opt.step()
                opt.zero_grad()
                if sched:
                    sched.step()
                if ep > 0:  # per optimizer step, batching included, as pipeline's step_seconds
                    now = time.perf_counter()
                    steps.append(now - t_prev)
                    t_prev = now
        common.sync(device)
        epoch_s.append(time.time() - t0)
    net.eval()
    days_va = np.where(va)[0]
    with torch.no_grad():
        x, s_, d_ = batch(days_va)
        pred = net(x, s_, d_).cpu().numpy().reshape(len(days_va), S)
    ic = float(np.mean([spearman(pred[k], tgt[t]) for k, t in enumerate(days_va)]))
    steady = epoch_s[1:] or epoch_s
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (len(days_tr) / float(np.median(steady)), ic, graph_s, rss,
            build_s[0] / max(sum(epoch_s), 1e-9), steps, epoch_s[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--no-graph-compare", action="store_true",
                    help="only the throughput comparison (no graphs once / per_batch runs)")
    common.add_device_arg(ap)
    args = ap.parse_args()
    cfg = common.read_ini(args.config)
    import torch
    torch.set_num_threads(args.threads)
    print(common.environment(args.device))
    base = [f"trainer.max_epochs={args.epochs}", f"pipeline.threads={args.threads}"]
    s = common.run_pipeline(args.config, base + common.device_overrides(args.device), "pipeline", test=False)
    ep = s["epoch_seconds"][1:] or s["epoch_seconds"]
    days = s["data"]["num_train"] / float(np.median(ep))
    info = {}

    def run(mode):
        tp, ic, gs, rss, _, st, warm = torch_run(cfg, args.epochs, args.threads, device=args.device, mode=mode)
        info[mode] = (ic, gs, rss)
        return {"throughput": tp, "steps": st, "warmup_s": warm}

    sides = common.torch_sides(common.torch_modes(args), args.device, run)
    theirs = sides["eager"]["throughput"]
    ic_t, graph_s, rss_t = info["eager"]
    ic_c = f", pytorch compiled {info['compile'][0]:.4f}" if "compile" in info else ""
    common.report(f"gat_stocks (train days/s, {args.device})", "days/s", days,
                  extra=f"| val IC after {args.epochs} epochs: pipeline {s['val_metrics']['ic']:.4f}, "
                  f"pytorch {ic_t:.4f}{ic_c} | peak RSS MiB: pipeline {s['peak_rss_bytes'] / 2**20:.0f}, "
                  f"pytorch {rss_t:.0f}", ours_steps=s["_step_seconds"],
                  ours_rss=s["peak_rss_bytes"], theirs_rss=rss_t * 2**20, sides=sides,
                  ours_peak=s["peak_memory_bytes"])
    if args.no_graph_compare:
        return
    print(f"day-graphs built once: pipeline {s['data']['graphs_built']} in "
          f"{s['data']['graph_build_ms']:.0f} ms (C, at load); PyTorch side {graph_s * 1e3:.0f} ms (NumPy)")
    per = common.run_pipeline(args.config, base + ["data.graphs=per_batch"], "per_batch", test=False)
    for name, r in (("graphs = once", s), ("graphs = per_batch", per)):
        e = r["epoch_seconds"][1:] or r["epoch_seconds"]
        print(f"{name:<20} {np.median(e):6.2f} s/epoch (median of {len(e)})  "
              f"data-wait {100 * r['data_wait_fraction']:5.1f} %  val IC {r['val_metrics']['ic']:.4f}  "
              f"graphs built {r['data']['graphs_built']} in {r['data']['graph_build_ms']:.0f} ms")
    # the loader's own clock of graph building, against the run's fit time:
    # robust to what else the machine runs (epoch times on a shared machine are not)
    fb = per["data"]["graph_build_ms"] / 1e3 / per["fit_seconds"]
    print(f"pipeline: with graphs = per_batch, building graphs (in C) takes {100 * fb:.2f} % of the "
          f"fit time ({per['data']['graphs_built']} graphs, {per['data']['graph_build_ms']:.0f} ms); "
          f"with graphs = once, 0 % (built before fit)")
    reb, _, _, _, frac, _, _ = torch_run(cfg, args.epochs, args.threads, rebuild=True)
    print(f"pytorch:  rebuilding every batch's graphs (NumPy) {reb:.1f} days/s against {theirs:.1f} "
          f"built once ({theirs / reb:.2f}x the epoch time); graph building is "
          f"{100 * frac:.1f} % of the training time")


if __name__ == "__main__":
    main()
