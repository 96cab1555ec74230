#!/usr/bin/env bash
# test_llm_run.sh - the iLoRA teacher on a Hugging Face Llama checkpoint
# (tests/data/hf_llama/gqa_tied), through `pipeline run`, in every precision:
# checkpoints hold the adapters, router and item projections but not the
# frozen backbone; a resume from a mid-run step checkpoint ends with weights
# equal to the straight run's (bit-exact); the last checkpoint serves
# init_from; gradient_checkpointing gives the straight run's weights.
# usage: test_llm_run.sh SOURCE_DIR BUILD_DIR   (ctest runs it)
set -euo pipefail
src=$1
bin=$2/core/pipeline
tmp=$(mktemp -d /tmp/pl_test_llm_run_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# a tiny MovieLens-shaped file: 40 items, 24 users, rows of 8
python3 "$src/tests/support/make_ml_tiny.py" "$tmp/ml.h5"

cat > "$tmp/t.ini" <<EOF
[pipeline]
name = llm
seed = 3
run_dir = $tmp/runs
[data]
plugin = hdf5_rows
path = $tmp/ml.h5
datasets = input_ids,labels
val_datasets = input_ids,target,user_index
test_datasets = input_ids,target,user_index
batch_size = 4
shuffle = true
[model]
plugin = ilora
backbone = $src/tests/data/hf_llama/gqa_tied
item_dim = 8
adapters = moe_lora
num_experts = 2
lora_rank = 4
lora_dropout = 0.1
max_len = 8
dropout = 0.0
exclude_history = false
[precision]
plugin = fp32
[optimizer]
plugin = adamw
lr = 1e-2
[trainer]
max_epochs = 2
checkpoint_every_n_train_steps = 4
log_every_n_steps = 1
EOF

# safetensors read by hand (numpy has no bfloat16): name -> (dtype, shape, raw bytes)
cat > "$tmp/st.py" <<'PY'
import json, struct
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items()}
def f32(t):
    dt, shape, raw = t
    if dt == "F32": return np.frombuffer(raw, np.float32).reshape(shape)
    if dt == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return None
PY
export PYTHONPATH=$tmp

compare() { # last.safetensors of two runs: equal tensors (bit-exact), same names
  python3 - "$1" "$2" <<'PY' || fail "$3"
import sys
from st import load
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, f"differ: {bad[:5]}"
PY
}

for prec in fp32 bf16-true qlora4; do
  case $prec in
    fp32) p=(precision.plugin=fp32) ;;
    bf16-true) p=(precision.plugin=bf16 precision.mode=bf16-true) ;;
    qlora4) p=(precision.plugin=qlora4 precision.block_size=32) ;;
  esac
  "$bin" run "$tmp/t.ini" pipeline.name=a_$prec "${p[@]}" > "$tmp/a_$prec.log" 2>&1 \
    || { cat "$tmp/a_$prec.log"; fail "$prec: straight run"; }
  a=$(echo "$tmp"/runs/a_$prec/2*/checkpoints)
  # the backbone is not in checkpoints; adapters, router, projections are
  python3 - "$a/last.safetensors" <<'PY' || fail "$prec: checkpoint contents"
import sys
from st import load
names = set(load(sys.argv[1]))
assert not any(n.endswith("self_attn.q_proj.weight") or n == "model.norm.weight" for n in names), names
for need in ("router.weight", "item_proj.weight", "score_proj.weight", "model.embed_tokens.weight",
             "model.layers.0.self_attn.q_proj.lora_A.weight"):
    assert need in names, need
PY
  grep -q "pretrained weights kept from their source" "$tmp/a_$prec.log" || fail "$prec: no kept-from-source log line"
  [[ -f $a/step-000004.safetensors ]] || fail "$prec: no step-4 checkpoint"
  "$bin" run "$tmp/t.ini" pipeline.name=b_$prec "${p[@]}" --resume "$a/step-000004.safetensors" \
    > "$tmp/b_$prec.log" 2>&1 || { cat "$tmp/b_$prec.log"; fail "$prec: resume"; }
  compare "$a/last.safetensors" "$(echo "$tmp"/runs/b_$prec/2*/checkpoints/last.safetensors)" \
    "$prec: resumed run's weights differ from the straight run's"
  "$bin" run "$tmp/t.ini" pipeline.name=c_$prec "${p[@]}" trainer.init_from="$a/last.safetensors" \
    trainer.max_epochs=1 > "$tmp/c_$prec.log" 2>&1 || { cat "$tmp/c_$prec.log"; fail "$prec: init_from"; }
  grep -q "loaded .* parameter tensors from" "$tmp/c_$prec.log" || fail "$prec: init_from did not load"
  echo "ok: $prec (straight, resume bit-exact, init_from)"
done

# the gradient norm covers the trainable parameters wherever they sit: here the first
# parameters (the frozen backbone) have no gradient, and a norm loop that stopped at
# them logged 0 (and would never clip)
python3 - "$(echo "$tmp"/runs/a_fp32/2*/metrics.csv)" <<'PY' || fail "grad_norm is not positive with a frozen backbone"
import sys
rows = [l.split(",") for l in open(sys.argv[1]).read().splitlines()[1:]]
g = [float(r[3]) for r in rows if r[2] == "grad_norm"]
assert g and all(v > 0 for v in g), g
PY

# activation checkpointing: the same weights as the straight fp32 run (within fp32 rounding)
"$bin" run "$tmp/t.ini" pipeline.name=gc model.gradient_checkpointing=true > "$tmp/gc.log" 2>&1 \
  || { cat "$tmp/gc.log"; fail "gradient_checkpointing run"; }
python3 - "$(echo "$tmp"/runs/a_fp32/2*/checkpoints/last.safetensors)" \
  "$(echo "$tmp"/runs/gc/2*/checkpoints/last.safetensors)" <<'PY' || fail "gradient_checkpointing changes the weights"
import sys
import numpy as np
from st import load, f32
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b)
for k in a:
    x, y = f32(a[k]), f32(b[k])
    if x is not None:
        d = np.abs(x.astype(np.float64) - y).max()
        assert d <= 1e-4 * (1 + np.abs(x).max()), (k, d)
PY
echo "ok: gradient_checkpointing"

# Issue 34: the run's config.ini records the shape options it took from their
# defaults (dim = 64  ; default); read back, they counted as set and disagreed
# with config.json (hidden_size = 32), so `pipeline predict RUN` and
# `pipeline run RUN/config.ini` refused every run on a Hugging Face backbone.
a=$(echo "$tmp"/runs/a_fp32/2*)
grep -q "^dim .*= 64  ; default$" "$a/config.ini" || fail "config.ini does not record dim as a default"
"$bin" predict "$a" "$tmp/ml.h5" "$tmp/pred.h5" > "$tmp/pred.log" 2>&1 \
  || { cat "$tmp/pred.log"; fail "predict on a Hugging Face backbone run"; }
[[ -s $tmp/pred.h5 ]] || fail "predict wrote no file"
"$bin" run "$a/config.ini" pipeline.name=rerun > "$tmp/rerun.log" 2>&1 \
  || { cat "$tmp/rerun.log"; fail "pipeline run RUN/config.ini on a Hugging Face backbone run"; }
compare "$a/checkpoints/last.safetensors" "$(echo "$tmp"/runs/rerun/2*/checkpoints/last.safetensors)" \
  "the run of RUN/config.ini does not repeat the run"
echo "ok: predict and RUN/config.ini on a Hugging Face backbone run"
