#!/bin/sh
# gat_seeds.sh [N_SEEDS] [extra overrides...]
#
# Runs `pipeline run configs/gat_cora.ini pipeline.seed=S` for S = 0..N-1
# (default 10) and prints, from each run's summary.json, the test accuracy,
# epochs, seconds per epoch and peak memory, then mean +- std (population
# std) of the test accuracy. Extra arguments are passed to every run as
# overrides, e.g. `bench/gat_seeds.sh 10 data.path=../shared/data/planetoid/cora.h5`.
# Env: PIPELINE (binary, default build/core/pipeline), RUN_DIR (default
# runs/bench_gat_seeds).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
n=${1:-10}
[ $# -gt 0 ] && shift
bin=${PIPELINE:-build/core/pipeline}
rd=${RUN_DIR:-runs/bench_gat_seeds}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
s=0
while [ "$s" -lt "$n" ]; do
    "$bin" run configs/gat_cora.ini "pipeline.seed=$s" "pipeline.run_dir=$rd" "$@" > "$rd.seed$s.log" 2>&1 || {
        echo "seed $s failed, see $rd.seed$s.log" >&2
        exit 1
    }
    python3 - "$rd/gat_cora/latest/summary.json" "$s" >> "$out" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(sys.argv[2], j["test_metrics"]["accuracy"], j["epochs"], j["time_per_epoch_seconds"],
      j["peak_memory_bytes"] / 2**20)
PY
    tail -n 1 "$out" | awk '{printf "seed %s: test_accuracy %.4f  epochs %d  %.4f s/epoch  peak %.1f MiB\n", $1, $2, $3, $4, $5}'
    s=$((s + 1))
done
awk '{a[NR]=$2; t+=$4; m+=$5} END {
    for (i = 1; i <= NR; i++) s += a[i]; mu = s / NR;
    for (i = 1; i <= NR; i++) v += (a[i] - mu) ^ 2;
    printf "gat_cora: test accuracy %.2f +- %.2f %% over %d seeds; %.4f s/epoch (train + validation); peak %.1f MiB\n",
           100 * mu, 100 * sqrt(v / NR), NR, t / NR, m / NR }' "$out"
