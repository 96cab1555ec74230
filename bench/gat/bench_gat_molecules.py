"""GAT graph-level regression on batches of small molecules (NCI TPSA):
graphs/s of `pipeline run configs/gat_molecules.ini` vs the same network in
PyTorch Geometric (GATConv x layers -> ELU -> global_mean_pool /
global_add_pool -> Linear head, Adam), trained for the same epochs on the
same split with the same batch size, on the same machine in the same run.
Both sides train on standardized targets (training-split mean and std) and
report test MAE in the target's units (A^2) beside the train-mean baseline.

PyG's side is PyG as users write it: a list of `Data` objects and
`torch_geometric.loader.DataLoader`, which collates every batch on the fly.

Both sides leave their warm-up out: pipeline its first 5 steps (summary.json
steady_samples_per_second), PyG its first epoch (when there are two or more).
With --device cuda each collated batch is moved to the GPU (`b.to(device)`,
in the step's time). --compile: PyG also with the network under
torch.compile(mode="reduce-overhead"); batch shapes change every step, so the
dynamic-shape graphs skip CUDA graphs (inductor's
triton.cudagraph_skip_dynamic_graphs) instead of recording one per shape.

usage: python3 bench/gat/bench_gat_molecules.py [--epochs 20] [--data data/nci_tpsa.h5]
                                                [--device cpu|cuda] [--compile]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def torch_run(path, epochs, cfg, threads, device="cpu", modes=("eager",)):
    import h5py
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GATConv, global_add_pool, global_mean_pool

    torch.set_num_threads(threads)
    with h5py.File(path) as f:
        x = torch.tensor(f["x"][:], dtype=torch.float32)
        ei = torch.tensor(f["edge_index"][:], dtype=torch.long)
        nptr, eptr = f["node_ptr"][:], f["edge_ptr"][:]
        y = torch.tensor(f["y"][:], dtype=torch.float32)
        masks = {s: f[s + "_mask"][:].astype(bool) for s in ("train", "val", "test")}
    mean = y[torch.tensor(masks["train"])].mean(0)
    std = y[torch.tensor(masks["train"])].std(0)  # torch default: unbiased
    mean_d, std_d = mean.to(device), std.to(device)
    data = []
    for g in range(len(nptr) - 1):
        data.append(Data(x=x[nptr[g]:nptr[g + 1]], edge_index=ei[:, eptr[g]:eptr[g + 1]],
                         y=((y[g] - mean) / std).view(1, -1)))
    split = {s: [data[i] for i in range(len(data)) if m[i]] for s, m in masks.items()}
    m, d, o = cfg["model"], cfg["data"], cfg["optimizer"]
    layers, hidden, heads = int(m.get("layers", 2)), int(m.get("hidden", 8)), int(m.get("heads", 8))
    p, ap = float(m.get("dropout", 0.6)), float(m.get("attn_dropout", 0.6))
    hh = int(m.get("head_hidden", 0))
    pool = global_add_pool if m.get("readout", "mean") == "sum" else global_mean_pool
    bs = int(d.get("batch_size", 32))
    K = y.shape[1]

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [x.shape[1]] + [hidden * heads] * layers
            self.convs = torch.nn.ModuleList(
                GATConv(dims[i], hidden, heads=heads, dropout=ap, residual=m.get("residual", "false") == "true")
                for i in range(layers))
            self.head = torch.nn.ModuleList(
                [torch.nn.Linear(dims[-1], hh), torch.nn.Linear(hh, K)] if hh else [torch.nn.Linear(dims[-1], K)])

        def forward(self, b):
            h = b.x
            for c in self.convs:
                h = F.elu(c(F.dropout(h, p, self.training), b.edge_index))
            h = pool(h, b.batch)
            for i, lin in enumerate(self.head):
                h = lin(F.elu(h) if i else h)
            return h

    def run(mode):
        torch.manual_seed(0)
        net = Net().to(device)
        fwd = common.compiled(net, mode)
        opt = torch.optim.AdamW(net.parameters(), lr=float(o.get("lr", 1e-3)),
                                weight_decay=float(o.get("weight_decay", 0.01)))
        loss_fn = {"mae": F.l1_loss, "huber": F.huber_loss}.get(m.get("loss", "mse"), F.mse_loss)
        train = DataLoader(split["train"], batch_size=bs, shuffle=True)
        # the config's per-step cosine schedule (no warmup) = CosineAnnealingLR over all steps
        sched = None
        if cfg.has_section("scheduler") and cfg["scheduler"].get("plugin") == "cosine":
            sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(train))
        n_graphs = 0
        steps = []  # wall seconds of each step, collation included (as pipeline's step_seconds)
        warm = train_s = 0.0
        # the first epoch is the warm-up (compilation in compile mode) when there are more
        timed_from = 1 if epochs > 1 else 0
        for ep in range(epochs):
            net.train()
            common.sync(device)
            t0 = time.perf_counter()
            t_prev = t0
            for b in train:
                common.step_begin(mode)
                b = b.to(device)
                opt.zero_grad()
                loss_fn(fwd(b), b.y).backward()
                opt.step()
                if sched:
                    sched.step()
                if ep >= timed_from:
                    n_graphs += b.num_graphs
                    now = time.perf_counter()
                    steps.append(now - t_prev)
                    t_prev = now
            common.sync(device)
            if ep >= timed_from:
                train_s += time.perf_counter() - t0
            else:
                warm += time.perf_counter() - t0
        net.eval()
        err = base = n = 0.0
        with torch.no_grad():
            for b in DataLoader(split["test"], batch_size=bs):
                common.step_begin(mode)
                b = b.to(device)
                pred = fwd(b) * std_d + mean_d
                t = b.y * std_d + mean_d
                err += (pred - t).abs().sum().item()
                base += (mean_d - t).abs().sum().item()
                n += t.numel()
        return {"throughput": n_graphs / train_s, "steps": steps, "warmup_s": warm,
                "mae": err / n, "base": base / n}

    if "compile" in modes:
        # every batch has its own node and edge counts: the graphs Dynamo compiles with
        # dynamic shapes run without CUDA graphs (reduce-overhead would record one graph per
        # batch shape, a capture every step)
        import torch._inductor.config as ic
        try:
            ic.triton.cudagraph_skip_dynamic_graphs = True
        except AttributeError:  # an older torch without the switch: one graph per shape
            print("compile: this torch has no inductor triton.cudagraph_skip_dynamic_graphs")
    return common.torch_sides(modes, device, run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--data", default="data/nci_tpsa.h5")
    ap.add_argument("--config", default="configs/gat_molecules.ini")
    common.add_device_arg(ap)
    a = ap.parse_args()
    path = os.path.join(common.ROOT, a.data)
    if not os.path.exists(path):
        sys.exit(f"bench: {a.data} missing: run tools/fetch_molecules.sh")
    cfg = common.read_ini(a.config)
    ours = common.run_pipeline(a.config, [f"data.path={a.data}", f"trainer.max_epochs={a.epochs}",
                                          "pipeline.threads=2"] + common.device_overrides(a.device),
                               "pipeline", test=True)
    # samples = graphs (pl_batch.size); after 5 warm-up steps, synchronized
    ours_tp = ours.get("steady_samples_per_second") or ours["train_samples_per_second"]
    sides = torch_run(path, a.epochs, cfg, 2, a.device, common.torch_modes(a))
    print(common.environment(a.device))
    common.report(f"gat molecules (train, {a.device})", "graphs/s", ours_tp, ours_steps=ours["_step_seconds"],
                  ours_rss=ours["peak_rss_bytes"], theirs_rss=common.peak_rss_bytes(), sides=sides,
                  ours_peak=ours["peak_memory_bytes"])
    tm = ours.get("test_metrics", {})
    e = sides["eager"]
    c = sides.get("compile") or {}
    print(f"test MAE after {a.epochs} epochs: pipeline {tm.get('mae', float('nan')):.3f}   "
          f"pyg {e['mae']:.3f}" + (f"   pyg compiled {c['mae']:.3f}" if "mae" in c else "")
          + f"   train-mean baseline {e['base']:.3f}")

if __name__ == "__main__":
    main()
