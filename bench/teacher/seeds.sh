#!/usr/bin/env bash
# The teacher on the whole-period backbone (the main job's setting): the
# frozen backbone alone, plain LoRA and iLoRA (configs/teacher.ini as shipped),
# each from `pipeline run`, over seeds, with paired-bootstrap intervals over
# the test users (bench/teacher/compare_table.py --setting standard). Every
# setting was chosen on validation; test is read only here.
#
# usage: bench/teacher/seeds.sh [--backbone RUN_DIR] [SEEDS...]   (default seeds 1 2 3)
#   --backbone RUN_DIR  adapt this pretrain run's best checkpoint for every
#                       seed (e.g. runs/pretrain/latest); default: pretrain a
#                       backbone per seed (configs/pretrain.ini, ~5 min each)
# environment: RD=runs/seeds, OUT=bench/teacher/seeds_result.md,
#   PIPELINE_BIN=build/core/pipeline, PYTHON=python3, EXTRA="k=v ..." for
#   every teacher run. A run whose summary.json exists is reused (FORCE=1 reruns).
set -euo pipefail
cd "$(dirname "$0")/../.."
PL=${PIPELINE_BIN:-build/core/pipeline}
PY=${PYTHON:-python3}
RD=${RD:-runs/seeds}
OUT=${OUT:-bench/teacher/seeds_result.md}
FORCE=${FORCE:-0}
read -r -a extra <<< "${EXTRA:-}"
backbone="" seeds=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backbone) backbone=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "seeds.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) seeds+=("$1") ;;
  esac
  shift
done
[[ ${#seeds[@]} -eq 0 ]] && seeds=(1 2 3)
mkdir -p "$RD/logs" "$RD/per_user"

run() { # NAME CONFIG OVERRIDES...
  local name=$1 cfg=$2; shift 2
  if [[ $FORCE != 1 && -f $RD/$name/latest/summary.json ]]; then echo "  $name: reused" >&2; return; fi
  local t0=$SECONDS
  "$PL" run "$cfg" pipeline.name="$name" pipeline.run_dir="$RD" "$@" > "$RD/logs/$name.log" 2>&1 ||
    { echo "seeds.sh: $name failed; see $RD/logs/$name.log" >&2; tail -n 20 "$RD/logs/$name.log" >&2; exit 1; }
  echo "  $name: $((SECONDS - t0)) s" >&2
}
manifest="$RD/manifest.tsv"
: > "$manifest.tmp"
per_user() { # VARIANT SEED RUN_DIR
  local npz="$RD/per_user/$1_s$2.npz"
  [[ $FORCE == 1 || ! -f $npz || $npz -ot $3/summary.json ]] &&
    PIPELINE_BIN="$PL" "$PY" bench/teacher/per_user.py "$3" "$npz" >&2
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$npz" >> "$manifest.tmp"
}
for s in "${seeds[@]}"; do
  echo "seed $s" >&2
  bb=$backbone
  if [[ -z $bb ]]; then
    run "pretrain_s$s" configs/pretrain.ini pipeline.seed="$s"
    bb="$RD/pretrain_s$s/latest"
  fi
  per_user frozen "$s" "$bb"
  ck="$bb/checkpoints/best.safetensors"
  for v in lora ilora4; do
    ad=$([[ $v == lora ]] && echo lora || echo moe_lora)
    run "${v}_s$s" configs/teacher.ini pipeline.seed="$s" pipeline.requires= \
        trainer.init_from="$ck" trainer.export=false model.adapters=$ad ${extra[@]+"${extra[@]}"}
    per_user "$v" "$s" "$RD/${v}_s$s/latest"
  done
done
mv "$manifest.tmp" "$manifest"
desc="seeds ${seeds[*]}; $([[ -n $backbone ]] && echo "one backbone ($backbone)" || echo "one backbone per seed"); configs/teacher.ini as shipped"
[[ -n ${EXTRA:-} ]] && desc+="; EXTRA: $EXTRA"
"$PY" bench/teacher/compare_table.py "$manifest" "$OUT" --setting standard --describe "$desc"
