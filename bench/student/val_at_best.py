#!/usr/bin/env python3
"""bench/student/val_at_best.py RUN_DIR... - one line per run: its validation
metrics at the checkpoint it tests (the epoch of the best monitored value,
[trainer] monitor / mode from the run's summary.json), read from
metrics.csv, and its wall time. Used to choose the student's settings on
validation only (sweep.sh); prints no test metric."""
import csv
import json
import os
import sys

for run in sys.argv[1:]:
    run = os.path.realpath(run)
    s = json.load(open(os.path.join(run, "summary.json")))
    mon = s["monitor"]
    val = {}  # epoch -> {key: value}
    with open(os.path.join(run, "metrics.csv")) as f:
        for r in csv.DictReader(f):
            if r["key"].startswith("val_"):
                val.setdefault(int(r["epoch"]), {})[r["key"]] = float(r["value"])
    ep = [e for e in val if val[e].get(mon) == s["best_monitor"]]
    best = min(ep) if ep else max(val, key=lambda e: val[e][mon])
    v = val[best]
    print(f"{os.path.basename(os.path.dirname(run))}: best epoch {best} of {len(val)}  "
          f"val HR@10 {v['val_hit_ratio@10']:.4f}  val NDCG@10 {v['val_ndcg@10']:.4f}  "
          f"val loss {v['val_loss']:.4f}  params {(s['frozen_parameter_bytes'] + s['trainable_parameter_bytes']) // 4:,}  "
          f"{s['total_wall_seconds']:.0f} s")
