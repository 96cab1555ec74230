#!/usr/bin/env python3
"""Per-user test hit@10 and NDCG@10 of a finished ilora run, exactly the
numbers behind its summary.json test metrics.

usage: per_user.py RUN_DIR OUT.npz [--data data/movielens.h5] [--split test]
                   [--pipeline build/core/pipeline] [--top-k 100]

Runs `pipeline predict RUN_DIR DATA PRED.h5 model.predict_top_k=K` (the
run's best checkpoint, its loader and history exclusion; PRED.h5 is written
beside OUT.npz) and, per row, finds the target in the K best items:

  rank = number of listed items whose score is STRICTLY greater than the
         target's (evaluation's rule: ties count in the target's favour,
         plugins/models/ilora/README.md "Rank and ties"), a target outside
         the K best has rank >= K;
  hit@10 = rank < 10;  NDCG@10 = 1 / log2(rank + 2) if rank < 10 else 0.

Why not predict's top-10 alone: predict breaks score ties by the lower item
id, evaluation counts them for the target, so a target tied with the 10th
item is a hit in the run's metrics and can be missing from a top-10 list;
with K = 100 and the scores the rank is exact. Predict excludes the seen
items as evaluation does; evaluation also never excludes the target, which
only matters if a target is in its own history (never in a leave-one-out
split of distinct ratings; the assertion below would catch it).

The means are ASSERTED to equal summary.json's test_metrics hit_ratio@10 and
ndcg@10 to 1e-6 (with --split val: the validation of the best checkpoint in
metrics.csv, see best_val_metrics; summary.json's val_metrics are the last
epoch's); a mismatch exits 1.
OUT.npz: user_index, target, rank, hit10, ndcg10 (one entry per row, in the
split's row order), and the run directory.
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np

TOL = 1e-6


def ranks_from_topk(top_items, top_scores, target):
    """Evaluation's 0-based rank of each row's target from its K best items
    and their scores; K (or more) when the target is not listed."""
    K = top_items.shape[1]
    rank = np.full(len(target), K, np.int64)
    for i, t in enumerate(target):
        where = np.flatnonzero(top_items[i] == t)
        if len(where):
            rank[i] = int((top_scores[i] > top_scores[i, where[0]]).sum())
    return rank


def metrics_at(rank, k=10):
    hit = (rank < k).astype(np.float64)
    ndcg = np.where(rank < k, 1.0 / np.log2(rank.astype(np.float64) + 2.0), 0.0)
    return hit, ndcg


def best_val_metrics(run_dir):
    """The validation metrics of the run's best checkpoint: summary.json's
    val_metrics are the LAST validation's, so take the validation step of
    metrics.csv whose monitor equals summary.json's best_monitor (the first
    such step, the one the best checkpoint was saved at)."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    mon, best = s["monitor"], s["best_monitor"]
    by_step = {}
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        next(f)
        for line in f:
            step, _, key, val = line.rstrip("\n").split(",")
            if key.startswith("val_"):
                by_step.setdefault(int(step), {})[key[4:]] = float(val)
    for step in sorted(by_step):
        m = by_step[step]
        if abs(m.get(mon[4:], float("nan")) - best) <= 1e-9 * max(1.0, abs(best)):
            return dict(m, step=step)
    raise ValueError(f"{run_dir}: no validation step in metrics.csv has {mon} = {best}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--data", default="data/movielens.h5")
    ap.add_argument("--split", default="test", choices=("test", "val"))
    ap.add_argument("--pipeline", default=os.environ.get("PIPELINE_BIN", "build/core/pipeline"))
    ap.add_argument("--top-k", type=int, default=100)
    args = ap.parse_args()

    if args.split == "test":
        with open(os.path.join(args.run_dir, "summary.json")) as f:
            want = json.load(f)["test_metrics"]
    else:
        want = best_val_metrics(args.run_dir)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    pred = os.path.splitext(args.out)[0] + f".{args.split}_pred.h5"
    if os.path.exists(pred):
        os.remove(pred)
    cmd = [args.pipeline, "predict", args.run_dir, args.data, pred, "--split", args.split,
           f"model.predict_top_k={args.top_k}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"per_user: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    with h5py.File(pred) as f:
        top, sc, tg = f["top_items"][:], f["top_scores"][:], f["target"][:]
        users = f["user_index"][:] if "user_index" in f else f["row"][:]
    rank = ranks_from_topk(top, sc, tg)
    hit, ndcg = metrics_at(rank)
    got = {"hit_ratio@10": float(hit.mean()), "ndcg@10": float(ndcg.mean())}
    for k, v in got.items():
        if abs(v - want[k]) > TOL:
            sys.exit(f"per_user: {args.run_dir}: per-user {k} averages to {v:.8f}, "
                     f"the run says ({args.split}) {want[k]:.8f} (tolerance {TOL})")
    np.savez(args.out, user_index=users.astype(np.int64), target=tg.astype(np.int64),
             rank=rank, hit10=hit, ndcg10=ndcg, run_dir=os.path.abspath(args.run_dir))
    print(f"per_user: {args.run_dir}: {len(tg)} {args.split} users, hit@10 {got['hit_ratio@10']:.6f} "
          f"ndcg@10 {got['ndcg@10']:.6f} = the run's metrics (|diff| <= {TOL}) -> {args.out}")


if __name__ == "__main__":
    main()
