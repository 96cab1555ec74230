#!/usr/bin/env python3
"""Reference for the ilora model's knowledge-distillation term
(plugins/models/ilora/distill.c): tests/data/ilora/kd_reference.safetensors.

An independent PyTorch computation: a full teacher logit matrix is softened
at temperature T over items 1..V-1 (item 0 = padding), its top-K items are
kept with their logits / T and the log-normalizer over every item (what the
teacher export writes); the student's softened distribution is compared
over those K items plus one bucket for the rest of the mass with
torch.nn.functional.kl_div (reduction 'sum', divided by the positions),
times kd_weight * T^2. The gradient of that value with respect to the
student logits comes from autograd.

    python3 tools/gen_kd_reference.py   (deterministic; rewrites the file)
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

NP, V, K, T, W = 6, 14, 4, 2.0, 0.7


def main():
    g = torch.Generator().manual_seed(19)
    teacher = torch.randn(NP, V, generator=g, dtype=torch.float64) * 3.0
    student = (torch.randn(NP, V, generator=g, dtype=torch.float64) * 2.0).requires_grad_()
    soft_t = teacher[:, 1:] / T
    lognorm = torch.logsumexp(soft_t, dim=1)
    top, idx = torch.topk(soft_t, K, dim=1)  # best first
    ids = idx + 1  # item ids (column 0 of the logits is the padding item)
    q_k = torch.exp(top - lognorm[:, None])
    q = torch.cat([q_k, (1 - q_k.sum(1, keepdim=True)).clamp_min(0)], dim=1)
    logp = F.log_softmax(student[:, 1:] / T, dim=1)
    lp_k = torch.gather(logp, 1, idx)
    p_rest = 1 - lp_k.exp().sum(1, keepdim=True)
    logp_b = torch.cat([lp_k, torch.log(p_rest)], dim=1)
    kl = F.kl_div(logp_b, q, reduction="sum") / NP
    loss = W * T * T * kl
    loss.backward()
    out = {
        "student_logits": student.detach().float(),
        "teacher_ids": ids.to(torch.int32),
        "teacher_topk_logits": top.float(),
        "teacher_lognorm": lognorm.float(),
        "teacher_rest_mass": q[:, K].float(),
        "loss": loss.detach().float().reshape(1),
        "grad_student_logits": student.grad.float(),
    }
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "ilora",
                        "kd_reference.safetensors")
    save_file({k: v.contiguous() for k, v in out.items()}, path,
              metadata={"T": str(T), "kd_weight": str(W), "K": str(K)})
    print(f"wrote {path}: loss {loss.item():.6f}, rest mass {q[:, K].tolist()}")


if __name__ == "__main__":
    main()
