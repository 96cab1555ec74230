#!/usr/bin/env bash
# test_hostile_files.sh - issue 34, classes 3 and 4, through `pipeline run`:
#  - a FIFO named as the config, data.path, a backbone's config.json, its shard
#    index or a shard, --resume or init_from is refused at once, naming the path
#    and "is a FIFO, expected a regular file" (it used to block forever);
#  - a NaN or Inf in a backbone weight (F32 and BF16 files) is refused at load
#    in every precision, naming the file and the tensor (under qlora4 the NaN
#    used to vanish in NF4 quantization, exit 0).
# Every run is under `timeout`, so a regression fails instead of hanging.
# usage: test_hostile_files.sh SOURCE_DIR BUILD_DIR   (needs python3, numpy, h5py)
set -uo pipefail
src=$(cd "$1" && pwd)
bin=$2/core/pipeline
tmp=$(mktemp -d /tmp/pl_test_hostile_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 -c 'import numpy, h5py' 2>/dev/null || { echo "SKIP: needs numpy and h5py"; exit 77; }

python3 "$src/tests/support/make_ml_tiny.py" "$tmp/ml.h5" || fail "make_ml_tiny.py"
hf=$src/tests/data/hf_llama
write_ini() { # BACKBONE
cat > "$tmp/t.ini" <<EOF
[pipeline]
name = h
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
backbone = $1
item_dim = 8
adapters = lora
lora_rank = 4
max_len = 8
exclude_history = false
[precision]
plugin = fp32
[optimizer]
plugin = adamw
lr = 1e-2
[trainer]
max_epochs = 1
limit_train_batches = 2
limit_val_batches = 1
limit_test_batches = 1
EOF
}

# expect_refused WHAT WANT... -- ARGS: `pipeline ARGS` fails (not by timeout) and
# prints every WANT
expect_refused() {
    local what=$1
    shift
    local wants=()
    while [ "$1" != "--" ]; do wants+=("$1"); shift; done
    shift
    timeout 60 "$bin" "$@" > "$tmp/out" 2>&1
    local rc=$?
    [ $rc -eq 124 ] && fail "$what: still blocked after 60 s"
    [ $rc -eq 0 ] && { cat "$tmp/out"; fail "$what: exit 0, expected a refusal"; }
    [ $rc -gt 128 ] && { cat "$tmp/out"; fail "$what: killed by signal $((rc - 128))"; }
    for w in "${wants[@]}"; do
        grep -qF -- "$w" "$tmp/out" || { cat "$tmp/out"; fail "$what: no '$w' in the output"; }
    done
    echo "ok: $what"
}
FIFO="is a FIFO, expected a regular file"

# ---- class 4: FIFOs -----------------------------------------------------------
mkfifo "$tmp/fifo"
write_ini "$hf/gqa_tied"
expect_refused "config file is a FIFO" "$tmp/fifo" "$FIFO" -- run "$tmp/fifo"
expect_refused "data.path is a FIFO" "$tmp/fifo" "$FIFO" -- run "$tmp/t.ini" data.path="$tmp/fifo"
expect_refused "--resume is a FIFO" "$tmp/fifo" "$FIFO" -- run "$tmp/t.ini" --resume "$tmp/fifo"
expect_refused "init_from is a FIFO" "$tmp/fifo" "$FIFO" -- \
    run "$tmp/t.ini" trainer.init_from="$tmp/fifo"
# a backbone directory whose config.json, index or one shard is a FIFO
for part in config.json model.safetensors.index.json model-00002-of-00003.safetensors; do
    d=$tmp/bb_$part
    mkdir "$d"
    cp "$hf/gqa_untied_sharded"/* "$d"/
    rm "$d/$part"
    mkfifo "$d/$part"
    write_ini "$d"
    expect_refused "backbone $part is a FIFO" "$d/$part" "$FIFO" -- run "$tmp/t.ini"
done
# a directory and a character device are refused the same way
write_ini "$hf/gqa_tied"
expect_refused "data.path is a directory" "is a directory, expected a regular file" -- \
    run "$tmp/t.ini" data.path="$tmp"
expect_refused "init_from is /dev/zero" "/dev/zero" "is a character device, expected a regular file" \
    -- run "$tmp/t.ini" trainer.init_from=/dev/zero

# ---- class 3: non-finite backbone weights -----------------------------------
# poison(SRC_DIR DST_DIR TENSOR VALUE): copy a backbone, set one element of TENSOR
# (F32 or BF16) in model.safetensors to VALUE, in place
poison() {
    mkdir -p "$2" && cp "$1"/* "$2"/
    python3 - "$2/model.safetensors" "$3" "$4" <<'PY' || fail "poison $2"
import json, struct, sys
import numpy as np
path, name, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    e = hdr[name]
    f.seek(8 + n + e["data_offsets"][0] + 4 * 3 if e["dtype"] == "F32" else 8 + n + e["data_offsets"][0] + 2 * 3)
    b = np.array([value], dtype=np.float32).tobytes()
    f.write(b if e["dtype"] == "F32" else b[2:4])  # bf16: the high half of the f32
PY
}
tensor=model.layers.0.self_attn.q_proj.weight
poison "$hf/gqa_tied" "$tmp/nan32" "$tensor" nan
poison "$hf/bf16" "$tmp/inf16" "$tensor" inf
for prec in fp32 bf16-true qlora4; do
    case $prec in
    fp32) p=(precision.plugin=fp32) ;;
    bf16-true) p=(precision.plugin=bf16 precision.mode=bf16-true) ;;
    qlora4) p=(precision.plugin=qlora4 precision.block_size=32) ;;
    esac
    write_ini "$tmp/nan32"
    expect_refused "NaN in an F32 backbone ($prec)" "$tmp/nan32/model.safetensors" "'$tensor'" \
        "1 non-finite values" "first at flat index 3: nan" -- run "$tmp/t.ini" "${p[@]}"
    write_ini "$tmp/inf16"
    expect_refused "Inf in a BF16 backbone ($prec)" "$tmp/inf16/model.safetensors" "'$tensor'" \
        "first at flat index 3: inf" -- run "$tmp/t.ini" "${p[@]}"
done
# and the unpoisoned backbone still trains (the checks refuse only what they should)
write_ini "$hf/gqa_tied"
timeout 120 "$bin" run "$tmp/t.ini" precision.plugin=qlora4 precision.block_size=32 > "$tmp/out" 2>&1 \
    || { cat "$tmp/out"; fail "the clean backbone under qlora4 failed"; }
echo "PASS: FIFOs, directories and devices refused by name; non-finite backbone weights refused"
