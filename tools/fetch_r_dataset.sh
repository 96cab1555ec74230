#!/bin/sh
# fetch_r_dataset.sh DEB_PACKAGE R_PACKAGE OBJECT|R_EXPRESSION OUT.csv
#
# Write a data set of the R package R_PACKAGE, shipped by the Debian package
# DEB_PACKAGE, to OUT.csv (write.csv, row.names = FALSE, factor columns
# written as their labels). The third argument is either the name of one of
# the package's data objects (fetch_movielens.sh, fetch_chicago.sh,
# fetch_usdthb.sh), or an R expression evaluated where every data object is
# loaded, for objects that are not a data frame with a date column (a ts
# vector, a station x day matrix: fetch_taylor.sh, fetch_pm10.sh); an
# expression must give a data frame without missing values.
#
# Steps: `apt-get download DEB_PACKAGE` (no root needed), `dpkg -x` into a
# temporary folder, then Rscript: the package's data (data/Rdata lazy-load
# database, or data/*.rda) loaded into one environment, and write.csv. Needs Rscript from r-base-core: if it
# is missing and we are root it is installed with --no-install-recommends,
# otherwise we stop with the command to run.
set -eu

if [ $# -ne 4 ]; then
    echo "usage: fetch_r_dataset.sh DEB_PACKAGE R_PACKAGE OBJECT|R_EXPRESSION OUT.csv" >&2
    exit 2
fi
deb_pkg=$1 r_pkg=$2 object=$3 out=$4
me="fetch_r_dataset($r_pkg)"

work=$(mktemp -d "${TMPDIR:-/tmp}/fetch_r_dataset.XXXXXX")
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
DATADIR="$datadir" OBJ="$object" OUT="$tmp_out" Rscript --vanilla -e '
e <- new.env()
dd <- Sys.getenv("DATADIR")
if (file.exists(file.path(dd, "Rdata.rdb"))) {
    invisible(lazyLoad(file.path(dd, "Rdata"), envir = e))
} else {
    for (f in list.files(dd, pattern = "[.](rda|RData)$", full.names = TRUE)) load(f, envir = e)
}
obj <- Sys.getenv("OBJ")
if (make.names(obj) == obj) {
    if (!exists(obj, envir = e, inherits = FALSE))
        stop(paste0("object ", obj, " not found in ", dd))
    d <- as.data.frame(get(obj, envir = e))
} else {
    d <- eval(parse(text = obj), envir = e)
    if (!is.data.frame(d)) stop("the expression did not give a data frame")
    if (anyNA(d)) stop("the data frame has missing values (the loaders do not impute)")
}
for (n in names(d)) if (is.factor(d[[n]])) d[[n]] <- as.character(d[[n]])
write.csv(d, Sys.getenv("OUT"), row.names = FALSE)
' >&2
mv "$tmp_out" "$out"
rows=$(($(wc -l < "$out") - 1))
echo "$me: wrote $out ($rows rows)" >&2
