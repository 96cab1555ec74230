#!/usr/bin/env bash
# Issue 15's table: does the teacher earn its keep when adaptation has work to
# do? The backbone is pretrained on an EARLIER period (configs/pretrain_early.ini,
# /early of data/movielens.h5), then each variant adapts it on the whole
# training split (configs/teacher.ini from that backbone's best checkpoint) and
# is tested on the usual leave-one-out /test (671 users):
#   frozen   the early backbone alone (the pretrain run's own test)
#   full     full fine-tune: model.adapters=none, every weight trains
#   lora     plain LoRA (model.adapters=lora, backbone frozen)
#   ilora<E> iLoRA, MoE-LoRA with E experts gated per user (E in $EXPERTS)
#   lora_embed, ilora<E>_embed (E in $EMBED_EXPERTS)  the same adapters with the
#            item table trained too (model.modules_to_save=embed_tokens), so
#            items the early backbone never saw can be learned
# Every selection (best checkpoint, --sweep's lr, iLoRA's best E) is made on
# validation; test is only read for the table.
#
# usage: bench/teacher/compare.sh [--sweep] [--shared-backbone] [SEEDS...]   (default seeds 1 2 3)
#   --shared-backbone  pretrain once (the first seed) and adapt it for every
#                      seed (default: one backbone per seed, pretrained with it)
#   --sweep            first choose each variant's lr in $SWEEP_LRS on the first
#                      seed by validation NDCG@10 (printed), then run with it
# environment:
#   EXTRA="k=v ..."        overrides for every teacher run (e.g. model.router_temperature=0.5)
#   ILORA_EXTRA="k=v ..."  overrides for the iLoRA runs only (after EXTRA)
#   PRETRAIN_EXTRA="..."   overrides for the pretrain runs
#   EPOCHS=N               trainer.max_epochs=N for both stages (PRETRAIN_EPOCHS,
#                          TEACHER_EPOCHS set them separately)
#   LIMIT=N                trainer.limit_train_batches=N for both stages (smoke tests)
#   EXPERTS="2 4 8"        iLoRA expert counts
#   EMBED_EXPERTS="4"      iLoRA expert counts of the _embed variants (empty: no
#                          _embed variants, plain LoRA's included)
#   RD=runs/compare        run directory (git-ignored); OUT=bench/teacher/compare_result.md
#   PIPELINE_BIN=build/core/pipeline, PYTHON=python3, FORCE=1 reruns finished runs
# Cost (2 shared cores, 2026-11-24, load average 6-10): pretrain 30 epochs 6.3 min
# (3-4 min idle), an adapter run 10 epochs ~3 min, full fine-tune ~4.5 min: the
# default (3 seeds, 5 teacher variants) ~1.2-1.5 h; --sweep adds 3 runs per variant.
# Smoke test in ~30 s: EPOCHS=1 LIMIT=5 EXPERTS="2 4" RD=runs/compare_smoke OUT=/tmp/t.md
# A run whose summary.json exists and whose command line is the same as last
# time ($RD/<name>.args) is reused, so an interrupted comparison resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."

# ---- per-variant overrides (teacher.ini's own values apply where empty) ----
LR_full=${LR_full:-3e-4}     # every weight trains: a smaller step than the adapters'
LR_lora=${LR_lora:-}         # teacher.ini: 1e-3
LR_ilora=${LR_ilora:-}       # teacher.ini: 1e-3 (all E)
OVR_full="model.adapters=none"
OVR_lora="model.adapters=lora"
OVR_ilora="model.adapters=moe_lora"   # + model.num_experts=E
SWEEP_LRS=${SWEEP_LRS:-"3e-4 1e-3 3e-3"}
EXPERTS=${EXPERTS:-"2 4 8"}
EMBED_EXPERTS=${EMBED_EXPERTS-4}
OVR_embed="model.modules_to_save=embed_tokens"

PL=${PIPELINE_BIN:-build/core/pipeline}
PY=${PYTHON:-python3}
RD=${RD:-runs/compare}
OUT=${OUT:-bench/teacher/compare_result.md}
EXTRA=${EXTRA:-}
ILORA_EXTRA=${ILORA_EXTRA:-}
PRETRAIN_EXTRA=${PRETRAIN_EXTRA:-}
FORCE=${FORCE:-0}
sweep=0
shared=0
seeds=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sweep) sweep=1 ;;
    --shared-backbone) shared=1 ;;
    -h|--help) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) seeds+=("$1") ;;
  esac
  shift
done
[[ ${#seeds[@]} -eq 0 ]] && seeds=(1 2 3)

pre_ovr=() tea_ovr=()
[[ -n ${EPOCHS:-} ]] && { pre_ovr+=("trainer.max_epochs=$EPOCHS"); tea_ovr+=("trainer.max_epochs=$EPOCHS"); }
[[ -n ${PRETRAIN_EPOCHS:-} ]] && pre_ovr+=("trainer.max_epochs=$PRETRAIN_EPOCHS")
[[ -n ${TEACHER_EPOCHS:-} ]] && tea_ovr+=("trainer.max_epochs=$TEACHER_EPOCHS")
[[ -n ${LIMIT:-} ]] && { pre_ovr+=("trainer.limit_train_batches=$LIMIT"); tea_ovr+=("trainer.limit_train_batches=$LIMIT"); }
read -r -a pre_extra <<< "$PRETRAIN_EXTRA"
read -r -a extra <<< "$EXTRA"
read -r -a ilora_extra <<< "$ILORA_EXTRA"

[[ -f data/movielens.h5 ]] || { echo "compare.sh: data/movielens.h5 missing: sh tools/prepare_data.sh --use-shared" >&2; exit 1; }
"$PY" -c "import h5py, sys; sys.exit(0 if 'early' in h5py.File('data/movielens.h5') else 1)" || {
  echo "compare.sh: data/movielens.h5 has no /early group (older converter): sh tools/prepare_data.sh --use-shared --force" >&2; exit 1; }

mkdir -p "$RD/logs" "$RD/per_user"
manifest="$RD/manifest.tsv"
: > "$manifest.tmp"

# run_once NAME CONFIG OVERRIDES...: `pipeline run` unless a finished run with the same
# command line exists; prints the run's seconds
run_once() {
  local name=$1 cfg=$2; shift 2
  local args="$cfg pipeline.name=$name pipeline.run_dir=$RD $*"
  local rdir="$RD/$name/latest"
  if [[ $FORCE != 1 && -f $rdir/summary.json && -f $RD/$name.args && $(cat "$RD/$name.args") == "$args" ]] &&
     grep -q '"status":[[:space:]]*"ok"' "$rdir/summary.json"; then
    echo "  $name: reused ($rdir)" >&2
    return 0
  fi
  local t0=$SECONDS
  if ! "$PL" run "$cfg" pipeline.name="$name" pipeline.run_dir="$RD" "$@" > "$RD/logs/$name.log" 2>&1; then
    echo "compare.sh: $name failed; last lines of $RD/logs/$name.log:" >&2
    tail -n 20 "$RD/logs/$name.log" >&2
    exit 1
  fi
  printf '%s' "$args" > "$RD/$name.args"
  echo "  $name: $((SECONDS - t0)) s" >&2
}

# per_user VARIANT SEED RUNNAME: per-user test hits (asserted equal to the run's metrics)
per_user() {
  local npz="$RD/per_user/$3.npz"
  if [[ $FORCE == 1 || ! -f $npz || $npz -ot $RD/$3/latest/summary.json ]]; then
    PIPELINE_BIN="$PL" "$PY" bench/teacher/per_user.py "$RD/$3/latest" "$npz" >&2
  fi
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$RD/$3/latest" "$npz" >> "$manifest.tmp"
}

pretrain() { # pretrain SEED -> backbone run name
  run_once "pretrain_early_s$1" configs/pretrain_early.ini pipeline.seed="$1" \
      ${pre_ovr[@]+"${pre_ovr[@]}"} ${pre_extra[@]+"${pre_extra[@]}"}
}

# teacher NAME SEED BACKBONE VARIANT LR [OVERRIDES...]
teacher() {
  local name=$1 seed=$2 bb=$3 v=$4 lr=$5; shift 5
  local ck="$RD/$bb/latest/checkpoints/best.safetensors"
  local lr_ovr=()
  [[ -n $lr ]] && lr_ovr=("optimizer.lr=$lr")
  local ilx=()
  [[ $v == ilora* ]] && ilx=(${ilora_extra[@]+"${ilora_extra[@]}"})
  run_once "$name" configs/teacher.ini pipeline.seed="$seed" pipeline.requires= \
      trainer.init_from="$ck" trainer.export=false "$@" ${lr_ovr[@]+"${lr_ovr[@]}"} \
      ${tea_ovr[@]+"${tea_ovr[@]}"} ${extra[@]+"${extra[@]}"} ${ilx[@]+"${ilx[@]}"}
}

variants=(full lora)
for e in $EXPERTS; do variants+=("ilora$e"); done
if [[ -n $EMBED_EXPERTS ]]; then
  variants+=(lora_embed)
  for e in $EMBED_EXPERTS; do variants+=("ilora${e}_embed"); done
fi
overrides_of() { # overrides_of VARIANT -> the variant's own overrides, one per line
  case "$1" in
    full) echo "$OVR_full" ;;
    lora) echo "$OVR_lora" ;;
    lora_embed) echo "$OVR_lora"; echo "$OVR_embed" ;;
    ilora*_embed) local e=${1#ilora}; echo "$OVR_ilora"; echo "model.num_experts=${e%_embed}"; echo "$OVR_embed" ;;
    ilora*) echo "$OVR_ilora"; echo "model.num_experts=${1#ilora}" ;;
  esac
}
lr_of() {
  case "$1" in full) echo "$LR_full" ;; lora*) echo "$LR_lora" ;; ilora*) echo "$LR_ilora" ;; esac
}
declare -A chosen_lr
for v in "${variants[@]}"; do chosen_lr[$v]=$(lr_of "$v"); done

bb_of() { if [[ $shared == 1 ]]; then echo "pretrain_early_s${seeds[0]}"; else echo "pretrain_early_s$1"; fi; }

if [[ $sweep == 1 ]]; then
  s=${seeds[0]}
  echo "sweep: lr in {$SWEEP_LRS} per variant, seed $s, chosen by validation NDCG@10 (best checkpoint)" >&2
  pretrain "$s"
  for v in "${variants[@]}"; do
    mapfile -t vo < <(overrides_of "$v")
    best="" bestv=-1
    for lr in $SWEEP_LRS; do
      teacher "sweep_${v}_lr${lr}_s$s" "$s" "$(bb_of "$s")" "$v" "$lr" "${vo[@]}"
      val=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['best_monitor'])" \
            "$RD/sweep_${v}_lr${lr}_s$s/latest/summary.json")
      printf 'sweep  %-8s lr %-6s val NDCG@10 %.5f\n' "$v" "$lr" "$val"
      if "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$val" "$bestv"; then
        best=$lr bestv=$val
      fi
    done
    chosen_lr[$v]=$best
    printf 'sweep  %-8s chosen lr %s (val NDCG@10 %.5f)\n' "$v" "$best" "$bestv"
  done
fi

for s in "${seeds[@]}"; do
  echo "seed $s" >&2
  bb=$(bb_of "$s")
  if [[ $shared == 1 ]]; then pretrain "${seeds[0]}"; else pretrain "$s"; fi
  per_user frozen "$s" "$bb"
  for v in "${variants[@]}"; do
    mapfile -t vo < <(overrides_of "$v")
    teacher "${v}_s$s" "$s" "$bb" "$v" "${chosen_lr[$v]}" "${vo[@]}"
    per_user "$v" "$s" "${v}_s$s"
  done
done
mv "$manifest.tmp" "$manifest"

desc="seeds ${seeds[*]}; $([[ $shared == 1 ]] && echo "one backbone (seed ${seeds[0]})" || echo "one backbone per seed")"
desc+="; lr: full ${chosen_lr[full]:-ini} lora ${chosen_lr[lora]:-ini (1e-3)}"
for e in $EXPERTS; do desc+=" ilora$e ${chosen_lr[ilora$e]:-ini (1e-3)}"; done
[[ $sweep == 1 ]] && desc+=" (chosen by --sweep)"
[[ -n $EXTRA ]] && desc+="; EXTRA: $EXTRA"
[[ -n $ILORA_EXTRA ]] && desc+="; ILORA_EXTRA: $ILORA_EXTRA"
[[ ${#pre_ovr[@]} -gt 0 ]] && desc+="; pretrain overrides: ${pre_ovr[*]}"
[[ ${#tea_ovr[@]} -gt 0 ]] && desc+="; teacher overrides: ${tea_ovr[*]}"
"$PY" bench/teacher/compare_table.py "$manifest" "$OUT" --describe "$desc"
