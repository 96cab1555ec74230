/* cuda_norm.cu - CUDA forward / backward kernels of softmax / log_softmax, the losses
 * (cross entropy, mse, mae, huber) and layer_norm / rms_norm: the GPU twin of the CPU
 * backend's kernels_norm.c, op for op.
 * Conventions (launch geometry only; the element math is kernel_math.h's PL_HD
 * functions, shared with the CPU kernels): the top of cuda_common.cuh. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- softmax / log_softmax (last dim), one block per row ---------------------------------------- */

#define last_dim_geom pl_last_dim_split /* t as [rows, last dim] (backend_util.h) */


/* row max and log-sum-exp base: m, s = sum exp(x - m) */
__device__ __forceinline__ void row_max_sum(const float *x, int64_t d, float *m_out, double *s_out,
                                            float *shf, double *shd) {
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        m = pl_max_step(m, x[j]);
    m = pl_d_block_max(m, shf);
    double s = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
        s += pl_softmax_exp(x[j], m);
    s = pl_d_block_sum(s, shd);
    *m_out = m;
    *s_out = s;
}

__global__ void k_softmax_f(const float *X, float *Y, int64_t rows, int64_t d, bool logsm) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = X + r * d;
        float *y = Y + r * d;
        float m;
        double s;
        row_max_sum(x, d, &m, &s, shf, shd);
        if (logsm) {
            float lse = pl_log_softmax_lse(m, s);
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
                y[j] = x[j] - lse;
        } else {
            float inv = pl_softmax_inv(s);
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
                y[j] = pl_softmax_exp(x[j], m) * inv;
        }
    }
}

/* softmax: gx = y (g - sum(g y)); log_softmax: gx = g - exp(y) sum(g); y the saved output */
__global__ void k_softmax_b(const float *G, const float *Y, float *D, int64_t rows, int64_t d,
                            bool logsm) {
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *y = Y + r * d, *g = G + r * d;
        float *o = D + r * d;
        double acc = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            acc += logsm ? (double)g[j] : (double)g[j] * y[j];
        acc = pl_d_block_sum(acc, shd);
        float sf = (float)acc;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            o[j] = logsm ? pl_log_softmax_grad(g[j], y[j], sf) : pl_softmax_grad(y[j], g[j], sf);
    }
}

static pl_status k_softmax_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t rows, d;
    last_dim_geom(a->in[0], &rows, &d);
    if (!rows) return PL_OK;
    k_softmax_f<<<row_grid(rows), T_ROW>>>(cf(a->in[0]), fp(a->out[0]), rows, d,
                                           a->op == PL_OP_LOG_SOFTMAX);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* in[2]: the saved output (in[1], the input, is a tape stub) */
static pl_status k_softmax_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[2])) return pl_error_status();
    int64_t rows, d;
    last_dim_geom(a->in[2], &rows, &d);
    if (!rows) return PL_OK;
    k_softmax_b<<<row_grid(rows), T_ROW>>>(cf(a->in[0]), cf(a->in[2]), fp(a->out[0]), rows, d,
                                           a->op == PL_OP_LOG_SOFTMAX);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* ---- cross entropy ------------------------------------------------------------------------------ */

typedef struct ce_row {
    double nll, smooth;
    int valid;
} ce_row;

__global__ void k_ce_rows(const float *X, const void *tg, int tdt, float *lse, ce_row *rows_out,
                          int64_t N, int64_t C, int64_t ign, pl_cu_fault *bad) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        const float *x = X + i * C;
        float m = -INFINITY;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            m = pl_max_step(m, x[c]);
        m = pl_d_block_max(m, shf);
        /* as the CPU: e^(x - m) in f32, summed in double */
        double s2 = 0, sx = 0;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            s2 += pl_ce_exp(x[c], m);
            sx += x[c];
        }
        s2 = pl_d_block_sum(s2, shd);
        sx = pl_d_block_sum(sx, shd);
        if (threadIdx.x == 0) {
            double l = pl_ce_lse(m, s2);
            lse[i] = (float)l;
            int64_t t = pl_d_idx(tg, tdt, i);
            ce_row rr = {0.0, 0.0, 0};
            if (t != ign) {
                if (t < 0 || t >= C)
                    pl_d_fault(bad, PL_OP_CROSS_ENTROPY, PL_CU_FAULT_TARGET, i, t, C, ign);
                else {
                    rr.nll = pl_ce_row_nll(l, x[t]);
                    rr.smooth = pl_ce_row_smooth(l, C, sx);
                    rr.valid = 1;
                }
            }
            rows_out[i] = rr;
        }
    }
}

__global__ void k_ce_final(const ce_row *rows, int64_t N, int64_t C, double eps, float *loss) {
    __shared__ double shd[32];
    double nll = 0, sm = 0, v = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        nll += rows[i].nll;
        sm += rows[i].smooth;
        v += rows[i].valid;
    }
    nll = pl_d_block_sum(nll, shd);
    sm = pl_d_block_sum(sm, shd);
    v = pl_d_block_sum(v, shd);
    if (threadIdx.x == 0) loss[0] = (float)pl_ce_loss(nll, sm, eps, C, v);
}

static pl_status k_ce_fwd(const pl_kernel_args *a) {
    const pl_tensor *lg = a->in[0], *tg = a->in[1];
    if (pl_cu_set_device(lg)) return pl_error_status();
    int64_t N, C;
    last_dim_geom(lg, &N, &C);
    /* a target outside [0, C) is recorded and reported at the next read
     * (pl_cu_fault_check): no copy back here */
    pl_cu_fault *bad = pl_cu_fault_record();
    if (!bad) return pl_error_status();
    pl_cu_scratch s = {0};
    ce_row *rows = (ce_row *)pl_cu_scratch_get(&s, lg->device, (size_t)(N ? N : 1) * sizeof(ce_row));
    if (!rows) return PL_ERR_NOMEM;
    if (N > 0)
        k_ce_rows<<<row_grid(N), T_ROW>>>(cf(lg), pl_tensor_data(tg), tg->dtype, fp(a->out[1]),
                                          rows, N, C, a->p.ignore_index, bad);
    k_ce_final<<<1, 1024>>>(rows, N, C, a->p.alpha, fp(a->out[0]));
    pl_cu_scratch_free(&s);
    CUDA_LAUNCHED("cross_entropy");
    return PL_OK;
}

__global__ void k_count_valid(const void *tg, int tdt, int64_t N, int64_t ign, float *out) {
    __shared__ double shd[32];
    double v = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x)
        v += pl_d_idx(tg, tdt, i) != ign;
    v = pl_d_block_sum(v, shd);
    if (threadIdx.x == 0) out[0] = (float)v;
}

__global__ void k_ce_b(const float *G, const float *X, const void *tg, int tdt, const float *lse,
                       const float *valid, float *D, int64_t N, int64_t C, int64_t ign, float eps) {
    float scale = G[0] / valid[0], off = pl_ce_smooth_off(eps, C);
    GRID_LOOP(e, N * C) {
        int64_t i = e / C, c = e % C, t = pl_d_idx(tg, tdt, i);
        float v;
        if (t == ign)
            v = 0.0f;
        else {
            v = pl_ce_grad(X[e], lse[i], scale, off);
            if (c == t) v -= pl_ce_target_grad(scale, eps);
        }
        D[e] = v;
    }
}

static pl_status k_ce_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    const pl_tensor *lg = a->in[1], *tg = a->in[2];
    if (pl_cu_set_device(lg)) return pl_error_status();
    int64_t N, C;
    last_dim_geom(lg, &N, &C);
    if (N * C == 0) return PL_OK;
    pl_cu_scratch s = {0};
    float *valid = (float *)pl_cu_scratch_get(&s, lg->device, sizeof(float));
    if (!valid) return PL_ERR_NOMEM;
    k_count_valid<<<1, 1024>>>(pl_tensor_data(tg), tg->dtype, N, a->p.ignore_index, valid);
    k_ce_b<<<pl_cu_blocks(N * C), PL_CUDA_THREADS>>>(cf(a->in[0]), cf(lg), pl_tensor_data(tg),
                                                     tg->dtype, cf(a->in[3]), valid, fp(gx), N, C,
                                                     a->p.ignore_index, (float)a->p.alpha);
    pl_cu_scratch_free(&s);
    CUDA_LAUNCHED("cross_entropy");
    return PL_OK;
}

/* ---- mse / mae / huber (mean) --------------------------------------------------------------------- */

__global__ void k_loss_f(const float *P, const float *T, int op, double delta, int64_t n,
                         float *out) {
    __shared__ double shd[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s += pl_loss_term((pl_op)op, (double)P[i] - T[i], delta);
    s = pl_d_block_sum(s, shd);
    if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}

__global__ void k_loss_b(const float *G, const float *P, const float *T, int op, float delta,
                         int64_t n, float *GP, float *GT) {
    float g = G[0] / (float)n;
    GRID_LOOP(i, n) {
        float v = pl_loss_grad((pl_op)op, P[i] - T[i], delta) * g;
        if (GP) GP[i] = v;
        if (GT) GT[i] = -v;
    }
}

static pl_status k_loss_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->in[0]);
    k_loss_f<<<1, 1024>>>(cf(a->in[0]), cf(a->in[1]), a->op, a->p.alpha, n, fp(a->out[0]));
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_loss_bwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[1])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->in[1]);
    if (!n || (!a->out[0] && !a->out[1])) return PL_OK;
    k_loss_b<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]), cf(a->in[1]), cf(a->in[2]), a->op,
                                                   (float)a->p.alpha, n,
                                                   a->out[0] ? fp(a->out[0]) : NULL,
                                                   a->out[1] ? fp(a->out[1]) : NULL);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* ---- layer_norm / rms_norm ------------------------------------------------------------------------ */

__global__ void k_ln_f(const float *X, const float *W, const float *B, float *Y, float *MU,
                       float *RS, int64_t R, int64_t D, double eps) {
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *x = X + r * D;
        float *y = Y + r * D;
        double s = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            s += x[j];
        s = pl_d_block_sum(s, shd);
        double mu = s / (double)D, ss = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            ss += pl_layer_norm_sqdev(x[j], mu);
        ss = pl_d_block_sum(ss, shd);
        float rs = pl_norm_rstd(ss, D, eps), m = (float)mu;
        if (threadIdx.x == 0) {
            MU[r] = m;
            RS[r] = rs;
        }
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            y[j] = pl_layer_norm_y(x[j], m, rs, W, B, j);
    }
}

/* layer: gx = rstd (gy - mean(gy) - xhat mean(gy xhat)); rms (MU NULL):
 * gx = rstd (gy - x rstd mean(gy x rstd)) (kernel_math.h) */
/* X and W of any float dtype (xd, wd: rms_norm is half_native), the rest f32;
 * a weight value goes through the kernel_math.h helpers as a one-element array */
__global__ void k_norm_gx(const float *G, const void *X, int xd, const void *W, int wd,
                          const float *MU, const float *RS, float *GX, int64_t R, int64_t D) {
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *g = G + r * D;
        float mu = MU ? MU[r] : 0.0f, rs = RS[r];
        double s1 = 0, s2 = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float wv = W ? pl_d_ldf(W, wd, j) : 0.0f, x = pl_d_ldf(X, xd, r * D + j);
            float gy = pl_norm_gy(g[j], W ? &wv : NULL, 0);
            s1 += gy;
            s2 += MU ? (double)gy * pl_norm_xhat(x, mu, rs) : pl_rms_norm_dot(gy, x, rs);
        }
        s1 = pl_d_block_sum(s1, shd);
        s2 = pl_d_block_sum(s2, shd);
        float m1 = (float)(s1 / (double)D), m2 = (float)(s2 / (double)D);
        float *gx = GX + r * D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float wv = W ? pl_d_ldf(W, wd, j) : 0.0f, x = pl_d_ldf(X, xd, r * D + j);
            float gy = pl_norm_gy(g[j], W ? &wv : NULL, 0);
            gx[j] = MU ? pl_layer_norm_gx(gy, pl_norm_xhat(x, mu, rs), rs, m1, m2)
                       : pl_rms_norm_gx(gy, x, rs, m2);
        }
    }
}

/* gw[j] = sum_r g xhat, gb[j] = sum_r g; one thread per column */
__global__ void k_norm_gwb(const float *G, const void *X, int xd, const float *MU,
                           const float *RS, float *GW, float *GB, int64_t R, int64_t D) {
    GRID_LOOP(j, D) {
        double sw = 0, sb = 0;
        for (int64_t r = 0; r < R; r++) {
            float g = G[r * D + j], x = pl_d_ldf(X, xd, r * D + j);
            sw += MU ? (double)g * pl_norm_xhat(x, MU[r], RS[r]) : pl_rms_norm_dot(g, x, RS[r]);
            sb += g;
        }
        if (GW) GW[j] = (float)sw;
        if (GB) GB[j] = (float)sb;
    }
}

/* argument layout: pl_norm_fwd_io / pl_norm_bwd_io (backend_util.h) */
static pl_status k_layer_norm_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    pl_norm_fwd_io io;
    pl_norm_fwd_io_init(&io, a, false);
    if (!io.R) return PL_OK;
    k_ln_f<<<row_grid(io.R), T_ROW>>>(io.x, io.w, io.b, io.y, io.mean, io.rstd, io.R, io.D,
                                      a->p.eps);
    CUDA_LAUNCHED("layer_norm");
    return PL_OK;
}

/* layer_norm and rms_norm backward (rms: no mean, no bias) */
static pl_status norm_bwd(const pl_kernel_args *a, bool rms) {
    if (pl_cu_set_device(a->in[1])) return pl_error_status();
    pl_norm_bwd_io io;
    pl_norm_bwd_io_init(&io, a, rms);
    int64_t R = io.R, D = io.D;
    /* x is in[1], the weight in[2] when there is one (backend_util.h's layout) */
    int xd = a->in[1]->dtype, wd = io.w ? a->in[2]->dtype : PL_F32;
    if (io.gx && R)
        k_norm_gx<<<row_grid(R), T_ROW>>>(io.g, io.x, xd, io.w, wd, io.mean, io.rstd, io.gx, R,
                                          D);
    if ((io.gw || io.gb) && D)
        k_norm_gwb<<<pl_cu_blocks(D), PL_CUDA_THREADS>>>(io.g, io.x, xd, io.mean, io.rstd, io.gw,
                                                         io.gb, R, D);
    CUDA_LAUNCHED(rms ? "rms_norm backward" : "layer_norm backward");
    return PL_OK;
}

static pl_status k_layer_norm_bwd(const pl_kernel_args *a) {
    return norm_bwd(a, false);
}

/* X, W, Y of any float dtype (half_native), rstd f32 */
__global__ void k_rms_f(const void *X, int xd, const void *W, int wd, void *Y, int yd, float *RS,
                        int64_t R, int64_t D, double eps) {
    __shared__ double shd[32];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        double ss = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float x = pl_d_ldf(X, xd, r * D + j);
            ss += (double)x * x;
        }
        ss = pl_d_block_sum(ss, shd);
        float rs = pl_norm_rstd(ss, D, eps);
        if (threadIdx.x == 0) RS[r] = rs;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            float wv = W ? pl_d_ldf(W, wd, j) : 0.0f;
            pl_d_stf(Y, yd, r * D + j,
                     pl_rms_norm_y(pl_d_ldf(X, xd, r * D + j), rs, W ? &wv : NULL, 0));
        }
    }
}

static pl_status k_rms_norm_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    pl_norm_fwd_io io;
    pl_norm_fwd_io_init(&io, a, true);
    if (!io.R) return PL_OK;
    int wd = io.w ? a->in[1]->dtype : PL_F32;
    k_rms_f<<<row_grid(io.R), T_ROW>>>(io.x, a->in[0]->dtype, io.w, wd, io.y, a->out[0]->dtype,
                                       io.rstd, io.R, io.D, a->p.eps);
    CUDA_LAUNCHED("rms_norm");
    return PL_OK;
}

static pl_status k_rms_norm_bwd(const pl_kernel_args *a) {
    return norm_bwd(a, true);
}

/* ---- registration ---------------------------------------------------------------------------------------- */

void pl_cuda_register_norm(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_SOFTMAX, k_softmax_fwd, k_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_LOG_SOFTMAX, k_softmax_fwd, k_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_CROSS_ENTROPY, k_ce_fwd, k_ce_bwd);
    static const pl_op ls[] = {PL_OP_MSE, PL_OP_MAE, PL_OP_HUBER};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        pl_kernel_table_set(t, ls[i], k_loss_fwd, k_loss_bwd);
    pl_kernel_table_set(t, PL_OP_LAYER_NORM, k_layer_norm_fwd, k_layer_norm_bwd);
    pl_kernel_table_set(t, PL_OP_RMS_NORM, k_rms_norm_fwd, k_rms_norm_bwd);
}
