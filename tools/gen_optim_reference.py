#!/usr/bin/env python3
"""Reference sequences for the optimizer, averager and scheduler plugins.

Writes tests/data/optim/*.json, computed with PyTorch (pip torch) on CPU:

  adamw.json     torch.optim.AdamW / torch.optim.Adam (l2), amsgrad, two
                 parameter groups with lr_scale, a step without a gradient,
                 steps skipped by GradScaler's found_inf (adamw_found_inf)
  sgd.json       torch.optim.SGD: momentum, dampening, nesterov, weight decay,
                 a skipped first step (sgd_first_step_skipped)

A case with "found_inf" (0-based step numbers) skips those steps as
torch.cuda.amp.GradScaler does for a non-fused optimizer: the gradients are
set, optimizer.step() is not called. For AdamW the same run is repeated with
fused=True and the found_inf tensor set on every step (1 at the skipped
ones), the path whose step counting the C kernels follow (state_steps += 1,
then -= found_inf); its step counts must equal the non-fused run's, and are
written as "steps_after" (each parameter's state["step"] after the run).
  onecycle.json  torch.optim.lr_scheduler.OneCycleLR lr and beta1 per step
  plateau.json   torch.optim.lr_scheduler.ReduceLROnPlateau lr per metric
  cosine.json    SequentialLR(LinearLR, CosineAnnealingLR) and LinearLR alone
  swa.json       torch.optim.swa_utils.AveragedModel + SWALR epoch loop

Every case carries the plugin options (INI strings) that should reproduce it,
so the C tests build the plugin from the same values. Floats are written
with repr() (exact round trip); f32 tensors as the exact doubles of their
f32 values.

Usage: python3 tools/gen_optim_reference.py [--out tests/data/optim] [--only NAME,...]
"""
import argparse
import json
import math
import os

import torch
from torch.optim import SGD, Adam, AdamW
from torch.optim.lr_scheduler import (CosineAnnealingLR, LinearLR, OneCycleLR,
                                      ReduceLROnPlateau, SequentialLR)
from torch.optim.swa_utils import SWALR, AveragedModel

torch.set_num_threads(1)


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def make_params(gen, specs):
    """specs: list of (name, shape). Returns list of leaf f32 tensors."""
    out = []
    for _, shape in specs:
        out.append(torch.randn(*shape, generator=gen, dtype=torch.float32).requires_grad_(True))
    return out


def run_optimizer(kind, case, seed):
    """Run `steps` optimizer steps with random f32 gradients. case:
    params [(name, shape, group)], groups {group: {lr_scale, weight_decay}},
    hyper (torch kwargs besides lr/weight_decay), lr, weight_decay,
    skip: list of (step, param index) with no gradient."""
    gen = torch.Generator().manual_seed(seed)
    specs = [(n, s) for n, s, _ in case["params"]]
    params = make_params(gen, specs)
    init = [flat(p) for p in params]
    groups = []
    for gname in case["group_order"]:
        g = case["groups"].get(gname, {})
        members = [p for p, (_, _, pg) in zip(params, case["params"]) if pg == gname]
        if not members:
            continue
        d = {"params": members, "lr": case["lr"] * g.get("lr_scale", 1.0)}
        if "weight_decay" in g:
            d["weight_decay"] = g["weight_decay"]
        groups.append(d)
    kw = dict(case["hyper"])
    kw["lr"] = case["lr"]
    kw["weight_decay"] = case["weight_decay"]
    kw["foreach"] = False  # the single-tensor (for-loop) path, as on CPU by default
    cls = {"adamw": AdamW, "adam": Adam, "sgd": SGD}[case["torch_class"]]
    opt = cls(groups, **kw)
    grads, expected = [], []
    skip = {tuple(x) for x in case.get("skip", [])}
    found_inf = set(case.get("found_inf", []))
    for step in range(case["steps"]):
        gstep = []
        for i, p in enumerate(params):
            if (step, i) in skip:
                p.grad = None
                gstep.append(None)
            else:
                g = torch.randn(p.shape, generator=gen, dtype=torch.float32)
                p.grad = g.clone()
                gstep.append(flat(g))
        if step not in found_inf:  # GradScaler: a found inf skips optimizer.step()
            opt.step()
        grads.append(gstep)
        expected.append([flat(p) for p in params])
    out = {
        "name": case["name"],
        "plugin": kind,
        "options": case["options"],
        "params": [{"name": n, "shape": list(s), "init": v} for (n, s, _), v in zip(case["params"], init)],
        "grads": grads,
        "expected": expected,
    }
    if found_inf:
        out["found_inf"] = sorted(found_inf)
    if found_inf and case["torch_class"] == "adamw":
        out["steps_after"] = fused_steps(case, init, grads, found_inf, opt, params)
    return out


def fused_steps(case, init, grads, found_inf, ref_opt, ref_params):
    """The run again with AdamW(fused=True), found_inf given on every step
    (torch/optim/adam.py _fused_adam: state_steps += 1, the kernel skips, then
    state_steps -= found_inf); returns each parameter's final state["step"],
    checked against the non-fused run's."""
    params = [torch.tensor(v, dtype=torch.float32).reshape(s).requires_grad_(True)
              for v, (_, s, _) in zip(init, case["params"])]
    kw = dict(case["hyper"], lr=case["lr"], weight_decay=case["weight_decay"], fused=True)
    opt = AdamW(params, **kw)
    for step, gstep in enumerate(grads):
        for p, g in zip(params, gstep):
            p.grad = None if g is None else torch.tensor(g, dtype=torch.float32).reshape(p.shape)
        opt.found_inf = torch.tensor(1.0 if step in found_inf else 0.0)
        opt.step()
    steps = [float(opt.state[p]["step"]) for p in params]
    ref = [float(ref_opt.state[p]["step"]) for p in ref_params]
    assert steps == ref, (steps, ref)
    assert steps[0] == len(grads) - len(found_inf), steps
    return steps


def adamw_cases():
    P = [("body.weight", (3, 4), "default"), ("body.bias", (4,), "no_decay"),
         ("head.weight", (2, 3), "head")]
    order = ["default", "no_decay", "head"]
    base = {
        "options": {"lr": "0.01", "weight_decay": "0.1"},
        "params": [(n, s, "default") for n, s, _ in P], "group_order": order, "groups": {},
        "lr": 0.01, "weight_decay": 0.1, "steps": 12,
    }
    cases = []
    c = dict(base, name="adamw_decoupled", torch_class="adamw",
             hyper={"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False})
    cases.append(c)
    c = dict(base, name="adamw_amsgrad", torch_class="adamw",
             options={"lr": "0.01", "weight_decay": "0.1", "amsgrad": "true", "beta1": "0.8",
                      "beta2": "0.99", "eps": "1e-6"},
             hyper={"betas": (0.8, 0.99), "eps": 1e-6, "amsgrad": True})
    cases.append(c)
    c = dict(base, name="adam_l2", torch_class="adam",
             options={"lr": "0.005", "weight_decay": "0.0005", "l2": "true"}, lr=0.005,
             weight_decay=5e-4, hyper={"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False})
    cases.append(c)
    c = dict(base, name="adamw_groups", torch_class="adamw", params=P,
             options={"lr": "0.02", "weight_decay": "0.05",
                      "group.no_decay.match": "*bias,*norm*",
                      "group.head.match": "head.*", "group.head.lr_scale": "0.5",
                      "group.head.weight_decay": "0.2"},
             lr=0.02, weight_decay=0.05,
             groups={"no_decay": {"weight_decay": 0.0},
                     "head": {"lr_scale": 0.5, "weight_decay": 0.2}},
             skip=[[3, 2], [4, 0]],
             hyper={"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False})
    cases.append(c)
    # GradScaler skips (found_inf) at steps 3 and 4 of 8: the later bias
    # corrections use the step count without them
    c = dict(base, name="adamw_found_inf", torch_class="adamw", steps=8, found_inf=[3, 4],
             hyper={"betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False})
    cases.append(c)
    return [run_optimizer("adamw", c, 1000 + i) for i, c in enumerate(cases)]


def sgd_cases():
    P = [("body.weight", (3, 4), "default"), ("body.bias", (4,), "no_decay"),
         ("head.weight", (2, 3), "head")]
    order = ["default", "no_decay", "head"]
    base = {"params": [(n, s, "default") for n, s, _ in P], "group_order": order, "groups": {},
            "steps": 10, "torch_class": "sgd"}
    cases = [
        dict(base, name="sgd_plain", options={"lr": "0.1"}, lr=0.1, weight_decay=0.0,
             hyper={"momentum": 0.0}),
        dict(base, name="sgd_momentum", options={"lr": "0.05", "momentum": "0.9",
                                                 "dampening": "0.1", "weight_decay": "0.01"},
             lr=0.05, weight_decay=0.01, hyper={"momentum": 0.9, "dampening": 0.1}),
        dict(base, name="sgd_nesterov", options={"lr": "0.05", "momentum": "0.8",
                                                 "nesterov": "true", "weight_decay": "0.001"},
             lr=0.05, weight_decay=0.001, hyper={"momentum": 0.8, "nesterov": True}),
        dict(base, name="sgd_groups", params=P,
             options={"lr": "0.1", "momentum": "0.9", "weight_decay": "0.01",
                      "group.no_decay.match": "*bias", "group.head.match": "head.*",
                      "group.head.lr_scale": "0.1"},
             lr=0.1, weight_decay=0.01,
             groups={"no_decay": {"weight_decay": 0.0}, "head": {"lr_scale": 0.1}},
             skip=[[2, 1]], hyper={"momentum": 0.9}),
        # a skipped first step leaves the momentum buffer uninitialised: the
        # next step sets it to the gradient (dampening makes the difference show)
        dict(base, name="sgd_first_step_skipped", steps=5, found_inf=[0],
             options={"lr": "0.05", "momentum": "0.9", "dampening": "0.5"},
             lr=0.05, weight_decay=0.0, hyper={"momentum": 0.9, "dampening": 0.5}),
    ]
    return [run_optimizer("sgd", c, 2000 + i) for i, c in enumerate(cases)]


def dummy_optimizer(lr, adam=True):
    p = torch.zeros(1, requires_grad=True)
    return Adam([p], lr=lr) if adam else SGD([p], lr=lr, momentum=0.9)


def onecycle_cases():
    cases = []
    base_lr = 0.01
    for i, (strategy, three, total, pct, cyc, extra) in enumerate([
            ("cos", False, 100, 0.3, True, {}),
            ("linear", False, 57, 0.25, True, {}),
            ("cos", True, 80, 0.3, True, {"div_factor": 10.0, "final_div_factor": 100.0}),
            ("linear", True, 33, 0.4, True, {"base_momentum": 0.8, "max_momentum": 0.9}),
            ("cos", False, 40, 0.3, False, {}),
    ]):
        max_lr = 0.1 if i % 2 == 0 else 0.05
        opt = dummy_optimizer(base_lr)
        kw = dict(max_lr=max_lr, total_steps=total, pct_start=pct, anneal_strategy=strategy,
                  three_phase=three, cycle_momentum=cyc, **extra)
        sch = OneCycleLR(opt, **kw)
        lrs, moms = [], []
        for _ in range(total):
            lrs.append(opt.param_groups[0]["lr"])
            moms.append(opt.param_groups[0]["betas"][0])
            opt.step()
            sch.step()
        options = {"max_lr": repr(max_lr), "total_steps": str(total), "pct_start": repr(pct),
                   "anneal_strategy": strategy, "three_phase": str(three).lower(),
                   "cycle_momentum": str(cyc).lower()}
        options.update({k: repr(v) for k, v in extra.items()})
        cases.append({"name": f"onecycle_{i}", "optimizer_lr": base_lr, "options": options,
                      "lr": lrs, "beta1": moms if cyc else None})
    return cases


def plateau_cases():
    gen = torch.Generator().manual_seed(3000)
    cases = []
    base_lr = 0.1
    configs = [
        ("min_rel", {"mode": "min", "patience": 2}),
        ("max_abs", {"mode": "max", "threshold_mode": "abs", "threshold": 0.05, "patience": 1,
                     "factor": 0.5}),
        ("min_cooldown_minlr", {"mode": "min", "patience": 1, "cooldown": 2, "factor": 0.3,
                                "min_lr": 0.002}),
        ("min_abs_eps", {"mode": "min", "threshold_mode": "abs", "threshold": 0.01,
                         "patience": 0, "factor": 0.5, "eps": 0.004}),
    ]
    for name, kw in configs:
        # a noisy loss that improves then plateaus (max mode: its negative)
        n = 40
        t = torch.arange(n, dtype=torch.float64)
        noise = torch.randn(n, generator=gen, dtype=torch.float64) * 0.02
        loss = (1.0 / (1.0 + 0.3 * t) + 0.3 + noise)
        metric = [float(x) for x in (-loss if kw["mode"] == "max" else loss)]
        opt = dummy_optimizer(base_lr)
        sch = ReduceLROnPlateau(opt, **kw)
        lrs = []
        for m in metric:
            sch.step(m)
            lrs.append(opt.param_groups[0]["lr"])
        cases.append({"name": "plateau_" + name, "optimizer_lr": base_lr,
                      "options": {k: (v if isinstance(v, str) else repr(v)) for k, v in kw.items()},
                      "metric": metric, "lr": lrs})
    return cases


def cosine_cases():
    cases = []
    base_lr = 0.02
    # (name, total, warmup, start_factor, eta_min)
    for name, total, warm, start, eta in [("cosine_warmup", 60, 10, 0.1, 0.0),
                                          ("cosine_warmup_eta", 45, 7, 0.25, 0.001),
                                          ("cosine_nowarmup", 30, 0, 1.0, 0.0005)]:
        opt = dummy_optimizer(base_lr)
        cos = CosineAnnealingLR(opt, T_max=total - warm, eta_min=eta)
        if warm > 0:
            lin = LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warm)
            sch = SequentialLR(opt, [lin, cos], milestones=[warm])
        else:
            sch = cos
        lrs = []
        for _ in range(total + 1):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        options = {"total_steps": str(total), "warmup_steps": str(warm),
                   "warmup_start_factor": repr(start), "eta_min": repr(eta)}
        cases.append({"name": name, "plugin": "cosine", "optimizer_lr": base_lr,
                      "options": options, "lr": lrs})
    # constant with warmup = LinearLR alone
    opt = dummy_optimizer(base_lr)
    sch = LinearLR(opt, start_factor=0.2, end_factor=1.0, total_iters=8)
    lrs = []
    for _ in range(15):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    cases.append({"name": "constant_warmup", "plugin": "constant", "optimizer_lr": base_lr,
                  "options": {"warmup_steps": "8", "warmup_start_factor": "0.2"}, "lr": lrs})
    return cases


def swa_cases():
    cases = []
    for i, (epochs, start, swa_lr, anneal_epochs, strategy) in enumerate([
            (12, 5, 0.005, 3, "cos"), (10, 3, 0.02, 4, "linear"), (8, 2, 0.01, 0, "cos")]):
        gen = torch.Generator().manual_seed(4000 + i)
        base_lr = 0.05
        model = torch.nn.Linear(3, 2)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        swa_model = AveragedModel(model)
        opt = SGD(model.parameters(), lr=base_lr)
        # main epoch-level scheduler, and a copy run without SWA for its values
        sched = CosineAnnealingLR(opt, T_max=epochs, eta_min=0.001)
        # SWALR is created when SWA starts: created at the beginning, with
        # anneal_epochs = 0 its constructor already sets lr = swa_lr (alpha
        # = 1 at step max(1, 0)), before the SWA phase; otherwise identical.
        swa_sched = None
        opt2 = SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
        sched2 = CosineAnnealingLR(opt2, T_max=epochs, eta_min=0.001)
        lrs, main_lrs, weights, averaged = [], [], [], []
        for epoch in range(epochs):
            lrs.append(opt.param_groups[0]["lr"])
            main_lrs.append(opt2.param_groups[0]["lr"])
            with torch.no_grad():  # "training": new weights for this epoch
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            weights.append([flat(p) for p in model.parameters()])
            opt.step()  # no gradients: leaves the weights, keeps the scheduler order canonical
            if epoch >= start:
                swa_model.update_parameters(model)
                if swa_sched is None:
                    swa_sched = SWALR(opt, swa_lr=swa_lr, anneal_epochs=anneal_epochs,
                                      anneal_strategy=strategy)
                swa_sched.step()
            else:
                sched.step()
            averaged.append([flat(p) for p in swa_model.module.parameters()]
                            if epoch >= start else None)
            opt2.step()
            sched2.step()
        names = ["lin.weight", "lin.bias"]
        cases.append({
            "name": f"swa_{i}", "optimizer_lr": base_lr, "epochs": epochs,
            "options": {"swa_start_epoch": str(start), "swa_lr": repr(swa_lr),
                        "annealing_epochs": str(anneal_epochs), "anneal_strategy": strategy},
            "params": [{"name": n, "shape": list(p.shape)} for n, p in zip(names, model.parameters())],
            "main_lr": main_lrs, "lr": lrs, "weights": weights, "averaged": averaged,
        })
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "optim"))
    ap.add_argument("--only", default="",
                    help="comma-separated case names: write only these into the existing files, "
                         "keeping the other cases as stored (torch's CPU kernels may round the "
                         "last bit differently on another machine)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    only = {n for n in a.only.split(",") if n}
    files = {
        "adamw.json": adamw_cases(), "sgd.json": sgd_cases(), "onecycle.json": onecycle_cases(),
        "plateau.json": plateau_cases(), "cosine.json": cosine_cases(), "swa.json": swa_cases(),
    }
    for fname, cases in files.items():
        path = os.path.join(a.out, fname)
        if only:
            mine = {c["name"]: c for c in cases if c["name"] in only}
            if not mine:
                continue
            with open(path) as f:
                stored = json.load(f)["cases"]
            names = [c["name"] for c in stored]
            cases = [mine.get(c["name"], c) for c in stored]
            cases += [c for n, c in mine.items() if n not in names]
        with open(path, "w") as f:
            json.dump({"generator": "tools/gen_optim_reference.py", "torch": torch.__version__,
                       "cases": cases}, f, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {len(cases)} cases, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
