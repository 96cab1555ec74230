#!/usr/bin/env python3
"""Planetoid raw files (ind.<name>.{x,tx,allx,y,ty,ally,graph,test.index}) -> HDF5.

usage: planetoid_to_h5.py [--name cora] RAW_DIR out.h5

The raw format is the one of the public planetoid repository (Yang, Cohen,
Salakhutdinov, ICML 2016; also used by Kipf & Welling's gcn repo and PyG):
  x, allx, tx   feature matrices (scipy.sparse pickles, Python 2) of the labeled
                training nodes, all training-side nodes, and the test nodes
  y, ally, ty   one-hot label arrays (numpy pickles) matching x, allx, tx
  graph         dict {node: [neighbour, ...]} (a defaultdict pickle)
  test.index    text, one node id per line: the ids of the rows of tx

Conversion (the same as torch_geometric.io.read_planetoid_data):
  features = vstack(allx, tx); rows at test.index are put in sorted test order
  (features[test_index] = features[sorted(test_index)]); the same for labels.
  For citeseer (or whenever test.index has gaps) tx/ty are padded with zero rows
  for the missing ids, and those nodes get label -1 (no class).
  labels = argmax of the one-hot rows; an all-zero row gives -1.
  train = the first len(y) nodes, val = the next 500, test = test.index.
  edge_index: every (key, neighbour) of graph, self loops removed, duplicates
  removed, sorted by (source, target). No direction is added: the dict already
  holds both directions for cora/citeseer/pubmed; a warning is printed if not.

Layout written (same as the project's reference cora.h5):
  /features   f32 [N, F]  gzip 6, chunks of 256 rows, NOT row-normalized
  /labels     i64 [N]
  /edge_index i64 [2, E]
  /train_mask /val_mask /test_mask  u8 [N]
  attributes: num_classes (i64), num_nodes (i64), source (str)

scipy is not needed: the sparse pickles are read through a small stand-in
class that understands csr/csc/coo/lil state (scipy is used if installed).
"""
import argparse
import os
import pickle
import sys

import h5py
import numpy as np

from convert_out import atomic_output, refuse_input_as_output


class _SparseStandIn:
    """Receives the pickled state of a scipy.sparse matrix."""

    fmt = None

    def __setstate__(self, state):
        self.__dict__.update(state)

    def todense(self):
        d = self.__dict__
        shape = d.get("_shape", d.get("shape"))
        if shape is None:
            raise ValueError("sparse pickle without a shape")
        rows, cols = int(shape[0]), int(shape[1])
        out = np.zeros((rows, cols), np.float32)
        fmt = self.fmt
        if fmt in ("csr", "csc"):
            data = np.asarray(d["data"])
            indices = np.asarray(d["indices"], np.int64)
            indptr = np.asarray(d["indptr"], np.int64)
            major = rows if fmt == "csr" else cols
            if len(indptr) != major + 1:
                raise ValueError(f"{fmt} indptr has {len(indptr)} entries, expected {major + 1}")
            maj = np.repeat(np.arange(major), np.diff(indptr))
            if fmt == "csr":
                np.add.at(out, (maj, indices), data)
            else:
                np.add.at(out, (indices, maj), data)
        elif fmt == "coo":
            r = np.asarray(d.get("row", d.get("coords", [[]])[0]), np.int64)
            c = np.asarray(d.get("col", d.get("coords", [[], []])[1]), np.int64)
            np.add.at(out, (r, c), np.asarray(d["data"]))
        elif fmt == "lil":
            for i, (cs, vs) in enumerate(zip(d["rows"], d["data"])):
                out[i, list(cs)] = vs
        else:
            raise ValueError(f"unsupported sparse format {fmt!r}")
        return out


def _stand_in(fmt):
    return type(f"{fmt}_matrix", (_SparseStandIn,), {"fmt": fmt})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("scipy.sparse") and name.endswith("_matrix"):
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                return _stand_in(name[:-len("_matrix")])
        return super().find_class(module, name)


def load_pickle(path):
    with open(path, "rb") as f:
        return _Unpickler(f, encoding="latin1").load()


def dense(obj, path):
    if hasattr(obj, "todense"):
        obj = obj.todense()
    a = np.asarray(obj, dtype=np.float32)
    if a.ndim != 2:
        sys.exit(f"planetoid_to_h5: {path}: expected a 2-D matrix, got shape {a.shape}")
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw_dir")
    ap.add_argument("out")
    ap.add_argument("--name", default="cora", help="dataset prefix: ind.<name>.* (default cora)")
    ap.add_argument("--num-val", type=int, default=500, help="validation nodes after the train nodes")
    args = ap.parse_args()

    def p(part):
        return os.path.join(args.raw_dir, f"ind.{args.name.lower()}.{part}")

    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        if not os.path.isfile(p(part)):
            sys.exit(f"planetoid_to_h5: {p(part)}: file not found")
    refuse_input_as_output("planetoid_to_h5", args.out,
                           [args.raw_dir] + [p(part) for part in ("x", "tx", "allx", "y", "ty",
                                                                  "ally", "graph", "test.index")])

    mats = {}
    for part in ("x", "tx", "allx", "y", "ty", "ally"):
        try:
            mats[part] = dense(load_pickle(p(part)), p(part))
        except (pickle.UnpicklingError, ValueError, EOFError, KeyError) as e:
            sys.exit(f"planetoid_to_h5: {p(part)}: cannot read: {e}")
    graph = load_pickle(p("graph"))
    if not hasattr(graph, "items"):
        sys.exit(f"planetoid_to_h5: {p('graph')}: expected a dict of adjacency lists, "
                 f"got {type(graph).__name__}")
    try:
        test_index = np.loadtxt(p("test.index"), dtype=np.int64, ndmin=1)
    except ValueError as e:
        sys.exit(f"planetoid_to_h5: {p('test.index')}: {e}")

    x, tx, allx = mats["x"], mats["tx"], mats["allx"]
    y, ty, ally = mats["y"], mats["ty"], mats["ally"]
    F = allx.shape[1]
    C = ally.shape[1]
    for name, m, want in (("x", x, F), ("tx", tx, F), ("y", y, C), ("ty", ty, C)):
        if m.shape[1] != want:
            sys.exit(f"planetoid_to_h5: {p(name)}: {m.shape[1]} columns, expected {want}")
    if x.shape[0] != y.shape[0] or allx.shape[0] != ally.shape[0]:
        sys.exit(f"planetoid_to_h5: {args.raw_dir}: x/y or allx/ally row counts disagree")
    if len(test_index) != tx.shape[0] or len(test_index) != ty.shape[0]:
        sys.exit(f"planetoid_to_h5: {p('test.index')}: {len(test_index)} ids but tx has "
                 f"{tx.shape[0]} rows, ty {ty.shape[0]}")

    sorted_test = np.sort(test_index)
    lo, hi = int(sorted_test[0]), int(sorted_test[-1])
    span = hi - lo + 1
    if span != len(test_index):
        # gaps in the test ids (citeseer): pad with zero rows (PyG does the same)
        tx_ext = np.zeros((span, F), np.float32)
        ty_ext = np.zeros((span, C), np.float32)
        tx_ext[sorted_test - lo] = tx
        ty_ext[sorted_test - lo] = ty
        tx, ty = tx_ext, ty_ext

    feats = np.concatenate([allx, tx], axis=0)
    onehot = np.concatenate([ally, ty], axis=0)
    N = feats.shape[0]
    if hi >= N or test_index.min() < 0:
        sys.exit(f"planetoid_to_h5: {p('test.index')}: ids {test_index.min()}..{hi} "
                 f"outside 0..{N - 1}")
    feats[test_index] = feats[sorted_test]
    onehot[test_index] = onehot[sorted_test]
    labels = np.argmax(onehot, axis=1).astype(np.int64)
    labels[onehot.max(axis=1) <= 0] = -1

    rows, cols = [], []
    for k, nbrs in graph.items():
        for v in nbrs:
            rows.append(int(k))
            cols.append(int(v))
    ei = np.array([rows, cols], np.int64).reshape(2, -1)
    if ei.size and (ei.min() < 0 or ei.max() >= N):
        sys.exit(f"planetoid_to_h5: {p('graph')}: node id {ei.max()} outside 0..{N - 1}")
    ei = ei[:, ei[0] != ei[1]]
    if ei.size:
        key = np.unique(ei[0] * N + ei[1])
        ei = np.stack([key // N, key % N]).astype(np.int64)
        rev = np.unique(ei[1] * N + ei[0])
        if len(rev) != len(key) or np.any(rev != key):
            print("planetoid_to_h5: warning: graph is not symmetric; kept as given",
                  file=sys.stderr)

    ntrain = y.shape[0]
    train_mask = np.zeros(N, np.uint8)
    val_mask = np.zeros(N, np.uint8)
    test_mask = np.zeros(N, np.uint8)
    train_mask[:ntrain] = 1
    val_mask[ntrain:min(N, ntrain + args.num_val)] = 1
    test_mask[test_index] = 1

    with atomic_output(args.out) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("features", data=feats, compression="gzip", compression_opts=6,
                         chunks=(min(256, max(1, N)), F) if N and F else None)
        f.create_dataset("labels", data=labels)
        f.create_dataset("edge_index", data=ei)
        f.create_dataset("train_mask", data=train_mask)
        f.create_dataset("val_mask", data=val_mask)
        f.create_dataset("test_mask", data=test_mask)
        f.attrs["num_classes"] = np.int64(C)
        f.attrs["num_nodes"] = np.int64(N)
        f.attrs["source"] = (f"Planetoid split of {args.name} (Yang, Cohen, Salakhutdinov 2016), "
                             f"converted from the ind.{args.name}.* files")
    print(f"planetoid_to_h5: {args.out}: {N} nodes, {F} features, {C} classes, "
          f"{ei.shape[1]} edges, train/val/test {int(train_mask.sum())}/"
          f"{int(val_mask.sum())}/{int(test_mask.sum())}", file=sys.stderr)


if __name__ == "__main__":
    main()
