#!/usr/bin/env python3
"""Print the teacher-at-scale table from the runs bench/teacher/scale.sh made.

usage: python3 bench/teacher/scale_table.py RUN_DIR SIZE...

pipeline runs: RUN_DIR/c_<size>_<precision>_gc<bool>/latest/{summary.json,
metrics.csv}; the step time is the median (min, max) of the per-step
`step_seconds` rows of metrics.csv after the first step (warm-up: first
touch of activations and packed weights). PyTorch runs:
RUN_DIR/t_<size>_<precision>_gc<bool>.json from scale_torch.py.
"""
import csv
import json
import os
import statistics
import sys

MiB = 1024 * 1024


def pipeline_row(rd, size, prec, gc):
    d = os.path.join(rd, f"c_{size}_{prec}_gc{gc}", "latest")
    try:
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    steps = []
    with open(os.path.join(d, "metrics.csv")) as f:
        for r in csv.DictReader(f):
            if r["key"] == "step_seconds":
                steps.append(float(r["value"]))
    steps = steps[1:] if len(steps) > 1 else steps
    return {
        "peak": s.get("peak_rss_bytes", 0) / MiB,
        "frozen": s.get("frozen_parameter_bytes", 0) / MiB,
        "trainable": s.get("trainable_parameter_bytes", 0) / 4,
        "step": statistics.median(steps) if steps else float("nan"),
        "min": min(steps) if steps else float("nan"),
        "max": max(steps) if steps else float("nan"),
        "load": s.get("load_seconds", float("nan")),
        "load_peak": s.get("load_peak_rss_bytes", 0) / MiB,
    }


def torch_row(rd, size, prec, gc):
    try:
        with open(os.path.join(rd, f"t_{size}_{prec}_gc{gc}.json")) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return None
    return {
        "peak": j.get("peak_rss_bytes", 0) / MiB,
        "frozen": j.get("frozen_bytes", 0) / MiB,
        "trainable": j.get("trainable_params", 0),
        "step": j.get("step_s_median", float("nan")),
        "min": j.get("step_s_min", float("nan")),
        "max": j.get("step_s_max", float("nan")),
        "load": j.get("load_s", float("nan")),
        "load_peak": float("nan"),
    }


def fmt(r):
    if r is None:
        return "| (failed or not run) | | | | | |"
    return (f"| {r['peak']:.0f} | {r['frozen']:.0f} | {r['trainable'] / 1e6:.2f} M | "
            f"{r['step']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | {r['load']:.1f} | "
            f"{r['load_peak']:.0f} |")


def main():
    rd, sizes = sys.argv[1], sys.argv[2:]
    print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}\n")
    print("| size | run | precision | activation ckpt | peak RSS MiB | frozen MiB | trainable | "
          "s/step median (min-max) | load s | load peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        fp32_peak = {}
        for prec in ("fp32", "bf16-true", "qlora4"):
            for gc in ("false", "true"):
                r = pipeline_row(rd, size, prec, gc)
                if r and prec == "fp32":
                    fp32_peak[gc] = r["peak"]
                ratio = ""
                if r and gc in fp32_peak and prec != "fp32":
                    ratio = f" ({r['peak'] / fp32_peak[gc]:.2f}x fp32)"
                print(f"| {size} | pipeline | {prec}{ratio} | {gc} " + fmt(r))
        for prec in ("fp32", "bf16", "qlora4"):
            for gc in ("false", "true"):
                print(f"| {size} | PyTorch+PEFT | {prec} | {gc} " + fmt(torch_row(rd, size, prec, gc)))


if __name__ == "__main__":
    main()
