#!/usr/bin/env bash
# Seed corpora of the harnesses, generated from the repository (nothing
# binary is committed): fuzz/seeds.sh OUT_DIR writes OUT_DIR/<harness>/.
#   ini          configs/*.ini, alone and with a few command-line overrides
#   safetensors  the small safetensors fixtures of tests/data
#   hf_config    the config.json (and index) of every tests/data/hf_llama
#                checkpoint, and a tiny complete checkpoint
#   hdf5         one input per loader mode (the valid layout), per mode and
#                hostile storage or damage (byte 0 bits 2..4), and a few
#                byte patterns
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: fuzz/seeds.sh OUT_DIR}
mkdir -p "$out"/{ini,safetensors,hf_config,hdf5}
sep=$'\n%%\n'

for f in "$repo"/configs/*.ini; do
  b=$(basename "$f" .ini)
  cp "$f" "$out/ini/$b.ini"
  { cat "$f"; printf '%s' "$sep"
    printf 'trainer.max_epochs=3\ndata.batch_size=8\n~trainer.monitor\npipeline.seed=7\n'; } > "$out/ini/$b-over.ini"
done
printf '[data]\nplugin = hdf5_chunk\npath = x.h5\n[model]\nplugin = mlp\n%s~data\ndata.plugin=hdf5_graph\ndata.path=y.h5\n' "$sep" > "$out/ini/swap.ini"

# the fixtures are larger than the fuzzer's 4 KiB inputs (a truncated file never
# opens): each is rewritten with the tensors that fit (header and offsets
# rebuilt), and one small file per dtype, with metadata, is added
python3 - "$out/safetensors" "$repo"/tests/data/ilora/reference.safetensors \
  "$repo"/tests/data/hf_llama/*/reference.safetensors <<'PY'
import json, os, struct, sys
out = sys.argv[1]

def write(path, entries, meta=None):
    header, blob = {}, b""
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)

for f in sys.argv[2:]:
    raw = open(f, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    entries, size = [], 0
    for name, t in sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        if size + (e - b) + len(name) + 120 > 2400:
            continue
        entries.append((name, t["dtype"], t["shape"], raw[8 + n + b:8 + n + e]))
        size += (e - b) + len(name) + 120
    write(os.path.join(out, os.path.basename(os.path.dirname(f)) + ".safetensors"), entries, meta)

sizes = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1}
entries = [("t_" + d.lower(), d, [2, 3], bytes(range(6 * k))) for d, k in sizes.items()]
write(os.path.join(out, "every_dtype.safetensors"), entries, {"format": "pt", "step": "1"})
write(os.path.join(out, "scalar_and_empty.safetensors"),
      [("s", "F32", [], struct.pack("<f", 1.5)), ("e", "F32", [0, 4], b"")])
PY

for d in "$repo"/tests/data/hf_llama/*/; do
  b=$(basename "$d")
  if [[ -f $d/model.safetensors.index.json ]]; then
    { cat "$d/config.json"; printf '%s' "$sep"; cat "$d/model.safetensors.index.json"; } > "$out/hf_config/$b"
  else
    cp "$d/config.json" "$out/hf_config/$b"
  fi
done
# a tiny checkpoint: config, no index, model.safetensors (embeddings 8 x 4, one q_proj 4 x 4)
python3 - "$out/hf_config/tiny" <<'PY'
import json, struct, sys
cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4, "intermediate_size": 8,
       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
       "vocab_size": 8, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
       "tie_word_embeddings": True, "torch_dtype": "float32"}
tensors = {"model.embed_tokens.weight": [8, 4], "model.layers.0.self_attn.q_proj.weight": [4, 4]}
header, off, blob = {}, 0, b""
for name, shape in tensors.items():
    n = shape[0] * shape[1]
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
    blob += struct.pack("<%df" % n, *[0.25 * (i % 7) for i in range(n)])
    off += 4 * n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
st = struct.pack("<Q", len(h)) + h + blob
sep = b"\n%%\n"
open(sys.argv[1], "wb").write(json.dumps(cfg).encode() + sep + sep + st)
PY

for m in 0 1 2 3; do
  # byte 0 bits 2..4: storage the loaders must refuse (virtual, external) or a
  # damaged file (truncated, superblock byte overwritten); fuzz_hdf5.c
  for st in 1 2 3 4 5 6 7; do
    printf "\\x$(printf %x $((m | st << 2)))" > "$out/hdf5/mode$m-storage$st"
    { printf "\\x$(printf %x $((m | st << 2)))"; head -c 64 /dev/zero | tr '\0' '\125'; } > "$out/hdf5/mode$m-storage$st-r"
  done
  printf "\\x$m" > "$out/hdf5/mode$m"
  { printf "\\x$m"; head -c 96 /dev/zero | tr '\0' '\125'; } > "$out/hdf5/mode$m-55"
  { printf "\\x$m"; head -c 96 /dev/zero | tr '\0' '\377'; } > "$out/hdf5/mode$m-ff"
done
echo "seeds: $(find "$out" -type f | wc -l) files in $out"
