#!/bin/sh
# prepare_data.sh [--use-shared] [--cora PATH] [--molecules] [--data-dir DIR] [--max-len L] [--force]
#
# Produce the reference workloads' HDF5 inputs under the repo's data/ folder
# (git-ignored):
#   data/movielens.h5   tools/movielens_to_h5.py  (iLoRA / recommender)
#   data/chicago.h5     tools/csv_to_h5.py        (LSTM forecasting)
#   data/usdthb_1h.h5   tools/csv_to_h5.py --utc --resample 1h --mid bid,ask
#                       --log-return: USD/THB quotes as hourly bars (LSTM
#                       multi-timeframe, configs/lstm_usdthb.ini)
#   data/dowjones30.h5  tools/stocks_to_h5.py: daily closes of the 30 Dow
#                       Jones stocks as a stock panel (configs/gat_stocks.ini)
#   data/cora.h5        only with --cora PATH: PATH is either a ready cora.h5
#                       (symlinked) or a folder of raw ind.cora.* files
#                       (converted with tools/planetoid_to_h5.py)
#   data/nci_tpsa.h5    only with --molecules: NCI molecules + TPSA from
#                       Debian's rdkit-data (tools/fetch_molecules.sh; needs
#                       python3-rdkit, installed when run as root)
#
# Sources: by default the CSVs are fetched from Debian packages
# (fetch_movielens.sh, fetch_chicago.sh, fetch_usdthb.sh, fetch_dowjones.sh;
# needs apt-get + Rscript). With --use-shared, ../shared/data/{movielens/ratings.csv,
# timeseries/chicago_ridership.csv, timeseries/usdthb_ticks.csv,
# timeseries/dowjones30.csv, planetoid/cora.h5} next to the repo are used instead when present (Cora is
# then linked even without --cora).
#
# Idempotent: an output that already exists is skipped (use --force to
# rebuild). Outputs are written to a temporary name (OUT.tmp.<pid>) and
# renamed, so an interrupted run never leaves a half-written file under the
# final name; the temporaries a killed run left (its pid no longer runs,
# untouched for a minute) are removed at the next start.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
shared="$repo/../shared/data"
data="$repo/data"
use_shared=0
force=0
cora=""
molecules=0
max_len=50
py=${PYTHON:-python3}

while [ $# -gt 0 ]; do
    case "$1" in
        --use-shared) use_shared=1 ;;
        --force) force=1 ;;
        --cora) shift; cora=${1:?--cora needs a path} ;;
        --molecules) molecules=1 ;;
        --data-dir) shift; data=${1:?--data-dir needs a path} ;;
        --max-len) shift; max_len=${1:?--max-len needs a number} ;;
        -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "prepare_data: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

mkdir -p "$data"
data=$(cd "$data" && pwd)

# orphan temporaries of a killed run: OUT.tmp.<pid> whose process is gone
# (kill -0 also fails for another user's live process: /proc tells them apart)
find "$data" -maxdepth 1 -name '*.tmp.*' -mmin +1 2>/dev/null | while IFS= read -r f; do
    pid=${f##*.tmp.}
    case "$pid" in '' | *[!0-9]*) continue ;; esac
    if ! kill -0 "$pid" 2>/dev/null && [ ! -d "/proc/$pid" ]; then
        rm -f "$f" && echo "prepare_data: removed $f, left by process $pid (killed while writing)" >&2
    fi
done

need() { # need OUT: true when OUT must be (re)built
    if [ -e "$1" ] && [ "$force" = 0 ]; then
        echo "prepare_data: $1 exists, skipping (--force rebuilds)" >&2
        return 1
    fi
    return 0
}

# $1 = shared csv, $2 = fetch script, $3 = cached download name
source_csv() {
    if [ "$use_shared" = 1 ] && [ -f "$shared/$1" ]; then
        echo "$shared/$1"
        return
    fi
    [ "$use_shared" = 1 ] && echo "prepare_data: $shared/$1 not found, fetching" >&2
    if [ ! -f "$data/raw/$3" ] || [ "$force" = 1 ]; then
        sh "$here/$2" "$data/raw/$3" >&2
    fi
    echo "$data/raw/$3"
}

# MovieLens
out="$data/movielens.h5"
if need "$out"; then
    csv=$(source_csv movielens/ratings.csv fetch_movielens.sh movielens_ratings.csv)
    "$py" "$here/movielens_to_h5.py" --max-len "$max_len" "$csv" "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
fi

# Chicago ridership
out="$data/chicago.h5"
if need "$out"; then
    csv=$(source_csv timeseries/chicago_ridership.csv fetch_chicago.sh chicago_ridership.csv)
    "$py" "$here/csv_to_h5.py" --date-col date "$csv" "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
fi

# USD/THB quotes (GMT) -> hourly bars of the mid-quote
out="$data/usdthb_1h.h5"
if need "$out"; then
    csv=$(source_csv timeseries/usdthb_ticks.csv fetch_usdthb.sh usdthb_ticks.csv)
    "$py" "$here/csv_to_h5.py" --utc --resample 1h --mid bid,ask --log-return "$csv" "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
fi

# Dow Jones 30 daily closes -> stock panel (features, factors, next-day target)
out="$data/dowjones30.h5"
if need "$out"; then
    csv=$(source_csv timeseries/dowjones30.csv fetch_dowjones.sh dowjones30.csv)
    "$py" "$here/stocks_to_h5.py" "$csv" "$out.tmp.$$"
    mv "$out.tmp.$$" "$out"
fi

# Cora (optional)
out="$data/cora.h5"
if [ -z "$cora" ] && [ "$use_shared" = 1 ] && [ -f "$shared/planetoid/cora.h5" ]; then
    cora="$shared/planetoid/cora.h5"
fi
if [ -n "$cora" ]; then
    if need "$out"; then
        if [ -d "$cora" ]; then
            "$py" "$here/planetoid_to_h5.py" --name cora "$cora" "$out.tmp.$$"
            mv "$out.tmp.$$" "$out"
        elif [ -f "$cora" ]; then
            rm -f "$out"
            ln -s "$(cd "$(dirname "$cora")" && pwd)/$(basename "$cora")" "$out"
            echo "prepare_data: linked $out -> $cora" >&2
        else
            echo "prepare_data: --cora $cora: no such file or folder" >&2
            exit 1
        fi
    fi
else
    echo "prepare_data: no Cora source (pass --cora PATH or --use-shared); data/cora.h5 not made" >&2
fi

# NCI molecules with TPSA (hdf5_graph mode = graphs; optional)
if [ "$molecules" = 1 ]; then
    out="$data/nci_tpsa.h5"
    if need "$out"; then
        rm -f "$out"
        sh "$here/fetch_molecules.sh" "$out"
    fi
fi

echo "prepare_data: done: $(ls "$data"/*.h5 2>/dev/null | tr '\n' ' ')" >&2
