#!/bin/sh
# fetch_usdthb.sh [OUT.csv]   (default: data/usdthb_ticks.csv)
#
# USD/THB foreign-exchange quotes, tick by tick: 2,984 Reuters quotes of the
# US dollar in Thai baht, 1997-06-01 19:28 .. 1997-06-30 23:44 GMT, from
# Debian's r-cran-fbasics package (R object `usdthb`, Rmetrics). Columns as
# in ../shared/data/timeseries/usdthb_ticks.csv (its README): `time` (ISO
# 8601 YYYY-MM-DDThh:mm, GMT, converted from the package's YYYYMMDDhhmm
# number), delay, contributor, bid, ask, flag.
# Needs apt-get and Rscript (r-base-core); see fetch_r_dataset.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-data/usdthb_ticks.csv}
mkdir -p "$(dirname "$out")"
raw="$out.raw.$$"
trap 'rm -f "$raw" "$out.tmp.$$"' EXIT INT TERM
sh "$here/fetch_r_dataset.sh" r-cran-fbasics fBasics usdthb "$raw"
# the package's first column (TIMEDATE, a number YYYYMMDDhhmm) -> ISO 8601
# `time`; every other field as written (an unexpected header or time is an
# error naming the line)
awk -F, -v OFS=, -v src="$raw" '
NR == 1 {
    if (NF != 6) { printf "fetch_usdthb: %s:1: %d columns, expected 6 (TIMEDATE, DELAY, CONTRIBUTOR, BID, ASK, FLAG)\n", src, NF > "/dev/stderr"; exit 1 }
    print "time,delay,contributor,bid,ask,flag"; next
}
{
    t = $1; gsub(/"/, "", t)
    if (t !~ /^[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]$/ || NF != 6) {
        printf "fetch_usdthb: %s:%d: expected 6 fields starting with a YYYYMMDDhhmm time, found \"%s\"\n", src, NR, $0 > "/dev/stderr"; exit 1
    }
    $1 = substr(t, 1, 4) "-" substr(t, 5, 2) "-" substr(t, 7, 2) "T" substr(t, 9, 2) ":" substr(t, 11, 2)
    for (i = 2; i <= NF; i++) gsub(/"/, "", $i)
    print
}' "$raw" > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "fetch_usdthb: wrote $out ($(($(wc -l < "$out") - 1)) quotes)" >&2
