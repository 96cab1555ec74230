/* cuda_attention.cu - CUDA forward / backward kernels of rope and causal_softmax (the
 * attention ops of kernels_index.c on the CPU), op for op.
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
 * device for the last (T, half, offset, theta). */
typedef struct rope_cache {
    float *dev;
    int64_t T, half, off;
    double theta;
} rope_cache;
static rope_cache g_rope[8];
static pthread_mutex_t g_rope_mu = PTHREAD_MUTEX_INITIALIZER;

static const float *rope_table(int dev, int64_t T, int64_t half, int64_t off, double theta) {
    if (dev < 0 || dev >= 8) {
        pl_error_set(PL_ERR_DEVICE, "rope: cuda device %d out of range", dev);
        return NULL;
    }
    rope_cache *c = &g_rope[dev];
    if (c->dev && c->T == T && c->half == half && c->off == off && c->theta == theta) return c->dev;
    size_t n = (size_t)(2 * T * half + 1);
    float *tab = (float *)malloc(n * sizeof(float));
    if (!tab) {
        pl_error_set(PL_ERR_NOMEM, "rope: out of host memory for the cos/sin table");
        return NULL;
    }
    pl_rope_cos_sin(tab, T, half, off, theta);
    if (c->dev) cudaFree(c->dev); /* synchronizes: no pending kernel still reads it */
    c->dev = NULL;
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
    c->dev = d;
    c->T = T;
    c->half = half;
    c->off = off;
    c->theta = theta;
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

/* ---- registration ---------------------------------------------------------------------------------------- */

void pl_cuda_register_attention(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_ROPE, k_rope_fwd, k_rope_bwd);
    pl_kernel_table_set(t, PL_OP_CAUSAL_SOFTMAX, k_causal_softmax_fwd, k_causal_softmax_bwd);
}
