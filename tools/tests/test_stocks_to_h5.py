#!/usr/bin/env python3
"""Test tools/stocks_to_h5.py on small synthetic price files.

- every feature, factor and target of a 3-stock, 40-day file against values
  computed here element by element with math.log (no NumPy vector code shared
  with the converter);
- no look-ahead: for several days t, multiplying every price after day t by a
  random factor leaves rows 0..t's features and factors unchanged (and
  changes row t's target, which is the next day's return by definition);
- bad input (a non-positive price, a repeated date, a short file) is refused
  with a message naming the file, the line and the column.
"""
import math
import os
import random
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "stocks_to_h5.py")
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def write_csv(path, dates, tickers, prices):
    with open(path, "w") as fh:
        fh.write("date," + ",".join(tickers) + "\n")
        for d, row in zip(dates, prices):
            fh.write(d + "," + ",".join(repr(float(v)) for v in row) + "\n")


def convert(csv_path, out):
    return subprocess.run([sys.executable, TOOL, csv_path, out], capture_output=True, text=True)


def dates_of(n):
    import datetime as dt
    d0 = dt.date(1995, 1, 2)
    return [(d0 + dt.timedelta(days=i + 2 * (i // 5))).isoformat() for i in range(n)]


def expected(p, t):
    """Row for price day t, by hand: features [S][5], factors [S][3], target [S]."""
    feats, facs, tgt = [], [], []
    for s in range(len(p[0])):
        r = [math.log(p[u][s] / p[u - 1][s]) for u in range(t - 19, t + 1)]
        mean_r = sum(r) / 20
        vol = math.sqrt(sum((x - mean_r) ** 2 for x in r) / 19)
        ma = sum(p[u][s] for u in range(t - 19, t + 1)) / 20
        f = [math.log(p[t][s] / p[t - 1][s]), math.log(p[t][s] / p[t - 5][s]),
             math.log(p[t][s] / p[t - 20][s]), vol, math.log(p[t][s] / ma)]
        feats.append(f)
        facs.append([-f[0], -f[1], f[2]])
        tgt.append(math.log(p[t + 1][s] / p[t][s]))
    return feats, facs, tgt


def main():
    rng = random.Random(7)
    n, tickers = 40, ["AAA", "BBB", "CCC"]
    prices = [[100.0, 20.0, 5.0]]
    for _ in range(n - 1):
        prices.append([v * math.exp(rng.gauss(0, 0.02)) for v in prices[-1]])
    dates = dates_of(n)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path, out = os.path.join(tmp, "p.csv"), os.path.join(tmp, "p.h5")
        write_csv(csv_path, dates, tickers, prices)
        r = convert(csv_path, out)
        check(r.returncode == 0, f"convert failed: {r.stderr}")
        with h5py.File(out) as f:
            T = f["features"].shape[0]
            check(T == n - 21, f"rows {T}, expected {n - 21}")
            check(f["features"].attrs["feature_names"] == "ret_1d,ret_5d,ret_20d,vol_20d,ma_gap_20d",
                  "feature_names")
            check(f["factors"].attrs["factor_names"] == "reversal_1d,reversal_5d,momentum_20d",
                  "factor_names")
            check([x.decode() for x in f["names"][:]] == tickers, "names")
            feats, facs, tgt = f["features"][:], f["factors"][:], f["target"][:]
            time, ttime = f["time"][:], f["target_time"][:]
            iso = [x.decode() for x in f["time_iso"][:]]
        for i in range(T):
            t = i + 20
            ef, ek, et = expected(prices, t)
            check(np.allclose(feats[i], ef, rtol=1e-5, atol=1e-6), f"features of row {i}")
            check(np.allclose(facs[i], ek, rtol=1e-5, atol=1e-6), f"factors of row {i}")
            check(np.allclose(tgt[i], et, rtol=1e-5, atol=1e-6), f"target of row {i}")
            check(iso[i] == dates[t], f"time_iso of row {i}: {iso[i]} != {dates[t]}")
        check(np.all(ttime[:-1] == time[1:]), "target_time[i] == time[i+1]")
        check(np.all(np.diff(time) > 0), "time increases")

        # no look-ahead: perturb every price after day t
        for t in (20, 27, 38):
            later = [row[:] if u <= t else [v * math.exp(rng.uniform(-0.3, 0.3)) for v in row]
                     for u, row in enumerate(prices)]
            csv2, out2 = os.path.join(tmp, f"q{t}.csv"), os.path.join(tmp, f"q{t}.h5")
            write_csv(csv2, dates, tickers, later)
            r = convert(csv2, out2)
            check(r.returncode == 0, f"convert of the perturbed file failed: {r.stderr}")
            with h5py.File(out2) as f:
                rows = t - 20 + 1
                check(np.array_equal(f["features"][:rows], feats[:rows]),
                      f"features of rows 0..{rows - 1} changed when prices after day {t} changed")
                check(np.array_equal(f["factors"][:rows], facs[:rows]),
                      f"factors of rows 0..{rows - 1} changed when prices after day {t} changed")
                check(not np.array_equal(f["target"][rows - 1], tgt[rows - 1]),
                      f"row {rows - 1}'s target is day {t + 1}'s return and should have changed")
                if rows < T:
                    check(not np.array_equal(f["features"][rows], feats[rows]),
                          f"row {rows} should see the changed price of day {t + 1}")

        # bad input
        bad = [r[:] for r in prices]
        bad[25][1] = 0.0
        write_csv(csv_path, dates, tickers, bad)
        r = convert(csv_path, out)
        check(r.returncode != 0 and "p.csv:27: column 'BBB'" in r.stderr and "> 0" in r.stderr,
              f"zero price: {r.stderr}")
        d2 = dates[:]
        d2[10] = d2[9]
        write_csv(csv_path, d2, tickers, prices)
        r = convert(csv_path, out)
        check(r.returncode != 0 and "p.csv:12: date" in r.stderr and "strictly increase" in r.stderr,
              f"repeated date: {r.stderr}")
        write_csv(csv_path, dates[:21], tickers, prices[:21])
        r = convert(csv_path, out)
        check(r.returncode != 0 and "21 days; at least 22" in r.stderr, f"short file: {r.stderr}")

    if FAILS:
        print(f"{len(FAILS)} check(s) failed", file=sys.stderr)
        sys.exit(1)
    print("test_stocks_to_h5: all checks passed")


if __name__ == "__main__":
    main()
