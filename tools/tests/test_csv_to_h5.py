#!/usr/bin/env python3
"""Test tools/csv_to_h5.py: a hand-made CSV (unsorted dates, TRUE/FALSE, a
text column skipped) and, when present, the real Chicago file (5,698 rows)."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "csv_to_h5.py")
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data", "timeseries", "chicago_ridership.csv")


def convert(*args):
    r = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)
    return r


def main():
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
