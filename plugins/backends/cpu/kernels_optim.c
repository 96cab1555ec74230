/* kernels_optim.c - CPU kernels of clamp and the in-place optimizer updates
 * (PL_OP_CLAMP, PL_OP_ADAMW_STEP, PL_OP_SGD_STEP and their multi-tensor
 * forms PL_OP_ADAMW_STEP_MULTI, PL_OP_SGD_STEP_MULTI; the GradScaler's
 * PL_OP_AMP_UNSCALE_MULTI, PL_OP_AMP_UPDATE_SCALE; clip_grad_norm_'s
 * PL_OP_SUM_SQUARES_MULTI, PL_OP_MUL_MULTI). The per-element math is
 * optim_math.h, shared with the CUDA kernels. Registered by
 * pl_cpu_register_optim(). */
#include <string.h>

#include "cpu_internal.h"
#include "pipeline/kernel_math.h"
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

/* A counted call (optim_math.h, ABI 2.12): the step counter, out[4] of
 * adamw_step, out[2] of sgd_step, or NULL. Its increment (unless skipped)
 * comes before the update, which then uses the new count. */
static float *counter(const pl_kernel_args *a, int k) {
    return a->n_out > k && a->out[k] ? pl_tensor_data(a->out[k]) : NULL;
}

static pl_status k_adamw_step(const pl_kernel_args *a) {
    if (skipped(a)) return PL_OK;
    pl_adamw_coef c;
    float *count = counter(a, 4);
    if (count) {
        pl_adamw_ccoef k;
        memcpy(&k, coef_of(a), sizeof k);
        pl_optim_count_elem(count, NULL);
        c = pl_adamw_coef_at(&k, (double)*count);
    } else {
        memcpy(&c, coef_of(a), sizeof c);
    }
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
    float *count = counter(a, 2);
    if (count) {
        pl_optim_count_elem(count, NULL);
        c.first = *count == 1.0f;
    }
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *g = pl_tensor_data(a->in[0]);
    float *p = pl_tensor_data(a->out[0]);
    float *buf = a->n_out > 1 && a->out[1] ? pl_tensor_data(a->out[1]) : NULL;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
    for (int64_t i = 0; i < n; i++) pl_sgd_elem(&c, p + i, g[i], buf ? buf + i : NULL);
    return PL_OK;
}

/* ---- multi-tensor updates (ops.def's adamw_step_multi / sgd_step_multi) ----
 * p.extra = const pl_optim_multi * (optim_math.h); in[0] the found_inf flag
 * or NULL; p.flags bit0: tensor i's coefficients are the 16 floats at
 * 16 i of in[1]; count[i] set: a counted call (pl_adamw_ccoef records; the
 * counts are incremented here, before the parallel loop, when not skipped). One OpenMP loop over the concatenated element range, cut
 * into blocks of MULTI_BLOCK elements that never straddle two tensors, so
 * a list of small tensors is one parallel region, not one (or none) per
 * tensor; each element gets the per-tensor kernel's exact operations. */
#define MULTI_BLOCK 8192

static const void *multi_coef(const pl_kernel_args *a, const pl_optim_multi *m, int i) {
    return (a->p.flags & 1) ? (const float *)pl_tensor_data(a->in[1]) + PL_OPTIM_COEF_FLOATS * i
                            : (const void *)&m->coef[i];
}

static pl_status multi_step(const pl_kernel_args *a, bool adamw) {
    const pl_optim_multi *m = a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cpu %s: no tensor list in p.extra",
                            pl_op_name(a->op));
    if (a->in[0] && *(const float *)pl_tensor_data(a->in[0]) != 0.0f) return PL_OK; /* found_inf */
    pl_adamw_coef ca[PL_OPTIM_MULTI_MAX];
    pl_sgd_coef cs[PL_OPTIM_MULTI_MAX];
    int64_t first_block[PL_OPTIM_MULTI_MAX + 1], total = 0;
    first_block[0] = 0;
    for (int i = 0; i < m->n; i++) {
        float *count = m->count[i] ? pl_tensor_data(m->count[i]) : NULL; /* a counted call */
        if (count) pl_optim_count_elem(count, NULL); /* not skipped: found_inf was 0 */
        if (adamw && count) {
            pl_adamw_ccoef k;
            memcpy(&k, multi_coef(a, m, i), sizeof k);
            ca[i] = pl_adamw_coef_at(&k, (double)*count);
        } else if (adamw) {
            memcpy(&ca[i], multi_coef(a, m, i), sizeof ca[i]);
        } else {
            memcpy(&cs[i], multi_coef(a, m, i), sizeof cs[i]);
            if (count) cs[i].first = *count == 1.0f;
        }
        int64_t n = pl_tensor_numel(m->param[i]);
        total += n;
        first_block[i + 1] = first_block[i] + (n + MULTI_BLOCK - 1) / MULTI_BLOCK;
    }
    const int64_t nb = first_block[m->n];
#pragma omp parallel for schedule(static) if (total >= OMP_MIN_ELEMENTS && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int i = 0;
        while (first_block[i + 1] <= b) i++; /* the tensor of block b (<= 32 of them) */
        const int64_t n = pl_tensor_numel(m->param[i]);
        const int64_t lo = (b - first_block[i]) * MULTI_BLOCK;
        const int64_t hi = lo + MULTI_BLOCK < n ? lo + MULTI_BLOCK : n;
        float *p = pl_tensor_data(m->param[i]);
        const float *g = pl_tensor_data(m->grad[i]);
        if (adamw) { /* a private copy: no store through p, m, v can alias it */
            const pl_adamw_coef c = ca[i];
            float *mm = pl_tensor_data(m->state[0][i]), *v = pl_tensor_data(m->state[1][i]);
            float *vmax = c.ams && m->state[2][i] ? pl_tensor_data(m->state[2][i]) : NULL;
            for (int64_t e = lo; e < hi; e++)
                pl_adamw_elem(&c, p + e, g[e], mm + e, v + e, vmax ? vmax + e : NULL);
        } else {
            const pl_sgd_coef c = cs[i];
            float *buf = c.mom && m->state[0][i] ? pl_tensor_data(m->state[0][i]) : NULL;
            for (int64_t e = lo; e < hi; e++) pl_sgd_elem(&c, p + e, g[e], buf ? buf + e : NULL);
        }
    }
    return PL_OK;
}

static pl_status k_adamw_step_multi(const pl_kernel_args *a) { return multi_step(a, true); }
static pl_status k_sgd_step_multi(const pl_kernel_args *a) { return multi_step(a, false); }

/* ---- GradScaler (ops.def's amp_unscale_multi, amp_update_scale) ----
 * optim_math.h's element functions; amp_unscale_multi: p.extra's grad[]
 * list, in[0] inv_scale, out[0] found_inf (set to 1, never cleared). */
static pl_status k_amp_unscale_multi(const pl_kernel_args *a) {
    const pl_optim_multi *m = a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cpu amp_unscale_multi: no tensor list in p.extra");
    const float inv = *(const float *)pl_tensor_data(a->in[0]);
    int bad = 0;
    for (int i = 0; i < m->n; i++) {
        const int64_t n = pl_tensor_numel(m->grad[i]);
        float *g = pl_tensor_data(m->grad[i]);
#pragma omp parallel for reduction(| : bad) schedule(static) if (n >= OMP_MIN_ELEMENTS)
        for (int64_t e = 0; e < n; e++) bad |= pl_amp_unscale_elem(g + e, inv);
    }
    if (bad) *(float *)pl_tensor_data(a->out[0]) = 1.0f;
    return PL_OK;
}

static pl_status k_amp_update_scale(const pl_kernel_args *a) {
    pl_amp_update_scale_elem(pl_tensor_data(a->out[0]), pl_tensor_data(a->out[1]),
                             *(const float *)pl_tensor_data(a->in[0]), a->p.alpha, a->p.beta,
                             a->p.start);
    return PL_OK;
}

/* ---- clip_grad_norm_'s foreach kernels (ops.def's sum_squares_multi,
 * mul_multi): p.extra's grad[] list. Each tensor's sum of squares is the
 * square kernel's f32 rounding summed as k_sum_fwd (kernels_dense.c) sums
 * all elements: in double, the same OpenMP loop (the same split, PAR_MIN
 * 32768), rounded to f32 once; the total then gets one f32 add per tensor,
 * in order, as the pl_add chain it replaces: the same bits. */
static pl_status k_sum_squares_multi(const pl_kernel_args *a) {
    const pl_optim_multi *m = a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cpu sum_squares_multi: no tensor list in p.extra");
    float *acc = pl_tensor_data(a->out[0]);
    float total = (a->p.flags & 1) ? 0.0f : acc[0]; /* 0 + s_0 == s_0: s_0 >= +0 or NaN */
    for (int t = 0; t < m->n; t++) {
        const int64_t n = pl_tensor_numel(m->grad[t]);
        const float *X = pl_tensor_data(m->grad[t]);
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > 32768)
        for (int64_t i = 0; i < n; i++) {
            const float q = pl_math_square(X[i]); /* one f32 rounding, as the square kernel's */
            s += q;
        }
        total = total + (float)s;
    }
    acc[0] = total;
    return PL_OK;
}

/* g *= s[0] in place: pl_mul's broadcast loop (x * y in f32) and the copy. */
static pl_status k_mul_multi(const pl_kernel_args *a) {
    const pl_optim_multi *m = a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cpu mul_multi: no tensor list in p.extra");
    const float s = *(const float *)pl_tensor_data(a->in[0]);
    for (int t = 0; t < m->n; t++) {
        const int64_t n = pl_tensor_numel(m->grad[t]);
        float *g = pl_tensor_data(m->grad[t]);
#pragma omp parallel for schedule(static) if (n >= OMP_MIN_ELEMENTS)
        for (int64_t i = 0; i < n; i++) g[i] = g[i] * s;
    }
    return PL_OK;
}

void pl_cpu_register_optim(pl_kernel_table *b) {
    pl_kernel_table_set(b, PL_OP_SUM_SQUARES_MULTI, k_sum_squares_multi, NULL);
    pl_kernel_table_set(b, PL_OP_MUL_MULTI, k_mul_multi, NULL);
    pl_kernel_table_set(b, PL_OP_AMP_UNSCALE_MULTI, k_amp_unscale_multi, NULL);
    pl_kernel_table_set(b, PL_OP_AMP_UPDATE_SCALE, k_amp_update_scale, NULL);
    pl_kernel_table_set(b, PL_OP_CLAMP, k_clamp_fwd, k_clamp_bwd);
    pl_kernel_table_set(b, PL_OP_ADAMW_STEP, k_adamw_step, NULL);
    pl_kernel_table_set(b, PL_OP_SGD_STEP, k_sgd_step, NULL);
    pl_kernel_table_set(b, PL_OP_ADAMW_STEP_MULTI, k_adamw_step_multi, NULL);
    pl_kernel_table_set(b, PL_OP_SGD_STEP_MULTI, k_sgd_step_multi, NULL);
}
