#!/usr/bin/env python3
"""molecules_to_h5.py [--seed 20240517] [--target-names TPSA] [--check-tpsa] in.csv out.h5

Convert a CSV of molecules (`SMILES,target[,target...]`, lines starting with
'#' are comments, an optional header row is recognised by a non-numeric
target) into the "many small graphs" HDF5 layout served by the hdf5_graph
loader in `mode = graphs` (the collated storage + slices of PyG's
InMemoryDataset, with CSR offsets instead of slice dicts):

  x           f32 [N_total, F]   atom features (list below), graphs concatenated
  edge_index  i64 [2, E_total]   row 0 source, row 1 target; node ids LOCAL to
                                 each graph; every bond in both directions,
                                 sorted by (source, target) within a graph
  node_ptr    i64 [G+1]          graph g owns x rows node_ptr[g]..node_ptr[g+1]-1
  edge_ptr    i64 [G+1]          graph g owns edge_index columns edge_ptr[g]..edge_ptr[g+1]-1
  y           f32 [G, K]         targets from the CSV (not standardized)
  train_mask, val_mask, test_mask  u8 [G]  seeded random 80/10/10 split
  smiles      str [G]            the input SMILES of each kept molecule
  source_line i64 [G]            1-based CSV line of each kept molecule

Atom features (F = 27, RDKit on the hydrogen-suppressed molecule that
Chem.MolFromSmiles returns; names stored in the `feature_names` attribute):
  0-9   element one-hot: C, N, O, S, F, Cl, Br, I, P, other
  10-15 degree one-hot (atom.GetDegree(), heavy-atom neighbours): 0, 1, 2, 3, 4, 5+
  16    formal charge (atom.GetFormalCharge(), as a float)
  17-21 total hydrogens one-hot (atom.GetTotalNumHs()): 0, 1, 2, 3, 4+
  22    aromatic (atom.GetIsAromatic(): 1.0 / 0.0)
  23-26 hybridization one-hot: SP, SP2, SP3, other (S, SP3D, SP3D2, UNSPECIFIED, ...)

Split: numpy.random.default_rng(seed).permutation(G); the first floor(0.8 G)
graphs of the permutation are train, the next floor(0.1 G) val, the rest test.

Molecules RDKit cannot parse, rows whose target is not a finite number and
molecules without atoms are skipped; the counts are printed and stored
(attributes num_skipped_parse, num_skipped_target, num_skipped_empty).

Needs RDKit, numpy and h5py in the same interpreter. On Debian:
`apt-get install python3-rdkit python3-h5py python3-numpy` and run it with
Debian's /usr/bin/python3 (a pyenv/venv python3 does not see python3-rdkit).
"""
import argparse
import csv
import math
import sys

from convert_out import atomic_output, check_names, refuse_input_as_output

ELEMENTS = ["C", "N", "O", "S", "F", "Cl", "Br", "I", "P"]
DEGREES = [0, 1, 2, 3, 4, 5]  # last bucket = 5 or more
NUM_HS = [0, 1, 2, 3, 4]  # last bucket = 4 or more
HYBRID = ["SP", "SP2", "SP3"]  # + other

FEATURE_NAMES = (
    [f"element={e}" for e in ELEMENTS]
    + ["element=other"]
    + [f"degree={d}" for d in DEGREES[:-1]]
    + ["degree>=5"]
    + ["formal_charge"]
    + [f"total_hs={h}" for h in NUM_HS[:-1]]
    + ["total_hs>=4"]
    + ["aromatic"]
    + [f"hybridization={h}" for h in HYBRID]
    + ["hybridization=other"]
)
NUM_FEATURES = len(FEATURE_NAMES)  # 27
DEFAULT_SEED = 20240517
SPLIT = (0.8, 0.1, 0.1)


def import_deps():
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        from rdkit import Chem  # noqa: F401
    except ImportError as e:
        sys.exit(
            f"molecules_to_h5: {e}. Needs RDKit + numpy + h5py in {sys.executable}; on Debian: "
            "apt-get install python3-rdkit python3-h5py python3-numpy, then run with /usr/bin/python3"
        )


def atom_features(atom):
    from rdkit import Chem

    f = [0.0] * NUM_FEATURES
    sym = atom.GetSymbol()
    f[ELEMENTS.index(sym) if sym in ELEMENTS else len(ELEMENTS)] = 1.0
    o = len(ELEMENTS) + 1
    f[o + min(atom.GetDegree(), DEGREES[-1])] = 1.0
    o += len(DEGREES)
    f[o] = float(atom.GetFormalCharge())
    o += 1
    f[o + min(atom.GetTotalNumHs(), NUM_HS[-1])] = 1.0
    o += len(NUM_HS)
    f[o] = 1.0 if atom.GetIsAromatic() else 0.0
    o += 1
    hyb = {
        Chem.rdchem.HybridizationType.SP: 0,
        Chem.rdchem.HybridizationType.SP2: 1,
        Chem.rdchem.HybridizationType.SP3: 2,
    }.get(atom.GetHybridization(), 3)
    f[o + hyb] = 1.0
    assert o + 4 == NUM_FEATURES
    return f


def mol_graph(mol):
    """(features [n, F] list, sorted local directed edges [(s, t)])."""
    feats = [atom_features(a) for a in mol.GetAtoms()]
    edges = []
    for b in mol.GetBonds():
        i, j = b.GetBeginAtomIdx(), b.GetEndAtomIdx()
        edges += [(i, j), (j, i)]
    edges.sort()
    return feats, edges


def read_rows(path):
    """[(line_no, smiles, [targets] or None)], header names or None."""
    rows, header = [], None
    with open(path, newline="") as fh:
        for line_no, rec in enumerate(csv.reader(fh), start=1):
            if not rec or not rec[0].strip() or rec[0].lstrip().startswith("#"):
                continue
            smi, vals = rec[0].strip(), [v.strip() for v in rec[1:]]
            try:
                ys = [float(v) for v in vals]
            except ValueError:
                ys = None
            if ys is None and header is None and not rows:
                header = vals
                continue
            rows.append((line_no, smi, ys))
    return rows, header


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="split seed (stored as attribute split_seed)")
    ap.add_argument("--target-names", default="", help="comma-separated target names (default: CSV header or y0..)")
    ap.add_argument("--check-tpsa", action="store_true",
                    help="also compute RDKit's TPSA and report how well it agrees with the CSV's first target")
    a = ap.parse_args(argv)
    refuse_input_as_output("molecules_to_h5", a.out, [a.csv])
    import_deps()
    import h5py
    import numpy as np
    import rdkit
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdMolDescriptors

    RDLogger.DisableLog("rdApp.*")
    rows, header = read_rows(a.csv)
    if not rows:
        sys.exit(f"molecules_to_h5: {a.csv}: no molecule rows")
    K = max(len(r[2]) for r in rows if r[2] is not None) if any(r[2] for r in rows) else 0
    if K == 0:
        sys.exit(f"molecules_to_h5: {a.csv}: no numeric target column (expected SMILES,target)")
    if a.target_names:
        names = [n.strip() for n in a.target_names.split(",")]
    elif header and len(header) >= K:
        names = header[:K]
    else:
        names = [f"y{k}" for k in range(K)]
    if len(names) != K:
        sys.exit(f"molecules_to_h5: --target-names has {len(names)} names; the CSV has {K} targets")
    check_names("molecules_to_h5", f"--target-names {a.target_names}" if a.target_names
                else f"{a.csv}:1", names, "target")

    xs, eis, nptr, eptr, ys, smiles, lines = [], [], [0], [0], [], [], []
    skip_parse = skip_target = skip_empty = 0
    tpsa_diff = []
    for line_no, smi, yv in rows:
        if yv is None or len(yv) != K or not all(math.isfinite(v) for v in yv):
            skip_target += 1
            continue
        mol = Chem.MolFromSmiles(smi)
        if mol is None:
            skip_parse += 1
            continue
        if mol.GetNumAtoms() == 0:
            skip_empty += 1
            continue
        feats, edges = mol_graph(mol)
        xs.extend(feats)
        eis.extend(edges)
        nptr.append(nptr[-1] + len(feats))
        eptr.append(eptr[-1] + len(edges))
        ys.append(yv)
        smiles.append(smi)
        lines.append(line_no)
        if a.check_tpsa:
            tpsa_diff.append(abs(rdMolDescriptors.CalcTPSA(mol) - yv[0]))
    G = len(ys)
    if G == 0:
        sys.exit(f"molecules_to_h5: {a.csv}: no molecule could be converted")
    x = np.asarray(xs, dtype=np.float32).reshape(-1, NUM_FEATURES)
    ei = np.asarray(eis, dtype=np.int64).reshape(-1, 2).T.copy()
    y = np.asarray(ys, dtype=np.float32).reshape(G, K)
    perm = np.random.default_rng(a.seed).permutation(G)
    n_tr, n_va = int(math.floor(SPLIT[0] * G)), int(math.floor(SPLIT[1] * G))
    masks = {}
    for name, sel in (("train_mask", perm[:n_tr]), ("val_mask", perm[n_tr:n_tr + n_va]),
                      ("test_mask", perm[n_tr + n_va:])):
        m = np.zeros(G, dtype=np.uint8)
        m[sel] = 1
        masks[name] = m

    def dset(f, name, data, chunk_rows):
        kw = {}
        if data.size:
            chunks = (min(data.shape[0], chunk_rows),) + data.shape[1:]
            if name == "edge_index":
                chunks = (2, min(data.shape[1], chunk_rows))
            kw = dict(compression="gzip", compression_opts=6, chunks=chunks)
        return f.create_dataset(name, data=data, **kw)

    with atomic_output(a.out) as tmp, h5py.File(tmp, "w") as f:
        dset(f, "x", x, 4096)
        dset(f, "edge_index", ei, 65536)
        dset(f, "node_ptr", np.asarray(nptr, dtype=np.int64), 65536)
        dset(f, "edge_ptr", np.asarray(eptr, dtype=np.int64), 65536)
        dset(f, "y", y, 65536)
        for k, m in masks.items():
            dset(f, k, m, 65536)
        f.create_dataset("smiles", data=np.array(smiles, dtype=object), dtype=h5py.string_dtype())
        dset(f, "source_line", np.asarray(lines, dtype=np.int64), 65536)
        f.attrs["num_graphs"] = G
        f.attrs["num_features"] = NUM_FEATURES
        f.attrs["num_targets"] = K
        f.attrs["num_nodes"] = x.shape[0]
        f.attrs["num_edges"] = ei.shape[1]
        f.attrs["feature_names"] = np.array(FEATURE_NAMES, dtype=object).astype(h5py.string_dtype())
        f.attrs["target_names"] = np.array(names, dtype=object).astype(h5py.string_dtype())
        f.attrs["split_seed"] = a.seed
        f.attrs["split_rule"] = ("numpy.random.default_rng(split_seed).permutation(G): first floor(0.8G) train, "
                                 "next floor(0.1G) val, rest test")
        f.attrs["source"] = a.csv
        f.attrs["converter"] = f"tools/molecules_to_h5.py (RDKit {rdkit.__version__})"
        f.attrs["num_skipped_parse"] = skip_parse
        f.attrs["num_skipped_target"] = skip_target
        f.attrs["num_skipped_empty"] = skip_empty
    print(f"molecules_to_h5: {a.out}: {G} graphs ({x.shape[0]} atoms, {ei.shape[1]} directed edges, "
          f"F = {NUM_FEATURES}, K = {K}); split {n_tr}/{n_va}/{G - n_tr - n_va}; skipped {skip_parse} "
          f"unparseable, {skip_target} bad target, {skip_empty} empty", file=sys.stderr)
    if a.check_tpsa:
        d = np.asarray(tpsa_diff)
        print(f"molecules_to_h5: RDKit CalcTPSA vs CSV: {int((d <= 0.01).sum())}/{G} within 0.01, "
              f"max |diff| {d.max():.3f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
