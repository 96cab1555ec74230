#!/usr/bin/env python3
"""Test tools/planetoid_to_h5.py on tiny synthetic ind.<name>.* files.

The raw files are written the way the planetoid repo's were (scipy.sparse
csr pickles for x/tx/allx, numpy one-hot pickles for y/ty/ally, a defaultdict
graph, a text test.index). scipy is not required: a stand-in class named
scipy.sparse.csr.csr_matrix with the same pickled state (data, indices,
indptr, _shape) is used to write them. The converter's output is compared
with torch_geometric.io.read_planetoid_data (the independent reference),
edge order aside (PyG sorts by target, we sort by source).
"""
import collections
import os
import pickle
import subprocess
import sys
import tempfile
import types

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "planetoid_to_h5.py")


def install_fake_scipy():
    fake = sys.modules.get("scipy.sparse.csr")
    if fake is not None and getattr(fake, "_pl_fake", False):
        return fake.csr_matrix
    try:
        import scipy.sparse  # noqa: F401
        return __import__("scipy.sparse", fromlist=["csr_matrix"]).csr_matrix
    except ImportError:
        pass

    class csr_matrix:
        def __init__(self, dense):
            dense = np.asarray(dense, np.float32)
            self._shape = dense.shape
            self.maxprint = 50
            r, c = np.nonzero(dense)
            self.data = dense[r, c]
            self.indices = c.astype(np.int32)
            self.indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=dense.shape[0]))]).astype(np.int32)

        def todense(self):
            out = np.zeros(self._shape, np.float32)
            rows = np.repeat(np.arange(self._shape[0]), np.diff(self.indptr))
            out[rows, self.indices] = self.data
            return np.asmatrix(out)

    csr_matrix.__module__ = "scipy.sparse.csr"
    csr_matrix.__qualname__ = "csr_matrix"
    for name in ("scipy", "scipy.sparse", "scipy.sparse.csr"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["scipy.sparse.csr"].csr_matrix = csr_matrix
    sys.modules["scipy.sparse.csr"]._pl_fake = True
    return csr_matrix


def write_raw(folder, name, rng, n_train, n_val_pool, test_ids, n_nodes, F, C, gap=False):
    csr = install_fake_scipy()
    n_all = n_train + n_val_pool  # allx rows
    feats = (rng.random((n_nodes, F)) < 0.3).astype(np.float32)
    labels = rng.integers(0, C, n_nodes)
    onehot = np.eye(C, dtype=np.float32)[labels]
    test_ids = np.array(test_ids)
    # tx rows are in test.index order (shuffled ids)
    tx = feats[test_ids]
    ty = onehot[test_ids]

    def dump(part, obj):
        with open(os.path.join(folder, f"ind.{name}.{part}"), "wb") as f:
            pickle.dump(obj, f, protocol=2)

    dump("x", csr(feats[:n_train]))
    dump("allx", csr(feats[:n_all]))
    dump("tx", csr(tx))
    dump("y", onehot[:n_train])
    dump("ally", onehot[:n_all])
    dump("ty", ty)
    g = collections.defaultdict(list)
    total = n_nodes
    for _ in range(3 * total):
        a, b = rng.integers(0, total, 2)
        g[int(a)].append(int(b))
        g[int(b)].append(int(a))
    g[0].append(0)      # a self loop: must be dropped
    g[1].append(2)      # duplicates: must be merged
    g[1].append(2)
    g[2].append(1)
    dump("graph", g)
    with open(os.path.join(folder, f"ind.{name}.test.index"), "w") as f:
        f.write("\n".join(str(int(i)) for i in test_ids) + "\n")


def check_against_pyg(folder, name, out, padded_ids=()):
    from torch_geometric.io.planetoid import read_planetoid_data
    ref = read_planetoid_data(folder, name)
    with h5py.File(out) as f:
        feats = f["features"][:]
        labels = f["labels"][:]
        ei = f["edge_index"][:]
        masks = [f[m][:] for m in ("train_mask", "val_mask", "test_mask")]
        assert f["features"].dtype == np.float32 and f["labels"].dtype == np.int64
        assert f["edge_index"].dtype == np.int64 and f["train_mask"].dtype == np.uint8
        assert f.attrs["num_nodes"] == ref.num_nodes
        assert f.attrs["num_classes"] == ref.y.max().item() + 1 or len(padded_ids)
    np.testing.assert_array_equal(feats, ref.x.numpy())
    ry = ref.y.numpy().copy()
    for i in padded_ids:
        assert labels[i] == -1, f"padded node {i} should have label -1, got {labels[i]}"
        ry[i] = -1
    np.testing.assert_array_equal(labels, ry)
    for m, r in zip(masks, (ref.train_mask, ref.val_mask, ref.test_mask)):
        np.testing.assert_array_equal(m.astype(bool), r.numpy())
    rei = ref.edge_index.numpy()
    order = np.lexsort((rei[1], rei[0]))
    np.testing.assert_array_equal(ei, rei[:, order])
    assert np.all(ei[0] != ei[1])
    key = ei[0] * 100000 + ei[1]
    assert np.all(np.diff(key) > 0), "edges must be sorted by (src, dst) and unique"


def run(folder, name, out):
    r = subprocess.run([sys.executable, TOOL, "--name", name, folder, out],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def main():
    try:
        import torch_geometric  # noqa: F401  (the reference)
    except ImportError:
        print("test_planetoid_to_h5: torch_geometric not installed: skipped")
        sys.exit(77)
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as d:
        # cora-like: 10 train, 510 allx rows (PyG needs the 500 val nodes),
        # test ids 510..529 shuffled, 530 nodes
        test_ids = rng.permutation(np.arange(510, 530))
        write_raw(d, "cora", rng, 10, 500, test_ids, 530, 9, 3)
        out = os.path.join(d, "cora.h5")
        run(d, "cora", out)
        check_against_pyg(d, "cora", out)

        # citeseer-like: the test ids have a gap (node 515 is isolated/unlabeled)
        ids = [i for i in range(510, 530) if i != 515]
        write_raw(d, "citeseer", rng, 10, 500, rng.permutation(ids), 530, 9, 3)
        out2 = os.path.join(d, "citeseer.h5")
        run(d, "citeseer", out2)
        check_against_pyg(d, "citeseer", out2, padded_ids=[515])

        # a missing file is a clear error naming it
        os.remove(os.path.join(d, "ind.cora.ty"))
        r = subprocess.run([sys.executable, TOOL, d, os.path.join(d, "x.h5")],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "ind.cora.ty" in r.stderr, r.stderr
    print("test_planetoid_to_h5: OK")


if __name__ == "__main__":
    main()
