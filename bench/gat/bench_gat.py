"""GAT on Cora: epochs/s of `pipeline run configs/gat_cora.ini` vs PyG GATConv
on the same graph with the paper's setup (8 heads x 8 hidden, 1 output head,
dropout 0.6, Adam lr 0.005 + L2 5e-4), one train step + one validation
forward per epoch on both sides.

usage: python3 bench/gat/bench_gat.py [--epochs 100] [--data ../shared/data/planetoid/cora.h5]
                                     [--device cpu|cuda] [--compile]
Both sides: epochs/s after 5 warm-up epochs. --compile: PyTorch also with the
model under torch.compile(mode="reduce-overhead") (the loss outside it).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def torch_epochs_per_s(path, epochs, cfg, device="cpu", modes=("eager",)):
    import h5py
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    with h5py.File(path) as f:
        x = torch.tensor(f["features"][:])
        y = torch.tensor(f["labels"][:])
        ei = torch.tensor(f["edge_index"][:])
        train = torch.tensor(f["train_mask"][:]).bool()
        val = torch.tensor(f["val_mask"][:]).bool()
    x = x / x.sum(1, keepdim=True).clamp(min=1)
    x, y, ei, train, val = (t.to(device) for t in (x, y, ei, train, val))
    m = cfg["model"]
    hidden, heads = int(m.get("hidden", 8)), int(m.get("heads", 8))
    out_heads, p = int(m.get("output_heads", 1)), float(m.get("dropout", 0.6))
    c = int(y.max()) + 1

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = GATConv(x.shape[1], hidden, heads=heads, dropout=p)
            self.c2 = GATConv(hidden * heads, c, heads=out_heads, concat=False, dropout=p)

        def forward(self, x, ei):
            x = F.dropout(x, p, self.training)
            x = F.elu(self.c1(x, ei))
            x = F.dropout(x, p, self.training)
            return self.c2(x, ei)

    # the masks as index lists: the same rows, and a shape torch.compile can keep static
    tr_idx, va_idx = train.nonzero().squeeze(1), val.nonzero().squeeze(1)

    def run(mode):
        torch.manual_seed(0)
        model = GAT().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
        fwd = common.compiled(model, mode)
        timer = common.StepTimer(device)

        def epoch():
            model.train()
            common.step_begin(mode)
            with timer:  # the training step alone, as pipeline's step_seconds
                opt.zero_grad()
                loss = F.cross_entropy(fwd(x, ei)[tr_idx], y[tr_idx])
                loss.backward()
                opt.step()
            model.eval()
            common.step_begin(mode)
            with torch.no_grad():
                F.cross_entropy(fwd(x, ei)[va_idx], y[va_idx])

        common.sync(device)
        t0 = time.perf_counter()
        for _ in range(5):  # warm-up (compilation and CUDA graph recording in compile mode)
            epoch()
        common.sync(device)
        warm = time.perf_counter() - t0
        timer.seconds.clear()
        t0 = time.perf_counter()
        for _ in range(epochs):
            epoch()
        common.sync(device)
        return {"throughput": epochs / (time.perf_counter() - t0), "steps": timer.seconds, "warmup_s": warm}

    return common.torch_sides(modes, device, run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--data", default=os.path.join(common.ROOT, "../shared/data/planetoid/cora.h5"))
    common.add_device_arg(ap)
    a = ap.parse_args()
    cfg = common.read_ini("configs/gat_cora.ini")
    print(common.environment(a.device))
    s = common.run_pipeline("configs/gat_cora.ini",
                            [f"trainer.max_epochs={a.epochs}", f"data.path={a.data}"]
                            + common.device_overrides(a.device), "gat")
    # the epochs after 5 warm-up epochs, as the PyTorch side (the whole fit's
    # figure counts the warm-up and, on cuda, the CUDA graph's capture)
    ep = s.get("epoch_seconds") or []
    ours = (len(ep) - 5) / sum(ep[5:]) if len(ep) > 5 and sum(ep[5:]) > 0 else s["epochs"] / s["fit_seconds"]
    sides = torch_epochs_per_s(a.data, a.epochs, cfg, a.device, common.torch_modes(a))
    common.report(f"GAT Cora (train+val epoch, {a.device})", "epochs/s", ours,
                  extra=f"| peak memory {s['phases']['fit']['peak_memory_bytes'] / 2**20:.1f} MiB",
                  ours_steps=s["_step_seconds"], ours_rss=s["peak_rss_bytes"],
                  theirs_rss=common.peak_rss_bytes(), sides=sides, ours_peak=s["peak_memory_bytes"])

if __name__ == "__main__":
    main()
