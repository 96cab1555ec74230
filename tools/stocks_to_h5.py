#!/usr/bin/env python3
"""Daily closing prices of a set of stocks (CSV) -> the stock-panel HDF5 of
hdf5_panel (configs/gat_stocks.ini).

usage: stocks_to_h5.py [--date-col date] prices.csv out.h5

Input: one row per trading day, a YYYY-MM-DD date column and one column of
closing prices per stock (tools/fetch_dowjones.sh writes such a file). Every
price must be a finite number > 0, dates strictly increasing; anything else is
an error naming the file, the line and the column.

Row t of the output holds what is known at the close of day t, computed from
the prices p[0..t] only (no look-ahead; tools/tests/test_stocks_to_h5.py
checks that changing every price after day t leaves rows 0..t unchanged):

  features [T, S, F] f32, F = 5, attribute feature_names:
    ret_1d      log(p[t] / p[t-1])
    ret_5d      log(p[t] / p[t-5])
    ret_20d     log(p[t] / p[t-20])
    vol_20d     sample standard deviation (ddof 1) of ret_1d over t-19..t
    ma_gap_20d  log(p[t] / mean(p[t-19..t]))
  factors [T, S, K] f32, K = 3, attribute factor_names: the classical
    cross-sectional signals, each a prediction of the next day's return:
    reversal_1d = -ret_1d, reversal_5d = -ret_5d, momentum_20d = ret_20d
    (Jegadeesh 1990 short-term reversal; Jegadeesh & Titman 1993 momentum,
    here over one month).
  target [T, S] f32: log(p[t+1] / p[t]), the next day's log return.
  time [T] i64: day t, seconds since 1970-01-01T00:00:00Z (midnight UTC).
  target_time [T] i64: day t+1, the day whose return is the target.
  names [S] str: the tickers (CSV header order).
  time_iso [T] str: day t as YYYY-MM-DD.

The first 20 price days (the warm-up of the 20-day features) and the last
one (no next day) are not rows, so every value is finite and T = days - 21.
Computed in float64, stored as float32.
"""
import argparse
import csv
import datetime as dt
import sys

import h5py
import numpy as np

from convert_out import atomic_output, check_names, refuse_input_as_output

FEATURES = ["ret_1d", "ret_5d", "ret_20d", "vol_20d", "ma_gap_20d"]
FACTORS = ["reversal_1d", "reversal_5d", "momentum_20d"]
WARMUP = 20
EPOCH = dt.date(1970, 1, 1)


def fail(msg):
    print(f"stocks_to_h5: {msg}", file=sys.stderr)
    sys.exit(1)


def read_prices(path, date_col):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        fail(f"{path}: empty file")
    check_names("stocks_to_h5", f"{path}:1", rows[0])
    header = [h.strip() for h in rows[0]]
    if date_col not in header:
        fail(f"{path}:1: no column '{date_col}' (found {', '.join(header[:5])}...)")
    di = header.index(date_col)
    tickers = [h for i, h in enumerate(header) if i != di]
    if not tickers:
        fail(f"{path}:1: no price column besides '{date_col}'")
    if len(set(tickers)) != len(tickers):
        fail(f"{path}:1: repeated column names")
    days, prices = [], []
    for ln, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            fail(f"{path}:{ln}: {len(row)} fields, expected {len(header)}")
        try:
            d = dt.date.fromisoformat(row[di].strip())
        except ValueError:
            fail(f"{path}:{ln}: column '{date_col}': '{row[di]}' is not a YYYY-MM-DD date")
        if days and d <= days[-1]:
            fail(f"{path}:{ln}: date {d} does not come after {days[-1]} (line {ln - 1}); "
                 f"dates must strictly increase")
        vals = []
        for i, v in enumerate(row):
            if i == di:
                continue
            try:
                x = float(v)
            except ValueError:
                x = float("nan")
            if not np.isfinite(x) or x <= 0:
                fail(f"{path}:{ln}: column '{header[i]}': price '{v}' is not a finite number > 0")
            vals.append(x)
        days.append(d)
        prices.append(vals)
    if len(days) < WARMUP + 2:
        fail(f"{path}: {len(days)} days; at least {WARMUP + 2} needed "
             f"({WARMUP} of warm-up, one row, one next day)")
    return days, tickers, np.asarray(prices, dtype=np.float64)


def compute(p):
    """p [D, S] prices -> features [T, S, F], factors [T, S, K], target [T, S]
    for the days t = WARMUP .. D-2 (T = D - WARMUP - 1). Only p[..t] enters
    row t's features and factors."""
    D, S = p.shape
    lp = np.log(p)
    r1 = np.full((D, S), np.nan)
    r1[1:] = lp[1:] - lp[:-1]
    rows = range(WARMUP, D - 1)
    feats = np.empty((len(rows), S, len(FEATURES)))
    target = np.empty((len(rows), S))
    for i, t in enumerate(rows):
        feats[i, :, 0] = r1[t]
        feats[i, :, 1] = lp[t] - lp[t - 5]
        feats[i, :, 2] = lp[t] - lp[t - 20]
        feats[i, :, 3] = np.std(r1[t - 19:t + 1], axis=0, ddof=1)
        feats[i, :, 4] = lp[t] - np.log(np.mean(p[t - 19:t + 1], axis=0))
        target[i] = lp[t + 1] - lp[t]
    factors = np.stack([-feats[:, :, 0], -feats[:, :, 1], feats[:, :, 2]], axis=2)
    return feats, factors, target


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--date-col", default="date", help="name of the date column (default: date)")
    args = ap.parse_args()
    refuse_input_as_output("stocks_to_h5", args.out, [args.csv])

    days, tickers, p = read_prices(args.csv, args.date_col)
    feats, factors, target = compute(p)
    if not (np.all(np.isfinite(feats)) and np.all(np.isfinite(target))):
        fail(f"{args.csv}: non-finite features or targets (a price too close to 0?)")
    T = feats.shape[0]
    secs = np.array([(d - EPOCH).days * 86400 for d in days], dtype=np.int64)
    time = secs[WARMUP:WARMUP + T]
    target_time = secs[WARMUP + 1:WARMUP + 1 + T]
    str_t = h5py.string_dtype("utf-8")
    unit = "seconds since 1970-01-01T00:00:00Z (the day's midnight UTC)"
    with atomic_output(args.out) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("time", data=time)
        f["time"].attrs["unit"] = unit
        f.create_dataset("target_time", data=target_time)
        f["target_time"].attrs["unit"] = unit
        f.create_dataset("time_iso", data=[d.isoformat() for d in days[WARMUP:WARMUP + T]],
                         dtype=str_t)
        f.create_dataset("names", data=tickers, dtype=str_t)
        f.create_dataset("features", data=feats.astype(np.float32))
        f["features"].attrs["feature_names"] = ",".join(FEATURES)
        f.create_dataset("factors", data=factors.astype(np.float32))
        f["factors"].attrs["factor_names"] = ",".join(FACTORS)
        f.create_dataset("target", data=target.astype(np.float32))
        f["target"].attrs["meaning"] = "log(p[t+1] / p[t]): the next trading day's log return"
        f.attrs["num_days"] = np.int64(T)
        f.attrs["num_stocks"] = np.int64(len(tickers))
        f.attrs["first_day"] = days[WARMUP].isoformat()
        f.attrs["last_day"] = days[WARMUP + T - 1].isoformat()
        f.attrs["source"] = f"stocks_to_h5.py from {args.csv}"
    print(f"stocks_to_h5: wrote {args.out}: {T} days ({days[WARMUP]} .. {days[WARMUP + T - 1]}, "
          f"the first {WARMUP} and the last price day are not rows), {len(tickers)} stocks, "
          f"{len(FEATURES)} features, {len(FACTORS)} factors", file=sys.stderr)


if __name__ == "__main__":
    main()
