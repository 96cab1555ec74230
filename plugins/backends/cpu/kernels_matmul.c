/* kernels_matmul.c - the CPU's matmul kernels: f32 through OpenBLAS's
 * sgemm, a half-precision operand (autocast) through gemm_mixed.c.
 * Conventions: kernels_dense.c. Registered by pl_cpu_register_dense (through
 * pl_cpu_register_dense_matmul). */
#include <cblas.h>
#include <math.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels_dense_common.h"

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

/* ---- matmul with a half-precision operand (autocast): gemm_mixed.c widens
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
     * AVX-512 BF16 dot products, f32 accumulation (bf16_gemm.c) */
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

/* ---- lora_add: y + scale ((x A^T) * gexp) B^T (ops.h pl_lora_add) ----------------
 * Forward, two sgemms: t = x A^T [N, R] (rounded to the compute dtype c =
 * x's, and stored: the op's saved output), u = t g rounded to c, then
 * out = scale u B^T (sgemm, alpha = scale) with y added in the same kernel
 * call (lora_add_y; not sgemm's beta = 1, see there). Half x and A are read in place by the
 * GEMMs that take them (t = x A^T, dA, dx: matmul's bf16 / f16 kernels,
 * so t is the chain's bit for bit); B [O, R] and gexp are widened to f32
 * scratch (small), for the two sgemms that scale by alpha.
 * Backward (in = {G, y, x, A, B[, g], t}), four sgemms at most, each only
 * when a gradient needs it:
 *   du = scale G B            [N, R]   (for dx, dA, dg)
 *   dB = scale G^T u          [O, R]
 *   dg = sum over the rows a gate covers of du t
 *   dt = du g;  dA = dt^T x [R, D];  dx = dt A [N, D];  dy = G. */

typedef struct lora_geo {
    int64_t N, D, R, O, gs; /* rows, in, rank slots, out, rows per gate row */
    pl_dtype c;
    bool gate;
} lora_geo;

static void lora_geo_init(lora_geo *q, const pl_tensor *x, const pl_tensor *A, const pl_tensor *B,
                          const pl_tensor *g) {
    q->D = A->shape[1];
    q->R = A->shape[0];
    q->O = B->shape[0];
    q->N = 1; /* x's leading dims (numel(x) / D was 0 for D = 0: out and t left unwritten) */
    for (int i = 0; i + 1 < x->ndim; i++)
        q->N *= x->shape[i];
    q->c = x->dtype;
    q->gate = g != NULL;
    int64_t gr = g && q->R ? pl_tensor_numel(g) / q->R : 1;
    q->gs = gr ? q->N / gr : 1;
    if (q->gs < 1) q->gs = 1;
}

/* u[n, r] = rne_c(t[n, r] g[n / gs, r]) (T already rounded to c) */
static void lora_gate_rows(const lora_geo *q, const float *T, const float *G, float *U) {
    int64_t N = q->N, R = q->R;
#pragma omp parallel for if (N * R > PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *gr = G + (n / q->gs) * R;
        for (int64_t r = 0; r < R; r++)
            U[n * R + r] = pl_math_lora_gate(T[n * R + r], gr[r], q->c);
    }
}

/* C[i] += y[i] (y f32 / bf16 / f16): the epilogue as its own pass over C,
 * not sgemm's beta = 1. OpenBLAS's Haswell, SkylakeX, Cooperlake and Zen
 * kernels fold beta = 1 into one FMA, C = fma(alpha, acc, C), while its
 * Prescott and Sandybridge kernels round alpha acc first (measured with
 * OPENBLAS_CORETYPE, 2026-11-27): with beta = 1 the fp32 bits would depend
 * on the BLAS kernel, and lora_recompute's branch (this op without y, then
 * pl_add) would no longer give the composed one's bits. Rounding alpha acc
 * first is also what the unfused chain did (pl_scale, then pl_add). */
static void lora_add_y(const pl_tensor *y, float *C, int64_t n) {
    const void *p = pl_tensor_data(y);
#pragma omp parallel for if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = y->dtype == PL_F32    ? ((const float *)p)[i]
                  : y->dtype == PL_BF16 ? pl_bf16_widen(((const uint16_t *)p)[i])
                                        : pl_f16_widen(((const uint16_t *)p)[i]);
        C[i] = v + C[i];
    }
}

/* ---- lora_add's dropout (p.flags bit1, pl_lora_add_dropout) ----
 * drop(x) is never stored by the op: the forward writes it into a scratch
 * for t = drop(x) A^T, the backward writes it again for dA and masks dx in
 * place. The mask is dropout_fwd's (kernels_index.c): element i kept iff
 * pl_dropout_keep(philox(group i / 4, counter; seed)[i % 4], p), drawn
 * PL_PHILOX_LANES groups at a time; a kept value is pl_dropout_apply'd
 * (x * scale in f32) and rounded to the destination's dtype once, as
 * dropout_fwd stores it. */

static uint64_t lora_drop_counter(const pl_kernel_args *a) {
    uint64_t ctr = a->p.counter;
    /* a captured graph's offset (graph.h), as dropout_fwd */
    if (a->p.extra)
        ctr += (uint64_t)a->p.start * (uint64_t)*(const int64_t *)pl_tensor_data(a->p.extra);
    return ctr;
}

static inline float lora_ld(const void *p, pl_dtype dt, int64_t i) {
    return dt == PL_F32    ? ((const float *)p)[i]
           : dt == PL_BF16 ? pl_bf16_widen(((const uint16_t *)p)[i])
                           : pl_f16_widen(((const uint16_t *)p)[i]);
}

static inline void lora_st(void *p, pl_dtype dt, int64_t i, float v) {
    if (dt == PL_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == PL_BF16 ? pl_bf16_round(v) : pl_f16_round(v);
}

/* dst[i] = drop(src[i]) for i < n (src in sdt, dst in ddt; dst may be src
 * when the dtypes match: dx masked in place); mask (may be NULL) gets the
 * keep bits as dropout_fwd's u8 mask. A block of PL_PHILOX_LANES groups is
 * dropout_fwd's: its 64 keep bits first, then one loop per dtype pair (the
 * f32 one vectorized, as dropout_fwd's f32 path). */
static void lora_drop_apply(const pl_kernel_args *a, const void *src, pl_dtype sdt, void *dst,
                            pl_dtype ddt, int64_t n, uint8_t *mask) {
    int64_t ng = (n + 3) / 4, nblk = (ng + PL_PHILOX_LANES - 1) / PL_PHILOX_LANES;
    float p = (float)a->p.beta, scale = pl_dropout_scale(a->p.beta);
    const uint32_t key[2] = {(uint32_t)a->p.seed, (uint32_t)(a->p.seed >> 32)};
    uint64_t ctr = lora_drop_counter(a);
    uint32_t c2 = (uint32_t)ctr, c3 = (uint32_t)(ctr >> 32);
    enum { BLK = PL_PHILOX_LANES * 4 };
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        uint32_t r[4][PL_PHILOX_LANES];
        pl_philox_dropout_block(blk, c2, c3, key, r);
        int64_t base = blk * BLK;
        int m = n - base < BLK ? (int)(n - base) : BLK;
        /* element l*4+j of the block takes word j of lane l */
        uint8_t keep[BLK];
        for (int l = 0; l < PL_PHILOX_LANES; l++)
            for (int j = 0; j < 4; j++) keep[l * 4 + j] = (uint8_t)pl_dropout_keep(r[j][l], p);
        if (mask) memcpy(mask + base, keep, (size_t)m);
        if (sdt == PL_F32 && ddt == PL_F32) {
            const float *sf = (const float *)src + base;
            float *df = (float *)dst + base;
#pragma omp simd
            for (int e = 0; e < m; e++) df[e] = pl_dropout_apply(sf[e], keep[e], scale);
        } else {
            for (int e = 0; e < m; e++)
                lora_st(dst, ddt, base + e,
                        pl_dropout_apply(lora_ld(src, sdt, base + e), keep[e], scale));
        }
    }
}

/* drop(x) [n] in the compute dtype c = p.dtype (x's, or under autocast
 * x f32 and c half: the chain's f32 dropout then cast, rounded once) into
 * s: its data, or NULL (st set); with sm, the keep bits too (u8 [n]) into
 * *mask */
static void *lora_dropped_x(const pl_kernel_args *a, const pl_tensor *x, scratch *s, scratch *sm,
                            uint8_t **mask, pl_status *st) {
    int64_t n = pl_tensor_numel(x);
    size_t es = pl_dtype_size(a->p.dtype);
    float *buf = scratch_f32(s, (int64_t)(((size_t)n * es + sizeof(float) - 1) / sizeof(float)));
    uint8_t *mk = sm ? (uint8_t *)scratch_f32(sm, (n + 3) / 4) : NULL;
    if (!buf || (sm && !mk)) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    lora_drop_apply(a, pl_tensor_data(x), x->dtype, buf, a->p.dtype, n, mk);
    if (mask) *mask = mk;
    return buf;
}

static pl_status k_lora_add_fwd(const pl_kernel_args *a) {
    bool has_y = !(a->p.flags & 1);
    const pl_tensor *x = a->in[1], *Ai = a->in[2], *Bi = a->in[3],
                    *g = a->n_in > 4 ? a->in[4] : NULL;
    pl_tensor *out = a->out[0], *tt = a->out[1];
    lora_geo q;
    lora_geo_init(&q, x, Ai, Bi, g);
    q.c = a->p.dtype; /* x's, or with dropout under autocast A's (x f32) */
    pl_status st = PL_OK;
    scratch sx = {0}, sa = {0}, sb = {0}, sg = {0}, stt = {0}, su = {0}, so = {0}, sd = {0};
    /* half x, A: read in place by the first GEMM (matmul's kernels); with
     * dropout, drop(x) in x's dtype from a scratch instead */
    bool half = q.c != PL_F32;
    const void *xdata =
        (a->p.flags & 2) ? lora_dropped_x(a, x, &sd, NULL, NULL, &st) : pl_tensor_data(x);
    const float *X = st || half ? NULL : (const float *)xdata;
    const float *A = st || half ? NULL : as_f32(Ai, &sa, &st);
    const float *B = st ? NULL : as_f32(Bi, &sb, &st);
    const float *G = !st && g ? as_f32(g, &sg, &st) : NULL;
    float *T = NULL, *U = NULL, *C = NULL;
    if (!st) {
        T = tt->dtype == PL_F32 ? f32p(tt) : scratch_f32(&stt, q.N * q.R);
        C = out->dtype == PL_F32 ? f32p(out) : scratch_f32(&so, q.N * q.O);
        U = g ? scratch_f32(&su, q.N * q.R) : T;
        if (!T || !C || !U) st = PL_ERR_NOMEM;
    }
    if (!st) {
        int64_t N = q.N, D = q.D, R = q.R, O = q.O;
        if (N > 0 && R > 0) {
            if (D == 0)
                memset(T, 0, (size_t)(N * R) * sizeof(float));
            else if (!half)
                pl_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)R, (int)D, 1.0f, X,
                         (int)D, A, (int)D, 0.0f, T, (int)R);
            else if (!(q.c == PL_BF16 &&
                       pl_bf16_gemm_nt(xdata, pl_tensor_data(Ai), T, N, R, D))) {
                /* the path pl_matmul's bf16 / f16 x @ A^T takes: the chain's t, bit for bit */
                pl_gemm_operand ox = {xdata, q.c, D, false};
                pl_gemm_operand oa = {pl_tensor_data(Ai), q.c, D, true};
                st = pl_gemm_mixed(N, R, D, &ox, &oa, T, PL_F32, R, false, true);
            }
            if (half) {
#pragma omp parallel for if (N * R > PAR_MIN)
                for (int64_t i = 0; i < N * R; i++)
                    T[i] = pl_math_rne_to(T[i], q.c);
            }
            if (g) lora_gate_rows(&q, T, G, U);
        }
        if (!st && N > 0 && O > 0) {
            if (R > 0)
                pl_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)R,
                         (float)a->p.alpha, U, (int)R, B, (int)R, 0.0f, C, (int)O);
            else
                memset(C, 0, (size_t)(N * O) * sizeof(float));
            if (has_y) lora_add_y(a->in[0], C, N * O);
        }
        if (!st && tt->dtype != PL_F32) st = from_f32(T, tt, N * R);
        if (!st && out->dtype != PL_F32) st = from_f32(C, out, N * O);
    }
    scratch_free(&sd);
    scratch_free(&sx);
    scratch_free(&sa);
    scratch_free(&sb);
    scratch_free(&sg);
    scratch_free(&stt);
    scratch_free(&su);
    scratch_free(&so);
    return st;
}

static pl_status k_lora_add_bwd(const pl_kernel_args *a) {
    const float *Gr = cf32(a->in[0]);
    int n_inputs = a->n_in - 2; /* G first, t last */
    const pl_tensor *x = a->in[2], *Ai = a->in[3], *Bi = a->in[4];
    const pl_tensor *g = n_inputs > 4 ? a->in[5] : NULL, *tt = a->in[a->n_in - 1];
    float *dy = a->out[0] ? f32p(a->out[0]) : NULL, *dx = a->out[1] ? f32p(a->out[1]) : NULL;
    float *dA = a->out[2] ? f32p(a->out[2]) : NULL, *dB = a->out[3] ? f32p(a->out[3]) : NULL;
    float *dg = g && a->out[4] ? f32p(a->out[4]) : NULL;
    lora_geo q;
    lora_geo_init(&q, tt, Ai, Bi, g);
    q.c = a->p.dtype;
    q.N = q.R ? pl_tensor_numel(tt) / q.R : 0;
    if (g && q.R) {
        int64_t gr = pl_tensor_numel(g) / q.R;
        q.gs = gr ? q.N / gr : 1;
        if (q.gs < 1) q.gs = 1;
    }
    int64_t N = q.N, D = q.D, R = q.R, O = q.O;
    float sc = (float)a->p.alpha;
    /* all of G (N is 0 here when R is) */
    if (dy) memcpy(dy, Gr, pl_tensor_nbytes(a->out[0]));
    bool need_du = dx || dA || dg;
    pl_status st = PL_OK;
    scratch sx = {0}, sa = {0}, sb = {0}, sg = {0}, stt = {0}, su = {0}, sdu = {0}, sd = {0};
    scratch sm = {0};
    bool drop = a->p.flags & 2;
    uint8_t *mask = NULL; /* the keep bits, drawn once when both dA and dx need them */
    const float *B = (need_du) ? as_f32(Bi, &sb, &st) : NULL;
    const float *T = !st && (dB || dg) ? as_f32(tt, &stt, &st) : NULL;
    /* gexp: for u (dB) and dt (dA, dx); dgexp alone reads B and t only */
    const float *G = !st && g && (dB || dx || dA) ? as_f32(g, &sg, &st) : NULL;
    /* half x, A: read in place by the dA / dx GEMMs (matmul's backward) */
    bool half = q.c != PL_F32;
    /* dA reads drop(x): regenerated from (seed, counter) into a scratch */
    const void *xdata =
        !st && dA && drop ? lora_dropped_x(a, x, &sd, dx ? &sm : NULL, &mask, &st) : NULL;
    if (!xdata && dA && !st) xdata = pl_tensor_data(x);
    const float *X = !st && dA && !half ? (const float *)xdata : NULL;
    const float *A = !st && dx && !half ? as_f32(Ai, &sa, &st) : NULL;
    if (st) goto done;
    if (dB) { /* dB = scale G^T u */
        const float *U = T;
        if (g) {
            float *u = scratch_f32(&su, N * R);
            if (!u) {
                st = PL_ERR_NOMEM;
                goto done;
            }
            lora_gate_rows(&q, T, G, u);
            U = u;
        }
        if (N > 0)
            pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)O, (int)R, (int)N, sc, Gr,
                     (int)O, U, (int)R, 0.0f, dB, (int)R);
        else
            memset(dB, 0, (size_t)(O * R) * sizeof(float));
    }
    if (need_du) {
        float *du = scratch_f32(&sdu, N * R);
        if (!du) {
            st = PL_ERR_NOMEM;
            goto done;
        }
        if (O > 0)
            pl_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)R, (int)O, sc, Gr,
                     (int)O, B, (int)R, 0.0f, du, (int)R);
        else
            memset(du, 0, (size_t)(N * R) * sizeof(float));
        if (dg) { /* dg[gr, r] = sum of du t over the gs rows of gate row gr */
            int64_t ngr = pl_tensor_numel(g) / (R ? R : 1);
#pragma omp parallel for if (N * R > PAR_MIN)
            for (int64_t i = 0; i < ngr; i++)
                for (int64_t r = 0; r < R; r++) {
                    float s = 0.0f;
                    for (int64_t k = 0; k < q.gs && i * q.gs + k < N; k++)
                        s += du[(i * q.gs + k) * R + r] * T[(i * q.gs + k) * R + r];
                    dg[i * R + r] = s;
                }
        }
        if (g && (dA || dx)) { /* dt = du g, in place */
#pragma omp parallel for if (N * R > PAR_MIN)
            for (int64_t n = 0; n < N; n++)
                for (int64_t r = 0; r < R; r++)
                    du[n * R + r] *= G[(n / q.gs) * R + r];
        }
        pl_gemm_operand odt = {du, PL_F32, R, true}, odu = {du, PL_F32, R, false};
        if (dA) { /* [R, D] = dt^T x */
            if (N == 0 || D == 0)
                memset(dA, 0, (size_t)(R * D) * sizeof(float));
            else if (!half)
                pl_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)R, (int)D, (int)N, 1.0f, du,
                         (int)R, X, (int)D, 0.0f, dA, (int)D);
            else {
                pl_gemm_operand ox = {xdata, q.c, D, false};
                st = pl_gemm_mixed(R, D, N, &odt, &ox, dA, PL_F32, D, false, true);
            }
        }
        if (dx && !st) { /* [N, D] = dt A */
            if (R == 0 || D == 0) /* all of dx: N is 0 here when R is */
                memset(dx, 0, pl_tensor_nbytes(a->out[1]));
            else if (!half)
                pl_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)D, (int)R, 1.0f,
                         du, (int)R, A, (int)D, 0.0f, dx, (int)D);
            else {
                pl_gemm_operand oa = {pl_tensor_data(Ai), q.c, D, false};
                st = pl_gemm_mixed(N, D, R, &odu, &oa, dx, PL_F32, D, false, true);
            }
            /* the dropout's backward on d drop(x): dropout_bwd's mask * scale
             * (the bits drawn with drop(x) above, or drawn here) */
            if (!st && drop && mask) {
                float scale = pl_dropout_scale(a->p.beta);
#pragma omp parallel for simd if (N * D > PAR_MIN) schedule(static)
                for (int64_t i = 0; i < N * D; i++)
                    dx[i] = pl_dropout_apply(dx[i], mask[i], scale);
            } else if (!st && drop) {
                lora_drop_apply(a, dx, PL_F32, dx, PL_F32, N * D, NULL);
            }
        }
    }
done:
    scratch_free(&sd);
    scratch_free(&sm);
    scratch_free(&sx);
    scratch_free(&sa);
    scratch_free(&sb);
    scratch_free(&sg);
    scratch_free(&stt);
    scratch_free(&su);
    scratch_free(&sdu);
    return st;
}

void pl_cpu_register_dense_matmul(pl_kernel_table *b) {
    b->forward[PL_OP_MATMUL] = k_matmul_fwd;
    b->backward[PL_OP_MATMUL] = k_matmul_bwd;
    b->forward[PL_OP_LORA_ADD] = k_lora_add_fwd;
    b->backward[PL_OP_LORA_ADD] = k_lora_add_bwd;
}
