"""cli_util.py - what the CLI tests share: failing with a message, running
the pipeline binary and checking its exit status, writing an INI, reading a
run's summary.json, a tiny MovieLens-layout file. Imported by the tests in this folder (ctest runs them
with this folder first on sys.path)."""
import json
import os
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(argv, expect=0, env=None, timeout=240):
    """Run argv; fail (with the tail of stdout and stderr) unless it exits `expect`."""
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != expect:
        fail("%s exited %d (expected %d)\nstdout:\n%s\nstderr:\n%s" %
             (" ".join(argv), p.returncode, expect, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def write_ini(path, text):
    with open(path, "w") as f:
        f.write(text)


def write_ilora_ini(path, run_dir, h5, batch_size, eval_batch_size, dim, layers=1, max_len=8,
                    model="", optimizer="lr = 1e-2\n", trainer="max_epochs = 1\n"):
    """A tiny ilora run (name il, seed 1) over make_movielens's file: hdf5_rows
    splits, [model] dim / layers / 2 heads / max_len plus the `model` lines,
    adamw plus the `optimizer` lines, the `trainer` lines."""
    write_ini(path, f"""[pipeline]
name = il
run_dir = {run_dir}
seed = 1
[data]
plugin = hdf5_rows
path = {h5}
datasets = input_ids,labels
val_datasets = input_ids,target,user_index
test_datasets = input_ids,target,user_index
batch_size = {batch_size}
eval_batch_size = {eval_batch_size}
[model]
plugin = ilora
dim = {dim}
layers = {layers}
heads = 2
max_len = {max_len}
{model}[optimizer]
plugin = adamw
{optimizer}[trainer]
{trainer}""")


def summary(run_dir):
    """RUN_DIR/summary.json as a dict."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def make_movielens(path, with_target=True, U=48, N=40, L=8):
    """N items, U users, rows of L: the layout of tools/movielens_to_h5.py.
    A user never sees an item twice, so excluding the input window never
    excludes the target (evaluation keeps the target; predict never looks)."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(0)
    seqs = [rng.permutation(np.arange(1, N + 1))[:rng.integers(6, 12)] for _ in range(U)]

    def rows(s):
        s = s[-(L + 1):]
        x = np.zeros(L, np.int32)
        y = np.zeros(L, np.int32)
        x[L - len(s) + 1:] = s[:-1]
        y[L - len(s) + 1:] = s[1:]
        return x, y

    with h5py.File(path, "w") as f:
        f.attrs["num_items"] = np.int64(N)
        tr = [rows(s[:-2]) for s in seqs]
        g = f.create_group("train")
        g["input_ids"] = np.stack([a for a, _ in tr])
        g["labels"] = np.stack([b for _, b in tr])
        for name, cut in (("val", 1), ("test", 0)):
            g = f.create_group(name)
            x = np.zeros((U, L), np.int32)
            for i, s in enumerate(seqs):
                c = s[:len(s) - cut - 1][-L:]
                x[i, L - len(c):] = c
            g["input_ids"] = x
            if with_target or name != "test":
                g["target"] = np.array([s[len(s) - cut - 1] for s in seqs], np.int32)
            g["user_index"] = np.arange(U, dtype=np.int32)
