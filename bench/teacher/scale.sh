#!/usr/bin/env bash
# The teacher at LLM scale: device memory (peak allocated / reserved, the
# meaning of torch.cuda.max_memory_allocated / max_memory_reserved), seconds
# per step and the ratios to fp32, of the iLoRA teacher on a Llama backbone,
# for each precision (fp32, bf16-mixed, bf16-true, qlora4), with and without
# activation checkpointing, at batch 16 x 50 and 64 x 50, beside PyTorch +
# PEFT LoRA on the same shapes and device (bench/teacher/scale_torch.py).
#
# usage: bench/teacher/scale.sh [--device cuda|strict|cpu] [--batches "16 64"] [SIZES...]
#   SIZES: 135m (SmolLM-135M shape), 1b (TinyLlama-1.1B), 7b (Llama-2-7B: hidden
#   4096, 32 layers, 32 heads, intermediate 11008); default 135m 1b.
# The backbone is built from a config.json alone (model.backbone_weights =
# random, written here to models/llama-SIZE-config/): no weights file, seconds
# to start at 7b. PyTorch builds the same shape with from_config; its qlora4
# needs a weights file (tools/make_hf_llama.py SIZE models/llama-SIZE, used when
# present) and bitsandbytes.
# --device strict: the GPU stand-in (CPU kernels, device memory counted by the
#   core allocator): memory only, one step per run, no PyTorch.
# --device cuda / cpu: STEPS (default 4) optimizer steps, the first excluded
#   from the step time.
# Env: PRECISIONS (default "fp32 bf16-mixed bf16-true qlora4"), GCS (default
#   "false true"), TORCH=0 skips PyTorch, TORCH_PRECISIONS (default
#   "fp32 bf16 bf16-true qlora4" on cuda, "fp32" on cpu), PIPELINE_BIN,
#   DATA (default data/movielens.h5; tools/prepare_data.sh).
# Results: runs/scale/<device>/table.md (also printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
PL=${PIPELINE_BIN:-build/core/pipeline}
STEPS=${STEPS:-4}
device=cpu
batches="16 64"
sizes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) sizes+=("$1"); shift ;;
  esac
done
[[ ${#sizes[@]} -eq 0 ]] && sizes=(135m 1b)
case $device in cuda|strict|cpu) ;; *) echo "--device: cuda, strict or cpu" >&2; exit 2 ;; esac
[[ $device == strict ]] && STEPS=1 && export PL_STRICT_MEMORY_ONLY=${PL_STRICT_MEMORY_ONLY:-1}
rd=runs/scale/$device
mkdir -p "$rd" models
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

write_config() { python3 tools/llama_config.py "$1" "$2"; } # SIZE DIR: config.json only

for size in "${sizes[@]}"; do
  dir=models/llama-$size-config
  [[ -f $dir/config.json ]] || write_config "$size" "$dir"
  for bs in $batches; do
    for prec in ${PRECISIONS:-fp32 bf16-mixed bf16-true qlora4}; do
      case $prec in
        fp32) pargs=(precision.plugin=fp32) ;;
        bf16-mixed) pargs=(precision.plugin=bf16 precision.mode=bf16-mixed) ;;
        bf16-true) pargs=(precision.plugin=bf16 precision.mode=bf16-true) ;;
        qlora4) pargs=(precision.plugin=qlora4 precision.compute_dtype=bf16) ;;
      esac
      for gc in ${GCS:-false true}; do
        name="c_${size}_b${bs}_${prec}_gc$gc"
        "$PL" run bench/teacher/scale.ini pipeline.name="$name" pipeline.run_dir="$rd" \
            pipeline.device="$device" data.path="${DATA:-data/movielens.h5}" data.batch_size="$bs" \
            model.backbone="$dir" model.backbone_weights=random model.gradient_checkpointing=$gc \
            trainer.max_steps="$STEPS" "${pargs[@]}" > "$rd/$name.log" 2>&1 ||
          echo "FAILED: $name (see $rd/$name.log)"
      done
    done
    [[ $device == strict || ${TORCH:-1} == 0 ]] && continue
    tdefault="fp32"; [[ $device == cuda ]] && tdefault="fp32 bf16 bf16-true qlora4"
    for prec in ${TORCH_PRECISIONS:-$tdefault}; do
      tdir=$dir; [[ $prec == qlora4 && -f models/llama-$size/config.json ]] && tdir=models/llama-$size
      for gc in ${GCS:-false true}; do
        name="t_${size}_b${bs}_${prec}_gc$gc"
        gflag=(); [[ $gc == true ]] && gflag=(--gradient-checkpointing)
        timeout "${TORCH_TIMEOUT:-1500}" python3 bench/teacher/scale_torch.py --backbone "$tdir" \
            --device "$([[ $device == cuda ]] && echo cuda || echo cpu)" --batch "$bs" \
            --precision "$prec" "${gflag[@]}" --steps "$((STEPS - 1))" > "$rd/$name.log" 2>&1 \
            || echo "FAILED: $name (see $rd/$name.log)"
        grep '^{' "$rd/$name.log" | tail -1 > "$rd/$name.json" || true
      done
    done
  done
done
python3 bench/teacher/scale_table.py "$rd" "$batches" "${sizes[@]}" | tee "$rd/table.md"
