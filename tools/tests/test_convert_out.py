#!/usr/bin/env python3
"""The output discipline of every converter in tools/ (tools/convert_out.py,
issue 34), on small hand-made inputs:

- an output that is, or resolves to, an input (the same path, another
  spelling, a symlink, a hard link; for planetoid_to_h5 one of the raw files)
  is refused and the input is left byte for byte as it was;
- a write failing half-way (a full disk, simulated by an OSError raised from
  h5py's create_dataset) leaves the previous output intact and no temporary
  file behind (movielens_to_h5, stocks_to_h5; csv_to_h5 in its own test);
- repeated or empty column names are refused naming the positions
  (movielens_to_h5, stocks_to_h5; csv_to_h5 in its own test).

molecules_to_h5 and planetoid_to_h5 refuse the output before importing RDKit
or reading the pickles, so those checks run without them."""
import os
import subprocess
import sys
import tempfile

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.normpath(os.path.join(HERE, ".."))
FAILS = []

FAIL_WRITE = """
import h5py, os, runpy, sys
orig = h5py.Group.create_dataset
def full_disk(self, name, *a, **k):
    if len(self.file.keys()) >= 1:  # the second dataset: the file is half written
        raise OSError(28, "No space left on device")
    return orig(self, name, *a, **k)
h5py.Group.create_dataset = full_disk
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def run(tool, *args, fail_write=False):
    path = os.path.join(TOOLS, tool)
    cmd = [sys.executable, "-c", FAIL_WRITE, path, *args] if fail_write else [sys.executable,
                                                                              path, *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def read(path):
    with open(path, "rb") as f:
        return f.read()


def movielens_csv(d, name="r.csv", header="userId,movieId,rating,timestamp"):
    rows = [f"{u},{10 + (u * 7 + i) % 9},3,{u * 100 + i}" for u in range(1, 5) for i in range(6)]
    return write(os.path.join(d, name), header + "\n" + "\n".join(rows) + "\n")


def stocks_csv(d, name="p.csv", header="date,AAA,BBB"):
    import datetime as dt
    day = dt.date(2001, 1, 1)
    lines = [header]
    for i in range(60):
        lines.append(f"{(day + dt.timedelta(days=i)).isoformat()},{10 + i % 7 + i * 0.1:.3f},"
                     f"{20 + (i * 3) % 5 + i * 0.05:.3f}")
    return write(os.path.join(d, name), "\n".join(lines) + "\n")


def refuses_input_as_output(d, tool, inp, *extra, inputs=None):
    """out == inp in four spellings; inputs: files whose bytes must not change."""
    inputs = inputs or [inp]
    before = {p: read(p) for p in inputs}
    link, hard = os.path.join(d, "link.h5"), os.path.join(d, "hard.h5")
    os.symlink(inputs[0], link)
    os.link(inputs[0], hard)
    dot = os.path.join(os.path.dirname(inputs[0]), ".", os.path.basename(inputs[0]))
    for out in (inputs[0], dot, link, hard):
        r = run(tool, *extra, inp, out)
        check(r.returncode != 0 and "is the input" in r.stderr,
              f"{tool}: output {out} (an input) not refused: rc {r.returncode} {r.stderr[-300:]}")
    for p, b in before.items():
        check(read(p) == b, f"{tool}: input {p} changed")
    os.unlink(link)
    os.unlink(hard)


def failed_write_keeps_previous(d, tool, good, other, *extra):
    sub = os.path.join(d, "out_" + tool)
    os.mkdir(sub)
    out = os.path.join(sub, "o.h5")
    r = run(tool, *extra, good, out)
    check(r.returncode == 0, f"{tool}: conversion failed: {r.stderr[-300:]}")
    before = read(out)
    r = run(tool, *extra, other, out, fail_write=True)
    check(r.returncode != 0 and "No space left on device" in r.stderr,
          f"{tool}: simulated full disk not reported: rc {r.returncode} {r.stderr[-300:]}")
    check(read(out) == before, f"{tool}: the previous output changed after a failed write")
    check(os.listdir(sub) == ["o.h5"], f"{tool}: left behind {os.listdir(sub)}")
    with h5py.File(out) as f:
        check(len(f.keys()) > 0, f"{tool}: previous output unreadable")


def main():
    with tempfile.TemporaryDirectory() as d:
        # csv_to_h5 (the rest of its checks: test_csv_to_h5.py)
        p = write(os.path.join(d, "c.csv"), "date,v\n2001-01-01,1\n")
        refuses_input_as_output(d, "csv_to_h5.py", p)

        p = movielens_csv(d)
        refuses_input_as_output(d, "movielens_to_h5.py", p)
        q = movielens_csv(d, "r2.csv")
        with open(q, "a") as f:
            f.write("5,10,3,1\n5,11,3,2\n5,12,3,3\n")
        failed_write_keeps_previous(d, "movielens_to_h5.py", p, q)
        for header, want in (("userId,movieId,rating,movieId", "columns 2 and 4 are both named"),
                             ("userId,movieId,,timestamp", "column 3 has an empty name")):
            r = run("movielens_to_h5.py", movielens_csv(d, "bad.csv", header),
                    os.path.join(d, "bad.h5"))
            check(r.returncode != 0 and want in r.stderr and "bad.csv:1" in r.stderr,
                  f"movielens_to_h5: header {header}: {r.stderr[-300:]}")

        p = stocks_csv(d)
        refuses_input_as_output(d, "stocks_to_h5.py", p)
        failed_write_keeps_previous(d, "stocks_to_h5.py", p, stocks_csv(d, "p2.csv"))
        r = run("stocks_to_h5.py", stocks_csv(d, "bad.csv", "date,AAA,"), os.path.join(d, "b.h5"))
        check(r.returncode != 0 and "column 3 has an empty name" in r.stderr,
              f"stocks_to_h5: empty ticker name: {r.stderr[-300:]}")

        # refused before RDKit is imported
        p = write(os.path.join(d, "m.csv"), "smiles,y\nCCO,1.0\n")
        refuses_input_as_output(d, "molecules_to_h5.py", p)

        # planetoid: any of the raw files, or the folder
        raw = os.path.join(d, "raw")
        os.mkdir(raw)
        parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
        files = [write(os.path.join(raw, f"ind.cora.{part}"), part) for part in parts]
        for target in (files[0], files[6], files[7]):
            r = run("planetoid_to_h5.py", raw, target)
            check(r.returncode != 0 and "is the input" in r.stderr,
                  f"planetoid_to_h5: output {target} not refused: {r.stderr[-300:]}")
        r = run("planetoid_to_h5.py", raw, raw)
        check(r.returncode != 0 and "is a directory" in r.stderr,
              f"planetoid_to_h5: the raw folder as output not refused: {r.stderr[-300:]}")
        check([read(f) for f in files] == [p.encode() for p in parts], "planetoid: input changed")
    if FAILS:
        sys.exit(f"test_convert_out: {len(FAILS)} failures")
    print("test_convert_out: OK")


if __name__ == "__main__":
    main()
