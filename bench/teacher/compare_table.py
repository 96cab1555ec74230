#!/usr/bin/env python3
"""The table of bench/teacher/compare.sh from its manifest.

usage: compare_table.py MANIFEST.tsv OUT.md [--describe TEXT]

MANIFEST: one line per (variant, seed): variant, seed, run directory,
per-user npz (bench/teacher/per_user.py). Prints and writes OUT.md:
  * per variant, mean +- std over seeds of test HR@10 / NDCG@10 (the best
    validation checkpoint's test) and of the validation metrics of that
    checkpoint (the frozen backbone's validation is /early/val, 478 users and
    other targets: not comparable with the teachers' /val);
  * paired bootstrap 95 % intervals (bench/teacher/paired_bootstrap.py,
    10,000 resamples of the 671 test users, each user's metric averaged over
    the seeds first) of iLoRA(4) minus every other variant, and of the iLoRA
    with the best validation NDCG@10 (mean over seeds) minus plain LoRA;
  * every `gate_*` statistic in the runs' test / validation metrics, if any;
  * seconds per run.
"""
import argparse
import json
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from paired_bootstrap import paired_bootstrap  # noqa: E402
from per_user import best_val_metrics  # noqa: E402

LABEL = {"frozen": "frozen early backbone", "full": "full fine-tune", "lora": "plain LoRA"}


def label(v):
    if v.endswith("_embed"):  # modules_to_save = embed_tokens
        return label(v[:-6]) + " + item table"
    return LABEL.get(v, f"iLoRA ({v[5:]} experts)" if v.startswith("ilora") else v)


def ms(xs, fmt="{:.4f}"):
    if not xs:
        return ""
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{fmt.format(statistics.mean(xs))} ± {fmt.format(sd)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("out")
    ap.add_argument("--describe", default="")
    ap.add_argument("--data", default="data/movielens.h5",
                    help="drift: its /early/train tells which test targets are new items")
    ap.add_argument("--setting", choices=("drift", "standard"), default="drift",
                    help="drift: compare.sh's early backbone; standard: seeds.sh's, pretrained "
                    "on the whole training split (pretrain.ini)")
    args = ap.parse_args()

    runs = {}  # variant -> list of (seed, run_dir, npz)
    order = []
    with open(args.manifest) as f:
        for line in f:
            v, s, rd, npz = line.rstrip("\n").split("\t")
            if v not in runs:
                runs[v] = []
                order.append(v)
            runs[v].append((s, rd, npz))

    rows, gates, per_user, secs = {}, {}, {}, {}
    users = None
    for v in order:
        test, val, g, sec = {"hr": [], "nd": []}, {"hr": [], "nd": []}, {}, []
        hits, ndcgs = [], []
        for s, rd, npz in runs[v]:
            with open(os.path.join(rd, "summary.json")) as f:
                sm = json.load(f)
            bv = best_val_metrics(rd)
            test["hr"].append(sm["test_metrics"]["hit_ratio@10"])
            test["nd"].append(sm["test_metrics"]["ndcg@10"])
            val["hr"].append(bv["hit_ratio@10"])
            val["nd"].append(bv["ndcg@10"])
            sec.append(sm["total_wall_seconds"])
            for split, m in (("test", sm["test_metrics"]), ("val", bv)):
                for k, x in m.items():
                    if k.startswith("gate_"):
                        g.setdefault(f"{split} {k}", []).append(float(x))
            d = np.load(npz)
            if users is None:
                users = d["user_index"]
            elif not np.array_equal(users, d["user_index"]):
                sys.exit(f"compare_table: {npz}: other test users than the first run's")
            hits.append(d["hit10"])
            ndcgs.append(d["ndcg10"])
            targets = d["target"]
        rows[v], gates[v], secs[v] = (test, val), g, sec
        per_user[v] = (np.stack(hits), np.stack(ndcgs))

    nseeds = max(len(r) for r in runs.values())
    drift = args.setting == "drift"
    if not drift:
        LABEL["frozen"] = "frozen backbone"
    out = ["# Issue 15: the teacher under drift (bench/teacher/compare.sh)" if drift else
           "# Issue 15: the teacher on the whole-period backbone (bench/teacher/seeds.sh)", ""]
    if args.describe:
        out += [args.describe, ""]
    where = ("Backbone pretrained on /early (training-split interactions before the 0.7 quantile "
             "of their timestamps, 2009-04-14)" if drift else
             "Backbone pretrained on the whole /train (configs/pretrain.ini)")
    out += [f"{where}, each teacher adapts it on the whole /train; test = "
            f"leave-one-out /test, {len(users)} users, best validation checkpoint "
            f"(val_ndcg@10). Mean ± std over {nseeds} seed(s).", "",
            "| variant | test HR@10 | test NDCG@10 | val HR@10 | val NDCG@10 | s per run |",
            "|---|---|---|---|---|---|"]
    for v in order:
        (t, va), sec = rows[v], secs[v]
        vl = " (/early/val)" if v == "frozen" and drift else ""
        out.append(f"| {label(v)} | {ms(t['hr'])} | {ms(t['nd'])} | {ms(va['hr'])}{vl} | "
                   f"{ms(va['nd'])}{vl} | {statistics.mean(sec):.0f} |")

    ilv = [v for v in order if v.startswith("ilora") and not v.endswith("_embed")]
    pairs = []
    if "ilora4" in per_user:
        pairs += [("ilora4", v) for v in order if v != "ilora4"]
    if ilv and "lora" in per_user:
        best = max(ilv, key=lambda v: statistics.mean(rows[v][1]["nd"]))
        if (best, "lora") not in pairs:  # else the row is already there
            pairs.append((best, "lora", f"best E by val NDCG@10 = {best[5:]}"))
    # with the item table trained too: iLoRA against the same LoRA, and
    # against its own frozen-table run
    for v in order:
        if v.startswith("ilora") and v.endswith("_embed"):
            pairs += [(v, b) for b in ("lora_embed", "full", v[:-6]) if b in per_user]
    if pairs:
        out += ["", "Paired bootstrap over test users (10,000 resamples, seed 0; each user's hit@10 "
                "and NDCG@10 averaged over the seeds first): mean difference [95 % interval].", "",
                "| A minus B | Δ test HR@10 | Δ test NDCG@10 |", "|---|---|---|"]
        for p in pairs:
            a, b = p[0], p[1]
            note = f" ({p[2]})" if len(p) > 2 else ""
            cells = []
            for k in (0, 1):
                m, lo, hi, _ = paired_bootstrap(per_user[a][k], per_user[b][k])
                cells.append(f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
            out.append(f"| {label(a)}{note} − {label(b)} | {cells[0]} | {cells[1]} |")
    if drift and os.path.exists(args.data):
        import h5py
        with h5py.File(args.data, "r") as f:
            early = np.union1d(np.unique(f["early/train/input_ids"][:]),
                               np.unique(f["early/train/labels"][:]))
        cold = ~np.isin(targets, early)
        out += ["", f"New items: {int(cold.sum())} of the {len(cold)} test targets never occur in "
                "/early/train, so the early backbone's item table never learned them (a frozen "
                "table keeps them untrained). Test HR@10 on those and on the others (mean ± std "
                "over seeds):", "", "| variant | HR@10, new-item targets | HR@10, other targets |",
                "|---|---|---|"]
        for v in order:
            h = per_user[v][0]
            out.append(f"| {label(v)} | {ms([float(x[cold].mean()) for x in h])} | "
                       f"{ms([float(x[~cold].mean()) for x in h])} |")
    if any(gates.values()):
        out += ["", "Gate statistics (`gate_*` in the runs' metrics; val = best checkpoint):", "",
                "| variant | statistic | mean ± std |", "|---|---|---|"]
        for v in order:
            for k in sorted(gates[v]):
                out.append(f"| {label(v)} | {k} | {ms(gates[v][k])} |")
    text = "\n".join(out) + "\n"
    print(text, end="")
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"compare_table: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
