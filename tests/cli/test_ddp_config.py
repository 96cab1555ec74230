"""test_ddp_config.py - data-parallel ranks must run the same configuration on
the same data (issue 34, class 7): only the initial parameters were compared,
so a rank with another `lr`, or another data file of the same shape, trained
on and silently diverged (exit 0). Each case starts two ranks with MPMD
(`mpirun -np 1 ... : -np 1 ...`) on the shipped LSTM config and a small
synthetic series:

- another lr on rank 1: every rank exits 2 before making the run directory,
  naming [optimizer] lr and both values with their origins;
- another optimizer plugin: the first differing key is [optimizer] plugin;
- another data file of the same shape (one value changed): [data] path is
  named with both files' sizes and fingerprints;
- the same data under another path (a copy), with other threads and verbose
  (per-rank keys): the run goes through, data parallel.

usage: test_ddp_config.py BUILD_DIR   (ctest runs it; skips, exit 77, when MPI
cannot start, as test_ddp.py)
"""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py

from cli_util import fail
from test_ddp import mpi_env, mpi_or_skip
from test_predict import make_series

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def two_ranks(mpirun, exe, common, rank0, rank1):
    argv = ([mpirun, "-np", "1", exe, "run"] + common + rank0 +
            [":", "-np", "1", exe, "run"] + common + rank1)
    return subprocess.run(argv, capture_output=True, text=True, env=mpi_env(), timeout=300)


def refused(p, what, needles, run_dir):
    out = p.stdout + p.stderr
    if p.returncode != 2:
        fail("%s: mpirun exited %d, expected 2 (configuration error)\n%s" %
             (what, p.returncode, out[-3000:]))
    for n in needles:
        if n not in out:
            fail("%s: '%s' not in the output:\n%s" % (what, n, out[-3000:]))
    if out.count("runs another configuration than rank 0") != 2:
        fail("%s: not both ranks stopped with the message:\n%s" % (what, out[-3000:]))
    if os.path.exists(run_dir):
        fail("%s: %s was made; a refused configuration makes no run directory" % (what, run_dir))
    print("%s: refused (exit 2) naming %s" % (what, needles[0]))


def main():
    build = os.path.abspath(sys.argv[1])
    exe = os.path.join(build, "core", "pipeline")
    mpirun = mpi_or_skip(build)
    tmp = tempfile.mkdtemp(prefix="pl_ddp_config_")
    os.chdir(ROOT)
    try:
        series, other, copy = (os.path.join(tmp, n) for n in ("s.h5", "other.h5", "copy.h5"))
        make_series(series, T=400)
        make_series(other, T=400)
        with h5py.File(other, "a") as f:  # same shape, one value changed
            f["series"][5, 0] += 1.0
        shutil.copyfile(series, copy)
        runs = os.path.join(tmp, "runs")
        common = ["configs/lstm_chicago.ini", "data.feature_columns=",
                  "data.train_end=2014-06-30", "data.val_end=2014-09-30", "data.drop_last=true",
                  "data.batch_size=16", "model.hidden_size=8", "model.dropout=0",
                  "trainer.max_epochs=1", "pipeline.run_dir=" + runs]

        p = two_ranks(mpirun, exe, common, ["data.path=" + series, "optimizer.lr=0.01"],
                      ["data.path=" + series, "optimizer.lr=0.02"])
        refused(p, "another lr", ["[optimizer] lr = 0.02 (command line) on rank 1",
                                  "[optimizer] lr = 0.01 (command line) on rank 0"], runs)

        p = two_ranks(mpirun, exe, common, ["data.path=" + series],
                      ["data.path=" + series, "optimizer.plugin=sgd"])
        refused(p, "another optimizer", ["[optimizer] plugin = sgd", "[optimizer] plugin = adam"],
                runs)

        p = two_ranks(mpirun, exe, common, ["data.path=" + series], ["data.path=" + other])
        refused(p, "another data file", ["[data] path = %s (command line; file " % other,
                                         "[data] path = %s (command line; file " % series], runs)

        p = two_ranks(mpirun, exe, common, ["data.path=" + series, "pipeline.threads=2"],
                      ["data.path=" + copy, "pipeline.threads=1", "pipeline.verbose=true"])
        out = p.stdout + p.stderr
        if p.returncode != 0 or "strategy ddp: 2 processes" not in out:
            fail("a copy of the data, other threads and verbose: mpirun exited %d\n%s" %
                 (p.returncode, out[-3000:]))
        print("a copy of the data under another path, other threads and verbose: runs")
        print("ddp_config: OK")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
