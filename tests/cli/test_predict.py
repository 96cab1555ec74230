#!/usr/bin/env python3
"""test_predict.py - `pipeline predict RUN_DIR INPUT.h5 OUT.h5` on tiny runs.

Trains two tiny runs (seconds each) and checks that predict reproduces what
the run's own test evaluation computed, recomputed from OUT.h5 alone:
  - ilora: HR@10 from top_items and the targets == summary.json
    test_metrics hit_ratio@10; the same rows WITHOUT targets (no /test/target)
    give the same top_items;
  - lstm (series, standardized): MAE of forecast vs target == test_mae; a
    new file holding only the tail of the series (whose own statistics
    differ from the run's) gives the same forecasts, so the run's
    standardization is the one used;
  - OUT.h5 attributes (run_dir, checkpoint, config_hash, model, split) and
    no temporary file left behind;
  - errors: a missing run directory, an input file without the dataset the
    model needs (the message names the file and the field), exit codes 2 / 1.
gat and mlp: tests/cli/test_predict_gat_mlp.py (also a model without predict).
usage: test_predict.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

from cli_util import fail, make_movielens, run, summary, write_ilora_ini, write_ini






def make_series(path, T=200):
    """Two columns (ridership with a weekly cycle, temp), one row a day from 2013-10-22."""
    rng = np.random.default_rng(0)
    t = np.arange(T)
    a = 100 + 20 * np.sin(2 * np.pi * t / 7) + rng.normal(0, 3, T)
    b = 5 + rng.normal(0, 1, T)
    with h5py.File(path, "w") as f:
        f["series"] = np.stack([a, b], 1).astype(np.float32)
        f["date"] = (16000 + t).astype(np.int64)
        f["columns"] = np.array(["ridership", "temp"], dtype=h5py.string_dtype())






def check_attrs(out, run_dir, model):
    with h5py.File(out) as f:
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    for k in ("run_dir", "checkpoint", "config_hash", "model", "split", "input"):
        if k not in a:
            fail("%s: attribute %s missing (has %s)" % (out, k, sorted(a)))
    if a["model"] != model or a["split"] != "test" or len(a["config_hash"]) != 16:
        fail("%s: attributes %r" % (out, a))
    if os.path.realpath(a["run_dir"]) != os.path.realpath(run_dir):
        fail("%s: run_dir %s, expected %s" % (out, a["run_dir"], run_dir))
    if not a["checkpoint"].endswith("best.safetensors"):
        fail("%s: checkpoint %s, expected the best one" % (out, a["checkpoint"]))
    left = [n for n in os.listdir(os.path.dirname(out)) if ".tmp." in n]
    if left:
        fail("temporary files left: %s" % left)


def test_ilora(exe, tmp):
    h5 = os.path.join(tmp, "ml.h5")
    make_movielens(h5)
    ini = os.path.join(tmp, "il.ini")
    write_ilora_ini(ini, f"{tmp}/runs", h5, 8, 10, dim=16,
                    trainer="max_epochs = 2\nmonitor = val_ndcg@10\nmode = max\n")
    run([exe, "run", ini])
    rd = os.path.join(tmp, "runs", "il", "latest")
    want = summary(rd)["test_metrics"]["hit_ratio@10"]
    out = os.path.join(tmp, "il_pred.h5")
    run([exe, "predict", rd, h5, out])
    check_attrs(out, rd, "ilora")
    with h5py.File(out) as f:
        top, tg, row, users = f["top_items"][:], f["target"][:], f["row"][:], f["user_index"][:]
    if top.shape != (48, 10) or not np.array_equal(row, np.arange(48)) \
            or not np.array_equal(users, np.arange(48)):
        fail("ilora: top_items %s, row %s, user_index %s" % (top.shape, row[:5], users[:5]))
    hr = float(np.mean([tg[i] in top[i] for i in range(len(tg))]))
    if abs(hr - want) > 1e-12:
        fail("ilora: HR@10 from OUT.h5 %.6f != the run's test_hit_ratio@10 %.6f" % (hr, want))
    print("ilora: HR@10 recomputed from OUT.h5 = %.6f = test_hit_ratio@10" % hr)

    # the same rows, no targets: predictions do not depend on them
    h5n = os.path.join(tmp, "ml_new.h5")
    make_movielens(h5n, with_target=False)
    outn = os.path.join(tmp, "il_new.h5")
    run([exe, "predict", rd, h5n, outn, "model.predict_top_k=5"])
    with h5py.File(outn) as f:
        if "target" in f:
            fail("ilora: a file without targets gave a target dataset")
        if not np.array_equal(f["top_items"][:], top[:, :5]):
            fail("ilora: predictions without targets differ from those with targets")
    print("ilora: a file without targets predicts the same top items")

    # on a device (strict, the GPU stand-in) the top-k is taken there (ilora's
    # ranking.c, ilora_topk_device) and only [B, k] comes back: the same bytes as
    # the CPU's, with the history field as the exclusions and with none; k = all
    # 40 items, so excluded items (-inf, lower id first) are among the picks
    h5h = os.path.join(tmp, "ml_hist.h5")
    shutil.copy(h5, h5h)
    with h5py.File(h5h, "a") as f:
        f["test/history"] = f["test/input_ids"][:]
    names = ("top_items", "top_scores", "row", "user_index", "target")
    for extra in ([], ["model.exclude_history=false"]):
        got = {}
        for dev in ("cpu", "strict"):
            o = os.path.join(tmp, "il_%s.h5" % dev)
            run([exe, "predict", rd, h5h, o, "pipeline.device=" + dev, "model.predict_top_k=40",
                 "data.test_datasets=input_ids,target,user_index,history"] + extra)
            with h5py.File(o) as f:
                got[dev] = [f[n][:] for n in names]
        for n, a, b in zip(names, got["cpu"], got["strict"]):
            if a.dtype != b.dtype or a.tobytes() != b.tobytes():
                fail("ilora %s: predict's %s on strict differs from the CPU's" % (extra, n))
    print("ilora: predict on a device (strict) writes the CPU's bytes (history field; no exclusions)")

    # errors: no such run; an input without the ids the model reads; a model without predict
    p = run([exe, "predict", os.path.join(tmp, "no_such_run"), h5, out], expect=2)
    if "no_such_run" not in p.stderr:
        fail("missing run dir: message does not name it:\n" + p.stderr)
    bad = os.path.join(tmp, "no_ids.h5")
    with h5py.File(bad, "w") as f:
        f.attrs["num_items"] = np.int64(40)
        f["test/target"] = np.arange(1, 5, dtype=np.int32)
    p = run([exe, "predict", rd, bad, os.path.join(tmp, "x.h5")], expect=1)
    if bad not in p.stderr or "input_ids" not in p.stderr:
        fail("input without input_ids: message names neither file nor field:\n" + p.stderr)
    if os.path.exists(os.path.join(tmp, "x.h5")):
        fail("a failed predict left OUT.h5")
    print("ilora: errors name the missing run dir, the input file and field")



def test_lstm(exe, tmp):
    h5 = os.path.join(tmp, "s.h5")
    make_series(h5)
    ini = os.path.join(tmp, "ls.ini")
    write_ini(ini, f"""[pipeline]
name = ls
run_dir = {tmp}/runs
seed = 1
[data]
plugin = hdf5_series
path = {h5}
window = 14
horizon = 2
target_columns = ridership
standardize = true
train_end = 2014-03-10
val_end = 2014-04-09
batch_size = 16
eval_batch_size = 8
[model]
plugin = lstm
hidden_size = 8
[optimizer]
plugin = adamw
lr = 1e-2
[trainer]
max_epochs = 2
monitor = val_mae
""")
    run([exe, "run", ini])
    rd = os.path.join(tmp, "runs", "ls", "latest")
    want = summary(rd)["test_metrics"]["mae"]
    out = os.path.join(tmp, "ls_pred.h5")
    run([exe, "predict", rd, h5, out])
    check_attrs(out, rd, "lstm")
    with h5py.File(out) as f:
        fc, tg = f["forecast"][:], f["target"][:]
    if fc.shape != (30, 2, 1) or tg.shape != fc.shape:
        fail("lstm: forecast %s target %s, expected (30, 2, 1)" % (fc.shape, tg.shape))
    mae = float(np.abs(fc.astype(np.float64) - tg).mean())
    if abs(mae - want) > 1e-4 * max(1.0, abs(want)):
        fail("lstm: MAE from OUT.h5 %.6f != the run's test_mae %.6f" % (mae, want))
    print("lstm: MAE recomputed from OUT.h5 = %.6f (test_mae %.6f)" % (mae, want))

    # a new file: the last 45 rows only (the test windows); its own mean/std differ
    tail = os.path.join(tmp, "tail.h5")
    with h5py.File(h5) as f, h5py.File(tail, "w") as g:
        k = 30 + 14 + 2 - 1
        g["series"] = f["series"][-k:]
        g["date"] = f["date"][-k:]
        g["columns"] = f["columns"][:]
    outt = os.path.join(tmp, "ls_tail.h5")
    run([exe, "predict", rd, tail, outt])
    with h5py.File(outt) as f:
        d = float(np.abs(f["forecast"][:] - fc).max())
    if d > 1e-5:
        fail("lstm: the tail file's forecasts differ by %g: not the run's standardization" % d)
    print("lstm: a file of the series' tail forecasts the same (max diff %g)" % d)


def main():
    build = os.path.abspath(sys.argv[1])
    exe = os.path.join(build, "core", "pipeline")
    with tempfile.TemporaryDirectory(prefix="pl_test_predict_") as tmp:
        test_ilora(exe, tmp)
        test_lstm(exe, tmp)
    print("OK")


if __name__ == "__main__":
    main()
