/* cuda_dense.cu - CUDA forward / backward kernels of the broadcasting binary ops, the
 * scalar ops, sum / mean, the activations and swiglu: the GPU twin of the CPU backend's
 * kernels_dense.c, op for op.
 * Conventions (launch geometry only; the element math is kernel_math.h's PL_HD
 * functions, shared with the CPU kernels): the top of cuda_common.cuh. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

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

/* O = X * mul: scale's backward (add_scalar's with mul 1) */
__global__ void k_affine(const float *X, float *O, float mul, int64_t n) {
    GRID_LOOP(i, n) O[i] = X[i] * mul;
}
/* O = X * mul (scale) or X + add (add_scalar), on any float dtypes (half_native): one f32
 * operation, the CPU's (X * mul + 0, as it was, turned a -0 product into +0) */
__global__ void k_affine_any(const void *X, int xd, void *O, int od, float mul, float add,
                             bool scale, int64_t n) {
    GRID_LOOP(i, n) {
        float x = pl_d_ldf(X, xd, i);
        pl_d_stf(O, od, i, scale ? x * mul : x + add);
    }
}

static pl_status k_scalar_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->out[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float s = (float)a->p.alpha;
    bool scale = a->op == PL_OP_SCALE;
    k_affine_any<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(pl_tensor_data(a->in[0]), a->in[0]->dtype,
                                                       pl_tensor_data(a->out[0]),
                                                       a->out[0]->dtype, s, s, scale, n);
    CUDA_LAUNCHED(pl_op_name(a->op));
    return PL_OK;
}

static pl_status k_scalar_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    int64_t n = pl_tensor_numel(a->out[0]);
    if (!n) return PL_OK;
    float s = a->op == PL_OP_SCALE ? (float)a->p.alpha : 1.0f;
    k_affine<<<pl_cu_blocks(n), PL_CUDA_THREADS>>>(cf(a->in[0]), fp(a->out[0]), s, n);
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

/* square, then the sum of all the squares, in one launch (cuda_fuse.cu: the
 * gradient norm's calls in a captured step), then optionally the add of the
 * norm's running total. The same bits as the square kernel (pl_math_square,
 * one f32 rounding) followed by k_sum_block <<<1, 1024>>> (k_sum_fwd of one
 * output: the same per-thread double sums in the same order, the same block
 * reduction, one f32 rounding) and the add kernel (one f32 add, its
 * operands in the add's order: `first`, the sum was the first). T, O: where
 * the square and sum kernels would have written, NULL when dead (the graph's
 * node is edited after the capture); U = A + sum (NULL: no add). */
__global__ void k_sum_squares(const float *X, float *T, float *O, const float *A, float *U,
                              int first, int64_t n) {
    __shared__ double sh[32];
    double acc = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float q = pl_math_square(X[k]);
        if (T) T[k] = q;
        acc += q;
    }
    acc = pl_d_block_sum(acc, sh);
    if (threadIdx.x == 0) {
        float s = (float)(acc * 1.0);
        if (O) O[0] = s;
        if (U) U[0] = first ? s + A[0] : A[0] + s;
    }
}

pl_status pl_cu_sum_squares(const float *x, float *t, float *o, const float *a, float *u, int first,
                            int64_t n) {
    k_sum_squares<<<1, 1024>>>(x, t, o, a, u, first, n);
    CUDA_LAUNCHED("square+sum");
    return PL_OK;
}

const void *pl_cu_sum_squares_kernel(void) { return (const void *)k_sum_squares; }

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

/* ---- registration ---------------------------------------------------------------------------------------- */

void pl_cuda_register_dense(pl_kernel_table *t) {
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
}
