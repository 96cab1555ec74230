#!/usr/bin/env bash
# test_hf_export.sh - `pipeline export RUN_DIR --format hf OUT_DIR` of the iLoRA
# teacher, loaded back with transformers + PEFT (tools/verify_hf_export.py):
# the logits of the loaded model match the run's own (its teacher outputs with
# every item exported) within 1e-4 on every labelled training position and the
# last position of every val / test row, for
#   lora     plain LoRA, untied lm_head, fp32: base + PEFT adapter
#   merge    the same run with --lora merge: base with W + (alpha/r) B A
#   moe      MoE-LoRA (2 experts, router), fp32: one PEFT adapter per expert,
#            per-user gates from router.safetensors, add_weighted_adapter("cat")
#   qlora4   the same in qlora4 (compute f32): NF4 base weights dequantized
#   llm      a Hugging Face backbone (tests/data/hf_llama/gqa_tied) with item
#            inputs: adapters on the unchanged backbone + item_head.safetensors
# and the refusals: merging a router-gated mixture, an unknown format or dtype
# (exit 2, nothing left behind), and a --dtype bf16 export's file dtypes.
# Skips (exit 77) without torch / transformers / peft, fails under CI=true.
# usage: test_hf_export.sh SOURCE_DIR BUILD_DIR   (ctest runs it)
set -euo pipefail
src=$1
bin=$2/core/pipeline
tmp=$(mktemp -d /tmp/pl_test_hf_export_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 40 items, 24 users, rows of 8
python3 "$src/tests/support/make_ml_tiny.py" "$tmp/ml.h5"
cat > "$tmp/t.ini" <<EOF
[pipeline]
name = t
seed = 3
run_dir = $tmp/runs
[data]
plugin = hdf5_rows
path = $tmp/ml.h5
datasets = input_ids,labels
val_datasets = input_ids,target,user_index
test_datasets = input_ids,target,user_index
batch_size = 4
[model]
plugin = ilora
dim = 16
layers = 2
heads = 2
max_len = 8
dropout = 0.0
adapters = lora
lora_rank = 4
lora_dropout = 0.0
exclude_history = false
; every item's logit in outputs/teacher_outputs.h5: the reference logits
export_top_k = 40
[optimizer]
plugin = adamw
lr = 3e-2
[trainer]
max_epochs = 2
export = true
EOF

run() { # NAME OVERRIDES...: a run; prints its run directory
  local name=$1
  shift
  "$bin" run "$tmp/t.ini" pipeline.name="$name" "$@" > "$tmp/$name.log" 2>&1 \
    || { cat "$tmp/$name.log" >&2; fail "$name: run"; }
  echo "$tmp"/runs/"$name"/2*
}
export_hf() { # RUN_DIR OUT_DIR [ARGS...]
  local r=$1 o=$2
  shift 2
  # Under ASan, LeakSanitizer's own tracer (StopTheWorld) crashes with signal 11 at the exit
  # of the HF-backbone run's export, and only for some output paths: reproduced every time
  # with OUT_DIR /tmp/<37 characters>_llm or inside this test's temporary directory, never
  # with /tmp/zz/llm, nor with LSAN_OPTIONS=verbosity=1; no ASan or UBSan report comes
  # before it. Not understood yet, so leak detection is off for this one command (ASan and
  # UBSan stay on). To investigate.
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$bin" export "$r" --format hf "$o" "$@" > "$o.log" 2>&1 || { cat "$o.log" >&2; fail "export $o"; }
}

lora=$(run lora model.tie_embeddings=false)
# PEFT takes one weight per adapter for a whole input: row-gated routers
# (mean_embedding) export; a per-position router (last_hidden) is refused below
row=model.router_input=mean_embedding
moe=$(run moe model.adapters=moe_lora model.num_experts=2 $row model.router_temperature=0.5)
q4=$(run q4 model.adapters=moe_lora model.num_experts=2 $row precision.plugin=qlora4 \
  precision.compute_dtype=f32 precision.block_size=16)
llm=$(run llm model.backbone="$src/tests/data/hf_llama/gqa_tied" model.item_dim=8 \
  model.adapters=moe_lora model.num_experts=2 $row '~model.dim' '~model.layers' '~model.heads')
per_pos=$(run per_pos model.adapters=moe_lora model.num_experts=2)
# modules_to_save = embed_tokens in front of a backbone trains the item table,
# which item_head.safetensors holds: the backbone stays unchanged, still exported
llm_mts=$(run llm_mts model.backbone="$src/tests/data/hf_llama/gqa_tied" model.item_dim=8 \
  model.adapters=lora model.modules_to_save=embed_tokens '~model.dim' '~model.layers' '~model.heads')
export_hf "$lora" "$tmp/lora"
export_hf "$lora" "$tmp/merge" --lora merge
export_hf "$moe" "$tmp/moe"
export_hf "$q4" "$tmp/q4"
export_hf "$llm" "$tmp/llm"
export_hf "$llm_mts" "$tmp/llm_mts"
for f in config.json model.safetensors adapter/adapter_config.json adapter/adapter_model.safetensors \
  README.md pipeline_export.json; do
  [[ -f $tmp/lora/$f ]] || fail "lora export lacks $f"
done
[[ ! -e $tmp/merge/adapter ]] || fail "a merged export has an adapter"
for f in expert_0/adapter_model.safetensors expert_1/adapter_config.json router.safetensors router.json; do
  [[ -f $tmp/moe/$f ]] || fail "moe export lacks $f"
done
for d in llm llm_mts; do
  [[ -f $tmp/$d/item_head.safetensors && ! -e $tmp/$d/config.json ]] \
    || fail "a backbone export with item inputs ($d): item_head.safetensors, no copy of the backbone"
done
echo "ok: exports written"

# refusals: exit 2, a message naming the problem, nothing left under OUT_DIR or OUT_DIR.tmp.*
refuse() { # WHAT-THE-MESSAGE-SAYS RUN_DIR ARGS...
  local want=$1 r=$2 rc=0
  shift 2
  "$bin" export "$r" "$@" "$tmp/refused" > "$tmp/refused.log" 2>&1 || rc=$?
  [[ $rc == 2 ]] || { cat "$tmp/refused.log" >&2; fail "export $* exits $rc, expected 2"; }
  grep -q -- "$want" "$tmp/refused.log" || { cat "$tmp/refused.log" >&2; fail "no '$want'"; }
  compgen -G "$tmp/refused*" | grep -v 'refused.log$' && fail "export $* left files behind"
  return 0
}
refuse "gated per user" "$moe" --format hf --lora merge
refuse "own mixture of the 2 experts" "$per_pos" --format hf
refuse "format 'onnx' is not written by ilora" "$moe" --format onnx
refuse "expected f32, bf16 or f16" "$moe" --format hf --dtype f64
refuse "expected peft or merge" "$lora" --format hf --lora fold
refuse "does not exist" "$lora" --format hf --checkpoint "$tmp/nope.safetensors"
mkdir -p "$tmp/full" && touch "$tmp/full/x"
"$bin" export "$lora" --format hf "$tmp/full" > "$tmp/full.log" 2>&1 && fail "export into a non-empty OUT_DIR"
grep -q "is not empty" "$tmp/full.log" || fail "non-empty OUT_DIR: $(cat "$tmp/full.log")"
echo "ok: refusals"

# --dtype bf16: the weights and config.json say bfloat16
export_hf "$moe" "$tmp/moe_bf16" --dtype bf16
python3 - "$tmp/moe_bf16" <<'PY' || fail "bf16 export"
import json, struct, sys
d = sys.argv[1]
def dtypes(p):
    with open(p, "rb") as f:
        h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    h.pop("__metadata__", None)
    return {v["dtype"] for v in h.values()}
assert json.load(open(d + "/config.json"))["dtype"] == "bfloat16"
assert dtypes(d + "/model.safetensors") == {"BF16"}, dtypes(d + "/model.safetensors")
assert dtypes(d + "/expert_0/adapter_model.safetensors") == {"BF16"}
assert dtypes(d + "/router.safetensors") == {"F32"}  # gates stay exact
PY
echo "ok: --dtype bf16"

# the parity, loaded by transformers + PEFT (exit 77 = skip when they are missing)
rc=0
python3 "$src/tools/verify_hf_export.py" "$tmp/ml.h5" --tol 1e-4 \
  --case lora "$tmp/lora" "$lora/outputs/teacher_outputs.h5" \
  --case merge "$tmp/merge" "$lora/outputs/teacher_outputs.h5" \
  --case moe "$tmp/moe" "$moe/outputs/teacher_outputs.h5" \
  --case qlora4 "$tmp/q4" "$q4/outputs/teacher_outputs.h5" \
  --case llm "$tmp/llm" "$llm/outputs/teacher_outputs.h5" > "$tmp/verify.log" 2>&1 || rc=$?
grep -v -e "^Loading weights" -e "FutureWarning" -e "warnings.warn" "$tmp/verify.log" || true
exit $rc
