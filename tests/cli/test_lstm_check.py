#!/usr/bin/env python3
"""test_lstm_check.py - the LSTM's options checked against [data] at
`pipeline check` time (plugins/models/lstm/README.md, "Checks against the
data"), on a small series whose target is NOT the first column:
  - naive_column is derived from target_columns: a run without it reports
    the seasonal naive (and corrected) MAE of the target's own column,
    recomputed here with numpy from the file;
  - an explicit naive_column that disagrees with the target is refused by
    `check` naming both options (exit 2);
  - the target left out of feature_columns is refused;
  - seasonal_period longer than [data] window is refused naming both values,
    and naive_skip = corrected with a period equal to the window too;
  - exogenous_gate = true on a one-column input is a warning, and the run
    goes through.
usage: test_lstm_check.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import os
import sys
import tempfile

import h5py
import numpy as np

from cli_util import fail, run, summary, write_ini

T, W, S = 200, 14, 7


def make_series(path):
    """temp (noise), ridership (weekly cycle + trend), one row a day from 2013-10-22."""
    rng = np.random.default_rng(3)
    t = np.arange(T)
    temp = 5 + rng.normal(0, 1, T)
    ride = 100 + 0.1 * t + 20 * np.sin(2 * np.pi * t / S) + rng.normal(0, 3, T)
    with h5py.File(path, "w") as f:
        f["series"] = np.stack([temp, ride], 1).astype(np.float32)
        f["date"] = (16000 + t).astype(np.int64)
        f["columns"] = np.array(["temp", "ridership"], dtype=h5py.string_dtype())
    return ride.astype(np.float32).astype(np.float64)


def config(tmp, h5, model_extra=""):
    return f"""[pipeline]
name = lc
run_dir = {tmp}/runs
seed = 1
[data]
plugin = hdf5_series
path = {h5}
window = {W}
horizon = 1
target_columns = ridership
standardize = true
train_end = 2014-03-10
val_end = 2014-04-09
batch_size = 16
[model]
plugin = lstm
hidden_size = 4
seasonal_period = {S}
{model_extra}
[optimizer]
plugin = adamw
lr = 1e-2
[trainer]
max_epochs = 1
monitor = val_mae
"""


def refused(exe, ini, overrides, *needles):
    p = run([exe, "check", ini] + overrides, expect=2)
    for n in needles:
        if n not in p.stderr:
            fail("check %s: stderr lacks %r:\n%s" % (" ".join(overrides), n, p.stderr[-2000:]))
    print("refused (%s): %s" % (" ".join(overrides),
                                [l for l in p.stderr.splitlines() if "error" in l][0][:160]))


def main():
    exe = os.path.join(os.path.abspath(sys.argv[1]), "core", "pipeline")
    with tempfile.TemporaryDirectory(prefix="pl_test_lstm_check_") as tmp:
        h5 = os.path.join(tmp, "s.h5")
        ride = make_series(h5)
        ini = os.path.join(tmp, "lc.ini")
        write_ini(ini, config(tmp, h5))

        # derived naive_column: the metrics read column 1 (ridership), not 0
        run([exe, "check", ini])
        run([exe, "run", ini])
        tm = summary(os.path.join(tmp, "runs", "lc", "latest"))["test_metrics"]
        # test windows: target rows after val_end (2014-04-09 = day 16000 + 170)
        rows = np.arange(T)[(16000 + np.arange(T)) > 16000 + 169]
        rows = rows[rows >= W]
        naive = np.abs(ride[rows - S] - ride[rows]).mean()
        corr = np.abs(ride[rows - S] + ride[rows - 1] - ride[rows - 1 - S] - ride[rows]).mean()
        for k, want in (("seasonal_naive_mae", naive), ("seasonal_naive_corrected_mae", corr)):
            got = tm.get(k)
            if got is None or abs(got - want) > 1e-3 * max(1.0, want):
                fail("%s = %s, numpy on the ridership column gives %.6f (test_metrics %s)" %
                     (k, got, want, tm))
            print("%s = %.5f (numpy %.5f)" % (k, got, want))

        # an explicit naive_column that disagrees with the target
        refused(exe, ini, ["model.naive_column=0"], "naive_column = 0 (command line)",
                "target_columns = ridership", "input column 1")
        run([exe, "check", ini, "model.naive_column=1"])
        # the target not among the inputs
        refused(exe, ini, ["data.feature_columns=temp"], "target_columns = ridership",
                "feature_columns = temp")
        # the period must fit the window
        refused(exe, ini, ["model.seasonal_period=%d" % (W + 1)], "seasonal_period = %d" % (W + 1),
                "window = %d" % W)
        run([exe, "check", ini, "model.seasonal_period=%d" % W])
        refused(exe, ini, ["model.seasonal_period=%d" % W, "model.naive_skip=corrected"],
                "naive_skip = corrected", "window = %d" % W)
        # exogenous_gate on one column: a warning, and the run works
        one = ["data.feature_columns=ridership", "model.exogenous_gate=true"]
        p = run([exe, "check", ini] + one)
        if "warning: exogenous_gate = true" not in p.stdout + p.stderr:
            fail("check %s: no warning about the gate:\n%s%s" % (one, p.stdout[-1500:], p.stderr))
        run([exe, "run", ini] + one)

        # an optimizer group whose pattern or tags select no parameter (a typo): check
        # builds the model and warns naming the group; a group that selects warns not
        p = run([exe, "check", ini, "optimizer.group.heda.match=heda.*",
                 "optimizer.group.heda.lr_scale=0.5"])
        out = p.stdout + p.stderr
        if "group 'heda' selects no trainable parameter" not in out or \
                "optimizer groups checked" not in out:
            fail("check with a group matching nothing: no warning naming it:\n" + out[-2000:])
        p = run([exe, "check", ini, "optimizer.group.head.match=head.*",
                 "optimizer.group.head.lr_scale=0.5"])
        out = p.stdout + p.stderr
        if "selects no trainable parameter" in out or "optimizer groups checked" not in out:
            fail("check with a group matching the head: a warning, or no check:\n" + out[-2000:])
        print("optimizer groups: a group matching nothing is warned about at check time")
    print("OK")


if __name__ == "__main__":
    main()
