#!/usr/bin/env bash
# The teacher at LLM scale: peak resident memory, frozen bytes, trainable
# parameters, seconds per step (batch 16 x 50 items) and load time of the
# iLoRA teacher on a Llama backbone, for each precision (fp32, bf16-true,
# qlora4) with and without activation checkpointing, beside PyTorch + PEFT
# LoRA on the same shapes (bench/teacher/scale_torch.py) in the same run.
#
# usage: bench/teacher/scale.sh [SIZES...]      (default: 135m 1b)
# Needs data/movielens.h5 (tools/prepare_data.sh) and a release build
# (build/core/pipeline, or PIPELINE_BIN). Backbones are written once by
# tools/make_hf_llama.py into models/llama-SIZE (random weights, bf16).
# STEPS (default 4) optimizer steps per run; the first is excluded from the
# step time. PRECISIONS (default "fp32 bf16-true qlora4") limits pipeline's
# rows, TORCH=0 skips PyTorch; TORCH_BF16_SIZES / TORCH_QLORA4_SIZES (default
# none / 135m) name the sizes where PyTorch's bf16 autocast and bitsandbytes
# NF4 run (both are emulated or unvectorized on this CPU: > 90 s per step at
# 135m). Results: runs/scale/table.md (also printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PL=${PIPELINE_BIN:-build/core/pipeline}
STEPS=${STEPS:-4}
sizes=("$@")
[[ $# -eq 0 ]] && sizes=(135m 1b)
rd=runs/scale
mkdir -p "$rd" models
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
for size in "${sizes[@]}"; do
  dir=models/llama-$size
  [[ -f $dir/config.json ]] || python3 tools/make_hf_llama.py "$size" "$dir"
  for prec in ${PRECISIONS:-fp32 bf16-true qlora4}; do
    case $prec in
      fp32) pargs=(precision.plugin=fp32) ;;
      bf16-true) pargs=(precision.plugin=bf16 precision.mode=bf16-true) ;;
      qlora4) pargs=(precision.plugin=qlora4 precision.compute_dtype=bf16) ;;
    esac
    for gc in false true; do
      name="c_${size}_${prec}_gc$gc"
      /usr/bin/time -v "$PL" run bench/teacher/scale.ini pipeline.name="$name" pipeline.run_dir=$rd \
          model.backbone="$dir" model.gradient_checkpointing=$gc trainer.max_steps="$STEPS" \
          "${pargs[@]}" > "$rd/$name.log" 2>&1 || { echo "FAILED: $name (see $rd/$name.log)"; continue; }
    done
  done
  # PyTorch's bf16 autocast on this CPU takes > 90 s per step already at 135m
  # (bench/teacher/scale_torch.py): it runs only at the sizes listed in TORCH_BF16_SIZES (default none)
  # bitsandbytes' CPU NF4 path takes ~100 s per step at 135m: TORCH_QLORA4_SIZES
  tprecs=(fp32)
  [[ " ${TORCH_BF16_SIZES:-} " == *" $size "* ]] && tprecs+=(bf16)
  [[ " ${TORCH_QLORA4_SIZES:-135m} " == *" $size "* ]] && tprecs+=(qlora4)
  [[ ${TORCH:-1} == 0 ]] && tprecs=()
  for prec in "${tprecs[@]+"${tprecs[@]}"}"; do
    for gc in false true; do
      name="t_${size}_${prec}_gc$gc"
      gflag=(); [[ $gc == true ]] && gflag=(--gradient-checkpointing)
      timeout "${TORCH_TIMEOUT:-1500}" python3 bench/teacher/scale_torch.py --backbone "$dir" \
          --precision $prec "${gflag[@]}" --steps "$((STEPS - 1))" > "$rd/$name.log" 2>&1 \
          || echo "FAILED: $name (see $rd/$name.log)"
      grep '^{' "$rd/$name.log" | tail -1 > "$rd/$name.json" || true
    done
  done
done
python3 bench/teacher/scale_table.py "$rd" "${sizes[@]}" | tee "$rd/table.md"
