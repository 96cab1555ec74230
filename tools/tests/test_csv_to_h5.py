#!/usr/bin/env python3
"""Test tools/csv_to_h5.py on hand-made CSVs with hand-computed answers: calendar
dates (unsorted, TRUE/FALSE, a text column skipped), ISO 8601 times of day
with zones (converted to UTC), naive times (refused without --utc),
duplicate timestamps (refused or kept on request), numeric time indices,
no time column, and ticks resampled to OHLC bars of the mid-quote (empty bars
forward-filled), the output discipline (an output that is an input, repeated
or empty column names, a write failing half-way: issue 34); then, when
present, the real Chicago (5,698 days) and USD/THB tick (2,984 quotes) files.

Day 10013 is 1997-06-01: 27 years from 1970 with 7 leap days (1972 .. 1996)
= 9862 days, plus January .. May 1997 (151 days)."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "csv_to_h5.py")
SHARED_TS = os.path.join(HERE, "..", "..", "..", "shared", "data", "timeseries")
SHARED = os.path.join(SHARED_TS, "chicago_ridership.csv")
USDTHB = os.path.join(SHARED_TS, "usdthb_ticks.csv")
D0 = 10013 * 86400  # 1997-06-01T00:00:00Z in seconds


def convert(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    return r


def write(d, name, text):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def strs(ds):
    return [v.decode() for v in ds[:]]


def times_of_day_with_zones_are_converted_to_utc(d):
    # unsorted; three zones; the sort must carry the series rows along
    p = write(d, "z.csv", "time,v\n"
              "1997-06-01T19:28:00+07:00,1\n"   # 12:28Z
              "1997-06-01T12:00Z,2\n"            # 12:00Z
              "1997-06-01 11:00:30-0130,3\n"     # 12:30:30Z
              "1997-05-31T23:59:59Z,4\n")        # day before
    out = os.path.join(d, "z.h5")
    r = convert(p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        want = [D0 - 1, D0 + 12 * 3600, D0 + 12 * 3600 + 28 * 60, D0 + 12 * 3600 + 30 * 60 + 30]
        np.testing.assert_array_equal(f["time"][:], want)
        assert f["time"].dtype == np.int64
        assert f["time"].attrs["unit"] == "seconds since 1970-01-01T00:00:00Z"
        assert strs(f["time_iso"]) == ["1997-05-31T23:59:59Z", "1997-06-01T12:00:00Z",
                                       "1997-06-01T12:28:00Z", "1997-06-01T12:30:30Z"]
        np.testing.assert_array_equal(f["series"][:, 0], [4, 2, 1, 3])
        assert f.attrs["time_kind"] == "seconds" and "date" not in f


def naive_times_need_utc(d):
    p = write(d, "n.csv", "when,v\n1997-06-01T00:00,1\n1997-06-01T19:28,2\n")
    out = os.path.join(d, "n.h5")
    r = convert("--time-col", "when", p, out)
    assert r.returncode != 0 and "no time zone" in r.stderr and "--utc" in r.stderr, r.stderr
    assert "n.csv:2" in r.stderr, r.stderr  # the first naive time
    r = convert("--time-col", "when", "--utc", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["time"][:], [D0, D0 + 19 * 3600 + 28 * 60])
    # a zone in the data wins over --utc
    p = write(d, "n2.csv", "when,v\n1997-06-01T07:00+07:00,1\n")
    r = convert("--time-col", "when", "--utc", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["time"][:], [D0])


def midnight_dates_stay_calendar_days(d):
    # every time midnight and no zone: the old layout (/date in days), which
    # existing configs read
    p = write(d, "m.csv", "date,v\n1997-06-02 00:00:00,1\n1997-06-01 00:00:00,2\n")
    out = os.path.join(d, "m.h5")
    r = convert(p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["date"][:], [10013, 10014])
        assert f.attrs["time_kind"] == "date" and "time" not in f


def bad_times_name_the_line(d):
    out = os.path.join(d, "b.h5")
    for bad, why in (("1997-06-01T25:00Z", "out of range"), ("1997-13-01", "month"),
                     ("01/06/1997", "not an ISO 8601"), ("1997-06-01T10:00:00.5Z", "sub-second")):
        p = write(d, "b.csv", f"time,v\n1997-06-01T00:00Z,1\n{bad},2\n")
        r = convert(p, out)
        assert r.returncode != 0 and "b.csv:3" in r.stderr and why in r.stderr, (bad, r.stderr)


def duplicate_timestamps_are_refused_or_kept_on_request(d):
    p = write(d, "d.csv", "time,v\n1997-06-01T10:00Z,1\n1997-06-01T09:00Z,2\n"
              "1997-06-01T10:00Z,3\n")
    out = os.path.join(d, "d.h5")
    r = convert(p, out)
    assert r.returncode != 0 and "1 rows repeat" in r.stderr and "lines 2 and 4" in r.stderr, r.stderr
    assert "--keep-duplicates" in r.stderr
    r = convert("--keep-duplicates", p, out)
    assert r.returncode == 0 and "1 duplicate timestamps kept" in r.stderr, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["time"][:], [D0 + 9 * 3600, D0 + 10 * 3600, D0 + 10 * 3600])
        np.testing.assert_array_equal(f["series"][:, 0], [2, 1, 3])  # stable: file order kept


def numeric_time_index(d):
    # R's fractional years: sorted, stored as given, never converted
    p = write(d, "y.csv", "year,v\n1997.5,1\n1997.25,2\n1997.75,3\n")
    out = os.path.join(d, "y.h5")
    r = convert("--time-col", "year", "--time-numeric", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["time_index"][:], [1997.25, 1997.5, 1997.75])
        assert f["time_index"].dtype == np.float64
        np.testing.assert_array_equal(f["series"][:, 0], [2, 1, 3])
        assert f.attrs["time_kind"] == "numeric" and "time" not in f and "date" not in f
        assert strs(f["columns"]) == ["v"]
    p = write(d, "y2.csv", "year,v\n1997.5,1\n1997.5,2\n")
    r = convert("--time-col", "year", "--time-numeric", p, out)
    assert r.returncode != 0 and "repeat" in r.stderr, r.stderr
    p = write(d, "y3.csv", "year,v\n1997.5,1\nNA,2\n")
    r = convert("--time-col", "year", "--time-numeric", p, out)
    assert r.returncode != 0 and "y3.csv:3" in r.stderr and "'NA'" in r.stderr, r.stderr


def no_time_keeps_row_order(d):
    p = write(d, "r.csv", "b,name,a\n3,x,1\n1,y,2\n2,z,3\n")
    out = os.path.join(d, "r.h5")
    r = convert(p, out)  # no time column found: said, with the ways out
    assert r.returncode != 0 and "--no-time" in r.stderr, r.stderr
    r = convert("--no-time", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["series"][:], [[3, 1], [1, 2], [2, 3]])
        assert strs(f["columns"]) == ["b", "a"]
        assert f.attrs["time_kind"] == "none"
        assert not any(k in f for k in ("date", "time", "time_index"))


TICKS = ("time,bid,ask,size\n"
         "1997-06-01T02:10Z,20,20,7\n"   # bar 02:00 (listed first: the sort moves it)
         "1997-06-01T00:05Z,10,12,1\n"   # mid 11, bar 00:00
         "1997-06-01T00:40Z,12,14,2\n"   # mid 13, bar 00:00 (00:30 for 15min)
         "1997-06-01T00:40Z,8,10,3\n")   # mid 9, same time: after the one above (file order)


def ticks_resample_to_ohlc_bars_of_the_mid_quote(d):
    p = write(d, "t.csv", TICKS)
    out = os.path.join(d, "t.h5")
    r = convert("--resample", "1h", "--mid", "bid,ask", p, out)
    assert r.returncode == 0, r.stderr
    assert "1 ticks share their timestamp" in r.stderr and "1 empty" in r.stderr, r.stderr
    with h5py.File(out) as f:
        assert strs(f["columns"]) == ["open", "high", "low", "close", "ticks"]
        np.testing.assert_array_equal(f["time"][:], [D0, D0 + 3600, D0 + 7200])
        np.testing.assert_array_equal(f["series"][:], [[11, 13, 9, 9, 3],
                                                       [9, 9, 9, 9, 0],  # empty: close carried
                                                       [20, 20, 20, 20, 1]])
        assert f.attrs["bar_seconds"] == 3600 and f["time"].attrs["bar_seconds"] == 3600
        assert f.attrs["empty_bars"] == 1 and f.attrs["resample"] == "1h"
    r = convert("--resample", "15min", "--mid", "bid,ask", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        s = f["series"][:]
        assert s.shape == (9, 5)  # 00:00 .. 02:00
        np.testing.assert_array_equal(s[0], [11, 11, 11, 11, 1])
        np.testing.assert_array_equal(s[1], [11, 11, 11, 11, 0])
        np.testing.assert_array_equal(s[2], [13, 13, 9, 9, 2])
        np.testing.assert_array_equal(s[8], [20, 20, 20, 20, 1])
        assert f.attrs["empty_bars"] == 6
    r = convert("--resample", "1d", "--price", "size", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["time"][:], [D0])
        np.testing.assert_array_equal(f["series"][:], [[1, 7, 1, 7, 4]])  # sizes 1, 2, 3, 7 by time


def log_return_drops_the_first_bar(d):
    p = write(d, "t.csv", TICKS)
    out = os.path.join(d, "t.h5")
    r = convert("--resample", "1h", "--mid", "bid,ask", "--log-return", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert strs(f["columns"])[-1] == "log_return"
        np.testing.assert_array_equal(f["time"][:], [D0 + 3600, D0 + 7200])
        np.testing.assert_allclose(f["series"][:, 5], [0, np.log(20 / 9)], rtol=1e-6)
        assert f.attrs["first_bar_dropped"] == "1997-06-01T00:00:00Z"


def resample_refusals(d):
    p = write(d, "t.csv", TICKS)
    out = os.path.join(d, "t.h5")
    for args, why in ((["--resample", "1h"], "--mid BID,ASK"),
                      (["--resample", "1h", "--mid", "bid,ask", "--price", "bid"], "one of them"),
                      (["--resample", "90m", "--price", "bid"], "expected N s|min|h|d"),
                      (["--resample", "1h", "--mid", "bid,nope"], "'nope' not found"),
                      (["--mid", "bid,ask"], "apply to --resample only")):
        r = convert(*args, p, out)
        assert r.returncode != 0 and why in r.stderr, (args, r.stderr)
    p = write(d, "c.csv", "date,bid\n1997-06-01,1\n")
    r = convert("--resample", "1h", "--price", "bid", p, out)
    assert r.returncode != 0 and "calendar dates" in r.stderr, r.stderr
    p = write(d, "e.csv", "time,bid,ask\n1997-06-01T00:00Z,1,NA\n")
    r = convert("--resample", "1h", "--mid", "bid,ask", p, out)
    assert r.returncode != 0 and "e.csv:2" in r.stderr and "'ask'" in r.stderr, r.stderr


def real_usdthb_ticks():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "u.h5")
        r = convert("--utc", "--resample", "1h", "--mid", "bid,ask", USDTHB, out)
        assert r.returncode == 0, r.stderr
        with h5py.File(out) as f:
            # 1997-06-01T19:00Z .. 1997-06-30T23:00Z: 29 days x 24 + 5 hourly bars
            assert f["series"].shape == (701, 5)
            assert strs(f["time_iso"])[0] == "1997-06-01T19:00:00Z"
            assert strs(f["time_iso"])[-1] == "1997-06-30T23:00:00Z"
            assert np.all(np.diff(f["time"][:]) == 3600)
            assert f["series"][:, 4].sum() == 2984  # every quote in one bar
            # first bar: quotes at 19:28 (24.8/25) and 19:31 (24.82/25.02)
            np.testing.assert_allclose(f["series"][0], [24.9, 24.92, 24.9, 24.92, 2], rtol=1e-6)
        r = convert("--utc", "--resample", "1h", "--mid", "bid,ask", "--log-return", USDTHB, out)
        assert r.returncode == 0, r.stderr
        with h5py.File(out) as f:
            s = f["series"][:]
            # every return is that of the stored closes; equal closes (mids such as
            # (24.83 + 25.03) / 2 and (24.85 + 25.01) / 2) give exactly 0, not 2e-16
            np.testing.assert_allclose(s[1:, 5], np.log(s[1:, 3].astype(np.float64) / s[:-1, 3]),
                                       rtol=1e-6, atol=0)
            r5 = s[:, 5][s[:, 5] != 0]
            assert np.min(np.abs(r5)) > 1e-6, np.min(np.abs(r5))


def output_that_is_an_input_is_refused(d):
    # issue 34: `csv_to_h5.py a.csv a.csv` replaced the CSV with HDF5
    text = "date,v\n2001-01-01,1\n2001-01-02,2\n"
    p = write(d, "in.csv", text)
    os.symlink(p, os.path.join(d, "link.h5"))
    os.link(p, os.path.join(d, "hard.h5"))
    for out in (p, os.path.join(d, ".", "in.csv"), os.path.join(d, "link.h5"),
                os.path.join(d, "hard.h5")):
        r = convert(p, out)
        assert r.returncode != 0 and "is the input" in r.stderr, (out, r.stderr)
        with open(p) as f:
            assert f.read() == text, out
    r = convert(p, d)
    assert r.returncode != 0 and "is a directory" in r.stderr, r.stderr
    os.unlink(os.path.join(d, "link.h5"))
    os.unlink(os.path.join(d, "hard.h5"))


def duplicate_or_empty_column_names_are_refused(d):
    # issue 34: a repeated name stored the first column's values twice
    out = os.path.join(d, "dup.h5")
    p = write(d, "dup.csv", "date,v,w,v\n2001-01-01,1,2,3\n")
    r = convert(p, out)
    assert r.returncode != 0 and "columns 2 and 4 are both named 'v'" in r.stderr, r.stderr
    assert "dup.csv:1" in r.stderr and not os.path.exists(out), r.stderr
    p = write(d, "empty.csv", "date,v,,w\n2001-01-01,1,2,3\n")
    r = convert(p, out)
    assert r.returncode != 0 and "column 3 has an empty name" in r.stderr, r.stderr
    p = write(d, "ok.csv", "date,v,w\n2001-01-01,1,2\n")
    r = convert("--columns", "w,v,w", p, out)
    assert r.returncode != 0 and "columns 1 and 3 are both named 'w'" in r.stderr, r.stderr
    r = convert("--columns", "w,v", p, out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["series"][:], [[2, 1]])


FAIL_WRITE = """
import h5py, runpy, sys
orig = h5py.Group.create_dataset
def full_disk(self, name, *a, **k):
    if name == "series":
        raise OSError(28, "No space left on device")
    return orig(self, name, *a, **k)
h5py.Group.create_dataset = full_disk
sys.argv = sys.argv[1:]
sys.path.insert(0, __import__("os").path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def failed_write_keeps_the_previous_output(d):
    # issue 34: the output was written in place, so a full disk left a partial
    # file under the final name and destroyed the previous good output
    sub = os.path.join(d, "atomic")
    os.mkdir(sub)
    out = os.path.join(sub, "o.h5")
    p = write(d, "a1.csv", "date,v\n2001-01-01,7\n")
    assert convert(p, out).returncode == 0
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~mask, oct(os.stat(out).st_mode)
    p = write(d, "a2.csv", "date,v\n2001-01-01,8\n2001-01-02,9\n")
    r = subprocess.run([sys.executable, "-c", FAIL_WRITE, TOOL, p, out], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr
    assert "nothing written under that name" in r.stderr, r.stderr
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["series"][:], [[7]])
    assert os.listdir(sub) == ["o.h5"], os.listdir(sub)  # no temporary left behind


def main():
    with tempfile.TemporaryDirectory() as d:
        for t in (times_of_day_with_zones_are_converted_to_utc, naive_times_need_utc,
                  midnight_dates_stay_calendar_days, bad_times_name_the_line,
                  duplicate_timestamps_are_refused_or_kept_on_request, numeric_time_index,
                  no_time_keeps_row_order, ticks_resample_to_ohlc_bars_of_the_mid_quote,
                  log_return_drops_the_first_bar, resample_refusals,
                  output_that_is_an_input_is_refused, duplicate_or_empty_column_names_are_refused,
                  failed_write_keeps_the_previous_output):
            t(d)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "s.csv")
        with open(p, "w") as f:
            f.write('"a","name","flag","when"\n1.5,"x",TRUE,1970-01-03\n-2,"y",FALSE,1969-12-31\n4,"z",TRUE,2000-03-01\n')
        out = os.path.join(d, "s.h5")
        r = convert("--date-col", "when", p, out)
        assert r.returncode == 0, r.stderr
        assert "skipping non-numeric column 'name'" in r.stderr
        with h5py.File(out) as f:
            np.testing.assert_array_equal(f["date"][:], [-1, 2, 11017])  # 2000-03-01 = day 11017
            assert [s.decode() for s in f["date_iso"][:]] == ["1969-12-31", "1970-01-03", "2000-03-01"]
            np.testing.assert_array_equal(f["series"][:], np.array([[-2, 0], [1.5, 1], [4, 1]], np.float32))
            assert [s.decode() for s in f["columns"][:]] == ["a", "flag"]
            assert list(f["series"].attrs["columns"]) == ["a", "flag"]
            assert f["series"].dtype == np.float32 and f["date"].dtype == np.int64
        r = convert(p, out)  # default --date-col date is missing
        assert r.returncode != 0 and "'date' not found" in r.stderr, r.stderr
    if not os.path.isfile(USDTHB):
        print("test_csv_to_h5: ../shared/data/timeseries/usdthb_ticks.csv absent: real part skipped")
    else:
        real_usdthb_ticks()
    if not os.path.isfile(SHARED):
        print("test_csv_to_h5: ../shared/data/timeseries/chicago_ridership.csv absent: real part skipped")
    else:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "c.h5")
            r = convert(SHARED, out)
            assert r.returncode == 0, r.stderr
            with h5py.File(out) as f:
                assert f["series"].shape == (5698, 49)
                assert f["columns"][0].decode() == "ridership"
                assert f["date_iso"][0].decode() == "2001-01-22"
                assert f["date_iso"][-1].decode() == "2016-08-28"
                assert np.all(np.diff(f["date"][:]) == 1)   # daily, no gaps
                assert abs(f["series"][0, 0] - 15.732) < 1e-5
    print("test_csv_to_h5: OK")


if __name__ == "__main__":
    main()
