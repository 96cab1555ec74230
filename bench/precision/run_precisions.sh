#!/usr/bin/env bash
# run_precisions.sh - run the teacher workload under each precision and print
# a table: mean step time, peak CPU memory, bytes of frozen weights, test HR@10.
#
# usage: bench/precision/run_precisions.sh [CONFIG] [extra overrides...]
#   CONFIG defaults to configs/teacher.ini; PIPELINE defaults to the first
#   of build/core/pipeline, build-*/core/pipeline or `pipeline` on PATH.
# Small limits by default (LIMIT_TRAIN batches, 1 epoch) so one row takes
# seconds to minutes; override with e.g. LIMIT_TRAIN=200 EPOCHS=2.
# Reads each run's summary.json and log.txt (keys are looked up loosely:
# the table says "n/a" where a run did not report a value).
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
printf '%-11s %12s %14s %16s %10s\n' precision "step_ms" "peak_MiB" "frozen_bytes" "test_HR@10"
for v in "${VARIANTS[@]}"; do
  name=${v%%|*}; ov=${v#*|}
  log="$OUT/$name.log"
  # shellcheck disable=SC2086
  if ! "$PIPELINE" run "$CONFIG" $ov trainer.max_epochs=$EPOCHS \
        trainer.limit_train_batches=$LIMIT_TRAIN trainer.limit_val_batches=$LIMIT_EVAL \
        trainer.limit_test_batches=$LIMIT_EVAL trainer.export=false pipeline.verbose=1 "$@" \
        >"$log" 2>&1; then
    printf '%-11s %s\n' "$name" "FAILED (see $log)"; continue
  fi
  run_dir=$(grep -oE 'run [^ :]+' "$log" | head -1 | cut -d' ' -f2 || true)
  python3 - "$name" "$run_dir" "$log" <<'PY'
import json, os, re, sys
name, run_dir, log = sys.argv[1:4]
s = {}
try:
    s = json.load(open(os.path.join(run_dir, "summary.json")))
except Exception:
    pass
def find(d, *keys):
    # depth-first search for the first key containing any of `keys`
    if isinstance(d, dict):
        for k, v in d.items():
            if any(x in k.lower() for x in keys) and isinstance(v, (int, float)):
                return v
        for v in d.values():
            r = find(v, *keys)
            if r is not None:
                return r
    return None
text = open(log).read()
step = find(s, "step_time", "seconds_per_step")
if step is None:
    ep, n = find(s, "epoch_time", "fit_time"), find(s, "steps", "global_step")
    step = ep / n if ep and n else None
peak = find(s, "peak")
hr = find(s, "test_hit_ratio@10", "hit_ratio@10", "hr@10")
m = re.search(r"\((\d+) -> (\d+) bytes\)", text)
frozen = m.group(2) if m else "f32(all)" if name in ("fp32", "bf16-mixed", "fp16") else "n/a"
fmt = lambda v, f: (f % v) if isinstance(v, (int, float)) else "n/a"
print("%-11s %12s %14s %16s %10s" % (name, fmt(step * 1e3 if step else None, "%.2f"),
      fmt(peak / 2**20 if peak else None, "%.1f"), frozen, fmt(hr, "%.4f")))
PY
done
echo "logs: $OUT"
