#!/usr/bin/env python3
"""Teacher at scale, PyTorch + PEFT side: seconds per training step of the iLoRA
teacher's "item mode" step on a Hugging Face Llama backbone.

usage: python3 bench/teacher/scale_torch.py --backbone DIR
           [--precision fp32|bf16|bf16-true|qlora4] [--gradient-checkpointing]
           [--steps 5] [--batch 16] [--seq 50] [--num-items 3706] [--item-dim 64]
           [--threads N] [--seed 0] [--device cpu|cuda]

--device cuda: the model, batch and step on the GPU; the JSON then also has
peak_memory_allocated_bytes / peak_memory_reserved_bytes
(torch.cuda.max_memory_allocated / max_memory_reserved over the run, reset
after loading) beside the step times; qlora4 there also runs PEFT's
prepare_model_for_kbit_training (which turns on gradient checkpointing, as the
reports' QLoRA runs had it). A DIR with config.json only (bench/teacher/scale.sh
writes such directories for 135m / 1b / 7b) is built with from_config
(random init) in fp32 / bf16 / bf16-true; qlora4 needs a weights file.

DIR is a checkpoint directory (config.json + safetensors) such as
tools/make_hf_llama.py writes (random weights; a real pretrained one loads the
same way). The step is the one the C teacher runs in item mode:

  ids [batch, seq] random in [1, num_items]
  x = item_table[ids] @ W_in^T + b_in          item_table [num_items+1, item_dim] frozen random,
                                               W_in [hidden, item_dim] + bias trainable
  h = LlamaModel(inputs_embeds=x)              frozen body from DIR (no LM head: the token
                                               vocabulary is unused), attention_mask all ones,
                                               PEFT LoRA r=8, alpha=32, dropout 0.1 on
                                               q,k,v,o,gate,up,down_proj (train mode)
  logits = (h @ W_out^T) @ item_table^T        W_out [item_dim, hidden] trainable, no bias
  loss = CE(logits, labels) over every position, labels random in [1, num_items]
  AdamW(lr 1e-3) over W_in, b_in, W_out and the LoRA A/B.

PEFT has no mixture-of-LoRA-experts (the C teacher's moe_lora with a router): this
is plain LoRA, the same adapter FLOPs as one expert of rank 8.

Precisions:
  fp32       weights and math in f32 (a bf16 file is upcast at load)
  bf16       f32 weights, forward under torch.autocast("cpu", dtype=torch.bfloat16)
  bf16-true  frozen body stored and run in bf16 (LoRA, projections, loss in f32;
             PEFT keeps adapter weights in f32)
  qlora4     body linears stored in NF4 by bitsandbytes (BitsAndBytesConfig load_in_4bit,
             nf4, compute dtype bf16), LoRA on top (QLoRA). The bitsandbytes wheel ships
             a CPU library (libbitsandbytes_cpu.so) and NF4 quantize/matmul run on CPU:
             checked with bitsandbytes 0.50.2 (`pip install bitsandbytes`, a plain
             wheel; its deps are torch, numpy, packaging). Refused with the reason
             when bitsandbytes is missing or its CPU NF4 round trip fails. frozen bytes
             then count the packed 4-bit weights (uint8, 2 values a byte), not the
             per-block absmax scales.
On a CPU without avx512_bf16/AMX (e.g. the 2-core AMD EPYC this was written on),
bf16 matmuls are emulated: bf16 and bf16-true are several times slower than fp32
there (tiny: fp32 0.04 s, bf16 0.40 s, bf16-true 0.18 s per step; 135m bf16 did
not finish 4 steps in 6.5 min, i.e. > 90 s/step against fp32's 4.0 s).
--gradient-checkpointing: transformers' activation checkpointing of every decoder
layer (use_reentrant False).

Prints one JSON line and one human line: load seconds, peak RSS of the process
(ru_maxrss * 1024), frozen bytes (numel * element_size of every frozen parameter,
body and item table, also the body alone; the body's token embedding is loaded,
then dropped since inputs_embeds replace it, and is not counted: its size is
reported), trainable parameters, median / min / max seconds per step over --steps timed steps after 1 warmup step, torch and
transformers/peft versions, torch.get_num_threads(), OPENBLAS_CORETYPE.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def bnb_cpu_4bit():
    """None when bitsandbytes can do NF4 on CPU here, else the reason it cannot."""
    try:
        import bitsandbytes as bnb  # noqa: F401
        import torch
        from bitsandbytes.functional import quantize_4bit, dequantize_4bit
        w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
        q, st = quantize_4bit(w, quant_type="nf4")
        back = dequantize_4bit(q, st)
        if (back - w).abs().mean().item() > 0.2:   # NF4 of N(0,1): mean error about 0.07
            return "bitsandbytes NF4 round trip on CPU is wrong"
        return None
    except Exception as e:  # ImportError, or no CPU kernel
        return f"bitsandbytes: {type(e).__name__}: {e}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--precision", choices=["fp32", "bf16", "bf16-true", "qlora4"], default="fp32")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=50)
    ap.add_argument("--num-items", type=int, default=3706)
    ap.add_argument("--item-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args(argv)

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import transformers
    import peft
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaModel

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.precision == "qlora4":
        why = bnb_cpu_4bit()
        if why:
            print(f"--precision qlora4 unavailable: {why}", file=sys.stderr)
            return 2
    torch.manual_seed(a.seed)

    t0 = time.perf_counter()
    kw = {"dtype": torch.bfloat16 if a.precision == "bf16-true" else torch.float32}
    if a.precision == "qlora4":
        from transformers import BitsAndBytesConfig
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    dev = torch.device(a.device)
    if os.path.exists(os.path.join(a.backbone, "config.json")) and not any(
            f.endswith(".safetensors") for f in os.listdir(a.backbone)):
        if a.precision == "qlora4":
            print("--precision qlora4 needs a weights file (config.json only here)", file=sys.stderr)
            return 2
        from transformers import LlamaConfig
        cfg = LlamaConfig.from_pretrained(a.backbone)
        torch.set_default_dtype(kw["dtype"])
        with torch.device(dev):
            body = LlamaModel(cfg)                     # transformers' random init (from_config)
        torch.set_default_dtype(torch.float32)
        body.to(kw["dtype"])
    else:
        if a.device == "cuda" and a.precision != "qlora4":
            kw["device_map"] = {"": 0}
        body = LlamaModel.from_pretrained(a.backbone, **kw)   # checkpoint's lm_head is not loaded
        if a.device == "cuda" and a.precision == "qlora4":
            from peft import prepare_model_for_kbit_training
            body = prepare_model_for_kbit_training(body)
    body.config.use_cache = False
    # inputs_embeds replace the token embedding: drop it (counted in the load's peak RSS only)
    tok_emb_bytes = sum(p.numel() * p.element_size() for p in body.embed_tokens.parameters())
    body.embed_tokens = None
    if a.gradient_checkpointing:
        ck = {"use_reentrant": False}
        if hasattr(body, "activation_checkpointing_enable"):
            body.activation_checkpointing_enable(activation_checkpointing_kwargs=ck)
        else:
            body.gradient_checkpointing_enable(gradient_checkpointing_kwargs=ck)
    for p in body.parameters():
        p.requires_grad_(False)
    body = get_peft_model(body, LoraConfig(r=8, lora_alpha=32, lora_dropout=0.1,
                                           target_modules=TARGETS, bias="none"))
    load_s = time.perf_counter() - t0
    hidden = body.config.hidden_size
    body_dtype = next(p.dtype for n, p in body.named_parameters() if "lora_" not in n)

    V, Dm = a.num_items + 1, a.item_dim
    item_table = nn.Parameter((torch.randn(V, Dm) * 0.1).to(dev), requires_grad=False)
    proj_in = nn.Linear(Dm, hidden, bias=True).to(dev)
    proj_out = nn.Linear(hidden, Dm, bias=False).to(dev)
    body.to(dev) if a.precision != "qlora4" else None
    body.train()
    trainable = [p for p in body.parameters() if p.requires_grad]
    trainable += list(proj_in.parameters()) + list(proj_out.parameters())
    opt = torch.optim.AdamW(trainable, lr=1e-3)
    n_trainable = sum(p.numel() for p in trainable)
    frozen_body = sum(p.numel() * p.element_size() for p in body.parameters() if not p.requires_grad)
    frozen = frozen_body + item_table.numel() * item_table.element_size()

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(1, a.num_items + 1, (a.batch, a.seq), generator=g)
    labels = torch.randint(1, a.num_items + 1, (a.batch, a.seq), generator=g)
    mask = torch.ones(a.batch, a.seq, dtype=torch.long)
    ids, labels, mask = ids.to(dev), labels.to(dev), mask.to(dev)
    if a.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            x = proj_in(item_table[ids])
            h = body(inputs_embeds=x.to(body_dtype) if a.precision == "bf16-true" else x,
                     attention_mask=mask).last_hidden_state
            logits = proj_out(h.float() if a.precision == "bf16-true" else h) @ item_table.t()
        loss = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    loss0 = step()                          # warmup (not timed)
    times, losses = [], []
    for _ in range(a.steps):
        t = time.perf_counter()
        losses.append(step())
        if a.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res = {
        "backbone": os.path.abspath(a.backbone), "precision": a.precision,
        "gradient_checkpointing": a.gradient_checkpointing,
        "batch": a.batch, "seq": a.seq, "num_items": a.num_items, "item_dim": a.item_dim,
        "hidden": hidden, "layers": body.config.num_hidden_layers,
        "load_s": round(load_s, 3), "peak_rss_bytes": rss,
        "frozen_bytes": frozen, "frozen_body_bytes": frozen_body,
        "dropped_token_embedding_bytes": tok_emb_bytes,
        "trainable_params": n_trainable, "steps": a.steps,
        "step_s_median": statistics.median(times), "step_s_min": min(times),
        "step_s_max": max(times), "loss_first": loss0, "loss_last": losses[-1] if losses else loss0,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": peft.__version__, "threads": torch.get_num_threads(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", ""),
        "adapters": "PEFT LoRA r=8 alpha=32 dropout=0.1 (no mixture-of-LoRA-experts in PEFT)",
        "device": a.device,
    }
    if a.device == "cuda":
        res["peak_memory_allocated_bytes"] = torch.cuda.max_memory_allocated()
        res["peak_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
        res["gpu"] = torch.cuda.get_device_name(0)
    print(json.dumps(res))
    print(f"{os.path.basename(os.path.normpath(a.backbone))} {a.precision}"
          f"{' +ckpt' if a.gradient_checkpointing else ''}: step median {res['step_s_median']:.3f} s "
          f"(min {res['step_s_min']:.3f}, max {res['step_s_max']:.3f}, {a.steps} steps), load "
          f"{load_s:.2f} s, peak RSS {rss / 2**20:.0f} MiB, frozen {frozen / 2**20:.1f} MiB, "
          f"trainable {n_trainable:,}, torch {torch.__version__}, {res['threads']} threads, "
          f"loss {loss0:.3f} -> {res['loss_last']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
