/* cuda_attention.cu - CUDA forward / backward kernels of rope and causal_softmax (the
 * attention ops of kernels_index.c on the CPU), op for op, and of the fused
 * attention (kernels_attention.c on the CPU).
 * Conventions (launch geometry only; the element math is kernel_math.h's PL_HD
 * functions, shared with the CPU kernels): the top of cuda_common.cuh. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- rope ----------------------------------------------------------------------------------------------- */

/* The cos/sin table is computed on the host by the core's pl_rope_cos_sin
 * (backend_util.h: the CPU's exact arithmetic, HF Llama) and cached per
 * device for each (T, half, offset, theta) seen, never freed while the
 * plugin is loaded: a captured graph holds the table's address, so a
 * table replaced by an eager call of another shape (evaluation, predict)
 * would be freed under the graph's next replay. Building a table is a
 * cudaMalloc and a synchronous upload, which a capture cannot contain: a
 * shape first seen inside a capture refuses it (the step runs eagerly, and
 * the next capture finds the table). */
typedef struct rope_cache {
    float *dev;
    int64_t T, half, off;
    double theta;
} rope_cache;
#define ROPE_TABLES 64
static rope_cache g_rope[8][ROPE_TABLES];
static pthread_mutex_t g_rope_mu = PTHREAD_MUTEX_INITIALIZER;

static const float *rope_table(int dev, int64_t T, int64_t half, int64_t off, double theta) {
    if (dev < 0 || dev >= 8) {
        pl_error_set(PL_ERR_DEVICE, "rope: cuda device %d out of range", dev);
        return NULL;
    }
    rope_cache *c = NULL;
    for (int i = 0; i < ROPE_TABLES && !c; i++) {
        rope_cache *e = &g_rope[dev][i];
        if (!e->dev || (e->T == T && e->half == half && e->off == off && e->theta == theta))
            c = e;
    }
    if (c && c->dev) return c->dev;
    if (!c) {
        pl_error_set(PL_ERR_UNSUPPORTED, "rope: more than %d distinct (T, head_dim, offset, "
                     "theta) tables on cuda:%d (T=%lld offset=%lld)", ROPE_TABLES, dev,
                     (long long)T, (long long)off);
        return NULL;
    }
    if (pl_cu_refuse_capture("rope", "its cos/sin table for this (T, offset, theta) is built "
                             "by a synchronous upload; the eager step builds it"))
        return NULL;
    size_t n = (size_t)(2 * T * half + 1);
    float *tab = (float *)malloc(n * sizeof(float));
    if (!tab) {
        pl_error_set(PL_ERR_NOMEM, "rope: out of host memory for the cos/sin table");
        return NULL;
    }
    pl_rope_cos_sin(tab, T, half, off, theta);
    float *d = NULL;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess ||
        cudaMemcpy(d, tab, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        if (d) cudaFree(d);
        free(tab);
        pl_error_set(PL_ERR_NOMEM, "rope: cannot upload the cos/sin table to cuda:%d", dev);
        return NULL;
    }
    free(tab);
    c->T = T;
    c->half = half;
    c->off = off;
    c->theta = theta;
    c->dev = d;
    return d;
}

__global__ void k_rope(const void *xp, int xdt, void *yp, int ydt, const float *tab, int64_t T,
                       int64_t H, int64_t Dh, int64_t rows, float sign) {
    int64_t half = Dh / 2;
    GRID_LOOP(e, rows * half) {
        int64_t r = e / half, i = e % half;
        int64_t t = (r / H) % T, base = r * Dh;
        const float *cs = tab + t * half * 2;
        float c = cs[2 * i], s = sign * cs[2 * i + 1];
        float x1 = pl_d_ldf(xp, xdt, base + i), x2 = pl_d_ldf(xp, xdt, base + i + half), y1, y2;
        pl_rope_rotate(x1, x2, c, s, &y1, &y2);
        pl_d_stf(yp, ydt, base + i, y1);
        pl_d_stf(yp, ydt, base + i + half, y2);
    }
}

static pl_status rope_apply(const pl_tensor *x, pl_tensor *y, int64_t off, double theta, float sign) {
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], Dh = x->shape[3];
    int64_t rows = B * T * H;
    if (rows * Dh == 0) return PL_OK;
    pthread_mutex_lock(&g_rope_mu);
    const float *tab = rope_table(x->device.index, T, Dh / 2, off, theta);
    if (tab)
        k_rope<<<pl_cu_blocks(rows * (Dh / 2)), PL_CUDA_THREADS>>>(
            pl_tensor_data(x), x->dtype, pl_tensor_data(y), y->dtype, tab, T, H, Dh, rows, sign);
    pthread_mutex_unlock(&g_rope_mu);
    if (!tab) return pl_error_status();
    CUDA_LAUNCHED("rope");
    return PL_OK;
}

static pl_status k_rope_fwd(const pl_kernel_args *a) {
    return rope_apply(a->in[0], a->out[0], a->p.start, a->p.alpha, 1.0f);
}

/* backward: the transposed rotation on the f32 gradient */
static pl_status k_rope_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    return rope_apply(a->in[0], a->out[0], a->p.start, a->p.alpha, -1.0f);
}

/* ---- causal softmax ------------------------------------------------------------------------------------ */

/* scores [..., T, S]: row r (query r % T) sees columns j <= r % T + S - T */
__global__ void k_causal_f(const void *xp, int xdt, void *yp, int ydt, int64_t rows, int64_t T,
                           int64_t S, float scale) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * S, vis = (r % T) + S - T + 1;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < vis; j += blockDim.x)
            m = pl_max_step(m, scale * pl_d_ldf(xp, xdt, base + j));
        m = pl_d_block_max(m, shf);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < vis; j += blockDim.x)
            sum += pl_softmax_exp(scale * pl_d_ldf(xp, xdt, base + j), m);
        sum = pl_d_block_sum(sum, shf);
        float inv = 1.0f / sum;
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
            pl_d_stf(yp, ydt, base + j,
                     j < vis ? pl_softmax_exp(scale * pl_d_ldf(xp, xdt, base + j), m) * inv : 0.0f);
    }
}

/* ds = scale y (g - sum(g y)) over the visible columns, 0 elsewhere */
__global__ void k_causal_b(const float *gp, const void *yp, int ydt, float *ds, int64_t rows,
                           int64_t T, int64_t S, float scale) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * S, vis = (r % T) + S - T + 1;
        float dot = 0.0f;
        for (int64_t j = threadIdx.x; j < vis; j += blockDim.x)
            dot += gp[base + j] * pl_d_ldf(yp, ydt, base + j);
        dot = pl_d_block_sum(dot, shf);
        for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
            ds[base + j] =
                j < vis ? pl_softmax_grad(scale * pl_d_ldf(yp, ydt, base + j), gp[base + j], dot)
                        : 0.0f;
    }
}

static pl_status k_causal_softmax_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    int nd = x->ndim;
    int64_t T = x->shape[nd - 2], S = x->shape[nd - 1], rows = S ? pl_tensor_numel(x) / S : 0;
    if (!rows) return PL_OK;
    k_causal_f<<<row_grid(rows), 128>>>(pl_tensor_data(x), x->dtype, pl_tensor_data(a->out[0]),
                                        a->out[0]->dtype, rows, T, S, (float)a->p.alpha);
    CUDA_LAUNCHED("causal_softmax");
    return PL_OK;
}

/* in = {g, scores, y} */
static pl_status k_causal_softmax_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    const pl_tensor *g = a->in[0], *y = a->in[2];
    if (pl_cu_set_device(g)) return pl_error_status();
    int nd = g->ndim;
    int64_t T = g->shape[nd - 2], S = g->shape[nd - 1], rows = S ? pl_tensor_numel(g) / S : 0;
    if (!rows) return PL_OK;
    k_causal_b<<<row_grid(rows), 128>>>(cf(g), pl_tensor_data(y), y->dtype, fp(a->out[0]), rows, T,
                                        S, (float)a->p.alpha);
    CUDA_LAUNCHED("causal_softmax backward");
    return PL_OK;
}

/* ---- fused attention (pl_attention, FlashAttention-2) ---------------------------------------------------- */

/* Simple rather than fast (issue 35): one thread per query row (forward, dQ)
 * or key row (dK, dV), the other side's rows staged in shared memory as f32
 * tiles, the row's vectors and accumulators in per-thread arrays of
 * ATT_DMAX floats. Forward: the online softmax of FlashAttention (running
 * max m and sum l, the accumulator rescaled by e^(m_old - m) when m grows),
 * lse - c saved, c the row's largest visible bias (a fully masked row keeps
 * its log l). Backward recomputes P from it, as the CPU kernel
 * (kernels_attention.c, which states the formulas); dK, dV of a kv head sum
 * over its rep query heads inside one thread, so there are no atomics.
 * test_kernels_emu.cpp runs these kernels on the host (CMakeLists.txt copies this
 * section's text, from its "---- fused attention" line to the comment of att_args_of). */
#define ATT_DMAX 128
#define ATT_ROWS 64 /* query (key) rows per block: one thread each */
#define ATT_TILE 32 /* rows of the other side per shared-memory tile */

typedef struct att_args {
    const void *q, *k, *v, *bias, *o;
    int qdt, bdt;
    int64_t B, H, KV, T, L, D, rep, bias_bstride; /* bias_bstride: 0 or L */
    float scale;
    int causal;
} att_args;

__device__ __forceinline__ int64_t att_visible(const att_args &a, int64_t i) {
    return a.causal ? a.L - a.T + i + 1 : a.L;
}
__device__ __forceinline__ float att_bias(const att_args &a, int64_t b, int64_t j) {
    return a.bias ? pl_d_ldf(a.bias, a.bdt, b * a.bias_bstride + j) : 0.0f;
}
/* the largest bias of the n keys a row sees (0 without a bias): kernels_attention.c's c */
__device__ float att_bias_max(const att_args &a, int64_t b, int64_t n) {
    if (!a.bias) return 0.0f;
    float c = -INFINITY;
    for (int64_t j = 0; j < n; j++) c = pl_max_step(c, att_bias(a, b, j));
    return c;
}

/* rows [r0, r0 + ATT_TILE) of a [.., n, D] slice at base into tile (f32, zero past n) */
__device__ void att_stage(float (*tile)[ATT_DMAX], const void *src, int dt, int64_t base,
                          int64_t r0, int64_t n, int64_t D) {
    for (int64_t e = threadIdx.x; e < ATT_TILE * D; e += blockDim.x) {
        int64_t r = e / D, d = e % D;
        tile[r][d] = r0 + r < n ? pl_d_ldf(src, dt, base + (r0 + r) * D + d) : 0.0f;
    }
}

/* grid (B * H, query blocks): out [B, H, T, D] in q's dtype, lse f32 [B, H, T] */
__global__ void k_att_fwd(att_args a, void *out, float *lse) {
    __shared__ float Ks[ATT_TILE][ATT_DMAX], Vs[ATT_TILE][ATT_DMAX];
    int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H, D = a.D;
    int64_t i0 = (int64_t)blockIdx.y * ATT_ROWS, i = i0 + threadIdx.x;
    int64_t kvbase = (b * a.KV + h / a.rep) * a.L * D, row = bh * a.T + i;
    bool live = i < a.T;
    float q[ATT_DMAX], acc[ATT_DMAX], m = -INFINITY, l = 0.0f;
    for (int64_t d = 0; d < D; d++) {
        q[d] = live ? pl_d_ldf(a.q, a.qdt, row * D + d) : 0.0f;
        acc[d] = 0.0f;
    }
    int64_t last = i0 + ATT_ROWS - 1 < a.T ? i0 + ATT_ROWS - 1 : a.T - 1;
    int64_t nk = att_visible(a, last), n = live ? att_visible(a, i) : 0;
    for (int64_t j0 = 0; j0 < nk; j0 += ATT_TILE) {
        att_stage(Ks, a.k, a.qdt, kvbase, j0, a.L, D);
        att_stage(Vs, a.v, a.qdt, kvbase, j0, a.L, D);
        __syncthreads();
        for (int64_t jj = 0; jj < ATT_TILE && j0 + jj < n; jj++) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += q[d] * Ks[jj][d];
            s = a.scale * s + att_bias(a, b, j0 + jj);
            if (s > m) { /* rescale what was summed under the old max */
                float c = expf(m - s);
                l *= c;
                for (int64_t d = 0; d < D; d++) acc[d] *= c;
                m = s;
            }
            float p = expf(s - m);
            l += p;
            for (int64_t d = 0; d < D; d++) acc[d] += p * Vs[jj][d];
        }
        __syncthreads();
    }
    if (!live) return;
    float inv = 1.0f / l;
    for (int64_t d = 0; d < D; d++) pl_d_stf(out, a.qdt, row * D + d, acc[d] * inv);
    lse[row] = (m - att_bias_max(a, b, n)) + logf(l);
}

/* grid (B * H, query blocks): dq [B, H, T, D] f32 */
__global__ void k_att_bwd_dq(att_args a, const float *dO, const float *lse, float *dq) {
    __shared__ float Ks[ATT_TILE][ATT_DMAX], Vs[ATT_TILE][ATT_DMAX];
    int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H, D = a.D;
    int64_t i0 = (int64_t)blockIdx.y * ATT_ROWS, i = i0 + threadIdx.x;
    int64_t kvbase = (b * a.KV + h / a.rep) * a.L * D, row = bh * a.T + i;
    bool live = i < a.T;
    float q[ATT_DMAX], go[ATT_DMAX], dqr[ATT_DMAX], Di = 0.0f, li = live ? lse[row] : 0.0f;
    for (int64_t d = 0; d < D; d++) {
        q[d] = live ? pl_d_ldf(a.q, a.qdt, row * D + d) : 0.0f;
        go[d] = live ? dO[row * D + d] : 0.0f;
        Di += live ? go[d] * pl_d_ldf(a.o, a.qdt, row * D + d) : 0.0f;
        dqr[d] = 0.0f;
    }
    int64_t last = i0 + ATT_ROWS - 1 < a.T ? i0 + ATT_ROWS - 1 : a.T - 1;
    int64_t nk = att_visible(a, last), n = live ? att_visible(a, i) : 0;
    float ci = att_bias_max(a, b, n);
    for (int64_t j0 = 0; j0 < nk; j0 += ATT_TILE) {
        att_stage(Ks, a.k, a.qdt, kvbase, j0, a.L, D);
        att_stage(Vs, a.v, a.qdt, kvbase, j0, a.L, D);
        __syncthreads();
        for (int64_t jj = 0; jj < ATT_TILE && j0 + jj < n; jj++) {
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                s += q[d] * Ks[jj][d];
                dp += go[d] * Vs[jj][d];
            }
            float p = expf((a.scale * s + att_bias(a, b, j0 + jj) - ci) - li);
            float sds = a.scale * p * (dp - Di);
            for (int64_t d = 0; d < D; d++) dqr[d] += sds * Ks[jj][d];
        }
        __syncthreads();
    }
    if (live)
        for (int64_t d = 0; d < D; d++) dq[row * D + d] = dqr[d];
}

/* grid (B * KV, key blocks): dk, dv [B, KV, L, D] f32 (either may be NULL) */
__global__ void k_att_bwd_dkv(att_args a, const float *dO, const float *lse, float *dk, float *dv) {
    __shared__ float Qs[ATT_TILE][ATT_DMAX], Gs[ATT_TILE][ATT_DMAX], Ls[ATT_TILE], Ds[ATT_TILE],
        Cs[ATT_TILE];
    int64_t bk = blockIdx.x, b = bk / a.KV, kvh = bk % a.KV, D = a.D;
    int64_t j = (int64_t)blockIdx.y * ATT_ROWS + threadIdx.x, kvrow = bk * a.L + j;
    bool live = j < a.L;
    float kr[ATT_DMAX], vr[ATT_DMAX], dkr[ATT_DMAX], dvr[ATT_DMAX];
    for (int64_t d = 0; d < D; d++) {
        kr[d] = live ? pl_d_ldf(a.k, a.qdt, kvrow * D + d) : 0.0f;
        vr[d] = live ? pl_d_ldf(a.v, a.qdt, kvrow * D + d) : 0.0f;
        dkr[d] = dvr[d] = 0.0f;
    }
    float bj = live ? att_bias(a, b, j) : 0.0f;
    /* query i sees key j when j <= L - T + i: the first such i */
    int64_t ifirst = a.causal ? j - (a.L - a.T) : 0;
    if (ifirst < 0) ifirst = 0;
    int64_t jfirst = (int64_t)blockIdx.y * ATT_ROWS;
    int64_t i_start = a.causal && jfirst > a.L - a.T ? jfirst - (a.L - a.T) : 0;
    for (int64_t h = kvh * a.rep; h < (kvh + 1) * a.rep; h++) {
        int64_t qbase = (b * a.H + h) * a.T;
        for (int64_t i0 = i_start - i_start % ATT_TILE; i0 < a.T; i0 += ATT_TILE) {
            for (int64_t e = threadIdx.x; e < ATT_TILE * D; e += blockDim.x) {
                int64_t r = e / D, d = e % D, i = i0 + r;
                Qs[r][d] = i < a.T ? pl_d_ldf(a.q, a.qdt, (qbase + i) * D + d) : 0.0f;
                Gs[r][d] = i < a.T ? dO[(qbase + i) * D + d] : 0.0f;
            }
            for (int64_t r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
                int64_t i = i0 + r;
                float di = 0.0f;
                if (i < a.T)
                    for (int64_t d = 0; d < D; d++)
                        di += dO[(qbase + i) * D + d] * pl_d_ldf(a.o, a.qdt, (qbase + i) * D + d);
                Ds[r] = di;
                Ls[r] = i < a.T ? lse[qbase + i] : 0.0f;
                Cs[r] = i < a.T ? att_bias_max(a, b, att_visible(a, i)) : 0.0f;
            }
            __syncthreads();
            for (int64_t r = 0; live && r < ATT_TILE && i0 + r < a.T; r++) {
                if (i0 + r < ifirst) continue;
                float s = 0.0f, dp = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    s += Qs[r][d] * kr[d];
                    dp += Gs[r][d] * vr[d];
                }
                float p = expf((a.scale * s + bj - Cs[r]) - Ls[r]);
                float sds = a.scale * p * (dp - Ds[r]);
                for (int64_t d = 0; d < D; d++) {
                    dvr[d] += p * Gs[r][d];
                    dkr[d] += sds * Qs[r][d];
                }
            }
            __syncthreads();
        }
    }
    if (!live) return;
    for (int64_t d = 0; d < D; d++) {
        if (dk) dk[kvrow * D + d] = dkr[d];
        if (dv) dv[kvrow * D + d] = dvr[d];
    }
}

/* the call's geometry from q, k, v (, bias) and p; PL_ERR_UNSUPPORTED beyond the kernels' limits */
static pl_status att_args_of(const pl_tensor *q, const pl_tensor *k, const pl_tensor *v,
                             const pl_tensor *bias, const pl_tensor *o, const pl_op_params *p,
                             att_args *a) {
    memset(a, 0, sizeof *a);
    a->q = pl_tensor_data(q);
    a->k = pl_tensor_data(k);
    a->v = pl_tensor_data(v);
    a->o = o ? pl_tensor_data(o) : NULL;
    a->qdt = q->dtype;
    a->B = q->shape[0];
    a->H = q->shape[1];
    a->T = q->shape[2];
    a->D = q->shape[3];
    a->KV = k->shape[1];
    a->L = k->shape[2];
    a->rep = a->H / a->KV;
    a->scale = (float)p->alpha;
    a->causal = p->flags & 1;
    if (bias) {
        a->bias = pl_tensor_data(bias);
        a->bdt = bias->dtype;
        a->bias_bstride = bias->shape[0] == 1 ? 0 : a->L;
    }
    if (a->D > ATT_DMAX)
        return pl_error_set(PL_ERR_UNSUPPORTED, "attention: head dim %lld > %d on cuda",
                            (long long)a->D, ATT_DMAX);
    if (a->B * a->H > INT32_MAX || (a->T + ATT_ROWS - 1) / ATT_ROWS > 65535 ||
        (a->L + ATT_ROWS - 1) / ATT_ROWS > 65535)
        return pl_error_set(PL_ERR_UNSUPPORTED, "attention: B*H %lld, T %lld or L %lld beyond the cuda grid",
                            (long long)(a->B * a->H), (long long)a->T, (long long)a->L);
    return PL_OK;
}

/* in = {q, k, v, [bias]}; out = {out, lse} */
static pl_status k_attention_fwd(const pl_kernel_args *a) {
    const pl_tensor *q = a->in[0];
    if (pl_cu_set_device(q)) return pl_error_status();
    att_args g;
    pl_status st = att_args_of(q, a->in[1], a->in[2], a->n_in > 3 ? a->in[3] : NULL, NULL, &a->p, &g);
    if (st) return st;
    if (g.B * g.H * g.T == 0) return PL_OK;
    dim3 grid((unsigned)(g.B * g.H), (unsigned)((g.T + ATT_ROWS - 1) / ATT_ROWS));
    k_att_fwd<<<grid, ATT_ROWS>>>(g, pl_tensor_data(a->out[0]), fp(a->out[1]));
    CUDA_LAUNCHED("attention");
    return PL_OK;
}

/* in = {g, q, k, v, [bias], out, lse}; out = {dq, dk, dv} (f32, any may be NULL) */
static pl_status k_attention_bwd(const pl_kernel_args *a) {
    int n = a->n_in - 3; /* the op's inputs */
    const pl_tensor *q = a->in[1];
    if (pl_cu_set_device(q)) return pl_error_status();
    if (a->n_out > 3 && a->out[3])
        return pl_error_set(PL_ERR_INVALID, "attention backward: the bias has no gradient");
    att_args g;
    pl_status st = att_args_of(q, a->in[2], a->in[3], n > 3 ? a->in[4] : NULL, a->in[1 + n], &a->p, &g);
    if (st) return st;
    if (g.B * g.H * g.T == 0 || g.L == 0) {
        for (int i = 0; i < 3; i++)
            if (a->out[i]) CUDA_TRY(cudaMemset(pl_tensor_data(a->out[i]), 0, pl_tensor_nbytes(a->out[i])));
        return PL_OK;
    }
    const float *dO = cf(a->in[0]), *lse = cf(a->in[2 + n]);
    if (a->out[0]) {
        dim3 grid((unsigned)(g.B * g.H), (unsigned)((g.T + ATT_ROWS - 1) / ATT_ROWS));
        k_att_bwd_dq<<<grid, ATT_ROWS>>>(g, dO, lse, fp(a->out[0]));
        CUDA_LAUNCHED("attention backward (dq)");
    }
    if (a->out[1] || a->out[2]) {
        dim3 grid((unsigned)(g.B * g.KV), (unsigned)((g.L + ATT_ROWS - 1) / ATT_ROWS));
        k_att_bwd_dkv<<<grid, ATT_ROWS>>>(g, dO, lse, a->out[1] ? fp(a->out[1]) : NULL,
                                          a->out[2] ? fp(a->out[2]) : NULL);
        CUDA_LAUNCHED("attention backward (dk, dv)");
    }
    return PL_OK;
}

/* ---- registration ---------------------------------------------------------------------------------------- */

void pl_cuda_register_attention(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_ROPE, k_rope_fwd, k_rope_bwd);
    pl_kernel_table_set(t, PL_OP_CAUSAL_SOFTMAX, k_causal_softmax_fwd, k_causal_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_ATTENTION, k_attention_fwd, k_attention_bwd);
}
