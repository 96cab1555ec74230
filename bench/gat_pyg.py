#!/usr/bin/env python3
"""Peer baseline for configs/gat_cora.ini: the same GAT in PyTorch Geometric
(GATConv, 8 heads x 8, ELU, 1 output head, dropout 0.6 on inputs and
attention, Adam lr 0.005 with weight_decay 5e-4 (coupled L2), row-normalized
features, early stopping with patience 100 on the validation loss, test
accuracy of the best-val-loss weights). Prints one line per seed and mean +- std.

Usage: python3 bench/gat_pyg.py [--path data/cora.h5] [--seeds 10] [--threads 2]
"""
import argparse
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv


def load(path):
    with h5py.File(path, "r") as h:
        x = torch.tensor(h["features"][:], dtype=torch.float32)
        y = torch.tensor(h["labels"][:], dtype=torch.long)
        ei = torch.tensor(h["edge_index"][:], dtype=torch.long)
        masks = [torch.tensor(h[k][:] != 0) for k in ("train_mask", "val_mask", "test_mask")]
    x = x - x.min()
    x = x / x.sum(-1, keepdim=True).clamp(min=1)  # NormalizeFeatures
    return x, y, ei, masks


class GAT(torch.nn.Module):
    def __init__(self, fin, k):
        super().__init__()
        self.c1 = GATConv(fin, 8, heads=8, dropout=0.6)
        self.c2 = GATConv(64, k, heads=1, concat=False, dropout=0.6)

    def forward(self, x, ei):
        x = F.dropout(x, 0.6, self.training)
        x = F.elu(self.c1(x, ei))
        x = F.dropout(x, 0.6, self.training)
        return self.c2(x, ei)


def run(seed, data, patience=100, max_epochs=100000):
    x, y, ei, (tr, va, te) = data
    torch.manual_seed(seed)
    m = GAT(x.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(m.parameters(), lr=0.005, weight_decay=5e-4)
    best, best_state, bad, ep = float("inf"), None, 0, 0
    t0 = time.time()
    for ep in range(max_epochs):
        m.train()
        opt.zero_grad()
        F.cross_entropy(m(x, ei)[tr], y[tr]).backward()
        opt.step()
        m.eval()
        with torch.no_grad():
            vl = F.cross_entropy(m(x, ei)[va], y[va]).item()
        if vl < best:
            best, bad = vl, 0
            best_state = {k: v.clone() for k, v in m.state_dict().items()}
        else:
            bad += 1
            if bad >= patience:
                break
    dt = (time.time() - t0) / (ep + 1)
    m.load_state_dict(best_state)
    m.eval()
    with torch.no_grad():
        acc = (m(x, ei).argmax(-1)[te] == y[te]).float().mean().item()
    return acc, ep + 1, dt, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="data/cora.h5")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    data = load(a.path)
    accs = []
    for s in range(a.seeds):
        acc, n, dt, vl = run(s, data)
        accs.append(acc)
        print("seed %d: test_accuracy %.4f  epochs %d  %.4f s/epoch  best val_loss %.4f" % (s, acc, n, dt, vl),
              flush=True)
    print("PyG GAT: test accuracy %.2f +- %.2f %% over %d seeds" % (100 * np.mean(accs), 100 * np.std(accs), a.seeds))


if __name__ == "__main__":
    main()
