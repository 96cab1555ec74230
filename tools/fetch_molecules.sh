#!/bin/sh
# fetch_molecules.sh [--force] [OUT.h5]   (default: data/nci_tpsa.h5)
#
# ~5,000 NCI molecules with their TPSA (topological polar surface area,
# computed by Daylight tools / Ertl's tpsa.c) from Debian's rdkit-data
# package: /usr/share/RDKit/Data/NCI/first_5k.tpsa.csv (`SMILES,TPSA`, first
# line a # comment). The CSV is kept as <dir of OUT>/raw/nci_first_5k_tpsa.csv
# and converted by tools/molecules_to_h5.py into the many-small-graphs layout
# of the hdf5_graph loader (`mode = graphs`).
#
# Steps: `apt-get download rdkit-data` (no root needed), `dpkg -x` into a
# temporary folder, copy the CSV; then molecules_to_h5.py under a Python that
# has RDKit + numpy + h5py ($PYTHON, else python3, else /usr/bin/python3).
# Debian's RDKit is python3-rdkit (for /usr/bin/python3): if no interpreter
# has it and we are root it is installed with --no-install-recommends,
# otherwise we stop with the command to run.
#
# Idempotent: an existing CSV is reused and an existing OUT is kept (--force
# redoes both). OUT is written to OUT.tmp and renamed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
me="fetch_molecules"
force=0
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --force) force=1 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "$me: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) [ -z "$out" ] || { echo "$me: one output only" >&2; exit 2; }; out=$1 ;;
    esac
    shift
done
out=${out:-data/nci_tpsa.h5}
if [ -e "$out" ] && [ "$force" = 0 ]; then
    echo "$me: $out exists, skipping (--force rebuilds)" >&2
    exit 0
fi
raw="$(dirname "$out")/raw"
csv="$raw/nci_first_5k_tpsa.csv"
mkdir -p "$raw"

# 1. the CSV from rdkit-data
if [ ! -f "$csv" ] || [ "$force" = 1 ]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/fetch_molecules.XXXXXX")
    chmod 755 "$work"  # lets apt's _apt user write the download
    trap 'rm -rf "$work"' EXIT INT TERM
    echo "$me: downloading rdkit-data" >&2
    if ! (cd "$work" && apt-get download rdkit-data >&2); then
        echo "$me: 'apt-get download rdkit-data' failed (run apt-get update first?)" >&2
        exit 1
    fi
    deb=$(ls "$work"/rdkit-data_*.deb 2>/dev/null | head -n 1)
    if [ -z "$deb" ]; then
        echo "$me: no rdkit-data_*.deb downloaded into $work" >&2
        exit 1
    fi
    dpkg -x "$deb" "$work/root"
    src="$work/root/usr/share/RDKit/Data/NCI/first_5k.tpsa.csv"
    if [ ! -f "$src" ]; then
        echo "$me: usr/share/RDKit/Data/NCI/first_5k.tpsa.csv not found in $deb" >&2
        exit 1
    fi
    cp "$src" "$csv.tmp"
    mv "$csv.tmp" "$csv"
    echo "$me: wrote $csv ($(grep -vc '^#' "$csv") molecules, from $(basename "$deb"))" >&2
fi

# 2. a Python with RDKit + numpy + h5py
has_deps() { "$1" -c "import rdkit, numpy, h5py" >/dev/null 2>&1; }
py=""
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && has_deps "$cand"; then
        py=$cand
        break
    fi
done
if [ -z "$py" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "$me: installing python3-rdkit python3-h5py python3-numpy (for /usr/bin/python3)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3-rdkit python3-h5py python3-numpy >&2
        py=/usr/bin/python3
        has_deps "$py" || { echo "$me: $py still cannot import rdkit, numpy, h5py" >&2; exit 1; }
    else
        echo "$me: no python with RDKit + numpy + h5py; run:" >&2
        echo "  sudo apt-get install -y --no-install-recommends python3-rdkit python3-h5py python3-numpy" >&2
        echo "  (or set PYTHON to an interpreter that has them)" >&2
        exit 1
    fi
fi

# 3. convert
"$py" "$here/molecules_to_h5.py" --target-names TPSA "$csv" "$out.tmp"
mv "$out.tmp" "$out"
echo "$me: wrote $out" >&2
