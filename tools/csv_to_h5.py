#!/usr/bin/env python3
"""CSV time series -> HDF5.

usage: csv_to_h5.py [--date-col date] [--date-format %Y-%m-%d] [--no-sort]
                    [--columns a,b,c] in.csv out.h5

Layout written:
  /date      [T] int64   days since 1970-01-01 (UTC calendar days)
  /date_iso  [T] str     the date as YYYY-MM-DD
  /series    [T, F] f32  every numeric column except the date, CSV order
                         (or the --columns order); attribute "columns"
  /columns   [F] str     the column names of /series (same as the attribute)
  attributes: num_rows, num_features, date_column, source, first_date, last_date

A column is numeric when every value parses as a float ("NA"/"" is refused
with the row and column named, since the loaders do not impute). Columns
holding only TRUE/FALSE are stored as 1/0. Other text columns are skipped
with a note on stderr. Rows are sorted by date (stable) unless --no-sort;
duplicate dates are reported but kept.
"""
import argparse
import csv
import datetime as dt
import sys

import h5py
import numpy as np

EPOCH = dt.date(1970, 1, 1)


def parse_date(text, fmt):
    text = text.strip()
    if fmt:
        return dt.datetime.strptime(text, fmt).date()
    # ISO date, optionally with a time part ("2001-01-22 00:00:00" / "T")
    return dt.date.fromisoformat(text[:10])


def as_number(v):
    s = v.strip()
    if s in ("TRUE", "True", "true"):
        return 1.0
    if s in ("FALSE", "False", "false"):
        return 0.0
    return float(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--date-col", default="date", help="name of the date column (default: date)")
    ap.add_argument("--date-format", default=None,
                    help="strptime format of the dates (default: ISO YYYY-MM-DD)")
    ap.add_argument("--columns", default=None,
                    help="comma-separated numeric columns to keep, in this order (default: all)")
    ap.add_argument("--no-sort", action="store_true", help="keep the CSV row order")
    args = ap.parse_args()

    with open(args.csv, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        sys.exit(f"csv_to_h5: {args.csv}: empty file")
    header, body = rows[0], [r for r in rows[1:] if r]
    if args.date_col not in header:
        sys.exit(f"csv_to_h5: {args.csv}: date column '{args.date_col}' not found "
                 f"(header: {','.join(header)}); use --date-col")
    if not body:
        sys.exit(f"csv_to_h5: {args.csv}: no data rows")
    for i, r in enumerate(body, start=2):
        if len(r) != len(header):
            sys.exit(f"csv_to_h5: {args.csv}:{i}: {len(r)} fields, header has {len(header)}")
    dci = header.index(args.date_col)

    try:
        dates = [parse_date(r[dci], args.date_format) for r in body]
    except ValueError as e:
        sys.exit(f"csv_to_h5: {args.csv}: column '{args.date_col}': {e}")

    wanted = args.columns.split(",") if args.columns else [h for h in header if h != args.date_col]
    names, cols = [], []
    for name in wanted:
        if name not in header:
            sys.exit(f"csv_to_h5: {args.csv}: column '{name}' not found")
        ci = header.index(name)
        try:
            vals = np.array([as_number(r[ci]) for r in body], np.float64)
        except ValueError:
            bad = next(i for i, r in enumerate(body, start=2) if not _is_num(r[ci]))
            if args.columns:
                sys.exit(f"csv_to_h5: {args.csv}:{bad}: column '{name}': "
                         f"'{body[bad - 2][ci]}' is not a number")
            print(f"csv_to_h5: skipping non-numeric column '{name}' "
                  f"(row {bad}: '{body[bad - 2][ci]}')", file=sys.stderr)
            continue
        names.append(name)
        cols.append(vals)
    if not cols:
        sys.exit(f"csv_to_h5: {args.csv}: no numeric columns")

    series = np.stack(cols, axis=1).astype(np.float32)
    days = np.array([(d - EPOCH).days for d in dates], np.int64)
    order = np.arange(len(days)) if args.no_sort else np.argsort(days, kind="stable")
    series, days = series[order], days[order]
    ndup = int(np.sum(np.diff(days) == 0)) if not args.no_sort else 0
    if ndup:
        print(f"csv_to_h5: note: {ndup} duplicate dates kept", file=sys.stderr)
    iso = [(EPOCH + dt.timedelta(days=int(d))).isoformat() for d in days]

    str_t = h5py.string_dtype("utf-8")
    with h5py.File(args.out, "w") as f:
        f.create_dataset("date", data=days)
        f.create_dataset("date_iso", data=iso, dtype=str_t)
        f.create_dataset("series", data=series)
        f["series"].attrs["columns"] = np.array(names, dtype=object).astype(str_t)
        f.create_dataset("columns", data=names, dtype=str_t)
        f.attrs["num_rows"] = np.int64(series.shape[0])
        f.attrs["num_features"] = np.int64(series.shape[1])
        f.attrs["date_column"] = args.date_col
        f.attrs["first_date"] = iso[0]
        f.attrs["last_date"] = iso[-1]
        f.attrs["source"] = f"csv_to_h5.py from {args.csv}"
    print(f"csv_to_h5: {args.out}: {series.shape[0]} rows x {series.shape[1]} columns, "
          f"{iso[0]} .. {iso[-1]}", file=sys.stderr)


def _is_num(v):
    try:
        as_number(v)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
