#!/usr/bin/env python3
"""test_stocks.py - configs/gat_stocks.ini end to end on a small synthetic
panel (issue 20): tools/stocks_to_h5.py converts a price CSV of 6 stocks
whose next-day return reverses the last one (a planted signal), then
`pipeline run configs/gat_stocks.ini` with smaller shapes, checking:
  - the run ends ok and its log says how many day-graphs were built once;
  - the factors' test IC, IC t-statistic and Sharpe equal the values computed
    here with NumPy from the file (Spearman with average ranks, long-short
    of the top / bottom stocks by the factor, sqrt(252) annualization) over
    the test days by target date: the loader's split, join and the model's
    metrics together against an independent computation;
  - configs/gat_stocks_recipe.ini (OneCycle x plateau, SWA, accumulation)
    runs too, and with `data.graphs=per_batch` (graphs rebuilt in every
    batch) gives the same test metrics bit for bit, and says so in its
    summary; its SWA averaged weights are validated and tested (swa_val_*,
    swa_test_*);
  - the model learns the planted reversal (test IC > 0.3);
  - summary.json's peak_rss_bytes is the run's own, not that of the process
    that launched it (this script holds 1 GiB meanwhile).
usage: test_stocks.py BUILD_DIR   (ctest runs it; needs numpy and h5py)
"""
import datetime as dt
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from cli_util import fail, run, summary

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
S, DAYS, LS = 6, 330, 2


def make_prices(path):
    rng = np.random.default_rng(5)
    d0 = dt.date(1995, 1, 2)
    dates = [d0 + dt.timedelta(days=i + 2 * (i // 5)) for i in range(DAYS)]
    r = np.zeros((DAYS, S))
    r[0] = rng.normal(0, 0.02, S)
    for t in range(1, DAYS):
        r[t] = -0.6 * r[t - 1] + rng.normal(0, 0.01, S)
    p = 50 * np.exp(np.cumsum(r, axis=0))
    with open(path, "w") as f:
        f.write("date," + ",".join(f"S{s}" for s in range(S)) + "\n")
        for d, row in zip(dates, p):
            f.write(d.isoformat() + "," + ",".join(f"{v:.6f}" for v in row) + "\n")
    return dates


def rank(v):
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    u, inv = np.unique(v, return_inverse=True)
    s, c = np.zeros(len(u)), np.zeros(len(u))
    np.add.at(s, inv, r)
    np.add.at(c, inv, 1)
    return (s / c)[inv]


def factor_stats(score, ret):
    """IC mean, IC t-stat, annualized long-short Sharpe over days (rows)."""
    ics, ls = [], []
    for sc, r in zip(score, ret):
        rs, rr = rank(sc), rank(r)
        ics.append(0.0 if rs.std() == 0 or rr.std() == 0 else np.corrcoef(rs, rr)[0, 1])
        order = np.lexsort((np.arange(len(sc)), sc))  # by (score, stock index)
        simple = np.exp(r) - 1
        ls.append(simple[order[-LS:]].mean() - simple[order[:LS]].mean())
    ics, ls = np.array(ics), np.array(ls)
    return (ics.mean(), ics.mean() / ics.std(ddof=1) * np.sqrt(len(ics)),
            ls.mean() / ls.std(ddof=1) * np.sqrt(252))


def main():
    exe = os.path.join(os.path.abspath(sys.argv[1]), "core", "pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        csv, h5 = os.path.join(tmp, "p.csv"), os.path.join(tmp, "p.h5")
        make_prices(csv)
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "stocks_to_h5.py"), csv, h5],
                       check=True, capture_output=True)
        common = [f"data.path={h5}", "data.train_end=1995-10-31", "data.val_end=1995-12-31",
                  "data.test_end=", "data.window=10", "data.graph_lookback=20", "data.graph_top_k=2",
                  "data.batch_size=8", f"model.long_short={LS}", "model.hidden=8", "model.heads=2",
                  "model.gat_hidden=4", "trainer.max_epochs=6", "optimizer.lr=1e-2"]
        # the launcher holds 1 GiB while pipeline runs: the run's peak_rss_bytes
        # must be its own (Linux keeps getrusage's ru_maxrss across execve)
        ballast = bytearray(1 << 30)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        runs = {}
        for key, ini, mode in (("once", "gat_stocks", "once"), ("recipe", "gat_stocks_recipe", "once"),
                               ("recipe_per_batch", "gat_stocks_recipe", "per_batch")):
            rd = os.path.join(tmp, key)
            run([exe, "run", os.path.join(ROOT, "configs", ini + ".ini"), f"pipeline.run_dir={rd}",
                 f"data.graphs={mode}"] + common, timeout=300)
            latest = os.path.join(rd, ini, "latest")
            runs[key] = (summary(latest), open(os.path.join(latest, "log.txt")).read())
        del ballast
        s, log = runs["once"]
        if not 0 < s["peak_rss_bytes"] < 768 << 20:
            fail(f"peak_rss_bytes {s['peak_rss_bytes']} of a tiny run: the launcher's memory, not the run's")
        if s["status"] != "ok":
            fail(f"status {s['status']}")
        if "day-graphs built once" not in log:
            fail("the log does not say how many day-graphs were built:\n" + log[:600])
        tm = s["test_metrics"]

        with h5py.File(h5) as f:
            fac, tgt, tt = f["factors"][:], f["target"][:], f["target_time"][:]
            names = f["factors"].attrs["factor_names"].split(",")
        val_end = (dt.date(1995, 12, 31) - dt.date(1970, 1, 1)).days * 86400
        usable = np.arange(len(tt)) >= 19  # max(window, lookback) - 1
        test = usable & (tt > val_end)
        if s["data"]["num_test"] != int(test.sum()):
            fail(f"num_test {s['data']['num_test']}, expected {int(test.sum())} days")
        for k, name in enumerate(names):
            ic, t, sh = factor_stats(fac[test, :, k], tgt[test])
            got = (tm[f"ic_{name}"], tm[f"ic_t_{name}"], tm[f"sharpe_{name}"])
            if not np.allclose(got, (ic, t, sh), rtol=1e-4, atol=1e-5):
                fail(f"factor {name}: pipeline (ic, ic_t, sharpe) = {got}, NumPy {(ic, t, sh)}")

        sr, _ = runs["recipe"]
        sp, _ = runs["recipe_per_batch"]
        if sp["test_metrics"] != sr["test_metrics"] or sp["swa_test_metrics"] != sr["swa_test_metrics"]:
            fail(f"graphs = per_batch changed the test metrics:\n{sp['test_metrics']}\nvs\n{sr['test_metrics']}")
        if sp["data"]["graphs_built"] <= sr["data"]["graphs_built"]:
            fail(f"per_batch built {sp['data']['graphs_built']} graphs, once {sr['data']['graphs_built']}: "
                 "rebuilding every batch should build more")
        for key in ("swa_val_metrics", "swa_test_metrics"):
            if key not in sr or not np.isfinite(sr[key]["ic"]):
                fail(f"the recipe's summary.json lacks a finite {key}.ic")
        for k, name in enumerate(names):
            if sr["test_metrics"][f"ic_{name}"] != tm[f"ic_{name}"]:
                fail(f"factor {name}: the two configs disagree on the same test days")
        if not tm["ic"] > 0.3:
            fail(f"test IC {tm['ic']:.3f}: the planted reversal (IC of reversal_1d "
                 f"{tm['ic_reversal_1d']:.3f}) was not learned")
    print(f"test_stocks: ok (test IC {tm['ic']:.3f}, reversal_1d {tm['ic_reversal_1d']:.3f}; "
          f"{s['data']['num_test']} test days; graphs once {s['data']['graphs_built']}, "
          f"per batch {sp['data']['graphs_built']})")


if __name__ == "__main__":
    main()
