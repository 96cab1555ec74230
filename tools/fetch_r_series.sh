#!/bin/sh
# fetch_r_series.sh DEB_PACKAGE R_PACKAGE R_EXPRESSION OUT.csv
#
# Like fetch_r_dataset.sh, for data objects that are not a data frame with a
# date column (a ts / msts vector, a station x day matrix): every data object
# of the R package R_PACKAGE, shipped by the Debian package DEB_PACKAGE, is
# loaded into one environment (data/Rdata lazy-load database or data/*.rda),
# R_EXPRESSION is evaluated there and must give a data frame, which is
# written to OUT.csv (write.csv, row.names = FALSE). Used by fetch_taylor.sh
# and fetch_pm10.sh. Needs apt-get and Rscript (r-base-core), as
# fetch_r_dataset.sh.
set -eu

if [ $# -ne 4 ]; then
    echo "usage: fetch_r_series.sh DEB_PACKAGE R_PACKAGE R_EXPRESSION OUT.csv" >&2
    exit 2
fi
deb_pkg=$1 r_pkg=$2 expr=$3 out=$4
me="fetch_r_series($r_pkg)"

work=$(mktemp -d "${TMPDIR:-/tmp}/fetch_r_series.XXXXXX")
chmod 755 "$work"  # lets apt's _apt user write the download
trap 'rm -rf "$work"' EXIT INT TERM

if ! command -v Rscript >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "$me: installing r-base-core (needed for Rscript)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends r-base-core >&2
    else
        echo "$me: Rscript not found; run: sudo apt-get install -y --no-install-recommends r-base-core" >&2
        exit 1
    fi
fi

echo "$me: downloading $deb_pkg" >&2
if ! (cd "$work" && apt-get download "$deb_pkg" >&2); then
    echo "$me: 'apt-get download $deb_pkg' failed (run apt-get update first?)" >&2
    exit 1
fi
deb=$(ls "$work"/"${deb_pkg}"_*.deb 2>/dev/null | head -n 1)
if [ -z "$deb" ]; then
    echo "$me: no ${deb_pkg}_*.deb downloaded into $work" >&2
    exit 1
fi
dpkg -x "$deb" "$work/root"
datadir="$work/root/usr/lib/R/site-library/$r_pkg/data"
if [ ! -d "$datadir" ]; then
    echo "$me: $datadir not found in $deb" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
tmp_out="$work/out.csv"
DATADIR="$datadir" EXPR="$expr" OUT="$tmp_out" Rscript --vanilla -e '
e <- new.env()
dd <- Sys.getenv("DATADIR")
if (file.exists(file.path(dd, "Rdata.rdb"))) {
    invisible(lazyLoad(file.path(dd, "Rdata"), envir = e))
} else {
    for (f in list.files(dd, pattern = "[.](rda|RData)$", full.names = TRUE)) load(f, envir = e)
}
d <- eval(parse(text = Sys.getenv("EXPR")), envir = e)
if (!is.data.frame(d)) stop("the expression did not give a data frame")
if (anyNA(d)) stop("the data frame has missing values (the loaders do not impute)")
write.csv(d, Sys.getenv("OUT"), row.names = FALSE)
' >&2
mv "$tmp_out" "$out"
rows=$(($(wc -l < "$out") - 1))
echo "$me: wrote $out ($rows rows)" >&2
