#!/usr/bin/env python3
"""The ablation table of plugins/models/stock_gat/README.md from the runs of
bench/stocks/ablation.sh.

usage: ablation_table.py RUNS_DIR VARIANT...

For each variant, over its seeds (runs RUNS_DIR/<variant>_s<seed>/latest):
validation IC and test IC / IC t-statistic / Sharpe, mean +- sd (ddof 1) over
seeds, of the best checkpoint by val_ic (its val IC is the best epoch's, a
maximum over epochs) and, for a variant with SWA, also of the averaged
weights (one validation after fit: swa_val_*, swa_test_*). The factors (no parameters, the same on
every run) follow; the best factor and the best variant are the ones with the
highest validation IC, marked with *.
"""
import glob
import json
import os
import statistics
import sys


def ms(xs, fmt="{:.4f}"):
    if not xs:
        return "-"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return (fmt + " ± " + fmt).format(statistics.mean(xs), statistics.stdev(xs))


def main():
    runs, variants = sys.argv[1], sys.argv[2:]
    rows, factors, nseeds = [], None, {}
    for v in variants:
        # (label, val, ic, t, sharpe) per reported weights; SWA variants also
        # show their best checkpoint, so what averaging buys is visible
        acc = {}
        for path in sorted(glob.glob(os.path.join(runs, f"{v}_s*", "latest", "summary.json"))):
            with open(path) as f:
                s = json.load(f)
            if s.get("status") != "ok":
                continue
            kinds = [(v + " (best checkpoint)" if "swa_test_metrics" in s else v,
                      s["best_monitor"], s["test_metrics"])]
            if "swa_test_metrics" in s:
                kinds.insert(0, (v + " (SWA weights)", s["swa_val_metrics"]["ic"], s["swa_test_metrics"]))
            for label, vic, tm in kinds:
                a = acc.setdefault(label, ([], [], [], []))
                a[0].append(vic)
                a[1].append(tm["ic"])
                a[2].append(tm["ic_t"])
                a[3].append(tm["sharpe"])
            if factors is None:
                vmet = s["val_metrics"]
                factors = [(k[3:], vmet[k], s["test_metrics"][k], s["test_metrics"]["ic_t_" + k[3:]],
                            s["test_metrics"]["sharpe_" + k[3:]])
                           for k in s["test_metrics"] if k.startswith("ic_") and not k.startswith("ic_t")
                           and k != "ic_std"]
        for label, (val, ic, t, sh) in acc.items():
            nseeds[label] = len(val)
            rows.append((label, val, ic, t, sh))
    best_v = max((r for r in rows if r[1]), key=lambda r: statistics.mean(r[1]), default=None)
    print("| variant | seeds | val IC | test IC | test IC t-stat | test Sharpe |")
    print("|---|---|---|---|---|---|")
    for v, val, ic, t, sh in rows:
        mark = " *" if best_v and v == best_v[0] else ""
        print(f"| {v}{mark} | {nseeds[v]} | {ms(val)} | {ms(ic)} | {ms(t, '{:.2f}')} | {ms(sh, '{:.2f}')} |")
    if factors:
        best_f = max(factors, key=lambda f: f[1])
        for name, vic, tic, tt, tsh in factors:
            mark = " *" if name == best_f[0] else ""
            print(f"| factor {name}{mark} | - | {vic:.4f} | {tic:.4f} | {tt:.2f} | {tsh:.2f} |")


if __name__ == "__main__":
    main()
