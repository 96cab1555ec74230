#!/bin/sh
# fetch_r_dataset.sh DEB_PACKAGE R_PACKAGE OBJECT OUT.csv
#
# Write the data object OBJECT of the R package R_PACKAGE, shipped by the
# Debian package DEB_PACKAGE, to OUT.csv (write.csv, row.names = FALSE,
# factor columns written as their labels). Used by fetch_movielens.sh and
# fetch_chicago.sh.
#
# Steps: `apt-get download DEB_PACKAGE` (no root needed), `dpkg -x` into a
# temporary folder, then Rscript: lazyLoad(<root>/usr/lib/R/site-library/
# R_PACKAGE/data/Rdata) and write.csv. Needs Rscript from r-base-core: if it
# is missing and we are root it is installed with --no-install-recommends,
# otherwise we stop with the command to run.
set -eu

if [ $# -ne 4 ]; then
    echo "usage: fetch_r_dataset.sh DEB_PACKAGE R_PACKAGE OBJECT OUT.csv" >&2
    exit 2
fi
deb_pkg=$1 r_pkg=$2 object=$3 out=$4
me="fetch_r_dataset($object)"

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

rdata="$work/root/usr/lib/R/site-library/$r_pkg/data/Rdata"
if [ ! -f "$rdata.rdb" ]; then
    echo "$me: $rdata.rdb not found in $deb" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
tmp_out="$work/out.csv"
RDATA="$rdata" OBJ="$object" OUT="$tmp_out" Rscript --vanilla -e '
e <- new.env()
invisible(lazyLoad(Sys.getenv("RDATA"), envir = e))
obj <- Sys.getenv("OBJ")
if (!exists(obj, envir = e, inherits = FALSE))
    stop(paste0("object ", obj, " not found in ", Sys.getenv("RDATA")))
d <- as.data.frame(get(obj, envir = e))
for (n in names(d)) if (is.factor(d[[n]])) d[[n]] <- as.character(d[[n]])
write.csv(d, Sys.getenv("OUT"), row.names = FALSE)
' >&2
mv "$tmp_out" "$out"
rows=$(($(wc -l < "$out") - 1))
echo "$me: wrote $out ($rows rows)" >&2
