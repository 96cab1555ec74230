#!/usr/bin/env python3
"""Write plugins/models/lstm/revin_reference.h: predictions and gradients of
the lstm plugin's input paths (RevIN, seasonal differencing, naive skip)
computed with PyTorch in float64, for test_lstm.c.

RevIN is the reference implementation of Kim et al., ICLR 2022, "Reversible
Instance Normalization for Accurate Time-Series Forecasting against
Distribution Shift" (github.com/ts-kim/RevIN, RevIN.py), re-typed below:
statistics over the time axis, detached; normalize x -> (x - mean) / stdev
[* w + b]; de-normalize y -> [(y - b) / (w + eps^2)] * stdev + mean.
The plugin's `revin = mean` (subtract the window mean, add it back; no
stdev) is this without the division, written out separately below.

The forecast of every case:
    xn   = RevIN.norm(x)                              [B, T, F]
    h    = xn[:, d:] - xn[:, :-d]  if input_diff d > 0 else xn
    y, _ = nn.LSTM(F, H, L, batch_first=True, bidirectional=...)(h)
    pred = nn.Linear(...)(y[:, -1])                   [B, Ho]
    pred = pred + xn[:, T - period : T - period + Ho, c]   (naive skip)
    pred = RevIN.denorm(pred) on the target column c
The scalar differentiated is sum(pred * R) with a fixed R; dx is the
gradient w.r.t. x with the statistics detached (as RevIN).

Cases (B=2, T=9, F=3, H=4; inputs with per-feature levels 5, -3, 10 so that
the normalization matters):
  std_affine : revin std + affine, 2 layers, horizon 1, naive skip (period 7, column 1)
  mean_diff  : revin mean, 1 bidirectional layer, input_diff 3, horizon 2,
               naive skip (period 7, column 2)

Usage: python3 plugins/models/lstm/gen_revin_reference.py  (any directory)
"""
import os

import torch
import torch.nn as nn

B, T, F, HID, EPS, PERIOD = 2, 9, 3, 4, 1e-5, 7
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "revin_reference.h")


class RevIN(nn.Module):
    """ts-kim/RevIN RevIN.py (norm / denorm), unchanged in substance."""

    def __init__(self, num_features, eps=1e-5, affine=True):
        super().__init__()
        self.num_features, self.eps, self.affine = num_features, eps, affine
        if self.affine:
            self.affine_weight = nn.Parameter(torch.ones(num_features))
            self.affine_bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x, mode):
        if mode == "norm":
            dim2reduce = tuple(range(1, x.ndim - 1))
            self.mean = torch.mean(x, dim=dim2reduce, keepdim=True).detach()
            self.stdev = torch.sqrt(torch.var(x, dim=dim2reduce, keepdim=True, unbiased=False)
                                    + self.eps).detach()
            x = x - self.mean
            x = x / self.stdev
            if self.affine:
                x = x * self.affine_weight
                x = x + self.affine_bias
            return x
        if self.affine:
            x = x - self.affine_bias
            x = x / (self.affine_weight + self.eps * self.eps)
        x = x * self.stdev
        x = x + self.mean
        return x


def arr(name, t):
    vals = t.detach().to(torch.float64).reshape(-1).tolist()
    body = ",\n    ".join(", ".join("%.9g" % v for v in vals[i:i + 6]) for i in range(0, len(vals), 6))
    return "static const float %s[%d] = {\n    %s};\n" % (name, len(vals), body)


def case(tag, g, x, mode, affine, layers, bidir, diff, horizon, col):
    lstm = nn.LSTM(F, HID, num_layers=layers, batch_first=True, bidirectional=bidir)
    head = nn.Linear(HID * (2 if bidir else 1), horizon)
    with torch.no_grad():
        for p in list(lstm.parameters()) + list(head.parameters()):
            p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * 0.6)
    lstm, head = lstm.double(), head.double()
    named = [("lstm." + n, p) for n, p in lstm.named_parameters()] + \
            [("head." + n, p) for n, p in head.named_parameters()]
    if mode == "std":
        rev = RevIN(F, EPS, affine).double()
        if affine:
            with torch.no_grad():
                rev.affine_weight.copy_(1 + 0.3 * torch.randn(F, generator=g).double())
                rev.affine_bias.copy_(0.2 * torch.randn(F, generator=g).double())
            named += [("revin.affine_weight", rev.affine_weight), ("revin.affine_bias", rev.affine_bias)]
        xn = rev(x, "norm")
    else:  # mean: subtract the window mean (detached), add it back at the end
        assert not affine
        mean = x.mean(1, keepdim=True).detach()
        xn = x - mean
    h = xn[:, diff:] - xn[:, :-diff] if diff else xn
    y, _ = lstm(h)
    pred = head(y[:, -1])
    t0 = T - PERIOD
    pred = pred + xn[:, t0:t0 + horizon, col]
    if mode == "std":
        # de-normalize the target column: put pred into column col of a
        # [B, horizon, F] tensor and run RevIN's denorm on all columns
        full = torch.zeros(B, horizon, F, dtype=torch.float64)
        full = torch.cat([full[:, :, :col], pred.unsqueeze(2), full[:, :, col + 1:]], dim=2)
        pred = rev(full, "denorm")[:, :, col]
    else:
        pred = pred + mean[:, :, col]
    r = torch.randn(pred.shape, generator=g).double()
    grads = torch.autograd.grad((pred * r).sum(), [x] + [p for _, p in named])
    lines = ["#define REVIN_REF_%s_LAYERS %d\n#define REVIN_REF_%s_BIDIR %d\n#define REVIN_REF_%s_DIFF %d\n"
             "#define REVIN_REF_%s_HORIZON %d\n#define REVIN_REF_%s_COL %d\n"
             % (tag.upper(), layers, tag.upper(), int(bidir), tag.upper(), diff, tag.upper(), horizon,
                tag.upper(), col),
             arr("revin_ref_%s_r" % tag, r), arr("revin_ref_%s_pred" % tag, pred),
             arr("revin_ref_%s_dx" % tag, grads[0])]
    table = []
    for i, ((n, p), gp) in enumerate(zip(named, grads[1:])):
        lines += [arr("revin_ref_%s_p%d" % (tag, i), p), arr("revin_ref_%s_g%d" % (tag, i), gp)]
        table.append('    {"%s", revin_ref_%s_p%d, revin_ref_%s_g%d, %d},\n' % (n, tag, i, tag, i, p.numel()))
    lines.append("static const revin_ref_param revin_ref_%s_params[] = {\n%s    {0, 0, 0, 0}};\n"
                 % (tag, "".join(table)))
    return lines


def main():
    g = torch.Generator().manual_seed(2022)
    levels = torch.tensor([5.0, -3.0, 10.0], dtype=torch.float64)
    scales = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    x = (torch.randn(B, T, F, generator=g).double() * scales + levels).requires_grad_(True)
    lines = ["/* Generated by plugins/models/lstm/gen_revin_reference.py from torch %s; do not edit. */\n"
             % torch.__version__,
             "#define REVIN_REF_B %d\n#define REVIN_REF_T %d\n#define REVIN_REF_F %d\n#define REVIN_REF_H %d\n"
             "#define REVIN_REF_PERIOD %d\n#define REVIN_REF_EPS %g\n" % (B, T, F, HID, PERIOD, EPS),
             "typedef struct revin_ref_param { const char *name; const float *value, *grad; int n; } "
             "revin_ref_param;\n",
             arr("revin_ref_x", x)]
    lines += case("std_affine", g, x, "std", True, 2, False, 0, 1, 1)
    lines += case("mean_diff", g, x, "mean", False, 1, True, 3, 2, 2)
    with open(OUT, "w") as f:
        f.write("".join(lines))
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
