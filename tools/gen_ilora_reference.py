#!/usr/bin/env python3
"""Reference data for plugins/models/ilora/test_ilora.c, computed with PyTorch.

usage: python3 tools/gen_ilora_reference.py [out.safetensors]
       (default tests/data/ilora/reference.safetensors)
       python3 tools/gen_ilora_reference.py --router [out.safetensors]
       (default tests/data/ilora/reference_router.safetensors: the per-position
       router over the backbone's hidden states, temperature and auxiliary
       losses; see router_reference)

An independent PyTorch implementation of the ilora model (Hugging Face
LlamaForCausalLM formulas: LlamaRMSNorm, rotate_half RoPE, causal attention,
SwiGLU MLP, tied head) with iLoRA MoE-LoRA adapters written the direct way,
one expert at a time:

    y = W0 x + (alpha / r_e) * sum_k g_k * B_k (A_k x),   g = softmax(W_r mean(E[ids]) + b_r)

(the C plugin stacks the experts into one A [E*r_e, in] and one B [out, E*r_e];
expert k owns rows/columns k*r_e .. (k+1)*r_e - 1). Padding keys get a bias of
-1e9 before the softmax, as in the plugin. Weights are random (seeded), LoRA B
non-zero so the adapter path matters.

Stored tensors (all f32 unless noted):
  every parameter under its plugin name (model.embed_tokens.weight, ...,
  ...q_proj.lora_A.weight, router.weight, router.bias)
  input_ids i32 [B, L], labels i32 [B, L]
  expected.logits [B, L, V]       adapters on (moe_lora), eval mode
  expected.logits_base [B, L, V]  same weights, adapters off (backbone only)
  expected.gates [B, E]
  expected.loss [1]               mean CE over labels != 0 (adapters on)
  expected.grad.<name>            d loss / d name for every adapter/router parameter
  expected.base_loss [1], expected.base_grad.<name>: backbone-only model, every backbone parameter
Metadata: the model options (dim, layers, heads, ffn_dim, num_items, ...).
"""
import math
import os
import sys

import torch
from safetensors.torch import save_file

NUM_ITEMS = 12
DIM, LAYERS, HEADS, FFN = 8, 2, 2, 24
E, RANK, ALPHA = 2, 4, 8.0
EPS, THETA = 1e-6, 10000.0
B, L = 3, 6
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def pname(l, p):
    blk = "self_attn" if p in PROJ[:4] else "mlp"
    return f"model.layers.{l}.{blk}.{p}"


def make_weights(g):
    V, D = NUM_ITEMS + 1, DIM
    w = {}
    w["model.embed_tokens.weight"] = torch.randn(V, D, generator=g) * 0.5
    w["model.embed_tokens.weight"][0] = 0.0
    ind = {"q_proj": D, "k_proj": D, "v_proj": D, "o_proj": D, "gate_proj": D, "up_proj": D,
           "down_proj": FFN}
    outd = {"q_proj": D, "k_proj": D, "v_proj": D, "o_proj": D, "gate_proj": FFN, "up_proj": FFN,
            "down_proj": D}
    r_e = RANK // E
    for l in range(LAYERS):
        w[f"model.layers.{l}.input_layernorm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
        w[f"model.layers.{l}.post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
        for p in PROJ:
            w[pname(l, p) + ".weight"] = torch.randn(outd[p], ind[p], generator=g) / math.sqrt(ind[p])
            w[pname(l, p) + ".lora_A.weight"] = torch.randn(E * r_e, ind[p], generator=g) / math.sqrt(ind[p])
            w[pname(l, p) + ".lora_B.weight"] = torch.randn(outd[p], E * r_e, generator=g) * 0.05
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(D, generator=g)
    w["router.weight"] = torch.randn(E, D, generator=g) * 0.5
    w["router.bias"] = torch.randn(E, generator=g) * 0.1
    return w


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(x):  # x [B, H, L, Dh], positions 0..L-1 (HF LlamaRotaryEmbedding)
    Dh = x.shape[-1]
    inv_freq = 1.0 / (THETA ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    t = torch.arange(x.shape[-2], dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    return x * cos + rotate_half(x) * sin


def forward(w, ids, adapters, router="mean_embedding", temperature=1.0, want_hidden=False):
    """logits (and gates; with want_hidden the final hidden states instead).
    router = mean_embedding: g [B, E] = softmax((W_r mean(E[ids != 0]) + b_r) / T)
    router = last_hidden:    g [B, L, E] = softmax((W_r h_t + b_r) / T), h_t the final
                             hidden state of the same weights without adapters (detached)"""
    V, D = NUM_ITEMS + 1, DIM
    Dh = D // HEADS
    r_e = RANK // E
    scale = ALPHA / r_e
    emb = w["model.embed_tokens.weight"]
    if not adapters:
        gates = None
    elif router == "mean_embedding":
        mask = (ids != 0).float()
        rep = (emb[ids].detach() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        z = (rep @ w["router.weight"].T + w["router.bias"]) / temperature
        gates = torch.softmax(z, dim=-1)
    else:
        with torch.no_grad():
            hb = forward(w, ids, False, want_hidden=True)
        z = (hb @ w["router.weight"].T + w["router.bias"]) / temperature
        gates = torch.softmax(z, dim=-1)

    def lin(x, l, p):
        y = x @ w[pname(l, p) + ".weight"].T
        if adapters:
            A = w[pname(l, p) + ".lora_A.weight"]
            Bm = w[pname(l, p) + ".lora_B.weight"]
            for k in range(E):
                Ak = A[k * r_e:(k + 1) * r_e]
                Bk = Bm[:, k * r_e:(k + 1) * r_e]
                gk = gates[:, k, None, None] if gates.dim() == 2 else gates[:, :, k, None]
                y = y + scale * gk * ((x @ Ak.T) @ Bk.T)
        return y

    pad_bias = (ids == 0).float()[:, None, None, :] * -1e9
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    h = emb[ids]
    for l in range(LAYERS):
        x = rms_norm(h, w[f"model.layers.{l}.input_layernorm.weight"])
        q = lin(x, l, "q_proj").view(B, L, HEADS, Dh).transpose(1, 2)
        k = lin(x, l, "k_proj").view(B, L, HEADS, Dh).transpose(1, 2)
        v = lin(x, l, "v_proj").view(B, L, HEADS, Dh).transpose(1, 2)
        q, k = rope(q), rope(k)
        s = (q @ k.transpose(-1, -2) + pad_bias) / math.sqrt(Dh)
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, L, D)
        h = h + lin(a, l, "o_proj")
        x = rms_norm(h, w[f"model.layers.{l}.post_attention_layernorm.weight"])
        h = h + lin(torch.nn.functional.silu(lin(x, l, "gate_proj")) * lin(x, l, "up_proj"), l,
                    "down_proj")
    h = rms_norm(h, w["model.norm.weight"])
    if want_hidden:
        return h
    if router == "last_hidden" and gates is not None:
        return h @ emb.T, gates, z
    return h @ emb.T, gates


def ce(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             labels.reshape(-1).long(), ignore_index=0)


def model_meta(**extra):
    """the fixture's metadata: the model options, the generator, torch's version"""
    meta = {"num_items": NUM_ITEMS, "dim": DIM, "layers": LAYERS, "heads": HEADS, "ffn_dim": FFN,
            "num_experts": E, "lora_rank": RANK, "lora_alpha": ALPHA, "norm_eps": EPS,
            "rope_theta": THETA, **extra}
    meta = {k: str(v) for k, v in meta.items()}
    meta.update(generator="tools/gen_ilora_reference.py", torch=torch.__version__)
    return meta


def batch():
    """input ids [B, L] (0 = padding) and next-item labels (0 = none)"""
    ids = torch.tensor([[0, 0, 3, 7, 1, 12],
                        [5, 2, 9, 9, 11, 4],
                        [0, 0, 0, 0, 6, 8]], dtype=torch.int64)
    labels = torch.tensor([[0, 0, 7, 1, 12, 2],
                           [2, 9, 9, 11, 4, 10],
                           [0, 0, 0, 0, 8, 3]], dtype=torch.int64)
    return ids, labels


# the per-position router's reference (reference_router.safetensors)
ROUTER_T, AUX_COEF, ENT_COEF = 0.7, 0.3, 0.2


def router_reference(out):
    """Router over the backbone's hidden states per position, temperature, and
    the auxiliary losses over the labelled positions n (N of them):
      loss = CE + AUX_COEF * E * sum_k P_k^2 + ENT_COEF * mean_n H(g_n) / ln E,
      P_k = mean_n g_nk,  H(g) = -sum_k g_k log_softmax(z)_k."""
    g = torch.Generator().manual_seed(20261124)
    w = make_weights(g)
    w["router.weight"] = torch.randn(E, DIM, generator=g) * 0.8
    ids, labels = batch()
    names = [n for n in w if "lora_" in n or n.startswith("router.")]
    wa = {n: t.clone().requires_grad_(n in names) for n, t in w.items()}
    logits, gates, z = forward(wa, ids, True, "last_hidden", ROUTER_T)
    ce_loss = ce(logits, labels)
    keep = labels.reshape(-1) != 0
    gn, zn = gates.reshape(-1, E)[keep], z.reshape(-1, E)[keep]
    P = gn.mean(0)
    bal = E * (P * P).sum()
    ent = -(gn * torch.log_softmax(zn, -1)).sum(-1).mean() / math.log(E)
    loss = ce_loss + AUX_COEF * bal + ENT_COEF * ent
    loss.backward()
    t = {n: v.contiguous() for n, v in w.items()}
    t["input_ids"] = ids.to(torch.int32)
    t["labels"] = labels.to(torch.int32)
    t["expected.logits"] = logits.detach()
    t["expected.gates"] = gates.detach()
    t["expected.loss"] = loss.detach().reshape(1)
    t["expected.ce"] = ce_loss.detach().reshape(1)
    for n in names:
        t["expected.grad." + n] = wa[n].grad.contiguous()
    save_file(t, out, metadata=model_meta(router_input="last_hidden", router_temperature=ROUTER_T,
                                          router_aux_loss_coef=AUX_COEF,
                                          router_entropy_coef=ENT_COEF))
    print(f"{out}: {len(t)} tensors, loss {loss.item():.6f} (CE {ce_loss.item():.6f}, "
          f"balance {bal.item():.6f}, entropy {ent.item():.6f})")


def main():
    if sys.argv[1:2] == ["--router"]:
        return router_reference(sys.argv[2] if len(sys.argv) > 2
                                else "tests/data/ilora/reference_router.safetensors")
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/ilora/reference.safetensors"
    g = torch.Generator().manual_seed(20240817)
    w = make_weights(g)
    ids, labels = batch()
    adapter_names = [n for n in w if "lora_" in n or n.startswith("router.")]
    base_names = [n for n in w if n not in adapter_names]

    wa = {n: t.clone().requires_grad_(n in adapter_names) for n, t in w.items()}
    logits, gates = forward(wa, ids, True)
    loss = ce(logits, labels)
    loss.backward()

    wb = {n: t.clone().requires_grad_(n in base_names) for n, t in w.items()}
    logits_b, _ = forward(wb, ids, False)
    loss_b = ce(logits_b, labels)
    loss_b.backward()

    t = {n: v.contiguous() for n, v in w.items()}
    t["input_ids"] = ids.to(torch.int32)
    t["labels"] = labels.to(torch.int32)
    t["expected.logits"] = logits.detach()
    t["expected.logits_base"] = logits_b.detach()
    t["expected.gates"] = gates.detach()
    t["expected.loss"] = loss.detach().reshape(1)
    t["expected.base_loss"] = loss_b.detach().reshape(1)
    for n in adapter_names:
        t["expected.grad." + n] = wa[n].grad.contiguous()
    for n in base_names:
        t["expected.base_grad." + n] = wb[n].grad.contiguous()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    save_file(t, out, metadata=model_meta())
    print(f"{out}: {len(t)} tensors, loss {loss.item():.6f}, base loss {loss_b.item():.6f}")


if __name__ == "__main__":
    main()
