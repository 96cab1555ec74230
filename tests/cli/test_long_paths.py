#!/usr/bin/env python3
"""test_long_paths.py - paths longer than ~190 bytes (issue 34): the INI
parser read lines into inih's 200-byte buffer ("line too long", with a wrong
byte count), and command-line overrides were refused past 198 bytes, so a
data file or run directory under a deep folder could not be named at all.
Here a 600+-byte data path and run directory are given in the INI, then on
the command line, and the run's own config.ini (lines of 600+ bytes) is run
again with `pipeline run RUN/config.ini`; every run ends ok and reads the
file named. `pipeline.run_dir=` (empty: runs went to /NAME/... at the
filesystem root) is refused.
usage: test_long_paths.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import os
import shutil
import sys
import tempfile

from cli_util import fail, run, summary, write_ini
from test_predict import make_series

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LSTM = ["data.feature_columns=", "data.train_end=2014-06-30", "data.val_end=2014-09-30",
        "model.hidden_size=8", "trainer.max_epochs=1"]


def only_run(base, name):
    d = os.path.join(base, name)
    runs = sorted(x for x in os.listdir(d) if x[0].isdigit())
    if len(runs) != 1:
        fail("%s: %d run directories, expected 1" % (d, len(runs)))
    return os.path.join(d, runs[0])


def main():
    exe = os.path.join(os.path.abspath(sys.argv[1]), "core", "pipeline")
    tmp = tempfile.mkdtemp(prefix="pl_long_")
    os.chdir(ROOT)
    try:
        deep = tmp
        while len(deep) < 600:
            deep = os.path.join(deep, "d" * 48)
        os.makedirs(deep)
        data = os.path.join(deep, "s.h5")
        make_series(data, T=400)
        with open("configs/lstm_chicago.ini") as f:
            text = "".join("path = %s\n" % data if l.split("=")[0].strip() == "path" else l
                           for l in f)
        ini = os.path.join(tmp, "t.ini")
        write_ini(ini, text.replace("[pipeline]\n", "[pipeline]\nrun_dir = %s\n" %
                                    os.path.join(deep, "runs_ini"), 1))
        if max(len(l) for l in open(ini)) < 600:
            fail("the INI has no 600-byte line")
        run([exe, "run", ini] + LSTM)
        r = only_run(os.path.join(deep, "runs_ini"), "lstm_chicago")
        if summary(r)["status"] != "ok":
            fail("run from the INI: %r" % summary(r))
        print("a %d-byte data path and run_dir in the INI: run ok" % len(data))

        base = os.path.join(deep, "runs_cli")
        run([exe, "run", "configs/lstm_chicago.ini", "data.path=" + data,
             "pipeline.run_dir=" + base] + LSTM)
        r = only_run(base, "lstm_chicago")
        print("the same on the command line: run ok")
        cfg = os.path.join(r, "config.ini")
        if max(len(l) for l in open(cfg)) < 600:
            fail("the run's config.ini has no 600-byte line")
        p = run([exe, "run", cfg])
        if "summary" not in p.stdout:
            fail("pipeline run RUN/config.ini:\n" + p.stdout[-2000:])
        print("the run's config.ini (600-byte lines) runs again")

        p = run([exe, "run", "configs/lstm_chicago.ini", "pipeline.run_dir=", "data.path=" + data]
                + LSTM, expect=2)
        if "run_dir is empty" not in p.stderr:
            fail("pipeline.run_dir= : " + p.stderr[-2000:])
        print("an empty run_dir is refused")
        print("long_paths: OK")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
