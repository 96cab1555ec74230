/* kernels_dense.c - CPU forward / backward kernels of the dense ops:
 * broadcasting arithmetic, reductions, activations, cast; softmax, losses and
 * normalization are in kernels_norm.c, matmul in kernels_matmul.c (helpers
 * shared: kernels_dense_common.h). Registered by pl_cpu_register_dense().
 *
 * Conventions (backend.h): every tensor handed to a kernel is contiguous.
 * Forward: in[] are the op's inputs, out[0] the result, out[1..] tensors
 * saved for backward. Backward: in[0] = grad of output (f32), in[1..] the
 * op's inputs then its saved tensors, out[i] = grad of input i (f32,
 * overwritten) or NULL. Elementwise kernels compute in f32; the op layer
 * (ops_dense.c) casts half inputs to f32 around them, except matmul and
 * cast which take bf16 / f16 directly.
 */
#include <math.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels_dense_common.h"

/* ---- broadcasting ------------------------------------------------------ */

/* Iteration space of a broadcast op: out shape with nd >= 1 (0-dim -> [1]),
 * rows = product of all but the last dim, inner = last dim. */
typedef struct bspace {
    int nd;
    int64_t shape[PL_MAX_DIMS];
    int64_t rows, inner;
} bspace;

static void bspace_init(bspace *b, const pl_tensor *out) {
    b->nd = out->ndim > 0 ? out->ndim : 1;
    if (out->ndim == 0) b->shape[0] = 1;
    for (int d = 0; d < out->ndim; d++)
        b->shape[d] = out->shape[d];
    b->inner = b->shape[b->nd - 1];
    b->rows = 1;
    for (int d = 0; d < b->nd - 1; d++)
        b->rows *= b->shape[d];
}

/* Element strides of contiguous t right-aligned to the space (0 where t
 * broadcasts or lacks the dim): pl_bcast_strides, shared with every backend. */
static void bstrides(const pl_tensor *t, const bspace *b, int64_t *st) {
    pl_bcast_strides(t, b->nd, st);
}

/* Merge adjacent dims that both operands traverse contiguously (or both
 * broadcast), e.g. [E, H, C] x [E, H, 1] -> [E*H, C] x [E*H, 1] and
 * [N, H, C] x [H, C] -> [N, H*C] x [H*C]: fewer index divisions per row and
 * longer inner loops. The strides stay valid for reduce_to. */
static void bspace_coalesce(bspace *b, int64_t *sx, int64_t *sy) {
    int nd = b->nd;
    for (int d = nd - 2; d >= 0; d--) {
        int64_t n1 = b->shape[d + 1];
        if (sx[d] != sx[d + 1] * n1 || sy[d] != sy[d + 1] * n1) continue;
        /* merge d into d + 1 */
        b->shape[d + 1] *= b->shape[d];
        for (int k = d; k < nd - 1; k++) {
            b->shape[k] = b->shape[k + 1];
            sx[k] = sx[k + 1];
            sy[k] = sy[k + 1];
        }
        nd--;
    }
    b->nd = nd;
    b->inner = b->shape[nd - 1];
    b->rows = 1;
    for (int d = 0; d < nd - 1; d++) b->rows *= b->shape[d];
}

static inline int64_t row_off(int64_t r, const bspace *b, const int64_t *st) {
    int64_t off = 0;
    for (int d = b->nd - 2; d >= 0; d--) {
        int64_t i = r % b->shape[d];
        r /= b->shape[d];
        off += i * st[d];
    }
    return off;
}

/* dst (shape of t, strides st in space b) = sum of src (space-shaped) over
 * the broadcast dims. */
static void reduce_to(const float *src, const bspace *b, const int64_t *st, float *dst,
                      int64_t dst_n) {
    memset(dst, 0, (size_t)dst_n * sizeof(float));
    int64_t sl = st[b->nd - 1];
    for (int64_t r = 0; r < b->rows; r++) {
        float *d = dst + row_off(r, b, st);
        const float *s = src + r * b->inner;
        if (sl)
            for (int64_t j = 0; j < b->inner; j++)
                d[j] += s[j];
        else {
            float acc = 0;
            for (int64_t j = 0; j < b->inner; j++)
                acc += s[j];
            d[0] += acc;
        }
    }
}

/* out = x (op) y, broadcasting. */
/* x +/- y of the same shape with f32 / bf16 operands: each widened (exact),
 * the f32 result rounded when the output is bf16 (both operands bf16) --
 * what cast, f32 op, cast computes, without the casts' copies. */
static inline float ld_f32_or_bf16(const void *p, pl_dtype dt, int64_t i) {
    return dt == PL_BF16 ? pl_bf16_widen(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static pl_status binary_half(const pl_kernel_args *a, int64_t n) {
    const void *X = pl_tensor_data(a->in[0]), *Y = pl_tensor_data(a->in[1]);
    pl_dtype dx = a->in[0]->dtype, dy = a->in[1]->dtype;
    float sign = a->op == PL_OP_SUB ? -1.0f : 1.0f;
    if (a->out[0]->dtype == PL_BF16) {
        uint16_t *o = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float xv = ld_f32_or_bf16(X, dx, i), yv = ld_f32_or_bf16(Y, dy, i);
            o[i] = pl_bf16_round(sign > 0 ? xv + yv : xv - yv);
        }
    } else {
        float *o = f32p(a->out[0]);
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float xv = ld_f32_or_bf16(X, dx, i), yv = ld_f32_or_bf16(Y, dy, i);
            o[i] = sign > 0 ? xv + yv : xv - yv;
        }
    }
    return PL_OK;
}

static pl_status k_binary_fwd(const pl_kernel_args *a) {
    bspace b;
    bspace_init(&b, a->out[0]);
    int64_t sx[PL_MAX_DIMS], sy[PL_MAX_DIMS];
    bstrides(a->in[0], &b, sx);
    bstrides(a->in[1], &b, sy);
    bspace_coalesce(&b, sx, sy);
    pl_op op = a->op;
    int64_t total = b.rows * b.inner;
    if (a->in[0]->dtype != PL_F32 || a->in[1]->dtype != PL_F32)
        return binary_half(a, total); /* same-shape add / sub with bf16 (ops_dense.c) */
    const float *X = cf32(a->in[0]), *Y = cf32(a->in[1]);
    float *O = f32p(a->out[0]);
    int64_t ix = sx[b.nd - 1], iy = sy[b.nd - 1], inner = b.inner;
    if (pl_tensor_numel(a->in[0]) == total && pl_tensor_numel(a->in[1]) == total) {
        /* same shapes: one flat loop (parallel even for a single long row) */
        switch (op) {
        case PL_OP_ADD:
#pragma omp parallel for if (total > PAR_MIN)
            for (int64_t i = 0; i < total; i++)
                O[i] = X[i] + Y[i];
            break;
        case PL_OP_SUB:
#pragma omp parallel for if (total > PAR_MIN)
            for (int64_t i = 0; i < total; i++)
                O[i] = X[i] - Y[i];
            break;
        case PL_OP_MUL:
#pragma omp parallel for if (total > PAR_MIN)
            for (int64_t i = 0; i < total; i++)
                O[i] = X[i] * Y[i];
            break;
        default:
#pragma omp parallel for if (total > PAR_MIN)
            for (int64_t i = 0; i < total; i++)
                O[i] = X[i] / Y[i];
            break;
        }
        return PL_OK;
    }
#pragma omp parallel for if (total > PAR_MIN)
    for (int64_t r = 0; r < b.rows; r++) {
        const float *xp = X + row_off(r, &b, sx), *yp = Y + row_off(r, &b, sy);
        float *o = O + r * inner;
        /* the inner stride of each operand is 1 (runs along) or 0 (broadcast):
         * spelled out so that every case vectorizes */
#define PL_BIN_LOOP(EXPR)                                                                    \
    do {                                                                                     \
        if (ix == 1 && iy == 1)                                                              \
            for (int64_t j = 0; j < inner; j++) {                                            \
                float xv = xp[j], yv = yp[j];                                                \
                o[j] = EXPR;                                                                 \
            }                                                                                \
        else if (ix == 1) {                                                                  \
            float yv = yp[0];                                                                \
            for (int64_t j = 0; j < inner; j++) {                                            \
                float xv = xp[j];                                                            \
                o[j] = EXPR;                                                                 \
            }                                                                                \
        } else if (iy == 1) {                                                                \
            float xv = xp[0];                                                                \
            for (int64_t j = 0; j < inner; j++) {                                            \
                float yv = yp[j];                                                            \
                o[j] = EXPR;                                                                 \
            }                                                                                \
        } else {                                                                             \
            float xv = xp[0], yv = yp[0];                                                    \
            for (int64_t j = 0; j < inner; j++) o[j] = EXPR;                                 \
        }                                                                                    \
    } while (0)
        switch (op) {
        case PL_OP_ADD: PL_BIN_LOOP(xv + yv); break;
        case PL_OP_SUB: PL_BIN_LOOP(xv - yv); break;
        case PL_OP_MUL: PL_BIN_LOOP(xv * yv); break;
        default: /* PL_OP_DIV */ PL_BIN_LOOP(xv / yv); break;
        }
#undef PL_BIN_LOOP
    }
    return PL_OK;
}

/* Gradient of input `which` (0: x, 1: y) of a binary op, space-shaped, into dst. */
static void binary_contrib(pl_op op, int which, const float *G, const float *X, const int64_t *sx,
                           const float *Y, const int64_t *sy, const bspace *b, float *dst) {
    int64_t ix = sx[b->nd - 1], iy = sy[b->nd - 1], inner = b->inner;
#pragma omp parallel for if (b->rows * b->inner > PAR_MIN)
    for (int64_t r = 0; r < b->rows; r++) {
        const float *xp = X + row_off(r, b, sx), *yp = Y + row_off(r, b, sy);
        const float *g = G + r * inner;
        float *d = dst + r * inner;
        if (op == PL_OP_ADD || (op == PL_OP_SUB && which == 0)) {
            for (int64_t j = 0; j < inner; j++)
                d[j] = g[j];
        } else if (op == PL_OP_SUB) {
            for (int64_t j = 0; j < inner; j++)
                d[j] = -g[j];
        } else if (op == PL_OP_MUL) {
            /* d = g * the other operand, whose inner stride is 1 or 0 (bstrides) */
            const float *o = which == 0 ? yp : xp;
            if (which == 0 ? iy : ix)
                for (int64_t j = 0; j < inner; j++)
                    d[j] = g[j] * o[j];
            else {
                float v = o[0];
                for (int64_t j = 0; j < inner; j++)
                    d[j] = g[j] * v;
            }
        } else { /* DIV */
            if (which == 0)
                for (int64_t j = 0; j < inner; j++)
                    d[j] = g[j] / yp[j * iy];
            else
                for (int64_t j = 0; j < inner; j++) {
                    float yv = yp[j * iy];
                    d[j] = -g[j] * xp[j * ix] / (yv * yv);
                }
        }
    }
}

static pl_status k_binary_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *y = a->in[2];
    bspace b;
    bspace_init(&b, g);
    int64_t sx[PL_MAX_DIMS], sy[PL_MAX_DIMS];
    bstrides(x, &b, sx);
    bstrides(y, &b, sy);
    bspace_coalesce(&b, sx, sy);
    int64_t total = b.rows * b.inner;
    for (int w = 0; w < 2; w++) {
        pl_tensor *o = a->out[w];
        if (!o) continue;
        int64_t on = pl_tensor_numel(o);
        if (on == total) {
            binary_contrib(a->op, w, cf32(g), cf32(x), sx, cf32(y), sy, &b, f32p(o));
            continue;
        }
        scratch s = {0};
        float *tmp = scratch_f32(&s, total);
        if (!tmp) return PL_ERR_NOMEM;
        binary_contrib(a->op, w, cf32(g), cf32(x), sx, cf32(y), sy, &b, tmp);
        reduce_to(tmp, &b, w == 0 ? sx : sy, f32p(o), on);
        scratch_free(&s);
    }
    return PL_OK;
}

/* ---- scalar ops ---------------------------------------------------------- */

static pl_status k_scalar_fwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->out[0]);
    float s = (float)a->p.alpha;
    if (a->in[0]->dtype == PL_BF16) { /* bf16 -> bf16, f32 arithmetic (ops_dense.c) */
        const uint16_t *x = pl_tensor_data(a->in[0]);
        uint16_t *o = pl_tensor_data(a->out[0]);
        bool mul = a->op == PL_OP_SCALE;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            float v = pl_bf16_widen(x[i]);
            o[i] = pl_bf16_round(mul ? v * s : v + s);
        }
        return PL_OK;
    }
    const float *x = cf32(a->in[0]);
    float *o = f32p(a->out[0]);
    if (a->op == PL_OP_SCALE) {
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            o[i] = x[i] * s;
    } else {
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            o[i] = x[i] + s;
    }
    return PL_OK;
}

static pl_status k_scalar_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *g = cf32(a->in[0]);
    float *o = f32p(a->out[0]);
    float s = a->op == PL_OP_SCALE ? (float)a->p.alpha : 1.0f;
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        o[i] = g[i] * s;
    return PL_OK;
}

/* ---- reductions ---------------------------------------------------------- */

/* The input of a dim reduction as [outer, n, inner] (backend_util.h). */
#define red_geom pl_reduce_split

static pl_status k_sum_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    int64_t outer, n, inner;
    red_geom(x, a->p.dim, &outer, &n, &inner);
    const float *X = cf32(x);
    float *O = f32p(a->out[0]);
    double scale = a->op == PL_OP_MEAN ? 1.0 / (double)n : 1.0;
    if (outer == 1 && inner == 1) {
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            s += X[i];
        O[0] = (float)(s * scale);
        return PL_OK;
    }
#pragma omp parallel for if (outer * n * inner > PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        const float *xp = X + o * n * inner;
        float *op = O + o * inner;
        if (inner == 1) {
            double s = 0;
            for (int64_t k = 0; k < n; k++)
                s += xp[k];
            op[0] = (float)(s * scale);
        } else {
            for (int64_t i = 0; i < inner; i++)
                op[i] = 0;
            for (int64_t k = 0; k < n; k++)
                for (int64_t i = 0; i < inner; i++)
                    op[i] += xp[k * inner + i];
            if (scale != 1.0)
                for (int64_t i = 0; i < inner; i++)
                    op[i] = (float)(op[i] * scale);
        }
    }
    return PL_OK;
}

static pl_status k_sum_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    int64_t outer, n, inner;
    red_geom(a->in[1], a->p.dim, &outer, &n, &inner);
    const float *G = cf32(a->in[0]);
    float *D = f32p(gx);
    float scale = a->op == PL_OP_MEAN ? (float)(1.0 / (double)n) : 1.0f;
#pragma omp parallel for if (outer * n * inner > PAR_MIN)
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < inner; i++)
                D[(o * n + k) * inner + i] = G[o * inner + i] * scale;
    return PL_OK;
}

/* ---- activations ----------------------------------------------------------- */

/* The formulas (and their sources) are kernel_math.h's; each case is its own
 * loop so that the op switch stays outside the hot loop. */

static pl_status k_unary_fwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *X = cf32(a->in[0]);
    float *O = f32p(a->out[0]);
    float al = (float)a->p.alpha;
    switch (a->op) {
    case PL_OP_RELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_relu(X[i]);
        break;
    case PL_OP_LEAKY_RELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_leaky_relu(X[i], al);
        break;
    case PL_OP_ELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_elu(X[i], al);
        break;
    case PL_OP_GELU:
        if (a->p.flags & 1) {
#pragma omp parallel for if (n > PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                O[i] = pl_math_gelu_tanh(X[i]);
        } else {
#pragma omp parallel for if (n > PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                O[i] = pl_math_gelu_erf(X[i]);
        }
        break;
    case PL_OP_SILU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_silu(X[i]);
        break;
    case PL_OP_SIGMOID:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_sigmoid(X[i]);
        break;
    case PL_OP_TANH:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = tanhf(X[i]);
        break;
    case PL_OP_EXP:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = expf(X[i]);
        break;
    case PL_OP_LOG:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = logf(X[i]);
        break;
    case PL_OP_SQUARE:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = pl_math_square(X[i]);
        break;
    case PL_OP_SQRT:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            O[i] = sqrtf(X[i]);
        break;
    default:
        return pl_error_set(PL_ERR_INTERNAL, "k_unary_fwd: op %s", pl_op_name(a->op));
    }
    return PL_OK;
}

/* gx = g * f'(x); derivatives as in PyTorch's derivatives.yaml (kernel_math.h).
 * relu, sigmoid, tanh, exp read their saved output y = in[2] (in[1], the
 * input, is a tape stub: pl_unary_grad_reads_output); X below is y for them. */
static pl_status k_unary_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0];
    if (!gx) return PL_OK;
    int64_t n = pl_tensor_numel(gx);
    const float *G = cf32(a->in[0]), *X = cf32(a->in[pl_unary_grad_reads_output(a->op) ? 2 : 1]);
    float *D = f32p(gx);
    float al = (float)a->p.alpha;
    switch (a->op) {
    case PL_OP_RELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_relu_grad(G[i], X[i]);
        break;
    case PL_OP_LEAKY_RELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_leaky_relu_grad(G[i], X[i], al);
        break;
    case PL_OP_ELU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_elu_grad(G[i], X[i], al);
        break;
    case PL_OP_GELU:
        if (a->p.flags & 1) {
#pragma omp parallel for if (n > PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                D[i] = pl_math_gelu_tanh_grad(G[i], X[i]);
        } else {
#pragma omp parallel for if (n > PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                D[i] = pl_math_gelu_erf_grad(G[i], X[i]);
        }
        break;
    case PL_OP_SILU:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_silu_grad(G[i], X[i]);
        break;
    case PL_OP_SIGMOID:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_sigmoid_grad(G[i], X[i]);
        break;
    case PL_OP_TANH:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_tanh_grad(G[i], X[i]);
        break;
    case PL_OP_EXP:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_exp_grad(G[i], X[i]);
        break;
    case PL_OP_LOG:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_log_grad(G[i], X[i]);
        break;
    case PL_OP_SQUARE:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_square_grad(G[i], X[i]);
        break;
    case PL_OP_SQRT:
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_sqrt_grad(G[i], X[i]);
        break;
    default:
        return pl_error_set(PL_ERR_INTERNAL, "k_unary_bwd: op %s", pl_op_name(a->op));
    }
    return PL_OK;
}

/* SwiGLU: out = silu(gate) * up (silu rounded to p.dtype when that is bf16
 * / f16); backward from gate and up (kernel_math.h). */
static pl_status k_swiglu_fwd(const pl_kernel_args *a) {
    int64_t n = pl_tensor_numel(a->out[0]);
    const float *X = cf32(a->in[0]), *U = cf32(a->in[1]);
    float *O = f32p(a->out[0]);
    pl_dtype rt = a->p.dtype;
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        O[i] = pl_math_swiglu(X[i], U[i], rt);
    return PL_OK;
}

static pl_status k_swiglu_bwd(const pl_kernel_args *a) {
    pl_tensor *gx = a->out[0], *gu = a->out[1];
    const float *G = cf32(a->in[0]), *X = cf32(a->in[1]);
    int64_t n = pl_tensor_numel(a->in[0]);
    if (gx) {
        const float *U = cf32(a->in[2]);
        float *D = f32p(gx);
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_swiglu_grad_gate(G[i], X[i], U[i]);
    }
    if (gu) {
        float *D = f32p(gu);
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            D[i] = pl_math_swiglu_grad_up(G[i], X[i], a->p.dtype);
    }
    return PL_OK;
}

/* ---- cast ---------------------------------------------------------------------- */

static pl_status k_cast_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *o = a->out[0];
    int64_t n = pl_tensor_numel(x);
    if (x->dtype == PL_F32) return from_f32(cf32(x), o, n);
    if (o->dtype == PL_F32) return to_f32(x, f32p(o), n);
    scratch s = {0};
    float *tmp = scratch_f32(&s, n);
    if (!tmp) return PL_ERR_NOMEM;
    pl_status st = to_f32(x, tmp, n);
    if (!st) st = from_f32(tmp, o, n);
    scratch_free(&s);
    return st;
}

/* The gradient of a cast is the incoming f32 gradient itself. */
static pl_status k_cast_bwd(const pl_kernel_args *a) {
    if (a->out[0])
        memcpy(f32p(a->out[0]), cf32(a->in[0]), pl_tensor_numel(a->out[0]) * sizeof(float));
    return PL_OK;
}

/* ---- registration ---------------------------------------------------------------- */

void pl_cpu_register_dense(pl_kernel_table *b) {
    pl_cpu_register_dense_matmul(b);
    static const pl_op bin[] = {PL_OP_ADD, PL_OP_SUB, PL_OP_MUL, PL_OP_DIV};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++) {
        b->forward[bin[i]] = k_binary_fwd;
        b->backward[bin[i]] = k_binary_bwd;
    }
    b->forward[PL_OP_SCALE] = b->forward[PL_OP_ADD_SCALAR] = k_scalar_fwd;
    b->backward[PL_OP_SCALE] = b->backward[PL_OP_ADD_SCALAR] = k_scalar_bwd;
    b->forward[PL_OP_SUM] = b->forward[PL_OP_MEAN] = k_sum_fwd;
    b->backward[PL_OP_SUM] = b->backward[PL_OP_MEAN] = k_sum_bwd;
    static const pl_op un[] = {PL_OP_RELU, PL_OP_LEAKY_RELU, PL_OP_ELU,  PL_OP_GELU,
                               PL_OP_SILU, PL_OP_SIGMOID,    PL_OP_TANH, PL_OP_EXP,
                               PL_OP_LOG,  PL_OP_SQUARE,     PL_OP_SQRT};
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
        b->forward[un[i]] = k_unary_fwd;
        b->backward[un[i]] = k_unary_bwd;
    }
    b->forward[PL_OP_SWIGLU] = k_swiglu_fwd;
    b->backward[PL_OP_SWIGLU] = k_swiglu_bwd;
    pl_cpu_register_dense_norm(b);
    b->forward[PL_OP_CAST] = k_cast_fwd;
    b->backward[PL_OP_CAST] = k_cast_bwd;
}
