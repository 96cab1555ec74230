/* kernels_norm.c - CPU forward / backward kernels of the softmax family
 * (softmax, log_softmax, last dim), the losses (cross entropy, MSE, MAE,
 * Huber) and normalization (layer norm, RMS norm): the "loss" and "norm"
 * families of ops.def. Conventions: kernels_dense.c. Registered by
 * pl_cpu_register_dense (through pl_cpu_register_dense_norm). */
#include <cblas.h>
#include <math.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h> /* row_max */
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels_dense_common.h"

/* ---- softmax family (last dim) -------------------------------------------- */

/* The max of a row, NaN entries skipped (pl_max_step). One running max is a
 * scalar loop of dependent vmaxss (GCC reorders no float max reduction, nor
 * vectorizes one written with 16 running maxima), which was a quarter of the
 * f32 cross-entropy forward once its exp vectorized; under AVX it is 4 x 8
 * running maxima. vmaxps(x, a) is x > a ? x : a, pl_max_step's select, so
 * NaN is skipped as before, and the result is the same value in any order (a
 * max picks an element; only the sign of a zero maximum could differ, which
 * no later use can see: x - m and m + log s are equal for m = +0 and -0). */
static inline float row_max(const float *x, int64_t n) {
    float m = -INFINITY;
    int64_t i = 0;
#if defined(__AVX__)
    if (n >= 32) {
        __m256 a0 = _mm256_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
        for (; i + 32 <= n; i += 32) {
            a0 = _mm256_max_ps(_mm256_loadu_ps(x + i), a0);
            a1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), a3);
        }
        float acc[32];
        _mm256_storeu_ps(acc, a0);
        _mm256_storeu_ps(acc + 8, a1);
        _mm256_storeu_ps(acc + 16, a2);
        _mm256_storeu_ps(acc + 24, a3);
        for (int j = 0; j < 32; j++)
            m = pl_max_step(m, acc[j]);
    }
#endif
    for (; i < n; i++)
        m = pl_max_step(m, x[i]);
    return m;
}

/* y[r] = softmax(x[r]) or log_softmax(x[r]) over a row of length d. */
static inline void softmax_row(const float *x, float *y, int64_t d, bool logsm) {
    float m = row_max(x, d);
    double s = 0;
    if (logsm) {
        for (int64_t j = 0; j < d; j++)
            s += pl_softmax_exp(x[j], m);
        float lse = pl_log_softmax_lse(m, s);
        for (int64_t j = 0; j < d; j++)
            y[j] = x[j] - lse;
    } else {
        for (int64_t j = 0; j < d; j++) {
            y[j] = pl_softmax_exp(x[j], m);
            s += y[j];
        }
        float inv = pl_softmax_inv(s);
        for (int64_t j = 0; j < d; j++)
            y[j] *= inv;
    }
}

#define last_dim_geom pl_last_dim_split /* t as [rows, last dim] (backend_util.h) */

static pl_status k_softmax_fwd(const pl_kernel_args *a) {
    int64_t rows, d;
    last_dim_geom(a->in[0], &rows, &d);
    const float *X = cf32(a->in[0]);
    float *Y = f32p(a->out[0]);
    bool logsm = a->op == PL_OP_LOG_SOFTMAX;
#pragma omp parallel for if (rows * d > PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        softmax_row(X + r * d, Y + r * d, d, logsm);
    return PL_OK;
}

/* From the saved output y = in[2] (derivatives.yaml's `result`; in[1], the
 * input, is a tape stub):
 *   softmax:     gx = y * (g - sum(g * y))
 *   log_softmax: gx = g - exp(y) * sum(g) */
static pl_status k_softmax_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    int64_t rows, d;
    last_dim_geom(a->in[2], &rows, &d);
    const float *G = cf32(a->in[0]), *Y = cf32(a->in[2]);
    float *D = f32p(gx);
    bool logsm = a->op == PL_OP_LOG_SOFTMAX;
#pragma omp parallel for if (rows * d > PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = G + r * d, *y = Y + r * d;
        float *o = D + r * d;
        double s = 0;
        if (logsm) {
            for (int64_t j = 0; j < d; j++)
                s += g[j];
            for (int64_t j = 0; j < d; j++)
                o[j] = pl_log_softmax_grad(g[j], y[j], (float)s);
        } else {
            for (int64_t j = 0; j < d; j++)
                s += (double)g[j] * y[j];
            for (int64_t j = 0; j < d; j++)
                o[j] = pl_softmax_grad(y[j], g[j], (float)s);
        }
    }
    return PL_OK;
}

/* ---- losses ------------------------------------------------------------------ */

static inline int64_t target_at(const pl_tensor *t, int64_t i) {
    return t->dtype == PL_I64 ? ((const int64_t *)pl_tensor_data(t))[i]
                              : (int64_t)((const int32_t *)pl_tensor_data(t))[i];
}

/* logits [N, C] f32, target [N] i64/i32 -> loss (0-dim), saved lse [N].
 * PyTorch: loss = (1-eps) * sum_valid(-logp[t]) / n_valid
 *               + eps/C * sum_valid(sum_c -logp[c]) / n_valid (kernel_math.h). */
/* Cross-entropy reads bf16 logits (autocast's logits GEMM output) in place:
 * each row is widened (exactly) into a per-thread f32 row, so there is no
 * [N, C] f32 copy forward and no gradient copy backward; the exponentials
 * of bf16 rows use pl_exp_neg (pl_softmax_exp_bf16: within a few f32 ulps
 * of expf, vectorized), everything else is the f32 code. */
typedef struct ce_rows {
    const float *x32;     /* f32 logits, or NULL */
    const uint16_t *x16;  /* bf16 logits, or NULL */
    int64_t C;
    scratch buf;          /* one row per thread */
} ce_rows;

static pl_status ce_rows_open(ce_rows *r, const pl_tensor *lg, int64_t C) {
    memset(r, 0, sizeof *r);
    r->C = C;
    if (lg->dtype == PL_F32) {
        r->x32 = cf32(lg);
        return PL_OK;
    }
    r->x16 = pl_tensor_data(lg);
    int nt = 1;
#if defined(_OPENMP)
    nt = omp_get_max_threads();
#endif
    return scratch_f32(&r->buf, (int64_t)nt * C) ? PL_OK : PL_ERR_NOMEM;
}

static inline const float *ce_row(const ce_rows *r, int64_t i) {
    if (r->x32) return r->x32 + i * r->C;
    int t = 0;
#if defined(_OPENMP)
    t = omp_get_thread_num();
#endif
    float *w = (float *)r->buf.p + (int64_t)t * r->C;
    const uint16_t *s = r->x16 + i * r->C;
    for (int64_t c = 0; c < r->C; c++)
        w[c] = pl_bf16_widen(s[c]);
    return w;
}

/* An f32 row's sum of pl_ce_exp(x - m) (*s) and of x (*sx), in f64: the
 * cross-entropy's and linear_cross_entropy's */
static inline void ce_sums_f32(const float *x, int64_t C, float m, double *s_out, double *sx_out) {
    double s = 0, sx = 0;
#pragma omp simd reduction(+ : s, sx)
    for (int64_t c = 0; c < C; c++) {
        s += pl_ce_exp(x[c], m);
        sx += x[c];
    }
    *s_out = s;
    *sx_out = sx;
}

static pl_status k_ce_fwd(const pl_kernel_args *a) {
    const pl_tensor *lg = a->in[0], *tg = a->in[1];
    int64_t N, C;
    last_dim_geom(lg, &N, &C);
    ce_rows X;
    if (ce_rows_open(&X, lg, C)) return PL_ERR_NOMEM;
    float *lse = f32p(a->out[1]);
    int64_t ign = a->p.ignore_index;
    double eps = a->p.alpha;
    double nll = 0, smooth = 0;
    int64_t valid = 0, bad = -1;
#pragma omp parallel for reduction(+ : nll, smooth, valid) if (N * C > PAR_MIN)
    for (int64_t i = 0; i < N; i++) {
        const float *x = ce_row(&X, i);
        float m = row_max(x, C);
        /* exp in f32 (both vectorized: pl_ce_exp within 1 ulp for f32 logits,
         * pl_exp_neg for bf16 ones), sums in f64 */
        double s = 0, sx = 0;
        if (X.x16) {
#pragma omp simd reduction(+ : s, sx)
            for (int64_t c = 0; c < C; c++) {
                s += pl_softmax_exp_bf16(x[c], m);
                sx += x[c];
            }
        } else {
            ce_sums_f32(x, C, m, &s, &sx);
        }
        double l = pl_ce_lse(m, s);
        lse[i] = (float)l;
        int64_t t = target_at(tg, i);
        if (t == ign) continue;
        if (t < 0 || t >= C) {
#pragma omp atomic write
            bad = i;
            continue;
        }
        valid++;
        nll += pl_ce_row_nll(l, x[t]);
        smooth += pl_ce_row_smooth(l, C, sx);
    }
    scratch_free(&X.buf);
    if (bad >= 0)
        return pl_error_set(PL_ERR_INVALID,
                            "cross_entropy: target[%lld] = %lld outside [0, %lld) and != "
                            "ignore_index %lld",
                            (long long)bad, (long long)target_at(tg, bad), (long long)C,
                            (long long)ign);
    f32p(a->out[0])[0] = (float)pl_ce_loss(nll, smooth, eps, C, (double)valid);
    return PL_OK;
}

/* gx[i,c] = g / n_valid * (p[i,c] - (1-eps) [c == t_i] - eps/C) for valid rows, 0 else. */
static pl_status k_ce_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    const pl_tensor *lg = a->in[1], *tg = a->in[2];
    const float *lse = cf32(a->in[3]);
    int64_t N, C;
    last_dim_geom(lg, &N, &C);
    ce_rows X;
    if (ce_rows_open(&X, lg, C)) return PL_ERR_NOMEM;
    float *D = f32p(gx);
    int64_t ign = a->p.ignore_index;
    float eps = (float)a->p.alpha;
    int64_t valid = 0;
    for (int64_t i = 0; i < N; i++)
        valid += target_at(tg, i) != ign;
    float scale = cf32(a->in[0])[0] / (float)valid;
    float off = pl_ce_smooth_off(eps, C);
#pragma omp parallel for if (N * C > PAR_MIN)
    for (int64_t i = 0; i < N; i++) {
        float *d = D + i * C;
        int64_t t = target_at(tg, i);
        if (t == ign) {
            for (int64_t c = 0; c < C; c++)
                d[c] = 0;
            continue;
        }
        const float *x = ce_row(&X, i);
        const float l = lse[i];
        if (X.x16) {
#pragma omp simd
            for (int64_t c = 0; c < C; c++)
                d[c] = pl_ce_grad_bf16(x[c], l, scale, off);
        } else {
#pragma omp simd
            for (int64_t c = 0; c < C; c++)
                d[c] = pl_ce_grad(x[c], l, scale, off);
        }
        if (t >= 0 && t < C) d[t] -= pl_ce_target_grad(scale, eps);
    }
    scratch_free(&X.buf);
    return PL_OK;
}

/* ---- linear_cross_entropy: cross_entropy(x W^T, target) without the logits ----
 * (ops.h pl_linear_cross_entropy; Liger-Kernel's FusedLinearCrossEntropy,
 * Wijmans et al. 2024.) Rows go in blocks of lce_rows: the block's logits
 * [b, V] = x_blk W^T (one sgemm into a scratch that stays in cache, where
 * the unfused chain writes and rereads N x V floats: the logits, their
 * gradient), each row's max, f64 sums and logsumexp as k_ce_fwd computes
 * them (row_max, pl_ce_exp, pl_ce_lse: the chain's loss to f32 rounding),
 * then, when a gradient is wanted (p.flags bit0: x's, bit1: W's), the
 * block becomes the loss's gradient at g = 1 in place (k_ce_bwd's
 * pl_ce_grad from the f32 lse: its values) and one more sgemm for each:
 * dx_blk = dl W, dW += dl^T x_blk (a frozen head costs what the chain's
 * matmul backward does: no dW).
 *
 * Threads: the blocks are split into `lanes` contiguous runs, one per
 * OpenMP thread, each thread running single-threaded sgemms on its own
 * blocks (its scratch stays in its core's cache; one parallel region per
 * call, not three sgemm hand-offs and a softmax loop per block) into its
 * own dW partial, summed in lane order at the end. One lane (one thread,
 * an OpenBLAS that is not OpenMP's, or W too large for a partial per
 * thread) runs the blocks in order with OpenBLAS's pool inside each sgemm
 * and OpenMP over the block's rows. The per-row losses are summed in row
 * order and dx's rows are each one block's, so the loss and dx do not
 * depend on the thread count; dW does (the partials), and is the same run
 * to run. */
#define LCE_ROWS 128                      /* rows per block (docs/benchmarks.md) */
#define LCE_BLOCK_FLOATS ((int64_t)1 << 21) /* at most 8 MiB of logits per block */
#define LCE_PARTIAL_FLOATS ((int64_t)1 << 24) /* dW partials of all lanes: 64 MiB */

static int64_t lce_rows(int64_t V) {
    int64_t b = LCE_ROWS;
    while (b > 8 && b * V > LCE_BLOCK_FLOATS) b /= 2;
    return b;
}

typedef struct lce_job {
    const float *X, *W;
    const pl_tensor *tg;
    int64_t N, K, V, B, ign;
    float scale, eps, off;
    bool grads, gx, gw; /* dl wanted; dx, dW wanted (p.flags bit0, bit1) */
    float *DX;
    double *R; /* [N, 2]: each row's nll and smoothing terms */
} lce_job;

/* Blocks [b0, b1) with scratch S [B, V], dW accumulated into dw (the first
 * block overwrites it); serial: one thread's sgemms (inside a parallel
 * region, where OpenMP's OpenBLAS runs on the calling thread), else
 * OpenBLAS's pool and OpenMP over the rows. */
/* one row-major sgemm of lce_blocks: on the calling thread (serial) or
 * through pl_sgemm (OpenBLAS's pool for a large product) */
static void lce_gemm(bool serial, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                     int64_t lda, const float *B, float beta, float *C) {
    if (serial)
        cblas_sgemm(CblasRowMajor, (enum CBLAS_TRANSPOSE)ta, (enum CBLAS_TRANSPOSE)tb, (int)M,
                    (int)N, (int)K, 1.0f, A, (int)lda, B, tb == CblasTrans ? (int)K : (int)N,
                    beta, C, (int)N);
    else
        pl_sgemm(CblasRowMajor, ta, tb, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B,
                 tb == CblasTrans ? (int)K : (int)N, beta, C, (int)N);
}

static void lce_blocks(const lce_job *j, int64_t b0, int64_t b1, float *S, float *dw,
                       bool serial) {
    int64_t K = j->K, V = j->V;
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t r0 = blk * j->B, b = j->N - r0 < j->B ? j->N - r0 : j->B;
        const float *xb = j->X + r0 * K;
        lce_gemm(serial, CblasNoTrans, CblasTrans, b, V, K, xb, K, j->W, 0.0f, S); /* logits */
#pragma omp parallel for if (!serial && b * V > PAR_MIN)
        for (int64_t i = 0; i < b; i++) {
            float *x = S + i * V;
            int64_t t = target_at(j->tg, r0 + i);
            double *R = j->R + 2 * (r0 + i);
            R[0] = R[1] = 0;
            if (t == j->ign) {
                if (j->grads) memset(x, 0, (size_t)V * sizeof(float));
                continue;
            }
            float m = row_max(x, V);
            double s, sx;
            ce_sums_f32(x, V, m, &s, &sx);
            double l = pl_ce_lse(m, s);
            R[0] = pl_ce_row_nll(l, x[t]);
            R[1] = pl_ce_row_smooth(l, V, sx);
            if (!j->grads) continue;
            const float lf = (float)l, scale = j->scale, off = j->off;
#pragma omp simd
            for (int64_t c = 0; c < V; c++)
                x[c] = pl_ce_grad(x[c], lf, scale, off);
            x[t] -= pl_ce_target_grad(scale, j->eps);
        }
        float beta = blk > b0 ? 1.0f : 0.0f;
        if (j->gx) /* dx_blk = dl W */
            lce_gemm(serial, CblasNoTrans, CblasNoTrans, b, K, V, S, V, j->W, 0.0f, j->DX + r0 * K);
        if (j->gw) /* dW += dl^T x_blk */
            lce_gemm(serial, CblasTrans, CblasNoTrans, V, K, b, S, V, xb, beta, dw);
    }
}

static pl_status k_lce_fwd(const pl_kernel_args *a) {
    lce_job j = {.X = cf32(a->in[0]), .W = cf32(a->in[1]), .tg = a->in[2],
                 .N = a->in[0]->shape[0], .K = a->in[0]->shape[1], .V = a->in[1]->shape[0],
                 .ign = a->p.ignore_index, .gx = a->p.flags & 1, .gw = a->p.flags >> 1 & 1};
    j.grads = j.gx || j.gw;
    int64_t N = j.N, V = j.V, K = j.K, valid = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = target_at(j.tg, i);
        if (t == j.ign) continue;
        if (t < 0 || t >= V)
            return pl_error_set(PL_ERR_INVALID,
                                "linear_cross_entropy: target[%lld] = %lld outside [0, %lld) and "
                                "!= ignore_index %lld",
                                (long long)i, (long long)t, (long long)V, (long long)j.ign);
        valid++;
    }
    /* k_ce_bwd's scale at g = 1 (backward multiplies by g) */
    double eps = a->p.alpha;
    j.scale = 1.0f / (float)valid;
    j.eps = (float)eps;
    j.off = pl_ce_smooth_off(j.eps, V);
    j.B = lce_rows(V);
    j.DX = j.gx ? f32p(a->out[1]) : NULL;
    float *DW = j.gw ? f32p(a->out[2]) : NULL;
    int64_t nblk = (N + j.B - 1) / j.B, lanes = 1;
#if defined(_OPENMP)
    lanes = omp_get_max_threads();
    if (strcmp(pl_blas_parallel(), "openmp") != 0) lanes = 1; /* its own pool: no nesting */
    if (lanes > nblk) lanes = nblk;
    while (lanes > 1 && j.gw && (lanes - 1) * V * K > LCE_PARTIAL_FLOATS) lanes--;
#endif
    if (lanes > 1) { /* as many blocks per lane, of as many rows (at most B): no lane waits */
        nblk = lanes * ((N + lanes * j.B - 1) / (lanes * j.B));
        j.B = (N + nblk - 1) / nblk;
        nblk = (N + j.B - 1) / j.B;
    }
    scratch ss, sr, sp = {0};
    float *S = scratch_f32(&ss, lanes * j.B * V);
    j.R = (double *)scratch_f32(&sr, 4 * N);
    float *P = lanes > 1 && j.gw ? scratch_f32(&sp, (lanes - 1) * V * K) : NULL;
    pl_status st = PL_OK;
    if (!S || !j.R || (lanes > 1 && j.gw && !P)) {
        st = PL_ERR_NOMEM;
    } else if (lanes == 1) {
        lce_blocks(&j, 0, nblk, S, DW, false);
    } else {
#pragma omp parallel num_threads((int)lanes)
        {
            int64_t l = omp_get_thread_num(), n = omp_get_num_threads();
            int64_t b0 = nblk * l / n, b1 = nblk * (l + 1) / n;
            float *dw = !j.gw ? NULL : l ? P + (l - 1) * V * K : DW;
            if (j.gw && b0 == b1) memset(dw, 0, (size_t)(V * K) * sizeof(float));
            lce_blocks(&j, b0, b1, S + l * j.B * V, dw, true);
        }
        /* dW = lane 0's partial + lane 1's + ..., in lane order */
        if (j.gw)
#pragma omp parallel for if (V * K > PAR_MIN)
            for (int64_t e = 0; e < V * K; e++) {
                float v = DW[e];
                for (int64_t l = 1; l < lanes; l++) v += P[(l - 1) * V * K + e];
                DW[e] = v;
            }
    }
    double nll = 0, smooth = 0;
    for (int64_t i = 0; !st && i < N; i++) {
        nll += j.R[2 * i];
        smooth += j.R[2 * i + 1];
    }
    scratch_free(&ss);
    scratch_free(&sr);
    scratch_free(&sp);
    if (st) return st;
    f32p(a->out[0])[0] = (float)pl_ce_loss(nll, smooth, eps, V, (double)valid);
    return PL_OK;
}

/* in = g, x, W, target (stubs but W), dx, dW (forward's, at g = 1);
 * out = gx, gW: g dx and g dW (the same bits at g = 1). */
static pl_status k_lce_bwd(const pl_kernel_args *a) {
    float g = cf32(a->in[0])[0];
    for (int o = 0; o < 2; o++) {
        pl_tensor *d = a->out[o];
        if (!d) continue;
        const pl_tensor *sv = a->in[4 + o];
        int64_t n = pl_tensor_numel(d);
        if (pl_tensor_numel(sv) != n)
            return pl_error_set(PL_ERR_INTERNAL,
                                "linear_cross_entropy backward: saved gradient %d has %lld "
                                "elements, the input %lld (forward ran without gradients)",
                                o, (long long)pl_tensor_numel(sv), (long long)n);
        const float *src = cf32(sv);
        float *dst = f32p(d);
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = g * src[i];
    }
    return PL_OK;
}

/* mse / mae / huber, mean reduction; pred and target same shape. */
static pl_status k_loss_fwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->in[0]);
    const float *P = cf32(a->in[0]), *T = cf32(a->in[1]);
    double delta = a->p.alpha, s = 0;
    pl_op op = a->op;
#pragma omp parallel for reduction(+ : s) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        s += pl_loss_term(op, (double)P[i] - T[i], delta);
    }
    f32p(a->out[0])[0] = (float)(s / (double)n);
    return PL_OK;
}

static pl_status k_loss_bwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->in[1]);
    const float *P = cf32(a->in[1]), *T = cf32(a->in[2]);
    float g = cf32(a->in[0])[0] / (float)n, delta = (float)a->p.alpha;
    float *GP = a->out[0] ? f32p(a->out[0]) : NULL;
    float *GT = a->out[1] ? f32p(a->out[1]) : NULL;
    pl_op op = a->op;
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = pl_loss_grad(op, P[i] - T[i], delta) * g;
        if (GP) GP[i] = v;
        if (GT) GT[i] = -v;
    }
    return PL_OK;
}

/* ---- normalization --------------------------------------------------------- */

/* layer_norm: in = x [R, D], w [D] if flags&1, b [D] if flags&2;
 * out[0] = y, out[1] = mean [R], out[2] = rstd [R] (pl_norm_fwd_io). */
static pl_status k_layer_norm_fwd(const pl_kernel_args *a) {
    pl_norm_fwd_io io;
    pl_norm_fwd_io_init(&io, a, false);
    int64_t R = io.R, D = io.D;
    const float *X = io.x, *W = io.w, *B = io.b;
    float *Y = io.y, *MU = io.mean, *RS = io.rstd;
    double eps = a->p.eps;
#pragma omp parallel for if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *x = X + r * D;
        float *y = Y + r * D;
        double s = 0, ss = 0;
        for (int64_t j = 0; j < D; j++)
            s += x[j];
        double mu = s / (double)D;
        for (int64_t j = 0; j < D; j++)
            ss += pl_layer_norm_sqdev(x[j], mu);
        float rs = pl_norm_rstd(ss, D, eps);
        float m = (float)mu;
        MU[r] = m;
        RS[r] = rs;
        for (int64_t j = 0; j < D; j++)
            y[j] = pl_layer_norm_y(x[j], m, rs, W, B, j);
    }
    return PL_OK;
}

/* in = g, x, [w], [b], mean, rstd; out = gx, [gw], [gb].
 * xhat = (x - mu) rstd, gy = g * w:
 * gx = rstd (gy - mean(gy) - xhat mean(gy xhat)), gw = sum_r g xhat, gb = sum_r g. */
static pl_status k_layer_norm_bwd(const pl_kernel_args *a) {
    pl_norm_bwd_io io;
    pl_norm_bwd_io_init(&io, a, false);
    int64_t R = io.R, D = io.D;
    const float *G = io.g, *X = io.x, *W = io.w, *MU = io.mean, *RS = io.rstd;
    float *GX = io.gx, *GW = io.gw, *GB = io.gb;
    if (GX) {
#pragma omp parallel for if (R * D > PAR_MIN)
        for (int64_t r = 0; r < R; r++) {
            const float *g = G + r * D, *xr = X + r * D;
            float mu = MU[r], rs = RS[r];
            double s1 = 0, s2 = 0;
            for (int64_t j = 0; j < D; j++) {
                float gy = pl_norm_gy(g[j], W, j);
                s1 += gy;
                s2 += (double)gy * pl_norm_xhat(xr[j], mu, rs);
            }
            float m1 = (float)(s1 / (double)D), m2 = (float)(s2 / (double)D);
            float *gx = GX + r * D;
            for (int64_t j = 0; j < D; j++)
                gx[j] = pl_layer_norm_gx(pl_norm_gy(g[j], W, j), pl_norm_xhat(xr[j], mu, rs), rs,
                                         m1, m2);
        }
    }
    if (GW || GB) {
#pragma omp parallel for if (R * D > PAR_MIN)
        for (int64_t j = 0; j < D; j++) {
            double sw = 0, sb = 0;
            for (int64_t r = 0; r < R; r++) {
                float g = G[r * D + j];
                sw += (double)g * pl_norm_xhat(X[r * D + j], MU[r], RS[r]);
                sb += g;
            }
            if (GW) GW[j] = (float)sw;
            if (GB) GB[j] = (float)sb;
        }
    }
    return PL_OK;
}

/* rms_norm: in = x [R, D], w [D] if flags&1; out[0] = y, out[1] = rstd [R]. */
static pl_status k_rms_norm_fwd(const pl_kernel_args *a) {
    pl_norm_fwd_io io;
    pl_norm_fwd_io_init(&io, a, true);
    int64_t R = io.R, D = io.D;
    const float *X = io.x, *W = io.w;
    float *Y = io.y, *RS = io.rstd;
    double eps = a->p.eps;
#pragma omp parallel for if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *x = X + r * D;
        float *y = Y + r * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++)
            ss += (double)x[j] * x[j];
        float rs = pl_norm_rstd(ss, D, eps);
        RS[r] = rs;
        for (int64_t j = 0; j < D; j++)
            y[j] = pl_rms_norm_y(x[j], rs, W, j);
    }
    return PL_OK;
}

/* in = g, x, [w], rstd; gx = rstd (gy - xhat mean(gy xhat)), gw = sum_r g xhat. */
static pl_status k_rms_norm_bwd(const pl_kernel_args *a) {
    pl_norm_bwd_io io;
    pl_norm_bwd_io_init(&io, a, true);
    int64_t R = io.R, D = io.D;
    const float *G = io.g, *X = io.x, *W = io.w, *RS = io.rstd;
    float *GX = io.gx, *GW = io.gw;
    if (GX) {
#pragma omp parallel for if (R * D > PAR_MIN)
        for (int64_t r = 0; r < R; r++) {
            const float *g = G + r * D, *xr = X + r * D;
            float rs = RS[r];
            double s2 = 0;
            for (int64_t j = 0; j < D; j++)
                s2 += pl_rms_norm_dot(pl_norm_gy(g[j], W, j), xr[j], rs);
            float m2 = (float)(s2 / (double)D);
            float *gx = GX + r * D;
            for (int64_t j = 0; j < D; j++)
                gx[j] = pl_rms_norm_gx(pl_norm_gy(g[j], W, j), xr[j], rs, m2);
        }
    }
    if (GW) {
#pragma omp parallel for if (R * D > PAR_MIN)
        for (int64_t j = 0; j < D; j++) {
            double s = 0;
            for (int64_t r = 0; r < R; r++)
                s += pl_rms_norm_dot(G[r * D + j], X[r * D + j], RS[r]);
            GW[j] = (float)s;
        }
    }
    return PL_OK;
}

void pl_cpu_register_dense_norm(pl_kernel_table *b) {
    b->forward[PL_OP_SOFTMAX] = b->forward[PL_OP_LOG_SOFTMAX] = k_softmax_fwd;
    b->backward[PL_OP_SOFTMAX] = b->backward[PL_OP_LOG_SOFTMAX] = k_softmax_bwd;
    b->forward[PL_OP_CROSS_ENTROPY] = k_ce_fwd;
    b->backward[PL_OP_CROSS_ENTROPY] = k_ce_bwd;
    b->forward[PL_OP_LINEAR_CROSS_ENTROPY] = k_lce_fwd;
    b->backward[PL_OP_LINEAR_CROSS_ENTROPY] = k_lce_bwd;
    static const pl_op ls[] = {PL_OP_MSE, PL_OP_MAE, PL_OP_HUBER};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        b->forward[ls[i]] = k_loss_fwd;
        b->backward[ls[i]] = k_loss_bwd;
    }
    b->forward[PL_OP_LAYER_NORM] = k_layer_norm_fwd;
    b->backward[PL_OP_LAYER_NORM] = k_layer_norm_bwd;
    b->forward[PL_OP_RMS_NORM] = k_rms_norm_fwd;
    b->backward[PL_OP_RMS_NORM] = k_rms_norm_bwd;
}
