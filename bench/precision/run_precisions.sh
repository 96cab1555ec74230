#!/usr/bin/env bash
# run_precisions.sh - run the teacher workload under each precision and print
# a table: mean step time, peak CPU memory, bytes of frozen weights, test HR@10.
#
# usage: bench/precision/run_precisions.sh [CONFIG] [extra overrides...]
#   CONFIG defaults to configs/teacher.ini; PIPELINE defaults to the first
#   of build/core/pipeline, build-*/core/pipeline or `pipeline` on PATH.
# Small limits by default (LIMIT_TRAIN batches, 1 epoch) so one row takes
# seconds to minutes; override with e.g. LIMIT_TRAIN=200 EPOCHS=2.
# Reads each run's summary.json: seconds_per_step, phases.fit.peak_memory_bytes,
# frozen_parameter_bytes (after the precision stage: nf4 codes + constants),
# test_metrics.hit_ratio@10, cpu_gemm_bf16 (the CPU kernel the bf16 GEMMs
# ran on, chosen at run time: avx512bf16, avx2 or scalar; PL_CPU_ISA=avx2
# forces the fallback).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:-configs/teacher.ini}
shift || true
LIMIT_TRAIN=${LIMIT_TRAIN:-50}
LIMIT_EVAL=${LIMIT_EVAL:-20}
EPOCHS=${EPOCHS:-1}
PIPELINE=${PIPELINE:-}
if [[ -z "$PIPELINE" ]]; then
  for c in build/core/pipeline build-*/core/pipeline; do [[ -x $c ]] && PIPELINE=$c && break; done
  PIPELINE=${PIPELINE:-pipeline}
fi
if [[ ! -f "$CONFIG" ]]; then
  echo "no $CONFIG: nothing to benchmark (create the teacher config first)" >&2
  exit 2
fi
VARIANTS=("fp32|precision.plugin=fp32"
          "bf16-mixed|precision.plugin=bf16 precision.mode=bf16-mixed"
          "bf16-true|precision.plugin=bf16 precision.mode=bf16-true"
          "fp16|precision.plugin=fp16"
          "qlora4|precision.plugin=qlora4")
OUT=$(mktemp -d)
printf '%-11s %12s %14s %16s %10s %11s\n' precision "step_ms" "peak_MiB" "frozen_bytes" "test_HR@10" \
  "bf16_gemm"
for v in "${VARIANTS[@]}"; do
  name=${v%%|*}; ov=${v#*|}
  log="$OUT/$name.log"
  # shellcheck disable=SC2086
  if ! "$PIPELINE" run "$CONFIG" $ov trainer.max_epochs=$EPOCHS \
        trainer.limit_train_batches=$LIMIT_TRAIN trainer.limit_val_batches=$LIMIT_EVAL \
        trainer.limit_test_batches=$LIMIT_EVAL trainer.export=false "$@" \
        >"$log" 2>&1; then
    printf '%-11s %s\n' "$name" "FAILED (see $log)"; continue
  fi
  run_dir=$(sed -n 's/^run \([^:]*\): config.*/\1/p' "$log" | tail -1)
  python3 - "$name" "$run_dir" <<'PY'
import json, os, sys
name, run_dir = sys.argv[1:3]
s = json.load(open(os.path.join(run_dir, "summary.json")))
hr = s.get("test_metrics", {}).get("hit_ratio@10", float("nan"))
print("%-11s %12.2f %14.1f %16d %10.4f %11s" % (name, s["seconds_per_step"] * 1e3,
      s["phases"]["fit"]["peak_memory_bytes"] / 2**20, s["frozen_parameter_bytes"], hr,
      s.get("cpu_gemm_bf16", "?")))
PY
done
echo "logs: $OUT"
