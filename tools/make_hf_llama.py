#!/usr/bin/env python3
"""Write a randomly initialized Hugging Face Llama checkpoint directory.

usage: python3 tools/make_hf_llama.py NAME OUT_DIR [--seed 0] [--dtype bf16|f32]
                                      [--max-shard-size 2GB]

NAME is one of
  tiny  2 layers, hidden 64, 4 heads / 2 kv heads, intermediate 128, vocab 256,
        max_position_embeddings 128, tied embeddings (for quick tests)
  135m  30 layers, hidden 576, 9 heads / 3 kv heads, intermediate 1536,
        vocab 49152, tied embeddings: the shape of SmolLM-135M
  1b    22 layers, hidden 2048, 32 heads / 4 kv heads, intermediate 5632,
        vocab 32000, untied lm_head: the shape of TinyLlama-1.1B
All sizes: rms_norm_eps 1e-5, rope_theta 10000, hidden_act silu, no rope_scaling.

The model is built with transformers (`LlamaConfig`, `LlamaForCausalLM(config)`,
initializer_range 0.02, created directly in the target dtype so the 1b model
never exists in f32 in RAM) and written with `save_pretrained` as safetensors
(`model.safetensors`, or `model-0000N-of-0000M.safetensors` shards plus
`model.safetensors.index.json` above --max-shard-size), with `config.json`
and `generation_config.json`. Tied checkpoints have no `lm_head.weight` in the
file (transformers drops the tied copy).

Nothing is downloaded: the config is built here, the weights are random. A
real pretrained checkpoint of this architecture (e.g. HuggingFaceTB/SmolLM-135M
or TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T, fetched by other means)
is the same directory layout and loads the same way; note that checkpoints
saved by transformers 4.x spell the file dtype `torch_dtype` and keep
`rope_theta` at the top level of config.json, while transformers >= 5 writes
`dtype` and `rope_parameters: {"rope_theta": ..., "rope_type": "default"}`.
Prints the time taken and the bytes written.
"""
import argparse
import inspect
import os
import sys
import time

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                 max_position_embeddings=128, tie_word_embeddings=True),
    "135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                 max_position_embeddings=2048, tie_word_embeddings=True),
    "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
               max_position_embeddings=2048, tie_word_embeddings=False),
}
COMMON = dict(rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
              initializer_range=0.02, rope_scaling=None)


def make_config(name, dtype_name):
    from transformers import LlamaConfig
    kw = dict(SIZES[name])
    kw.update(COMMON)
    kw["dtype"] = dtype_name
    return LlamaConfig(**kw)


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if os.path.isfile(os.path.join(path, f)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("name", choices=sorted(SIZES))
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--max-shard-size", default="2GB",
                    help="shard above this size (transformers' max_shard_size)")
    a = ap.parse_args(argv)

    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(min(2, torch.get_num_threads()))
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    dtype_name = {"bf16": "bfloat16", "f32": "float32"}[a.dtype]
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    cfg = make_config(a.name, dtype_name)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)          # parameters are created (and initialized) in dt
    try:
        model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    t_build = time.perf_counter() - t0
    os.makedirs(a.out_dir, exist_ok=True)
    kw = {"max_shard_size": a.max_shard_size}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True   # transformers 4.x; 5.x writes safetensors only
    model.save_pretrained(a.out_dir, **kw)
    t_all = time.perf_counter() - t0
    size = dir_bytes(a.out_dir)
    files = sorted(f for f in os.listdir(a.out_dir) if f.endswith(".safetensors"))
    print(f"{a.name}: {n_params:,} parameters ({a.dtype}), {len(files)} safetensors file(s), "
          f"{size:,} bytes in {a.out_dir}; build {t_build:.1f} s, total {t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
