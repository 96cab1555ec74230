#!/bin/sh
# fetch_chicago.sh [OUT.csv]   (default: data/chicago_ridership.csv)
#
# Chicago "L" daily ridership (5,698 days, 2001-01-22 .. 2016-08-28, 50
# columns, `ridership` at Clark/Lake first, `date` last) from Debian's
# r-cran-modeldata package (R object `Chicago`).
# Needs apt-get and Rscript (r-base-core); see fetch_r_dataset.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/fetch_r_dataset.sh" r-cran-modeldata modeldata Chicago "${1:-data/chicago_ridership.csv}"
