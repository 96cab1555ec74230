#!/usr/bin/env python3
"""Check tests/data/hf_llama without transformers: a plain-torch Llama forward
(RMSNorm, rotate_half RoPE, causal GQA attention with HF's repeat_kv head
mapping, SwiGLU, tied or untied head) read straight from the safetensors files
and config.json (either config layout) must reproduce reference.safetensors
(logits and final_hidden, max abs diff < 1e-4), and the usual loader bugs
(wrong rope_theta, norm weights ignored, interleaved-pair RoPE, kv heads tiled
instead of repeated, embedding used as the head of an untied model) must miss
it by more than 0.1, so the fixtures can tell them apart. Exit 77 (skip) without
torch + safetensors."""
import json
import math
import os
import sys

try:
    import torch
    from safetensors.torch import load_file
except ImportError:
    print("skip: needs torch and safetensors")
    sys.exit(77)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf_llama")
BUGS = ["theta", "nonormw", "interleaved", "gqa_tile", "head_other"]


def load(d):
    c = json.load(open(os.path.join(d, "config.json")))
    w = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors") and f != "reference.safetensors":
            w.update({k: v.float() for k, v in load_file(os.path.join(d, f)).items()})
    return c, w


def run(d, bug=None):
    """Max |diff| of (logits, final_hidden) against the reference, with an optional bug."""
    c, w = load(d)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    ids = ref["input_ids"].long()
    B, T = ids.shape
    H, KV, D = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    hd = c.get("head_dim") or D // H
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    if bug == "theta":
        theta = 10000.0 if theta != 10000.0 else 500000.0
    eps = c["rms_norm_eps"]

    def rms(x, g):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y if bug == "nonormw" else y * g

    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(T).float()[:, None] * inv
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()

    def rope(x):
        if bug == "interleaved":   # GPT-J / Meta-original pairing: wrong for HF files
            x1, x2 = x[..., 0::2], x[..., 1::2]
            c2, s2 = cos[:, : hd // 2], sin[:, : hd // 2]
            return torch.stack([x1 * c2 - x2 * s2, x1 * s2 + x2 * c2], -1).flatten(-2)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    causal = torch.triu(torch.full((T, T), -1e30), 1)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        if bug == "gqa_tile":      # query head h -> kv head h % KV: wrong
            k, v = k.repeat(1, H // KV, 1, 1), v.repeat(1, H // KV, 1, 1)
        else:                      # HF repeat_kv: query head h -> kv head h // (H / KV)
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd) + causal
        a = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (g * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])   # tied: no lm_head in file
    if bug == "head_other":
        head = w["model.embed_tokens.weight"]
    logits = x @ head.T
    return ((logits - ref["logits"]).abs().max().item(),
            (x - ref["final_hidden"]).abs().max().item())

def main():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    root = sys.argv[1] if len(sys.argv) > 1 else ROOT
    fixtures = sorted(f for f in os.listdir(root) if os.path.isdir(os.path.join(root, f)))
    assert fixtures, root
    bad = 0
    for f in fixtures:
        d = os.path.join(root, f)
        c = json.load(open(os.path.join(d, "config.json")))
        e_logits, e_hidden = run(d)
        ok = e_logits < 1e-4 and e_hidden < 1e-4
        applicable = [b for b in BUGS
                      if not (b == "gqa_tile" and c["num_key_value_heads"] in (1, c["num_attention_heads"]))
                      and not (b == "head_other" and c.get("tie_word_embeddings", True))]
        misses = {b: run(d, b)[0] for b in applicable}
        ok = ok and all(v > 0.1 for v in misses.values())
        bad += not ok
        print(f"{f}: logits {e_logits:.1e}, final_hidden {e_hidden:.1e}; bug variants miss by "
              + ", ".join(f"{b} {v:.2g}" for b, v in misses.items()) + (" ok" if ok else " FAIL"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
