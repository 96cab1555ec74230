/* cuda_nf4.cu - PL_OP_NF4_MATMUL on CUDA (ops.h pl_nf4_matmul) and
 * PL_OP_NF4_QUANTIZE (pl_nf4_quantize's absmax and codes), the GPU twin of
 * plugins/backends/cpu/kernels_nf4.c.
 *
 * forward : x [M, K] (f32/bf16/f16, contiguous; leading dims flattened),
 *           W nf4 [N, K] -> y [M, N] in x's dtype, y = x @ dequant(W)^T.
 *           W is dequantized a panel of rows at a time into a scratch buffer
 *           of x's dtype (each value code * absmax computed in f32 and
 *           rounded to x's dtype, as the CPU does, so a bf16 x sees bf16
 *           weights), then one cublasGemmEx per panel: operands in x's dtype,
 *           f32 accumulation (CUBLAS_COMPUTE_32F, no TF32), the result
 *           rounded to x's dtype by cuBLAS. The CPU widens x to f32 and runs
 *           sgemm on the same (exactly representable) values, so the two
 *           differ only in summation order.
 * backward: dy [M, N] f32 -> dx [M, K] f32 = dy @ dequant(W): the panels are
 *           dequantized into f32 holding values rounded to x's dtype (the
 *           CPU's numbers), f32 GEMMs accumulate into dx. W is frozen: a
 *           request for its gradient is an error, as on the CPU.
 *
 * NF4 layout (pipeline/nf4.h): element e of the flat row-major weight is
 * the LOW nibble of byte e/2 when e is even, the HIGH nibble when odd; its
 * block is e / quant.block. Double-quantized absmax (u8 codes into the
 * signed dynamic map, f32 group scale per 256 blocks, one f32 mean) is
 * recovered on the device.
 *
 * The element math is kernel_math.h's, the functions the CPU's
 * pl_nf4_dequant_range_cpu / pl_nf4_block_absmax call: pl_nf4_decode (code
 * table, nibble order, code * absmax), pl_bf16_rne / pl_f16_rne (rounding to
 * x's dtype) and pl_nf4_dq_absmax (dyn[q8[b]] * scale[b / 256] + mean). That
 * last one is a*b + c: gcc contracts it into one FMA under the core's
 * default -march=native (gnu11, -ffp-contract=fast), and nvcc does the same
 * under its default --fmad=true (k_nf4_absmax_dq is one fma.rn.f32 in the
 * PTX), so both compute the fused form. A core built with PL_NATIVE=OFF on
 * x86-64, or this plugin with --fmad=false, rounds twice and can differ by
 * one ulp of absmax.
 *
 * Table: pl_nf4_code keeps its 16 codes in a function-local `static const`
 * array, which nvcc places in read-only global memory (no stack frame,
 * ld.global.nc; a plain local array was rebuilt in local memory per element).
 */
#include <limits.h>
#include <pthread.h>
#include <string.h>

#include "cuda_common.cuh"
#include "pipeline/nf4.h"

#define PL_CUDA_MAX_DEVICES 8
/* Elements of W dequantized per panel: 32 Mi (64 MiB bf16 / 128 MiB f32);
 * a whole projection of a 7B model fits in one panel. */
#define NF4_PANEL_ELEMS ((int64_t)1 << 25)

/* ---- the double-quantization map ---------------------------------------------- */

/* The signed dynamic map of double quantization, pl_nf4_dynamic_map(),
 * uploaded once per device (constant memory is per device). */
__constant__ float c_nf4_dyn_map[256];
static bool g_dyn_ready[PL_CUDA_MAX_DEVICES];
static pthread_mutex_t g_dyn_mu = PTHREAD_MUTEX_INITIALIZER;

/* The dynamic map is copied from the core to the current device on first
 * use. (The 16 NF4 codes need no upload: pl_nf4_code holds them.) */
static pl_status nf4_tables_ready(int dev) {
    if (dev < 0 || dev >= PL_CUDA_MAX_DEVICES)
        return pl_error_set(PL_ERR_DEVICE, "cuda nf4_matmul: device index %d out of range", dev);
    pl_status st = PL_OK;
    pthread_mutex_lock(&g_dyn_mu);
    if (!g_dyn_ready[dev]) {
        cudaError_t e = cudaMemcpyToSymbol(c_nf4_dyn_map, pl_nf4_dynamic_map(),
                                           256 * sizeof(float));
        if (e != cudaSuccess)
            st = pl_error_set(PL_ERR_DEVICE, "cuda nf4_matmul: upload of the dynamic map to "
                              "cuda:%d failed: %s", dev, cudaGetErrorString(e));
        else
            g_dyn_ready[dev] = true;
    }
    pthread_mutex_unlock(&g_dyn_mu);
    return st;
}

/* ---- kernels ---------------------------------------------------------------------- */

/* absmax[b] = dyn[q8[b]] * scale[b / 256] + mean (one FMA), b < nb (see the top). */
__global__ void k_nf4_absmax_dq(float *absmax, const uint8_t *q8, const float *scale, float mean,
                                int64_t nb) {
    GRID_LOOP(b, nb) {
        absmax[b] = pl_nf4_dq_absmax(c_nf4_dyn_map[q8[b]], scale[b / PL_NF4_DQ_BLOCK], mean);
    }
}

/* dst[i] (dtype dst_dt, contiguous) = dequantized element e0 + i of the flat
 * weight, i < n: code * absmax in f32, rounded to `round_to` (bf16 / f16
 * rounding; f32 keeps the product), then stored as dst_dt. The CPU's
 * pl_nf4_dequant_range_cpu, element for element. */
__global__ void k_nf4_dequant(void *dst, int dst_dt, const uint8_t *codes, const float *absmax,
                              int64_t block, int64_t e0, int64_t n, int round_to) {
    GRID_LOOP(i, n) {
        int64_t e = e0 + i;
        float v = pl_nf4_decode(codes, e, absmax[e / block]);
        if (round_to == PL_BF16)
            v = pl_bf16_rne(v);
        else if (round_to == PL_F16)
            v = pl_f16_rne(v);
        pl_d_stf(dst, dst_dt, i, v);
    }
}

/* ---- host side ------------------------------------------------------------------------ */

typedef struct nf4_w {
    const uint8_t *codes;
    const float *absmax; /* f32 [nb] on the device: the tensor's own or `s_am` */
    int64_t block, N, K;
    pl_cu_scratch s_am;
} nf4_w;

/* Check W's quantization state (on W's device) and make its f32 absmax. */
static pl_status nf4_w_open(nf4_w *w, const pl_tensor *t) {
    memset(w, 0, sizeof *w);
    const pl_tensor *am = t->quant.absmax, *sc = t->quant.absmax_scale;
    if (t->dtype != PL_NF4 || t->ndim != 2 || t->quant.block <= 0 || !am ||
        !(am->dtype == PL_F32 || (am->dtype == PL_U8 && sc && sc->dtype == PL_F32)))
        return pl_error_set(PL_ERR_INVALID, "cuda nf4_matmul: weight '%s' is not a 2-d nf4 tensor "
                            "with a quantization state", t->name);
    int64_t nb = pl_nf4_num_blocks(t);
    if (pl_tensor_numel(am) != nb || am->device.type != PL_DEVICE_CUDA ||
        am->device.index != t->device.index ||
        (sc && (sc->device.type != PL_DEVICE_CUDA || sc->device.index != t->device.index)))
        return pl_error_set(PL_ERR_INVALID, "cuda nf4_matmul: the absmax of weight '%s' must hold "
                            "%lld values on cuda:%d", t->name, (long long)nb,
                            t->device.index);
    if (nf4_tables_ready(t->device.index)) return pl_error_status();
    w->codes = (const uint8_t *)pl_tensor_data(t);
    w->block = t->quant.block;
    w->N = t->shape[0];
    w->K = t->shape[1];
    if (am->dtype == PL_F32) {
        w->absmax = cf(am);
        return PL_OK;
    }
    float *p = (float *)pl_cu_scratch_get(&w->s_am, t->device, (size_t)nb * sizeof(float));
    if (!p) return pl_error_status();
    if (nb > 0)
        k_nf4_absmax_dq<<<pl_cu_blocks(nb), PL_CUDA_THREADS>>>(
            p, (const uint8_t *)pl_tensor_data(am), cf(sc), t->quant.absmax_mean, nb);
    CUDA_LAUNCHED("nf4_matmul");
    w->absmax = p;
    return PL_OK;
}

static void nf4_w_close(nf4_w *w) { pl_cu_scratch_free(&w->s_am); }

/* Rows [r0, r1) of W into panel [r1 - r0, K] of dtype dt, rounded to round_to. */
static pl_status nf4_dequant_rows(const nf4_w *w, int64_t r0, int64_t r1, void *panel, int dt,
                                  int round_to) {
    int64_t n = (r1 - r0) * w->K;
    if (n <= 0) return PL_OK;
    k_nf4_dequant<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(panel, dt, w->codes, w->absmax, w->block,
                                                         r0 * w->K, n, round_to);
    CUDA_LAUNCHED("nf4_matmul");
    return PL_OK;
}

static int64_t nf4_panel_rows(int64_t N, int64_t K) {
    int64_t r = NF4_PANEL_ELEMS / (K > 0 ? K : 1);
    if (r < 1) r = 1;
    return r < N ? r : N;
}

static cudaDataType_t nf4_cu_type(pl_dtype dt) {
    return dt == PL_BF16 ? CUDA_R_16BF : dt == PL_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static pl_status nf4_check_dims(int64_t M, int64_t N, int64_t K) {
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cuda nf4_matmul: [%lld, %lld] @ [%lld, %lld]^T "
                            "exceeds cuBLAS's int range", (long long)M, (long long)K,
                            (long long)N, (long long)K);
    return PL_OK;
}

/* in = {x [.., K], W nf4 [N, K]}; out = {y [.., N]} in x's dtype. */
static pl_status k_nf4_matmul_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *wt = a->in[1];
    pl_tensor *y = a->out[0];
    pl_dtype xd = x->dtype;
    if (!(xd == PL_F32 || xd == PL_BF16 || xd == PL_F16) || y->dtype != xd)
        return pl_error_set(PL_ERR_DTYPE, "cuda nf4_matmul: x %s -> y %s; expected f32, bf16 or "
                            "f16 for both", pl_dtype_name(xd), pl_dtype_name(y->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t N = wt->shape[0], K = wt->shape[1];
    int64_t M = K ? pl_tensor_numel(x) / K : 0;
    if (nf4_check_dims(M, N, K)) return pl_error_status();
    if (M == 0 || N == 0) return PL_OK;
    if (K == 0) {
        CUDA_TRY(cudaMemset(pl_tensor_data(y), 0, pl_tensor_nbytes(y)));
        return PL_OK;
    }
    cublasHandle_t h = pl_cu_blas_handle(x->device.index);
    if (!h) return pl_error_status();
    nf4_w w;
    pl_cu_scratch s_p = {0};
    pl_status st = nf4_w_open(&w, wt);
    int64_t pr = nf4_panel_rows(N, K);
    size_t es = pl_dtype_size(xd);
    void *panel = st ? NULL : pl_cu_scratch_get(&s_p, x->device, (size_t)(pr * K) * es);
    if (!st && !panel) st = pl_error_status();
    const cudaDataType_t t = nf4_cu_type(xd);
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t r0 = 0; !st && r0 < N; r0 += pr) {
        int64_t r1 = r0 + pr < N ? r0 + pr : N;
        if ((st = nf4_dequant_rows(&w, r0, r1, panel, xd, xd))) break;
        /* column-major view: Y^T[r0:r1, :] (ld N) = P X^T, where the row-major
         * panel P [r, K] reads as P^T (so OP_T) and x [M, K] as X^T */
        cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)(r1 - r0), (int)M, (int)K,
                                        &alpha, panel, t, (int)K, pl_tensor_data(x), t, (int)K,
                                        &beta, (char *)pl_tensor_data(y) + (size_t)r0 * es, t,
                                        (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            st = pl_error_set(PL_ERR_DEVICE, "cuda nf4_matmul: cublasGemmEx failed: %s",
                              pl_cu_blas_status(s));
    }
    pl_cu_scratch_free(&s_p);
    nf4_w_close(&w);
    return st;
}

/* in = {dy [.., N] f32, x, W}; out = {dx [.., K] f32, NULL (W is frozen)}.
 * Under a half compute dtype (x bf16 / f16) the panel is dequantized in it and
 * dy is rounded to it, so the GEMM runs on the tensor cores with f32
 * accumulation and output (as bitsandbytes' / PyTorch's bf16 backward does). */
static pl_status k_nf4_matmul_bwd(const pl_kernel_args *a) {
    const pl_tensor *dy = a->in[0], *x = a->in[1], *wt = a->in[2];
    pl_tensor *dx = a->out[0];
    if (a->n_out > 1 && a->out[1])
        return pl_error_set(PL_ERR_INVALID, "nf4_matmul: weight '%s' is frozen and gets no gradient",
                            wt->name);
    if (!dx) return PL_OK;
    if (pl_cu_set_device(dy)) return pl_error_status();
    int64_t N = wt->shape[0], K = wt->shape[1];
    int64_t M = K ? pl_tensor_numel(x) / K : 0;
    if (nf4_check_dims(M, N, K)) return pl_error_status();
    if (M == 0 || K == 0) return PL_OK;
    if (N == 0) {
        CUDA_TRY(cudaMemset(pl_tensor_data(dx), 0, (size_t)(M * K) * sizeof(float)));
        return PL_OK;
    }
    cublasHandle_t h = pl_cu_blas_handle(dy->device.index);
    if (!h) return pl_error_status();
    nf4_w w;
    pl_cu_scratch s_p = {0};
    pl_status st = nf4_w_open(&w, wt);
    int64_t pr = nf4_panel_rows(N, K);
    pl_dtype cd = x->dtype == PL_BF16 || x->dtype == PL_F16 ? x->dtype : PL_F32;
    cudaDataType_t ct = cd == PL_F32 ? CUDA_R_32F : nf4_cu_type(cd);
    size_t es = pl_dtype_size(cd);
    pl_cu_scratch s_g = {0};
    const char *g = (const char *)(cd == PL_F32 ? pl_tensor_data(dy) : NULL);
    if (!st && cd != PL_F32) g = (const char *)pl_cu_as_dtype(dy, cd, &s_g, &st);
    void *panel = st ? NULL : pl_cu_scratch_get(&s_p, dy->device, (size_t)(pr * K) * es);
    if (!st && !panel) st = pl_error_status();
    const float alpha = 1.0f, zero = 0.0f, one = 1.0f;
    for (int64_t r0 = 0; !st && r0 < N; r0 += pr) {
        int64_t r1 = r0 + pr < N ? r0 + pr : N;
        if ((st = nf4_dequant_rows(&w, r0, r1, panel, cd, x->dtype))) break;
        /* column-major view: dX^T [K, M] (+)= P^T dY^T[r0:r1, :] */
        cublasStatus_t s = cublasGemmEx(
            h, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)M, (int)(r1 - r0), &alpha, panel, ct,
            (int)K, g + (size_t)r0 * es, ct, (int)N, r0 == 0 ? &zero : &one, fp(dx), CUDA_R_32F,
            (int)K, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS)
            st = pl_error_set(PL_ERR_DEVICE, "cuda nf4_matmul backward: cublasGemmEx failed: %s",
                              pl_cu_blas_status(s));
    }
    pl_cu_scratch_free(&s_p);
    pl_cu_scratch_free(&s_g);
    nf4_w_close(&w);
    return st;
}

/* ---- nf4_quantize: the block absmax and the codes on the device ------------------ */

/* One thread per block: absmax[b] (NaN skipped, as the CPU's fabsf(x) > m)
 * and the non-finite count / first index (bad[0] / bad[1], atomics). */
__global__ void k_nf4_q_absmax(const void *X, int xd, int64_t n, int64_t block, int64_t nb,
                               float *AM, unsigned long long *bad) {
    GRID_LOOP(b, nb) {
        int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
        float m = 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            float v = pl_d_ldf(X, xd, i);
            if (!isfinite(v)) {
                atomicAdd(&bad[0], 1ULL);
                atomicMin(&bad[1], (unsigned long long)i);
            }
            m = pl_nf4_absmax_step(m, v);
        }
        AM[b] = m;
    }
}

/* One thread per byte: the codes of elements 2j (low nibble) and 2j + 1
 * (high), each with its own block's absmax, so odd block sizes need no
 * serial pass; nothing is written when a value was not finite. */
__global__ void k_nf4_q_encode(const void *X, int xd, int64_t n, int64_t block, const float *AM,
                               const unsigned long long *bad, uint8_t *codes, int64_t nbytes) {
    if (bad[0]) return;
    GRID_LOOP(j, nbytes) {
        unsigned byte = 0;
        for (int h = 0; h < 2; h++) {
            int64_t e = 2 * j + h;
            if (e >= n) break;
            float inv = pl_nf4_inv_absmax(AM[e / block]);
            byte |= (unsigned)pl_nf4_encode(pl_d_ldf(X, xd, e) * inv) << (4 * h);
        }
        codes[j] = (uint8_t)byte;
    }
}

__global__ void k_nf4_q_init(unsigned long long *bad) {
    bad[0] = 0;
    bad[1] = ~0ULL;
}

/* in[0] w (f32/bf16/f16, contiguous); out[0] codes (nf4, w's shape), out[1]
 * absmax f32 [blocks], out[2] i64 [2] {non-finite count, first index: read
 * only when the count is not 0}; the
 * CPU's nf4_quantize_fwd, the same bits (pl_nf4_encode of x * (1 / absmax)
 * in f32). */
static pl_status k_nf4_quantize_fwd(const pl_kernel_args *a) {
    const pl_tensor *w = a->in[0];
    int xd = w->dtype;
    if (!(xd == PL_F32 || xd == PL_BF16 || xd == PL_F16))
        return pl_error_set(PL_ERR_DTYPE, "cuda nf4_quantize: '%s' is %s; expected f32, bf16 or "
                            "f16", w->name, pl_dtype_name(w->dtype));
    if (pl_cu_set_device(w)) return pl_error_status();
    int64_t n = pl_tensor_numel(w), block = a->p.start;
    if (block <= 0)
        return pl_error_set(PL_ERR_INVALID, "cuda nf4_quantize: block size %lld", (long long)block);
    int64_t nb = (n + block - 1) / block, nbytes = (n + 1) / 2;
    unsigned long long *bad = (unsigned long long *)pl_tensor_data(a->out[2]);
    float *am = (float *)pl_tensor_data(a->out[1]);
    k_nf4_q_init<<<1, 1>>>(bad);
    if (nb) k_nf4_q_absmax<<<pl_cu_blocks(nb), PL_CUDA_THREADS>>>(pl_tensor_data(w), xd, n, block, nb, am, bad);
    if (nbytes)
        k_nf4_q_encode<<<pl_cu_blocks(nbytes), PL_CUDA_THREADS>>>(
            pl_tensor_data(w), xd, n, block, am, bad, (uint8_t *)pl_tensor_data(a->out[0]), nbytes);
    CUDA_LAUNCHED("nf4_quantize");
    return PL_OK;
}

void pl_cuda_register_nf4(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_NF4_QUANTIZE, k_nf4_quantize_fwd, NULL);
    pl_kernel_table_set(t, PL_OP_NF4_MATMUL, k_nf4_matmul_fwd, k_nf4_matmul_bwd);
}
