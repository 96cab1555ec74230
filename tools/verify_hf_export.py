#!/usr/bin/env python3
"""verify_hf_export.py - load a `pipeline export --format hf` directory of the
ilora model with transformers + PEFT and compare its logits with the ones the
pipeline computed for the same rows.

usage: verify_hf_export.py DATA_H5 --case NAME EXPORT_DIR TEACHER_OUTPUTS_H5 [--case ...]
                           [--tol 1e-4]

The pipeline's logits come from the run's own teacher export
(outputs/teacher_outputs.h5, written by `[trainer] export = true` with the
weights `pipeline export` also defaults to, the best checkpoint) with
export_top_k = num_items, so every item's logit is there: for every labelled
(non-padding) position of every training row, and for the last position of
every val / test row (their input rows are read from DATA_H5 by the exported
user index). Items 1..num_items are compared (item 0, the padding, is never
exported).

What is loaded, by what the directory holds (plugins/models/ilora/README.md,
"Export to Hugging Face"):
  config.json      LlamaForCausalLM.from_pretrained(EXPORT_DIR), float32, eager
                   attention; otherwise the base named by the adapter's
                   base_model_name_or_path
  adapter/         PeftModel.from_pretrained(base, EXPORT_DIR/adapter)
  expert_*/        every expert loaded as a named adapter; for each input row
                   the gates g = softmax(router.weight @ u + router.bias),
                   u = mean of the embedding rows of its non-padding ids
                   (router.json), then add_weighted_adapter(experts, g,
                   combination_type="cat") and set_adapter, row by row
  item_head.safetensors  inputs_embeds = item_proj(item_embeddings[ids]);
                   logits = score_proj(last_hidden_state) @ item_embeddings.T
Rows are left-padded (attention_mask = ids != pad_id), positions 0..L-1.

Prints the largest absolute difference per case and split, and how far the
adapters move the logits (the base model alone against base + adapters: a
parity test of adapters that do nothing would prove nothing, so an export
with adapters whose effect is not above 10 x --tol fails); exit 0 when every
difference is <= --tol, 1 otherwise, 77 when torch / transformers / peft are missing
(ctest's skip code), except under CI=true, where that is a failure (CI
installs them).
"""
import argparse
import json
import os
import sys


def need_packages():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import peft  # noqa: F401
        import h5py  # noqa: F401
        import safetensors  # noqa: F401
    except ImportError as e:
        msg = f"verify_hf_export: {e.name} is not installed (pip install torch transformers peft)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            print(msg + "; CI=true: failing", file=sys.stderr)
            sys.exit(1)
        print("SKIP: " + msg, file=sys.stderr)
        sys.exit(77)


def verify(name, d, teacher_outputs, data_path, tol):
    """max |logit diff| of one export against its run's teacher outputs"""
    import h5py
    import numpy as np
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    has = lambda p: os.path.exists(os.path.join(d, p))  # noqa: E731
    experts = sorted((e for e in os.listdir(d) if e.startswith("expert_")),
                     key=lambda s: int(s.split("_")[1]))
    adapter_dirs = ["adapter"] if has("adapter") else experts
    if has("config.json"):
        base_path = d
    else:
        with open(os.path.join(d, adapter_dirs[0], "adapter_config.json")) as f:
            base_path = json.load(f)["base_model_name_or_path"]
    base = LlamaForCausalLM.from_pretrained(base_path, dtype=torch.float32,
                                            attn_implementation="eager")
    base.eval()
    pad_id = base.config.pad_token_id
    item_head = load_file(os.path.join(d, "item_head.safetensors")) if has("item_head.safetensors") else None
    if item_head is not None:
        pad_id = 0
    # the router's input: the embedding of the model's inputs (before PEFT wraps it)
    embedding = (item_head["item_embeddings.weight"] if item_head is not None
                 else base.get_input_embeddings().weight.detach().clone())
    model = base
    if adapter_dirs:
        model = PeftModel.from_pretrained(base, os.path.join(d, adapter_dirs[0]),
                                          adapter_name=adapter_dirs[0])
        for e in adapter_dirs[1:]:
            model.load_adapter(os.path.join(d, e), adapter_name=e)
        model.eval()
    router = None
    if experts:
        router = load_file(os.path.join(d, "router.safetensors"))
        with open(os.path.join(d, "router.json")) as f:
            rj = json.load(f)
        assert rj["experts"] == experts, (rj["experts"], experts)
        pad_id = rj["pad_id"]
        temperature = rj.get("temperature", 1.0)

    def gates(ids):
        """softmax((router.weight @ mean(embedding[ids != pad]) + router.bias) / T), one row"""
        keep = ids != pad_id
        u = embedding[ids[keep]].mean(0) if keep.any() else torch.zeros(embedding.shape[1])
        return torch.softmax((router["router.weight"] @ u + router["router.bias"]) / temperature, -1)

    def logits_of(rows):
        """logits [N, L, V] of the left-padded id rows [N, L] (int64)"""
        mask = (rows != pad_id).long() if pad_id is not None and pad_id >= 0 else torch.ones_like(rows)
        with torch.no_grad():
            if item_head is None:
                return model(input_ids=rows, attention_mask=mask).logits.float()
            emb = item_head["item_embeddings.weight"]
            x = torch.nn.functional.linear(emb[rows], item_head["item_proj.weight"],
                                           item_head["item_proj.bias"])
            body = model.get_base_model().model if adapter_dirs else model.model
            h = body(inputs_embeds=x, attention_mask=mask).last_hidden_state
            return (h @ item_head["score_proj.weight"].T) @ emb.T

    def all_logits(rows):
        if router is None:
            return logits_of(rows)
        out = []
        for i in range(rows.shape[0]):  # one weighted adapter per user (input row)
            g = gates(rows[i]).tolist()
            model.add_weighted_adapter(experts, g, "user", combination_type="cat")
            model.set_adapter("user")
            out.append(logits_of(rows[i:i + 1]))
            model.set_adapter(experts[0])
            model.delete_adapter("user")
        return torch.cat(out)

    worst, effect = 0.0, None
    with h5py.File(teacher_outputs, "r") as t, h5py.File(data_path, "r") as data:
        num_items = int(t.attrs["num_items"])
        assert t.attrs["top_k"] == num_items, "the run must export every item (export_top_k = num_items)"
        for split in ("train", "val", "test"):
            ids = t[f"{split}/topk_ids"][:].astype(np.int64)
            ours = t[f"{split}/topk_logits"][:].astype(np.float64) * float(t.attrs["temperature"])
            if split == "train":
                rows = torch.from_numpy(t["train/input_ids"][:].astype(np.int64))
                row, pos = t["train/row"][:], t["train/pos"][:]
            else:
                users = t[f"{split}/user"][:]
                rows = torch.from_numpy(data[f"{split}/input_ids"][:][users].astype(np.int64))
                row, pos = np.arange(len(users)), np.full(len(users), rows.shape[1] - 1)
            lg = all_logits(rows).double().numpy()
            theirs = np.take_along_axis(lg[row, pos], ids, axis=1)
            diff = float(np.abs(theirs - ours).max())
            print(f"{name} {split}: {len(row)} positions x {ids.shape[1]} items, "
                  f"max |logit diff| = {diff:.3g} (max |logit| {np.abs(ours).max():.3g})")
            worst = max(worst, diff)
            if split == "train" and adapter_dirs:
                with model.disable_adapter():
                    plain = logits_of(rows).double().numpy()
                effect = float(np.abs(np.take_along_axis(plain[row, pos], ids, axis=1) - ours).max())
    ok = worst <= tol
    msg = f"{name}: max |logit diff| = {worst:.3g} ({'<=' if ok else '>'} {tol:g})"
    if effect is not None:
        msg += f"; the adapters move the logits by up to {effect:.3g}"
        if effect <= 10 * tol:
            ok = False
            msg += " (not above 10 x tol: the adapters do nothing, the parity proves nothing)"
    print(msg + (": ok" if ok else ": FAIL"))
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data")
    ap.add_argument("--case", nargs=3, action="append", required=True,
                    metavar=("NAME", "EXPORT_DIR", "TEACHER_OUTPUTS_H5"))
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args(argv)
    need_packages()

    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    ok = True
    for name, d, outputs in a.case:
        ok = verify(name, d, outputs, a.data, a.tol) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
