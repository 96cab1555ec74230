/* kernels_optim.c - CPU kernels of clamp and the in-place optimizer updates
 * (PL_OP_CLAMP, PL_OP_ADAMW_STEP, PL_OP_SGD_STEP). The per-element math is
 * optim_math.h, shared with the CUDA kernels. Registered by
 * pl_cpu_register_optim(). */
#include <string.h>

#include "cpu_internal.h"
#include "pipeline/optim_math.h"

#define OMP_MIN_ELEMENTS 32768

static pl_status k_clamp_fwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *X = pl_tensor_data(a->in[0]);
    float *Y = pl_tensor_data(a->out[0]);
    const float lo = (float)a->p.alpha, hi = (float)a->p.beta;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
    for (int64_t i = 0; i < n; i++) Y[i] = pl_clamp_elem(X[i], lo, hi);
    return PL_OK;
}

static pl_status k_clamp_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *G = pl_tensor_data(a->in[0]), *X = pl_tensor_data(a->in[1]);
    float *D = pl_tensor_data(a->out[0]);
    const float lo = (float)a->p.alpha, hi = (float)a->p.beta;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
    for (int64_t i = 0; i < n; i++) D[i] = pl_clamp_grad_elem(X[i], lo, hi, G[i]);
    return PL_OK;
}

/* in[1], when present: the step's found_inf flag (pl_optim_set_found_inf):
 * non-zero (or NaN) skips the update, leaving every tensor as it was. */
static bool skipped(const pl_kernel_args *a) {
    return a->n_in > 1 && a->in[1] && *(const float *)pl_tensor_data(a->in[1]) != 0.0f;
}

/* The coefficients: by value in p.extra, or (p.flags bit0, a captured
 * graph's call: graph.h) in device memory, the bytes of tensor in[2]. */
static const void *coef_of(const pl_kernel_args *a) {
    return (a->p.flags & 1) ? pl_tensor_data(a->in[2]) : a->p.extra;
}

static pl_status k_adamw_step(const pl_kernel_args *a) {
    if (skipped(a)) return PL_OK;
    pl_adamw_coef c;
    memcpy(&c, coef_of(a), sizeof c);
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *g = pl_tensor_data(a->in[0]);
    float *p = pl_tensor_data(a->out[0]), *m = pl_tensor_data(a->out[1]),
          *v = pl_tensor_data(a->out[2]);
    float *vmax = a->n_out > 3 && a->out[3] ? pl_tensor_data(a->out[3]) : NULL;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
    for (int64_t i = 0; i < n; i++) pl_adamw_elem(&c, p + i, g[i], m + i, v + i, vmax ? vmax + i : NULL);
    return PL_OK;
}

static pl_status k_sgd_step(const pl_kernel_args *a) {
    if (skipped(a)) return PL_OK;
    pl_sgd_coef c;
    memcpy(&c, coef_of(a), sizeof c);
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *g = pl_tensor_data(a->in[0]);
    float *p = pl_tensor_data(a->out[0]);
    float *buf = a->n_out > 1 && a->out[1] ? pl_tensor_data(a->out[1]) : NULL;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
    for (int64_t i = 0; i < n; i++) pl_sgd_elem(&c, p + i, g[i], buf ? buf + i : NULL);
    return PL_OK;
}

void pl_cpu_register_optim(pl_kernel_table *b) {
    pl_kernel_table_set(b, PL_OP_CLAMP, k_clamp_fwd, k_clamp_bwd);
    pl_kernel_table_set(b, PL_OP_ADAMW_STEP, k_adamw_step, NULL);
    pl_kernel_table_set(b, PL_OP_SGD_STEP, k_sgd_step, NULL);
}
