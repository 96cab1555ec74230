#!/usr/bin/env python3
"""Paired bootstrap over users: is variant A better than variant B on the
same test users?

usage: paired_bootstrap.py A.npy B.npy [--resamples 10000] [--seed 0]

A and B hold one metric per test user (e.g. hit@10 or NDCG@10 of each user,
bench/teacher/per_user.py), shape [U] or [S, U] for S seeds. Both must list
the same users in the same order.

Seeds: each user's metric is first averaged over the seeds (a [S, U] array
becomes its column means), then the users are resampled. The interval is
therefore over the users drawn from the population, for the seed-averaged
models; seed-to-seed variation enters only through those averages.

Method: d_u = mean_s A[s, u] - mean_s B[s, u]; the estimate is mean_u d_u.
B resamples draw U users with replacement (numpy Generator(PCG64(seed)),
integers in [0, U)); each resample's statistic is the mean of its d_u; the
95 % interval is the 2.5 and 97.5 percentiles of the B statistics
(np.percentile, linear interpolation). Resampling the SAME users for A and B
is what makes it paired: the between-user spread, which is far larger than
the difference between variants, cancels.
"""
import argparse
import sys

import numpy as np


def seed_mean(x):
    """[U] or [S, U] -> [U]: each user's metric averaged over the seeds."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        return x
    if x.ndim == 2:
        return x.mean(axis=0)
    raise ValueError(f"per-user metrics must be [U] or [S, U], got shape {x.shape}")


def resample_indices(U, resamples, seed, chunk=1000):
    """Yield the resamples' user indices, [n, U] int64 blocks (n <= chunk),
    B rows in all, drawn from one Generator(PCG64(seed))."""
    rng = np.random.Generator(np.random.PCG64(seed))
    done = 0
    while done < resamples:
        n = min(chunk, resamples - done)
        yield rng.integers(0, U, size=(n, U))
        done += n


def paired_bootstrap(a, b, resamples=10000, seed=0, level=0.95):
    """(mean difference a - b, interval low, interval high, per-resample means).

    a, b: [U] or [S, U] per-user metrics of two variants on the same users
    (averaged over seeds first, see the module docstring)."""
    a, b = seed_mean(a), seed_mean(b)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in users: {a.shape} vs {b.shape}")
    if a.size == 0:
        raise ValueError("no users")
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    d = a - b
    stats = np.concatenate([d[idx].mean(axis=1)
                            for idx in resample_indices(d.size, resamples, seed)])
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return float(d.mean()), float(lo), float(hi), stats


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        m, lo, hi, _ = paired_bootstrap(np.load(args.a), np.load(args.b), args.resamples, args.seed)
    except ValueError as e:
        sys.exit(f"paired_bootstrap: {e}")
    print(f"mean(A - B) = {m:+.6f}   95 % interval [{lo:+.6f}, {hi:+.6f}]   "
          f"({args.resamples} paired resamples over users, seed {args.seed})")


if __name__ == "__main__":
    main()
