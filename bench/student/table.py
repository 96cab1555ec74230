#!/usr/bin/env python3
"""bench/student/table.py SEED... - the README's student table from the runs
of seeds.sh (runs/student_{alone,kd}_sSEED/latest, runs/kd_teacher_sSEED/latest)
and bench/student/infer_result.json. Mean +- sample standard deviation
(ddof 1) over seeds, and each seed's value."""
import json
import os
import statistics
import sys

root = os.path.join(os.path.dirname(__file__), "..", "..")


def summary(run):
    with open(os.path.join(root, "runs", run, "latest", "summary.json")) as f:
        return json.load(f)


def stat(xs):
    if len(xs) == 1:
        return f"{xs[0]:.4f}"
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}"


seeds = sys.argv[1:] or ["1", "2", "3"]
inf = json.load(open(os.path.join(root, "bench", "student", "infer_result.json")))


def t(name, path):
    return inf[name][path]["s_per_1000_users_median"]


rows = []
for label, v in (("student alone (kd_weight 0)", "alone"), ("distilled student", "kd")):
    ss = [summary(f"student_{v}_s{s}") for s in seeds]
    hr = [s["test_metrics"]["hit_ratio@10"] for s in ss]
    nd = [s["test_metrics"]["ndcg@10"] for s in ss]
    p = (ss[0]["frozen_parameter_bytes"] + ss[0]["trainable_parameter_bytes"]) // 4
    rows.append((label, ", ".join(seeds), stat(hr), stat(nd), " ".join(f"{x:.4f}" for x in hr), p,
                 t("student", "serving"), t("student", "eval")))
ts = [summary(f"kd_teacher_s{s}") for s in seeds]
hr = [s["test_metrics"]["hit_ratio@10"] for s in ts]
nd = [s["test_metrics"]["ndcg@10"] for s in ts]
p = (ts[0]["frozen_parameter_bytes"] + ts[0]["trainable_parameter_bytes"]) // 4
rows.append(("teacher (iLoRA on the pretrained backbone)", ", ".join(seeds), stat(hr), stat(nd),
             " ".join(f"{x:.4f}" for x in hr), p, t("teacher", "serving"), t("teacher", "eval")))
print("| model | seeds | test HR@10 (mean +- std) | test NDCG@10 | HR@10 per seed | parameters | "
      "s / 1,000 users, full ranking, serving | same, eval forward |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:,} | {r[6]:.4f} | {r[7]:.4f} |")
print(f"\nstudents distil from {inf['teacher']['run']}; timings {inf.get('threads', 2)} thread(s)")
for path in ("serving", "eval"):
    print(f"\n{path}: teacher / student time {inf['speedup_' + path]:.1f}x (median of "
          f"{inf['teacher']['passes']} passes each; min-max teacher "
          f"{inf['teacher'][path]['s_per_1000_users_min']:.4f}-"
          f"{inf['teacher'][path]['s_per_1000_users_max']:.4f}, student "
          f"{inf['student'][path]['s_per_1000_users_min']:.4f}-"
          f"{inf['student'][path]['s_per_1000_users_max']:.4f} s)")
