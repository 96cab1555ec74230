"""LSTM forecasting: training samples/s of `pipeline run configs/lstm_chicago.ini`
vs torch.nn.LSTM with the same shapes (window, features, hidden_size,
num_layers, dropout, batch size from the INI), linear head on the last step,
Huber loss, AdamW, gradient clipping at 1.0, on the same standardized windows.

usage: python3 bench/lstm/bench_lstm.py [--epochs 3] [--device cpu|cuda] [--compile]
(on cuda, torch.nn.LSTM runs cuDNN's fused LSTM). Both sides leave their
warm-up steps out. --compile: PyTorch also with the model and loss under
torch.compile(mode="reduce-overhead") (Dynamo leaves nn.LSTM to eager: a
graph break, as users get it).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def torch_samples_per_s(h5, cfg, epochs, device="cpu", modes=("eager",)):
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    m, d = cfg["model"], cfg["data"]
    W, bs = int(d.get("window", 28)), int(d.get("batch_size", 64))
    H, nl = int(m.get("hidden_size", 64)), int(m.get("num_layers", 2))
    p = float(m.get("dropout", 0.0))
    with h5py.File(h5) as f:
        s = np.asarray(f[d.get("series", "series")][:], dtype=np.float32)
    n_train = int(0.75 * len(s))  # same order of magnitude as the 2001-2013 range
    s = (s - s[:n_train].mean(0)) / (s[:n_train].std(0) + 1e-8)
    x = torch.tensor(s, device=device)
    idx = torch.arange(n_train - W - 1, device=device)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(x.shape[1], H, nl, batch_first=True, dropout=p if nl > 1 else 0)
            self.head = nn.Linear(H, 1)

        def forward(self, xb):
            y, _ = self.lstm(xb)
            return self.head(y[:, -1])

    windows = x.unfold(0, W, 1).transpose(1, 2)  # [T-W+1, W, F] strided view

    def run(mode):
        torch.manual_seed(0)
        net = Net().to(device)
        opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)

        def loss_of(xb, yb):
            return F.huber_loss(net(xb), yb)

        loss_fn = common.compiled(loss_of, mode)

        def step(ib):
            common.step_begin(mode)
            xb, yb = windows[ib], x[ib + W, :1]
            loss = loss_fn(xb, yb)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()

        # warm-up, untimed: full batches, the epoch's short last batch, full batches again
        # (compile mode: the second batch size recompiles, each size records a CUDA graph)
        perm = idx[torch.randperm(len(idx), device=device)]
        last = len(perm) % bs
        common.sync(device)
        t0 = time.perf_counter()
        for k in range(3):
            step(perm[k * bs:(k + 1) * bs])
        for _ in range(3 if last else 0):
            step(perm[len(perm) - last:])
        for k in range(3):
            step(perm[k * bs:(k + 1) * bs])
        common.sync(device)
        warm = time.perf_counter() - t0
        n = 0
        timer = common.StepTimer(device)
        t0 = time.perf_counter()
        for ep in range(epochs):
            perm = idx[torch.randperm(len(idx), device=device)]
            for b in range(0, len(perm), bs):
                with timer:
                    ib = perm[b:b + bs]
                    step(ib)
                n += len(ib)
        common.sync(device)
        return {"throughput": n / (time.perf_counter() - t0), "steps": timer.seconds, "warmup_s": warm}

    return common.torch_sides(modes, device, run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(common.ROOT, "data/chicago.h5"))
    common.add_device_arg(ap)
    a = ap.parse_args()
    cfg = common.read_ini("configs/lstm_chicago.ini")
    print(common.environment(a.device))
    s = common.run_pipeline("configs/lstm_chicago.ini",
                            [f"trainer.max_epochs={a.epochs}", "trainer.limit_val_batches=1",
                             f"data.path={a.data}"] + common.device_overrides(a.device), "lstm")
    # after 5 warm-up steps, synchronized (summary.json), as the PyTorch side
    # leaves its warm-up steps out
    ours = s.get("steady_samples_per_second") or s["train_samples_per_second"]
    sides = torch_samples_per_s(a.data, cfg, a.epochs, a.device, common.torch_modes(a))
    common.report(f"LSTM Chicago (train, {a.device})", "samples/s", ours,
                  extra=f"| peak memory {s['phases']['fit']['peak_memory_bytes'] / 2**20:.1f} MiB",
                  ours_steps=s["_step_seconds"], ours_rss=s["peak_rss_bytes"],
                  theirs_rss=common.peak_rss_bytes(), sides=sides, ours_peak=s["peak_memory_bytes"])

if __name__ == "__main__":
    main()
