/* kernels_dense.c - CPU forward / backward kernels of the dense ops
 * (matmul, broadcasting arithmetic, reductions, activations, softmax,
 * losses, normalization, cast). Registered by pl_cpu_register_dense().
 *
 * Conventions (backend.h): every tensor handed to a kernel is contiguous.
 * Forward: in[] are the op's inputs, out[0] the result, out[1..] tensors
 * saved for backward. Backward: in[0] = grad of output (f32), in[1..] the
 * op's inputs then its saved tensors, out[i] = grad of input i (f32,
 * overwritten) or NULL. Elementwise kernels compute in f32; the op layer
 * (ops_dense.c) casts half inputs to f32 around them, except matmul and
 * cast which take bf16 / f16 directly.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h> /* row_max */
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "internal.h" /* and pipeline/backend_util.h: matmul and broadcast geometry,
                        * pipeline/kernel_math.h: the per-element math */

#define PAR_MIN 32768 /* elements below which loops stay serial */

/* ---- small helpers ----------------------------------------------------- */

static inline const float *cf32(const pl_tensor *t) {
    return (const float *)pl_tensor_data(t);
}
static inline float *f32p(const pl_tensor *t) {
    return (float *)pl_tensor_data(t);
}

/* Convert n elements of a float tensor's data (f32/bf16/f16/f64) to f32. */
static pl_status to_f32(const pl_tensor *t, float *dst, int64_t n) {
    const void *src = pl_tensor_data(t);
    switch (t->dtype) {
    case PL_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return PL_OK;
    case PL_BF16: {
        const uint16_t *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = pl_bf16_widen(s[i]);
        return PL_OK;
    }
    case PL_F16: {
        const uint16_t *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = pl_f16_widen(s[i]);
        return PL_OK;
    }
    case PL_F64: {
        const double *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        return PL_OK;
    }
    default:
        return pl_error_set(PL_ERR_DTYPE, "cpu dense kernel: cannot read %s as f32",
                            pl_dtype_name(t->dtype));
    }
}

/* Store n f32 values into a float tensor's data in its dtype. */
static pl_status from_f32(const float *src, pl_tensor *t, int64_t n) {
    void *dst = pl_tensor_data(t);
    switch (t->dtype) {
    case PL_F32:
        if (dst != (const void *)src) memcpy(dst, src, (size_t)n * sizeof(float));
        return PL_OK;
    case PL_BF16: {
        uint16_t *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = pl_bf16_round(src[i]);
        return PL_OK;
    }
    case PL_F16: {
        uint16_t *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = pl_f16_round(src[i]);
        return PL_OK;
    }
    case PL_F64: {
        double *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = src[i];
        return PL_OK;
    }
    default:
        return pl_error_set(PL_ERR_DTYPE, "cpu dense kernel: cannot write f32 as %s",
                            pl_dtype_name(t->dtype));
    }
}

/* Scratch from the caching allocator (no system malloc in steady state). */
typedef struct scratch {
    void *p;
    size_t cap;
} scratch;

static float *scratch_f32(scratch *s, int64_t n) {
    s->p = pl_alloc(PL_CPU, (size_t)(n > 0 ? n : 1) * sizeof(float), &s->cap);
    return s->p;
}

static void scratch_free(scratch *s) {
    if (s->p) pl_free(PL_CPU, s->p, s->cap);
    s->p = NULL;
}

/* f32 view of a tensor: its own data when f32, else a converted scratch copy. */
static const float *as_f32(const pl_tensor *t, scratch *s, pl_status *st) {
    if (t->dtype == PL_F32) return cf32(t);
    int64_t n = pl_tensor_numel(t);
    float *p = scratch_f32(s, n);
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    *st = to_f32(t, p, n);
    return p;
}

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
#pragma omp simd reduction(+ : s, sx)
            for (int64_t c = 0; c < C; c++) {
                s += pl_ce_exp(x[c], m);
                sx += x[c];
            }
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

/* ---- matmul --------------------------------------------------------------------- */

/* Geometry of C[batch..., M, N] = op(A)[batch..., M, K] @ op(B)[batch..., K, N]. */

#define TR(t) ((t) ? CblasTrans : CblasNoTrans)

static void mm_fwd_f32(const pl_mm_geo *g, const float *A, const float *B, float *C) {
    int64_t M = g->M, N = g->N, K = g->K;
    int64_t lda = g->ta ? M : K, ldb = g->tb ? K : N;
    if (M == 0 || N == 0) return;
    if (K == 0) {
        memset(C, 0, (size_t)(g->nbatch * M * N) * sizeof(float));
        return;
    }
    if (g->collapse) {
        pl_sgemm(CblasRowMajor, CblasNoTrans, TR(g->tb), (int)(g->nbatch * M), (int)N, (int)K,
                    1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)N);
        return;
    }
    for (int64_t bi = 0; bi < g->nbatch; bi++) {
        int64_t ia, ib;
        pl_mm_batch_off(g, bi, &ia, &ib);
        pl_sgemm(CblasRowMajor, TR(g->ta), TR(g->tb), (int)M, (int)N, (int)K, 1.0f,
                    A + ia * M * K, (int)lda, B + ib * K * N, (int)ldb, 0.0f, C + bi * M * N,
                    (int)N);
    }
}

/* The zeroing both matmul backwards share: a broadcast operand's gradient
 * accumulates over batches, and an empty product leaves a zero gradient.
 * Returns true when there is nothing more to compute (M, N or K is 0). */
static bool mm_bwd_zero(const pl_mm_geo *g, float *dA, float *dB) {
    int64_t M = g->M, N = g->N, K = g->K;
    if (dA && (g->na != g->nbatch || N == 0))
        memset(dA, 0, (size_t)(g->na * M * K) * sizeof(float));
    if (dB && (g->nb != g->nbatch || M == 0))
        memset(dB, 0, (size_t)(g->nb * K * N) * sizeof(float));
    return M == 0 || N == 0 || K == 0;
}

/* dA / dB (either may be NULL); broadcast matrices accumulate over batches. */
static void mm_bwd_f32(const pl_mm_geo *g, const float *G, const float *A, const float *B, float *dA,
                       float *dB) {
    int64_t M = g->M, N = g->N, K = g->K;
    int64_t lda = g->ta ? M : K, ldb = g->tb ? K : N;
    bool ta = g->ta, tb = g->tb;
    if (mm_bwd_zero(g, dA, dB)) return;
    if (g->collapse) {
        int Mt = (int)(g->nbatch * M);
        if (dA)
            pl_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasNoTrans : CblasTrans, Mt, (int)K,
                        (int)N, 1.0f, G, (int)N, B, (int)ldb, 0.0f, dA, (int)K);
        if (dB) {
            if (!tb)
                pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)N, Mt, 1.0f, A,
                            (int)K, G, (int)N, 0.0f, dB, (int)N);
            else
                pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, Mt, 1.0f, G,
                            (int)N, A, (int)K, 0.0f, dB, (int)K);
        }
        return;
    }
    float beta_a = g->na == g->nbatch ? 0.0f : 1.0f, beta_b = g->nb == g->nbatch ? 0.0f : 1.0f;
    for (int64_t bi = 0; bi < g->nbatch; bi++) {
        int64_t ia, ib;
        pl_mm_batch_off(g, bi, &ia, &ib);
        const float *a = A + ia * M * K, *b = B + ib * K * N, *gg = G + bi * M * N;
        if (dA) {
            float *d = dA + ia * M * K;
            if (!ta)
                pl_sgemm(CblasRowMajor, CblasNoTrans, tb ? CblasNoTrans : CblasTrans, (int)M,
                            (int)K, (int)N, 1.0f, gg, (int)N, b, (int)ldb, beta_a, d, (int)K);
            else
                pl_sgemm(CblasRowMajor, TR(tb), CblasTrans, (int)K, (int)M, (int)N, 1.0f, b,
                            (int)ldb, gg, (int)N, beta_a, d, (int)M);
        }
        if (dB) {
            float *d = dB + ib * K * N;
            if (!tb)
                pl_sgemm(CblasRowMajor, ta ? CblasNoTrans : CblasTrans, CblasNoTrans, (int)K,
                            (int)N, (int)M, 1.0f, a, (int)lda, gg, (int)N, beta_b, d, (int)N);
            else
                pl_sgemm(CblasRowMajor, CblasTrans, TR(ta), (int)N, (int)K, (int)M, 1.0f, gg,
                            (int)N, a, (int)lda, beta_b, d, (int)K);
        }
    }
}

/* ---- matmul with a half-precision operand (autocast): cpu/gemm_mixed.c widens
 * bf16 / f16 while packing and rounds a bf16 C in its store, so neither an
 * f32 copy of an operand nor an f32 C is made. Gradients are f32. */

static bool mm_mixed_dtype(pl_dtype d) {
    return d == PL_F32 || d == PL_BF16 || d == PL_F16;
}

/* A half operand and nothing else: f32 x f32 keeps sgemm (bit-identical fp32). */
static bool mm_use_mixed(const pl_tensor *x, const pl_tensor *y) {
    return mm_mixed_dtype(x->dtype) && mm_mixed_dtype(y->dtype) &&
           (x->dtype != PL_F32 || y->dtype != PL_F32);
}

static pl_gemm_operand mm_opnd(const pl_tensor *t, int64_t matrix, int64_t elems, int64_t ld,
                               bool trans) {
    const char *p = pl_tensor_data(t);
    return (pl_gemm_operand){p + (size_t)(matrix * elems) * pl_dtype_size(t->dtype), t->dtype, ld,
                             trans};
}

/* Below this many flops a matrix of a batched product runs on one thread,
 * the batch spread over the threads instead. */
#define MM_MIXED_SERIAL_FLOPS 4e6

static pl_status mm_fwd_mixed(const pl_mm_geo *g, const pl_tensor *A, const pl_tensor *B, void *C,
                              pl_dtype cdt) {
    int64_t M = g->M, N = g->N, K = g->K;
    int64_t lda = g->ta ? M : K, ldb = g->tb ? K : N;
    if (g->collapse) {
        pl_gemm_operand oa = mm_opnd(A, 0, 0, lda, false), ob = mm_opnd(B, 0, 0, ldb, g->tb);
        return pl_gemm_mixed(g->nbatch * M, N, K, &oa, &ob, C, cdt, N, false, true);
    }
    bool serial = 2.0 * M * N * K < MM_MIXED_SERIAL_FLOPS;
    pl_status st = PL_OK;
    size_t cs = pl_dtype_size(cdt);
#pragma omp parallel for schedule(dynamic, 1) if (serial && g->nbatch > 1)
    for (int64_t bi = 0; bi < g->nbatch; bi++) {
        int64_t ia, ib;
        pl_mm_batch_off(g, bi, &ia, &ib);
        pl_gemm_operand oa = mm_opnd(A, ia, M * K, lda, g->ta), ob = mm_opnd(B, ib, K * N, ldb, g->tb);
        pl_status s = pl_gemm_mixed(M, N, K, &oa, &ob, (char *)C + (size_t)(bi * M * N) * cs, cdt, N,
                                    false, !serial);
        if (s) {
#pragma omp atomic write
            st = s;
        }
    }
    return st;
}

/* dA / dB (either may be NULL) of the f32 gradient G, as mm_bwd_f32 with
 * the half operands read in place. */
static pl_status mm_bwd_mixed(const pl_mm_geo *g, const float *G, const pl_tensor *A,
                              const pl_tensor *B, float *dA, float *dB) {
    int64_t M = g->M, N = g->N, K = g->K;
    int64_t lda = g->ta ? M : K, ldb = g->tb ? K : N;
    bool ta = g->ta, tb = g->tb;
    if (mm_bwd_zero(g, dA, dB)) return PL_OK;
    pl_status st = PL_OK;
    if (g->collapse) {
        int64_t Mt = g->nbatch * M;
        pl_gemm_operand og = {G, PL_F32, N, false};
        if (dA) { /* [Mt, K] = G [Mt, N] @ op(B)^T */
            pl_gemm_operand ob = mm_opnd(B, 0, 0, ldb, !tb);
            st = pl_gemm_mixed(Mt, K, N, &og, &ob, dA, PL_F32, K, false, true);
        }
        if (dB && !st) {
            pl_gemm_operand oa = mm_opnd(A, 0, 0, K, !tb);
            pl_gemm_operand ogt = {G, PL_F32, N, true};
            st = tb ? pl_gemm_mixed(N, K, Mt, &ogt, &oa, dB, PL_F32, K, false, true) /* G^T A */
                    : pl_gemm_mixed(K, N, Mt, &oa, &og, dB, PL_F32, N, false, true); /* A^T G */
        }
        return st;
    }
    bool acc_a = g->na != g->nbatch, acc_b = g->nb != g->nbatch;
    bool serial = 2.0 * M * N * K < MM_MIXED_SERIAL_FLOPS;
    /* matrices accumulated over the batch are written by one thread at a time */
    bool spread = serial && !acc_a && !acc_b && g->nbatch > 1;
#pragma omp parallel for schedule(dynamic, 1) if (spread)
    for (int64_t bi = 0; bi < g->nbatch; bi++) {
        int64_t ia, ib;
        pl_mm_batch_off(g, bi, &ia, &ib);
        pl_gemm_operand og = {G + bi * M * N, PL_F32, N, false}, ogt = {G + bi * M * N, PL_F32, N, true};
        pl_status s = PL_OK;
        if (dA) {
            float *d = dA + ia * M * K;
            if (!ta) { /* [M, K] = G @ op(B)^T */
                pl_gemm_operand ob = mm_opnd(B, ib, K * N, ldb, !tb);
                s = pl_gemm_mixed(M, K, N, &og, &ob, d, PL_F32, K, acc_a, !spread);
            } else { /* A^T's gradient [K, M] = op(B) @ G^T */
                pl_gemm_operand ob = mm_opnd(B, ib, K * N, ldb, tb);
                s = pl_gemm_mixed(K, M, N, &ob, &ogt, d, PL_F32, M, acc_a, !spread);
            }
        }
        if (dB && !s) {
            float *d = dB + ib * K * N;
            if (!tb) { /* [K, N] = op(A)^T @ G */
                pl_gemm_operand oa = mm_opnd(A, ia, M * K, lda, !ta);
                s = pl_gemm_mixed(K, N, M, &oa, &og, d, PL_F32, N, acc_b, !spread);
            } else { /* B^T's gradient [N, K] = G^T @ op(A) */
                pl_gemm_operand oa = mm_opnd(A, ia, M * K, lda, ta);
                s = pl_gemm_mixed(N, K, M, &ogt, &oa, d, PL_F32, K, acc_b, !spread);
            }
        }
        if (s) {
#pragma omp atomic write
            st = s;
        }
    }
    return st;
}

/* f32 x f32 -> f32 directly; bf16 / f16 inputs are widened to f32 panels
 * (exact), multiplied with f32 accumulation and rounded once to the
 * output dtype. */
static pl_status k_matmul_fwd(const pl_kernel_args *a) {
    pl_mm_geo g;
    pl_mm_geo_init(&g, a->in[0], a->in[1], a->out[0], a->p.flags);
    pl_status st = PL_OK;
    scratch sa = {0}, sb = {0}, sc = {0};
    /* bf16 x bf16 in the nn.Linear shape (x @ W^T, W shared): native
     * AVX-512 BF16 dot products, f32 accumulation (cpu/bf16_gemm.c) */
    if (a->in[0]->dtype == PL_BF16 && a->in[1]->dtype == PL_BF16 && g.collapse && g.tb &&
        g.M > 0 && g.N > 0 && g.K > 0) {
        float *C0 = a->out[0]->dtype == PL_F32 ? f32p(a->out[0])
                                               : scratch_f32(&sc, pl_tensor_numel(a->out[0]));
        if (C0 && pl_bf16_gemm_nt(pl_tensor_data(a->in[0]), pl_tensor_data(a->in[1]), C0,
                                  g.nbatch * g.M, g.N, g.K)) {
            if (a->out[0]->dtype != PL_F32)
                st = from_f32(C0, a->out[0], pl_tensor_numel(a->out[0]));
            scratch_free(&sc);
            return st;
        }
        scratch_free(&sc);
        sc = (scratch){0};
    }
    if (mm_use_mixed(a->in[0], a->in[1])) {
        pl_tensor *o = a->out[0];
        bool direct = o->dtype == PL_F32 || o->dtype == PL_BF16;
        void *C = direct ? pl_tensor_data(o) : scratch_f32(&sc, pl_tensor_numel(o));
        if (!C) return PL_ERR_NOMEM;
        st = mm_fwd_mixed(&g, a->in[0], a->in[1], C, direct ? o->dtype : PL_F32);
        if (!st && !direct) st = from_f32(C, o, pl_tensor_numel(o));
        scratch_free(&sc);
        return st;
    }
    const float *A = as_f32(a->in[0], &sa, &st);
    const float *B = st ? NULL : as_f32(a->in[1], &sb, &st);
    float *C = NULL;
    if (!st) {
        C = a->out[0]->dtype == PL_F32 ? f32p(a->out[0])
                                       : scratch_f32(&sc, pl_tensor_numel(a->out[0]));
        if (!C) st = PL_ERR_NOMEM;
    }
    if (!st) {
        mm_fwd_f32(&g, A, B, C);
        if (a->out[0]->dtype != PL_F32) st = from_f32(C, a->out[0], pl_tensor_numel(a->out[0]));
    }
    scratch_free(&sa);
    scratch_free(&sb);
    scratch_free(&sc);
    return st;
}

static pl_status k_matmul_bwd(const pl_kernel_args *a) {
    const pl_tensor *G = a->in[0];
    pl_mm_geo g;
    pl_mm_geo_init(&g, a->in[1], a->in[2], G, a->p.flags);
    pl_status st = PL_OK;
    if (mm_use_mixed(a->in[1], a->in[2]))
        return mm_bwd_mixed(&g, cf32(G), a->in[1], a->in[2], a->out[0] ? f32p(a->out[0]) : NULL,
                            a->out[1] ? f32p(a->out[1]) : NULL);
    scratch sa = {0}, sb = {0};
    /* dA needs B, dB needs A */
    const float *A = a->out[1] ? as_f32(a->in[1], &sa, &st) : NULL;
    const float *B = !st && a->out[0] ? as_f32(a->in[2], &sb, &st) : NULL;
    if (!st)
        mm_bwd_f32(&g, cf32(G), A, B, a->out[0] ? f32p(a->out[0]) : NULL,
                   a->out[1] ? f32p(a->out[1]) : NULL);
    scratch_free(&sa);
    scratch_free(&sb);
    return st;
}

/* ---- registration ---------------------------------------------------------------- */

void pl_cpu_register_dense(pl_kernel_table *b) {
    b->forward[PL_OP_MATMUL] = k_matmul_fwd;
    b->backward[PL_OP_MATMUL] = k_matmul_bwd;
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
    b->forward[PL_OP_SOFTMAX] = b->forward[PL_OP_LOG_SOFTMAX] = k_softmax_fwd;
    b->backward[PL_OP_SOFTMAX] = b->backward[PL_OP_LOG_SOFTMAX] = k_softmax_bwd;
    b->forward[PL_OP_CROSS_ENTROPY] = k_ce_fwd;
    b->backward[PL_OP_CROSS_ENTROPY] = k_ce_bwd;
    static const pl_op ls[] = {PL_OP_MSE, PL_OP_MAE, PL_OP_HUBER};
    for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
        b->forward[ls[i]] = k_loss_fwd;
        b->backward[ls[i]] = k_loss_bwd;
    }
    b->forward[PL_OP_LAYER_NORM] = k_layer_norm_fwd;
    b->backward[PL_OP_LAYER_NORM] = k_layer_norm_bwd;
    b->forward[PL_OP_RMS_NORM] = k_rms_norm_fwd;
    b->backward[PL_OP_RMS_NORM] = k_rms_norm_bwd;
    b->forward[PL_OP_CAST] = k_cast_fwd;
    b->backward[PL_OP_CAST] = k_cast_bwd;
}
