#!/usr/bin/env python3
"""Compare the loss curves of two runs of the same config (a device run
against the CPU reference): per-step relative difference, pass/fail.

usage: tools/compare_curves.py RUN RUN_REF [--key train_loss]
           [--precision f32|bf16|fp16] [--tol-first X] [--tol-max X] [--tol-final X]
           [--floor 1e-3] [--label NAME] [--markdown]

RUN and RUN_REF are run directories (holding metrics.csv), a runs/NAME
folder (its `latest` link is followed) or metrics.csv files themselves.
RUN_REF is the reference (the CPU run). metrics.csv is the trainer's long
format, `step,epoch,key,value`; the rows of --key (train_loss: one per
logged optimizer step, so run with trainer.log_every_n_steps=1) are matched
by step. Only steps both runs logged are compared; a run that logged fewer
steps than the other (stopped early, non-finite loss) fails.

Per step:  rel(s) = |run(s) - ref(s)| / max(|ref(s)|, floor)

Checked against the tolerance of --precision (override each with --tol-*):

             first step   max over steps   final (mean of the last 10 %)
    f32        1e-3           1e-1             2e-2
    bf16       2e-2           2e-1             5e-2
    fp16       2e-2           2e-1             5e-2

Why: both runs start from the same weights and see the same batches and
dropout masks (counter-based RNG), so the first step differs only by the
order of floating-point accumulation (a few ulp of f32, a few ulp of the
16-bit compute type). Later steps feed those differences back through the
optimizer and may drift apart by more, so single steps get a loose bound;
the end of training must agree to 2 % (5 % with 16-bit compute), as two
correct implementations do. "final" is the relative difference of the mean
loss over the last 10 % of the compared steps (at least one), which keeps
one noisy batch from deciding.

Prints one summary line (or a markdown table row with --markdown: label,
steps, first, max (step), final, tolerance, status). Exit status: 0 pass,
1 fail, 2 unreadable input. Standard library only.
"""
import argparse
import csv
import math
import os
import sys

TOLERANCES = {  # precision: (first, max, final)
    "f32": (1e-3, 1e-1, 2e-2),
    "bf16": (2e-2, 2e-1, 5e-2),
    "fp16": (2e-2, 2e-1, 5e-2),
}


def metrics_path(p):
    """metrics.csv of a run dir, a runs/NAME dir (via latest) or the file."""
    if os.path.isfile(p):
        return p
    for cand in (os.path.join(p, "metrics.csv"), os.path.join(p, "latest", "metrics.csv")):
        if os.path.isfile(cand):
            return cand
    raise FileNotFoundError(f"{p}: no metrics.csv (neither {p}/metrics.csv nor {p}/latest/metrics.csv)")


def read_curve(path, key):
    """{step: value} of `key`; the last row wins when a step is logged twice."""
    curve = {}
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header != ["step", "epoch", "key", "value"]:
            raise ValueError(f"{path}: header {header} is not step,epoch,key,value")
        for n, row in enumerate(rows, start=2):
            if len(row) != 4:
                raise ValueError(f"{path}:{n}: expected 4 fields, found {len(row)}")
            if row[2] == key:
                curve[int(row[0])] = float(row[3])
    return curve


def compare(run, ref, floor):
    """Per-step relative differences over the common steps, and the summary."""
    steps = sorted(set(run) & set(ref))
    rel = []
    for s in steps:
        a, b = run[s], ref[s]
        if math.isfinite(a) and math.isfinite(b):
            rel.append(abs(a - b) / max(abs(b), floor))
        else:
            rel.append(0.0 if (math.isnan(a) and math.isnan(b)) or a == b else math.inf)
    out = {"steps": steps, "rel": rel}
    if not steps:
        return out
    k = max(1, len(steps) // 10)
    tail = steps[-k:]
    ma = sum(run[s] for s in tail) / k
    mb = sum(ref[s] for s in tail) / k
    out["first"] = rel[0]
    i = max(range(len(rel)), key=lambda j: rel[j])
    out["max"], out["max_step"] = rel[i], steps[i]
    out["final"] = abs(ma - mb) / max(abs(mb), floor) if math.isfinite(ma - mb) else math.inf
    out["identical"] = all(run[s] == ref[s] for s in steps)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("ref", help="the reference run (the CPU one)")
    ap.add_argument("--key", default="train_loss")
    ap.add_argument("--precision", choices=sorted(TOLERANCES), default="f32")
    ap.add_argument("--tol-first", type=float)
    ap.add_argument("--tol-max", type=float)
    ap.add_argument("--tol-final", type=float)
    ap.add_argument("--floor", type=float, default=1e-3,
                    help="smallest denominator of the relative difference")
    ap.add_argument("--label", default="")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table row")
    a = ap.parse_args(argv)
    t_first, t_max, t_final = TOLERANCES[a.precision]
    t_first = a.tol_first if a.tol_first is not None else t_first
    t_max = a.tol_max if a.tol_max is not None else t_max
    t_final = a.tol_final if a.tol_final is not None else t_final
    label = a.label or a.run
    try:
        run = read_curve(metrics_path(a.run), a.key)
        ref = read_curve(metrics_path(a.ref), a.key)
    except (OSError, ValueError) as e:
        print(f"compare_curves: {e}", file=sys.stderr)
        return 2

    c = compare(run, ref, a.floor)
    problems = []
    if not c["steps"]:
        problems.append(f"no common steps with key {a.key} ({len(run)} vs {len(ref)} rows)")
    else:
        if len(run) != len(ref):
            problems.append(f"{a.key} logged at {len(run)} steps vs {len(ref)} in the reference")
        if c["first"] > t_first:
            problems.append(f"first step {c['first']:.2e} > {t_first:.0e}")
        if c["max"] > t_max:
            problems.append(f"step {c['max_step']} {c['max']:.2e} > {t_max:.0e}")
        if c["final"] > t_final:
            problems.append(f"final {c['final']:.2e} > {t_final:.0e}")
    status = "FAIL" if problems else "PASS"
    tol = f"{t_first:.0e} / {t_max:.0e} / {t_final:.0e}"
    if c["steps"]:
        nums = (f"{len(c['steps'])} steps, first {c['first']:.2e}, max {c['max']:.2e} "
                f"(step {c['max_step']}), final {c['final']:.2e}")
        if c["identical"]:
            nums += ", identical"
    else:
        nums = "no steps"
    if a.markdown:
        if c["steps"]:
            cells = [label, str(len(c["steps"])), f"{c['first']:.2e}",
                     f"{c['max']:.2e} (step {c['max_step']})", f"{c['final']:.2e}"]
        else:
            cells = [label, "0", "-", "-", "-"]
        cells += [f"{a.precision}: {tol}", status + (": " + "; ".join(problems) if problems else "")]
        print("| " + " | ".join(cells) + " |")
    else:
        print(f"{status} {label} {a.key}: {nums} (tolerance {a.precision} first / max / final: {tol})"
              + ("".join("\n  " + p for p in problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
