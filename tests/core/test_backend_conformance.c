/* test_backend_conformance.c - every op of pl_op on every backend (the idea
 * of ggml's test-backend-ops).
 *
 * For each op (every row of pipeline/ops.def) a few small representative cases
 * run forward (and backward through pl_backward of sum(out * R) when the op
 * is differentiable) on the CPU backend, the reference. Then, for the backend
 * registered for PL_DEVICE_CUDA (the "cuda" plugin, loaded through the
 * registry from the build's plugin dir; PL_CONFORMANCE_BACKEND=NAME loads the
 * backend plugin NAME instead, e.g. the CPU-side emulated "strict" backend),
 * the same inputs are copied there with pl_tensor_to, the case runs again and
 * its output and input gradients are compared with the CPU's.
 *
 * The result is one table on stdout (markdown, so tools/gpu_check.sh can put
 * it in its report as printed): one row per case and direction (fwd: the
 * output; bwd: every input gradient) with the dtype of the case's float
 * inputs, the max abs and max rel error against the CPU, the tolerance and
 * a status:
 *   OK           within tolerance everywhere;
 *   FAIL         an element outside it (the note names the first one), or
 *                the case failed to run with any error but PL_ERR_UNSUPPORTED;
 *   unsupported  the backend's kernel lookup answers NULL (the documented way
 *                a backend declines an op) or the kernel returned
 *                PL_ERR_UNSUPPORTED (e.g. for a dtype).
 * A last line counts the rows. FAIL rows fail the test; unsupported rows fail
 * it only with PL_CONFORMANCE_REQUIRE_ALL=1 (tools/gpu_check.sh sets it: on a
 * real GPU the goal is no unsupported row).
 *
 * Tolerances depend on the dtype of the case's float inputs (g_tol below);
 * a case may set its own (exact ones for cast and dropout).
 *
 * Without a GPU (no plugin built, no driver, no device) the device part is
 * skipped with a message and the CPU part still checks that every op has a
 * CPU forward kernel (and a backward where the op is differentiable), that
 * every op has a forward and a backward case, that every case runs, gives
 * finite values and is bit-for-bit reproducible.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_loader.h"
#include "op_table.h"
#include "pipeline/nf4.h"
#include "pipeline/optim_math.h"
#include "pl_test.h"
#include "registry.h"

#define MAX_IN 6

typedef struct tin {
    int nd;
    int64_t sh[4];
    char kind;         /* 'f' float (uniform [lo, hi)), 'i' i64 from vals */
    double lo, hi;
    int64_t vals[24];  /* 'i': the values, one per element (numel <= 24) */
    pl_dtype dt;       /* 'f': dtype on the device (converted from f32) */
    bool grad;
    bool strided;      /* the input is columns 1..3 of sh's last dim: a strided view */
} tin;

struct ocase;
typedef pl_tensor *(*case_fn)(pl_tensor **in, const struct ocase *c);

typedef struct ocase {
    pl_op op;
    const char *what;
    int n_in;
    tin in[MAX_IN];
    case_fn fn;
    bool bwd;          /* run backward and compare input gradients */
    double atol, rtol; /* device vs CPU tolerance; 0, 0: by dtype (g_tol) */
    int flag;
    double par;
    const char *env;   /* "NAME=VALUE" set while the case runs on the device (not on
                        * the CPU), e.g. a backend's choice between two kernels */
} ocase;

#define F(nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_F32, .grad = true}
#define FP(nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = 0.5, .hi = 2, .dt = PL_F32, .grad = true}
#define FN(nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_F32, .grad = false}
/* a float input stored as dtype dt_ (bf16 / f16) on both backends */
#define FD(dt_, nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = -2, .hi = 2, .dt = dt_, .grad = true}
#define FDP(dt_, nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = 0.5, .hi = 2, .dt = dt_, .grad = true}
#define I(nd_, sh_, ...) {.nd = nd_, .sh = sh_, .kind = 'i', .vals = {__VA_ARGS__}, .dt = PL_I64}
#define SH(...) {__VA_ARGS__}
/* f32 uniform [lo_, hi_) with a gradient */
#define FR(lo_, hi_, nd_, ...) {.nd = nd_, .sh = {__VA_ARGS__}, .kind = 'f', .lo = lo_, .hi = hi_, .dt = PL_F32, .grad = true}

/* ---- case functions ------------------------------------------------------- */

static pl_tensor *c_copy(pl_tensor **in, const ocase *c) {
    return pl_contiguous(in[0]); /* in[0] is a strided view (tin.strided) */
}
static pl_tensor *c_matmul(pl_tensor **in, const ocase *c) {
    return pl_matmul(in[0], in[1], c->flag & 1, c->flag & 2);
}
/* flag bit0: no y (in = x, A, B[, gexp]); else in = y, x, A, B[, gexp];
 * bit1: dropout of x inside the op (pl_lora_add_dropout, p 0.3, seed 9,
 * counter 5: the device must draw the CPU's mask); bit2: under bf16
 * autocast (with bit1: f32 x dropped and rounded to bf16 by the kernel) */
static pl_tensor *c_lora_add(pl_tensor **in, const ocase *c) {
    int o = c->flag & 1 ? 0 : 1;
    pl_tensor *y = o ? in[0] : NULL, *g = c->n_in > o + 3 ? in[o + 3] : NULL, *r;
    if ((c->flag & 4) && pl_autocast_begin(PL_BF16)) return NULL;
    if (c->flag & 2)
        r = pl_lora_add_dropout(y, in[o], in[o + 1], in[o + 2], g, c->par, 0.3, 9, 5, true);
    else
        r = pl_lora_add(y, in[o], in[o + 1], in[o + 2], g, c->par);
    if (c->flag & 4) pl_autocast_end();
    return r;
}
static pl_tensor *c_add(pl_tensor **in, const ocase *c) { return pl_add(in[0], in[1]); }
static pl_tensor *c_sub(pl_tensor **in, const ocase *c) { return pl_sub(in[0], in[1]); }
static pl_tensor *c_mul(pl_tensor **in, const ocase *c) { return pl_mul(in[0], in[1]); }
static pl_tensor *c_div(pl_tensor **in, const ocase *c) { return pl_div(in[0], in[1]); }
static pl_tensor *c_scale(pl_tensor **in, const ocase *c) { return pl_scale(in[0], c->par); }
static pl_tensor *c_add_scalar(pl_tensor **in, const ocase *c) { return pl_add_scalar(in[0], c->par); }
static pl_tensor *c_sum(pl_tensor **in, const ocase *c) { return pl_sum(in[0], c->flag, c->par != 0); }
static pl_tensor *c_mean(pl_tensor **in, const ocase *c) { return pl_mean(in[0], c->flag, c->par != 0); }
static pl_tensor *c_relu(pl_tensor **in, const ocase *c) { return pl_relu(in[0]); }
static pl_tensor *c_leaky(pl_tensor **in, const ocase *c) { return pl_leaky_relu(in[0], c->par); }
static pl_tensor *c_elu(pl_tensor **in, const ocase *c) { return pl_elu(in[0], c->par); }
static pl_tensor *c_gelu(pl_tensor **in, const ocase *c) { return pl_gelu(in[0], c->flag); }
static pl_tensor *c_silu(pl_tensor **in, const ocase *c) { return pl_silu(in[0]); }
static pl_tensor *c_sigmoid(pl_tensor **in, const ocase *c) { return pl_sigmoid(in[0]); }
static pl_tensor *c_tanh(pl_tensor **in, const ocase *c) { return pl_tanh(in[0]); }
static pl_tensor *c_exp(pl_tensor **in, const ocase *c) { return pl_exp(in[0]); }
static pl_tensor *c_log(pl_tensor **in, const ocase *c) { return pl_log(in[0]); }
static pl_tensor *c_square(pl_tensor **in, const ocase *c) { return pl_square(in[0]); }
static pl_tensor *c_sqrt(pl_tensor **in, const ocase *c) { return pl_sqrt(in[0]); }
static pl_tensor *c_softmax(pl_tensor **in, const ocase *c) { return pl_softmax(in[0]); }
static pl_tensor *c_swiglu(pl_tensor **in, const ocase *c) { return pl_swiglu(in[0], in[1]); }
static pl_tensor *c_log_softmax(pl_tensor **in, const ocase *c) { return pl_log_softmax(in[0]); }
static pl_tensor *c_ce(pl_tensor **in, const ocase *c) {
    return pl_cross_entropy(in[0], in[1], -100, c->par);
}
/* x [N, K], W [V, K], target [N]; ignore_index -100, smoothing c->par */
static pl_tensor *c_lce(pl_tensor **in, const ocase *c) {
    return pl_linear_cross_entropy(in[0], in[1], in[2], -100, c->par);
}
static pl_tensor *c_mse(pl_tensor **in, const ocase *c) { return pl_mse_loss(in[0], in[1]); }
static pl_tensor *c_mae(pl_tensor **in, const ocase *c) { return pl_mae_loss(in[0], in[1]); }
static pl_tensor *c_huber(pl_tensor **in, const ocase *c) { return pl_huber_loss(in[0], in[1], c->par); }
static pl_tensor *c_embedding(pl_tensor **in, const ocase *c) { return pl_embedding(in[0], in[1]); }
static pl_tensor *c_index_select(pl_tensor **in, const ocase *c) {
    return pl_index_select(in[0], c->flag, in[1]);
}
static pl_tensor *c_gather(pl_tensor **in, const ocase *c) { return pl_gather(in[0], c->flag, in[1]); }
static pl_tensor *c_scatter_add(pl_tensor **in, const ocase *c) {
    return pl_scatter_add(in[0], c->flag, in[1], (int64_t)c->par);
}
static pl_tensor *c_segment_softmax(pl_tensor **in, const ocase *c) {
    return pl_segment_softmax(in[0], in[1], (int64_t)c->par);
}
static pl_tensor *c_layer_norm(pl_tensor **in, const ocase *c) {
    return pl_layer_norm(in[0], c->n_in > 1 ? in[1] : NULL, c->n_in > 2 ? in[2] : NULL, 1e-5);
}
static pl_tensor *c_rms_norm(pl_tensor **in, const ocase *c) {
    return pl_rms_norm(in[0], c->n_in > 1 ? in[1] : NULL, 1e-6);
}
static pl_tensor *c_dropout(pl_tensor **in, const ocase *c) {
    return pl_dropout(in[0], c->par, 1234567890123ull, 77, true);
}
static pl_tensor *c_concat(pl_tensor **in, const ocase *c) { return pl_concat(in, c->n_in, c->flag); }
static pl_tensor *c_slice(pl_tensor **in, const ocase *c) { return pl_slice(in[0], c->flag, 1, 4); }
static pl_tensor *c_permute(pl_tensor **in, const ocase *c) {
    return pl_permute(in[0], (const int[]){2, 0, 1});
}
static pl_tensor *c_reshape(pl_tensor **in, const ocase *c) {
    /* square after the reshape so the reshape node is not the graph's root */
    return pl_square(pl_reshape(in[0], PL_SHAPE(6, 4)));
}
static pl_tensor *c_rope(pl_tensor **in, const ocase *c) { return pl_rope(in[0], 3, 10000.0); }
static pl_tensor *c_causal(pl_tensor **in, const ocase *c) { return pl_causal_softmax(in[0], c->par); }
/* c->flag: causal; c->par: scale; a 4th input is the additive key bias */
static pl_tensor *c_attention(pl_tensor **in, const ocase *c) {
    return pl_attention(in[0], in[1], in[2], c->n_in > 3 ? in[3] : NULL, c->par, c->flag);
}
static pl_tensor *c_cast(pl_tensor **in, const ocase *c) { return pl_cast(in[0], (pl_dtype)c->flag); }
static pl_tensor *c_nf4(pl_tensor **in, const ocase *c) {
    pl_tensor *q = pl_nf4_quantize(in[1], 64, false);
    if (!q) return NULL;
    pl_tensor *y = pl_nf4_matmul(in[0], q);
    pl_tensor_release(q);
    return y;
}
/* quantized on the device (block c->flag, double quantization), read back as
 * values: same codes and absmax as the CPU's give the same numbers */
static pl_tensor *c_nf4_quant(pl_tensor **in, const ocase *c) {
    pl_tensor *q = pl_nf4_quantize(in[0], c->flag, true);
    if (!q) return NULL;
    pl_tensor *y = pl_nf4_dequantize(q, PL_F32); /* owned: handed to the frame as a copy */
    pl_tensor_release(q);
    pl_tensor *r = y ? pl_scale(y, 1.0) : NULL;
    pl_tensor_release(y);
    return r;
}
/* topk of in[0] [R, V] with k = c->par: values and indices (as f32) side by
 * side. flag bit0: the input is replaced by a pattern of ties (5 distinct
 * values) and -inf (every 7th element); bit1: and NaN (every 11th): the
 * indices alone (the values hold NaN / -inf, not comparable as numbers);
 * the order of ties and NaN is part of the op (ops.h pl_topk) */
static pl_tensor *c_topk(pl_tensor **in, const ocase *c) {
    pl_tensor *x = in[0], *v, *i;
    int64_t R = x->shape[0], V = x->shape[1];
    if (c->flag & 3) {
        float *h = malloc((size_t)(R * V) * sizeof *h);
        if (!h) return NULL;
        for (int64_t e = 0; e < R * V; e++)
            h[e] = (c->flag & 2) && e % 11 == 3 ? NAN : e % 7 == 2 ? -INFINITY
                                                                   : (float)((e * 13) % 5) - 2.0f;
        x = pl_tensor_to(pl_tensor_from_data(PL_F32, 2, x->shape, h, PL_CPU), x->dtype, x->device);
        free(h);
    }
    if (!x || pl_topk(x, (int64_t)c->par, &v, &i)) return NULL;
    pl_tensor *fi = pl_tensor_to(i, PL_F32, i->device);
    if (c->flag & 2) return fi;
    pl_tensor *both[2] = {pl_tensor_to(v, PL_F32, v->device), fi};
    return pl_concat(both, 2, 1);
}
static pl_tensor *c_lstm(pl_tensor **in, const ocase *c) {
    return pl_lstm(in[0], in[1], in[2], in[3], in[4], NULL, NULL, c->flag, NULL, NULL);
}

/* ---- the cases --------------------------------------------------------------- */

/* Device vs CPU tolerance by the dtype of a case's float inputs:
 * |device - cpu| <= atol + rtol |cpu| for every element of the output (fwd)
 * and of every input gradient (bwd). Both backends start from the same
 * rounded inputs; what may differ is the order of accumulation (f32: a few
 * ulp, grown by reductions over up to ~300 terms and by exp/log/erf
 * approximations) and, for 16-bit results, one rounding of the result:
 * bf16 has 8 significant bits (ulp 2^-8 = 3.9e-3 relative), f16 11 (ulp
 * 2^-11 = 4.9e-4); about 2.5 ulp are allowed, plus an absolute term for
 * values near 0 produced by cancellation. */
static const struct {
    pl_dtype dt;
    double atol, rtol;
} g_tol[] = {
    {PL_F32, 1e-4, 1e-3},
    {PL_BF16, 3e-2, 1e-2},
    {PL_F16, 4e-3, 2e-3},
};

static pl_tensor *c_clamp(pl_tensor **in, const ocase *c) { return pl_clamp(in[0], -c->par, c->par); }
/* In-place updates: on copies of the inputs (the CPU's inputs are copied to
 * the device afterwards), returning the updated state as one [3 * n] tensor. */
static pl_tensor *fresh(pl_tensor *t) { return pl_tensor_to(t, PL_F32, t->device); }
/* flag bit 2 (4): the step runs with a found_inf flag (pl_optim_set_found_inf)
 * on the tensors' device, NaN (skip: every tensor stays as it was) or, with
 * bit 3 (8), 0 (update as without one): a kernel that ignores in[1] fails. */
static pl_tensor *found_inf_on(const pl_tensor *like, int flag) {
    pl_tensor *h = pl_tensor_zeros(PL_F32, 1, (int64_t[]){1}, PL_CPU);
    if (!h) return NULL;
    ((float *)pl_tensor_data(h))[0] = flag & 8 ? 0.0f : NAN;
    return pl_tensor_to(h, PL_F32, like->device);
}
/* flag bit 4 (16): a counted call (ABI 2.12): the step count an f32 [1] on
 * the tensors' device holding `count` before the call, appended to the
 * result (the kernel increments it unless found_inf). */
static pl_tensor *count_on(const pl_tensor *like, double count) {
    return pl_tensor_full(PL_F32, 1, (int64_t[]){1}, count, like->device);
}
static pl_tensor *c_adamw(pl_tensor **in, const ocase *c) {
    pl_tensor *p = fresh(in[0]), *m = fresh(in[2]), *v = fresh(in[3]), *vm = fresh(in[4]);
    pl_adamw_hyper h = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                        .weight_decay = 0.1, .l2 = c->flag & 1, .amsgrad = c->flag & 2, .step = 3};
    pl_tensor *fi = c->flag & 4 ? found_inf_on(in[0], c->flag) : NULL;
    if ((c->flag & 4) && !fi) return NULL;
    pl_tensor *n = c->flag & 16 ? count_on(in[0], 2.0) : NULL; /* step 3 when it counts */
    if ((c->flag & 16) && !n) return NULL;
    pl_optim_set_found_inf(fi);
    pl_status st = !p || !m || !v || !vm ? PL_ERR_NOMEM
                   : n                  ? pl_adamw_step_counted_(p, in[1], m, v, vm, n, &h)
                                        : pl_adamw_step_(p, in[1], m, v, vm, &h);
    pl_optim_set_found_inf(NULL);
    if (st) return NULL;
    pl_tensor *parts[5] = {p, m, v, vm, n};
    return pl_concat(parts, n ? 5 : 4, 0);
}
static pl_tensor *c_sgd(pl_tensor **in, const ocase *c) {
    pl_tensor *p = fresh(in[0]), *b = fresh(in[2]);
    pl_sgd_hyper h = {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01,
                      .nesterov = c->flag & 1, .first = c->flag & 2};
    pl_tensor *fi = c->flag & 4 ? found_inf_on(in[0], c->flag) : NULL;
    if ((c->flag & 4) && !fi) return NULL;
    /* counted: first when the count reaches 1 (flag bit 1: from 0) */
    pl_tensor *n = c->flag & 16 ? count_on(in[0], c->flag & 2 ? 0.0 : 4.0) : NULL;
    if ((c->flag & 16) && !n) return NULL;
    pl_optim_set_found_inf(fi);
    pl_status st = !p || !b ? PL_ERR_NOMEM
                   : n      ? pl_sgd_step_counted_(p, in[1], b, n, &h)
                            : pl_sgd_step_(p, in[1], b, &h);
    pl_optim_set_found_inf(NULL);
    if (st) return NULL;
    pl_tensor *parts[3] = {p, b, n};
    return pl_concat(parts, n ? 3 : 2, 0);
}

/* The multi-tensor forms (ops.def's adamw_step_multi / sgd_step_multi): the
 * [40] inputs cut into 3 parameters of 7, 13 and 20 elements, each with its
 * own step count (1, 3, 5: per-tensor coefficients), updated by one call;
 * the states concatenated per kind. flag bits as for c_adamw / c_sgd. */
static const int64_t g_cut[4] = {0, 7, 20, 40};
static pl_tensor *cut(pl_tensor *t, int i) {
    pl_tensor *v = pl_tensor_narrow(t, 0, g_cut[i], g_cut[i + 1] - g_cut[i]);
    return v ? fresh(v) : NULL;
}
static pl_tensor *cat3(pl_tensor **t) {
    if (!t[0] || !t[1] || !t[2]) return NULL;
    return pl_concat(t, 3, 0);
}
static pl_tensor *c_adamw_multi(pl_tensor **in, const ocase *c) {
    pl_tensor *p[3], *g[3], *m[3], *v[3], *vm[3];
    pl_adamw_hyper h[3];
    for (int i = 0; i < 3; i++) {
        p[i] = cut(in[0], i), g[i] = cut(in[1], i), m[i] = cut(in[2], i), v[i] = cut(in[3], i),
        vm[i] = cut(in[4], i);
        if (!p[i] || !g[i] || !m[i] || !v[i] || !vm[i]) return NULL;
        h[i] = (pl_adamw_hyper){.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                .weight_decay = 0.1, .l2 = c->flag & 1, .amsgrad = c->flag & 2,
                                .step = 1 + 2 * i};
    }
    pl_tensor *fi = c->flag & 4 ? found_inf_on(in[0], c->flag) : NULL;
    if ((c->flag & 4) && !fi) return NULL;
    pl_tensor *n[3] = {NULL, NULL, NULL}; /* counted: steps 1, 3, 5 */
    for (int i = 0; i < 3 && (c->flag & 16); i++)
        if (!(n[i] = count_on(in[0], 2.0 * i))) return NULL;
    pl_optim_set_found_inf(fi);
    pl_status st = c->flag & 16 ? pl_adamw_step_multi_counted_(3, p, g, m, v, vm, n, h)
                                : pl_adamw_step_multi_(3, p, g, m, v, vm, h);
    pl_optim_set_found_inf(NULL);
    if (st) return NULL;
    pl_tensor *parts[5] = {cat3(p), cat3(m), cat3(v), cat3(vm), c->flag & 16 ? cat3(n) : NULL};
    return parts[0] && parts[1] && parts[2] && parts[3] && (parts[4] || !(c->flag & 16))
               ? pl_concat(parts, c->flag & 16 ? 5 : 4, 0)
               : NULL;
}
/* the middle parameter has no momentum buffer (plain SGD beside momentum) */
static pl_tensor *c_sgd_multi(pl_tensor **in, const ocase *c) {
    pl_tensor *p[3], *g[3], *b[3];
    pl_sgd_hyper h[3];
    for (int i = 0; i < 3; i++) {
        p[i] = cut(in[0], i), g[i] = cut(in[1], i), b[i] = cut(in[2], i);
        if (!p[i] || !g[i] || !b[i]) return NULL;
        h[i] = (pl_sgd_hyper){.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01,
                              .nesterov = c->flag & 1, .first = (c->flag & 2) && i == 0};
    }
    pl_tensor *bl[3] = {b[0], NULL, b[2]};
    pl_tensor *fi = c->flag & 4 ? found_inf_on(in[0], c->flag) : NULL;
    if ((c->flag & 4) && !fi) return NULL;
    /* counted: the first parameter's count from 0 (its first step), the
     * third's from 6; the middle one has no buffer and so no count */
    pl_tensor *n[3] = {NULL, NULL, NULL};
    if ((c->flag & 16) && (!(n[0] = count_on(in[0], 0.0)) || !(n[2] = count_on(in[0], 6.0))))
        return NULL;
    pl_optim_set_found_inf(fi);
    pl_status st = c->flag & 16 ? pl_sgd_step_multi_counted_(3, p, g, bl, n, h)
                                : pl_sgd_step_multi_(3, p, g, bl, h);
    pl_optim_set_found_inf(NULL);
    if (st) return NULL;
    pl_tensor *parts[4] = {cat3(p), cat3(b), n[0], n[2]};
    return parts[0] && parts[1] ? pl_concat(parts, c->flag & 16 ? 4 : 2, 0) : NULL;
}

/* The GradScaler's ops (ops.def's amp_unscale_multi, amp_update_scale): no
 * backward, so no numerical gradient check applies; the device's results
 * are compared with the CPU's. A 1-element f32 tensor of value v on like's
 * device. */
static pl_tensor *scalar_on(const pl_tensor *like, float v) {
    return pl_tensor_from_data(PL_F32, 1, (int64_t[]){1}, &v, like->device);
}
/* amp_unscale_multi over the [40] input cut into 7 + 13 + 20, inv_scale
 * c->par; flag 1: gradient 1 gets an inf, 2: gradient 2 a NaN (each then left
 * out of the result, which must be finite), 4: found_inf starts at 1 (never
 * cleared). Result: found_inf, then the finite gradients. */
static pl_tensor *c_amp_unscale(pl_tensor **in, const ocase *c) {
    pl_tensor *g[3];
    for (int i = 0; i < 3; i++)
        if (!(g[i] = cut(in[0], i))) return NULL;
    for (int i = 1; i < 3; i++) {
        if (!(c->flag & i)) continue;
        float v[20];
        int64_t n = g_cut[i + 1] - g_cut[i];
        for (int64_t e = 0; e < n; e++) v[e] = (float)(e - 3);
        v[n / 2] = i == 1 ? -INFINITY : NAN;
        if (!(g[i] = pl_tensor_from_data(PL_F32, 1, (int64_t[]){n}, v, in[0]->device))) return NULL;
    }
    pl_tensor *fi = scalar_on(in[0], c->flag & 4 ? 1.0f : 0.0f), *inv = scalar_on(in[0], (float)c->par);
    if (!fi || !inv || pl_amp_unscale_multi_(3, g, fi, inv)) return NULL;
    pl_tensor *parts[4] = {fi};
    int np = 1;
    for (int i = 0; i < 3; i++)
        if (!(c->flag & i)) parts[np++] = g[i]; /* i = 0: always */
    return pl_concat(parts, np, 0);
}
/* amp_update_scale from scale c->par, tracker c->flag >> 4, found_inf
 * (c->flag & 3: 0, 1, NaN), growth 2, backoff 0.5, interval 3. Result: the
 * scale and the tracker (as f32). */
static pl_tensor *c_amp_update(pl_tensor **in, const ocase *c) {
    pl_tensor *sc = scalar_on(in[0], (float)c->par);
    const float fv[3] = {0.0f, 1.0f, NAN};
    pl_tensor *fi = scalar_on(in[0], fv[c->flag & 3]);
    int32_t tr0 = c->flag >> 4;
    pl_tensor *tr = pl_tensor_from_data(PL_I32, 1, (int64_t[]){1}, &tr0, in[0]->device);
    if (!sc || !fi || !tr || pl_amp_update_scale_(sc, tr, fi, 2.0, 0.5, 3)) return NULL;
    pl_tensor *th = pl_tensor_to(tr, PL_I32, PL_CPU);
    if (!th) return NULL;
    pl_tensor *t32 = scalar_on(in[0], (float)*(const int32_t *)pl_tensor_data(th));
    pl_tensor *parts[2] = {sc, t32};
    return t32 ? pl_concat(parts, 2, 0) : NULL;
}
/* clip_grad_norm_'s foreach ops (ops.def's sum_squares_multi, mul_multi):
 * no backward. flag 0: the [40] input cut into 7 + 13 + 20 (one call);
 * flag 1: into 40 one-element tensors (two calls, 32 + 8); flag 2: the
 * three with an empty tensor between. sum_squares_multi's result: the total;
 * mul_multi's: the tensors, multiplied in place by c->par. */
static int foreach_list(pl_tensor **in, const ocase *c, pl_tensor **g) {
    int n = 0;
    for (int i = 0; i < (c->flag & 1 ? 40 : 3); i++) {
        g[n++] = c->flag & 1 ? fresh(pl_tensor_narrow(in[0], 0, i, 1)) : cut(in[0], i);
        if ((c->flag & 2) && i == 1) g[n++] = pl_tensor_empty(PL_F32, 1, (int64_t[]){0}, in[0]->device);
    }
    for (int i = 0; i < n; i++)
        if (!g[i]) return -1;
    return n;
}
static pl_tensor *c_sum_squares_multi(pl_tensor **in, const ocase *c) {
    pl_tensor *g[40];
    int n = foreach_list(in, c, g);
    return n < 0 ? NULL : pl_sum_squares_multi(n, g);
}
static pl_tensor *c_mul_multi(pl_tensor **in, const ocase *c) {
    pl_tensor *g[40], *s = scalar_on(in[0], (float)c->par);
    int n = foreach_list(in, c, g);
    if (n < 0 || !s || pl_mul_multi_(n, g, s)) return NULL;
    return pl_concat(g, n, 0);
}

static const ocase g_cases[] = {
    {PL_OP_COPY, "strided view [4,5][:,1:4] -> contiguous", 1, {{.nd = 2, .sh = {4, 5}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_F32, .grad = true, .strided = true}}, c_copy, true},
    {PL_OP_MATMUL, "[2,3,4] @ [4,5] (shared B)", 2, {F(3, 2, 3, 4), F(2, 4, 5)}, c_matmul, true},
    {PL_OP_MATMUL, "[2,3,4] @ [2,5,4]^T", 2, {F(3, 2, 3, 4), F(3, 2, 5, 4)}, c_matmul, true, .flag = 2},
    {PL_OP_MATMUL, "[4,3]^T @ [2,4,5] (shared A, trans_a)", 2, {F(2, 4, 3), F(3, 2, 4, 5)}, c_matmul, true, .flag = 1},
    {PL_OP_MATMUL, "[2,1,3,4] @ [1,2,4,5] (batch broadcast)", 2, {F(4, 2, 1, 3, 4), F(4, 1, 2, 4, 5)}, c_matmul, true},
    {PL_OP_MATMUL, "bf16 [3,8] @ [8,4]", 2, {FD(PL_BF16, 2, 3, 8), FD(PL_BF16, 2, 8, 4)}, c_matmul, true},
    {PL_OP_MATMUL, "bf16 [2,3,40] @ [2,5,40]^T", 2, {FD(PL_BF16, 3, 2, 3, 40), FD(PL_BF16, 3, 2, 5, 40)}, c_matmul, true, .flag = 2},
    {PL_OP_MATMUL, "f16 [3,8] @ [8,4]", 2, {FD(PL_F16, 2, 3, 8), FD(PL_F16, 2, 8, 4)}, c_matmul, true},
    {PL_OP_ADD, "[2,3,4] + [3,1]", 2, {F(3, 2, 3, 4), F(2, 3, 1)}, c_add, true},
    {PL_OP_SUB, "[3,1] - [2,1,4]", 2, {F(2, 3, 1), F(3, 2, 1, 4)}, c_sub, true},
    {PL_OP_MUL, "[2,3,4] * [4]", 2, {F(3, 2, 3, 4), F(1, 4)}, c_mul, true},
    {PL_OP_DIV, "[2,3] / [2,3]", 2, {F(2, 2, 3), FP(2, 2, 3)}, c_div, true},
    {PL_OP_DIV, "[2,3,4] / [1] broadcast", 2, {F(3, 2, 3, 4), FP(1, 1)}, c_div, true},
    /* half operands read by the kernels themselves where a backend says so
     * (cuda's half_native), widened by the core elsewhere: same bits */
    {PL_OP_ADD, "bf16 [2,3,4] + bf16 [3,1]", 2, {FD(PL_BF16, 3, 2, 3, 4), FD(PL_BF16, 2, 3, 1)}, c_add, true},
    {PL_OP_ADD, "bf16 [2,3,4] + f32 [4] (promotes)", 2, {FD(PL_BF16, 3, 2, 3, 4), F(1, 4)}, c_add, true},
    {PL_OP_SUB, "f16 [3,5] - f16 [3,5]", 2, {FD(PL_F16, 2, 3, 5), FD(PL_F16, 2, 3, 5)}, c_sub, true},
    {PL_OP_MUL, "bf16 [2,3,4] * bf16 [4]", 2, {FD(PL_BF16, 3, 2, 3, 4), FD(PL_BF16, 1, 4)}, c_mul, true},
    {PL_OP_DIV, "bf16 [2,3] / bf16 [2,3]", 2, {FD(PL_BF16, 2, 2, 3), FDP(PL_BF16, 2, 2, 3)}, c_div, true},
    {PL_OP_SCALE, "bf16 [3,5] * 1.5", 1, {FD(PL_BF16, 2, 3, 5)}, c_scale, true, .par = 1.5},
    {PL_OP_ADD_SCALAR, "f16 [3,5] + 0.25", 1, {FD(PL_F16, 2, 3, 5)}, c_add_scalar, true, .par = 0.25},
    {PL_OP_SCALE, "[3,5] * 1.5", 1, {F(2, 3, 5)}, c_scale, true, .par = 1.5},
    {PL_OP_ADD_SCALAR, "[3,5] + 0.25", 1, {F(2, 3, 5)}, c_add_scalar, true, .par = 0.25},
    {PL_OP_SUM, "dim 1 keepdim of [2,3,4]", 1, {F(3, 2, 3, 4)}, c_sum, true, .flag = 1, .par = 1},
    {PL_OP_SUM, "all of [2,3,4]", 1, {F(3, 2, 3, 4)}, c_sum, true, .flag = PL_ALL_DIMS},
    {PL_OP_MEAN, "dim -1 of [3,70]", 1, {F(2, 3, 70)}, c_mean, true, .flag = -1},
    {PL_OP_MEAN, "dim 0 of [40,33]", 1, {F(2, 40, 33)}, c_mean, true, .flag = 0},
    {PL_OP_RELU, "[4,5]", 1, {F(2, 4, 5)}, c_relu, true},
    {PL_OP_LEAKY_RELU, "[4,5] slope 0.1", 1, {F(2, 4, 5)}, c_leaky, true, .par = 0.1},
    {PL_OP_ELU, "[4,5] alpha 0.7", 1, {F(2, 4, 5)}, c_elu, true, .par = 0.7},
    {PL_OP_GELU, "[4,5] erf", 1, {F(2, 4, 5)}, c_gelu, true},
    {PL_OP_GELU, "[4,5] tanh", 1, {F(2, 4, 5)}, c_gelu, true, .flag = 1},
    {PL_OP_SILU, "[4,5]", 1, {F(2, 4, 5)}, c_silu, true},
    {PL_OP_SIGMOID, "[4,5]", 1, {F(2, 4, 5)}, c_sigmoid, true},
    {PL_OP_TANH, "[4,5]", 1, {F(2, 4, 5)}, c_tanh, true},
    {PL_OP_RELU, "bf16 [4,5]", 1, {FD(PL_BF16, 2, 4, 5)}, c_relu, true},
    {PL_OP_LEAKY_RELU, "bf16 [4,5] slope 0.1", 1, {FD(PL_BF16, 2, 4, 5)}, c_leaky, true, .par = 0.1},
    {PL_OP_ELU, "bf16 [4,5] alpha 0.7", 1, {FD(PL_BF16, 2, 4, 5)}, c_elu, true, .par = 0.7},
    {PL_OP_GELU, "bf16 [4,5] erf", 1, {FD(PL_BF16, 2, 4, 5)}, c_gelu, true},
    {PL_OP_GELU, "bf16 [4,5] tanh", 1, {FD(PL_BF16, 2, 4, 5)}, c_gelu, true, .flag = 1},
    {PL_OP_SILU, "bf16 [4,5]", 1, {FD(PL_BF16, 2, 4, 5)}, c_silu, true},
    {PL_OP_SIGMOID, "bf16 [4,5]", 1, {FD(PL_BF16, 2, 4, 5)}, c_sigmoid, true},
    {PL_OP_TANH, "bf16 [4,5]", 1, {FD(PL_BF16, 2, 4, 5)}, c_tanh, true},
    {PL_OP_SILU, "f16 [4,5]", 1, {FD(PL_F16, 2, 4, 5)}, c_silu, true},
    {PL_OP_EXP, "[4,5]", 1, {F(2, 4, 5)}, c_exp, true},
    {PL_OP_SWIGLU, "[3,70] gate, up", 2, {F(2, 3, 70), F(2, 3, 70)}, c_swiglu, true},
    {PL_OP_SWIGLU, "[3,70] frozen gate (d up only)", 2, {FN(2, 3, 70), F(2, 3, 70)}, c_swiglu, true},
    {PL_OP_SWIGLU, "bf16 [4,5] (silu rounded to bf16)", 2, {FD(PL_BF16, 2, 4, 5), FD(PL_BF16, 2, 4, 5)}, c_swiglu, true},
    {PL_OP_LOG, "[4,5] positive", 1, {FP(2, 4, 5)}, c_log, true},
    {PL_OP_SQUARE, "[4,5]", 1, {F(2, 4, 5)}, c_square, true},
    {PL_OP_SQRT, "[4,5] positive", 1, {FP(2, 4, 5)}, c_sqrt, true},
    {PL_OP_SOFTMAX, "[3,7]", 1, {F(2, 3, 7)}, c_softmax, true},
    {PL_OP_SOFTMAX, "[2,300] (multi-warp rows)", 1, {F(2, 2, 300)}, c_softmax, true},
    {PL_OP_LOG_SOFTMAX, "[3,7]", 1, {F(2, 3, 7)}, c_log_softmax, true},
    /* backward from the saved output (in[2]; the input is a stub), also
     * across the warps of a row and through the bf16 casts */
    {PL_OP_LOG_SOFTMAX, "[2,300] (multi-warp rows)", 1, {F(2, 2, 300)}, c_log_softmax, true},
    {PL_OP_SOFTMAX, "bf16 [3,7]", 1, {FD(PL_BF16, 2, 3, 7)}, c_softmax, true},
    {PL_OP_EXP, "bf16 [4,5]", 1, {FD(PL_BF16, 2, 4, 5)}, c_exp, true},
    {PL_OP_CROSS_ENTROPY, "[5,4], one ignored, smoothing 0.1", 2, {F(2, 5, 4), I(1, SH(5), 1, 3, -100, 0, 2)}, c_ce, true, .par = 0.1},
    /* the head and its loss fused: a device that does not promise the op
     * (CUDA) runs the chain matmul + cross_entropy, the same values */
    {PL_OP_LINEAR_CROSS_ENTROPY, "x [7,5], W [13,5], one ignored", 3, {F(2, 7, 5), F(2, 13, 5), I(1, SH(7), 3, -100, 12, 0, 7, 1, 9)}, c_lce, true},
    {PL_OP_LINEAR_CROSS_ENTROPY, "x [20,9], W [301,9], smoothing 0.1", 3, {F(2, 20, 9), F(2, 301, 9), I(1, SH(20), 5, 300, 0, 17, 250, 3, -100, 44, 99, 1, 2, 3, 200, 201, 7, 8, 9, 10, 11, 12)}, c_lce, true, .par = 0.1},
    {PL_OP_LINEAR_CROSS_ENTROPY, "x [1,4], W [3,4]", 3, {F(2, 1, 4), F(2, 3, 4), I(1, SH(1), 2)}, c_lce, true},
    {PL_OP_MSE, "[3,4]", 2, {F(2, 3, 4), F(2, 3, 4)}, c_mse, true},
    {PL_OP_MAE, "[3,4]", 2, {F(2, 3, 4), F(2, 3, 4)}, c_mae, true},
    {PL_OP_HUBER, "[3,4] delta 0.8", 2, {F(2, 3, 4), F(2, 3, 4)}, c_huber, true, .par = 0.8},
    {PL_OP_EMBEDDING, "[6,3] by [2,3]", 2, {F(2, 6, 3), I(2, SH(2, 3), 5, 0, 2, 2, 5, 1)}, c_embedding, true},
    {PL_OP_INDEX_SELECT, "[4,5] dim 1 by [3]", 2, {F(2, 4, 5), I(1, SH(3), 4, 0, 4)}, c_index_select, true, .flag = 1},
    {PL_OP_GATHER, "[3,4] dim 1 by [3,2]", 2, {F(2, 3, 4), I(2, SH(3, 2), 3, 0, 1, 1, 2, 0)}, c_gather, true, .flag = 1},
    {PL_OP_SCATTER_ADD, "[5,3] dim 0 into 4", 2, {F(2, 5, 3), I(1, SH(5), 2, 0, 2, 3, 0)}, c_scatter_add, true, .par = 4},
    {PL_OP_SEGMENT_SOFTMAX, "[6,2] in 3 segments", 2, {F(2, 6, 2), I(1, SH(6), 0, 2, 0, 1, 2, 2)}, c_segment_softmax, true, .par = 3},
    {PL_OP_LAYER_NORM, "[3,8] + w + b", 3, {F(2, 3, 8), F(1, 8), F(1, 8)}, c_layer_norm, true},
    {PL_OP_LAYER_NORM, "[2,300] no affine", 1, {F(2, 2, 300)}, c_layer_norm, true},
    {PL_OP_RMS_NORM, "[3,8] + w", 2, {F(2, 3, 8), F(1, 8)}, c_rms_norm, true},
    {PL_OP_RMS_NORM, "bf16 [3,64] + w", 2, {FD(PL_BF16, 2, 3, 64), FD(PL_BF16, 1, 64)}, c_rms_norm, true},
    {PL_OP_RMS_NORM, "bf16 [3,64] + f32 w", 2, {FD(PL_BF16, 2, 3, 64), F(1, 64)}, c_rms_norm, true},
    {PL_OP_RMS_NORM, "bf16 [2,300] + frozen bf16 w", 2, {FD(PL_BF16, 2, 2, 300), {.nd = 1, .sh = {300}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_BF16, .grad = false}}, c_rms_norm, true},
    {PL_OP_DROPOUT, "[4,17] p 0.3 (masks must match)", 1, {F(2, 4, 17)}, c_dropout, true, 1e-6, 1e-6, .par = 0.3},
    {PL_OP_CONCAT, "[2,3] | [2,2] dim 1", 2, {F(2, 2, 3), F(2, 2, 2)}, c_concat, true, .flag = 1},
    {PL_OP_SLICE, "[4,5] dim 1 [1,4)", 1, {F(2, 4, 5)}, c_slice, true, .flag = 1},
    {PL_OP_PERMUTE, "[2,3,4] perm (2,0,1)", 1, {F(3, 2, 3, 4)}, c_permute, true},
    {PL_OP_RESHAPE, "[2,3,4] -> [6,4]", 1, {F(3, 2, 3, 4)}, c_reshape, true},
    {PL_OP_ROPE, "[1,3,2,4] offset 3", 1, {F(4, 1, 3, 2, 4)}, c_rope, true},
    {PL_OP_CAUSAL_SOFTMAX, "[2,3,5] scale 0.5", 1, {F(3, 2, 3, 5)}, c_causal, true, .par = 0.5},
    {PL_OP_CAUSAL_SOFTMAX, "bf16 [2,4,6] scale 0.5", 1, {FD(PL_BF16, 3, 2, 4, 6)}, c_causal, true, .par = 0.5},
    /* fused attention: grouped-query heads, the last T of L queries, a bias;
     * L 70 > the CUDA kernel's tiles (32 keys, 64 rows per block) */
    {PL_OP_ATTENTION, "q [2,4,5,8], k, v [2,2,7,8], causal, bias [2,1,1,7]", 4, {F(4, 2, 4, 5, 8), F(4, 2, 2, 7, 8), F(4, 2, 2, 7, 8), FN(4, 2, 1, 1, 7)}, c_attention, true, .flag = 1, .par = 0.35},
    {PL_OP_ATTENTION, "q, k, v [1,2,70,16], causal", 3, {F(4, 1, 2, 70, 16), F(4, 1, 2, 70, 16), F(4, 1, 2, 70, 16)}, c_attention, true, .flag = 1, .par = 0.25},
    /* causal with L - T = 34 over two query and four key blocks: the dK / dV kernel's first
     * query tile of a key block (i_start), a per-batch bias, two query heads per kv head */
    {PL_OP_ATTENTION, "q [2,4,66,8], k, v [2,2,100,8], causal, bias [2,1,1,100]", 4, {F(4, 2, 4, 66, 8), F(4, 2, 2, 100, 8), F(4, 2, 2, 100, 8), FN(4, 2, 1, 1, 100)}, c_attention, true, .flag = 1, .par = 0.35},
    {PL_OP_ATTENTION, "q [1,2,4,8], k, v [1,2,6,8], not causal", 3, {F(4, 1, 2, 4, 8), F(4, 1, 2, 6, 8), F(4, 1, 2, 6, 8)}, c_attention, true, .par = 0.35},
    {PL_OP_ATTENTION, "f16 q, k, v [1,2,5,8], causal, f16 bias [1,1,1,5]", 4, {FD(PL_F16, 4, 1, 2, 5, 8), FD(PL_F16, 4, 1, 2, 5, 8), FD(PL_F16, 4, 1, 2, 5, 8), {.nd = 4, .sh = {1, 1, 1, 5}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_F16, .grad = false}}, c_attention, true, .flag = 1, .par = 0.35},
    {PL_OP_ATTENTION, "bf16 q [1,4,3,8], k, v [1,1,6,8] (MQA), causal", 3, {FD(PL_BF16, 4, 1, 4, 3, 8), FD(PL_BF16, 4, 1, 1, 6, 8), FD(PL_BF16, 4, 1, 1, 6, 8)}, c_attention, true, .flag = 1, .par = 0.35},
    {PL_OP_CAST, "f32 -> bf16", 1, {F(2, 3, 5)}, c_cast, true, 1e-6, 1e-6, .flag = PL_BF16},
    {PL_OP_CAST, "f32 -> f16", 1, {F(2, 3, 5)}, c_cast, true, 1e-6, 1e-6, .flag = PL_F16},
    {PL_OP_CAST, "bf16 -> f32", 1, {FD(PL_BF16, 2, 3, 5)}, c_cast, true, 1e-6, 1e-6, .flag = PL_F32},
    {PL_OP_CAST, "bf16 -> f16", 1, {FD(PL_BF16, 2, 3, 5)}, c_cast, true, 1e-6, 1e-6, .flag = PL_F16},
    {PL_OP_CAST, "f16 -> bf16", 1, {FD(PL_F16, 2, 3, 5)}, c_cast, true, 1e-6, 1e-6, .flag = PL_BF16},
    {PL_OP_LORA_ADD, "y [2,3,6] + lora x [2,3,5] A [4,5] B [6,4] gexp [2,3,4]", 5, {F(3, 2, 3, 6), F(3, 2, 3, 5), F(2, 4, 5), F(2, 6, 4), F(3, 2, 3, 4)}, c_lora_add, true, .par = 0.5},
    {PL_OP_LORA_ADD, "gexp [2,1,4] per row over x [2,3,5]", 5, {F(3, 2, 3, 6), F(3, 2, 3, 5), F(2, 4, 5), F(2, 6, 4), F(3, 2, 1, 4)}, c_lora_add, true, .par = 2.0},
    {PL_OP_LORA_ADD, "plain LoRA, frozen x [7,40], rank 8", 4, {F(2, 7, 48), FN(2, 7, 40), F(2, 8, 40), F(2, 48, 8)}, c_lora_add, true, .par = 0.25},
    {PL_OP_LORA_ADD, "no y (the branch alone), gexp [3,1,4]", 4, {F(3, 3, 2, 5), F(2, 4, 5), F(2, 6, 4), F(3, 3, 1, 4)}, c_lora_add, true, .flag = 1, .par = 1.5},
    {PL_OP_LORA_ADD, "bf16 y, x, A, B, f32 gexp [2,3,4]", 5, {FD(PL_BF16, 3, 2, 3, 6), FD(PL_BF16, 3, 2, 3, 5), FD(PL_BF16, 2, 4, 5), FD(PL_BF16, 2, 6, 4), F(3, 2, 3, 4)}, c_lora_add, true, .par = 0.5},
    {PL_OP_LORA_ADD, "f32 y + f16 lora, f16 gexp [2,1,4]", 5, {F(3, 2, 3, 6), FD(PL_F16, 3, 2, 3, 5), FD(PL_F16, 2, 4, 5), FD(PL_F16, 2, 6, 4), FD(PL_F16, 3, 2, 1, 4)}, c_lora_add, true, .par = 0.5},
    /* dropout of x inside the op: x [3,7,24] = 504 elements, more than one
     * block of the CPU's 16-lane Philox draws, with a partial group of 4 */
    {PL_OP_LORA_ADD, "dropout 0.3: y [3,7,6] + lora x [3,7,24] A [4,24] B [6,4] gexp [3,7,4]", 5, {F(3, 3, 7, 6), F(3, 3, 7, 24), F(2, 4, 24), F(2, 6, 4), F(3, 3, 7, 4)}, c_lora_add, true, .flag = 2, .par = 0.5},
    {PL_OP_LORA_ADD, "dropout 0.3, no y, x [5,9] (45: a partial group), plain", 3, {F(2, 5, 9), F(2, 4, 9), F(2, 6, 4)}, c_lora_add, true, .flag = 3, .par = 1.5},
    {PL_OP_LORA_ADD, "dropout 0.3 under bf16 autocast: f32 y, x [2,3,5], A, B, gexp [2,3,4]", 5, {F(3, 2, 3, 6), F(3, 2, 3, 5), F(2, 4, 5), F(2, 6, 4), F(3, 2, 3, 4)}, c_lora_add, true, 3e-2, 1e-2, .flag = 6, .par = 0.5},
    {PL_OP_LORA_ADD, "dropout 0.3, bf16 y, x, A, B, f32 gexp [2,1,4]", 5, {FD(PL_BF16, 3, 2, 3, 6), FD(PL_BF16, 3, 2, 3, 5), FD(PL_BF16, 2, 4, 5), FD(PL_BF16, 2, 6, 4), F(3, 2, 1, 4)}, c_lora_add, true, .flag = 2, .par = 0.5},
    {PL_OP_NF4_MATMUL, "[2,64] @ nf4[3,64]^T", 2, {F(2, 2, 64), FN(2, 3, 64)}, c_nf4, true},
    {PL_OP_NF4_QUANTIZE, "f32 [40,96] block 64, double quant", 1, {FN(2, 40, 96)}, c_nf4_quant, false, .flag = 64},
    {PL_OP_NF4_QUANTIZE, "bf16 [5,77] block 63 (blocks share bytes)", 1, {{.nd = 2, .sh = {5, 77}, .kind = 'f', .lo = -2, .hi = 2, .dt = PL_BF16, .grad = false}}, c_nf4_quant, false, .flag = 63},
    {PL_OP_LSTM, "B2 T3 In4 H2", 5, {F(3, 2, 3, 4), F(2, 8, 4), F(2, 8, 2), F(1, 8), F(1, 8)}, c_lstm, true},
    {PL_OP_LSTM, "reverse", 5, {F(3, 2, 3, 4), F(2, 8, 4), F(2, 8, 2), F(1, 8), F(1, 8)}, c_lstm, true, .flag = 1},
    /* several blocks per element pass on a GPU (B*H = 280); the cuda backend's native
     * lstm (cuda_lstm_native.cu) through PL_CUDA_LSTM, its default (auto) being cuDNN
     * outside a graph capture */
    {PL_OP_LSTM, "B4 T5 In6 H70", 5, {FR(-1, 1, 3, 4, 5, 6), FR(-0.3, 0.3, 2, 280, 6), FR(-0.3, 0.3, 2, 280, 70), F(1, 280), F(1, 280)}, c_lstm, true},
    {PL_OP_LSTM, "B2 T3 In4 H2, PL_CUDA_LSTM=native", 5, {F(3, 2, 3, 4), F(2, 8, 4), F(2, 8, 2), F(1, 8), F(1, 8)}, c_lstm, true, .env = "PL_CUDA_LSTM=native"},
    {PL_OP_LSTM, "reverse, PL_CUDA_LSTM=native", 5, {F(3, 2, 3, 4), F(2, 8, 4), F(2, 8, 2), F(1, 8), F(1, 8)}, c_lstm, true, .flag = 1, .env = "PL_CUDA_LSTM=native"},
    {PL_OP_LSTM, "B4 T5 In6 H70 rev, PL_CUDA_LSTM=native", 5, {FR(-1, 1, 3, 4, 5, 6), FR(-0.3, 0.3, 2, 280, 6), FR(-0.3, 0.3, 2, 280, 70), F(1, 280), F(1, 280)}, c_lstm, true, .flag = 1, .env = "PL_CUDA_LSTM=native"},
    {PL_OP_CLAMP, "[3,5] to [-1,1]", 1, {F(2, 3, 5)}, c_clamp, true, .par = 1.0},
    {PL_OP_ADAMW_STEP, "AdamW [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false},
    {PL_OP_ADAMW_STEP, "Adam l2 amsgrad [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 3},
    {PL_OP_SGD_STEP, "momentum [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false},
    {PL_OP_SGD_STEP, "nesterov first [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 3},
    {PL_OP_ADAMW_STEP, "AdamW found_inf NaN: skipped [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 4},
    {PL_OP_ADAMW_STEP, "AdamW found_inf 0: updates [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 12},
    {PL_OP_SGD_STEP, "momentum found_inf NaN: skipped [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 4},
    {PL_OP_SGD_STEP, "momentum found_inf 0: updates [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 8 | 4},
    {PL_OP_ADAMW_STEP_MULTI, "AdamW [7]+[13]+[20], steps 1,3,5", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false},
    {PL_OP_ADAMW_STEP_MULTI, "Adam l2 amsgrad [7]+[13]+[20]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 3},
    {PL_OP_ADAMW_STEP_MULTI, "AdamW found_inf NaN: skipped [7]+[13]+[20]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 4},
    {PL_OP_ADAMW_STEP_MULTI, "AdamW found_inf 0: updates [7]+[13]+[20]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 12},
    {PL_OP_SGD_STEP_MULTI, "momentum, [13] none [7]+[13]+[20]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false},
    {PL_OP_SGD_STEP_MULTI, "nesterov first [7]+[13]+[20]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false, .flag = 3},
    {PL_OP_SGD_STEP_MULTI, "momentum found_inf NaN: skipped", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false, .flag = 4},
    {PL_OP_SGD_STEP_MULTI, "momentum found_inf 0: updates", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false, .flag = 8 | 4},
    /* counted calls (the step count on the device, appended to the result) */
    {PL_OP_ADAMW_STEP, "AdamW counted, 2 -> 3 [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 16},
    {PL_OP_ADAMW_STEP, "Adam l2 amsgrad counted, found_inf 0 [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 16 | 12 | 3},
    {PL_OP_ADAMW_STEP, "AdamW counted, found_inf NaN [40]", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw, false, .flag = 16 | 4},
    {PL_OP_SGD_STEP, "momentum counted, 0 -> 1: first [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 16 | 2},
    {PL_OP_SGD_STEP, "nesterov counted, 4 -> 5 [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 16 | 1},
    {PL_OP_SGD_STEP, "momentum counted, found_inf NaN [40]", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd, false, .flag = 16 | 4 | 2},
    {PL_OP_ADAMW_STEP_MULTI, "AdamW counted [7]+[13]+[20], 0,2,4->1,3,5", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 16},
    {PL_OP_ADAMW_STEP_MULTI, "Adam l2 amsgrad counted, found_inf 0", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 16 | 12 | 3},
    {PL_OP_ADAMW_STEP_MULTI, "AdamW counted, found_inf NaN: counts stay", 5, {FN(1, 40), FN(1, 40), FN(1, 40), FP(1, 40), FP(1, 40)}, c_adamw_multi, false, .flag = 16 | 4},
    {PL_OP_SGD_STEP_MULTI, "momentum counted, [13] none, counts 0, 6", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false, .flag = 16},
    {PL_OP_SGD_STEP_MULTI, "momentum counted, found_inf NaN: counts stay", 3, {FN(1, 40), FN(1, 40), FN(1, 40)}, c_sgd_multi, false, .flag = 16 | 4},
    {PL_OP_AMP_UNSCALE_MULTI, "[7]+[13]+[20] x 1/1024, finite", 1, {FN(1, 40)}, c_amp_unscale, false, .par = 1.0 / 1024},
    {PL_OP_AMP_UNSCALE_MULTI, "[7]+[13]+[20] x 3, an inf in [13]", 1, {FN(1, 40)}, c_amp_unscale, false, .flag = 1, .par = 3.0},
    {PL_OP_AMP_UNSCALE_MULTI, "x 0.5, an inf in [13], a NaN in [20]", 1, {FN(1, 40)}, c_amp_unscale, false, .flag = 3, .par = 0.5},
    {PL_OP_AMP_UNSCALE_MULTI, "inv_scale 1, found_inf already 1: kept", 1, {FN(1, 40)}, c_amp_unscale, false, .flag = 4, .par = 1.0},
    {PL_OP_AMP_UPDATE_SCALE, "finite, tracker 0 -> 1", 1, {FN(1, 1)}, c_amp_update, false, .par = 1024},
    {PL_OP_AMP_UPDATE_SCALE, "finite, tracker 2 -> grow x2", 1, {FN(1, 1)}, c_amp_update, false, .flag = 2 << 4, .par = 1024},
    {PL_OP_AMP_UPDATE_SCALE, "found_inf 1: back off", 1, {FN(1, 1)}, c_amp_update, false, .flag = 1 | (2 << 4), .par = 1024},
    {PL_OP_AMP_UPDATE_SCALE, "found_inf NaN: back off", 1, {FN(1, 1)}, c_amp_update, false, .flag = 2, .par = 3.0},
    {PL_OP_AMP_UPDATE_SCALE, "growth to inf: scale kept", 1, {FN(1, 1)}, c_amp_update, false, .flag = 2 << 4, .par = 3e38},
    {PL_OP_TOPK, "f32 [6,37] k 5", 1, {FN(2, 6, 37)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .par = 5},
    {PL_OP_TOPK, "f32 [3,300] k 1", 1, {FN(2, 3, 300)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .par = 1},
    /* V 700 > the CUDA kernel's 256 threads, 20 rounds of its block argmax */
    {PL_OP_TOPK, "f32 [3,700] k 20", 1, {FN(2, 3, 700)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .par = 20},
    {PL_OP_TOPK, "bf16 [4,50] k 9", 1, {FD(PL_BF16, 2, 4, 50)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .par = 9},
    {PL_OP_TOPK, "[5,40] ties and -inf, k 12", 1, {FN(2, 5, 40)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .flag = 1, .par = 12},
    {PL_OP_TOPK, "[4,23] ties, -inf, NaN, k = V", 1, {FN(2, 4, 23)}, c_topk, false, .atol = 1e-30, .rtol = 1e-30, .flag = 3, .par = 23},
    {PL_OP_SUM_SQUARES_MULTI, "[7]+[13]+[20]", 1, {FN(1, 40)}, c_sum_squares_multi, false},
    {PL_OP_SUM_SQUARES_MULTI, "40 x [1]: 32 + 8", 1, {FN(1, 40)}, c_sum_squares_multi, false, .flag = 1},
    {PL_OP_SUM_SQUARES_MULTI, "[7]+[13]+[0]+[20]", 1, {FN(1, 40)}, c_sum_squares_multi, false, .flag = 2},
    {PL_OP_MUL_MULTI, "[7]+[13]+[20] x 0.37", 1, {FN(1, 40)}, c_mul_multi, false, .par = 0.37},
    {PL_OP_MUL_MULTI, "40 x [1]: 32 + 8, x -3", 1, {FN(1, 40)}, c_mul_multi, false, .flag = 1, .par = -3.0},
    {PL_OP_MUL_MULTI, "[7]+[13]+[0]+[20] x 0.5", 1, {FN(1, 40)}, c_mul_multi, false, .flag = 2, .par = 0.5},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

/* ---- running a case ------------------------------------------------------------ */

typedef struct result {
    pl_status st;
    char msg[512];
    bool in_backward;         /* the failure (st, msg) came from the backward */
    pl_tensor *out;           /* CPU copy (f32 for float outputs) */
    pl_tensor *grad[MAX_IN];  /* CPU f32 copies of input grads, NULL if none */
} result;

static void result_free(result *r) {
    pl_tensor_release(r->out);
    for (int i = 0; i < MAX_IN; i++) pl_tensor_release(r->grad[i]);
    memset(r, 0, sizeof *r);
}

/* Host tensor of input i of case c (deterministic: seed from case and input).
 * Called inside a frame, which owns the result. */
static pl_tensor *make_host(const ocase *c, int ci, int i) {
    const tin *t = &c->in[i];
    if (t->kind == 'f') return pl_test_rand(t->nd, t->sh, t->lo, t->hi, 1000u + 17u * ci + i);
    int64_t n = 1;
    for (int d = 0; d < t->nd; d++) n *= t->sh[d];
    int64_t v[24];
    for (int64_t k = 0; k < n && k < 24; k++) v[k] = t->vals[k]; /* one listed value per element */
    return pl_tensor_from_data(PL_I64, t->nd, t->sh, v, PL_CPU);
}

static bool set_fail(result *r, const char *what) {
    r->st = pl_error_status() ? pl_error_status() : PL_ERR_INTERNAL;
    snprintf(r->msg, sizeof r->msg, "%s: %s", what, pl_error_message());
    return false;
}

static bool run_case_(const ocase *c, int ci, pl_device dev, result *r);

/* run_case_ with the case's environment variable set on the device side */
static bool run_case(const ocase *c, int ci, pl_device dev, result *r) {
    char name[64] = "";
    const char *eq = c->env ? strchr(c->env, '=') : NULL;
    if (eq && dev.type != PL_DEVICE_CPU) {
        snprintf(name, sizeof name, "%.*s", (int)(eq - c->env), c->env);
        ck_assert_int_eq(setenv(name, eq + 1, 1), 0);
    }
    bool ok = run_case_(c, ci, dev, r);
    if (name[0]) unsetenv(name);
    return ok;
}

static bool run_case_(const ocase *c, int ci, pl_device dev, result *r) {
    memset(r, 0, sizeof *r);
    pl_error_clear();
    bool ok = true;
    pl_frame_begin();
    pl_tensor *in[MAX_IN] = {0};
    for (int i = 0; i < c->n_in && ok; i++) {
        pl_tensor *h = make_host(c, ci, i);
        if (!h) {
            ok = set_fail(r, "input");
            break;
        }
        pl_dtype dt = c->in[i].kind == 'f' ? c->in[i].dt : PL_I64;
        in[i] = pl_tensor_to(h, dt, dev); /* h and in[i] belong to the frame */
        if (in[i] && c->in[i].strided) /* the view is the leaf: its gradient is compared */
            in[i] = pl_tensor_narrow(in[i], c->in[i].nd - 1, 1, 3);
        if (!in[i]) {
            ok = set_fail(r, "copy input to device");
            break;
        }
        if (c->in[i].kind == 'f' && c->in[i].grad && c->bwd) pl_tensor_set_requires_grad(in[i], true);
    }
    pl_tensor *out = ok ? c->fn(in, c) : NULL;
    if (ok && !out) ok = set_fail(r, "forward");
    if (ok && c->bwd && out->requires_grad) {
        pl_tensor *o32 = out->dtype == PL_F32 ? out : pl_cast(out, PL_F32);
        pl_tensor *rh = pl_test_rand(out->ndim, out->shape, -1, 1, 99);
        pl_tensor *rw = rh ? pl_tensor_to(rh, PL_F32, dev) : NULL;
        pl_tensor *loss = pl_sum(pl_mul(o32, rw), PL_ALL_DIMS, false);
        if (!loss || pl_backward(loss, 1.0)) {
            ok = set_fail(r, "backward");
            r->in_backward = true;
        }
    }
    if (ok) {
        pl_dtype odt = pl_dtype_is_float(out->dtype) ? PL_F32 : out->dtype;
        r->out = pl_tensor_retain(pl_tensor_to(out, odt, PL_CPU));
        if (!r->out) ok = set_fail(r, "copy output to CPU");
        for (int i = 0; i < c->n_in && ok; i++)
            if (in[i]->grad) {
                r->grad[i] = pl_tensor_retain(pl_tensor_to(in[i]->grad, PL_F32, PL_CPU));
                if (!r->grad[i]) ok = set_fail(r, "copy gradient to CPU");
            }
    }
    pl_tape_clear();
    pl_frame_end();
    if (!ok) {
        pl_tensor_release(r->out);
        r->out = NULL;
        for (int i = 0; i < MAX_IN; i++) {
            pl_tensor_release(r->grad[i]);
            r->grad[i] = NULL;
        }
    }
    return ok;
}

/* How far a device tensor is from the CPU's: max |a - b|, max |a - b| / |b|
 * over the elements with |b| > REL_FLOOR (below it a relative error says
 * nothing; the absolute term of the tolerance covers them), and the first
 * element outside atol + rtol |b|. */
#define REL_FLOOR 1e-3

typedef struct errs {
    double max_abs, max_rel;
    bool ok;
    char msg[256]; /* the first element outside the tolerance, or why not comparable */
} errs;

static void errs_init(errs *e) {
    memset(e, 0, sizeof *e);
    e->ok = true;
}

static void compare(const char *what, const pl_tensor *a, const pl_tensor *b, double atol,
                    double rtol, errs *e) {
    if (!a || !b) {
        if (e->ok) snprintf(e->msg, sizeof e->msg, "%s: present on one backend only", what);
        e->ok = false;
        return;
    }
    if (pl_tensor_numel(a) != pl_tensor_numel(b) || a->ndim != b->ndim) {
        if (e->ok) snprintf(e->msg, sizeof e->msg, "%s: shapes differ", what);
        e->ok = false;
        return;
    }
    for (int64_t i = 0; i < pl_tensor_numel(a); i++) {
        double x = pl_tensor_get(a, i), y = pl_tensor_get(b, i);
        if (isnan(x) && isnan(y)) continue;
        double d = fabs(x - y);
        if (isnan(d)) d = INFINITY;
        if (d > e->max_abs) e->max_abs = d;
        if (fabs(y) > REL_FLOOR && d / fabs(y) > e->max_rel) e->max_rel = d / fabs(y);
        if (!(d <= atol + rtol * fabs(y))) {
            if (e->ok)
                snprintf(e->msg, sizeof e->msg, "%s[%lld]: %.7g vs CPU %.7g", what, (long long)i, x,
                         y);
            e->ok = false;
        }
    }
}

/* Bit-for-bit equality (the CPU reruns). */
static bool identical(const char *what, const pl_tensor *a, const pl_tensor *b, char *msg,
                      size_t n) {
    errs e;
    errs_init(&e);
    compare(what, a, b, 0, 0, &e);
    if (!e.ok) snprintf(msg, n, "%s", e.msg);
    return e.ok;
}

static bool all_finite(const pl_tensor *t) {
    if (!t || !pl_dtype_is_float(t->dtype)) return true;
    for (int64_t i = 0; i < pl_tensor_numel(t); i++)
        if (!isfinite(pl_tensor_get(t, i))) return false;
    return true;
}

/* Whether ops.def's row of op says it has a backward. */
static bool is_differentiable(pl_op op) {
    const pl_op_row *r = pl_op_row_of(op);
    return r && r->bwd;
}

/* ---- tests ------------------------------------------------------------------------ */

/* Coverage from the table: every op of pipeline/ops.def has a CPU forward
 * kernel, and a CPU backward kernel exactly when its row says it has a
 * backward. */
START_TEST(cpu_kernels_complete) {
    const pl_backend *cpu = pl_backend_cpu();
    ck_assert_ptr_nonnull(cpu);
    int missing = 0;
    char list[1024] = "";
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        bool f = pl_backend_supports(cpu, (pl_op)op, false),
             b = pl_backend_supports(cpu, (pl_op)op, true);
        ck_assert_msg(!b || is_differentiable((pl_op)op),
                      "op %s has a CPU backward kernel, but ops.def says it has no backward",
                      pl_op_name((pl_op)op));
        if (!f || (is_differentiable((pl_op)op) && !b)) {
            missing++;
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, " %s(%s%s)", pl_op_name((pl_op)op), f ? "" : "fwd",
                     b ? "" : (f ? "bwd" : ",bwd"));
        }
    }
    ck_assert_msg(missing == 0, "ops without CPU kernels:%s", list);
    /* and every op has at least one conformance case, with a backward one
     * when ops.def says it has a backward: a fwd and a bwd row in the
     * device table; and no case runs a backward the table does not have */
    for (int i = 0; i < N_CASES; i++)
        ck_assert_msg(!g_cases[i].bwd || is_differentiable(g_cases[i].op),
                      "case %s (%s) runs a backward; ops.def says the op has none",
                      pl_op_name(g_cases[i].op), g_cases[i].what);
    for (int op = PL_OP_NONE + 1; op < PL_OP_COUNT; op++) {
        bool has = false, has_bwd = false;
        for (int i = 0; i < N_CASES; i++)
            if ((int)g_cases[i].op == op) {
                has = true;
                has_bwd = has_bwd || g_cases[i].bwd;
            }
        ck_assert_msg(has, "op %s has no conformance case", pl_op_name((pl_op)op));
        ck_assert_msg(has_bwd || !is_differentiable((pl_op)op),
                      "op %s has no conformance case with backward", pl_op_name((pl_op)op));
    }
}
END_TEST

/* The CPU reference itself: each case runs, gives finite values and the same
 * bits when run twice. */
START_TEST(cpu_reference_sane) {
    int bad = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        const ocase *c = &g_cases[ci];
        result r1, r2;
        bool ok1 = run_case(c, ci, PL_CPU, &r1), ok2 = ok1 && run_case(c, ci, PL_CPU, &r2);
        char msg[512] = "";
        bool ok = ok1 && ok2;
        if (!ok1 || !ok2)
            snprintf(msg, sizeof msg, "%s", ok1 ? r2.msg : r1.msg);
        else if (!all_finite(r1.out))
            snprintf(msg, sizeof msg, "non-finite output"), ok = false;
        else if (!identical("out (rerun)", r1.out, r2.out, msg, sizeof msg))
            ok = false;
        for (int i = 0; ok && i < c->n_in; i++) {
            bool want = c->bwd && c->in[i].kind == 'f' && c->in[i].grad;
            if (want && !r1.grad[i]) {
                snprintf(msg, sizeof msg, "input %d got no gradient", i);
                ok = false;
            } else if (r1.grad[i] && !all_finite(r1.grad[i])) {
                snprintf(msg, sizeof msg, "non-finite gradient of input %d", i);
                ok = false;
            } else if (r1.grad[i] &&
                       !identical("grad (rerun)", r1.grad[i], r2.grad[i], msg, sizeof msg))
                ok = false;
        }
        if (!ok) {
            bad++;
            fprintf(stderr, "FAIL cpu %-16s %-40s %s\n", pl_op_name(c->op), c->what, msg);
        }
        if (ok1) result_free(&r1);
        if (ok2) result_free(&r2);
    }
    ck_assert_msg(bad == 0, "%d CPU reference cases failed (see stderr)", bad);
}
END_TEST

/* The found_inf cases on the CPU reference itself: NaN leaves parameter and
 * state exactly as they were, 0 updates them (so the device rows, which are
 * compared to these, test that a backend's kernel reads the flag). */
START_TEST(found_inf_skips_the_optimizer_update) {
    pl_frame_begin();
    pl_tensor *in[5];
    for (int i = 0; i < 5; i++) /* v and max v (3, 4) positive */
        in[i] = i >= 3 ? pl_test_rand(PL_SHAPE(40), 0.5, 2, 100 + i) : pl_test_randn(PL_SHAPE(40), 100 + i);
    for (int k = 0; k < 4; k++) { /* adamw, sgd, their multi-tensor forms */
        int which = k & 1;
        case_fn f = k == 0 ? c_adamw : k == 1 ? c_sgd : k == 2 ? c_adamw_multi : c_sgd_multi;
        ocase skip = {.flag = 4}, upd = {.flag = 12};
        pl_tensor *a = f(in, &skip);
        pl_tensor *b = f(in, &upd);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(b);
        pl_tensor *parts[4] = {in[0], in[2], in[3], in[4]};
        pl_tensor *before = pl_concat(parts, which ? 2 : 4, 0);
        ck_assert_double_eq(pl_test_max_abs_diff(a, before), 0.0);
        ck_assert_double_gt(pl_test_max_abs_diff(b, before), 0.0);
    }
    pl_frame_end();
}
END_TEST

/* The counted calls (ABI 2.12) on the CPU reference: the parameters and
 * state of the host-step call with the same step (adamw: count 2 -> step 3,
 * the multi form's 0, 2, 4 -> 1, 3, 5; sgd: count 0 -> 1 is the first step),
 * the same bits, and the counts incremented; with found_inf NaN nothing
 * changes, the counts included. */
START_TEST(counted_calls_equal_host_step_calls) {
    pl_frame_begin();
    pl_tensor *in[5];
    for (int i = 0; i < 5; i++)
        in[i] = i >= 3 ? pl_test_rand(PL_SHAPE(40), 0.5, 2, 200 + i) : pl_test_randn(PL_SHAPE(40), 200 + i);
    static const struct {
        int form, host_flag, counted_flag, n_counts;
        float counts[3], before[3];
    } t[] = {
        {0, 0, 16, 1, {3}, {2}},          {0, 3, 16 | 3, 1, {3}, {2}},
        {1, 2, 16 | 2, 1, {1}, {0}},      {1, 1, 16 | 1, 1, {5}, {4}},
        {2, 0, 16, 3, {1, 3, 5}, {0, 2, 4}}, {2, 3, 16 | 3, 3, {1, 3, 5}, {0, 2, 4}},
        {3, 2, 16, 2, {1, 7}, {0, 6}},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        int f = t[k].form;
        case_fn fn = f == 0 ? c_adamw : f == 1 ? c_sgd : f == 2 ? c_adamw_multi : c_sgd_multi;
        ocase host = {.flag = t[k].host_flag}, counted = {.flag = t[k].counted_flag},
              skip = {.flag = t[k].counted_flag | 4};
        pl_tensor *a = PL_CK_NOTNULL(fn(in, &host)), *b = PL_CK_NOTNULL(fn(in, &counted));
        pl_tensor *z = PL_CK_NOTNULL(fn(in, &skip));
        const int64_t na = pl_tensor_numel(a), nc = t[k].n_counts;
        ck_assert_int_eq(pl_tensor_numel(b), na + nc);
        ck_assert_msg(memcmp(pl_tensor_data(a), pl_tensor_data(b), (size_t)na * sizeof(float)) == 0,
                      "form %d flag %d: the counted call's update differs", f, t[k].host_flag);
        const float *cb = (const float *)pl_tensor_data(b) + na;
        const float *cz = (const float *)pl_tensor_data(z) + na;
        for (int i = 0; i < nc; i++) {
            ck_assert_float_eq(cb[i], t[k].counts[i]);
            ck_assert_float_eq(cz[i], t[k].before[i]);
        }
        pl_tensor *parts[4] = {in[0], in[2], in[3], in[4]};
        pl_tensor *before = pl_concat(parts, f & 1 ? 2 : 4, 0);
        ck_assert_msg(memcmp(pl_tensor_data(before), pl_tensor_data(z), (size_t)na * sizeof(float)) == 0,
                      "form %d: a skipped counted call changed the state", f);
    }
    pl_frame_end();
}
END_TEST

/* ---- the device table ------------------------------------------------------------- */

/* The dtype of a case's float inputs (the first one decides; cases do not
 * mix), "f32->bf16" style for casts. */
static const char *case_dtype(const ocase *c, char *buf, size_t n) {
    pl_dtype dt = PL_F32;
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i].kind == 'f') {
            dt = c->in[i].dt;
            break;
        }
    if (c->op == PL_OP_CAST)
        snprintf(buf, n, "%s->%s", pl_dtype_name(dt), pl_dtype_name((pl_dtype)c->flag));
    else
        snprintf(buf, n, "%s", pl_dtype_name(dt));
    return buf;
}

static void case_tol(const ocase *c, double *atol, double *rtol) {
    *atol = c->atol;
    *rtol = c->rtol;
    if (c->atol > 0 || c->rtol > 0) return;
    pl_dtype dt = PL_F32;
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i].kind == 'f') {
            dt = c->in[i].dt;
            break;
        }
    *atol = g_tol[0].atol; /* f32 unless listed */
    *rtol = g_tol[0].rtol;
    for (size_t k = 0; k < sizeof g_tol / sizeof g_tol[0]; k++)
        if (g_tol[k].dt == dt) {
            *atol = g_tol[k].atol;
            *rtol = g_tol[k].rtol;
        }
}

typedef enum { ROW_OK, ROW_FAIL, ROW_UNSUPPORTED } row_status;

typedef struct counts {
    int rows, ok, fail, unsupported;
    char unsupported_ops[512]; /* distinct op names, space-separated */
} counts;

static void print_row(const ocase *c, const char *dir, row_status st, const errs *e, double atol,
                      double rtol, const char *note, counts *n) {
    char dt[32], tol[48], ea[24] = "-", er[24] = "-", nt[256];
    snprintf(nt, sizeof nt, "%s", note ? note : "");
    for (char *p = nt; *p; p++)
        if (*p == '|' || *p == '\n') *p = ' '; /* keep the markdown row one row */
    case_dtype(c, dt, sizeof dt);
    snprintf(tol, sizeof tol, "%.0e abs, %.0e rel", atol, rtol);
    if (e && st != ROW_UNSUPPORTED) {
        snprintf(ea, sizeof ea, "%.2e", e->max_abs);
        snprintf(er, sizeof er, "%.2e", e->max_rel);
    }
    const char *s = st == ROW_OK ? "OK" : st == ROW_FAIL ? "FAIL" : "unsupported";
    printf("| %-16s | %-42s | %-3s | %-10s | %-9s | %-9s | %-20s | %-11s | %s |\n",
           pl_op_name(c->op), c->what, dir, dt, ea, er, tol, s, nt);
    n->rows++;
    if (st == ROW_OK) n->ok++;
    if (st == ROW_FAIL) n->fail++;
    if (st == ROW_UNSUPPORTED) {
        n->unsupported++;
        const char *op = pl_op_name(c->op);
        size_t l = strlen(op);
        const char *u = n->unsupported_ops, *hit = strstr(u, op);
        bool listed = false;
        for (; hit && !listed; hit = strstr(hit + 1, op))
            listed = (hit == u || hit[-1] == ' ') && (hit[l] == ' ' || hit[l] == 0);
        size_t k = strlen(u);
        if (!listed)
            snprintf(n->unsupported_ops + k, sizeof n->unsupported_ops - k, "%s%s", k ? " " : "", op);
    }
}

/* The backend plugin to check: PL_CONFORMANCE_BACKEND, else "cuda". */
static const char *backend_name(bool *explicit_) {
    const char *e = getenv("PL_CONFORMANCE_BACKEND");
    *explicit_ = e && e[0];
    return *explicit_ ? e : "cuda";
}

/* The backend registered for PL_DEVICE_CUDA, case by case and direction by
 * direction against the CPU: one table, one count line. */
START_TEST(device_conformance) {
    bool named;
    const char *want = backend_name(&named);
    pl_registry *reg = pl_registry_new();
    ck_assert_ptr_nonnull(reg);
    PL_CK_OK(pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR));
    pl_status ls = pl_backend_load_named(reg, PL_DEVICE_CUDA, want);
    pl_registry_free(reg);
    /* asked for by name: not finding it is an error, not a missing GPU */
    ck_assert_msg(!ls || !named, "PL_CONFORMANCE_BACKEND=%s: %s", want, pl_error_message());
    if (ls) {
        printf("SKIP: no CUDA device (cuda backend: %s); conformance runs only on the CPU "
               "reference\n",
               pl_error_message());
        return;
    }
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert_ptr_nonnull(b);
    pl_device dev = {PL_DEVICE_CUDA, 0};
    counts n = {0};
    printf("backend conformance, %s vs cpu (OK: |%s - cpu| <= abs + rel * |cpu| for every "
           "element; max rel err over the elements with |cpu| > %g)\n\n",
           b->name, b->name, REL_FLOOR);
    printf("| op | case | dir | dtype | max abs err | max rel err | tolerance | status | note |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int ci = 0; ci < N_CASES; ci++) {
        const ocase *c = &g_cases[ci];
        double atol, rtol;
        case_tol(c, &atol, &rtol);
        bool has_f = pl_backend_supports(b, c->op, false),
             has_b = c->bwd && pl_backend_supports(b, c->op, true);
        if (!has_f) {
            print_row(c, "fwd", ROW_UNSUPPORTED, NULL, atol, rtol, "no forward kernel", &n);
            if (c->bwd) print_row(c, "bwd", ROW_UNSUPPORTED, NULL, atol, rtol, "no forward kernel", &n);
            continue;
        }
        result rc, rd;
        bool ok = run_case(c, ci, PL_CPU, &rc);
        ck_assert_msg(ok, "CPU reference of %s (%s) failed: %s", pl_op_name(c->op), c->what, rc.msg);
        ocase cc = *c;
        cc.bwd = has_b; /* no backward kernel: compare the forward only */
        bool okd = run_case(&cc, ci, dev, &rd);
        char bwd_note[512] = "";
        row_status bwd_st = has_b ? ROW_OK : ROW_UNSUPPORTED;
        if (!okd && rd.in_backward) {
            /* the forward ran: report the backward's failure on its row and
             * compare the forward alone */
            bwd_st = rd.st == PL_ERR_UNSUPPORTED ? ROW_UNSUPPORTED : ROW_FAIL;
            snprintf(bwd_note, sizeof bwd_note, "%s", rd.msg);
            cc.bwd = false;
            okd = run_case(&cc, ci, dev, &rd);
        }
        if (!okd) {
            row_status st = rd.st == PL_ERR_UNSUPPORTED ? ROW_UNSUPPORTED : ROW_FAIL;
            print_row(c, "fwd", st, NULL, atol, rtol, rd.msg, &n);
            if (c->bwd) print_row(c, "bwd", st, NULL, atol, rtol, "forward did not run", &n);
            result_free(&rc);
            continue;
        }
        errs ef;
        errs_init(&ef);
        compare("out", rd.out, rc.out, atol, rtol, &ef);
        print_row(c, "fwd", ef.ok ? ROW_OK : ROW_FAIL, &ef, atol, rtol, ef.msg, &n);
        if (c->bwd) {
            errs eb;
            errs_init(&eb);
            if (bwd_st == ROW_OK) {
                for (int i = 0; i < c->n_in; i++) {
                    if (!rc.grad[i] && !rd.grad[i]) continue;
                    char w[32];
                    snprintf(w, sizeof w, "grad of input %d", i);
                    compare(w, rd.grad[i], rc.grad[i], atol, rtol, &eb);
                }
                if (!eb.ok) bwd_st = ROW_FAIL;
                snprintf(bwd_note, sizeof bwd_note, "%s", eb.msg);
            } else if (!has_b)
                snprintf(bwd_note, sizeof bwd_note, "no backward kernel");
            print_row(c, "bwd", bwd_st, bwd_st == ROW_UNSUPPORTED ? NULL : &eb, atol, rtol, bwd_note,
                      &n);
        }
        result_free(&rc);
        result_free(&rd);
    }
    const char *req = getenv("PL_CONFORMANCE_REQUIRE_ALL");
    bool require_all = req && req[0] && strcmp(req, "0");
    printf("\nconformance %s vs cpu: %d rows: %d OK, %d FAIL, %d unsupported%s%s%s\n", b->name,
           n.rows, n.ok, n.fail, n.unsupported, n.unsupported ? " (" : "", n.unsupported_ops,
           n.unsupported ? ")" : "");
    fflush(stdout);
    ck_assert_msg(n.fail == 0, "%d conformance rows failed on backend %s (see the table on stdout)",
                  n.fail, b->name);
    ck_assert_msg(!require_all || n.unsupported == 0,
                  "%d conformance rows unsupported on backend %s (%s) and "
                  "PL_CONFORMANCE_REQUIRE_ALL is set",
                  n.unsupported, b->name, n.unsupported_ops);
}
END_TEST

int main(void) {
    Suite *s = suite_create("backend_conformance");
    TCase *tc = tcase_create("ops");
    tcase_add_test(tc, cpu_kernels_complete);
    tcase_add_test(tc, cpu_reference_sane);
    tcase_add_test(tc, found_inf_skips_the_optimizer_update);
    tcase_add_test(tc, counted_calls_equal_host_step_calls);
    tcase_add_test(tc, device_conformance);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
