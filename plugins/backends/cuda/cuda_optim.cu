/* cuda_optim.cu - CUDA kernels of clamp and the in-place optimizer updates
 * (PL_OP_CLAMP, PL_OP_ADAMW_STEP, PL_OP_SGD_STEP), the GPU twin of
 * plugins/backends/cpu/kernels_optim.c. Calling conventions: backend.h's enum
 * comments; the front ends are pl_clamp (ops_dense.c) and pl_adamw_step_ /
 * pl_sgd_step_ (ops_optim.c), which check dtypes (f32), contiguity, element
 * counts and devices before a kernel runs.
 *
 * The element math is pipeline/optim_math.h (pl_clamp_elem,
 * pl_clamp_grad_elem, pl_adamw_elem, pl_sgd_elem), the functions the CPU
 * kernels call. The optimizer's f32 scalars (pl_adamw_coef / pl_sgd_coef)
 * arrive as a host pointer in p.extra; they are copied by value into the
 * kernel's arguments, so the device never reads host memory and the struct
 * need not outlive the launch. In a captured graph (graph.h) they are a
 * device table slot instead (p.flags bit0, in[2]), which the host rewrites
 * before each replay; the kernel reads them from there.
 *
 * One launch per parameter tensor: a multi-tensor (fused) AdamW step is not
 * done here (see README.md).
 */
#include <string.h>

#include "cuda_common.cuh"
#include "pipeline/optim_math.h"

/* ---- kernels ---------------------------------------------------------------------- */

/* Y[i] = clamp(X[i], lo, hi); X, Y [n] f32. */
__global__ void k_clamp(const float *X, float *Y, float lo, float hi, int64_t n) {
    GRID_LOOP(i, n) Y[i] = pl_clamp_elem(X[i], lo, hi);
}

/* D[i] = G[i] where lo <= X[i] <= hi, else 0; G, X, D [n] f32. */
__global__ void k_clamp_grad(const float *G, const float *X, float *D, float lo, float hi,
                             int64_t n) {
    GRID_LOOP(i, n) D[i] = pl_clamp_grad_elem(X[i], lo, hi, G[i]);
}

/* One AdamW / Adam update in place; p, m, v, g (and vmax when c.ams) [n] f32.
 * skip: the step's found_inf flag [1] (NULL: none); non-zero or NaN leaves
 * every tensor as it was (GradScaler's found_inf; the CPU kernel's rule). */
__global__ void k_adamw_step(pl_adamw_coef hc, const pl_adamw_coef *dc, float *p, const float *g,
                             float *m, float *v, float *vmax, const float *skip, int64_t n) {
    if (skip && *skip != 0.0f) return;
    const pl_adamw_coef c = dc ? *dc : hc; /* dc: a captured graph's table slot (device) */
    if (c.ams && !vmax) return;
    GRID_LOOP(i, n) pl_adamw_elem(&c, p + i, g[i], m + i, v + i, vmax ? vmax + i : NULL);
}

/* One SGD update in place; p, g (and buf when c.mom) [n] f32; skip as above. */
__global__ void k_sgd_step(pl_sgd_coef hc, const pl_sgd_coef *dc, float *p, const float *g,
                           float *buf, const float *skip, int64_t n) {
    if (skip && *skip != 0.0f) return;
    const pl_sgd_coef c = dc ? *dc : hc; /* dc: a captured graph's table slot (device) */
    if (c.mom && !buf) return;
    GRID_LOOP(i, n) pl_sgd_elem(&c, p + i, g[i], buf ? buf + i : NULL);
}

/* ---- host side ------------------------------------------------------------------------ */

/* in = {x}; out = {y}, f32, p.alpha = min, p.beta = max. */
static pl_status k_clamp_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    k_clamp<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]), fp(a->out[0]),
                                                  (float)a->p.alpha, (float)a->p.beta, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in = {dy, x}; out = {dx} (NULL when not wanted). */
static pl_status k_clamp_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    if (pl_cu_set_device(gx)) return pl_error_status();
    int64_t n = pl_tensor_numel(gx);
    if (!n) return PL_OK;
    k_clamp_grad<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]), cf(a->in[1]), fp(gx),
                                                       (float)a->p.alpha, (float)a->p.beta, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in[1], when present: the step's found_inf flag on the device (a scalar f32,
 * pl_optim_set_found_inf), read by the kernel itself: no host read. */
static const float *found_inf(const pl_kernel_args *a) {
    return a->n_in > 1 && a->in[1] ? cf(a->in[1]) : NULL;
}

/* The coefficients' device copy when the call is a captured graph's (p.flags
 * bit0: in[2] holds the struct's bytes, graph.h), else NULL. */
static const void *device_coef(const pl_kernel_args *a) {
    return (a->p.flags & 1) && a->n_in > 2 && a->in[2] ? pl_tensor_data(a->in[2]) : NULL;
}

/* in = {grad, found_inf (optional), coefficients (p.flags bit0)}; out = {param, exp_avg,
 * exp_avg_sq, max_exp_avg_sq (amsgrad)}; p.extra = const pl_adamw_coef * (host) unless
 * the coefficients are on the device. */
static pl_status k_adamw_step_fwd(const pl_kernel_args *a) {
    const pl_adamw_coef *dc = (const pl_adamw_coef *)device_coef(a);
    if (!a->p.extra && !dc)
        return pl_error_set(PL_ERR_INTERNAL, "cuda adamw_step: no pl_adamw_coef in p.extra");
    pl_adamw_coef c;
    memset(&c, 0, sizeof c);
    if (!dc) c = *(const pl_adamw_coef *)a->p.extra;
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float *vmax = a->n_out > 3 && a->out[3] ? fp(a->out[3]) : NULL;
    if (!dc && c.ams && !vmax)
        return pl_error_set(PL_ERR_INTERNAL, "cuda adamw_step: amsgrad without max_exp_avg_sq");
    k_adamw_step<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(c, dc, fp(a->out[0]), cf(a->in[0]),
                                                       fp(a->out[1]), fp(a->out[2]), vmax,
                                                       found_inf(a), n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in = {grad, found_inf (optional), coefficients (p.flags bit0)}; out = {param, momentum
 * buffer (momentum only)}; p.extra = const pl_sgd_coef * (host) unless on the device. */
static pl_status k_sgd_step_fwd(const pl_kernel_args *a) {
    const pl_sgd_coef *dc = (const pl_sgd_coef *)device_coef(a);
    if (!a->p.extra && !dc)
        return pl_error_set(PL_ERR_INTERNAL, "cuda sgd_step: no pl_sgd_coef in p.extra");
    pl_sgd_coef c;
    memset(&c, 0, sizeof c);
    if (!dc) c = *(const pl_sgd_coef *)a->p.extra;
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float *buf = a->n_out > 1 && a->out[1] ? fp(a->out[1]) : NULL;
    if (!dc && c.mom && !buf)
        return pl_error_set(PL_ERR_INTERNAL, "cuda sgd_step: momentum without a buffer");
    k_sgd_step<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(c, dc, fp(a->out[0]), cf(a->in[0]), buf,
                                                     found_inf(a), n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

void pl_cuda_register_optim(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_CLAMP, k_clamp_fwd, k_clamp_bwd);
    pl_kernel_table_set(t, PL_OP_ADAMW_STEP, k_adamw_step_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_SGD_STEP, k_sgd_step_fwd, NULL);
}
