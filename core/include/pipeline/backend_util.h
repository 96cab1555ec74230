/* backend_util.h - geometry and math every backend shares with the CPU one.
 *
 * A backend (the cpu plugin, the CUDA plugin, a third party's) gets
 * the same op from the core with the same pl_kernel_args (backend.h); what
 * it derives from them must agree bit for bit with the CPU reference: which
 * matrices of a batched matmul pair up, which element of a broadcast operand
 * an output element reads, the RoPE angles, the dropout random stream. Those
 * derivations live here, once, instead of being copied into each backend.
 * The per-element math (activations, softmax and loss terms, normalization,
 * Philox and dropout, RoPE rotation, NF4 decode, bf16 / f16 rounding) is in
 * kernel_math.h, included here, which also defines PL_HD.
 *
 * Everything is `static inline` except pl_rope_cos_sin (exported by
 * libpipeline_core). Functions marked PL_HD compile for the device too
 * under nvcc (__host__ __device__); the others read pl_tensor headers and are
 * host-only. All are plain C that is also valid C++.
 *
 * Tensors passed here are borrowed and only their headers (dtype, ndim,
 * shape) are read; kernels receive contiguous tensors (backend.h), so the
 * strides computed below are element strides of row-major storage. No
 * function allocates or fails, except pl_rope_cos_sin (caller's buffer).
 */
#ifndef PIPELINE_BACKEND_UTIL_H
#define PIPELINE_BACKEND_UTIL_H

#include <math.h> /* NAN */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/backend.h"
#include "pipeline/kernel_math.h" /* PL_HD and the per-element math */
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- a kernel table behind the lookup --------------------------------------
 * The usual way to implement pl_backend.kernel: fill a table once, answer
 * lookups from it. The bound is the PL_OP_COUNT this backend is compiled
 * with, so a newer core asking about an op appended later gets NULL. */
typedef struct pl_kernel_table {
    pl_kernel_fn forward[PL_OP_COUNT];
    pl_kernel_fn backward[PL_OP_COUNT];
} pl_kernel_table;

/* The forward or backward kernel of `op`: NULL when unset, or for an id
 * outside this table (PL_OP_NONE, negative, past PL_OP_COUNT, custom). */
static inline pl_kernel_fn pl_kernel_table_get(const pl_kernel_table *t, pl_op op, bool backward) {
    if ((int)op <= (int)PL_OP_NONE || (int)op >= (int)PL_OP_COUNT) return NULL;
    return backward ? t->backward[op] : t->forward[op];
}

/* The ops whose GPU kernels load and store bf16 / f16 tensors in place
 * (f32 math, one rounding per output): add, sub, mul, div, scale,
 * add_scalar, swiglu and rms_norm, forward and backward. The CUDA backend's
 * pl_backend.half_native answers with it (cuda_backend.cu); the strict
 * device claims the same set, so that its device memory holds what a GPU's
 * would (no f32 copies of these ops' half tensors). True or false, no
 * error; any op id. */
static inline bool pl_gpu_half_native_op(pl_op op) {
    switch (op) {
    case PL_OP_ADD:
    case PL_OP_SUB:
    case PL_OP_MUL:
    case PL_OP_DIV:
    case PL_OP_SCALE:
    case PL_OP_ADD_SCALAR:
    case PL_OP_SWIGLU:
    case PL_OP_RMS_NORM: return true;
    default: return false;
    }
}

/* Set both kernels of `op` (either may be NULL); ids outside the table are
 * ignored. */
static inline void pl_kernel_table_set(pl_kernel_table *t, pl_op op, pl_kernel_fn forward,
                                       pl_kernel_fn backward) {
    if ((int)op <= (int)PL_OP_NONE || (int)op >= (int)PL_OP_COUNT) return;
    t->forward[op] = forward;
    t->backward[op] = backward;
}

/* ---- one dim of a contiguous tensor ----------------------------------------- */

/* t seen as [outer, t.shape[dim], inner] (index_select, gather, scatter_add,
 * concat, slice along `dim`; 0 <= dim < t->ndim). */
static inline void pl_dim_split(const pl_tensor *t, int dim, int64_t *outer, int64_t *mid,
                                int64_t *inner) {
    int64_t o = 1, in = 1;
    for (int i = 0; i < dim; i++)
        o *= t->shape[i];
    for (int i = dim + 1; i < t->ndim; i++)
        in *= t->shape[i];
    *outer = o;
    *mid = t->shape[dim];
    *inner = in;
}

/* t seen as [rows, d], d the last dim (1 for a 0-dim tensor; rows 0 when
 * d is 0): softmax, cross_entropy, layer_norm, rms_norm rows. */
static inline void pl_last_dim_split(const pl_tensor *t, int64_t *rows, int64_t *d) {
    *d = t->ndim > 0 ? t->shape[t->ndim - 1] : 1;
    *rows = *d > 0 ? pl_tensor_numel(t) / *d : 0;
}

/* The input x of a sum / mean over `dim` as [outer, n, inner], n the reduced
 * length; dim == PL_ALL_DIMS reduces everything: [1, numel, 1]. */
static inline void pl_reduce_split(const pl_tensor *x, int64_t dim, int64_t *outer, int64_t *n,
                                   int64_t *inner) {
    *outer = 1;
    *inner = 1;
    *n = 1;
    if (dim == PL_ALL_DIMS) {
        *n = pl_tensor_numel(x);
        return;
    }
    for (int d = 0; d < x->ndim; d++) {
        if (d < dim)
            *outer *= x->shape[d];
        else if (d == dim)
            *n = x->shape[d];
        else
            *inner *= x->shape[d];
    }
}

/* ---- layer_norm / rms_norm arguments (PL_OP_LAYER_NORM, PL_OP_RMS_NORM) -----
 * Rows are x's last dim: x is [R, D]. p.flags bit0: weight w [D]; bit1 (layer_norm
 * only): bias b [D]. Forward: in = x, [w], [b]; out = y, [mean] (layer_norm
 * only), rstd, mean and rstd [R]. Backward: in = g, x, [w], [b], [mean], rstd;
 * out = gx, [gw], [gb], each NULL when that gradient is not wanted. The
 * structs hold the data pointers by role, NULL where absent; f32 throughout. */
typedef struct pl_norm_fwd_io {
    int64_t R, D;
    const float *x, *w, *b;
    float *y, *mean, *rstd;
} pl_norm_fwd_io;

typedef struct pl_norm_bwd_io {
    int64_t R, D;
    const float *g, *x, *w, *mean, *rstd;
    float *gx, *gw, *gb;
} pl_norm_bwd_io;

/* t's f32 data, or NULL for an absent (NULL) tensor. */
static inline float *pl_norm_data_(const pl_tensor *t) {
    return t ? (float *)pl_tensor_data(t) : NULL;
}

/* io from a forward kernel's args of layer_norm (rms false) or rms_norm (rms
 * true: PL_OP_RMS_NORM's layout, no bias, no mean); R, D from x's last dim. */
static inline void pl_norm_fwd_io_init(pl_norm_fwd_io *io, const pl_kernel_args *a, bool rms) {
    bool hw = a->p.flags & 1, hb = !rms && (a->p.flags & 2);
    int k = 1;
    pl_last_dim_split(a->in[0], &io->R, &io->D);
    io->x = pl_norm_data_(a->in[0]);
    io->w = hw ? pl_norm_data_(a->in[k++]) : NULL;
    io->b = hb ? pl_norm_data_(a->in[k++]) : NULL;
    io->y = pl_norm_data_(a->out[0]);
    io->mean = rms ? NULL : pl_norm_data_(a->out[1]);
    io->rstd = pl_norm_data_(a->out[rms ? 1 : 2]);
}

/* io from a backward kernel's args (the layout above); gradients not wanted
 * are NULL. */
static inline void pl_norm_bwd_io_init(pl_norm_bwd_io *io, const pl_kernel_args *a, bool rms) {
    bool hw = a->p.flags & 1, hb = !rms && (a->p.flags & 2);
    int k = 2, o = 1;
    pl_last_dim_split(a->in[1], &io->R, &io->D);
    io->g = pl_norm_data_(a->in[0]);
    io->x = pl_norm_data_(a->in[1]);
    io->w = hw ? pl_norm_data_(a->in[k++]) : NULL;
    if (hb) k++;
    io->mean = rms ? NULL : pl_norm_data_(a->in[k++]);
    io->rstd = pl_norm_data_(a->in[k]);
    io->gx = pl_norm_data_(a->out[0]);
    io->gw = hw ? pl_norm_data_(a->out[o++]) : NULL;
    io->gb = hb ? pl_norm_data_(a->out[o]) : NULL;
}

/* ---- NumPy broadcasting of a binary op -------------------------------------
 * The op iterates over the output's shape (the "space", nd >= 1: a 0-dim
 * output is [1]). Operand t (contiguous, ndim <= nd) is right-aligned to the
 * space; its element stride along space dim d is 0 where it has size 1 or
 * lacks the dim. The gradient of a broadcast operand is the space-shaped
 * gradient summed over the dims where its stride is 0. */

/* Element strides st[0..nd) of contiguous t right-aligned to an nd-dim space. */
static inline void pl_bcast_strides(const pl_tensor *t, int nd, int64_t *st) {
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int td = d - (nd - t->ndim);
        if (td < 0) {
            st[d] = 0;
            continue;
        }
        st[d] = t->shape[td] == 1 ? 0 : s;
        s *= t->shape[td];
    }
}

typedef struct pl_bcast_geo {
    int nd;                     /* dims of the space, >= 1 */
    int64_t shape[PL_MAX_DIMS]; /* the space (the output's shape) */
    int64_t sx[PL_MAX_DIMS];    /* strides of operand x in the space */
    int64_t sy[PL_MAX_DIMS];    /* strides of operand y in the space */
} pl_bcast_geo;

/* Geometry of out = x (op) y over `space` (the output, or the incoming
 * gradient in backward). Plain data: can be passed to a device kernel by value. */
static inline void pl_bcast_geo_init(pl_bcast_geo *g, const pl_tensor *space, const pl_tensor *x,
                                     const pl_tensor *y) {
    g->nd = space->ndim > 0 ? space->ndim : 1;
    if (space->ndim == 0) g->shape[0] = 1;
    for (int d = 0; d < space->ndim; d++)
        g->shape[d] = space->shape[d];
    pl_bcast_strides(x, g->nd, g->sx);
    pl_bcast_strides(y, g->nd, g->sy);
}

/* Offsets into x and y of space element i (row-major). */
PL_HD static inline void pl_bcast_offsets(const pl_bcast_geo *g, int64_t i, int64_t *ox,
                                          int64_t *oy) {
    int64_t a = 0, c = 0;
    for (int d = g->nd - 1; d >= 0; d--) {
        int64_t k = i % g->shape[d];
        i /= g->shape[d];
        a += k * g->sx[d];
        c += k * g->sy[d];
    }
    *ox = a;
    *oy = c;
}

/* ---- batched matmul geometry (PL_OP_MATMUL) --------------------------------
 * C[..., M, N] = op(A)[..., M, K] @ op(B)[..., K, N]; p.flags bit0 transposes
 * A (stored [..., K, M]), bit1 transposes B (stored [..., N, K]). Batch dims
 * of C are the broadcast of A's and B's (checked by pl_matmul before the
 * kernel runs); matrix bi of C uses matrix ia of A and ib of B
 * (pl_mm_batch_off), a broadcast dim having stride 0. */
typedef struct pl_mm_geo {
    int64_t M, N, K;
    bool ta, tb;
    int bnd; /* batch dims of the output */
    int64_t bshape[PL_MAX_DIMS];
    int64_t sa[PL_MAX_DIMS], sb[PL_MAX_DIMS]; /* matrix-index strides per batch dim */
    int64_t nbatch, na, nb;                   /* matrices in C, A, B */
    bool collapse; /* B shared and A un-transposed: one GEMM of nbatch*M rows */
} pl_mm_geo;

/* flags: PL_OP_MATMUL's p.flags. C is the output (forward) or its gradient. */
static inline void pl_mm_geo_init(pl_mm_geo *g, const pl_tensor *A, const pl_tensor *B,
                                  const pl_tensor *C, int flags) {
    g->ta = flags & 1;
    g->tb = (flags & 2) != 0;
    int na = A->ndim, nb = B->ndim;
    g->M = g->ta ? A->shape[na - 1] : A->shape[na - 2];
    g->K = g->ta ? A->shape[na - 2] : A->shape[na - 1];
    g->N = g->tb ? B->shape[nb - 2] : B->shape[nb - 1];
    g->bnd = C->ndim - 2;
    g->nbatch = 1;
    for (int d = 0; d < g->bnd; d++) {
        g->bshape[d] = C->shape[d];
        g->nbatch *= C->shape[d];
    }
    int64_t s1 = 1, s2 = 1;
    for (int d = g->bnd - 1; d >= 0; d--) {
        int da = d - (g->bnd - (na - 2)), db = d - (g->bnd - (nb - 2));
        int64_t ea = da >= 0 ? A->shape[da] : 1, eb = db >= 0 ? B->shape[db] : 1;
        g->sa[d] = ea == 1 ? 0 : s1;
        g->sb[d] = eb == 1 ? 0 : s2;
        s1 *= ea;
        s2 *= eb;
    }
    g->na = s1;
    g->nb = s2;
    g->collapse = !g->ta && g->nb == 1 && g->na == g->nbatch;
}

/* Matrix indices into A and B of output matrix bi (0 <= bi < nbatch). */
PL_HD static inline void pl_mm_batch_off(const pl_mm_geo *g, int64_t bi, int64_t *ia, int64_t *ib) {
    *ia = 0;
    *ib = 0;
    for (int d = g->bnd - 1; d >= 0; d--) {
        int64_t i = bi % g->bshape[d];
        bi /= g->bshape[d];
        *ia += i * g->sa[d];
        *ib += i * g->sb[d];
    }
}

/* ---- one element of any dtype (host copies and conversions) -----------------
 * The element-by-element path of a copy between dtypes or strides, shared by
 * the core's host copies (pl_tensor_copy_ into a strided CPU view,
 * pl_tensor_get) and the CPU backend's copy kernel. Every value passes
 * through f64: exact for every dtype but i64 beyond 2^53; bf16 / f16 round
 * to nearest even (kernel_math.h). Not for nf4 (packed codes: NaN / no-op). */

/* Storage offset (in elements) of t's i-th element in row-major order: its
 * offset plus i's coordinates times its strides. 0 <= i < numel. */
static inline int64_t pl_strided_offset(const pl_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t sz = t->shape[d];
        off += (i % sz) * t->stride[d];
        i /= sz;
    }
    return off;
}

/* Element `off` of a buffer of dtype dt, as a double. */
static inline double pl_elem_load(const void *base, pl_dtype dt, int64_t off) {
    switch (dt) {
    case PL_F32: return ((const float *)base)[off];
    case PL_F64: return ((const double *)base)[off];
    case PL_BF16: return pl_bf16_widen(((const uint16_t *)base)[off]);
    case PL_F16: return pl_f16_widen(((const uint16_t *)base)[off]);
    case PL_I32: return ((const int32_t *)base)[off];
    case PL_I64: return (double)((const int64_t *)base)[off];
    case PL_U8: return ((const uint8_t *)base)[off];
    default: return (double)NAN;
    }
}

/* Element `off` of a buffer of dtype dt set to v (rounded / truncated to dt). */
static inline void pl_elem_store(void *base, pl_dtype dt, int64_t off, double v) {
    switch (dt) {
    case PL_F32: ((float *)base)[off] = (float)v; break;
    case PL_F64: ((double *)base)[off] = v; break;
    case PL_BF16: ((uint16_t *)base)[off] = pl_bf16_round((float)v); break;
    case PL_F16: ((uint16_t *)base)[off] = pl_f16_round((float)v); break;
    case PL_I32: ((int32_t *)base)[off] = (int32_t)v; break;
    case PL_I64: ((int64_t *)base)[off] = (int64_t)v; break;
    case PL_U8: ((uint8_t *)base)[off] = (uint8_t)v; break;
    default: break;
    }
}

/* ---- RoPE (PL_OP_ROPE) -------------------------------------------------------
 * x is [B, T, H, Dh], position of row t is p.start + t, theta = p.alpha; the
 * convention (Hugging Face Llama) and the rotation (pl_rope_rotate) are in
 * kernel_math.h. */

/* tab[(t * half + i) * 2 + 0 / 1] = cos / sin of the angle of position
 * pos_offset + t and frequency i, for t < T, i < half. tab holds 2 * T * half
 * floats, caller-owned. Computed on the host once per (T, half, offset,
 * theta); a device backend uploads it (exported by libpipeline_core so every
 * backend gets the same bits from the same code). */
void pl_rope_cos_sin(float *tab, int64_t T, int64_t half, int64_t pos_offset, double theta);

#ifdef __cplusplus
}
#endif
#endif
