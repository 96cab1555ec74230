#!/bin/sh
# fetch_taylor.sh [OUT.csv]   (default: data/taylor_hourly.csv)
#
# Half-hourly electricity demand of England and Wales, Monday 5 June 2000 ..
# Sunday 27 August 2000 (Taylor 2003; R object `taylor` of the forecast
# package, Debian r-cran-forecast; 4,032 values in megawatts), written as
# hourly means (the two half-hours of each hour: 2,016 rows), so that a
# day is 24 steps. Columns: date (the calendar day; 24 rows share it, in
# time order), demand. Convert with
#   python3 tools/csv_to_h5.py data/taylor_hourly.csv data/taylor_hourly.h5
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/fetch_r_dataset.sh" r-cran-forecast forecast '
x <- as.numeric(taylor)
stopifnot(length(x) == 4032)
h <- (x[c(TRUE, FALSE)] + x[c(FALSE, TRUE)]) / 2
i <- seq_along(h) - 1
data.frame(date = format(as.Date("2000-06-05") + i %/% 24), demand = h)
' "${1:-data/taylor_hourly.csv}"
