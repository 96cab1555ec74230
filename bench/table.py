#!/usr/bin/env python3
"""The table of bench/run from RESULTS_DIR/results.jsonl (one JSON line per
workload, written by bench/common.py's report) and the GEMM sweep's log.

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


def main():
    d = sys.argv[1]
    print(open(os.path.join(d, "env.txt")).read().replace("\n", "  \n"))
    print("| workload | pipeline | PyTorch | ratio | pipeline step ms, median (min-max) | "
          "PyTorch step ms, median (min-max) | peak RSS MiB pipeline / PyTorch |")
    print("|---|---|---|---|---|---|---|")
    path = os.path.join(d, "results.jsonl")
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            print(f"| {r['workload']} | {r['pipeline']:.1f} {r['unit']} | {r['pytorch']:.1f} {r['unit']} | "
                  f"{r['ratio']:.2f}x | {step(r['pipeline_step'])} | {step(r['pytorch_step'])} | "
                  f"{mib(r['pipeline_rss'])} / {mib(r['pytorch_rss'])} |")
    g = os.path.join(d, "gemm.log")
    if os.path.exists(g):
        print("\nGEMM sweep, pl_linear (the op: checks, caching allocator, kernel lookup, frame) "
              "against a direct cblas_sgemm, f32, forward:\n")
        print("```")
        print(open(g).read().rstrip())
        print("```")


if __name__ == "__main__":
    main()
