#!/bin/sh
# fetch_pm10.sh [OUT.csv]   (default: data/pm10_deth026.csv)
#
# Daily mean PM10 (ug/m3) at the German rural background station DETH026
# (Thuringia) from the AirBase data of the spacetime package (R object
# `air`, 70 stations x 4,383 days 1998-2009, Debian r-cran-spacetime): its
# longest stretch without missing days, 2006-06-17 .. 2009-08-12 (1,153
# days). Columns: date, pm10. Convert with
#   python3 tools/csv_to_h5.py data/pm10_deth026.csv data/pm10_deth026.h5
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/fetch_r_dataset.sh" r-cran-spacetime spacetime '
i <- which(dates >= as.Date("2006-06-17") & dates <= as.Date("2009-08-12"))
stopifnot(length(i) == 1153)
data.frame(date = format(dates[i]), pm10 = as.numeric(air["DETH026", i]))
' "${1:-data/pm10_deth026.csv}"
