/* optim_math.h - the per-element AdamW / Adam and SGD updates, once, for
 * every backend.
 *
 * An optimizer plugin describes one update of one parameter tensor with a
 * pl_adamw_hyper or pl_sgd_hyper and calls pl_adamw_step_ / pl_sgd_step_
 * (ops.h), which run on the tensors' device. Each backend's kernel loops over
 * the elements calling pl_adamw_elem / pl_sgd_elem below with the scalars
 * pl_adamw_coef_of / pl_sgd_coef_of derived once per tensor on the host (or,
 * for a counted call, pl_adamw_coef_at of the step count on the device, in
 * the kernel), so the CPU and a GPU compute the same f32 operations in the
 * same order.
 *
 * Math: torch/optim/adam.py and sgd.py, _single_tensor_adam and
 * _single_tensor_sgd (PyTorch 2.x), in f32:
 *   AdamW:  p <- p * (1 - lr * wd)              Adam (l2): g <- g + wd * p
 *   m <- m + (1 - beta1) (g - m)                (torch's lerp_, both branches)
 *   v <- beta2 v + (1 - beta2) g^2
 *   vmax <- max(vmax, v)                        (amsgrad; v below means vmax)
 *   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   SGD:    g <- g + wd * p
 *           momentum mu != 0: b <- g (first step) or mu b + (1 - dampening) g
 *                             d <- g + mu b (nesterov) or b;   p <- p - lr d
 *
 * Everything here is `static inline`; the element functions are PL_HD
 * (host and device under nvcc). Plain C that is also valid C++.
 */
#ifndef PIPELINE_OPTIM_MATH_H
#define PIPELINE_OPTIM_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/backend_util.h"
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW / Adam update of one tensor, as the optimizer sees it. */
typedef struct pl_adamw_hyper {
    double lr, beta1, beta2, eps, weight_decay;
    bool l2;      /* true: coupled L2 (torch.optim.Adam), false: decoupled (AdamW) */
    bool amsgrad; /* keep max_exp_avg_sq */
    int64_t step; /* 1-based count of this update (bias correction), >= 1 */
} pl_adamw_hyper;

/* The f32 scalars of one AdamW update (derived on the host, passed to a
 * kernel by value). */
typedef struct pl_adamw_coef {
    float decay_f;  /* 1 - lr * wd (decoupled decay) */
    float wd_f;     /* wd (coupled L2) */
    float w1;       /* 1 - beta1, the lerp weight */
    float b2, c2;   /* beta2, 1 - beta2 */
    float neg_step; /* -lr / (1 - beta1^t) */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float eps;
    int decay, l2, ams; /* flags */
} pl_adamw_coef;

/* ---- the step count on the device (ABI 2.12) ----
 *
 * torch's fused AdamW keeps each parameter's `step` as an f32 tensor on the
 * parameter's device (torch/optim/adam.py `_fused_adam`, state_steps of
 * dtype _get_scalar_dtype(is_fused=True) = float32) and, under
 * GradScaler's found_inf, takes a skipped step back on the device:
 *     torch._foreach_add_(state_steps, 1)
 *     torch._fused_adamw_(..., state_steps, found_inf=found_inf)  # no update when found_inf
 *     torch._foreach_sub_(state_steps, [found_inf] * n)
 * so the count advances by 1 - found_inf and the host never reads the flag.
 * A non-fused torch optimizer under GradScaler skips optimizer.step()
 * altogether (a host read of found_inf), with the same count. A counted
 * kernel call (pl_adamw_step_counted_, ops.h) does the same in one place:
 * pl_optim_count_elem below, then the update with the count it left,
 * converted to double as torch's fused kernel does (`*step_count`, f32, in
 * pow(beta, step) of doubles). The bias corrections are then those of
 * pl_adamw_coef_of below, from the same expressions in double, rounded to
 * f32 once: for a count up to 2^24 (exact in f32) the coefficients are the
 * bits the host computes from an int64 step (the CPU kernel calls the same
 * libm pow). CUDA's double pow is within 2 ulp (CUDA C Programming Guide,
 * mathematical functions), so a GPU's double may differ in its last bits,
 * which the f32 rounding of lr / bc1 and sqrt(bc2) hides unless the double
 * lies within those bits of an f32 rounding boundary (a last-bit difference
 * of one coefficient; torch's fused kernel also calls pow on the device).
 *
 * found_inf non-zero or NaN (the kernels' skip rule; torch's flag is only
 * ever 0 or 1, the trainer's is NaN for a non-finite loss): the count stays;
 * else it is incremented. Returns whether the step runs. */
PL_HD static inline bool pl_optim_count_elem(float *count, const float *found_inf) {
    if (found_inf && *found_inf != 0.0f) return false;
    *count = *count + 1.0f;
    return true;
}

/* What a counted AdamW call gets instead of a pl_adamw_coef (the record in
 * p.extra, or a captured graph's table slot): the doubles that the bias
 * corrections need, and the scalars that do not depend on the step. 48
 * bytes, within PL_OPTIM_COEF_FLOATS floats. */
typedef struct pl_adamw_ccoef {
    double lr, beta1, beta2;
    float decay_f, wd_f, eps; /* as in pl_adamw_coef */
    int32_t decay, l2, ams;   /* flags; l2, ams as pl_adamw_coef's */
} pl_adamw_ccoef;

/* The step-independent part of h (host only). */
static inline pl_adamw_ccoef pl_adamw_ccoef_of(const pl_adamw_hyper *h) {
    pl_adamw_ccoef k;
    memset(&k, 0, sizeof k); /* no padding bytes of the stack in a copied record */
    k.lr = h->lr;
    k.beta1 = h->beta1;
    k.beta2 = h->beta2;
    k.decay = h->weight_decay != 0.0 && !h->l2;
    k.l2 = h->weight_decay != 0.0 && h->l2;
    k.decay_f = (float)(1.0 - h->lr * h->weight_decay);
    k.wd_f = (float)h->weight_decay;
    k.eps = (float)h->eps;
    k.ams = h->amsgrad;
    return k;
}

/* The f32 scalars of update `step` (1-based) of k: pow in double as torch
 * computes them (the single-tensor path from a Python float step, the fused
 * kernel from its f32 step tensor), each rounded to f32 once. Host and
 * device (a counted kernel calls it with its count). */
PL_HD static inline pl_adamw_coef pl_adamw_coef_at(const pl_adamw_ccoef *k, double step) {
    pl_adamw_coef c;
    const double bc1 = 1.0 - pow(k->beta1, step);
    const double bc2 = 1.0 - pow(k->beta2, step);
    c.decay = k->decay;
    c.l2 = k->l2;
    c.decay_f = k->decay_f;
    c.wd_f = k->wd_f;
    c.w1 = (float)(1.0 - k->beta1);
    c.b2 = (float)k->beta2;
    c.c2 = (float)(1.0 - k->beta2);
    c.neg_step = (float)(-(k->lr / bc1));
    c.bc2_sqrt = (float)sqrt(bc2);
    c.eps = k->eps;
    c.ams = k->ams;
    return c;
}

/* The scalars of h (host only): pl_adamw_coef_at of h's step. */
static inline pl_adamw_coef pl_adamw_coef_of(const pl_adamw_hyper *h) {
    const pl_adamw_ccoef k = pl_adamw_ccoef_of(h);
    return pl_adamw_coef_at(&k, (double)h->step);
}

/* Update element i in place: p, m, v (and vmax when c->ams; vmax may be
 * NULL otherwise) from gradient g. */
PL_HD static inline void pl_adamw_elem(const pl_adamw_coef *c, float *p, float g, float *m,
                                       float *v, float *vmax) {
    float pi = *p, gi = g;
    if (c->decay) pi = pi * c->decay_f;
    if (c->l2) gi = gi + c->wd_f * pi;
    float mi = *m, d = gi - mi;
    /* torch's lerp_: start + w (end - start) for w < 0.5, else end - (1 - w)(end - start) */
    mi = c->w1 < 0.5f ? fmaf(c->w1, d, mi) : fmaf(c->w1 - 1.0f, d, gi);
    float vi = *v * c->b2;
    vi = vi + c->c2 * gi * gi;
    float vu = vi;
    if (c->ams) {
        float vm = *vmax;
        vu = (vi > vm || vi != vi) ? vi : vm; /* torch.maximum propagates NaN */
        *vmax = vu;
    }
    float denom = sqrtf(vu) / c->bc2_sqrt + c->eps;
    *m = mi;
    *v = vi;
    *p = pi + c->neg_step * mi / denom;
}

/* One SGD update of one tensor. */
typedef struct pl_sgd_hyper {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first; /* true: the momentum buffer is initialised to the gradient (a
                 * counted call, pl_sgd_step_counted_, ignores it: the kernel
                 * sets first when its count, after pl_optim_count_elem, is 1,
                 * so a skipped first step leaves the buffer uninitialised, as
                 * torch's GradScaler, which then calls no optimizer.step) */
} pl_sgd_hyper;

typedef struct pl_sgd_coef {
    float wd_f, mu, keep, neg_lr; /* wd, momentum, 1 - dampening, -lr */
    int wd, mom, first, nesterov; /* flags */
} pl_sgd_coef;

/* The scalars of h; `has_buf`: a momentum buffer is passed (momentum != 0). */
static inline pl_sgd_coef pl_sgd_coef_of(const pl_sgd_hyper *h, bool has_buf) {
    pl_sgd_coef c;
    c.wd = h->weight_decay != 0.0;
    c.wd_f = (float)h->weight_decay;
    c.mom = h->momentum != 0.0 && has_buf;
    c.mu = (float)h->momentum;
    c.keep = (float)(1.0 - h->dampening);
    c.neg_lr = (float)(-h->lr);
    c.first = h->first;
    c.nesterov = h->nesterov;
    return c;
}

/* Update element p (and the momentum buffer element buf when c->mom; may be
 * NULL otherwise) from gradient g. */
PL_HD static inline void pl_sgd_elem(const pl_sgd_coef *c, float *p, float g, float *buf) {
    float pi = *p, d = g;
    if (c->wd) d = d + c->wd_f * pi;
    if (c->mom) {
        float b = c->first ? d : *buf * c->mu + c->keep * d;
        *buf = b;
        d = c->nesterov ? d + c->mu * b : b;
    }
    *p = pi + c->neg_lr * d;
}

/* ---- multi-tensor updates (ops.def's adamw_step_multi / sgd_step_multi) ----
 *
 * What torch.optim.AdamW(foreach=True) / (fused=True) and SGD(foreach=True)
 * do (torch/optim/adamw.py `_multi_tensor_adamw`, `_fused_adamw`; CUDA's
 * multi_tensor_apply, which packs a list of tensors into the arguments of
 * one launch, torch's TensorListMetadata): one kernel call updates up to
 * PL_OPTIM_MULTI_MAX parameters. Each parameter gets exactly the per-element
 * update above (pl_adamw_elem / pl_sgd_elem) with its own coefficients, so
 * the result is the per-tensor op's, bit for bit; only the launch count
 * changes (a GPU: one launch instead of n).
 *
 * The kernel call (backend.h's pl_kernel_args):
 *   op     PL_OP_ADAMW_STEP_MULTI or PL_OP_SGD_STEP_MULTI
 *   in[0]  the found_inf flag (pl_optim_set_found_inf, ops.h: a 1-element f32
 *          on the device; non-zero or NaN skips every tensor of the call) or
 *          NULL; n_in 1, or 2 with in[1] below
 *   in[1]  with p.flags bit0 (a captured graph's call, graph.h): the
 *          coefficients on the device, f32 [PL_OPTIM_COEF_FLOATS * n], tensor
 *          i's pl_adamw_coef / pl_sgd_coef bytes at float offset
 *          PL_OPTIM_COEF_FLOATS * i; the host rewrites them before a replay
 *   out[0] param[0] (n_out 1): the device the call runs on
 *   p.extra  const pl_optim_multi * below, borrowed for the call (a backend
 *          that records the call, a graph capture, copies what it needs:
 *          the tensors' data pointers and, eagerly, the coefficients)
 * Every tensor is f32, contiguous and on out[0]'s device (the core checks,
 * as for the per-tensor ops); param[i], grad[i] and state[k][i] have the same
 * element count (numel 0 allowed). A backend without these ops (its kernel
 * lookup answers NULL) still works: pl_adamw_step_multi_ / pl_sgd_step_multi_
 * (ops.h) then make one per-tensor call per parameter. */
#define PL_OPTIM_MULTI_MAX 32   /* tensors per call; <= the graph's 64 slots per chunk */
#define PL_OPTIM_COEF_FLOATS 16 /* one coefficient record on the device: 64 bytes */

typedef struct pl_optim_multi {
    int n; /* tensors in the call, 1..PL_OPTIM_MULTI_MAX */
    /* the parameters (updated in place) and their gradients (read) */
    pl_tensor *param[PL_OPTIM_MULTI_MAX];
    pl_tensor *grad[PL_OPTIM_MULTI_MAX];
    /* adamw: state[0] exp_avg, state[1] exp_avg_sq, state[2] max_exp_avg_sq
     * (NULL unless that tensor's coefficients say amsgrad); sgd: state[0]
     * the momentum buffer (NULL unless its coefficients say momentum),
     * state[1], state[2] NULL. Updated in place. */
    pl_tensor *state[3][PL_OPTIM_MULTI_MAX];
    /* eager calls (p.flags bit0 clear): tensor i's pl_adamw_coef or
     * pl_sgd_coef, from pl_adamw_coef_of / pl_sgd_coef_of; unused otherwise */
    union {
        pl_adamw_coef adamw;
        pl_adamw_ccoef adamw_counted; /* a counted adamw call (count[] below) */
        pl_sgd_coef sgd;
        float pad[PL_OPTIM_COEF_FLOATS];
    } coef[PL_OPTIM_MULTI_MAX];
    /* ABI 2.12, after everything a 2.11 backend reads: a counted call's step
     * counters (f32, one element each, on out[0]'s device; written), or
     * NULL. adamw: all n set or all NULL; set, the coefficient records are
     * pl_adamw_ccoef and the kernel, unless found_inf, increments count[i]
     * (pl_optim_count_elem) and updates tensor i with pl_adamw_coef_at of
     * it. sgd: count[i] set where state[0][i] is (momentum), NULL elsewhere;
     * the record stays a pl_sgd_coef whose `first` the kernel replaces by
     * count[i] == 1 after the increment. Only a backend that accepts the
     * setting "optimizer_step_count" gets a counted call (ops.h,
     * pl_optim_counts_on_device). */
    pl_tensor *count[PL_OPTIM_MULTI_MAX];
} pl_optim_multi;

/* Whether op's kernel calls carry a pl_optim_multi list in p.extra (the
 * multi-tensor optimizer steps, the GradScaler's unscale and
 * clip_grad_norm_'s foreach ops: the last three fill grad[] only, param[]
 * NULL), not a tensor (dropout's offset) or nothing. For a backend that
 * records calls (a graph capture) or tracks what they read. Any op id. */
static inline bool pl_op_has_multi_list(int op) {
    return op == PL_OP_ADAMW_STEP_MULTI || op == PL_OP_SGD_STEP_MULTI ||
           op == PL_OP_AMP_UNSCALE_MULTI || op == PL_OP_SUM_SQUARES_MULTI || op == PL_OP_MUL_MULTI;
}

/* Whether op's pl_optim_multi list may carry count[] (the optimizer steps; the
 * other multi-list ops leave it unset, so a backend reads it only for these). */
static inline bool pl_optim_multi_counted(int op) {
    return op == PL_OP_ADAMW_STEP_MULTI || op == PL_OP_SGD_STEP_MULTI;
}

/* ---- GradScaler on the device (ops.def's amp_unscale_multi, amp_update_scale) ----
 *
 * torch.cuda.amp.GradScaler keeps its scale and growth tracker on the device
 * and never reads them on the host during training (ATen
 * native/cuda/AmpKernels.cu, PyTorch 2.x):
 *   _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
 *       every element g of every gradient: found_inf = 1 when g (as it
 *       arrives, before the multiply) is inf or NaN; g = g * inv_scale
 *       (g unchanged when inv_scale == 1). found_inf is never cleared.
 *   _amp_update_scale_(scale, growth_tracker, found_inf, growth_factor,
 *       backoff_factor, growth_interval): below, one thread.
 * The kernel calls (backend.h's pl_kernel_args):
 *   amp_unscale_multi  in[0] inv_scale f32 [1]; out[0] found_inf f32 [1];
 *                      p.extra const pl_optim_multi * with n and grad[0..n)
 *                      (f32, contiguous, on out[0]'s device; param, state
 *                      and coef unused, NULL); the list is copied by a
 *                      backend that records the call, as for the optimizer
 *                      ops
 *   amp_update_scale   in[0] found_inf f32 [1] (non-zero or NaN: found);
 *                      out[0] scale f32 [1], out[1] growth_tracker i32 [1];
 *                      p.alpha growth_factor, p.beta backoff_factor,
 *                      p.start growth_interval (constants of the run)
 * Both read every per-step value (inv_scale, found_inf, scale, tracker) from
 * device memory, so a captured graph's replay sees the values of its step. */

/* One element of _amp_foreach_non_finite_check_and_unscale_: *g unscaled in
 * place; returns true when it was not finite as it arrived. */
PL_HD static inline bool pl_amp_unscale_elem(float *g, float inv_scale) {
    float v = *g;
    bool bad = !isfinite(v);
    *g = inv_scale == 1.0f ? v : v * inv_scale;
    return bad;
}

/* _amp_update_scale_ (amp_update_scale_cuda_kernel): found_inf non-zero (NaN
 * counts, as C's truth test of a float): scale *= backoff_factor (the
 * product in double, rounded to f32), tracker = 0; else tracker + 1, and
 * when that reaches growth_interval the scale is multiplied by
 * growth_factor (rounded to f32) and kept only when finite (the scale never
 * grows to inf), tracker = 0. */
PL_HD static inline void pl_amp_update_scale_elem(float *scale, int32_t *tracker, float found_inf,
                                                  double growth_factor, double backoff_factor,
                                                  int64_t growth_interval) {
    if (found_inf != 0.0f) {
        *scale = (float)((double)*scale * backoff_factor);
        *tracker = 0;
    } else {
        int64_t successful = (int64_t)*tracker + 1;
        if (successful == growth_interval) {
            float grown = (float)((double)*scale * growth_factor);
            if (isfinite(grown)) *scale = grown;
            *tracker = 0;
        } else {
            *tracker = (int32_t)successful;
        }
    }
}

/* torch.clamp(x, lo, hi) of one element: NaN stays NaN; the gradient passes
 * where lo <= x <= hi (derivatives.yaml, clamp_backward). */
PL_HD static inline float pl_clamp_elem(float x, float lo, float hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
PL_HD static inline float pl_clamp_grad_elem(float x, float lo, float hi, float dy) {
    return (x >= lo && x <= hi) ? dy : 0.0f;
}

#ifdef __cplusplus
}
#endif
#endif
