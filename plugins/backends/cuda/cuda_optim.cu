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
 * adamw_step / sgd_step: one launch per parameter tensor. Their multi-tensor
 * forms adamw_step_multi / sgd_step_multi (optim_math.h, pl_optim_multi):
 * one launch for up to PL_OPTIM_MULTI_MAX tensors, CUDA's multi_tensor_apply
 * idea (torch's TensorListMetadata): the tensors' pointers, element counts
 * and (eagerly) coefficients travel by value in the kernel's arguments
 * (multi_args, under the 4 KB launch-parameter limit), so no pointer table
 * lives in device memory and a captured graph replays the launch with the
 * baked pointers; blockIdx.y picks the tensor, a grid-stride loop in x
 * covers its elements. The GradScaler's amp_unscale_multi launches the same
 * way; amp_update_scale is one thread (torch's AmpKernels.cu). clip_grad_norm_'s
 * sum_squares_multi and mul_multi take the same list (one launch each).
 */
#include <string.h>

#include "cuda_common.cuh"
#include "pipeline/kernel_math.h"
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
/* A counted call's increment (optim_math.h, ABI 2.12), a launch before the
 * update so that every block of the update reads the same new count (torch's
 * _foreach_add_ before _fused_adamw_): count[t] for t < n (one thread each),
 * unless found_inf. */
struct count_args {
    float *c[PL_OPTIM_MULTI_MAX];
};
__global__ void k_count(const count_args a, int n, const float *skip) {
    const int t = threadIdx.x;
    if (t < n && a.c[t]) pl_optim_count_elem(a.c[t], skip);
}

/* The coefficients of a counted AdamW update: the record's bytes are a
 * pl_adamw_ccoef, the step is the count on the device. Thread 0 of the block
 * computes them (two pow and a sqrt in double) into shared memory for the
 * others; every thread of the block must call it (a uniform branch: count
 * is the same for the whole block). */
__device__ static pl_adamw_coef counted_coef(const void *rec, const float *count) {
    __shared__ pl_adamw_coef s;
    if (threadIdx.x == 0) {
        pl_adamw_ccoef k;
        memcpy(&k, rec, sizeof k);
        s = pl_adamw_coef_at(&k, (double)*count);
    }
    __syncthreads();
    return s;
}

/* count: a counted call's step counter (after k_count) or NULL; the record
 * (hc or dc) is then a pl_adamw_ccoef. */
union adamw_rec {
    pl_adamw_coef c;
    pl_adamw_ccoef k; /* a counted call's record */
};
__global__ void k_adamw_step(adamw_rec hc, const adamw_rec *dc, float *p, const float *g,
                             float *m, float *v, float *vmax, const float *skip,
                             const float *count, int64_t n) {
    if (skip && *skip != 0.0f) return;
    const adamw_rec *r = dc ? dc : &hc; /* dc: a captured graph's table slot (device) */
    const pl_adamw_coef c = count ? counted_coef(&r->k, count) : r->c;
    if (c.ams && !vmax) return;
    GRID_LOOP(i, n) pl_adamw_elem(&c, p + i, g[i], m + i, v + i, vmax ? vmax + i : NULL);
}

/* One SGD update in place; p, g (and buf when c.mom) [n] f32; skip as above. */
__global__ void k_sgd_step(pl_sgd_coef hc, const pl_sgd_coef *dc, float *p, const float *g,
                           float *buf, const float *skip, const float *count, int64_t n) {
    if (skip && *skip != 0.0f) return;
    pl_sgd_coef c = dc ? *dc : hc; /* dc: a captured graph's table slot (device) */
    if (count) c.first = *count == 1.0f; /* a counted call, after k_count */
    if (c.mom && !buf) return;
    GRID_LOOP(i, n) pl_sgd_elem(&c, p + i, g[i], buf ? buf + i : NULL);
}

/* The argument block of a multi-tensor launch (by value: 5 x 32 pointers,
 * 32 counts, 32 coefficient records = 2.9 KB for adamw). */
struct adamw_multi_args {
    float *p[PL_OPTIM_MULTI_MAX];
    const float *g[PL_OPTIM_MULTI_MAX];
    float *m[PL_OPTIM_MULTI_MAX], *v[PL_OPTIM_MULTI_MAX], *vmax[PL_OPTIM_MULTI_MAX];
    const float *count[PL_OPTIM_MULTI_MAX]; /* a counted call's counters, or NULL */
    int64_t n[PL_OPTIM_MULTI_MAX];
    union {
        pl_adamw_coef c;
        pl_adamw_ccoef k; /* a counted call's record */
    } c[PL_OPTIM_MULTI_MAX];
};
struct sgd_multi_args {
    float *p[PL_OPTIM_MULTI_MAX];
    const float *g[PL_OPTIM_MULTI_MAX];
    float *buf[PL_OPTIM_MULTI_MAX];
    const float *count[PL_OPTIM_MULTI_MAX];
    int64_t n[PL_OPTIM_MULTI_MAX];
    pl_sgd_coef c[PL_OPTIM_MULTI_MAX];
};
static_assert(sizeof(adamw_multi_args) + 2 * sizeof(void *) <= 4096,
              "adamw_multi_args must fit the 4 KB launch-parameter limit");

/* Tensor blockIdx.y of the list; dc: a captured graph's coefficient table
 * (PL_OPTIM_COEF_FLOATS floats per tensor) or NULL (the coefficients in a);
 * skip: found_inf as above. */
__global__ void k_adamw_step_multi(const adamw_multi_args a, const float *dc, const float *skip) {
    if (skip && *skip != 0.0f) return;
    const int t = blockIdx.y;
    pl_adamw_coef c;
    if (a.count[t]) /* a counted call: the record is a pl_adamw_ccoef */
        c = counted_coef(dc ? (const void *)(dc + PL_OPTIM_COEF_FLOATS * t) : &a.c[t].k, a.count[t]);
    else if (dc) memcpy(&c, dc + PL_OPTIM_COEF_FLOATS * t, sizeof c);
    else c = a.c[t].c;
    float *vmax = a.vmax[t];
    if (c.ams && !vmax) return;
    float *p = a.p[t], *m = a.m[t], *v = a.v[t];
    const float *g = a.g[t];
    GRID_LOOP(i, a.n[t]) pl_adamw_elem(&c, p + i, g[i], m + i, v + i, vmax ? vmax + i : NULL);
}

__global__ void k_sgd_step_multi(const sgd_multi_args a, const float *dc, const float *skip) {
    if (skip && *skip != 0.0f) return;
    const int t = blockIdx.y;
    pl_sgd_coef c = a.c[t];
    if (dc) memcpy(&c, dc + PL_OPTIM_COEF_FLOATS * t, sizeof c);
    if (a.count[t]) c.first = *a.count[t] == 1.0f;
    float *buf = a.buf[t];
    if (c.mom && !buf) return;
    float *p = a.p[t];
    const float *g = a.g[t];
    GRID_LOOP(i, a.n[t]) pl_sgd_elem(&c, p + i, g[i], buf ? buf + i : NULL);
}

/* GradScaler (ops.def's amp_unscale_multi, amp_update_scale; optim_math.h):
 * the list's gradient pointers and counts by value, as the optimizer's
 * multi-tensor launches pass theirs; inv_scale and found_inf read / written
 * in device memory (torch's _amp_foreach_non_finite_check_and_unscale_cuda_:
 * any thread that sees an inf / NaN stores 1, the same value, no atomics). */
struct amp_unscale_args {
    float *g[PL_OPTIM_MULTI_MAX];
    int64_t n[PL_OPTIM_MULTI_MAX];
};

__global__ void k_amp_unscale_multi(const amp_unscale_args a, const float *inv_scale,
                                    float *found_inf) {
    const int t = blockIdx.y;
    const float inv = *inv_scale;
    float *g = a.g[t];
    bool bad = false;
    GRID_LOOP(i, a.n[t]) bad |= pl_amp_unscale_elem(g + i, inv);
    if (bad) *found_inf = 1.0f;
}

/* clip_grad_norm_'s foreach kernels (ops.def's sum_squares_multi, mul_multi),
 * the list passed as amp_unscale_args (pointers and counts by value).
 * sum_squares_multi is one block of 1024 threads that takes the tensors in
 * order, each as the chain it replaces: the square kernel's f32 rounding,
 * k_sum_block <<<1, 1024>>>'s per-thread double sums and block reduction
 * (cuda_dense.cu), one f32 rounding, then one f32 add into the total: the
 * same bits as square + sum + add on this backend. */
__global__ void k_sum_squares_multi(const amp_unscale_args a, int nt, float *acc, int start) {
    __shared__ double sh[32];
    float total = start ? 0.0f : acc[0]; /* 0 + s_0 == s_0: s_0 >= +0 or NaN */
    for (int t = 0; t < nt; t++) {
        const float *X = a.g[t];
        double s = 0;
        for (int64_t k = threadIdx.x; k < a.n[t]; k += blockDim.x) {
            const float q = pl_math_square(X[k]);
            s += q;
        }
        s = pl_d_block_sum(s, sh);
        if (threadIdx.x == 0) total = total + (float)s;
    }
    if (threadIdx.x == 0) acc[0] = total;
}

/* g *= s[0] in place, tensor blockIdx.y (pl_mul's x * y, then the copy). */
__global__ void k_mul_multi(const amp_unscale_args a, const float *s) {
    const float v = *s;
    float *g = a.g[blockIdx.y];
    GRID_LOOP(i, a.n[blockIdx.y]) g[i] = g[i] * v;
}

/* torch's amp_update_scale_cuda_kernel: one thread. */
__global__ void k_amp_update_scale(float *scale, int32_t *tracker, const float *found_inf,
                                   double growth_factor, double backoff_factor,
                                   int64_t growth_interval) {
    pl_amp_update_scale_elem(scale, tracker, *found_inf, growth_factor, backoff_factor,
                             growth_interval);
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

/* k_count on the n counters c (NULL entries skipped); n <= PL_OPTIM_MULTI_MAX. */
static pl_status launch_count(float *const *c, int n, const float *skip) {
    count_args k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < n; i++) k.c[i] = c[i];
    k_count<<<1, PL_OPTIM_MULTI_MAX>>>(k, n, skip);
    CUDA_LAUNCHED("optimizer step count");
    return PL_OK;
}

/* in = {grad, found_inf (optional), coefficients (p.flags bit0)}; out = {param, exp_avg,
 * exp_avg_sq, max_exp_avg_sq (amsgrad)}; p.extra = const pl_adamw_coef * (host) unless
 * the coefficients are on the device. */
static pl_status k_adamw_step_fwd(const pl_kernel_args *a) {
    const adamw_rec *dc = (const adamw_rec *)device_coef(a);
    if (!a->p.extra && !dc)
        return pl_error_set(PL_ERR_INTERNAL, "cuda adamw_step: no pl_adamw_coef in p.extra");
    adamw_rec c;
    memset(&c, 0, sizeof c);
    float *count = a->n_out > 4 && a->out[4] ? fp(a->out[4]) : NULL;
    if (!dc && count) c.k = *(const pl_adamw_ccoef *)a->p.extra;
    else if (!dc) c.c = *(const pl_adamw_coef *)a->p.extra;
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float *vmax = a->n_out > 3 && a->out[3] ? fp(a->out[3]) : NULL;
    bool ams = count ? c.k.ams != 0 : c.c.ams != 0;
    if (!dc && ams && !vmax)
        return pl_error_set(PL_ERR_INTERNAL, "cuda adamw_step: amsgrad without max_exp_avg_sq");
    if (count && launch_count(&count, 1, found_inf(a))) return pl_error_status();
    k_adamw_step<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(c, dc, fp(a->out[0]), cf(a->in[0]),
                                                       fp(a->out[1]), fp(a->out[2]), vmax,
                                                       found_inf(a), count, n);
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
    float *count = a->n_out > 2 && a->out[2] ? fp(a->out[2]) : NULL;
    if (!dc && c.mom && !buf)
        return pl_error_set(PL_ERR_INTERNAL, "cuda sgd_step: momentum without a buffer");
    if (count && launch_count(&count, 1, found_inf(a))) return pl_error_status();
    k_sgd_step<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(c, dc, fp(a->out[0]), cf(a->in[0]), buf,
                                                     found_inf(a), count, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* The list of a multi-tensor call, checked; sets *dc (the device table, or
 * NULL) and *blocks (x blocks: enough for the largest tensor). */
static pl_status multi_prepare(const pl_kernel_args *a, const pl_optim_multi **m,
                               const float **dc, unsigned *blocks) {
    *m = (const pl_optim_multi *)a->p.extra;
    if (!*m || (*m)->n < 1 || (*m)->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cuda %s: no tensor list in p.extra", pl_op_name(a->op));
    *dc = (a->p.flags & 1) && a->n_in > 1 && a->in[1] ? cf(a->in[1]) : NULL;
    if ((a->p.flags & 1) && !*dc)
        return pl_error_set(PL_ERR_INTERNAL, "cuda %s: p.flags bit0 without the coefficient table",
                            pl_op_name(a->op));
    int64_t most = 0;
    for (int i = 0; i < (*m)->n; i++) {
        int64_t n = pl_tensor_numel((*m)->param[i]);
        if (n > most) most = n;
    }
    *blocks = pl_cu_blocks(most);
    if (*blocks > 4096) *blocks = 4096; /* x blocks per tensor; the loop strides beyond */
    return pl_cu_set_device(a->out[0]);
}

/* in = {found_inf or NULL, coefficient table (p.flags bit0)}; out = {param[0]};
 * p.extra = const pl_optim_multi *. One launch. */
static pl_status k_adamw_step_multi_fwd(const pl_kernel_args *a) {
    const pl_optim_multi *m;
    const float *dc;
    unsigned bx;
    pl_status s = multi_prepare(a, &m, &dc, &bx);
    if (s) return s;
    adamw_multi_args k;
    memset(&k, 0, sizeof k);
    float *cnt[PL_OPTIM_MULTI_MAX];
    bool counted = false;
    for (int i = 0; i < m->n; i++) {
        k.p[i] = fp(m->param[i]);
        k.g[i] = cf(m->grad[i]);
        k.m[i] = fp(m->state[0][i]);
        k.v[i] = fp(m->state[1][i]);
        k.vmax[i] = m->state[2][i] ? fp(m->state[2][i]) : NULL;
        k.n[i] = pl_tensor_numel(m->param[i]);
        cnt[i] = m->count[i] ? fp(m->count[i]) : NULL;
        k.count[i] = cnt[i];
        counted |= cnt[i] != NULL;
        if (!dc && cnt[i]) k.c[i].k = m->coef[i].adamw_counted;
        else if (!dc) k.c[i].c = m->coef[i].adamw;
        bool ams = cnt[i] ? m->coef[i].adamw_counted.ams != 0 : m->coef[i].adamw.ams != 0;
        if (!dc && ams && !k.vmax[i])
            return pl_error_set(PL_ERR_INTERNAL, "cuda adamw_step_multi: amsgrad without "
                                "max_exp_avg_sq for parameter '%s'", m->param[i]->name);
    }
    const float *skip = a->in[0] ? cf(a->in[0]) : NULL;
    if (counted && launch_count(cnt, m->n, skip)) return pl_error_status();
    k_adamw_step_multi<<<dim3(bx, (unsigned)m->n), PL_CUDA_THREADS>>>(k, dc, skip);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_sgd_step_multi_fwd(const pl_kernel_args *a) {
    const pl_optim_multi *m;
    const float *dc;
    unsigned bx;
    pl_status s = multi_prepare(a, &m, &dc, &bx);
    if (s) return s;
    sgd_multi_args k;
    memset(&k, 0, sizeof k);
    float *cnt[PL_OPTIM_MULTI_MAX];
    bool counted = false;
    for (int i = 0; i < m->n; i++) {
        k.p[i] = fp(m->param[i]);
        k.g[i] = cf(m->grad[i]);
        k.buf[i] = m->state[0][i] ? fp(m->state[0][i]) : NULL;
        k.n[i] = pl_tensor_numel(m->param[i]);
        cnt[i] = m->count[i] ? fp(m->count[i]) : NULL;
        k.count[i] = cnt[i];
        counted |= cnt[i] != NULL;
        if (!dc) k.c[i] = m->coef[i].sgd;
        if (!dc && k.c[i].mom && !k.buf[i])
            return pl_error_set(PL_ERR_INTERNAL, "cuda sgd_step_multi: momentum without a "
                                "buffer for parameter '%s'", m->param[i]->name);
    }
    const float *skip = a->in[0] ? cf(a->in[0]) : NULL;
    if (counted && launch_count(cnt, m->n, skip)) return pl_error_status();
    k_sgd_step_multi<<<dim3(bx, (unsigned)m->n), PL_CUDA_THREADS>>>(k, dc, skip);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in = {inv_scale}; out = {found_inf}; p.extra = const pl_optim_multi * (grad[]
 * only). One launch. */
static pl_status k_amp_unscale_multi_fwd(const pl_kernel_args *a) {
    const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cuda amp_unscale_multi: no tensor list in p.extra");
    amp_unscale_args k;
    memset(&k, 0, sizeof k);
    int64_t most = 0;
    for (int i = 0; i < m->n; i++) {
        k.g[i] = fp(m->grad[i]);
        k.n[i] = pl_tensor_numel(m->grad[i]);
        if (k.n[i] > most) most = k.n[i];
    }
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    if (!most) return PL_OK;
    unsigned bx = pl_cu_blocks(most);
    if (bx > 4096) bx = 4096; /* x blocks per tensor; the loop strides beyond */
    k_amp_unscale_multi<<<dim3(bx, (unsigned)m->n), PL_CUDA_THREADS>>>(k, cf(a->in[0]),
                                                                       fp(a->out[0]));
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* p.extra's grad[] as amp_unscale_args; *most: the largest count. */
static pl_status list_args(const pl_kernel_args *a, amp_unscale_args *k, int64_t *most) {
    const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
    if (!m || m->n < 1 || m->n > PL_OPTIM_MULTI_MAX)
        return pl_error_set(PL_ERR_INTERNAL, "cuda %s: no tensor list in p.extra", pl_op_name(a->op));
    memset(k, 0, sizeof *k);
    *most = 0;
    for (int i = 0; i < m->n; i++) {
        k->g[i] = fp(m->grad[i]);
        k->n[i] = pl_tensor_numel(m->grad[i]);
        if (k->n[i] > *most) *most = k->n[i];
    }
    return pl_cu_set_device(a->out[0]) ? pl_error_status() : PL_OK;
}

/* out = {the total f32 [1]}; p.flags bit0: it starts at 0. One launch. */
static pl_status k_sum_squares_multi_fwd(const pl_kernel_args *a) {
    amp_unscale_args k;
    int64_t most;
    if (list_args(a, &k, &most)) return pl_error_status();
    const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
    k_sum_squares_multi<<<1, 1024>>>(k, m->n, fp(a->out[0]), (int)(a->p.flags & 1));
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in = {s f32 [1]}; out = {grad[0]}. One launch. */
static pl_status k_mul_multi_fwd(const pl_kernel_args *a) {
    amp_unscale_args k;
    int64_t most;
    if (list_args(a, &k, &most)) return pl_error_status();
    if (!most) return PL_OK;
    unsigned bx = pl_cu_blocks(most);
    if (bx > 4096) bx = 4096; /* x blocks per tensor; the loop strides beyond */
    const pl_optim_multi *m = (const pl_optim_multi *)a->p.extra;
    k_mul_multi<<<dim3(bx, (unsigned)m->n), PL_CUDA_THREADS>>>(k, cf(a->in[0]));
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in = {found_inf}; out = {scale f32, growth_tracker i32}; p.alpha growth_factor,
 * p.beta backoff_factor, p.start growth_interval. One thread. */
static pl_status k_amp_update_scale_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    k_amp_update_scale<<<1, 1>>>(fp(a->out[0]), (int32_t *)pl_tensor_data(a->out[1]),
                                 cf(a->in[0]), a->p.alpha, a->p.beta, a->p.start);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

void pl_cuda_register_optim(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_AMP_UNSCALE_MULTI, k_amp_unscale_multi_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_AMP_UPDATE_SCALE, k_amp_update_scale_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_SUM_SQUARES_MULTI, k_sum_squares_multi_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_MUL_MULTI, k_mul_multi_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_CLAMP, k_clamp_fwd, k_clamp_bwd);
    pl_kernel_table_set(t, PL_OP_ADAMW_STEP, k_adamw_step_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_SGD_STEP, k_sgd_step_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_ADAMW_STEP_MULTI, k_adamw_step_multi_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_SGD_STEP_MULTI, k_sgd_step_multi_fwd, NULL);
}
