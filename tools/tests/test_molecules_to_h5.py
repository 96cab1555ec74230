#!/usr/bin/env python3
"""Test tools/molecules_to_h5.py on a tiny hand-made CSV.

Expected graphs are worked out by hand from chemistry, not from RDKit:
ethanol CCO (3 heavy atoms, 2 bonds), benzene (6 aromatic sp2 CH atoms, 6
bonds), sodium chloride [Na+].[Cl-] (2 ions, no bond), plus a comment line,
an unparseable SMILES and a non-numeric target that must be skipped.

The converter needs RDKit, which on Debian lives in /usr/bin/python3
(python3-rdkit): this script runs the converter under the first
interpreter that has RDKit + numpy + h5py and exits 77 (ctest: skipped)
when none has.
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "molecules_to_h5.py")

CSV = """# tiny test set
smiles,logp
CCO,-0.31
c1ccccc1,2.13
not_a_smiles((,1.0
[Na+].[Cl-],0.5
CC,nan
"""


def interpreter():
    for cand in (os.environ.get("PYTHON"), sys.executable, "/usr/bin/python3"):
        if cand and os.path.exists(cand) and subprocess.run(
                [cand, "-c", "import rdkit, numpy, h5py"], capture_output=True).returncode == 0:
            return cand
    return None


def feat(names, row, name):
    return row[names.index(name)]


def main():
    py = interpreter()
    if py is None:
        if os.environ.get("CI") == "true":  # .ci/run installs RDKit: missing it there is a failure
            print("FAIL: CI=true but no python3 with RDKit + numpy + h5py")
            return 1
        print("SKIP: no python3 with RDKit + numpy + h5py (Debian: apt-get install python3-rdkit)")
        return 77
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "m.csv"), os.path.join(d, "m.h5")
        with open(src, "w") as f:
            f.write(CSV)
        p = subprocess.run([py, TOOL, src, out], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        with h5py.File(out) as f:
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in f.attrs["feature_names"]]
            x, ei = f["x"][:], f["edge_index"][:]
            nptr, eptr, y = f["node_ptr"][:], f["edge_ptr"][:], f["y"][:]
            masks = [f[s + "_mask"][:] for s in ("train", "val", "test")]
            assert int(f.attrs["num_skipped_parse"]) == 1, dict(f.attrs)
            assert int(f.attrs["num_skipped_target"]) == 1, dict(f.attrs)
    assert len(names) == x.shape[1] == 27
    # three kept molecules, in file order
    assert list(nptr) == [0, 3, 9, 11], nptr
    assert list(eptr) == [0, 4, 16, 16], eptr
    np.testing.assert_allclose(y[:, 0], [-0.31, 2.13, 0.5], rtol=1e-6)
    # every graph's edges are local ids, both directions of each bond
    for g in range(3):
        n = nptr[g + 1] - nptr[g]
        e = ei[:, eptr[g]:eptr[g + 1]]
        assert e.size == 0 or (e.min() >= 0 and e.max() < n), (g, e)
        pairs = set(map(tuple, e.T))
        assert all((b, a) in pairs for a, b in pairs), (g, pairs)
    # ethanol C-C-O: a chain 0-1-2
    assert set(map(tuple, ei[:, 0:4].T)) == {(0, 1), (1, 0), (1, 2), (2, 1)}
    c0, c1, o2 = x[0], x[1], x[2]
    assert feat(names, c0, "element=C") == 1 and feat(names, o2, "element=O") == 1
    assert feat(names, c0, "degree=1") == 1 and feat(names, c1, "degree=2") == 1 and feat(names, o2, "degree=1") == 1
    assert feat(names, c0, "total_hs=3") == 1 and feat(names, c1, "total_hs=2") == 1 and feat(names, o2, "total_hs=1") == 1
    assert feat(names, c1, "hybridization=SP3") == 1 and feat(names, c1, "aromatic") == 0
    # benzene: 6 aromatic sp2 carbons with one H and two ring neighbours, a 6-cycle
    for a in x[3:9]:
        assert feat(names, a, "element=C") == 1 and feat(names, a, "aromatic") == 1
        assert feat(names, a, "hybridization=SP2") == 1 and feat(names, a, "degree=2") == 1
        assert feat(names, a, "total_hs=1") == 1
    deg = np.bincount(ei[0, 4:16], minlength=6)
    assert list(deg) == [2] * 6, deg
    # NaCl: two charged ions, no bond; sodium is "other" among the elements
    na, cl = x[9], x[10]
    assert feat(names, na, "element=other") == 1 and feat(names, na, "formal_charge") == 1
    assert feat(names, cl, "element=Cl") == 1 and feat(names, cl, "formal_charge") == -1
    assert feat(names, na, "degree=0") == 1
    # the split covers every graph exactly once
    assert (sum(m.astype(int) for m in masks) == 1).all(), masks
    print("ok: 3 molecules, features, local edges, skips, split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
