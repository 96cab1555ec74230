#!/usr/bin/env python3
"""Print the teacher-at-scale table from the runs bench/teacher/scale.sh made.

usage: python3 bench/teacher/scale_table.py RUN_DIR "BATCHES" SIZE...

pipeline runs: RUN_DIR/c_<size>_b<batch>_<precision>_gc<bool>/latest/
{summary.json, metrics.csv}: device peak allocated / reserved (summary.json
peak_memory_allocated_bytes / peak_memory_reserved_bytes: the meaning of
torch.cuda.max_memory_allocated / max_memory_reserved), the ratio of the
allocated peak to fp32's without checkpointing at the same batch, frozen
bytes, and the step time: the median (min-max) of metrics.csv's
step_seconds after the first step (none on the strict device: one step,
memory only). PyTorch runs: RUN_DIR/t_<size>_b<batch>_<precision>_gc<bool>.json
from scale_torch.py (on cuda its peak allocated / reserved; on the CPU its
peak RSS, in the allocated column, marked "rss").
"""
import csv
import json
import math
import os
import statistics
import sys

MiB = 1024 * 1024
PRECS = ("fp32", "bf16-mixed", "bf16-true", "qlora4")
TPRECS = ("fp32", "bf16", "bf16-true", "qlora4")


def pipeline_row(rd, size, bs, prec, gc):
    d = os.path.join(rd, f"c_{size}_b{bs}_{prec}_gc{gc}", "latest")
    try:
        with open(os.path.join(d, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    if s.get("status") != "ok":
        return None
    steps = []
    try:
        with open(os.path.join(d, "metrics.csv")) as f:
            for r in csv.DictReader(f):
                if r["key"] == "step_seconds":
                    steps.append(float(r["value"]))
    except OSError:
        pass
    steps = steps[1:] if len(steps) > 1 else []
    fit = s.get("phases", {}).get("fit", {})
    return {
        "alloc": fit.get("peak_memory_allocated_bytes", math.nan) / MiB,
        "reserved": fit.get("peak_memory_reserved_bytes", math.nan) / MiB,
        "frozen": s.get("frozen_parameter_bytes", 0) / MiB,
        "step": statistics.median(steps) if steps else math.nan,
        "min": min(steps) if steps else math.nan,
        "max": max(steps) if steps else math.nan,
        # on the CPU, the bf16 GEMM kernel cpuid chose (summary.json's cpu_gemm_bf16)
        "device": s.get("device", "") + (f" ({s['cpu_gemm_bf16']})" if s.get("device", "")
                                           .startswith("cpu") and "cpu_gemm_bf16" in s else ""),
    }


def torch_row(rd, size, bs, prec, gc):
    try:
        with open(os.path.join(rd, f"t_{size}_b{bs}_{prec}_gc{gc}.json")) as f:
            j = json.load(f)
    except (OSError, ValueError):
        return None
    cuda = "peak_memory_allocated_bytes" in j
    return {
        "alloc": (j["peak_memory_allocated_bytes"] if cuda else j.get("peak_rss_bytes", 0)) / MiB,
        "reserved": j.get("peak_memory_reserved_bytes", math.nan) / MiB,
        "frozen": j.get("frozen_bytes", 0) / MiB,
        "step": j.get("step_s_median", math.nan),
        "min": j.get("step_s_min", math.nan),
        "max": j.get("step_s_max", math.nan),
        "device": j.get("gpu", "cpu") + ("" if cuda else " (rss)"),
    }


def fmt(r, base):
    if r is None:
        return "| (failed or not run) | | | | |"
    ratio = f"{r['alloc'] / base:.2f}x" if base and not math.isnan(r["alloc"]) else ""
    step = "" if math.isnan(r["step"]) else f"{r['step']:.3f} ({r['min']:.3f}-{r['max']:.3f})"
    return (f"| {r['alloc']:.0f} | {r['reserved']:.0f} | {ratio} | {r['frozen']:.0f} | {step} |")


def main():
    rd, batches, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}\n")
    print("| size | batch | run | precision | activation ckpt | peak allocated MiB | "
          "peak reserved MiB | allocated / fp32 (no ckpt) | frozen MiB | s/step median (min-max) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        for bs in batches:
            f = pipeline_row(rd, size, bs, "fp32", "false")
            base = f["alloc"] if f else None
            for prec in PRECS:
                for gc in ("false", "true"):
                    r = pipeline_row(rd, size, bs, prec, gc)
                    print(f"| {size} | {bs}x50 | pipeline | {prec} | {gc} " + fmt(r, base))
            for prec in TPRECS:
                for gc in ("false", "true"):
                    r = torch_row(rd, size, bs, prec, gc)
                    if r is not None:
                        print(f"| {size} | {bs}x50 | PyTorch+PEFT | {prec} | {gc} " + fmt(r, base))


if __name__ == "__main__":
    main()
