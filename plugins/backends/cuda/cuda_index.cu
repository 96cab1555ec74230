/* cuda_index.cu - CUDA forward / backward kernels of embedding, index_select,
 * scatter_add, gather, segment_softmax, dropout and topk, and the random fill of
 * pl_backend.fill_random: the GPU twin of the CPU backend's kernels_index.c, op for op.
 * Conventions (launch geometry only; the element math is kernel_math.h's PL_HD
 * functions, shared with the CPU kernels): the top of cuda_common.cuh. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

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

/* ---- topk: one block per row, k rounds of a block-wide argmax ---------------------------- */

#define TOPK_THREADS 256

/* Does candidate (vb, ib) win over (va, ia)? ib < 0: no candidate. */
__device__ __forceinline__ bool topk_wins(float vb, int64_t ib, float va, int64_t ia) {
    return ib >= 0 && (ia < 0 || pl_topk_before(vb, ib, va, ia));
}

/* Row r of x [R, V]: round j picks the best element that ranks after round
 * j-1's pick in pl_topk_before's total order (strictly, so nothing is picked
 * twice and no element is marked), by a scan of the row (V / 256 per thread)
 * and a shared-memory tree reduction. O(k V) per row: written for k up to a
 * few hundred of a few thousand items (the teacher export: k = 100 of
 * ~3,700); the same values and indices as the CPU's heap, since the order is
 * total. Never run on a GPU when written (no GPU in the session): its check
 * is test_backend_conformance's topk rows on one; test_kernels_emu.cpp runs it on the
 * host (CMakeLists.txt copies this section's text up to k_topk_fwd's comment). */
__global__ void k_topk_rows(const float *x, float *ov, int64_t *oi, int64_t R, int64_t V,
                            int64_t k) {
    __shared__ float sv[TOPK_THREADS];
    __shared__ int64_t si[TOPK_THREADS];
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const float *s = x + r * V;
        float pv = 0.0f;
        int64_t pi = -1; /* the previous pick; -1: none yet */
        for (int64_t j = 0; j < k; j++) {
            float bv = 0.0f;
            int64_t bi = -1;
            for (int64_t e = threadIdx.x; e < V; e += blockDim.x) {
                float v = s[e];
                if ((pi < 0 || pl_topk_before(pv, pi, v, e)) && topk_wins(v, e, bv, bi)) {
                    bv = v;
                    bi = e;
                }
            }
            sv[threadIdx.x] = bv;
            si[threadIdx.x] = bi;
            __syncthreads();
            for (unsigned h = blockDim.x / 2; h > 0; h >>= 1) {
                unsigned t = threadIdx.x;
                if (t < h && topk_wins(sv[t + h], si[t + h], sv[t], si[t])) {
                    sv[t] = sv[t + h];
                    si[t] = si[t + h];
                }
                __syncthreads();
            }
            pv = sv[0];
            pi = si[0];
            if (threadIdx.x == 0) {
                ov[r * k + j] = pv;
                oi[r * k + j] = pi;
            }
            __syncthreads(); /* sv[0] read by all before the next round writes it */
        }
    }
}

/* in[0] x f32 [.., V]; out[0] f32 [.., k], out[1] i64 [.., k]; p.start = k */
static pl_status k_topk_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    int64_t k = a->p.start, V = x->ndim ? x->shape[x->ndim - 1] : 1;
    int64_t R = V ? pl_tensor_numel(x) / V : 0;
    if (k < 1 || k > V)
        return pl_error_set(PL_ERR_INVALID, "cuda topk: k = %lld for '%s' of last dim %lld",
                            (long long)k, x->name, (long long)V);
    if (pl_cu_set_device(x)) return pl_error_status();
    if (!R) return PL_OK;
    unsigned nb = (unsigned)(R < 65535 * 16 ? R : 65535 * 16);
    k_topk_rows<<<nb, TOPK_THREADS>>>(cf(x), fp(a->out[0]), (int64_t *)pl_tensor_data(a->out[1]), R,
                                      V, k);
    CUDA_LAUNCHED("topk");
    return PL_OK;
}

/* ---- registration ---------------------------------------------------------------------------------------- */

void pl_cuda_register_index(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_EMBEDDING, k_embedding_fwd, k_embedding_bwd);
    pl_kernel_table_set(t, PL_OP_INDEX_SELECT, k_index_select_fwd, k_index_select_bwd);
    pl_kernel_table_set(t, PL_OP_GATHER, k_gather_fwd, k_gather_bwd);
    pl_kernel_table_set(t, PL_OP_SCATTER_ADD, k_scatter_add_fwd, k_scatter_add_bwd);
    pl_kernel_table_set(t, PL_OP_SEGMENT_SOFTMAX, k_segment_softmax_fwd, k_segment_softmax_bwd);
    pl_kernel_table_set(t, PL_OP_DROPOUT, k_dropout_fwd, k_dropout_bwd);
    pl_kernel_table_set(t, PL_OP_TOPK, k_topk_fwd, NULL);
}
