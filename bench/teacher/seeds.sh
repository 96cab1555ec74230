#!/usr/bin/env bash
# The issue-7 comparison: test HR@10 / NDCG@10 of the frozen backbone alone,
# plain LoRA and iLoRA (MoE-LoRA), each from `pipeline run`, over seeds.
# Every setting was chosen on validation metrics; test is read only here.
# usage: bench/teacher/seeds.sh [SEEDS...]   (default: 1 2 3)
# Writes runs under runs/seeds/ and prints mean +- std per variant.
set -euo pipefail
cd "$(dirname "$0")/../.."
PL=${PIPELINE_BIN:-build/core/pipeline}
seeds=("$@")
[[ $# -eq 0 ]] && seeds=(1 2 3)
rd=runs/seeds
for s in "${seeds[@]}"; do
  mkdir -p $rd
  "$PL" run configs/pretrain.ini pipeline.seed="$s" pipeline.name="pretrain_s$s" \
      pipeline.run_dir=$rd > "$rd.pretrain_s$s.log" 2>&1
  ck="$rd/pretrain_s$s/latest/checkpoints/best.safetensors"
  for v in lora moe_lora; do
    "$PL" run configs/teacher.ini pipeline.seed="$s" pipeline.name="${v}_s$s" pipeline.run_dir=$rd \
        pipeline.requires= trainer.init_from="$ck" model.adapters=$v trainer.export=false \
        > "$rd.${v}_s$s.log" 2>&1
  done
done
python3 - "$rd" "${seeds[@]}" <<'PY'
import json, os, statistics, sys
rd, seeds = sys.argv[1], sys.argv[2:]
def test(name, s):
    with open(os.path.join(rd, f"{name}_s{s}", "latest", "summary.json")) as f:
        return json.load(f)["test_metrics"]
print(f"{'variant':<22} {'test hit_ratio@10':>20} {'test ndcg@10':>18}   seeds {' '.join(seeds)}")
for label, name in (("backbone alone", "pretrain"), ("plain LoRA", "lora"), ("iLoRA (4 experts)", "moe_lora")):
    hr = [test(name, s)["hit_ratio@10"] for s in seeds]
    nd = [test(name, s)["ndcg@10"] for s in seeds]
    sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
    print(f"{label:<22} {statistics.mean(hr):.4f} +- {sd(hr):.4f}   {statistics.mean(nd):.4f} +- {sd(nd):.4f}"
          f"   per seed HR: {' '.join(f'{h:.4f}' for h in hr)}")
PY
