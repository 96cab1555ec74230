"""iLoRA teacher training step: samples/s of `pipeline run configs/teacher.ini`
vs the same model in PyTorch (Llama-style decoder: RMSNorm, RoPE, causal
attention, SwiGLU, tied head; MoE-LoRA adapters gated per sample by a router
over the mean item embedding; frozen base), on the same MovieLens training
rows, batch size and full-softmax cross-entropy. Shapes come from the INI.

usage: python3 bench/teacher/bench_teacher.py [--batches 60] [--config configs/teacher.ini]
                                             [--device cpu|cuda] [--compile]
(--compile: PyTorch also under torch.compile(mode="reduce-overhead"), the
model's forward and the loss compiled, 5 warm-up steps excluded as in eager)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402


def torch_samples_per_s(h5, cfg, batches, device="cpu", modes=("eager",)):
    import h5py
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    m, d = cfg["model"], cfg["data"]
    dim, layers, heads = int(m.get("dim", 64)), int(m.get("layers", 2)), int(m.get("heads", 2))
    L = int(m.get("max_len", 50))
    ffn = int(m.get("ffn_dim", 0)) or int(((8 * dim // 3) + 63) // 64 * 64)
    adapters = m.get("adapters", "none")
    E = int(m.get("num_experts", 4)) if adapters == "moe_lora" else 1
    rank = int(m.get("lora_rank", 8))
    re_ = max(1, rank // E)
    alpha = float(m.get("lora_alpha", 32))
    p_drop, lora_p = float(m.get("dropout", 0.1)), float(m.get("lora_dropout", 0.1))
    bs = int(d.get("batch_size", 16))
    with h5py.File(h5) as f:
        ids = torch.tensor(f["/train/input_ids"][:]).long().to(device)
        labels = torch.tensor(f["/train/labels"][:]).long().to(device)
        V = int(f.attrs["num_items"]) + 1

    class Proj(nn.Module):
        def __init__(self, i, o):
            super().__init__()
            self.w = nn.Linear(i, o, bias=False)
            self.w.weight.requires_grad_(False)
            self.a = nn.Parameter(torch.randn(E * re_, i) * 0.01) if adapters != "none" else None
            self.b = nn.Parameter(torch.zeros(o, E * re_)) if adapters != "none" else None

        def forward(self, x, gate):
            y = self.w(x)
            if self.a is None:
                return y
            xa = F.dropout(x, lora_p, self.training) @ self.a.t()          # [B, T, E*r]
            xa = xa * gate.repeat_interleave(re_, dim=-1)[:, None, :]      # gate each expert
            return y + (alpha / re_) * (xa @ self.b.t())

    def rope(x):  # x [B, T, H, Dh], HF rotate_half
        dh = x.shape[-1]
        inv = 10000 ** (-torch.arange(0, dh, 2, device=x.device).float() / dh)
        ang = torch.arange(x.shape[1], device=x.device).float()[:, None] * inv[None]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None]
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)
            self.q, self.k, self.v, self.o = (Proj(dim, dim) for _ in range(4))
            self.g, self.u, self.dn = Proj(dim, ffn), Proj(dim, ffn), Proj(ffn, dim)
            for n in (self.n1, self.n2):
                n.weight.requires_grad_(False)

        def forward(self, x, gate):
            B, T, _ = x.shape
            h = self.n1(x)
            q = rope(self.q(h, gate).view(B, T, heads, -1))
            k = rope(self.k(h, gate).view(B, T, heads, -1))
            v = self.v(h, gate).view(B, T, heads, -1)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True,
                                               dropout_p=p_drop if self.training else 0)
            x = x + F.dropout(self.o(a.transpose(1, 2).reshape(B, T, dim), gate), p_drop,
                              self.training)
            h = self.n2(x)
            return x + F.dropout(self.dn(F.silu(self.g(h, gate)) * self.u(h, gate), gate),
                                 p_drop, self.training)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, dim)
            self.emb.weight.requires_grad_(False)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(dim, eps=1e-6)
            self.router = nn.Linear(dim, E) if adapters == "moe_lora" else None

        def forward(self, ids):
            x = self.emb(ids)
            mask = (ids > 0).float()[..., None]
            rep = (x * mask).sum(1) / mask.sum(1).clamp(min=1)
            gate = (F.softmax(self.router(rep), -1) if self.router is not None
                    else torch.ones(ids.shape[0], 1, device=ids.device))
            x = F.dropout(x, p_drop, self.training)
            for b in self.blocks:
                x = b(x, gate)
            return self.norm(x) @ self.emb.weight.t()

    def run(mode):
        torch.manual_seed(0)
        model = Model().to(device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        model.train()
        n = ids.shape[0]

        def loss_of(x, y):
            logits = model(x)
            return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1), ignore_index=0)

        loss_fn = common.compiled(loss_of, mode)

        def step(i):
            common.step_begin(mode)
            s = (i * bs) % (n - bs)
            loss = loss_fn(ids[s:s + bs], labels[s:s + bs])
            opt.zero_grad()
            loss.backward()
            opt.step()

        common.sync(device)
        t0 = time.perf_counter()
        for i in range(5):  # warm-up (compilation and CUDA graph recording in compile mode)
            step(i)
        common.sync(device)
        warm = time.perf_counter() - t0
        timer = common.StepTimer(device)
        t0 = time.perf_counter()
        for i in range(batches):
            with timer:
                step(i)
        common.sync(device)
        return {"throughput": batches * bs / (time.perf_counter() - t0), "steps": timer.seconds,
                "warmup_s": warm}

    return common.torch_sides(modes, device, run)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--config", default="configs/teacher.ini")
    ap.add_argument("--data", default=os.path.join(common.ROOT, "data/movielens.h5"))
    common.add_device_arg(ap)
    a = ap.parse_args()
    cfg = common.read_ini(a.config)
    print(common.environment(a.device))
    s = common.run_pipeline(a.config, ["pipeline.requires=", "trainer.init_from=",
                                       "trainer.max_epochs=1",
                                       f"trainer.limit_train_batches={a.batches}",
                                       "trainer.limit_val_batches=1", f"data.path={a.data}"]
                            + common.device_overrides(a.device), "teacher")
    # after 5 warm-up steps, synchronized, as the PyTorch side is timed
    # (summary.json steady_samples_per_second; the whole fit's figure counts
    # the warm-up and, on cuda, the graph's capture)
    ours = s.get("steady_samples_per_second") or s["train_samples_per_second"]
    sides = torch_samples_per_s(a.data, cfg, a.batches, a.device, common.torch_modes(a))
    common.report(f"iLoRA teacher train ({a.config}, {a.device})", "samples/s", ours,
                  extra=f"| peak memory {s['phases']['fit']['peak_memory_bytes'] / 2**20:.1f} MiB",
                  ours_steps=s["_step_seconds"], ours_rss=s["peak_rss_bytes"],
                  theirs_rss=common.peak_rss_bytes(), sides=sides, ours_peak=s["peak_memory_bytes"])


if __name__ == "__main__":
    main()
