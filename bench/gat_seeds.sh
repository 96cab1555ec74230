#!/bin/sh
# gat_seeds.sh [N_SEEDS] [extra overrides...]
#
# Runs `pipeline run configs/gat_cora.ini pipeline.seed=S` for S = 0..N-1
# (default 10) and prints, from each run's summary.json, the test accuracy,
# epochs, seconds per epoch and peak memory, then mean +- std (population
# std) of the test accuracy. Extra arguments are passed to every run as
# overrides, e.g. `bench/gat_seeds.sh 10 data.path=../shared/data/planetoid/cora.h5`.
# Env: PIPELINE (binary, default build/core/pipeline), RUN_DIR (default
# runs/bench_gat_seeds; seed S runs under RUN_DIR/seedS, so that concurrent
# seeds never share a `latest` link), JOBS (seeds run at once, default 1;
# with JOBS > 1 pass pipeline.threads=1 so the runs do not fight for cores,
# and the s/epoch figures then include that sharing).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
n=${1:-10}
[ $# -gt 0 ] && shift
bin=${PIPELINE:-build/core/pipeline}
rd=${RUN_DIR:-runs/bench_gat_seeds}
jobs=${JOBS:-1}
case "$jobs" in
'' | *[!0-9]* | 0) echo "gat_seeds: JOBS must be an integer >= 1, got '$jobs'" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one_seed S: run seed S, write "S acc epochs s/epoch MiB" to $tmp/S.row
one_seed() {
    sd=$1
    shift
    "$bin" run configs/gat_cora.ini "pipeline.seed=$sd" "pipeline.run_dir=$rd/seed$sd" "$@" \
        > "$rd.seed$sd.log" 2>&1 || { echo "seed $sd failed, see $rd.seed$sd.log" >&2; return 1; }
    python3 - "$rd/seed$sd/gat_cora/latest/summary.json" "$sd" > "$tmp/$sd.row" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(sys.argv[2], j["test_metrics"]["accuracy"], j["epochs"], j["time_per_epoch_seconds"],
      j["peak_memory_bytes"] / 2**20)
PY
    awk '{printf "seed %s: test_accuracy %.4f  epochs %d  %.4f s/epoch  peak %.1f MiB\n", $1, $2, $3, $4, $5}' "$tmp/$sd.row"
}

mkdir -p "$(dirname "$rd")"
s=0
pids=""
running=0
failed=0
while [ "$s" -lt "$n" ]; do
    seed=$s
    one_seed "$seed" "$@" &
    pids="$pids $!"
    running=$((running + 1))
    s=$((s + 1))
    if [ "$running" -ge "$jobs" ]; then
        for p in $pids; do wait "$p" || failed=1; done
        pids=""
        running=0
    fi
done
for p in $pids; do wait "$p" || failed=1; done
[ "$failed" -eq 0 ] || exit 1
s=0
while [ "$s" -lt "$n" ]; do cat "$tmp/$s.row"; s=$((s + 1)); done > "$tmp/all"
awk '{a[NR]=$2; t+=$4; m+=$5} END {
    for (i = 1; i <= NR; i++) s += a[i]; mu = s / NR;
    for (i = 1; i <= NR; i++) v += (a[i] - mu) ^ 2;
    printf "gat_cora: test accuracy %.2f +- %.2f %% over %d seeds; %.4f s/epoch (train + validation); peak %.1f MiB\n",
           100 * mu, 100 * sqrt(v / NR), NR, t / NR, m / NR }' "$tmp/all"
