"""make_ml_tiny.py OUT.h5 - a tiny MovieLens-shaped file for tests of the
teacher on the HF Llama fixtures: 40 items, 24 users, rows of 8, the
layout of tools/movielens_to_h5.py (train input_ids/labels; val and test
input_ids/target/user_index; attribute num_items). Deterministic (seed 0)."""
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
N, U, L = 40, 24, 8
seqs = [rng.integers(1, N + 1, size=rng.integers(5, 12)) for _ in range(U)]
def rows(s):
    s = s[-(L + 1):]
    x = np.zeros(L, np.int32); y = np.zeros(L, np.int32)
    x[L - len(s) + 1:] = s[:-1]; y[L - len(s) + 1:] = s[1:]
    return x, y
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["num_items"] = np.int64(N)
    tr = [rows(s[:-2]) for s in seqs]
    g = f.create_group("train")
    g["input_ids"] = np.stack([a for a, _ in tr]); g["labels"] = np.stack([b for _, b in tr])
    for name, cut in (("val", 1), ("test", 0)):
        g = f.create_group(name)
        ctx = [s[:len(s) - cut - 1] for s in seqs]
        x = np.zeros((U, L), np.int32)
        for i, c in enumerate(ctx):
            c = c[-L:]; x[i, L - len(c):] = c
        g["input_ids"] = x
        g["target"] = np.array([s[len(s) - cut - 1] for s in seqs], np.int32)
        g["user_index"] = np.arange(U, dtype=np.int32)
