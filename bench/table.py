#!/usr/bin/env python3
"""The table of bench/run and bench/gpu_compare.sh from RESULTS_DIR/results.jsonl
(one JSON line per workload, written by bench/common.py's report) and the GEMM
sweep's log.

Columns: each side's throughput (pipeline; PyTorch eager; PyTorch under
torch.compile(mode="reduce-overhead") when the run had --compile, or
`failed (reason)`), pipeline's ratio to each, the compile mode's warm-up
seconds (compilation included), median step times, peak device memory
(pipeline's summary.json peak_memory_bytes; PyTorch's
torch.cuda.max_memory_allocated, cuda only), peak RSS, and issue 35's bars
(pipeline at 3x PyTorch eager or more, at 1.0x compile or more; only a GPU
run's answer counts for the issue).

usage: table.py RESULTS_DIR
"""
import json
import os
import sys


def step(x):
    if not x:
        return "-"
    return f"{x['median'] * 1e3:.2f} ({x['min'] * 1e3:.2f}-{x['max'] * 1e3:.2f})"


def mib(b):
    return f"{b / 2**20:.0f}" if b else "-"


def compile_cells(r):
    """(throughput, ratio, warm-up s) cells of the compile mode."""
    if not r.get("compile_run"):
        return "not run", "-", "-"
    if r.get("compile_error"):
        reason = r["compile_error"].replace("|", "/")
        return f"failed ({reason[:160]})", "-", "-"
    warm = r.get("compile_warmup_s")
    return (f"{r['compile']:.1f} {r['unit']}", f"{r['compile_ratio']:.2f}x",
            f"{warm:.1f}" if warm is not None else "-")


def bars(r):
    """Issue 35's two bars, each "yes" / "no" ("-" where compile did not run or failed)."""
    eager = "yes" if r["ratio"] >= 3.0 else "no"
    comp = "-"
    if r.get("compile_run") and not r.get("compile_error") and r.get("compile_ratio") is not None:
        comp = "yes" if r["compile_ratio"] >= 1.0 else "no"
    return f"{eager} / {comp}"


def main():
    d = sys.argv[1]
    env = os.path.join(d, "env.txt")
    if os.path.exists(env):
        print(open(env).read().replace("\n", "  \n"))
    print("| workload | pipeline | PyTorch eager | pipeline / eager | PyTorch compile (reduce-overhead) | "
          "pipeline / compile | compile warm-up s | pipeline step ms, median (min-max) | "
          "PyTorch eager step ms, median (min-max) | peak device MiB pipeline / eager / compile | "
          "peak RSS MiB pipeline / PyTorch | issue 35: >= 3x eager / >= 1x compile |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    path = os.path.join(d, "results.jsonl")
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            c_tp, c_ratio, c_warm = compile_cells(r)
            print(f"| {r['workload']} | {r['pipeline']:.1f} {r['unit']} | {r['pytorch']:.1f} {r['unit']} | "
                  f"{r['ratio']:.2f}x | {c_tp} | {c_ratio} | {c_warm} | {step(r['pipeline_step'])} | "
                  f"{step(r['pytorch_step'])} | {mib(r.get('pipeline_peak'))} / {mib(r.get('pytorch_peak'))} / "
                  f"{mib(r.get('compile_peak'))} | {mib(r['pipeline_rss'])} / {mib(r['pytorch_rss'])} | "
                  f"{bars(r)} |")
    notes = os.path.join(d, "notes.txt")
    if os.path.exists(notes) and os.path.getsize(notes):
        print()
        print(open(notes).read().rstrip().replace("\n", "  \n"))
    g = os.path.join(d, "gemm.log")
    if os.path.exists(g):
        print("\nGEMM sweep, pl_linear (the op: checks, caching allocator, kernel lookup, frame) "
              "against a direct cblas_sgemm, f32, forward:\n")
        print("```")
        print(open(g).read().rstrip())
        print("```")


if __name__ == "__main__":
    main()
