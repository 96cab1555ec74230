#!/usr/bin/env python3
"""Write a LlamaForCausalLM config.json of a named shape (no weights), for a
backbone built with `model.backbone_weights = random` (issue 31).

usage: python3 tools/llama_config.py SIZE DIR
  SIZE: 135m (SmolLM-135M), 1b (TinyLlama-1.1B), 7b (Llama-2-7B: hidden 4096,
  32 layers, 32 heads, intermediate 11008); file dtype bfloat16.
Used by bench/teacher/scale.sh and tools/gpu_check.sh (scale, profile)."""
import json
import os
import sys

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings
    "135m": (576, 30, 9, 3, 1536, 49152, True),
    "1b": (2048, 22, 32, 4, 5632, 32000, False),
    "7b": (4096, 32, 32, 32, 11008, 32000, False),
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: llama_config.py {{{'|'.join(SHAPES)}}} DIR")
    h, l, nh, kv, i, v, tie = SHAPES[sys.argv[1]]
    os.makedirs(sys.argv[2], exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
           "num_hidden_layers": l, "num_attention_heads": nh, "num_key_value_heads": kv,
           "intermediate_size": i, "vocab_size": v, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": tie, "initializer_range": 0.02, "torch_dtype": "bfloat16"}
    with open(os.path.join(sys.argv[2], "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


if __name__ == "__main__":
    main()
