/* cuda_matmul.cu - matmul through cuBLAS (row-major via C^T = B^T A^T), the cuBLAS
 * handles, the allow_tf32 option: the GPU twin of the CPU backend's kernels_matmul.c. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- cuBLAS handles (one per device, created on first use) --------------------- */

static cublasHandle_t g_blas[PL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_blas_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *blas_str(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

static cublasHandle_t blas_handle(int dev) {
    if (dev < 0 || dev >= PL_CUDA_MAX_DEVICES) {
        pl_error_set(PL_ERR_DEVICE, "cuda backend: device index %d out of range", dev);
        return NULL;
    }
    pthread_mutex_lock(&g_blas_mu);
    if (!g_blas[dev]) {
        cublasHandle_t h;
        cublasStatus_t s = cublasCreate(&h);
        if (s != CUBLAS_STATUS_SUCCESS)
            pl_error_set(PL_ERR_DEVICE, "cublasCreate on cuda:%d failed: %s", dev, blas_str(s));
        else {
            /* f32 GEMMs stay true f32 (no TF32): results match the CPU backend */
            cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
            /* the calling thread's stream (cuda_common.cuh), resolved at each call */
            cublasSetStream(h, cudaStreamPerThread);
            /* a workspace of ours, set after the stream (cublasSetStream resets
             * it): cuBLAS then never allocates inside a captured graph
             * (PyTorch's CUBLAS_WORKSPACE_CONFIG rule); 32 MiB as cuBLAS
             * recommends for Hopper */
            void *ws = NULL;
            if (cudaMalloc(&ws, (size_t)32 << 20) == cudaSuccess)
                cublasSetWorkspace(h, ws, (size_t)32 << 20);
            else
                cudaGetLastError(); /* without it cuBLAS uses its own pool (eager is fine) */
            g_blas[dev] = h;
        }
    }
    cublasHandle_t h = g_blas[dev];
    pthread_mutex_unlock(&g_blas_mu);
    return h;
}

cublasHandle_t pl_cu_blas_handle(int dev) { return blas_handle(dev); }
const char *pl_cu_blas_status(cublasStatus_t s) { return blas_str(s); }

/* ---- matmul (cuBLAS, row-major via C^T = B^T A^T) ------------------------------------------ */

/* [pipeline] allow_tf32 (set_option): f32 x f32 GEMMs may use TF32 tensor
 * cores. Off by default (torch.backends.cuda.matmul.allow_tf32 = False). */
static bool g_allow_tf32;

pl_status cu_set_option(const char *key, const char *value) {
    if (!strcmp(key, "allow_tf32")) {
        g_allow_tf32 = !strcmp(value, "true") || !strcmp(value, "1");
        return PL_OK;
    }
    /* the adamw / sgd kernels read the step's found_inf flag on the device
     * (cuda_optim.cu), so the trainer may keep the loss there */
    if (!strcmp(key, "optimizer_found_inf")) return PL_OK;
    /* and keep a counted call's step count on the device (ops.h) */
    if (!strcmp(key, "optimizer_step_count")) return PL_OK;
    /* and lora_add honours its dropout bit (p.flags bit1, ABI 2.12) */
    if (!strcmp(key, "lora_add_dropout")) return PL_OK;
    if (!strcmp(key, "fuse")) return pl_cu_fuse_option(value); /* cuda_fuse.cu */
    if (!strcmp(key, "lstm")) return pl_cu_lstm_option(value); /* cuda_lstm_native.cu */
    return pl_error_set(PL_ERR_UNSUPPORTED, "cuda backend: no setting '%s'", key);
}

static cudaDataType_t cu_type(pl_dtype dt) {
    return dt == PL_BF16 ? CUDA_R_16BF : dt == PL_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Row-major C[M,N] (+batch) = alpha op(A) op(B) + beta C, where A is stored
 * [M,K] (ta: [K,M]) and B [K,N] (tb: [N,K]), f32 accumulation. cuBLAS is
 * column-major: a row-major X is X^T to it, so we ask for
 * C^T[N,M] = op(B)^T op(A)^T, i.e. gemm(opB, opA, N, M, K, B, A). */
static pl_status rm_gemm_ab(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                            float alpha, const void *A, cudaDataType_t at, int64_t sA,
                            const void *B, cudaDataType_t bt, int64_t sB, float beta, void *C,
                            cudaDataType_t ct, int64_t sC, int64_t batch) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "cuda matmul: dims %lld x %lld x %lld (batch %lld) "
                            "exceed cuBLAS's int range",
                            (long long)M, (long long)N, (long long)K, (long long)batch);
    int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
    cublasStatus_t s = cublasGemmStridedBatchedEx(
        h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K,
        &alpha, B, bt, ldb, sB, A, at, lda, sA, &beta, C, ct, (int)N, sC, (int)batch,
        g_allow_tf32 && at == CUDA_R_32F && bt == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                             : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return pl_error_set(PL_ERR_DEVICE, "cuda matmul: cublasGemmStridedBatchedEx failed: %s",
                            blas_str(s));
    return PL_OK;
}

/* rm_gemm_ab with alpha = 1 */
static pl_status rm_gemm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                         const void *A, cudaDataType_t at, int64_t sA, const void *B,
                         cudaDataType_t bt, int64_t sB, float beta, void *C, cudaDataType_t ct,
                         int64_t sC, int64_t batch) {
    return rm_gemm_ab(h, ta, tb, M, N, K, 1.0f, A, at, sA, B, bt, sB, beta, C, ct, sC, batch);
}

/* A batch count is "uniform" when one stride describes it: every matrix (n ==
 * nbatch) or one shared matrix (n == 1, stride 0). */
static bool uniform(int64_t n, int64_t nbatch) { return n == nbatch || n == 1; }

static pl_status k_matmul_fwd(const pl_kernel_args *a) {
    const pl_tensor *A = a->in[0], *B = a->in[1];
    pl_tensor *C = a->out[0];
    if (A->dtype != B->dtype || A->dtype != C->dtype ||
        !(A->dtype == PL_F32 || A->dtype == PL_BF16 || A->dtype == PL_F16))
        return pl_error_set(PL_ERR_DTYPE, "cuda matmul: dtypes %s @ %s -> %s not supported",
                            pl_dtype_name(A->dtype), pl_dtype_name(B->dtype),
                            pl_dtype_name(C->dtype));
    if (pl_cu_set_device(A)) return pl_error_status();
    cublasHandle_t h = blas_handle(A->device.index);
    if (!h) return pl_error_status();
    pl_mm_geo g;
    pl_mm_geo_init(&g, A, B, C, a->p.flags);
    int64_t M = g.M, N = g.N, K = g.K;
    if (M == 0 || N == 0 || g.nbatch == 0) return PL_OK;
    if (K == 0) {
        CUDA_TRY(cudaMemset(pl_tensor_data(C), 0, pl_tensor_nbytes(C)));
        return PL_OK;
    }
    cudaDataType_t t = cu_type(A->dtype);
    size_t es = pl_dtype_size(A->dtype);
    const char *pa = (const char *)pl_tensor_data(A), *pb = (const char *)pl_tensor_data(B);
    char *pc = (char *)pl_tensor_data(C);
    if (!g.ta && g.nb == 1 && g.na == g.nbatch) /* shared B: one GEMM of nbatch*M rows */
        return rm_gemm(h, false, g.tb, g.nbatch * M, N, K, pa, t, 0, pb, t, 0, 0.0f, pc, t, 0, 1);
    if (uniform(g.na, g.nbatch) && uniform(g.nb, g.nbatch))
        return rm_gemm(h, g.ta, g.tb, M, N, K, pa, t, g.na == 1 ? 0 : M * K, pb, t,
                       g.nb == 1 ? 0 : K * N, 0.0f, pc, t, M * N, g.nbatch);
    for (int64_t bi = 0; bi < g.nbatch; bi++) { /* general batch broadcast */
        int64_t ia, ib;
        pl_mm_batch_off(&g, bi, &ia, &ib);
        if (rm_gemm(h, g.ta, g.tb, M, N, K, pa + (size_t)(ia * M * K) * es, t, 0,
                    pb + (size_t)(ib * K * N) * es, t, 0, 0.0f, pc + (size_t)(bi * M * N) * es, t,
                    0, 1))
            return pl_error_status();
    }
    return PL_OK;
}

const void *pl_cu_as_dtype(const pl_tensor *G, pl_dtype dt, pl_cu_scratch *s, pl_status *st) {
    int64_t n = pl_tensor_numel(G);
    void *p = pl_cu_scratch_get(s, G->device, (size_t)n * pl_dtype_size(dt));
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    pl_cu_geom gg;
    pl_cu_geom_contig(&gg, G->ndim, G->shape);
    *st = pl_cu_strided_copy(p, dt, pl_tensor_data(G), G->dtype, &gg, n, true);
    return *st ? NULL : p;
}

/* in = {G [.., M, N] f32, A, B}; out = {dA (A's shape), dB (B's shape)} f32.
 * Half (bf16 / f16) operands stay half: G is rounded to their dtype and the
 * GEMMs read half and accumulate and write f32 (CUBLAS_COMPUTE_32F), as
 * PyTorch's autograd does for a bf16 matmul, whose grad_output is bf16 (its
 * mm backward runs in the operands' dtype). Widening the operands to f32
 * instead ran the 7B backward on the f32 (non-tensor-core) path, 7x the
 * forward's time (H200, 2026-11-27 profile). */
static pl_status k_matmul_bwd(const pl_kernel_args *a) {
    const pl_tensor *G = a->in[0];
    pl_tensor *dA = a->out[0], *dB = a->out[1];
    if (!dA && !dB) return PL_OK;
    if (pl_cu_set_device(G)) return pl_error_status();
    cublasHandle_t h = blas_handle(G->device.index);
    if (!h) return pl_error_status();
    pl_mm_geo g;
    pl_mm_geo_init(&g, a->in[1], a->in[2], G, a->p.flags);
    int64_t M = g.M, N = g.N, K = g.K;
    bool ta = g.ta, tb = g.tb;
    pl_status st = PL_OK;
    pl_cu_scratch sa = {0}, sb = {0}, sg = {0};
    pl_dtype odt = a->in[1]->dtype;
    bool half = (odt == PL_BF16 || odt == PL_F16) && a->in[2]->dtype == odt;
    const cudaDataType_t f = CUDA_R_32F, it = half ? cu_type(odt) : f;
    size_t es = half ? 2 : sizeof(float);
    const char *A = NULL, *B = NULL, *Gp = NULL;
    if (half) {
        A = dB ? (const char *)pl_tensor_data(a->in[1]) : NULL;
        B = dA ? (const char *)pl_tensor_data(a->in[2]) : NULL;
        Gp = (const char *)pl_cu_as_dtype(G, odt, &sg, &st);
    } else {
        A = dB ? (const char *)pl_cu_as_f32(a->in[1], &sa, &st) : NULL;
        B = !st && dA ? (const char *)pl_cu_as_f32(a->in[2], &sb, &st) : NULL;
        Gp = (const char *)pl_tensor_data(G);
    }
    float *pdA = dA ? fp(dA) : NULL, *pdB = dB ? fp(dB) : NULL;
    if (st) goto done;
    if (pdA && (g.na != g.nbatch || N == 0 || M * K == 0))
        if (cudaMemset(pdA, 0, (size_t)(g.na * M * K) * sizeof(float)) != cudaSuccess) {
            st = pl_error_set(PL_ERR_DEVICE, "cuda matmul backward: cudaMemset failed");
            goto done;
        }
    if (pdB && (g.nb != g.nbatch || M == 0 || K * N == 0))
        if (cudaMemset(pdB, 0, (size_t)(g.nb * K * N) * sizeof(float)) != cudaSuccess) {
            st = pl_error_set(PL_ERR_DEVICE, "cuda matmul backward: cudaMemset failed");
            goto done;
        }
    if (M == 0 || N == 0 || K == 0 || g.nbatch == 0) goto done;
    if (!ta && g.nb == 1 && g.na == g.nbatch) {
        /* shared B, A rows stacked: dA = G op(B)^T, dB = sum over all rows */
        int64_t Mt = g.nbatch * M;
        if (pdA && (st = rm_gemm(h, false, !tb, Mt, K, N, Gp, it, 0, B, it, 0, 0.0f, pdA, f, 0, 1)))
            goto done;
        if (pdB) {
            if (!tb) /* dB [K,N] = A^T G */
                st = rm_gemm(h, true, false, K, N, Mt, A, it, 0, Gp, it, 0, 0.0f, pdB, f, 0, 1);
            else /* dB [N,K] = G^T A */
                st = rm_gemm(h, true, false, N, K, Mt, Gp, it, 0, A, it, 0, 0.0f, pdB, f, 0, 1);
        }
        goto done;
    }
    /* dA: !ta -> dA[M,K] = G op(B)^T ; ta -> dA[K,M] = op(B) G^T
     * dB: !tb -> dB[K,N] = op(A)^T G ; tb -> dB[N,K] = G^T op(A) */
    if (pdA) {
        if (g.na == g.nbatch && uniform(g.nb, g.nbatch)) {
            int64_t sB = g.nb == 1 ? 0 : K * N;
            st = !ta ? rm_gemm(h, false, !tb, M, K, N, Gp, it, M * N, B, it, sB, 0.0f, pdA, f,
                               M * K, g.nbatch)
                     : rm_gemm(h, tb, true, K, M, N, B, it, sB, Gp, it, M * N, 0.0f, pdA, f,
                               M * K, g.nbatch);
        } else { /* broadcast A: accumulate batch by batch (dA zeroed above) */
            for (int64_t bi = 0; bi < g.nbatch && !st; bi++) {
                int64_t ia, ib;
                pl_mm_batch_off(&g, bi, &ia, &ib);
                const char *gb = Gp + (size_t)(bi * M * N) * es, *bb = B + (size_t)(ib * K * N) * es;
                float *d = pdA + ia * M * K;
                st = !ta ? rm_gemm(h, false, !tb, M, K, N, gb, it, 0, bb, it, 0, 1.0f, d, f, 0, 1)
                         : rm_gemm(h, tb, true, K, M, N, bb, it, 0, gb, it, 0, 1.0f, d, f, 0, 1);
            }
        }
        if (st) goto done;
    }
    if (pdB) {
        if (g.nb == g.nbatch && uniform(g.na, g.nbatch)) {
            int64_t sA = g.na == 1 ? 0 : M * K;
            st = !tb ? rm_gemm(h, !ta, false, K, N, M, A, it, sA, Gp, it, M * N, 0.0f, pdB, f,
                               K * N, g.nbatch)
                     : rm_gemm(h, true, ta, N, K, M, Gp, it, M * N, A, it, sA, 0.0f, pdB, f,
                               K * N, g.nbatch);
        } else {
            for (int64_t bi = 0; bi < g.nbatch && !st; bi++) {
                int64_t ia, ib;
                pl_mm_batch_off(&g, bi, &ia, &ib);
                const char *gb = Gp + (size_t)(bi * M * N) * es, *ab = A + (size_t)(ia * M * K) * es;
                float *d = pdB + ib * K * N;
                st = !tb ? rm_gemm(h, !ta, false, K, N, M, ab, it, 0, gb, it, 0, 1.0f, d, f, 0, 1)
                         : rm_gemm(h, true, ta, N, K, M, gb, it, 0, ab, it, 0, 1.0f, d, f, 0, 1);
            }
        }
    }
done:
    pl_cu_scratch_free(&sa);
    pl_cu_scratch_free(&sb);
    pl_cu_scratch_free(&sg);
    return st;
}

/* ---- lora_add: y + scale ((x A^T) * gexp) B^T, the CPU's k_lora_add_* --------------------------
 * Forward: cuBLAS t = x A^T (written in the compute dtype c = x's), one
 * gate kernel u = rne_c(t g), then the copy of y into out and the second
 * GEMM accumulating into it with alpha = scale, beta = 1 (the epilogue; beta
 * = 0 without y): three launches and a copy for the chain's six. Backward
 * (formulas: kernels_matmul.c of the CPU backend): half operands stay half,
 * G rounded to c as k_matmul_bwd does, f32 accumulation and gradients.
 * With dropout (p.flags bit1, pl_lora_add_dropout): one more launch forward
 * (drop(x) into a transient scratch for t), two backward (drop(x) again for
 * dA; dx masked in place). */

/* o[n, r] = rne_c(t[n, r] g[n / gs, r]) (o in c; g any float dtype) */
__global__ void k_lora_gate(const void *T, int c, const void *G, int gd, void *O, int64_t N,
                            int64_t R, int64_t gs) {
    GRID_LOOP(i, N * R) {
        int64_t n = i / R, r = i - n * R;
        float g = pl_d_ldf(G, gd, (n / gs) * R + r);
        pl_d_stf(O, c, i, pl_math_lora_gate(pl_d_ldf(T, c, i), g, (pl_dtype)c));
    }
}

/* dg[gr, r] = sum over the gs rows of gate row gr of du t; dt = rne_c(du g)
 * into DT (in c) for the dA / dx GEMMs, or du itself rounded when no gate */
__global__ void k_lora_dg(const float *DU, const void *T, int c, float *DG, int64_t NG, int64_t R,
                          int64_t gs, int64_t N) {
    GRID_LOOP(i, NG * R) {
        int64_t gr = i / R, r = i - gr * R;
        float s = 0.0f;
        for (int64_t k = 0; k < gs && gr * gs + k < N; k++) {
            int64_t j = (gr * gs + k) * R + r;
            s += DU[j] * pl_d_ldf(T, c, j);
        }
        DG[i] = s;
    }
}

__global__ void k_lora_dt(const float *DU, const void *G, int gd, void *DT, int c, int64_t N,
                          int64_t R, int64_t gs) {
    GRID_LOOP(i, N * R) {
        int64_t n = i / R, r = i - n * R;
        float v = G ? DU[i] * pl_d_ldf(G, gd, (n / gs) * R + r) : DU[i];
        pl_d_stf(DT, c, i, v);
    }
}

/* lora_add's dropout (p.flags bit1): dst[i] = drop(src[i]) with k_dropout_f's
 * stream (cuda_index.cu, kernel_math.h's pl_dropout_draw / keep / apply: the
 * CPU's mask bits), no mask stored; src in sdt, dst in ddt, in place allowed
 * (dx). The forward writes drop(x) for t, the backward again for dA, then
 * masks dx. */
__global__ void k_lora_drop(const void *src, int sdt, void *dst, int ddt, int64_t n, float p,
                            float scale, uint64_t seed, uint64_t counter, const int64_t *delta,
                            int64_t stride) {
    if (delta) counter += (uint64_t)stride * (uint64_t)*delta; /* a captured graph (graph.h) */
    GRID_LOOP(g, (n + 3) / 4) {
        uint32_t r[4];
        pl_dropout_draw((uint64_t)g, seed, counter, r);
        for (int j = 0; j < 4; j++) {
            int64_t i = g * 4 + j;
            if (i >= n) break;
            bool keep = pl_dropout_keep(r[j], p);
            pl_d_stf(dst, ddt, i, pl_dropout_apply(pl_d_ldf(src, sdt, i), keep, scale));
        }
    }
}

static pl_status lora_drop_launch(const pl_kernel_args *a, const void *src, pl_dtype sdt, void *dst,
                                  pl_dtype ddt, int64_t n) {
    if (n == 0) return PL_OK;
    k_lora_drop<<<pl_cu_blocks((n + 3) / 4), PL_CUDA_THREADS>>>(
        src, (int)sdt, dst, (int)ddt, n, (float)a->p.beta, pl_dropout_scale(a->p.beta),
        (uint64_t)a->p.seed, (uint64_t)a->p.counter,
        a->p.extra ? (const int64_t *)pl_tensor_data((const pl_tensor *)a->p.extra) : NULL,
        (int64_t)a->p.start);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? PL_OK
                            : pl_error_set(PL_ERR_DEVICE, "cuda lora_add: dropout kernel failed: %s",
                                           cudaGetErrorString(e));
}

/* drop(x) in the compute dtype c = p.dtype (x's, or under autocast x f32 and c
 * half: the chain's f32 dropout then cast) in a transient scratch (freed by the
 * caller); NULL with the error set */
static const void *lora_dropped_x(const pl_kernel_args *a, const pl_tensor *x, pl_cu_scratch *s) {
    int64_t n = pl_tensor_numel(x);
    pl_dtype c = a->p.dtype;
    void *d = pl_cu_scratch_get(s, x->device, (size_t)(n > 0 ? n : 1) * pl_dtype_size(c));
    if (!d || lora_drop_launch(a, pl_tensor_data(x), x->dtype, d, c, n)) return NULL;
    return d;
}

typedef struct cu_lora_geo {
    int64_t N, D, R, O, gs, ng;
} cu_lora_geo;

static void cu_lora_geo_init(cu_lora_geo *q, int64_t rows, const pl_tensor *A, const pl_tensor *B,
                             const pl_tensor *g) {
    q->D = A->shape[1];
    q->R = A->shape[0];
    q->O = B->shape[0];
    q->N = rows;
    q->ng = g && q->R ? pl_tensor_numel(g) / q->R : 1;
    q->gs = q->ng ? q->N / q->ng : 1;
    if (q->gs < 1) q->gs = 1;
}

static pl_status k_lora_add_fwd(const pl_kernel_args *a) {
    bool has_y = !(a->p.flags & 1);
    const pl_tensor *x = a->in[1], *A = a->in[2], *B = a->in[3], *g = a->n_in > 4 ? a->in[4] : NULL;
    pl_tensor *out = a->out[0], *tt = a->out[1];
    /* c: x's, or with dropout under autocast A's (x f32, dropped into c) */
    pl_dtype c = a->p.dtype;
    if (A->dtype != c || B->dtype != c || tt->dtype != c || (x->dtype != c && !(a->p.flags & 2)) ||
        !(c == PL_F32 || c == PL_BF16 || c == PL_F16))
        return pl_error_set(PL_ERR_DTYPE, "cuda lora_add: dtypes x %s, A %s, B %s not supported",
                            pl_dtype_name(x->dtype), pl_dtype_name(A->dtype),
                            pl_dtype_name(B->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    cublasHandle_t h = blas_handle(x->device.index);
    if (!h) return pl_error_status();
    /* N: x's leading dims, not numel(x) / D: with D = 0 that was 0, and nothing was written,
     * where t is [N, R] of zeros and out is y (or zeros) */
    int64_t rows = 1;
    for (int i = 0; i + 1 < x->ndim; i++)
        rows *= x->shape[i];
    cu_lora_geo q;
    cu_lora_geo_init(&q, rows, A, B, g);
    int64_t N = q.N, D = q.D, R = q.R, O = q.O;
    if (N == 0) return PL_OK;
    cudaDataType_t ct = cu_type(c), ot = cu_type(out->dtype);
    pl_status st = PL_OK;
    pl_cu_scratch su = {0}, sd = {0};
    void *U = pl_tensor_data(tt);
    /* with dropout (p.flags bit1) t = drop(x) A^T, drop(x) transient */
    const void *xp = pl_tensor_data(x);
    if ((a->p.flags & 2) && R > 0 && D > 0 && !(xp = lora_dropped_x(a, x, &sd)))
        st = pl_error_status();
    if (st)
        ; /* the dropout's launch failed */
    else if (R > 0 && D > 0)
        st = rm_gemm(h, false, true, N, R, D, xp, ct, 0, pl_tensor_data(A), ct, 0,
                     0.0f, pl_tensor_data(tt), ct, 0, 1);
    else if (R > 0 && cudaMemset(pl_tensor_data(tt), 0, pl_tensor_nbytes(tt)) != cudaSuccess)
        st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add: cudaMemset failed");
    if (!st && g && R > 0) {
        if (!(U = pl_cu_scratch_get(&su, x->device, (size_t)(N * R) * pl_dtype_size(c)))) {
            st = pl_error_status();
        } else {
            k_lora_gate<<<pl_cu_blocks(N * R), PL_CUDA_THREADS>>>(
                pl_tensor_data(tt), (int)c, pl_tensor_data(g), (int)g->dtype, U, N, R, q.gs);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess)
                st = pl_error_set(PL_ERR_DEVICE, "cuda backend: kernel of op 'lora_add' failed: %s",
                                  cudaGetErrorString(e));
        }
    }
    if (!st && has_y && O > 0) {
        const pl_tensor *y = a->in[0];
        if (y->dtype == out->dtype) {
            if (cudaMemcpyAsync(pl_tensor_data(out), pl_tensor_data(y), pl_tensor_nbytes(out),
                                cudaMemcpyDeviceToDevice, cudaStreamPerThread) != cudaSuccess)
                st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add: copy of y failed");
        } else {
            pl_cu_geom gg;
            pl_cu_geom_contig(&gg, y->ndim, y->shape);
            st = pl_cu_strided_copy(pl_tensor_data(out), out->dtype, pl_tensor_data(y), y->dtype,
                                    &gg, N * O, true);
        }
    }
    if (!st && O > 0) {
        if (R > 0)
            st = rm_gemm_ab(h, false, true, N, O, R, (float)a->p.alpha, U, ct, 0, pl_tensor_data(B),
                            ct, 0, has_y ? 1.0f : 0.0f, pl_tensor_data(out), ot, 0, 1);
        else if (!has_y && cudaMemset(pl_tensor_data(out), 0, pl_tensor_nbytes(out)) != cudaSuccess)
            st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add: cudaMemset failed");
    }
    pl_cu_scratch_free(&su);
    pl_cu_scratch_free(&sd);
    return st;
}

static pl_status k_lora_add_bwd(const pl_kernel_args *a) {
    const pl_tensor *G = a->in[0];
    int n_inputs = a->n_in - 2;
    const pl_tensor *x = a->in[2], *A = a->in[3], *B = a->in[4];
    const pl_tensor *g = n_inputs > 4 ? a->in[5] : NULL, *tt = a->in[a->n_in - 1];
    pl_tensor *dy = a->out[0], *dx = a->out[1], *dA = a->out[2], *dB = a->out[3];
    pl_tensor *dg = g ? a->out[4] : NULL;
    pl_dtype c = tt->dtype;
    if (pl_cu_set_device(G)) return pl_error_status();
    cublasHandle_t h = blas_handle(G->device.index);
    if (!h) return pl_error_status();
    cu_lora_geo q;
    cu_lora_geo_init(&q, A->shape[0] ? pl_tensor_numel(tt) / A->shape[0] : 0, A, B, g);
    int64_t N = q.N, D = q.D, R = q.R, O = q.O;
    float sc = (float)a->p.alpha;
    const cudaDataType_t f = CUDA_R_32F, ct = cu_type(c);
    bool half = c != PL_F32, need_du = dx || dA || dg;
    pl_status st = PL_OK;
    pl_cu_scratch sg = {0}, su = {0}, sdu = {0}, sdt = {0}, sd = {0};
    bool drop = a->p.flags & 2;
    if (dy && cudaMemcpyAsync(pl_tensor_data(dy), pl_tensor_data(G), pl_tensor_nbytes(dy),
                              cudaMemcpyDeviceToDevice, cudaStreamPerThread) != cudaSuccess)
        return pl_error_set(PL_ERR_DEVICE, "cuda lora_add backward: copy of dy failed");
    /* zero first: an empty product leaves zero gradients */
    pl_tensor *zero[4] = {dx, dA, dB, dg};
    for (int i = 0; i < 4; i++)
        if (zero[i] && (N == 0 || R == 0 || O == 0) &&
            cudaMemset(pl_tensor_data(zero[i]), 0, pl_tensor_nbytes(zero[i])) != cudaSuccess)
            return pl_error_set(PL_ERR_DEVICE, "cuda lora_add backward: cudaMemset failed");
    if (N == 0 || R == 0 || O == 0) return PL_OK;
    const void *Gp = half ? pl_cu_as_dtype(G, c, &sg, &st) : pl_tensor_data(G);
    if (st) goto done;
    if (dB) { /* dB = scale G^T u */
        const void *U = pl_tensor_data(tt);
        if (g) {
            void *u = pl_cu_scratch_get(&su, G->device, (size_t)(N * R) * pl_dtype_size(c));
            if (!u) {
                st = pl_error_status();
                goto done;
            }
            k_lora_gate<<<pl_cu_blocks(N * R), PL_CUDA_THREADS>>>(
                pl_tensor_data(tt), (int)c, pl_tensor_data(g), (int)g->dtype, u, N, R, q.gs);
            if (cudaGetLastError() != cudaSuccess) {
                st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add backward: gate kernel failed");
                goto done;
            }
            U = u;
        }
        if ((st = rm_gemm_ab(h, true, false, O, R, N, sc, Gp, ct, 0, U, ct, 0, 0.0f,
                             pl_tensor_data(dB), f, 0, 1)))
            goto done;
    }
    if (need_du) {
        float *du = (float *)pl_cu_scratch_get(&sdu, G->device, (size_t)(N * R) * sizeof(float));
        if (!du) {
            st = pl_error_status();
            goto done;
        }
        if ((st = rm_gemm_ab(h, false, false, N, R, O, sc, Gp, ct, 0, pl_tensor_data(B), ct, 0,
                             0.0f, du, f, 0, 1)))
            goto done;
        if (dg) {
            k_lora_dg<<<pl_cu_blocks(q.ng * R), PL_CUDA_THREADS>>>(du, pl_tensor_data(tt), (int)c,
                                                                   fp(dg), q.ng, R, q.gs, N);
            if (cudaGetLastError() != cudaSuccess) {
                st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add backward: dgexp kernel failed");
                goto done;
            }
        }
        if (dA || dx) {
            void *dt = du;
            if (g || half) {
                if (!(dt =
                          pl_cu_scratch_get(&sdt, G->device, (size_t)(N * R) * pl_dtype_size(c)))) {
                    st = pl_error_status();
                    goto done;
                }
                k_lora_dt<<<pl_cu_blocks(N * R), PL_CUDA_THREADS>>>(
                    du, g ? pl_tensor_data(g) : NULL, g ? (int)g->dtype : 0, dt, (int)c, N, R,
                    q.gs);
                if (cudaGetLastError() != cudaSuccess) {
                    st = pl_error_set(PL_ERR_DEVICE, "cuda lora_add backward: dt kernel failed");
                    goto done;
                }
            }
            if (dA && D > 0) {
                /* dA = dt^T drop(x): drop(x) regenerated from (seed, counter) */
                const void *xp = drop ? lora_dropped_x(a, x, &sd) : pl_tensor_data(x);
                if (!xp) {
                    st = pl_error_status();
                    goto done;
                }
                if ((st = rm_gemm(h, true, false, R, D, N, dt, ct, 0, xp, ct, 0, 0.0f,
                                  pl_tensor_data(dA), f, 0, 1)))
                    goto done;
            }
            if (dx && D > 0)
                st = rm_gemm(h, false, false, N, D, R, dt, ct, 0, pl_tensor_data(A), ct, 0, 0.0f,
                             pl_tensor_data(dx), f, 0, 1);
            /* the dropout's backward on d drop(x), in place: mask * scale */
            if (!st && dx && D > 0 && drop)
                st = lora_drop_launch(a, pl_tensor_data(dx), PL_F32, pl_tensor_data(dx), PL_F32,
                                      N * D);
        }
    }
done:
    pl_cu_scratch_free(&sg);
    pl_cu_scratch_free(&su);
    pl_cu_scratch_free(&sdu);
    pl_cu_scratch_free(&sdt);
    pl_cu_scratch_free(&sd);
    return st;
}

/* ---- registration ------------------------------------------------------------------------ */

void pl_cuda_register_matmul(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_MATMUL, k_matmul_fwd, k_matmul_bwd);
    pl_kernel_table_set(t, PL_OP_LORA_ADD, k_lora_add_fwd, k_lora_add_bwd);
}
