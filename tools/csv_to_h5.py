#!/usr/bin/env python3
"""CSV time series -> HDF5.

usage: csv_to_h5.py [--time-col NAME | --no-time] [--time-numeric] [--utc]
                    [--date-format FMT] [--columns a,b,c] [--no-sort]
                    [--keep-duplicates]
                    [--resample 15min|1h|1d --mid BID,ASK | --price COL [--log-return]]
                    in.csv out.h5

The time column (--time-col, alias --date-col; default: the first header
field named date, time, datetime or timestamp, any case) is one of three kinds:

  calendar dates  "2001-01-22" (or "2001-01-22 00:00:00": every time midnight,
                  no zone) -> /date, int64 days since 1970-01-01, as before;
  times of day    ISO 8601 "1997-06-01T19:28", "1997-06-01 19:28:05+07:00",
                  "...Z": converted to UTC -> /time, int64 seconds since
                  1970-01-01T00:00:00Z. A time without a zone is refused unless
                  --utc says the file's naive times are UTC (a zone given in the
                  data always wins). Sub-second parts other than zero are refused.
  numeric index   --time-numeric: the column holds numbers (R's fractional years
                  1997.4167, a step counter) -> /time_index f64, not converted.

--no-time: no time column at all; rows stay in file order (/row_order only).

Layout written (every kind):
  /series    [T, F] f32  every numeric column except the time column, CSV
                         order (or the --columns order); attribute "columns"
  /columns   [F] str     the column names of /series
  attributes: num_rows, num_features, time_kind (date|seconds|numeric|none),
              source, and per kind:
  date:     /date [T] int64 (attr unit), /date_iso [T] str YYYY-MM-DD;
            attrs date_column, first_date, last_date
  seconds:  /time [T] int64 (attr unit = "seconds since 1970-01-01T00:00:00Z"),
            /time_iso [T] str YYYY-MM-DDThh:mm:ssZ; attrs time_column,
            first_time, last_time
  numeric:  /time_index [T] f64 (attr unit); attrs time_column
  none:     nothing more

Rows are sorted by time (stable: equal times keep file order) unless
--no-sort. Duplicate times: calendar dates are reported and kept (daily files
with repeated days are common and existing configs rely on it); seconds and
numeric indices are an error naming the first repeated rows, unless
--keep-duplicates (reported and kept) or --resample (ticks sharing a time all
go into their bar, in file order; the count is reported).

--resample LEN (LEN = N s|min|h|d, e.g. 15min, 1h, 1d; needs times of day):
irregular ticks -> regular bars. Bars are aligned to multiples of LEN since
1970-01-01T00:00Z (1d: UTC midnight) and labelled by their START: the bar at
/time[t] holds the ticks with time in [time[t], time[t] + LEN). The price is
--price COL or the mid-quote (bid + ask) / 2 of --mid BID,ASK. Columns:
  open, high, low, close   first / max / min / last price of the bar's ticks
                           (file order within one timestamp)
  ticks                    number of ticks in the bar
  log_return               --log-return: ln(close_t / close_{t-1}) of the
                           closes as stored (f32: equal closes give 0); the first
                           bar has no previous close and is dropped (said on
                           stderr and in the attribute first_bar_dropped)
Bars from the first tick's bar to the last tick's bar, none skipped. An empty
bar (no tick) is explicit: open = high = low = close = the previous bar's
close (forward-filled), ticks = 0 (so log_return = 0). Other CSV columns are
not carried into resampled files. Extra attributes: bar_seconds (int64, also
on /time), resample (LEN as given), price (the price's definition),
empty_bars (their count).

A column is numeric when every value parses as a float ("NA"/"" is refused
with the row and column named, since the loaders do not impute). Columns
holding only TRUE/FALSE are stored as 1/0. Other text columns are skipped
with a note on stderr. Every error names the file, the row (1-based line of
the CSV) and column, what was expected and what was found.
"""
import argparse
import csv
import datetime as dt
import math
import re
import sys

import h5py
import numpy as np

from convert_out import atomic_output, check_names, refuse_input_as_output

EPOCH = dt.date(1970, 1, 1)
TIME_NAMES = ("date", "time", "datetime", "timestamp")
SECONDS_UNIT = "seconds since 1970-01-01T00:00:00Z"
# YYYY-MM-DD[(T| )hh:mm[:ss[.frac]]][ ][Z|UTC|+hh[:mm]|-hh[:mm]]
ISO_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})"
                    r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?"
                    r"\s*(Z|z|UTC|GMT|[+-]\d{2}(?::?\d{2})?)?$")
RESAMPLE_RE = re.compile(r"^(\d+)(s|min|h|d)$")
RESAMPLE_UNIT = {"s": 1, "min": 60, "h": 3600, "d": 86400}


class Bad(Exception):
    """A value that cannot be used: the message says what was expected."""


def fail(msg):
    sys.exit(f"csv_to_h5: {msg}")


def parse_iso(text):
    """'1997-06-01T19:28+07:00' -> (days since epoch, seconds of day or None,
    zone offset in seconds or None). Raises Bad."""
    m = ISO_RE.match(text.strip())
    if not m:
        raise Bad(f"'{text}' is not an ISO 8601 date or time (YYYY-MM-DD[Thh:mm[:ss]][Z|+hh:mm])")
    y, mo, d, hh, mi, ss, frac, zone = m.groups()
    try:
        days = (dt.date(int(y), int(mo), int(d)) - EPOCH).days
    except ValueError as e:
        raise Bad(f"'{text}': {e}") from None
    sod = None
    if hh is not None:
        h, mn, s = int(hh), int(mi), int(ss or 0)
        if h > 23 or mn > 59 or s > 59:  # no leap seconds: Unix time has none
            raise Bad(f"'{text}': time of day out of range (00:00:00 .. 23:59:59)")
        if frac and int(frac) != 0:
            raise Bad(f"'{text}': sub-second times are not supported (seconds are the unit)")
        sod = h * 3600 + mn * 60 + s
    off = None
    if zone is not None:
        if zone in ("Z", "z", "UTC", "GMT"):
            off = 0
        else:
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            zh, zm = int(digits[:2]), int(digits[2:] or 0)
            if zh > 23 or zm > 59:
                raise Bad(f"'{text}': zone offset {zone} out of range")
            off = sign * (zh * 3600 + zm * 60)
    return days, sod, off


def parse_with_format(text, fmt):
    """strptime(text, fmt) -> the same triple as parse_iso."""
    try:
        t = dt.datetime.strptime(text.strip(), fmt)
    except ValueError as e:
        raise Bad(f"'{text}' does not match --date-format '{fmt}' ({e})") from None
    if t.microsecond:
        raise Bad(f"'{text}': sub-second times are not supported (seconds are the unit)")
    days = (t.date() - EPOCH).days
    has_time = any(c in fmt for c in ("%H", "%I", "%M", "%S", "%X", "%c", "%T", "%R"))
    sod = t.hour * 3600 + t.minute * 60 + t.second if has_time else None
    off = int(t.utcoffset().total_seconds()) if t.tzinfo else None
    return days, sod, off


def as_number(v):
    s = v.strip()
    if s in ("TRUE", "True", "true"):
        return 1.0
    if s in ("FALSE", "False", "false"):
        return 0.0
    return float(s)


def _is_num(v):
    try:
        as_number(v)
        return True
    except ValueError:
        return False


def numeric_column(path, body, ci, name, first_line=2):
    """Column ci of body as float64; Bad names the first bad row."""
    out = np.empty(len(body), np.float64)
    for i, r in enumerate(body):
        try:
            out[i] = as_number(r[ci])
        except ValueError:
            raise Bad(f"{path}:{i + first_line}: column '{name}': expected a number, "
                      f"found '{r[ci]}'") from None
        if not math.isfinite(out[i]):
            raise Bad(f"{path}:{i + first_line}: column '{name}': expected a finite number, "
                      f"found '{r[ci]}'")
    return out


def find_time_col(args, header):
    if args.time_col:
        if args.time_col not in header:
            fail(f"{args.csv}: time column '{args.time_col}' not found "
                 f"(header: {','.join(header)}); use --time-col NAME or --no-time")
        return header.index(args.time_col)
    for want in TIME_NAMES:
        for i, h in enumerate(header):
            if h.strip().lower() == want:
                return i
    fail(f"{args.csv}: time column 'date' not found, nor any of {', '.join(TIME_NAMES[1:])} "
         f"(header: {','.join(header)}); use --time-col NAME, --time-numeric or --no-time")


def parse_times(args, body, tci):
    """-> (kind, values): kind 'date' (int64 days) or 'seconds' (int64 UTC seconds)."""
    name = args.header[tci]
    parsed = []
    for i, r in enumerate(body, start=2):
        try:
            parsed.append(parse_with_format(r[tci], args.date_format) if args.date_format
                          else parse_iso(r[tci]))
        except Bad as e:
            fail(f"{args.csv}:{i}: column '{name}': {e}")
    timed = any((sod is not None and sod != 0) or off is not None for _, sod, off in parsed)
    if not timed:  # calendar dates (midnight, no zone, or no time at all)
        return "date", np.array([d for d, _, _ in parsed], np.int64)
    secs = np.empty(len(parsed), np.int64)
    for i, (days, sod, off) in enumerate(parsed):
        if off is None and not args.utc:
            fail(f"{args.csv}:{i + 2}: column '{name}': '{body[i][tci]}' has a time of day but "
                 f"no time zone; give the zone in the data (Z, +07:00) or pass --utc if the "
                 f"file's times are UTC")
        secs[i] = days * 86400 + (sod or 0) - (off or 0)
    return "seconds", secs


def duplicates(t):
    """Sorted t -> indices i (into t) with t[i] == t[i - 1]."""
    return np.nonzero(np.diff(t) == 0)[0] + 1


def iso_seconds(s):
    return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=int(s))).strftime("%Y-%m-%dT%H:%M:%SZ")


def resample(args, secs, lines, body, header):
    """Ticks (sorted by time) -> bars. Returns (bar_start_seconds, names, [T, F] f64, attrs)."""
    m = RESAMPLE_RE.match(args.resample)
    if not m or int(m.group(1)) <= 0:
        fail(f"--resample {args.resample}: expected N s|min|h|d with N >= 1 (15min, 1h, 1d)")
    bar = int(m.group(1)) * RESAMPLE_UNIT[m.group(2)]
    if (args.mid is None) == (args.price is None):
        fail("--resample needs the price: --mid BID,ASK (mid-quote) or --price COL, one of them")
    try:
        if args.mid:
            cols = args.mid.split(",")
            if len(cols) != 2:
                fail(f"--mid {args.mid}: expected two columns BID,ASK")
            for c in cols:
                if c not in header:
                    fail(f"{args.csv}: --mid column '{c}' not found (header: {','.join(header)})")
            bid = numeric_column(args.csv, body, header.index(cols[0]), cols[0])
            ask = numeric_column(args.csv, body, header.index(cols[1]), cols[1])
            price = (bid + ask) / 2
            price_def = f"mid-quote ({cols[0]} + {cols[1]}) / 2"
        else:
            if args.price not in header:
                fail(f"{args.csv}: --price column '{args.price}' not found "
                     f"(header: {','.join(header)})")
            price = numeric_column(args.csv, body, header.index(args.price), args.price)
            price_def = f"column {args.price}"
    except Bad as e:
        fail(str(e))
    price = price[lines]  # body is in file order, lines is the sorted order
    b = secs // bar  # floor, also before 1970
    b0, b1 = int(b[0]), int(b[-1])
    nb = b1 - b0 + 1
    if nb > 50_000_000:
        fail(f"--resample {args.resample}: {nb} bars from {iso_seconds(secs[0])} to "
             f"{iso_seconds(secs[-1])}; more than 50,000,000")
    ohlc = np.zeros((nb, 5), np.float64)
    # ticks of bar k are the run of equal b (b is sorted)
    starts = np.concatenate(([0], np.nonzero(np.diff(b))[0] + 1))
    ends = np.concatenate((starts[1:], [len(b)]))
    filled = np.zeros(nb, bool)
    for s, e in zip(starts, ends):
        k = int(b[s]) - b0
        p = price[s:e]
        ohlc[k] = (p[0], p.max(), p.min(), p[-1], e - s)
        filled[k] = True
    for k in range(nb):  # forward fill: bar 0 is never empty
        if not filled[k]:
            c = ohlc[k - 1, 3]
            ohlc[k] = (c, c, c, c, 0)
    names = ["open", "high", "low", "close", "ticks"]
    start = (np.arange(b0, b1 + 1, dtype=np.int64)) * bar
    attrs = {"bar_seconds": np.int64(bar), "resample": args.resample, "price": price_def,
             "empty_bars": np.int64(nb - len(starts))}
    if args.log_return:
        if np.any(ohlc[:, 3] <= 0):
            k = int(np.nonzero(ohlc[:, 3] <= 0)[0][0])
            fail(f"{args.csv}: --log-return: the close of bar {iso_seconds(start[k])} is "
                 f"{ohlc[k, 3]}; log returns need prices > 0")
        if nb < 2:
            fail(f"{args.csv}: --log-return needs at least two bars, the ticks make {nb}")
        # from the closes as stored (f32), so that log_return = ln(close_t / close_t-1) of
        # the file exactly and equal closes give 0 (not the f64 mid's rounding, ~1e-16)
        c32 = ohlc[:, 3].astype(np.float32).astype(np.float64)
        r = np.log(c32[1:] / c32[:-1])
        ohlc = np.concatenate([ohlc[1:], r[:, None]], axis=1)
        start = start[1:]
        names.append("log_return")
        attrs["first_bar_dropped"] = iso_seconds(b0 * bar)
        print(f"csv_to_h5: --log-return: first bar {iso_seconds(b0 * bar)} dropped "
              f"(no previous close)", file=sys.stderr)
    print(f"csv_to_h5: resampled {len(secs)} ticks to {len(start)} bars of {args.resample} "
          f"({attrs['empty_bars']} empty, forward-filled with ticks = 0); price: {price_def}",
          file=sys.stderr)
    return start, names, ohlc, attrs


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("out")
    ap.add_argument("--time-col", "--date-col", dest="time_col", default=None,
                    help="name of the time column (default: date, time, datetime or timestamp)")
    ap.add_argument("--date-format", default=None,
                    help="strptime format of the times (default: ISO 8601)")
    ap.add_argument("--utc", action="store_true",
                    help="times of day without a zone are UTC (else they are refused)")
    ap.add_argument("--time-numeric", action="store_true",
                    help="the time column is a number (fractional years, step index): /time_index")
    ap.add_argument("--no-time", action="store_true",
                    help="no time column: keep the rows in file order")
    ap.add_argument("--columns", default=None,
                    help="comma-separated numeric columns to keep, in this order (default: all)")
    ap.add_argument("--no-sort", action="store_true", help="keep the CSV row order")
    ap.add_argument("--keep-duplicates", action="store_true",
                    help="keep rows with repeated times of day / indices (reported) instead of failing")
    ap.add_argument("--resample", default=None, help="ticks -> bars of this length: 15min, 1h, 1d")
    ap.add_argument("--mid", default=None, help="BID,ASK: resample the mid-quote (bid + ask) / 2")
    ap.add_argument("--price", default=None, help="COL: resample this price column")
    ap.add_argument("--log-return", action="store_true",
                    help="with --resample: add log_return = ln(close_t / close_t-1), first bar dropped")
    args = ap.parse_args()

    if args.no_time and (args.time_col or args.time_numeric or args.utc or args.date_format):
        fail("--no-time has no time column: --time-col, --time-numeric, --utc and --date-format "
             "do not apply")
    if args.time_numeric and (args.utc or args.date_format):
        fail("--time-numeric: the times are plain numbers; --utc and --date-format do not apply")
    if args.resample is None and (args.mid or args.price or args.log_return):
        fail("--mid, --price and --log-return apply to --resample only")
    if args.resample and (args.no_time or args.time_numeric):
        fail("--resample needs times of day (ISO 8601 with hh:mm), not --no-time or --time-numeric")
    if args.resample and args.no_sort:
        fail("--resample sorts the ticks by time; --no-sort does not apply")
    refuse_input_as_output("csv_to_h5", args.out, [args.csv])

    try:
        with open(args.csv, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        fail(f"{args.csv}: cannot read: {e}")
    if not rows:
        fail(f"{args.csv}: empty file")
    header, body = rows[0], [r for r in rows[1:] if r]
    check_names("csv_to_h5", f"{args.csv}:1", header)
    args.header = header
    tci = None if args.no_time else find_time_col(args, header)
    if not body:
        fail(f"{args.csv}: no data rows")
    for i, r in enumerate(body, start=2):
        if len(r) != len(header):
            fail(f"{args.csv}:{i}: {len(r)} fields, header has {len(header)}")
    tname = header[tci] if tci is not None else None

    # the time index
    if args.no_time:
        kind, t = "none", None
    elif args.time_numeric:
        try:
            kind, t = "numeric", numeric_column(args.csv, body, tci, tname)
        except Bad as e:
            fail(f"{e} (--time-numeric)")
    else:
        kind, t = parse_times(args, body, tci)
    if args.resample and kind != "seconds":
        fail(f"{args.csv}: --resample needs times of day; column '{tname}' holds calendar dates "
             f"only")
    order = (np.arange(len(body)) if args.no_sort or t is None
             else np.argsort(t, kind="stable"))
    ts = t[order] if t is not None else None
    # repeated times, found in time order even with --no-sort (lines: bysort[i])
    bysort = order if t is None or not args.no_sort else np.argsort(t, kind="stable")
    dup = duplicates(t[bysort]) if t is not None else np.array([], np.int64)
    if len(dup):
        what = {"date": "dates", "seconds": "timestamps", "numeric": "time indices"}[kind]
        first = int(dup[0])
        where = (f"first: lines {int(bysort[first - 1]) + 2} and {int(bysort[first]) + 2}, "
                 f"'{body[bysort[first]][tci]}'")
        if kind == "date":
            print(f"csv_to_h5: note: {len(dup)} duplicate dates kept", file=sys.stderr)
        elif args.resample:
            print(f"csv_to_h5: note: {len(dup)} ticks share their timestamp with the one before "
                  f"({where}); each goes into its bar, in file order", file=sys.stderr)
        elif args.keep_duplicates:
            print(f"csv_to_h5: note: {len(dup)} duplicate {what} kept (--keep-duplicates; "
                  f"{where})", file=sys.stderr)
        else:
            fail(f"{args.csv}: column '{tname}': {len(dup)} rows repeat the time of the row "
                 f"before ({where}); pass --keep-duplicates to keep them, or --resample to "
                 f"make bars")

    attrs = {"time_kind": kind}
    if args.resample:
        ts, names, series, extra = resample(args, ts, order, body, header)
        attrs.update(extra)
        series = series.astype(np.float32)
    else:
        wanted = args.columns.split(",") if args.columns else [h for i, h in enumerate(header)
                                                               if i != tci]
        if args.columns:
            check_names("csv_to_h5", f"--columns {args.columns}", wanted)
        names, cols = [], []
        for name in wanted:
            if name not in header:
                fail(f"{args.csv}: column '{name}' not found")
            ci = header.index(name)
            if ci == tci:
                fail(f"{args.csv}: column '{name}' is the time column")
            try:
                vals = np.array([as_number(r[ci]) for r in body], np.float64)
            except ValueError:
                bad = next(i for i, r in enumerate(body, start=2) if not _is_num(r[ci]))
                if args.columns:
                    fail(f"{args.csv}:{bad}: column '{name}': '{body[bad - 2][ci]}' is not a "
                         f"number")
                print(f"csv_to_h5: skipping non-numeric column '{name}' "
                      f"(row {bad}: '{body[bad - 2][ci]}')", file=sys.stderr)
                continue
            names.append(name)
            cols.append(vals)
        if not cols:
            fail(f"{args.csv}: no numeric columns")
        series = np.stack(cols, axis=1).astype(np.float32)[order]

    str_t = h5py.string_dtype("utf-8")
    try:
        with atomic_output(args.out) as tmp:
            span = write(args, tmp, kind, ts, tname, attrs, series, names, str_t)
    except OSError as e:
        fail(f"{args.out}: cannot write: {e} (nothing written under that name)")
    print(f"csv_to_h5: {args.out}: {series.shape[0]} rows x {series.shape[1]} columns "
          f"({kind}{span})", file=sys.stderr)


def write(args, path, kind, ts, tname, attrs, series, names, str_t):
    """The HDF5 layout of the module docstring, into `path` (a temporary name)."""
    with h5py.File(path, "w") as f:
        span = ""
        if kind == "date":
            iso = [(EPOCH + dt.timedelta(days=int(d))).isoformat() for d in ts]
            f.create_dataset("date", data=ts)
            f["date"].attrs["unit"] = "days since 1970-01-01"
            f.create_dataset("date_iso", data=iso, dtype=str_t)
            f.attrs["date_column"] = tname
            f.attrs["first_date"], f.attrs["last_date"] = iso[0], iso[-1]
            span = f", {iso[0]} .. {iso[-1]}"
        elif kind == "seconds":
            iso = [iso_seconds(s) for s in ts]
            f.create_dataset("time", data=ts.astype(np.int64))
            f["time"].attrs["unit"] = SECONDS_UNIT
            if args.resample:
                f["time"].attrs["bar_seconds"] = attrs["bar_seconds"]
                f["time"].attrs["label"] = "bar start: bar t holds [time[t], time[t] + bar_seconds)"
            f.create_dataset("time_iso", data=iso, dtype=str_t)
            f.attrs["time_column"] = tname
            f.attrs["first_time"], f.attrs["last_time"] = iso[0], iso[-1]
            span = f", {iso[0]} .. {iso[-1]}"
        elif kind == "numeric":
            f.create_dataset("time_index", data=ts)
            f["time_index"].attrs["unit"] = (f"as in column '{tname}' of the CSV (not converted)")
            f.attrs["time_column"] = tname
            span = f", {tname} {ts[0]:g} .. {ts[-1]:g}"
        f.create_dataset("series", data=series)
        f["series"].attrs["columns"] = np.array(names, dtype=object).astype(str_t)
        f.create_dataset("columns", data=names, dtype=str_t)
        f.attrs["num_rows"] = np.int64(series.shape[0])
        f.attrs["num_features"] = np.int64(series.shape[1])
        for k, v in attrs.items():
            f.attrs[k] = v
        f.attrs["source"] = f"csv_to_h5.py from {args.csv}"
    return span


if __name__ == "__main__":
    main()
