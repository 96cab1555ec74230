#!/usr/bin/env python3
"""Fixtures for the ilora Hugging Face Llama backbone parity test.

usage: python3 tools/gen_hf_llama_reference.py [OUT_DIR]     (default tests/data/hf_llama)
       python3 tools/gen_hf_llama_reference.py --check [OUT_DIR]

Each fixture is a checkpoint directory exactly as transformers'
`save_pretrained` writes it (config.json, generation_config.json, the weights as
`model.safetensors` or `model-0000N-of-0000M.safetensors` shards +
`model.safetensors.index.json`) plus `reference.safetensors`:

  input_ids     i32 [2, 7]        fixed ids in [0, vocab) (0 and vocab-1 included)
  logits        f32 [2, 7, vocab] LlamaForCausalLM logits, float32, eval mode,
                                  attention_mask all ones (no padding), eager attention
  final_hidden  f32 [2, 7, hidden] the body's output after model.norm (before the
                                  head), to tell a head bug from a body bug

The reference is computed by loading the written directory back with
`LlamaForCausalLM.from_pretrained(dir, dtype=torch.float32)`, so it is what the
file holds (for the bf16 fixture: the bf16 weights upcast to f32, then f32
math), and is also checked against the in-memory model that wrote it.
Weights are random with a fixed seed and scaled so every term matters: linear
weights randn/sqrt(fan_in), embeddings randn*0.5, every RMSNorm weight
1 + 0.1*randn (so a missing or misplaced norm weight shows).

Fixtures (2 layers, vocab 96, all small enough to check in):
  gqa_tied            hidden 32, 4 heads / 2 kv heads (head_dim 8), ffn 80,
                      tied embeddings (no lm_head.weight in the file), f32, one file
  gqa_untied_sharded  hidden 48, 4 heads / 1 kv head, explicit head_dim 16
                      (q_proj is 48 -> 64), ffn 112, untied lm_head,
                      rope_theta 500000, f32, 3 shards + index
  bf16                gqa_tied's shape and weights saved as bfloat16
  legacy_config       gqa_tied's shape (other weights), f32, config.json rewritten
                      in the transformers 4.x layout that hub checkpoints such as
                      TinyLlama / SmolLM ship: `torch_dtype`, top-level
                      `rope_theta` (100000, not the default), no `head_dim`, no
                      `rope_parameters`, no `dtype`

--check recomputes the logits of every fixture in OUT_DIR with transformers
and compares them with reference.safetensors (exit 1 on a mismatch).
Writes OUT_DIR/README.md (versions, what each fixture checks, tensor names).
"""
import json
import math
import os
import shutil
import sys

import torch

VOCAB, LAYERS = 96, 2
INPUT_IDS = [[1, 5, 17, 42, 95, 0, 63],
             [7, 7, 88, 3, 60, 31, 12]]
PROJ_IN_OUT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

BASE = dict(vocab_size=VOCAB, num_hidden_layers=LAYERS, rms_norm_eps=1e-5,
            hidden_act="silu", max_position_embeddings=64, initializer_range=0.02,
            attention_bias=False, mlp_bias=False)
GQA = dict(hidden_size=32, intermediate_size=80, num_attention_heads=4,
           num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True)

FIXTURES = {
    "gqa_tied": dict(
        cfg=GQA, seed=1, dtype="float32", shard=None,
        checks="grouped-query attention (4 query heads share 2 kv heads), tied head "
               "(logits = final_hidden @ embed_tokens^T; lm_head.weight absent from "
               "the file), f32 single-file model.safetensors, transformers-5 config "
               "layout (`dtype`, `rope_parameters.rope_theta`, `head_dim` written)"),
    "gqa_untied_sharded": dict(
        cfg=dict(hidden_size=48, intermediate_size=112, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=16, rope_theta=500000.0,
                 tie_word_embeddings=False),
        seed=2, dtype="float32", shard="100KB",
        checks="multi-query attention (1 kv head), head_dim 16 != hidden/heads 12 "
               "(q_proj [64, 48], k/v_proj [16, 48], o_proj [48, 64]), untied "
               "lm_head.weight, rope_theta 500000 read from `rope_parameters`, "
               "sharded safetensors (3 shards, tensors located through "
               "model.safetensors.index.json weight_map), f32"),
    "bf16": dict(
        cfg=GQA, seed=1, dtype="bfloat16", shard=None,
        checks="BF16 tensors in the file (`dtype: bfloat16` in config.json); same "
               "shape as gqa_tied and gqa_tied's weights rounded to bf16; reference "
               "logits = bf16 weights upcast to f32, all math in f32 (what the C side "
               "computes after converting on load)"),
    "legacy_config": dict(
        cfg=dict(GQA, rope_theta=100000.0), seed=3, dtype="float32", shard=None,
        legacy=True,
        checks="config.json in the transformers 4.x layout of hub checkpoints "
               "(TinyLlama, SmolLM): `torch_dtype` instead of `dtype`, `rope_theta` "
               "(100000, not the 10000 default) at the top level instead of "
               "`rope_parameters`, no `head_dim` key (so head_dim = hidden/heads = 8); "
               "tied head, f32, one file"),
}

REQUIRED = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "rms_norm_eps", "vocab_size", "tie_word_embeddings",
            "max_position_embeddings", "architectures", "hidden_act"]


def random_state(model, cfg, seed):
    """Random weights for every parameter, in sorted-name order from one generator."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, p in sorted(model.state_dict().items()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.endswith("norm.weight"):
            sd[name] = 1 + 0.1 * torch.randn(p.shape, generator=g)
        elif name == "model.embed_tokens.weight":
            sd[name] = 0.5 * torch.randn(p.shape, generator=g)
        else:  # linear [out, in]
            sd[name] = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])
    return sd


def forward(model, ids):
    model.eval()
    with torch.no_grad():
        mask = torch.ones_like(ids)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    return logits.float(), hidden.float()   # last_hidden_state is after model.norm


def weight_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".safetensors") and f != "reference.safetensors")


def tensor_names(d):
    from safetensors import safe_open
    names = {}
    for f in weight_files(d):
        with safe_open(os.path.join(d, f), "pt") as h:
            for k in h.keys():
                names[k] = (f, str(h.get_slice(k).get_dtype()), h.get_slice(k).get_shape())
    return names


def load_f32(d):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")


def check_config(d):
    c = json.load(open(os.path.join(d, "config.json")))
    missing = [k for k in REQUIRED if k not in c]
    if "torch_dtype" not in c and "dtype" not in c:
        missing.append("torch_dtype|dtype")
    if "rope_theta" not in c and "rope_theta" not in (c.get("rope_parameters") or {}):
        missing.append("rope_theta|rope_parameters.rope_theta")
    if c.get("architectures") != ["LlamaForCausalLM"]:
        missing.append("architectures == [LlamaForCausalLM]")
    if missing:
        raise SystemExit(f"{d}/config.json lacks {missing}")
    return c


def make_fixture(out, name, spec):
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    import transformers

    d = os.path.join(out, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    cfg = LlamaConfig(**BASE, **spec["cfg"], dtype="float32")
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    sd = random_state(model, cfg, spec["seed"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if spec["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
    ids = torch.tensor(INPUT_IDS, dtype=torch.long)
    # in-memory reference: the same (possibly bf16-rounded) weights in f32
    mem = LlamaForCausalLM(cfg)
    mem.load_state_dict({k: v.float() for k, v in model.state_dict().items()}, strict=False)
    logits_mem, _ = forward(mem, ids)

    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(d, **kw)
    if spec.get("legacy"):
        cp = os.path.join(d, "config.json")
        c = json.load(open(cp))
        rp = c.pop("rope_parameters")
        assert rp.get("rope_type", "default") == "default"
        c["rope_theta"] = rp["rope_theta"]
        c["torch_dtype"] = c.pop("dtype")
        c.pop("head_dim", None)
        with open(cp, "w") as f:
            json.dump(dict(sorted(c.items())), f, indent=2)
            f.write("\n")
    conf = check_config(d)
    if spec["shard"]:
        assert len(weight_files(d)) >= 2 and os.path.exists(os.path.join(d, "model.safetensors.index.json"))

    back = load_f32(d)
    logits, hidden = forward(back, ids)
    err = (logits - logits_mem).abs().max().item()
    assert err < 1e-5, f"{name}: reloaded logits differ from the in-memory model by {err}"
    want_dtype = "BF16" if spec["dtype"] == "bfloat16" else "F32"
    names = tensor_names(d)
    assert all(v[1] == want_dtype for v in names.values()), names
    assert ("lm_head.weight" in names) == (not cfg.tie_word_embeddings)

    meta = {
        "fixture": name,
        "checks": spec["checks"],
        "file_dtype": spec["dtype"],
        "reference": ("bf16 file weights upcast to f32, forward in f32" if spec["dtype"] == "bfloat16"
                      else "f32 weights, forward in f32"),
        "model": "LlamaForCausalLM, eval, attention_mask all ones, eager attention, use_cache False",
        "config": json.dumps({k: conf.get(k) for k in sorted(conf) if k in (
            REQUIRED + ["head_dim", "rope_theta", "rope_parameters", "dtype", "torch_dtype"])},
            sort_keys=True),
        "weight_tensors": json.dumps(sorted(names)),
        "seed": str(spec["seed"]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generator": "tools/gen_hf_llama_reference.py",
    }
    save_file({"input_ids": ids.to(torch.int32).contiguous(),
               "logits": logits.contiguous(),
               "final_hidden": hidden.contiguous()},
              os.path.join(d, "reference.safetensors"), metadata=meta)
    return d, conf, names, logits


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def write_readme(out, rows):
    import transformers
    import safetensors
    lines = [
        "# tests/data/hf_llama: Hugging Face Llama checkpoints with reference logits",
        "",
        "Generated by `python3 tools/gen_hf_llama_reference.py` (deterministic: same tensors and metadata on a rerun, though safetensors may order the metadata keys of reference.safetensors differently; "
        "`--check` recomputes the logits from the files here and compares).",
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}.",
        "",
        "Each directory is what `LlamaForCausalLM.save_pretrained` writes, plus "
        "`reference.safetensors`: `input_ids` i32 [2, 7], `logits` f32 [2, 7, 96] "
        "and `final_hidden` f32 [2, 7, hidden] (after `model.norm`), computed by "
        "`LlamaForCausalLM.from_pretrained(dir, dtype=float32)` in eval mode, "
        "attention_mask all ones, eager attention. Its safetensors metadata repeats "
        "what the fixture checks, the config fields and the tensor names. All have 2 "
        "layers, vocab 96, rms_norm_eps 1e-5, SiLU, random weights (linear "
        "randn/sqrt(fan_in), embeddings 0.5*randn, every norm weight 1 + 0.1*randn).",
        "",
        "config.json layout: transformers >= 5 (this generator's) writes `dtype` instead "
        "of `torch_dtype` and `rope_parameters: {\"rope_theta\": ..., \"rope_type\": "
        "\"default\"}` instead of a top-level `rope_theta`, and always writes `head_dim`. "
        "Checkpoints on the hub saved by transformers 4.x (TinyLlama, SmolLM) use "
        "`torch_dtype`, top-level `rope_theta` and often no `head_dim`: `legacy_config` "
        "has that layout. A loader should read `torch_dtype` or `dtype`, "
        "`rope_theta` or `rope_parameters.rope_theta` (default 10000), and "
        "`head_dim` defaulting to hidden_size / num_attention_heads. Tied checkpoints "
        "have no `lm_head.weight` in the file (the head is `model.embed_tokens.weight`).",
        "",
        "| fixture | bytes | files | what it checks | tensors in the weight files |",
        "|---|---|---|---|---|",
    ]
    for name, d, conf, names in rows:
        files = ", ".join(weight_files(d))
        nl = len(names)
        extra = "incl. `lm_head.weight`" if "lm_head.weight" in names else "no `lm_head.weight`"
        dts = sorted({v[1] for v in names.values()})
        lines.append(f"| `{name}` | {dir_bytes(d):,} | {files} | {FIXTURES[name]['checks']} | "
                     f"{nl} ({'/'.join(dts)}): `model.embed_tokens.weight`, `model.norm.weight`, "
                     f"per layer `input_layernorm`, `post_attention_layernorm`, "
                     f"`self_attn.{{q,k,v,o}}_proj`, `mlp.{{gate,up,down}}_proj` "
                     f"(`.weight`); {extra} |")
    lines += ["", "Tensor shapes per fixture (name: file, dtype, shape):", ""]
    for name, d, conf, names in rows:
        lines.append(f"- `{name}`: " + "; ".join(
            f"`{k}` {v[0].replace('.safetensors', '')} {v[1]} {list(v[2])}"
            for k, v in sorted(names.items()) if ".layers.0." in k or ".layers." not in k))
    lines += ["", "(layer 1 has the shapes of layer 0.)", "",
              "Independent check: `tools/tests/test_hf_llama_fixtures.py` (torch + safetensors, "
              "no transformers) recomputes every fixture from the files with a plain Llama "
              "forward and matches `logits` to about 4e-6 (f32 summation order); the usual "
              "loader bugs (rope_theta ignored, norm weights ignored, interleaved-pair RoPE "
              "instead of rotate_half, kv heads tiled instead of repeat_kv's "
              "query head h -> kv head h / (heads/kv_heads), embedding as head of the untied "
              "model) miss by 0.37 or more. A C parity tolerance of 1e-4 on the logits "
              "separates the two.", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines))


def check(out):
    from safetensors.torch import load_file
    bad = 0
    for name in FIXTURES:
        d = os.path.join(out, name)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        logits, hidden = forward(load_f32(d), ref["input_ids"].long())
        e1 = (logits - ref["logits"]).abs().max().item()
        e2 = (hidden - ref["final_hidden"]).abs().max().item()
        ok = e1 < 1e-5 and e2 < 1e-5
        bad += not ok
        print(f"{name}: max |logits diff| {e1:.2e}, |final_hidden diff| {e2:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


def main(argv):
    torch.set_num_threads(min(2, torch.get_num_threads()))
    do_check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = argv[0] if argv else os.path.join(root, "tests", "data", "hf_llama")
    if do_check:
        return check(out)
    os.makedirs(out, exist_ok=True)
    rows = []
    for name, spec in FIXTURES.items():
        d, conf, names, logits = make_fixture(out, name, spec)
        rows.append((name, d, conf, names))
        print(f"{name}: {dir_bytes(d):,} bytes, {len(weight_files(d))} weight file(s), "
              f"{len(names)} tensors, logits std {logits.std().item():.3f}")
    write_readme(out, rows)
    total = sum(dir_bytes(d) for _, d, _, _ in rows)
    print(f"total {total:,} bytes in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
