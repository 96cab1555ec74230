#!/bin/sh
# fetch_dowjones.sh [OUT.csv]   (default: data/dowjones30.csv)
#
# Daily closing prices of the 30 Dow Jones Industrial Average stocks of 2001,
# 2,529 trading days 1990-12-31 .. 2001-01-02, from Debian's r-cran-fbasics
# package (R object `DowJones30`, Rmetrics). The package's first column
# (header "X.Y..m..d" after R's write.csv, dates YYYY-MM-DD) is renamed to
# `date`; every other field is written as shipped. The result is
# byte-identical to ../shared/data/timeseries/dowjones30.csv.
# Needs apt-get and Rscript (r-base-core); see fetch_r_dataset.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-data/dowjones30.csv}
mkdir -p "$(dirname "$out")"
raw="$out.raw.$$"
trap 'rm -f "$raw" "$out.tmp.$$"' EXIT INT TERM
sh "$here/fetch_r_dataset.sh" r-cran-fbasics fBasics DowJones30 "$raw"
# header: first field -> date, quotes dropped; rows: a YYYY-MM-DD date and 31
# fields, quotes dropped (anything else is an error naming the line)
awk -F, -v OFS=, -v src="$raw" '
NR == 1 {
    if (NF != 31) { printf "fetch_dowjones: %s:1: %d columns, expected 31 (a date and 30 tickers)\n", src, NF > "/dev/stderr"; exit 1 }
    $1 = "date"; for (i = 2; i <= NF; i++) gsub(/"/, "", $i); print; next
}
{
    d = $1; gsub(/"/, "", d)
    if (d !~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]$/ || NF != 31) {
        printf "fetch_dowjones: %s:%d: expected 31 fields starting with a YYYY-MM-DD date, found \"%s\"\n", src, NR, $0 > "/dev/stderr"; exit 1
    }
    $1 = d; print
}' "$raw" > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "fetch_dowjones: wrote $out ($(($(wc -l < "$out") - 1)) days)" >&2
