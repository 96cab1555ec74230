#!/usr/bin/env bash
# Data-parallel scaling on this machine (issue 21): the same global batch trained by
#   A: one process, 1 thread        (the baseline of the scaling figure)
#   B: one process, 2 threads       (what 2 cores give without MPI: OpenMP + OpenBLAS)
#   C: mpirun -np 2, 1 thread each  (ddp; per-rank batch_size = half)
# for the teacher step (configs/teacher.ini, random backbone: the pretrain run is not
# needed for timing) and the LSTM (configs/lstm_chicago.ini). Prints training
# samples/s (summary.json, whole run's global samples) and C / A, C / B.
#
#   bash bench/ddp/run.sh [EPOCHS]      (data/movielens.h5, data/chicago.h5:
#                                        tools/prepare_data.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=${1:-2}
exe=build/core/pipeline
export PIPELINE_PLUGIN_PATH=${PIPELINE_PLUGIN_PATH:-$PWD/build/plugins}
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(mpirun --version | head -1)"

sps() { python3 -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['train_samples_per_second'])" "$1"; }

bench() { # name ini global_batch overrides...
  local name=$1 ini=$2 gb=$3; shift 3
  local common=("trainer.max_epochs=$epochs" trainer.test=false trainer.export=false "$@")
  "$exe" run "$ini" "${common[@]}" pipeline.threads=1 data.batch_size="$gb" pipeline.run_dir="$out/a" >/dev/null
  "$exe" run "$ini" "${common[@]}" pipeline.threads=2 data.batch_size="$gb" pipeline.run_dir="$out/b" >/dev/null
  mpirun -np 2 "$exe" run "$ini" "${common[@]}" pipeline.threads=1 data.batch_size=$((gb / 2)) \
    pipeline.run_dir="$out/c" >/dev/null
  local n; n=$(basename "$ini" .ini)
  local a b c
  a=$(sps "$out/a/$n/latest/summary.json"); b=$(sps "$out/b/$n/latest/summary.json")
  c=$(sps "$out/c/$n/latest/summary.json")
  python3 - "$name" "$gb" "$a" "$b" "$c" <<'PY'
import sys
name, gb, a, b, c = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
print("| %s | %s | %.0f | %.0f | %.0f | %.2fx | %.2fx |" % (name, gb, a, b, c, c / a, c / b))
PY
  rm -rf "$out"/a "$out"/b "$out"/c
}

echo "| workload | global batch | 1 proc x 1 thread (samples/s) | 1 proc x 2 threads | 2 procs x 1 thread (ddp) | ddp / 1x1 | ddp / 1x2 |"
echo "|---|---|---|---|---|---|---|"
bench "teacher (iLoRA, dim 64, 2 layers)" configs/teacher.ini 16 "~pipeline.requires" "~trainer.init_from"
bench "teacher, global batch 64" configs/teacher.ini 64 "~pipeline.requires" "~trainer.init_from"
bench "LSTM Chicago" configs/lstm_chicago.ini 64
