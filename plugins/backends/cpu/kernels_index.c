/* kernels_index.c - CPU kernels of the indexing, shape, dropout, rope and
 * causal-softmax ops (forward + backward). Conventions: backend.h.
 *
 * Data-moving forwards (embedding, index_select, gather, concat, slice,
 * permute) copy elements of any size, so they serve f32, bf16, f16 and
 * integer tensors alike. Gradients are f32. Scatter-style backwards are
 * deterministic: each destination element accumulates its sources in index
 * order whatever the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h" /* backend_util.h, kernel_math.h: the per-element math */

#ifdef _OPENMP
#include <omp.h>
#endif

void pl_cpu_register_lstm(pl_kernel_table *b); /* kernels_lstm.c */

#define PAR_MIN 32768 /* elements below which loops stay serial */

/* ---- small helpers ------------------------------------------------------------ */

static inline int64_t idx_get(const void *p, pl_dtype dt, int64_t i) {
    return dt == PL_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* First out-of-range index of `t` (values must lie in [0, n)), or PL_OK. */
static pl_status check_indices(pl_op op, const pl_tensor *t, int64_t n) {
    const void *p = pl_tensor_data(t);
    int64_t m = pl_tensor_numel(t), bad = -1;
    for (int64_t i = 0; i < m; i++) {
        int64_t v = idx_get(p, t->dtype, i);
        if (v < 0 || v >= n) {
            bad = i;
            break;
        }
    }
    if (bad < 0) return PL_OK;
    return pl_error_set(PL_ERR_INVALID, "%s: index %lld at position %lld is out of range [0, %lld)",
                        pl_op_name(op), (long long)idx_get(p, t->dtype, bad), (long long)bad,
                        (long long)n);
}

static inline float ld(const void *p, pl_dtype dt, int64_t i) {
    switch (dt) {
    case PL_BF16:
        return pl_bf16_widen(((const uint16_t *)p)[i]);
    case PL_F16:
        return pl_f16_widen(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static inline void st(void *p, pl_dtype dt, int64_t i, float v) {
    switch (dt) {
    case PL_BF16:
        ((uint16_t *)p)[i] = pl_bf16_round(v);
        break;
    case PL_F16:
        ((uint16_t *)p)[i] = pl_f16_round(v);
        break;
    default:
        ((float *)p)[i] = v;
        break;
    }
}

/* Sizes of t seen as [outer, t.shape[dim], inner] (backend_util.h). */
#define split3 pl_dim_split

/* dst[o, k, :] = src[o, idx[k], :]; rows of `inner` elements of es bytes.
 * src is [O, Nsrc, inner], dst is [O, K, inner]. */
static void select_rows(void *dst, const void *src, int64_t O, int64_t Nsrc, int64_t K,
                        int64_t inner, size_t es, const void *idx, pl_dtype idt) {
    size_t row = (size_t)inner * es;
#pragma omp parallel for collapse(2) if (O * K * inner > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < O; o++)
        for (int64_t k = 0; k < K; k++)
            memcpy((char *)dst + (size_t)(o * K + k) * row,
                   (const char *)src + (size_t)(o * Nsrc + idx_get(idx, idt, k)) * row, row);
}

/* dst[o, idx[k], :] += src[o, k, :] over k in order (f32); dst zeroed first.
 * dst [O, Ndst, inner], src [O, K, inner]. Parallel over o when there are
 * enough; otherwise each thread owns the destination rows r = tid mod nth.
 * Either way each element sums its sources in k order (deterministic). */
static void index_add_f32(float *dst, const float *src, int64_t O, int64_t Ndst, int64_t K,
                          int64_t inner, const void *idx, pl_dtype idt) {
    int64_t ndst = O * Ndst * inner;
#pragma omp parallel for if (ndst > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < ndst; i++)
        dst[i] = 0.0f;
    bool big = O * K * inner > PAR_MIN;
    if (O >= 16 || !big) {
#pragma omp parallel for if (big) schedule(static)
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                float *d = dst + (o * Ndst + idx_get(idx, idt, k)) * inner;
                const float *s = src + (o * K + k) * inner;
                for (int64_t j = 0; j < inner; j++)
                    d[j] += s[j];
            }
        return;
    }
#pragma omp parallel
    {
        int nth = 1, tid = 0;
#ifdef _OPENMP
        nth = omp_get_num_threads();
        tid = omp_get_thread_num();
#endif
        for (int64_t o = 0; o < O; o++)
            for (int64_t k = 0; k < K; k++) {
                int64_t r = idx_get(idx, idt, k);
                if (r % nth != tid) continue;
                float *d = dst + (o * Ndst + r) * inner;
                const float *s = src + (o * K + k) * inner;
                for (int64_t j = 0; j < inner; j++)
                    d[j] += s[j];
            }
    }
}

/* ---- embedding ------------------------------------------------------------------ */

/* out [*idx, D] = weight [V, D] rows. */
static pl_status embedding_fwd(const pl_kernel_args *a) {
    const pl_tensor *w = a->in[0], *ix = a->in[1];
    if (check_indices(a->op, ix, w->shape[0])) return PL_ERR_INVALID;
    select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(w), 1, w->shape[0], pl_tensor_numel(ix),
                w->shape[1], pl_dtype_size(w->dtype), pl_tensor_data(ix), ix->dtype);
    return PL_OK;
}

/* dW [V, D] = scatter-add of grad rows by idx. */
static pl_status embedding_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *w = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    index_add_f32(pl_tensor_data(a->out[0]), pl_tensor_data(g), 1, w->shape[0], pl_tensor_numel(ix),
                  w->shape[1], pl_tensor_data(ix), ix->dtype);
    return PL_OK;
}

/* ---- index_select / scatter_add ----------------------------------------------------- */

static pl_status index_select_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *ix = a->in[1];
    int d = (int)a->p.dim;
    int64_t O, N, I;
    split3(x, d, &O, &N, &I);
    if (check_indices(a->op, ix, N)) return PL_ERR_INVALID;
    select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(x), O, N, ix->shape[0], I,
                pl_dtype_size(x->dtype), pl_tensor_data(ix), ix->dtype);
    return PL_OK;
}

static pl_status index_select_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    int64_t O, N, I;
    split3(x, (int)a->p.dim, &O, &N, &I);
    index_add_f32(pl_tensor_data(a->out[0]), pl_tensor_data(g), O, N, ix->shape[0], I,
                  pl_tensor_data(ix), ix->dtype);
    return PL_OK;
}

static pl_status scatter_add_fwd(const pl_kernel_args *a) {
    const pl_tensor *s = a->in[0], *ix = a->in[1];
    int64_t O, K, I, N = a->p.shape[0];
    split3(s, (int)a->p.dim, &O, &K, &I);
    if (check_indices(a->op, ix, N)) return PL_ERR_INVALID;
    index_add_f32(pl_tensor_data(a->out[0]), pl_tensor_data(s), O, N, K, I, pl_tensor_data(ix),
                  ix->dtype);
    return PL_OK;
}

/* d src [o, k, :] = g [o, idx[k], :] */
static pl_status scatter_add_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *s = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    int64_t O, K, I, N = a->p.shape[0];
    split3(s, (int)a->p.dim, &O, &K, &I);
    select_rows(pl_tensor_data(a->out[0]), pl_tensor_data(g), O, N, K, I, sizeof(float),
                pl_tensor_data(ix), ix->dtype);
    return PL_OK;
}

/* ---- gather ------------------------------------------------------------------------ */

/* Element offsets into x of idx's outer (dims < d) and inner (dims > d)
 * coordinates; x contiguous. Caller frees *bo, *bi. */
static pl_status gather_bases(const pl_tensor *x, const pl_tensor *ix, int d, int64_t **bo,
                              int64_t **bi, int64_t *O, int64_t *K, int64_t *I) {
    int64_t xs[PL_MAX_DIMS], s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        xs[i] = s;
        s *= x->shape[i];
    }
    split3(ix, d, O, K, I);
    *bo = malloc((size_t)(*O ? *O : 1) * sizeof(int64_t));
    *bi = malloc((size_t)(*I ? *I : 1) * sizeof(int64_t));
    if (!*bo || !*bi) {
        free(*bo);
        free(*bi);
        return pl_error_set(PL_ERR_NOMEM, "gather: out of host memory for offsets");
    }
    for (int64_t o = 0; o < *O; o++) {
        int64_t r = o, off = 0;
        for (int i = d - 1; i >= 0; i--) {
            off += (r % ix->shape[i]) * xs[i];
            r /= ix->shape[i];
        }
        (*bo)[o] = off;
    }
    for (int64_t j = 0; j < *I; j++) {
        int64_t r = j, off = 0;
        for (int i = ix->ndim - 1; i > d; i--) {
            off += (r % ix->shape[i]) * xs[i];
            r /= ix->shape[i];
        }
        (*bi)[j] = off;
    }
    return PL_OK;
}

static pl_status gather_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0], *ix = a->in[1];
    int d = (int)a->p.dim;
    if (check_indices(a->op, ix, x->shape[d])) return PL_ERR_INVALID;
    int64_t *bo, *bi, O, K, I, sd = 1;
    for (int i = d + 1; i < x->ndim; i++)
        sd *= x->shape[i];
    if (gather_bases(x, ix, d, &bo, &bi, &O, &K, &I)) return PL_ERR_NOMEM;
    const void *ip = pl_tensor_data(ix);
    const char *src = pl_tensor_data(x);
    char *dst = pl_tensor_data(a->out[0]);
    size_t es = pl_dtype_size(x->dtype);
#pragma omp parallel for collapse(2) if (O * K * I > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < O; o++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < I; j++) {
                int64_t e = (o * K + k) * I + j;
                int64_t off = bo[o] + idx_get(ip, ix->dtype, e) * sd + bi[j];
                memcpy(dst + (size_t)e * es, src + (size_t)off * es, es);
            }
    free(bo);
    free(bi);
    return PL_OK;
}

/* dx zero, dx[o, idx[o,k,j], j] += g[o, k, j]; parallel over (o, j), k in order. */
static pl_status gather_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *x = a->in[1], *ix = a->in[2];
    if (!a->out[0]) return PL_OK;
    int d = (int)a->p.dim;
    int64_t *bo, *bi, O, K, I, sd = 1, nx = pl_tensor_numel(x);
    for (int i = d + 1; i < x->ndim; i++)
        sd *= x->shape[i];
    if (gather_bases(x, ix, d, &bo, &bi, &O, &K, &I)) return PL_ERR_NOMEM;
    const void *ip = pl_tensor_data(ix);
    const float *gp = pl_tensor_data(g);
    float *dx = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (nx > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < nx; i++)
        dx[i] = 0.0f;
#pragma omp parallel for collapse(2) if (O * K * I > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < O; o++)
        for (int64_t j = 0; j < I; j++)
            for (int64_t k = 0; k < K; k++) {
                int64_t e = (o * K + k) * I + j;
                dx[bo[o] + idx_get(ip, ix->dtype, e) * sd + bi[j]] += gp[e];
            }
    free(bo);
    free(bi);
    return PL_OK;
}

/* ---- segment softmax ------------------------------------------------------------------ */

/* Stable counting sort of rows by segment: rows of segment n are
 * order[start[n] .. start[n+1]). */
static pl_status segment_csr(const pl_tensor *seg, int64_t N, int64_t **start, int64_t **order) {
    int64_t E = seg->shape[0];
    const void *sp = pl_tensor_data(seg);
    *start = calloc((size_t)N + 2, sizeof(int64_t));
    *order = malloc((size_t)(E ? E : 1) * sizeof(int64_t));
    if (!*start || !*order) {
        free(*start);
        free(*order);
        return pl_error_set(PL_ERR_NOMEM, "segment_softmax: out of host memory");
    }
    int64_t *st = *start;
    for (int64_t e = 0; e < E; e++)
        st[idx_get(sp, seg->dtype, e) + 2]++;
    for (int64_t n = 0; n < N; n++)
        st[n + 2] += st[n + 1];
    for (int64_t e = 0; e < E; e++)
        (*order)[st[idx_get(sp, seg->dtype, e) + 1]++] = e;
    return PL_OK;
}

/* y[e, h] = exp(s[e,h] - max_seg) / sum_seg exp(s - max_seg) */
static pl_status segment_softmax_fwd(const pl_kernel_args *a) {
    const pl_tensor *s = a->in[0], *seg = a->in[1];
    int64_t N = a->p.num_segments, E = s->shape[0], H = E ? pl_tensor_numel(s) / E : 0;
    if (check_indices(a->op, seg, N)) return PL_ERR_INVALID;
    int64_t *start, *order;
    if (segment_csr(seg, N, &start, &order)) return PL_ERR_NOMEM;
    const float *x = pl_tensor_data(s);
    float *y = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (E * H > PAR_MIN) schedule(dynamic, 64)
    for (int64_t n = 0; n < N; n++) {
        int64_t b = start[n], e_ = start[n + 1];
        for (int64_t h = 0; h < H; h++) {
            float m = -INFINITY;
            for (int64_t r = b; r < e_; r++)
                m = pl_max_step(m, x[order[r] * H + h]);
            float sum = 0.0f;
            for (int64_t r = b; r < e_; r++) {
                float v = pl_softmax_exp(x[order[r] * H + h], m);
                y[order[r] * H + h] = v;
                sum += v;
            }
            float inv = 1.0f / sum;
            for (int64_t r = b; r < e_; r++)
                y[order[r] * H + h] *= inv;
        }
    }
    free(start);
    free(order);
    return PL_OK;
}

/* ds = y * (g - sum_seg(g * y)); in = {g, scores, seg, y} */
static pl_status segment_softmax_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0], *s = a->in[1], *seg = a->in[2], *yt = a->in[3];
    if (!a->out[0]) return PL_OK;
    int64_t N = a->p.num_segments, E = s->shape[0], H = E ? pl_tensor_numel(s) / E : 0;
    int64_t *start, *order;
    if (segment_csr(seg, N, &start, &order)) return PL_ERR_NOMEM;
    const float *gp = pl_tensor_data(g), *y = pl_tensor_data(yt);
    float *ds = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (E * H > PAR_MIN) schedule(dynamic, 64)
    for (int64_t n = 0; n < N; n++) {
        int64_t b = start[n], e_ = start[n + 1];
        for (int64_t h = 0; h < H; h++) {
            float dot = 0.0f;
            for (int64_t r = b; r < e_; r++)
                dot += gp[order[r] * H + h] * y[order[r] * H + h];
            for (int64_t r = b; r < e_; r++) {
                int64_t i = order[r] * H + h;
                ds[i] = pl_softmax_grad(y[i], gp[i], dot);
            }
        }
    }
    free(start);
    free(order);
    return PL_OK;
}

/* ---- dropout ------------------------------------------------------------------------ */

/* Element i is kept iff u01(philox(ctr = {i/4 lo, i/4 hi, counter lo, hi},
 * key = seed)[i % 4]) >= p; kept values are scaled by 1/(1-p) (the dropout
 * stream of kernel_math.h). */
static pl_status dropout_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_dtype dt = x->dtype;
    int64_t n = pl_tensor_numel(x), ng = (n + 3) / 4;
    float p = (float)a->p.alpha, scale = pl_dropout_scale(a->p.alpha);
    const uint32_t key[2] = {(uint32_t)a->p.seed, (uint32_t)(a->p.seed >> 32)};
    /* p.extra: a captured graph's offset (graph.h), i64 micro-steps since the
     * capture, times p.start, the call's counter step per micro-step */
    uint64_t ctr = a->p.counter;
    if (a->p.extra) ctr += (uint64_t)a->p.start * (uint64_t)*(const int64_t *)pl_tensor_data(a->p.extra);
    uint32_t c2 = (uint32_t)ctr, c3 = (uint32_t)(ctr >> 32);
    const void *xp = pl_tensor_data(x);
    void *yp = pl_tensor_data(a->out[0]);
    uint8_t *mask = pl_tensor_data(a->out[1]);
    /* groups of 4 elements share one Philox call (counter = group index);
     * PL_PHILOX_LANES groups are generated together, vectorized */
    int64_t nblk = (ng + PL_PHILOX_LANES - 1) / PL_PHILOX_LANES;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        uint32_t r[4][PL_PHILOX_LANES];
        pl_philox_dropout_block(blk, c2, c3, key, r);
        int64_t base = blk * PL_PHILOX_LANES * 4;
        if (dt == PL_F32 && base + PL_PHILOX_LANES * 4 <= n) {
            const float *xf = (const float *)xp + base;
            float *yf = (float *)yp + base;
            uint8_t *mk = mask + base;
            /* element l*4+j takes word j of lane l */
            uint32_t w[PL_PHILOX_LANES * 4];
            for (int l = 0; l < PL_PHILOX_LANES; l++)
                for (int j = 0; j < 4; j++) w[l * 4 + j] = r[j][l];
#pragma omp simd
            for (int e = 0; e < PL_PHILOX_LANES * 4; e++) {
                bool keep = pl_dropout_keep(w[e], p);
                mk[e] = (uint8_t)keep;
                yf[e] = pl_dropout_apply(xf[e], keep, scale);
            }
            continue;
        }
        for (int l = 0; l < PL_PHILOX_LANES; l++)
            for (int j = 0; j < 4; j++) {
                int64_t i = base + l * 4 + j;
                if (i >= n) break;
                bool keep = pl_dropout_keep(r[j][l], p);
                mask[i] = (uint8_t)keep;
                st(yp, dt, i, pl_dropout_apply(ld(xp, dt, i), keep, scale));
            }
    }
    return PL_OK;
}

/* in = {g, x, mask} */
static pl_status dropout_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    int64_t n = pl_tensor_numel(a->in[0]);
    float scale = pl_dropout_scale(a->p.alpha);
    const float *g = pl_tensor_data(a->in[0]);
    const uint8_t *mask = pl_tensor_data(a->in[2]);
    float *dx = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        dx[i] = pl_dropout_apply(g[i], mask[i], scale);
    return PL_OK;
}

/* ---- concat / slice ------------------------------------------------------------------- */

/* out [O, sum K_j, I] from in_j [O, K_j, I] */
static pl_status concat_fwd(const pl_kernel_args *a) {
    int d = (int)a->p.dim;
    const pl_tensor *out = a->out[0];
    size_t es = pl_dtype_size(out->dtype);
    int64_t O, Kt, I;
    split3(out, d, &O, &Kt, &I);
    char *dst = pl_tensor_data(out);
    int64_t koff = 0;
    for (int j = 0; j < a->n_in; j++) {
        int64_t Kj = a->in[j]->shape[d];
        size_t row = (size_t)(Kj * I) * es;
        const char *src = pl_tensor_data(a->in[j]);
#pragma omp parallel for if (O * Kj * I > PAR_MIN) schedule(static)
        for (int64_t o = 0; o < O; o++)
            memcpy(dst + (size_t)(o * Kt + koff) * I * es, src + (size_t)o * row, row);
        koff += Kj;
    }
    return PL_OK;
}

/* in = {g, x_0 .. x_{n-1}}; n = number of inputs recorded */
static pl_status concat_bwd(const pl_kernel_args *a) {
    int d = (int)a->p.dim, n = (int)a->p.start; /* number of inputs, set by the op */
    const pl_tensor *g = a->in[0];
    int64_t O, Kt, I;
    split3(g, d, &O, &Kt, &I);
    const float *gp = pl_tensor_data(g);
    int64_t koff = 0;
    for (int j = 0; j < n; j++) {
        int64_t Kj = a->in[1 + j]->shape[d];
        if (a->out[j]) {
            float *dx = pl_tensor_data(a->out[j]);
            size_t row = (size_t)(Kj * I) * sizeof(float);
#pragma omp parallel for if (O * Kj * I > PAR_MIN) schedule(static)
            for (int64_t o = 0; o < O; o++)
                memcpy(dx + o * Kj * I, gp + (o * Kt + koff) * I, row);
        }
        koff += Kj;
    }
    return PL_OK;
}

static pl_status slice_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    size_t es = pl_dtype_size(x->dtype);
    int64_t O, K, I, s = a->p.start, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    const char *src = pl_tensor_data(x);
    char *dst = pl_tensor_data(a->out[0]);
    size_t row = (size_t)(L * I) * es;
#pragma omp parallel for if (O * L * I > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < O; o++)
        memcpy(dst + (size_t)o * row, src + (size_t)((o * K + s) * I) * es, row);
    return PL_OK;
}

static pl_status slice_bwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[1];
    if (!a->out[0]) return PL_OK;
    int64_t O, K, I, s = a->p.start, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    const float *g = pl_tensor_data(a->in[0]);
    float *dx = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (O * K * I > PAR_MIN) schedule(static)
    for (int64_t o = 0; o < O; o++) {
        float *row = dx + o * K * I;
        memset(row, 0, (size_t)(s * I) * sizeof(float));
        memcpy(row + s * I, g + o * L * I, (size_t)(L * I) * sizeof(float));
        memset(row + (s + L) * I, 0, (size_t)((K - s - L) * I) * sizeof(float));
    }
    return PL_OK;
}

/* ---- permute / reshape / copy ------------------------------------------------------------ */

/* dst (contiguous, shape dshape = src shape permuted) <- src (contiguous
 * with shape sshape): dst[i_0..i_{n-1}] = src at coordinate i_d in dim perm[d]. */
static void permute_copy(void *dst, const void *src, int nd, const int64_t *sshape,
                         const int64_t *perm, size_t es) {
    int64_t ss[PL_MAX_DIMS], st_[PL_MAX_DIMS], dshape[PL_MAX_DIMS], s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        ss[i] = s;
        s *= sshape[i];
    }
    int64_t n = s;
    for (int i = 0; i < nd; i++) {
        dshape[i] = sshape[perm[i]];
        st_[i] = ss[perm[i]];
    }
    if (nd == 0 || n == 0) {
        if (n) memcpy(dst, src, es);
        return;
    }
    int64_t inner = dshape[nd - 1], istride = st_[nd - 1], rows = n / inner;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, off = 0;
        for (int i = nd - 2; i >= 0; i--) {
            off += (rem % dshape[i]) * st_[i];
            rem /= dshape[i];
        }
        char *d = (char *)dst + (size_t)(r * inner) * es;
        const char *sp = (const char *)src + (size_t)off * es;
        if (istride == 1) {
            memcpy(d, sp, (size_t)inner * es);
        } else if (es == 4) {
            for (int64_t j = 0; j < inner; j++)
                ((uint32_t *)d)[j] = ((const uint32_t *)sp)[j * istride];
        } else if (es == 2) {
            for (int64_t j = 0; j < inner; j++)
                ((uint16_t *)d)[j] = ((const uint16_t *)sp)[j * istride];
        } else if (es == 8) {
            for (int64_t j = 0; j < inner; j++)
                ((uint64_t *)d)[j] = ((const uint64_t *)sp)[j * istride];
        } else {
            for (int64_t j = 0; j < inner; j++)
                memcpy(d + j * es, sp + (size_t)(j * istride) * es, es);
        }
    }
}

static pl_status permute_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(x), x->ndim, x->shape, a->p.perm,
                 pl_dtype_size(x->dtype));
    return PL_OK;
}

/* dx = permute(g, inverse perm); g has the output's shape */
static pl_status permute_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0];
    if (!a->out[0]) return PL_OK;
    int64_t inv[PL_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++)
        inv[a->p.perm[i]] = i;
    permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(g), g->ndim, g->shape, inv,
                 sizeof(float));
    return PL_OK;
}

/* Same bytes, new shape (reshape forward if ever run as a copy; copy /
 * reshape backward: the gradient is the incoming one, re-shaped). */
static pl_status bytes_fwd(const pl_kernel_args *a) {
    memcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]), pl_tensor_nbytes(a->in[0]));
    return PL_OK;
}

static pl_status grad_identity_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    memcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]),
           (size_t)pl_tensor_numel(a->in[0]) * sizeof(float));
    return PL_OK;
}

/* ---- rope ------------------------------------------------------------------------------ */

/* cos/sin [T, Dh/2] for positions off..off+T-1 (pl_rope_cos_sin, HF Llama
 * arithmetic, shared with every backend: backend_util.h). */
static float *rope_table(int64_t T, int64_t half, int64_t off, double theta) {
    float *tab = malloc((size_t)(2 * T * half + 1) * sizeof(float));
    if (!tab) {
        pl_error_set(PL_ERR_NOMEM, "rope: out of host memory for the cos/sin table");
        return NULL;
    }
    pl_rope_cos_sin(tab, T, half, off, theta);
    return tab;
}

/* x [B, T, H, Dh]: y[d] = x[d] cos - x[d+h] sin, y[d+h] = x[d+h] cos + x[d] sin
 * (d < h = Dh/2, pl_rope_rotate). Backward applies the transposed rotation
 * (sign of sin flipped). */
static pl_status rope_apply(const void *xp, pl_dtype xdt, void *yp, pl_dtype ydt,
                            const int64_t *shape, int64_t off, double theta, float sign) {
    int64_t B = shape[0], T = shape[1], H = shape[2], Dh = shape[3], half = Dh / 2;
    float *tab = rope_table(T, half, off, theta);
    if (!tab) return PL_ERR_NOMEM;
    int64_t rows = B * T * H;
#pragma omp parallel for if (rows * Dh > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = (r / H) % T, base = r * Dh;
        const float *cs = tab + t * half * 2;
        for (int64_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = sign * cs[2 * i + 1];
            float x1 = ld(xp, xdt, base + i), x2 = ld(xp, xdt, base + i + half), y1, y2;
            pl_rope_rotate(x1, x2, c, s, &y1, &y2);
            st(yp, ydt, base + i, y1);
            st(yp, ydt, base + i + half, y2);
        }
    }
    free(tab);
    return PL_OK;
}

static pl_status rope_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    return rope_apply(pl_tensor_data(x), x->dtype, pl_tensor_data(a->out[0]), a->out[0]->dtype,
                      x->shape, a->p.start, a->p.alpha, 1.0f);
}

static pl_status rope_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    const pl_tensor *g = a->in[0];
    return rope_apply(pl_tensor_data(g), PL_F32, pl_tensor_data(a->out[0]), PL_F32, g->shape,
                      a->p.start, a->p.alpha, -1.0f);
}

/* ---- causal softmax ------------------------------------------------------------------------ */

/* scores [..., T, S]: row i (query) sees columns j <= i + S - T. */
static pl_status causal_softmax_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *y = a->out[0];
    int nd = x->ndim;
    int64_t T = x->shape[nd - 2], S = x->shape[nd - 1], rows = pl_tensor_numel(x) / (S ? S : 1);
    float scale = (float)a->p.alpha;
    const void *xp = pl_tensor_data(x);
    void *yp = pl_tensor_data(y);
#pragma omp parallel for if (rows * S > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * S, vis = (r % T) + S - T + 1;
        float m = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < vis; j++)
            m = pl_max_step(m, scale * ld(xp, x->dtype, base + j));
        for (int64_t j = 0; j < vis; j++)
            sum += pl_softmax_exp(scale * ld(xp, x->dtype, base + j), m);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < vis; j++)
            st(yp, y->dtype, base + j, pl_softmax_exp(scale * ld(xp, x->dtype, base + j), m) * inv);
        for (int64_t j = vis; j < S; j++)
            st(yp, y->dtype, base + j, 0.0f);
    }
    return PL_OK;
}

/* in = {g, scores, y}: ds = scale * y * (g - sum(g*y)) */
static pl_status causal_softmax_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    const pl_tensor *g = a->in[0], *y = a->in[2];
    int nd = g->ndim;
    int64_t T = g->shape[nd - 2], S = g->shape[nd - 1], rows = pl_tensor_numel(g) / (S ? S : 1);
    float scale = (float)a->p.alpha;
    const float *gp = pl_tensor_data(g);
    const void *yp = pl_tensor_data(y);
    float *ds = pl_tensor_data(a->out[0]);
#pragma omp parallel for if (rows * S > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = r * S, vis = (r % T) + S - T + 1;
        float dot = 0.0f;
        for (int64_t j = 0; j < vis; j++)
            dot += gp[base + j] * ld(yp, y->dtype, base + j);
        for (int64_t j = 0; j < vis; j++)
            ds[base + j] = pl_softmax_grad(scale * ld(yp, y->dtype, base + j), gp[base + j], dot);
        for (int64_t j = vis; j < S; j++)
            ds[base + j] = 0.0f;
    }
    return PL_OK;
}

/* ---- registration ------------------------------------------------------------------------- */

/* ---- copy: out[0] (contiguous) <- in[0] (any strides, any non-nf4 dtype) ----
 * pl_tensor_copy_ (the core's tensor_init.c) runs it for a contiguous CPU
 * destination, as the strict device does on the memory it opens for the call
 * (so it reads no device field); a strided CPU destination is walked there
 * with the same element helpers (backend_util.h). Each element goes
 * through f64 (exact for every dtype but i64 beyond 2^53) except the
 * same-dtype and f32 <-> bf16 paths, which are exact. */
static pl_status copy_fwd(const pl_kernel_args *a) {
    const pl_tensor *src = a->in[0];
    pl_tensor *dst = a->out[0];
    int64_t n = pl_tensor_numel(src);
    const char *sb = (const char *)src->storage->data;
    char *db = pl_tensor_data(dst);
    bool contig = pl_tensor_is_contiguous(src);
    if (src->dtype == dst->dtype) {
        if (contig) { /* nf4 too: its packed codes */
            memcpy(db, pl_tensor_data(src), pl_dtype_nbytes(src->dtype, n));
            return PL_OK;
        }
        size_t es = pl_dtype_size(src->dtype);
        int nd = src->ndim;
        if (nd > 0 && src->stride[nd - 1] == 1) { /* rows contiguous */
            int64_t inner = src->shape[nd - 1], rows = n / (inner ? inner : 1);
#pragma omp parallel for if (n > 65536) schedule(static)
            for (int64_t r = 0; r < rows; r++)
                memcpy(db + (size_t)(r * inner) * es,
                       sb + (size_t)pl_strided_offset(src, r * inner) * es, (size_t)inner * es);
            return PL_OK;
        }
    }
    if (contig && src->dtype == PL_F32 && dst->dtype == PL_BF16) {
        const float *s = pl_tensor_data(src);
        uint16_t *d = (uint16_t *)db;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_bf16_round(s[i]);
        return PL_OK;
    }
    if (contig && src->dtype == PL_BF16 && dst->dtype == PL_F32) {
        const uint16_t *s = pl_tensor_data(src);
        float *d = (float *)db;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_bf16_widen(s[i]);
        return PL_OK;
    }
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        pl_elem_store(db, dst->dtype, i, pl_elem_load(sb, src->dtype, pl_strided_offset(src, i)));
    return PL_OK;
}

/* ---- topk -------------------------------------------------------------------------- */

PL_TOPK_SELECT_DEFINE(topk_select, int64_t) /* kernel_math.h */

/* in[0] x f32 [R, V]; out[0] f32 [R, k], out[1] i64 [R, k]; p.start = k.
 * Per row: PL_TOPK_SELECT_DEFINE's heap selection (kernel_math.h). */
static pl_status topk_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    int64_t k = a->p.start, V = x->ndim ? x->shape[x->ndim - 1] : 1;
    int64_t R = V ? pl_tensor_numel(x) / V : 0;
    if (k < 1 || k > V)
        return pl_error_set(PL_ERR_INVALID, "topk: k = %lld for '%s' of last dim %lld",
                            (long long)k, x->name, (long long)V);
    const float *xs = pl_tensor_data(x);
    float *ov = pl_tensor_data(a->out[0]);
    int64_t *oi = pl_tensor_data(a->out[1]);
#pragma omp parallel for if (R * V > 32768) schedule(static)
    for (int64_t r = 0; r < R; r++) topk_select(xs + r * V, V, k, ov + r * k, oi + r * k);
    return PL_OK;
}

void pl_cpu_register_index(pl_kernel_table *b) {
    b->forward[PL_OP_EMBEDDING] = embedding_fwd;
    b->backward[PL_OP_EMBEDDING] = embedding_bwd;
    b->forward[PL_OP_INDEX_SELECT] = index_select_fwd;
    b->backward[PL_OP_INDEX_SELECT] = index_select_bwd;
    b->forward[PL_OP_GATHER] = gather_fwd;
    b->backward[PL_OP_GATHER] = gather_bwd;
    b->forward[PL_OP_SCATTER_ADD] = scatter_add_fwd;
    b->backward[PL_OP_SCATTER_ADD] = scatter_add_bwd;
    b->forward[PL_OP_SEGMENT_SOFTMAX] = segment_softmax_fwd;
    b->backward[PL_OP_SEGMENT_SOFTMAX] = segment_softmax_bwd;
    b->forward[PL_OP_DROPOUT] = dropout_fwd;
    b->backward[PL_OP_DROPOUT] = dropout_bwd;
    b->forward[PL_OP_CONCAT] = concat_fwd;
    b->backward[PL_OP_CONCAT] = concat_bwd;
    b->forward[PL_OP_SLICE] = slice_fwd;
    b->backward[PL_OP_SLICE] = slice_bwd;
    b->forward[PL_OP_PERMUTE] = permute_fwd;
    b->backward[PL_OP_PERMUTE] = permute_bwd;
    b->forward[PL_OP_RESHAPE] = bytes_fwd;
    b->backward[PL_OP_RESHAPE] = grad_identity_bwd;
    b->forward[PL_OP_ROPE] = rope_fwd;
    b->backward[PL_OP_ROPE] = rope_bwd;
    b->forward[PL_OP_CAUSAL_SOFTMAX] = causal_softmax_fwd;
    b->backward[PL_OP_CAUSAL_SOFTMAX] = causal_softmax_bwd;
    /* pl_contiguous and pl_tensor_to record / dispatch PL_OP_COPY */
    b->forward[PL_OP_COPY] = copy_fwd;
    b->forward[PL_OP_TOPK] = topk_fwd;
    b->backward[PL_OP_COPY] = grad_identity_bwd;
    pl_cpu_register_lstm(b);
}
