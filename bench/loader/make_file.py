#!/usr/bin/env python3
"""make_file.py OUT.h5 [GiB=2]: /train/x f32 [N, 256] with N = GiB * 2^30 / 1024, written in slabs."""
import sys

import h5py
import numpy as np

out = sys.argv[1]
gib = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
n = int(gib * (1 << 30) / (256 * 4))
slab = 65536
with h5py.File(out, "w") as f:
    d = f.create_dataset("train/x", shape=(n, 256), dtype=np.float32)
    rng = np.random.default_rng(0)
    for s in range(0, n, slab):
        e = min(n, s + slab)
        d[s:e] = rng.random((e - s, 256), dtype=np.float32)
print(f"{out}: {n} rows x 256 f32 = {n * 1024 / (1 << 30):.2f} GiB")
