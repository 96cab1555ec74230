/* cuda_kernels.cu - CUDA forward / backward kernels of the elementwise,
 * reduction, softmax, loss, normalization, indexing, dropout, rope and
 * causal-softmax ops. Semantics, argument layout and saved tensors follow the
 * CPU kernels (plugins/backends/cpu/kernels_dense.c, kernels_index.c) op for op; see
 * backend.h for the calling convention. This file holds launch geometry,
 * reductions and memory access; the formula of every element is the PL_HD
 * function of pipeline/kernel_math.h that the CPU kernel calls too. Sums
 * that the CPU does in double are done in double here too; scatter-style
 * backwards use atomicAdd, so their summation order (not their value beyond
 * rounding) differs from the CPU.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

#define T_ROW 256 /* threads per block of the row kernels */

/* ---- index checking (deferred: see pl_cu_fault in cuda_common.cuh) ---------------------------- */

static pl_cu_fault *g_fault_host, *g_fault_dev;
static pthread_mutex_t g_fault_mu = PTHREAD_MUTEX_INITIALIZER;

pl_cu_fault *pl_cu_fault_record(void) {
    pthread_mutex_lock(&g_fault_mu);
    if (!g_fault_dev) {
        void *h = NULL, *d = NULL;
        cudaError_t e = cudaHostAlloc(&h, sizeof(pl_cu_fault),
                                      cudaHostAllocMapped | cudaHostAllocPortable);
        if (e == cudaSuccess) {
            memset(h, 0, sizeof(pl_cu_fault));
            e = cudaHostGetDevicePointer(&d, h, 0);
            if (e != cudaSuccess) cudaFreeHost(h);
        }
        if (e != cudaSuccess) {
            cudaGetLastError();
            pthread_mutex_unlock(&g_fault_mu);
            pl_error_set(PL_ERR_DEVICE, "cuda backend: mapped pinned memory for the kernels' "
                         "error record: %s", cudaGetErrorString(e));
            return NULL;
        }
        g_fault_host = (pl_cu_fault *)h;
        g_fault_dev = (pl_cu_fault *)d;
    }
    pl_cu_fault *d = g_fault_dev;
    pthread_mutex_unlock(&g_fault_mu);
    return d;
}

pl_status pl_cu_fault_check(void) {
    volatile pl_cu_fault *f = g_fault_host;
    if (!f || !f->set) return PL_OK;
    pthread_mutex_lock(&g_fault_mu);
    pl_cu_fault r;
    memcpy(&r, (const void *)g_fault_host, sizeof r);
    memset((void *)g_fault_host, 0, sizeof r);
    pthread_mutex_unlock(&g_fault_mu);
    if (!r.set) return PL_OK; /* another thread reported it */
    if (r.kind == PL_CU_FAULT_TARGET)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: target[%lld] = %lld outside [0, %lld) and != ignore_index %lld "
                            "(found by the kernel on the GPU, reported at the next read of "
                            "device memory: values computed since then are not valid)",
                            pl_op_name((pl_op)r.op), r.pos, r.value, r.bound, r.ignore);
    return pl_error_set(PL_ERR_INVALID,
                        "%s: index %lld at position %lld is out of range [0, %lld) (found by the "
                        "kernel on the GPU, reported at the next read of device memory: values "
                        "computed since then are not valid)",
                        pl_op_name((pl_op)r.op), r.value, r.pos, r.bound);
}

__global__ void k_check_idx(const void *idx, int dt, int64_t m, int64_t n, pl_cu_fault *f,
                            int op) {
    GRID_LOOP(i, m) {
        int64_t v = pl_d_idx(idx, dt, i);
        if (v < 0 || v >= n) pl_d_fault(f, op, PL_CU_FAULT_INDEX, i, v, n, 0);
    }
}

pl_status pl_cu_check_indices(pl_op op, const pl_tensor *idx, int64_t n) {
    int64_t m = pl_tensor_numel(idx);
    if (m == 0) return PL_OK;
    pl_cu_fault *f = pl_cu_fault_record();
    if (!f) return pl_error_status();
    k_check_idx<<<pl_cu_blocks(m), PL_CUDA_THREADS>>>(pl_tensor_data(idx), idx->dtype, m, n, f,
                                                      (int)op);
    CUDA_LAUNCHED(pl_op_name(op));
    return PL_OK;
}

/* ---- broadcasting binary ops -------------------------------------------------------------- */

/* The broadcast geometry of the CPU backend (backend_util.h), passed to the
 * kernels by value. */
typedef pl_bcast_geo bgeom;
#define bgeom_init pl_bcast_geo_init

__device__ __forceinline__ void boffs(const bgeom &b, int64_t i, int64_t *ox, int64_t *oy) {
    pl_bcast_offsets(&b, i, ox, oy);
}

template <int OP> __device__ __forceinline__ float bin_apply(float x, float y) {
    if (OP == PL_OP_ADD) return x + y;
    if (OP == PL_OP_SUB) return x - y;
    if (OP == PL_OP_MUL) return x * y;
    return x / y;
}

/* X, Y, O of any float dtype (f32 / bf16 / f16: pl_d_ldf / pl_d_stf), f32
 * arithmetic, O rounded once: the bits of the op on f32 copies (half_native) */
template <int OP>
__global__ void k_binary(const void *X, int xd, const void *Y, int yd, void *O, int od, bgeom b,
                         int64_t n, bool flat) {
    GRID_LOOP(i, n) {
        int64_t ox = i, oy = i;
        if (!flat) boffs(b, i, &ox, &oy);
        pl_d_stf(O, od, i, bin_apply<OP>(pl_d_ldf(X, xd, ox), pl_d_ldf(Y, yd, oy)));
    }
}

/* gradient of input `which` of a binary op over the whole space */
template <int OP>
__global__ void k_binary_contrib(int which, const float *G, const void *X, int xd, const void *Y,
                                 int yd, float *D, bgeom b, int64_t n) {
    GRID_LOOP(i, n) {
        int64_t ox, oy;
        boffs(b, i, &ox, &oy);
        float g = G[i], v;
        if (OP == PL_OP_ADD)
            v = g;
        else if (OP == PL_OP_SUB)
            v = which == 0 ? g : -g;
        else if (OP == PL_OP_MUL)
            v = which == 0 ? g * pl_d_ldf(Y, yd, oy) : g * pl_d_ldf(X, xd, ox);
        else {
            float yv = pl_d_ldf(Y, yd, oy);
            v = which == 0 ? g / yv : -g * pl_d_ldf(X, xd, ox) / (yv * yv);
        }
        D[i] = v;
    }
}

/* dst (shape of the input, strides st in the space) = sum of src (space) over
 * the broadcast dims; one block per dst element. */
typedef struct rgeom {
    int nd, nred;
    int64_t S[PL_MAX_DIMS], sp[PL_MAX_DIMS], st[PL_MAX_DIMS];
    int red[PL_MAX_DIMS];
    int64_t cnt; /* space elements per dst element */
} rgeom;

__global__ void k_reduce_to(const float *src, float *dst, rgeom r, int64_t dst_n) {
    __shared__ double sh[32];
    for (int64_t j = blockIdx.x; j < dst_n; j += gridDim.x) {
        int64_t base = 0;
        for (int d = 0; d < r.nd; d++)
            if (r.st[d]) base += ((j / r.st[d]) % r.S[d]) * r.sp[d];
        double acc = 0;
        for (int64_t k = threadIdx.x; k < r.cnt; k += blockDim.x) {
            int64_t kk = k, off = base;
            for (int q = r.nred - 1; q >= 0; q--) {
                int d = r.red[q];
                off += (kk % r.S[d]) * r.sp[d];
                kk /= r.S[d];
            }
            acc += src[off];
        }
        acc = pl_d_block_sum(acc, sh);
        if (threadIdx.x == 0) dst[j] = (float)acc;
    }
}

static pl_status reduce_to(const float *src, const bgeom *b, const int64_t *st, float *dst,
                           int64_t dst_n) {
    rgeom r;
    memset(&r, 0, sizeof r);
    r.nd = b->nd;
    int64_t s = 1, total = 1;
    for (int d = b->nd - 1; d >= 0; d--) {
        r.S[d] = b->shape[d];
        r.sp[d] = s;
        s *= b->shape[d];
        r.st[d] = st[d];
    }
    total = s;
    for (int d = 0; d < b->nd; d++)
        if (!st[d] && b->shape[d] > 1) r.red[r.nred++] = d;
    r.cnt = dst_n ? total / dst_n : 0;
    unsigned nb = (unsigned)(dst_n < 65535 * 16 ? (dst_n > 0 ? dst_n : 1) : 65535 * 16);
    k_reduce_to<<<nb, 128>>>(src, dst, r, dst_n);
    CUDA_LAUNCHED("broadcast reduction");
    return PL_OK;
}

template <int OP> static pl_status binary_fwd_t(const pl_kernel_args *a, const bgeom &b, int64_t n) {
    bool flat = pl_tensor_numel(a->in[0]) == n && pl_tensor_numel(a->in[1]) == n;
    k_binary<OP><<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(
        pl_tensor_data(a->in[0]), a->in[0]->dtype, pl_tensor_data(a->in[1]), a->in[1]->dtype,
        pl_tensor_data(a->out[0]), a->out[0]->dtype, b, n, flat);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_binary_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    bgeom b;
    bgeom_init(&b, a->out[0], a->in[0], a->in[1]);
    int64_t n = pl_tensor_numel(a->out[0]);
    if (n == 0) return PL_OK;
    switch (a->op) {
    case PL_OP_ADD: return binary_fwd_t<PL_OP_ADD>(a, b, n);
    case PL_OP_SUB: return binary_fwd_t<PL_OP_SUB>(a, b, n);
    case PL_OP_MUL: return binary_fwd_t<PL_OP_MUL>(a, b, n);
    default: return binary_fwd_t<PL_OP_DIV>(a, b, n);
    }
}

static void launch_contrib(pl_op op, int w, const float *G, const pl_tensor *x,
                           const pl_tensor *y, float *D, const bgeom &b, int64_t n) {
    unsigned nb = pl_cu_blocks(n);
    /* add / sub read neither operand (tape stubs: their data is not there) */
    const void *X = op == PL_OP_ADD || op == PL_OP_SUB ? NULL : pl_tensor_data(x);
    const void *Y = op == PL_OP_ADD || op == PL_OP_SUB ? NULL : pl_tensor_data(y);
    int xd = x->dtype, yd = y->dtype;
    switch (op) {
    case PL_OP_ADD: k_binary_contrib<PL_OP_ADD><<<nb, PL_CUDA_THREADS>>>(w, G, X, xd, Y, yd, D, b, n); break;
    case PL_OP_SUB: k_binary_contrib<PL_OP_SUB><<<nb, PL_CUDA_THREADS>>>(w, G, X, xd, Y, yd, D, b, n); break;
    case PL_OP_MUL: k_binary_contrib<PL_OP_MUL><<<nb, PL_CUDA_THREADS>>>(w, G, X, xd, Y, yd, D, b, n); break;
    default: k_binary_contrib<PL_OP_DIV><<<nb, PL_CUDA_THREADS>>>(w, G, X, xd, Y, yd, D, b, n); break;
    }
}

static pl_status k_binary_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *y = a->in[2];
    if (pl_cu_set_device(g)) return pl_error_status();
    bgeom b;
    bgeom_init(&b, g, x, y);
    int64_t total = pl_tensor_numel(g);
    for (int w = 0; w < 2; w++) {
        pl_tensor *o = a->out[w];
        if (!o) continue;
        int64_t on = pl_tensor_numel(o);
        if (total == 0) {
            CUDA_TRY(cudaMemset(fp(o), 0, (size_t)on * sizeof(float)));
            continue;
        }
        if (on == total) {
            launch_contrib(a->op, w, cf(g), x, y, fp(o), b, total);
            CUDA_LAUNCHED(pl_op_name(a->op));
            continue;
        }
        pl_cu_scratch s = {0};
        float *tmp = (float *)pl_cu_scratch_get(&s, g->device, (size_t)total * sizeof(float));
        if (!tmp) return PL_ERR_NOMEM;
        launch_contrib(a->op, w, cf(g), x, y, tmp, b, total);
        pl_status st = reduce_to(tmp, &b, w == 0 ? b.sx : b.sy, fp(o), on);
        pl_cu_scratch_free(&s);
        if (st) return st;
    }
    return PL_OK;
}

/* ---- scalar ops ------------------------------------------------------------------------------ */

__global__ void k_affine(const float *X, float *O, float mul, float add, int64_t n) {
    GRID_LOOP(i, n) O[i] = X[i] * mul + add;
}
/* the same on any float dtypes (half_native) */
__global__ void k_affine_any(const void *X, int xd, void *O, int od, float mul, float add,
                             int64_t n) {
    GRID_LOOP(i, n) pl_d_stf(O, od, i, pl_d_ldf(X, xd, i) * mul + add);
}

static pl_status k_scalar_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float s = (float)a->p.alpha;
    bool scale = a->op == PL_OP_SCALE;
    k_affine_any<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(pl_tensor_data(a->in[0]), a->in[0]->dtype,
                                                       pl_tensor_data(a->out[0]),
                                                       a->out[0]->dtype, scale ? s : 1.0f,
                                                       scale ? 0.0f : s, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_scalar_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float s = a->op == PL_OP_SCALE ? (float)a->p.alpha : 1.0f;
    k_affine<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]), fp(a->out[0]), s, 0.0f, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* ---- reductions (sum / mean over one dim or all) ------------------------------------------------ */

#define red_geom pl_reduce_split /* [outer, n, inner] of a dim reduction (backend_util.h) */

/* one block per output (o, i): sum over k of X[(o n + k) inner + i] */
__global__ void k_sum_block(const float *X, float *O, int64_t outer, int64_t n, int64_t inner,
                            double scale) {
    __shared__ double sh[32];
    int64_t nout = outer * inner;
    for (int64_t q = blockIdx.x; q < nout; q += gridDim.x) {
        int64_t o = q / inner, i = q % inner;
        const float *xp = X + o * n * inner + i;
        double acc = 0;
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
            acc += xp[k * inner];
        acc = pl_d_block_sum(acc, sh);
        if (threadIdx.x == 0) O[q] = (float)(acc * scale);
    }
}

/* one thread per output (coalesced over inner) */
__global__ void k_sum_thread(const float *X, float *O, int64_t outer, int64_t n, int64_t inner,
                             double scale) {
    GRID_LOOP(q, outer * inner) {
        int64_t o = q / inner, i = q % inner;
        const float *xp = X + o * n * inner + i;
        double acc = 0;
        for (int64_t k = 0; k < n; k++)
            acc += xp[k * inner];
        O[q] = (float)(acc * scale);
    }
}

static pl_status k_sum_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t outer, n, inner;
    red_geom(x, a->p.dim, &outer, &n, &inner);
    int64_t nout = outer * inner;
    if (nout == 0) return PL_OK;
    double scale = a->op == PL_OP_MEAN ? 1.0 / (double)n : 1.0;
    if (inner >= 32 && nout >= 1024)
        k_sum_thread<<<pl_cu_blocks(nout), PL_CUDA_THREADS>>>(cf(x), fp(a->out[0]), outer, n,
                                                              inner, scale);
    else {
        unsigned nb = (unsigned)(nout < 65535 * 16 ? nout : 65535 * 16);
        k_sum_block<<<nb, nout == 1 ? 1024 : T_ROW>>>(cf(x), fp(a->out[0]), outer, n, inner, scale);
    }
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

__global__ void k_sum_bwd_k(const float *G, float *D, int64_t n, int64_t inner, float scale,
                            int64_t total) {
    GRID_LOOP(e, total) {
        int64_t i = e % inner, o = e / (n * inner);
        D[e] = G[o * inner + i] * scale;
    }
}

static pl_status k_sum_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    if (pl_cu_set_device(gx)) return pl_error_status();
    int64_t outer, n, inner;
    red_geom(a->in[1], a->p.dim, &outer, &n, &inner);
    int64_t total = outer * n * inner;
    if (!total) return PL_OK;
    float scale = a->op == PL_OP_MEAN ? (float)(1.0 / (double)n) : 1.0f;
    k_sum_bwd_k<<<pl_cu_blocks(total), PL_CUDA_THREADS>>>(cf(a->in[0]), fp(gx), n, inner, scale,
                                                          total);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* ---- activations ------------------------------------------------------------------------------ */

/* pl_unary_forward / pl_unary_backward (kernel_math.h) on a constant op:
 * the switch folds away in each instantiation. */
template <int OP> __global__ void k_unary_f(const float *X, float *O, float al, int fl, int64_t n) {
    GRID_LOOP(i, n) O[i] = pl_unary_forward((pl_op)OP, X[i], al, fl);
}
template <int OP>
__global__ void k_unary_b(const float *G, const float *X, float *D, float al, int fl, int64_t n) {
    GRID_LOOP(i, n) D[i] = pl_unary_backward((pl_op)OP, G[i], X[i], al, fl);
}

#define UNARY_CASES(M)                                                                        \
    M(PL_OP_RELU) M(PL_OP_LEAKY_RELU) M(PL_OP_ELU) M(PL_OP_GELU) M(PL_OP_SILU) M(PL_OP_SIGMOID) \
    M(PL_OP_TANH) M(PL_OP_EXP) M(PL_OP_LOG) M(PL_OP_SQUARE) M(PL_OP_SQRT)

static pl_status k_unary_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    const float *X = cf(a->in[0]);
    float *O = fp(a->out[0]);
    float al = (float)a->p.alpha;
    int fl = a->p.flags;
    unsigned nb = pl_cu_blocks(n);
    switch (a->op) {
#define F_CASE(op)                                                                             \
    case op: k_unary_f<op><<<nb, PL_CUDA_THREADS>>>(X, O, al, fl, n); break;
        UNARY_CASES(F_CASE)
#undef F_CASE
    default: return pl_error_set(PL_ERR_INTERNAL, "cuda unary: op %s", pl_op_name(a->op));
    }
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_unary_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    if (pl_cu_set_device(gx)) return pl_error_status();
    int64_t n = pl_tensor_numel(gx);
    if (!n) return PL_OK;
    /* relu, sigmoid, tanh, exp: their saved output in[2] (in[1] is a tape
     * stub), as the CPU's k_unary_bwd */
    const float *G = cf(a->in[0]), *X = cf(a->in[pl_unary_grad_reads_output(a->op) ? 2 : 1]);
    float *D = fp(gx);
    float al = (float)a->p.alpha;
    int fl = a->p.flags;
    unsigned nb = pl_cu_blocks(n);
    switch (a->op) {
#define B_CASE(op)                                                                             \
    case op: k_unary_b<op><<<nb, PL_CUDA_THREADS>>>(G, X, D, al, fl, n); break;
        UNARY_CASES(B_CASE)
#undef B_CASE
    default: return pl_error_set(PL_ERR_INTERNAL, "cuda unary backward: op %s", pl_op_name(a->op));
    }
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

/* ---- swiglu: silu(gate) * up (silu rounded to p.dtype), the CPU's k_swiglu_* -------------------- */

/* gate X, up U and O of any float dtype (half_native), f32 math */
__global__ void k_swiglu_f(const void *X, int xd, const void *U, int ud, void *O, int od,
                           pl_dtype rt, int64_t n) {
    GRID_LOOP(i, n) pl_d_stf(O, od, i, pl_math_swiglu(pl_d_ldf(X, xd, i), pl_d_ldf(U, ud, i), rt));
}
__global__ void k_swiglu_b(const float *G, const void *X, int xd, const void *U, int ud, float *DX,
                           float *DU, pl_dtype rt, int64_t n) {
    GRID_LOOP(i, n) {
        float x = pl_d_ldf(X, xd, i);
        if (DX) DX[i] = pl_math_swiglu_grad_gate(G[i], x, pl_d_ldf(U, ud, i));
        if (DU) DU[i] = pl_math_swiglu_grad_up(G[i], x, rt);
    }
}

static pl_status k_swiglu_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    k_swiglu_f<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(
        pl_tensor_data(a->in[0]), a->in[0]->dtype, pl_tensor_data(a->in[1]), a->in[1]->dtype,
        pl_tensor_data(a->out[0]), a->out[0]->dtype, a->p.dtype, n);
    CUDA_LAUNCHED("swiglu");
    return PL_OK;
}

/* in[1] gate (always read), in[2] up (a tape stub unless gate needs a gradient) */
static pl_status k_swiglu_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0], *gu = a->out[1];
    if (!gx && !gu) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->in[0]);
    if (!n) return PL_OK;
    k_swiglu_b<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(
        cf(a->in[0]), pl_tensor_data(a->in[1]), a->in[1]->dtype,
        gx ? pl_tensor_data(a->in[2]) : NULL, a->in[2]->dtype, gx ? fp(gx) : NULL,
        gu ? fp(gu) : NULL, a->p.dtype, n);
    CUDA_LAUNCHED("swiglu backward");
    return PL_OK;
}

/* ---- softmax / log_softmax (last dim), one block per row ---------------------------------------- */

#define last_dim_geom pl_last_dim_split /* t as [rows, last dim] (backend_util.h) */

static unsigned row_grid(int64_t rows) {
    return (unsigned)(rows < 65535 * 16 ? (rows > 0 ? rows : 1) : 65535 * 16);
}

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

/* ---- embedding / index_select / scatter_add / gather ------------------------------------------------- */

/* dst[o, k, :] = src[o, idx[k], :]; src [O, Nsrc, I], dst [O, K, I] */
template <typename T>
__global__ void k_select_rows(T *dst, const T *src, int64_t O, int64_t Nsrc, int64_t K, int64_t I,
                              const void *idx, int idt) {
    GRID_LOOP(e, O * K * I) {
        int64_t j = e % I, k = (e / I) % K, o = e / (I * K), r = pl_d_idx_in(idx, idt, k, Nsrc);
        dst[e] = r < 0 ? (T)0 : src[(o * Nsrc + r) * I + j];
    }
}

static pl_status select_rows(void *dst, const void *src, int64_t O, int64_t Nsrc, int64_t K,
                             int64_t I, size_t es, const void *idx, int idt) {
    int64_t n = O * K * I;
    if (!n) return PL_OK;
    unsigned nb = pl_cu_blocks(n);
    switch (es) {
    case 1: k_select_rows<uint8_t><<<nb, PL_CUDA_THREADS>>>((uint8_t *)dst, (const uint8_t *)src, O, Nsrc, K, I, idx, idt); break;
    case 2: k_select_rows<uint16_t><<<nb, PL_CUDA_THREADS>>>((uint16_t *)dst, (const uint16_t *)src, O, Nsrc, K, I, idx, idt); break;
    case 4: k_select_rows<uint32_t><<<nb, PL_CUDA_THREADS>>>((uint32_t *)dst, (const uint32_t *)src, O, Nsrc, K, I, idx, idt); break;
    case 8: k_select_rows<uint64_t><<<nb, PL_CUDA_THREADS>>>((uint64_t *)dst, (const uint64_t *)src, O, Nsrc, K, I, idx, idt); break;
    default: return pl_error_set(PL_ERR_DTYPE, "cuda select rows: element size %zu", es);
    }
    CUDA_LAUNCHED("select rows");
    return PL_OK;
}

/* dst[o, idx[k], :] += src[o, k, :] (dst zeroed first); dst [O, Ndst, I] */
__global__ void k_index_add(float *dst, const float *src, int64_t O, int64_t Ndst, int64_t K,
                            int64_t I, const void *idx, int idt) {
    GRID_LOOP(e, O * K * I) {
        int64_t j = e % I, k = (e / I) % K, o = e / (I * K), r = pl_d_idx_in(idx, idt, k, Ndst);
        if (r >= 0) atomicAdd(&dst[(o * Ndst + r) * I + j], src[e]);
    }
}

static pl_status index_add(float *dst, const float *src, int64_t O, int64_t Ndst, int64_t K,
                           int64_t I, const void *idx, int idt) {
    CUDA_TRY(cudaMemset(dst, 0, (size_t)(O * Ndst * I) * sizeof(float)));
    int64_t n = O * K * I;
    if (!n) return PL_OK;
    k_index_add<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(dst, src, O, Ndst, K, I, idx, idt);
    CUDA_LAUNCHED("index add");
    return PL_OK;
}

#define split3 pl_dim_split /* t as [outer, t.shape[dim], inner] (backend_util.h) */

static pl_status k_embedding_fwd(const pl_kernel_args *a) {
    const pl_tensor *w = a->in[0], *ix = a->in[1];
    if (pl_cu_set_device(w)) return pl_error_status();
    if (pl_cu_check_indices(a->op, ix, w->shape[0])) return pl_error_status();
    return select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(w), 1, w->shape[0],
                       pl_tensor_numel(ix), w->shape[1], pl_dtype_size(w->dtype),
                       pl_tensor_data(ix), ix->dtype);
}

static pl_status k_embedding_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *w = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    return index_add(fp(a->out[0]), cf(g), 1, w->shape[0], pl_tensor_numel(ix), w->shape[1],
                     pl_tensor_data(ix), ix->dtype);
}

static pl_status k_index_select_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *ix = a->in[1];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t O, N, I;
    split3(x, (int)a->p.dim, &O, &N, &I);
    if (pl_cu_check_indices(a->op, ix, N)) return pl_error_status();
    return select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(x), O, N, ix->shape[0], I,
                       pl_dtype_size(x->dtype), pl_tensor_data(ix), ix->dtype);
}

static pl_status k_index_select_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t O, N, I;
    split3(x, (int)a->p.dim, &O, &N, &I);
    return index_add(fp(a->out[0]), cf(g), O, N, ix->shape[0], I, pl_tensor_data(ix), ix->dtype);
}

static pl_status k_scatter_add_fwd(const pl_kernel_args *a) {
    const pl_tensor *s = a->in[0], *ix = a->in[1];
    if (pl_cu_set_device(s)) return pl_error_status();
    int64_t O, K, I, N = a->p.shape[0];
    split3(s, (int)a->p.dim, &O, &K, &I);
    if (pl_cu_check_indices(a->op, ix, N)) return pl_error_status();
    return index_add(fp(a->out[0]), cf(s), O, N, K, I, pl_tensor_data(ix), ix->dtype);
}

static pl_status k_scatter_add_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *s = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t O, K, I, N = a->p.shape[0];
    split3(s, (int)a->p.dim, &O, &K, &I);
    return select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(g), O, N, K, I, sizeof(float),
                       pl_tensor_data(ix), ix->dtype);
}

typedef struct ggeom {
    int nd, d;
    int64_t ishape[PL_MAX_DIMS], xs[PL_MAX_DIMS];
    int64_t n_d; /* x.shape[d]: the indices' range */
} ggeom;

static void ggeom_init(ggeom *g, const pl_tensor *x, const pl_tensor *ix, int d) {
    g->nd = ix->ndim;
    g->d = d;
    g->n_d = x->shape[d];
    int64_t s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        g->xs[i] = s;
        s *= x->shape[i];
    }
    for (int i = 0; i < ix->ndim; i++)
        g->ishape[i] = ix->shape[i];
}

__device__ __forceinline__ int64_t gather_off(const ggeom &g, int64_t e, int64_t iv) {
    int64_t off = 0, r = e;
    for (int i = g.nd - 1; i >= 0; i--) {
        int64_t c = r % g.ishape[i];
        r /= g.ishape[i];
        off += (i == g.d ? iv : c) * g.xs[i];
    }
    return off;
}

template <typename T>
__global__ void k_gather_f(T *dst, const T *src, const void *idx, int idt, ggeom g, int64_t n) {
    GRID_LOOP(e, n) {
        int64_t v = pl_d_idx_in(idx, idt, e, g.n_d);
        dst[e] = v < 0 ? (T)0 : src[gather_off(g, e, v)];
    }
}

__global__ void k_gather_b(float *dx, const float *gp, const void *idx, int idt, ggeom g,
                           int64_t n) {
    GRID_LOOP(e, n) {
        int64_t v = pl_d_idx_in(idx, idt, e, g.n_d);
        if (v >= 0) atomicAdd(&dx[gather_off(g, e, v)], gp[e]);
    }
}

static pl_status k_gather_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *ix = a->in[1];
    int d = (int)a->p.dim;
    if (pl_cu_set_device(x)) return pl_error_status();
    if (pl_cu_check_indices(a->op, ix, x->shape[d])) return pl_error_status();
    ggeom g;
    ggeom_init(&g, x, ix, d);
    int64_t n = pl_tensor_numel(ix);
    if (!n) return PL_OK;
    unsigned nb = pl_cu_blocks(n);
    void *dst = pl_tensor_data(a->out[0]);
    const void *src = pl_tensor_data(x), *ip = pl_tensor_data(ix);
    switch (pl_dtype_size(x->dtype)) {
    case 1: k_gather_f<uint8_t><<<nb, PL_CUDA_THREADS>>>((uint8_t *)dst, (const uint8_t *)src, ip, ix->dtype, g, n); break;
    case 2: k_gather_f<uint16_t><<<nb, PL_CUDA_THREADS>>>((uint16_t *)dst, (const uint16_t *)src, ip, ix->dtype, g, n); break;
    case 4: k_gather_f<uint32_t><<<nb, PL_CUDA_THREADS>>>((uint32_t *)dst, (const uint32_t *)src, ip, ix->dtype, g, n); break;
    case 8: k_gather_f<uint64_t><<<nb, PL_CUDA_THREADS>>>((uint64_t *)dst, (const uint64_t *)src, ip, ix->dtype, g, n); break;
    default: return pl_error_set(PL_ERR_DTYPE, "cuda gather: dtype %s", pl_dtype_name(x->dtype));
    }
    CUDA_LAUNCHED("gather");
    return PL_OK;
}

static pl_status k_gather_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    CUDA_TRY(cudaMemset(fp(a->out[0]), 0, (size_t)pl_tensor_numel(x) * sizeof(float)));
    ggeom gg;
    ggeom_init(&gg, x, ix, (int)a->p.dim);
    int64_t n = pl_tensor_numel(ix);
    if (!n) return PL_OK;
    k_gather_b<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(fp(a->out[0]), cf(g), pl_tensor_data(ix),
                                                     ix->dtype, gg, n);
    CUDA_LAUNCHED("gather backward");
    return PL_OK;
}

/* ---- segment softmax (atomics over segments) --------------------------------------------------------- */

__device__ __forceinline__ void atomic_max_f(float *addr, float v) {
    int *ai = (int *)addr;
    int old = *ai;
    while (v > __int_as_float(old)) {
        int assumed = old;
        old = atomicCAS(ai, assumed, __float_as_int(v));
        if (old == assumed) break;
    }
}

__global__ void k_fill(float *p, float v, int64_t n) {
    GRID_LOOP(i, n) p[i] = v;
}

__global__ void k_seg_max(const float *x, const void *seg, int sdt, float *mx, int64_t E, int64_t H,
                          int64_t N) {
    GRID_LOOP(e, E * H) {
        int64_t q = pl_d_idx_in(seg, sdt, e / H, N);
        if (q >= 0) atomic_max_f(&mx[q * H + e % H], x[e]);
    }
}

__global__ void k_seg_exp(const float *x, const void *seg, int sdt, const float *mx, float *y,
                          float *sum, int64_t E, int64_t H, int64_t N) {
    GRID_LOOP(e, E * H) {
        int64_t q = pl_d_idx_in(seg, sdt, e / H, N);
        if (q < 0) {
            y[e] = 0.0f;
            continue;
        }
        q = q * H + e % H;
        float v = pl_softmax_exp(x[e], mx[q]);
        y[e] = v;
        atomicAdd(&sum[q], v);
    }
}

__global__ void k_seg_norm(const void *seg, int sdt, const float *sum, float *y, int64_t E,
                           int64_t H, int64_t N) {
    GRID_LOOP(e, E * H) {
        int64_t q = pl_d_idx_in(seg, sdt, e / H, N);
        if (q >= 0) y[e] *= 1.0f / sum[q * H + e % H];
    }
}

__global__ void k_seg_dot(const float *g, const float *y, const void *seg, int sdt, float *dot,
                          int64_t E, int64_t H, int64_t N) {
    GRID_LOOP(e, E * H) {
        int64_t q = pl_d_idx_in(seg, sdt, e / H, N);
        if (q >= 0) atomicAdd(&dot[q * H + e % H], g[e] * y[e]);
    }
}

__global__ void k_seg_grad(const float *g, const float *y, const void *seg, int sdt,
                           const float *dot, float *ds, int64_t E, int64_t H, int64_t N) {
    GRID_LOOP(e, E * H) {
        int64_t q = pl_d_idx_in(seg, sdt, e / H, N);
        if (q < 0) {
            ds[e] = 0.0f;
            continue;
        }
        float d = dot[q * H + e % H];
        ds[e] = pl_softmax_grad(y[e], g[e], d);
    }
}

static pl_status k_segment_softmax_fwd(const pl_kernel_args *a) {
    const pl_tensor *s = a->in[0], *seg = a->in[1];
    if (pl_cu_set_device(s)) return pl_error_status();
    int64_t N = a->p.num_segments, E = s->shape[0], H = E ? pl_tensor_numel(s) / E : 0;
    if (pl_cu_check_indices(a->op, seg, N)) return pl_error_status();
    if (E * H == 0) return PL_OK;
    pl_cu_scratch sc = {0};
    float *mx = (float *)pl_cu_scratch_get(&sc, s->device, (size_t)(2 * N * H) * sizeof(float));
    if (!mx) return PL_ERR_NOMEM;
    float *sum = mx + N * H;
    unsigned nb = pl_cu_blocks(E * H);
    k_fill<<<pl_cu_blocks(N * H), PL_CUDA_THREADS>>>(mx, -INFINITY, N * H);
    k_fill<<<pl_cu_blocks(N * H), PL_CUDA_THREADS>>>(sum, 0.0f, N * H);
    k_seg_max<<<nb, PL_CUDA_THREADS>>>(cf(s), pl_tensor_data(seg), seg->dtype, mx, E, H, N);
    k_seg_exp<<<nb, PL_CUDA_THREADS>>>(cf(s), pl_tensor_data(seg), seg->dtype, mx, fp(a->out[0]),
                                       sum, E, H, N);
    k_seg_norm<<<nb, PL_CUDA_THREADS>>>(pl_tensor_data(seg), seg->dtype, sum, fp(a->out[0]), E, H,
                                        N);
    pl_cu_scratch_free(&sc);
    CUDA_LAUNCHED("segment_softmax");
    return PL_OK;
}

/* in = {g, scores, seg, y} */
static pl_status k_segment_softmax_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *s = a->in[1], *seg = a->in[2], *y = a->in[3];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t N = a->p.num_segments, E = s->shape[0], H = E ? pl_tensor_numel(s) / E : 0;
    if (E * H == 0) return PL_OK;
    pl_cu_scratch sc = {0};
    float *dot = (float *)pl_cu_scratch_get(&sc, g->device, (size_t)(N * H) * sizeof(float));
    if (!dot) return PL_ERR_NOMEM;
    unsigned nb = pl_cu_blocks(E * H);
    k_fill<<<pl_cu_blocks(N * H), PL_CUDA_THREADS>>>(dot, 0.0f, N * H);
    k_seg_dot<<<nb, PL_CUDA_THREADS>>>(cf(g), cf(y), pl_tensor_data(seg), seg->dtype, dot, E, H, N);
    k_seg_grad<<<nb, PL_CUDA_THREADS>>>(cf(g), cf(y), pl_tensor_data(seg), seg->dtype, dot,
                                        fp(a->out[0]), E, H, N);
    pl_cu_scratch_free(&sc);
    CUDA_LAUNCHED("segment_softmax backward");
    return PL_OK;
}

/* ---- dropout (Philox4x32-10, the same counter scheme as the CPU kernel) ---------------------------------- */

/* element i kept iff u01(philox({i/4 lo, i/4 hi, counter lo, hi}, seed)[i % 4]) >= p:
 * the dropout stream of kernel_math.h (pl_dropout_draw / keep / apply) */
__global__ void k_dropout_f(const void *xp, void *yp, int dt, uint8_t *mask, int64_t n, float p,
                            float scale, uint64_t seed, uint64_t counter, const int64_t *delta,
                            int64_t stride) {
    /* a captured graph's call: the counter moves by stride per micro-step since the
     * capture, *delta of them (graph.h) */
    if (delta) counter += (uint64_t)stride * (uint64_t)*delta;
    GRID_LOOP(g, (n + 3) / 4) {
        uint32_t r[4];
        pl_dropout_draw((uint64_t)g, seed, counter, r);
        for (int j = 0; j < 4; j++) {
            int64_t i = g * 4 + j;
            if (i >= n) break;
            bool keep = pl_dropout_keep(r[j], p);
            mask[i] = (uint8_t)keep;
            pl_d_stf(yp, dt, i, pl_dropout_apply(pl_d_ldf(xp, dt, i), keep, scale));
        }
    }
}

__global__ void k_dropout_b(const float *g, const uint8_t *mask, float *dx, float scale, int64_t n) {
    GRID_LOOP(i, n) dx[i] = pl_dropout_apply(g[i], mask[i], scale);
}

/* parameter init (pl_backend.fill_random): group g of 4 elements draws
 * pl_init_draw's values (kernel_math.h, the host's formula) */
__global__ void k_init_fill(void *yp, int dt, int64_t n, uint64_t seed, uint64_t stream,
                            int normal, double a, double b) {
    GRID_LOOP(g, (n + 3) / 4) {
        float v[4];
        pl_init_draw((uint64_t)g, seed, stream, normal, a, b, v);
        for (int j = 0; j < 4; j++) {
            int64_t i = g * 4 + j;
            if (i >= n) break;
            pl_d_stf(yp, dt, i, v[j]);
        }
    }
}

pl_status pl_cu_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                            uint64_t stream) {
    if (pl_cu_set_device(t)) return pl_error_status();
    int64_t n = pl_tensor_numel(t);
    if (!n) return PL_OK;
    k_init_fill<<<pl_cu_blocks((n + 3) / 4), PL_CUDA_THREADS>>>(pl_tensor_data(t), t->dtype, n,
                                                                  seed, stream, normal, a, b);
    CUDA_LAUNCHED("fill_random");
    return PL_OK;
}

static pl_status k_dropout_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t n = pl_tensor_numel(x);
    if (!n) return PL_OK;
    float p = (float)a->p.alpha, scale = pl_dropout_scale(a->p.alpha);
    k_dropout_f<<<pl_cu_blocks((n + 3) / 4), PL_CUDA_THREADS>>>(
        pl_tensor_data(x), pl_tensor_data(a->out[0]), x->dtype, (uint8_t *)pl_tensor_data(a->out[1]),
        n, p, scale, (uint64_t)a->p.seed, (uint64_t)a->p.counter,
        a->p.extra ? (const int64_t *)pl_tensor_data((const pl_tensor *)a->p.extra) : NULL,
        (int64_t)a->p.start);
    CUDA_LAUNCHED("dropout");
    return PL_OK;
}

/* in = {g, x, mask} */
static pl_status k_dropout_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->in[0]);
    if (!n) return PL_OK;
    float scale = pl_dropout_scale(a->p.alpha);
    k_dropout_b<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]),
                                                      (const uint8_t *)pl_tensor_data(a->in[2]),
                                                      fp(a->out[0]), scale, n);
    CUDA_LAUNCHED("dropout backward");
    return PL_OK;
}

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

void pl_cuda_register_kernels(pl_kernel_table *t) {
    static const pl_op bin[] = {PL_OP_ADD, PL_OP_SUB, PL_OP_MUL, PL_OP_DIV};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        pl_kernel_table_set(t, bin[i], k_binary_fwd, k_binary_bwd);
    pl_kernel_table_set(t, PL_OP_SCALE, k_scalar_fwd, k_scalar_bwd);
    pl_kernel_table_set(t, PL_OP_ADD_SCALAR, k_scalar_fwd, k_scalar_bwd);
    pl_kernel_table_set(t, PL_OP_SUM, k_sum_fwd, k_sum_bwd);
    pl_kernel_table_set(t, PL_OP_MEAN, k_sum_fwd, k_sum_bwd);
    static const pl_op un[] = {PL_OP_RELU, PL_OP_LEAKY_RELU, PL_OP_ELU,  PL_OP_GELU,
                               PL_OP_SILU, PL_OP_SIGMOID,    PL_OP_TANH, PL_OP_EXP,
                               PL_OP_LOG,  PL_OP_SQUARE,     PL_OP_SQRT};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++)
        pl_kernel_table_set(t, un[i], k_unary_fwd, k_unary_bwd);
    pl_kernel_table_set(t, PL_OP_SWIGLU, k_swiglu_fwd, k_swiglu_bwd);
    pl_kernel_table_set(t, PL_OP_SOFTMAX, k_softmax_fwd, k_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_LOG_SOFTMAX, k_softmax_fwd, k_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_CROSS_ENTROPY, k_ce_fwd, k_ce_bwd);
    static const pl_op ls[] = {PL_OP_MSE, PL_OP_MAE, PL_OP_HUBER};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
        pl_kernel_table_set(t, ls[i], k_loss_fwd, k_loss_bwd);
    pl_kernel_table_set(t, PL_OP_LAYER_NORM, k_layer_norm_fwd, k_layer_norm_bwd);
    pl_kernel_table_set(t, PL_OP_RMS_NORM, k_rms_norm_fwd, k_rms_norm_bwd);
    pl_kernel_table_set(t, PL_OP_EMBEDDING, k_embedding_fwd, k_embedding_bwd);
    pl_kernel_table_set(t, PL_OP_INDEX_SELECT, k_index_select_fwd, k_index_select_bwd);
    pl_kernel_table_set(t, PL_OP_GATHER, k_gather_fwd, k_gather_bwd);
    pl_kernel_table_set(t, PL_OP_SCATTER_ADD, k_scatter_add_fwd, k_scatter_add_bwd);
    pl_kernel_table_set(t, PL_OP_SEGMENT_SOFTMAX, k_segment_softmax_fwd, k_segment_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_DROPOUT, k_dropout_fwd, k_dropout_bwd);
    pl_kernel_table_set(t, PL_OP_ROPE, k_rope_fwd, k_rope_bwd);
    pl_kernel_table_set(t, PL_OP_CAUSAL_SOFTMAX, k_causal_softmax_fwd, k_causal_softmax_bwd);
    /* nf4_matmul, lstm and clamp / adamw_step / sgd_step are registered by
     * cuda_nf4.cu, cuda_lstm.cu and cuda_optim.cu */
}
