#!/usr/bin/env python3
"""new_series.py - the shipped LSTM recipe (configs/lstm_chicago.ini) on
series it was not developed on, unchanged except the data path, the target,
the seasonal period and the split dates (issue 22, "Bring your own data").

For each series and seed: `pipeline run configs/lstm_chicago.ini` with those
overrides; the table gives the test MAE of the model (best-val_mae
checkpoint) beside the seasonal naive y[t-s] and the corrected seasonal
naive y[t-s] + (y[t-1] - y[t-1-s]) on the same test windows, and the
validation MAE the checkpoint was chosen by. Nothing here is tuned: the
recipe's options are the Chicago ones.

  sh tools/fetch_taylor.sh && python3 tools/csv_to_h5.py data/taylor_hourly.csv data/taylor_hourly.h5
  sh tools/fetch_pm10.sh && python3 tools/csv_to_h5.py data/pm10_deth026.csv data/pm10_deth026.h5
  python3 bench/lstm/new_series.py --pipeline build/core/pipeline --seeds 42,1,2 --jobs 2
"""
import argparse
import json
import os
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor

SERIES = {
    # name: (path, target, seasonal_period, train_end, val_end)
    "taylor_hourly": ("data/taylor_hourly.h5", "demand", 24, "2000-07-30", "2000-08-13"),
    "pm10_deth026": ("data/pm10_deth026.h5", "pm10", 7, "2008-06-30", "2008-12-31"),
    # the series the recipe was developed on, with its own settings (--series chicago)
    "chicago": ("data/chicago.h5", "ridership", 7, "2013-12-31", "2014-12-31"),
}
NEW = "taylor_hourly,pm10_deth026"


def one(exe, run_dir, name, seed, extra):
    path, target, period, te, ve = SERIES[name]
    tag = "%s_s%d" % (name, seed)
    ov = ["pipeline.name=" + tag, "pipeline.run_dir=" + run_dir, "pipeline.seed=%d" % seed,
          "pipeline.threads=1", "data.path=" + path, "data.target_columns=" + target,
          "data.train_end=" + te, "data.val_end=" + ve,
          "model.seasonal_period=%d" % period,
          # the loader's training-window MAE of both baselines (naive_skip = auto reads them)
          "data.naive_period=%d" % period] + extra
    log = os.path.join(run_dir, tag + ".log")
    os.makedirs(run_dir, exist_ok=True)
    with open(log, "w") as f:
        subprocess.run([exe, "run", "configs/lstm_chicago.ini"] + ov, stdout=f, stderr=f,
                       check=True, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    with open(os.path.join(run_dir, tag, "latest", "summary.json")) as f:
        s = json.load(f)
    t = s["test_metrics"]
    d = s.get("data", {})
    print("%s: training-window MAE naive %s, corrected %s; naive_skip = auto took %s"
          % (tag, d.get("train_seasonal_naive_mae"), d.get("train_seasonal_naive_corrected_mae"),
             d.get("naive_skip_auto", "(not auto)")), flush=True)
    return name, seed, t["mae"], t["seasonal_naive_mae"], t["seasonal_naive_corrected_mae"], \
        s.get("best_monitor")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipeline", default="build/core/pipeline")
    ap.add_argument("--seeds", default="42,1,2")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--run-dir", default="runs/lstm_new_series")
    ap.add_argument("--series", default=NEW, help="from %s" % ",".join(SERIES))
    ap.add_argument("extra", nargs="*", help="more overrides for every run")
    a = ap.parse_args()
    jobs = [(n, int(s)) for n in a.series.split(",") for s in a.seeds.split(",")]
    with ThreadPoolExecutor(a.jobs) as ex:
        res = list(ex.map(lambda j: one(a.pipeline, a.run_dir, j[0], j[1], a.extra), jobs))
    print("| series | seed | val MAE (best) | test MAE | seasonal naive | corrected naive | x naive | x corrected |")
    print("|---|---|---|---|---|---|---|---|")
    for n, s, m, nv, cr, bv in res:
        print("| %s | %d | %.4g | %.4g | %.4g | %.4g | %.3f | %.3f |" % (n, s, bv or float("nan"), m, nv, cr,
                                                                      m / nv, m / cr))
    for n in SERIES:
        ms = [r[2] for r in res if r[0] == n]
        if not ms:
            continue
        sd = statistics.stdev(ms) if len(ms) > 1 else 0.0
        r0 = [r for r in res if r[0] == n][0]
        print("%s: test MAE %.4g +- %.2g (mean +- sd over %d seeds); naive %.4g, corrected %.4g"
              % (n, statistics.mean(ms), sd, len(ms), r0[3], r0[4]))


if __name__ == "__main__":
    main()
