#!/usr/bin/env python3
"""Choose the configs/lstm_chicago.ini variant on the VALIDATION split only,
then evaluate the chosen one on the test split once.

Every candidate is `pipeline run configs/lstm_chicago.ini` with all 49 input
columns (the config's feature_columns, never overridden here) plus a few
key=value overrides, trained with `trainer.test=false`: the test split is
never evaluated for a candidate. The score is the run's best validation MAE
(summary.json `best_monitor`, monitor = val_mae: the epoch whose weights are
kept in checkpoints/best.safetensors).

Stage 1 compares how the inputs enter the LSTM (level drift); stage 2 tries
a few regularization settings on top of the stage-1 winner; stage 3 trains
the best so far as an averaged ensemble of 4 members. The variant with the
lowest validation MAE over all stages is chosen, and only its best
checkpoint is evaluated on the test split (an evaluation-only run:
trainer.max_epochs=0, trainer.init_from=<best checkpoint>; the scheduler is
set to constant there because cosine needs > 0 steps; it does not act
without training).

usage: python3 bench/lstm/select_variant.py [--pipeline build/core/pipeline]
           [--run-dir runs/lstm_select] [--reuse] [--stage1-only] [--no-test]
  --reuse   reuse a finished candidate run (same overrides, same INI
            content) found under --run-dir instead of training it again
(The file is not named select.py: that would shadow Python's select module.)
Runs use pipeline.threads=1 (OMP_WAIT_POLICY=passive); about 1-2 min each.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "configs/lstm_chicago.ini"

# (name, overrides). The first entry is the config without any new option
# (naive_skip, mae loss, dropout 0.3, weight_decay 0.05, hidden 64).
STAGE1 = [
    ("naive_skip", []),
    ("revin_mean", ["model.revin=mean"]),
    ("revin_std", ["model.revin=std"]),
    ("revin_std_affine", ["model.revin=std", "model.revin_affine=true"]),
    ("diff7", ["model.input_diff=7"]),
]
# applied on top of the stage-1 winner's overrides
STAGE2 = [
    ("hidden32", ["model.hidden_size=32"]),
    ("dropout0.5", ["model.dropout=0.5"]),
    ("wd0.2", ["optimizer.weight_decay=0.2"]),
    ("input_dropout0.2", ["model.input_dropout=0.2"]),
    ("feature_dropout0.3", ["model.feature_dropout=0.3"]),
]
# stage 3: the winner so far as an ensemble of 4 independently initialized
# members whose forecasts are averaged (4x the training time)
STAGE3 = [("ensemble4", ["model.ensemble=4"])]


def run(pipeline, run_dir, name, overrides, extra):
    cmd = [pipeline, "run", CONFIG, "pipeline.threads=1", "pipeline.run_dir=" + run_dir,
           "pipeline.name=" + name] + overrides + extra
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    log = os.path.join(run_dir, name + ".log")
    os.makedirs(run_dir, exist_ok=True)
    with open(log, "w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    if r.returncode:
        sys.exit("failed (%d): %s\nsee %s" % (r.returncode, " ".join(cmd), log))
    latest = os.path.join(run_dir, name, "latest", "summary.json")
    with open(latest) as f:
        return json.load(f)


def train(args, name, overrides):
    """Train one candidate without touching the test split; summary.json."""
    rec = os.path.join(args.run_dir, name + ".json")
    with open(os.path.join(ROOT, CONFIG), "rb") as f:
        ini = hashlib.sha256(f.read()).hexdigest()
    if args.reuse and os.path.exists(rec):
        with open(rec) as f:
            r = json.load(f)
        if r["overrides"] == overrides and r.get("config_sha256") == ini and os.path.exists(r["summary"]):
            with open(r["summary"]) as f:
                return json.load(f)
    s = run(args.pipeline, args.run_dir, name, overrides, ["trainer.test=false"])
    assert "test_metrics" not in s, "a candidate run evaluated the test split"
    with open(rec, "w") as f:
        json.dump({"overrides": overrides, "config_sha256": ini,
                   "summary": os.path.join(s["run_dir"], "summary.json")}, f)
    return s


def row(name, overrides, s):
    v = s["val_metrics"]
    print("%-28s val_mae %.4f  (naive %.4f, x %.3f)  epochs %3d  %.2f s/epoch  %s"
          % (name, s["best_monitor"], v["seasonal_naive_mae"], s["best_monitor"] / v["seasonal_naive_mae"],
             s["epochs"], s["time_per_epoch_seconds"], " ".join(overrides) or "(config as is)"), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipeline", default=os.path.join(ROOT, "build", "core", "pipeline"))
    ap.add_argument("--run-dir", default=os.path.join(ROOT, "runs", "lstm_select"))
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--stage1-only", action="store_true", help="stage 1 only (no stage 2, 3)")
    ap.add_argument("--no-test", action="store_true", help="stop after the selection")
    args = ap.parse_args()
    args.run_dir = os.path.abspath(args.run_dir)
    args.pipeline = os.path.abspath(args.pipeline)

    results = []  # (name, overrides, summary)
    print("stage 1: input normalization (selection by validation MAE only)")
    for name, ov in STAGE1:
        s = train(args, name, ov)
        assert s["monitor"] == "val_mae", s["monitor"]
        results.append((name, ov, s))
        row(name, ov, s)
    w1 = min(results, key=lambda r: r[2]["best_monitor"])
    print("stage-1 winner: %s" % w1[0])
    if not args.stage1_only:
        print("stage 2: regularization on top of %s" % w1[0])
        for name, ov in STAGE2:
            n2, ov2 = w1[0] + "+" + name, w1[1] + ov
            s = train(args, n2, ov2)
            results.append((n2, ov2, s))
            row(n2, ov2, s)
        w2 = min(results, key=lambda r: r[2]["best_monitor"])
        print("stage 3: ensemble of %s" % w2[0])
        for name, ov in STAGE3:
            n3, ov3 = w2[0] + "+" + name, w2[1] + ov
            s = train(args, n3, ov3)
            results.append((n3, ov3, s))
            row(n3, ov3, s)
    best = min(results, key=lambda r: r[2]["best_monitor"])
    name, ov, s = best
    print("\nchosen by validation MAE: %s (val_mae %.4f)" % (name, s["best_monitor"]))
    if args.no_test:
        return

    # the one test evaluation: the chosen run's best checkpoint
    t = run(args.pipeline, args.run_dir, "test_" + name, ov,
            ["trainer.max_epochs=0", "scheduler.plugin=constant", "trainer.init_from=" + s["best_checkpoint"]])
    m = t["test_metrics"]
    print("test of the chosen variant: mae %.4f  naive %.4f  x naive %.3f  rmse %.4f  mape %.2f %%"
          % (m["mae"], m["seasonal_naive_mae"], m["mae"] / m["seasonal_naive_mae"], m["rmse"], m["mape"]))
    print("training run: %s  (%d epochs, %.2f s/epoch, peak memory %.1f MiB)"
          % (s["run_dir"], s["epochs"], s["time_per_epoch_seconds"], s["peak_memory_bytes"] / 1048576.0))
    print("command: pipeline run %s %s" % (CONFIG, " ".join(ov)))
    print("target x naive <= 0.80: %s" % ("met" if m["mae"] <= 0.8 * m["seasonal_naive_mae"] else "NOT met"))


if __name__ == "__main__":
    main()
