/* gemm_mixed.c - C (+)= op(A) @ op(B) where A and B are each f32, bf16 or
 * f16 (any mix, either transposed), f32 accumulation, C f32 or bf16.
 *
 * Why: under autocast every matmul has a bf16 operand. Without it the CPU
 * backend widened each bf16 operand into an f32 scratch copy, ran sgemm into
 * an f32 scratch C and rounded C into the bf16 output: three extra passes
 * over memory per GEMM, forward and backward. Here the widening happens
 * while packing (which a GEMM does anyway) and the rounding in the store,
 * so a bf16 matmul moves half the bytes of an f32 one and nothing more.
 * Widening bf16 / f16 is exact, so C is the f32-accumulated product of the
 * operands as given; only the summation order differs from sgemm's.
 *
 * Structure (Goto / BLIS): threads take chunks of C's rows (or, when N > M,
 * of its columns), a few per thread, dynamically; each chunk is a serial
 * GEMM with its own packs, so threads meet only at the end. In a chunk, K
 * runs in blocks of KC; per block op(B) is packed into panels of NR = 16
 * columns (Bp[panel][k][16]); A is taken in MC-row blocks, packed into
 * MR = 6-row micro-panels (Ap[k][6]) or, when it is an untransposed f32
 * matrix, read in place six rows at a time; the 6 x 16 micro-kernel (12
 * accumulators of 8 floats, FMA) runs over every (micro-panel, B panel).
 * A B panel (KC x 16 floats = 16 KiB) stays in L1 while the A block (MC x KC
 * floats, 96 KiB) stays in L2. Edges are zero padded in the packs and masked
 * in the store; a bf16 C is rounded (round to nearest even, NaN stays NaN)
 * from the registers when K fits one block, else the f32 sums of all blocks
 * go through an f32 buffer and are rounded once at the end.
 *
 * The AVX2/FMA code is compiled for those instructions (target attributes)
 * whatever -march the build uses, and runs where cpu_isa.c finds them
 * at run time (PL_CPU_ISA=scalar, or pl_gemm_mixed_generic, forces the
 * portable micro-kernel). */
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2 1 /* compiled in; used when the CPU has it (cdesc.avx2) */
#define AVX2_FN __attribute__((target("avx2,fma")))
#else
#define HAVE_AVX2 0
#endif

#define MR 6
#define NR 16
#define KC 256
#define MC 96 /* multiple of MR */

bool pl_gemm_mixed_generic; /* tests: force the portable micro-kernel */

/* op(X)[r, c] of an operand, widened to f32 */
static inline float elem(const pl_gemm_operand *o, int64_t r, int64_t c) {
    int64_t i = o->trans ? c * o->ld + r : r * o->ld + c;
    switch (o->dtype) {
    case PL_BF16:
        return pl_bf16_widen(((const uint16_t *)o->data)[i]);
    case PL_F16:
        return pl_f16_widen(((const uint16_t *)o->data)[i]);
    default:
        return ((const float *)o->data)[i];
    }
}

/* Row r0..r0+n of op(X) restricted to columns c0..c0+kc, written with
 * stride `step` (dst[c * step] = op(X)[r, c0 + c]); rows past `rows` are 0.
 * A contiguous run (the untransposed bf16 / f32 case) widens 8 at a time. */
static void pack_rows(const pl_gemm_operand *o, int64_t r0, int64_t n, int64_t rows, int64_t c0,
                      int64_t kc, float *dst, int64_t step) {
    for (int64_t r = 0; r < n; r++) {
        float *d = dst + r;
        if (r0 + r >= rows) {
            for (int64_t c = 0; c < kc; c++)
                d[c * step] = 0.0f;
            continue;
        }
        if (!o->trans && o->dtype == PL_BF16) {
            const uint16_t *s = (const uint16_t *)o->data + (r0 + r) * o->ld + c0;
            for (int64_t c = 0; c < kc; c++)
                d[c * step] = pl_bf16_widen(s[c]);
        } else if (!o->trans && o->dtype == PL_F32) {
            const float *s = (const float *)o->data + (r0 + r) * o->ld + c0;
            for (int64_t c = 0; c < kc; c++)
                d[c * step] = s[c];
        } else {
            for (int64_t c = 0; c < kc; c++)
                d[c * step] = elem(o, r0 + r, c0 + c);
        }
    }
}

/* Columns j0..j0+n of op(B) over k0..k0+kc as Bp[k][16]; columns past N are 0.
 * op(B)[k, j] is row j of the [N, K] operand B^T when B is transposed (the
 * nn.Linear weight), else column j of B [K, N]: read along the contiguous
 * direction in both cases. */
static void pack_b_panel(const pl_gemm_operand *b, int64_t k0, int64_t kc, int64_t j0, int64_t N,
                         float *dst) {
    if (b->trans) { /* B stored [N, K]: row j of storage is column j of op(B) */
        pl_gemm_operand bt = *b;
        bt.trans = false;
        pack_rows(&bt, j0, NR, N, k0, kc, dst, NR);
        return;
    }
    int64_t n = N - j0 < NR ? N - j0 : NR;
    for (int64_t k = 0; k < kc; k++) {
        float *d = dst + k * NR;
        int64_t base = (k0 + k) * b->ld + j0;
        if (b->dtype == PL_BF16) {
            const uint16_t *s = (const uint16_t *)b->data + base;
            for (int64_t j = 0; j < n; j++)
                d[j] = pl_bf16_widen(s[j]);
        } else if (b->dtype == PL_F32) {
            memcpy(d, (const float *)b->data + base, (size_t)n * sizeof(float));
        } else {
            for (int64_t j = 0; j < n; j++)
                d[j] = pl_f16_widen(((const uint16_t *)b->data)[base + j]);
        }
        for (int64_t j = n; j < NR; j++)
            d[j] = 0.0f;
    }
}

/* Six whole untransposed f32 / bf16 rows r0.. of op(A) over c0..c0+kc as
 * d[k][MR]: 4 columns at a time through a 4 x 4 transpose (rows 0-3) and
 * an interleave (rows 4-5), SSE2 (every x86-64). false: not this case. */
static bool pack_a_micro_fast(const pl_gemm_operand *a, int64_t r0, int64_t c0, int64_t kc,
                              float *d) {
#if HAVE_AVX2
    if (a->trans || (a->dtype != PL_F32 && a->dtype != PL_BF16)) return false;
    bool h = a->dtype == PL_BF16;
    const float *f = (const float *)a->data + r0 * a->ld + c0;
    const uint16_t *b = (const uint16_t *)a->data + r0 * a->ld + c0;
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
        __m128 x[MR];
        for (int r = 0; r < MR; r++)
            x[r] =
                h ? _mm_castsi128_ps(_mm_unpacklo_epi16(
                        _mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(b + r * a->ld + k))))
                  : _mm_loadu_ps(f + r * a->ld + k);
        _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
        __m128 lo = _mm_unpacklo_ps(x[4], x[5]), hi = _mm_unpackhi_ps(x[4], x[5]);
        float *o = d + k * MR;
        _mm_storeu_ps(o, x[0]);
        _mm_storel_pi((__m64 *)(o + 4), lo);
        _mm_storeu_ps(o + 6, x[1]);
        _mm_storeh_pi((__m64 *)(o + 10), lo);
        _mm_storeu_ps(o + 12, x[2]);
        _mm_storel_pi((__m64 *)(o + 16), hi);
        _mm_storeu_ps(o + 18, x[3]);
        _mm_storeh_pi((__m64 *)(o + 22), hi);
    }
    for (; k < kc; k++)
        for (int r = 0; r < MR; r++)
            d[k * MR + r] = h ? pl_bf16_widen(b[r * a->ld + k]) : f[r * a->ld + k];
    return true;
#else
    (void)a, (void)r0, (void)c0, (void)kc, (void)d;
    return false;
#endif
}

/* A rows i0..i0+mc over k0..k0+kc as micro-panels Ap[p][k][MR]. */
static void pack_a_block(const pl_gemm_operand *a, int64_t i0, int64_t mc, int64_t M, int64_t k0,
                         int64_t kc, float *dst) {
    for (int64_t p = 0; p < mc; p += MR) {
        float *d = dst + p * kc;
        if (a->trans) { /* A stored [K, M]: op(A)[i, k] = A[k, i], rows of A run along i */
            for (int64_t k = 0; k < kc; k++)
                for (int64_t r = 0; r < MR; r++)
                    d[k * MR + r] = i0 + p + r < M ? elem(a, i0 + p + r, k0 + k) : 0.0f;
        } else if (i0 + p + MR > M || pl_gemm_mixed_generic ||
                   !pack_a_micro_fast(a, i0 + p, k0, kc, d)) {
            pack_rows(a, i0 + p, MR, M, k0, kc, d, MR);
        }
    }
}

/* ---- stores ------------------------------------------------------------------------------ */

typedef struct cdesc {
    void *data;
    pl_dtype dtype; /* PL_F32 or PL_BF16 */
    int64_t ld;
    bool avx2; /* run the AVX2/FMA code: compiled in, the CPU has it, nothing forbids it */
} cdesc;

#if HAVE_AVX2
/* 8 floats -> 8 bf16, round to nearest even, NaN quiet (pl_bf16_round) */
AVX2_FN static inline void store_bf16x8(uint16_t *d, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rn = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    rn = _mm256_blendv_epi8(rn, qn, nan);
    __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(rn, rn), 0x08);
    _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(pk));
}

/* 16 floats at s -> 16 bf16 at d (a callable boundary for store_tile, which
 * is compiled for the baseline ISA) */
AVX2_FN static void store_bf16x16(uint16_t *d, const float *s) {
    store_bf16x8(d, _mm256_loadu_ps(s));
    store_bf16x8(d + 8, _mm256_loadu_ps(s + 8));
}
#endif

/* Store tile t[MR][NR] into C rows i.., columns j.. (rows x cols valid).
 * add: C += t (f32 C only). */
static void store_tile(const float *t, const cdesc *c, int64_t i, int64_t j, int rows, int cols,
                       bool add) {
    for (int r = 0; r < rows; r++) {
        const float *s = t + r * NR;
        if (c->dtype == PL_F32) {
            float *d = (float *)c->data + (i + r) * c->ld + j;
            if (add)
                for (int q = 0; q < cols; q++)
                    d[q] += s[q];
            else
                memcpy(d, s, (size_t)cols * sizeof(float));
        } else {
            uint16_t *d = (uint16_t *)c->data + (i + r) * c->ld + j;
#if HAVE_AVX2
            if (cols == NR && c->avx2) {
                store_bf16x16(d, s);
                continue;
            }
#endif
            for (int q = 0; q < cols; q++)
                d[q] = pl_bf16_round(s[q]);
        }
    }
}

/* ---- micro-kernels: t[MR][NR] (+)= Ap[kc][MR] @ Bp[kc][NR] ---------------------------------- */

static void ukr_generic(int64_t kc, const float *ap, const float *bp, float *t) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < kc; k++)
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR; q++)
                acc[r][q] = fmaf(ap[k * MR + r], bp[k * NR + q], acc[r][q]);
    memcpy(t, acc, sizeof acc);
}

#if HAVE_AVX2
/* 12 accumulators, 2 B loads and 6 broadcasts per k; A element (r, k) at
 * ap[r * rs + k * ks]: a packed micro-panel (rs 1, ks MR) or six rows of an
 * f32 A read in place (rs lda, ks 1). Writes the tile straight into an f32
 * C when it is whole (ct != NULL), else into t. */
AVX2_FN static inline __attribute__((always_inline)) void
ukr_avx2_body(int64_t kc, const float *ap, int64_t rs, int64_t ks, const float *bp, float *t,
              float *ct, uint16_t *cb, int64_t ldc, bool add) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *a0 = ap, *a1 = ap + rs, *a2 = ap + 2 * rs, *a3 = ap + 3 * rs, *a4 = ap + 4 * rs,
                *a5 = ap + 5 * rs;
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
        _mm_prefetch((const char *)(bp + 8 * NR), _MM_HINT_T0);
        __m256 a;
        a = _mm256_broadcast_ss(a0);
        c00 = _mm256_fmadd_ps(a, b0, c00);
        c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a1);
        c10 = _mm256_fmadd_ps(a, b0, c10);
        c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a2);
        c20 = _mm256_fmadd_ps(a, b0, c20);
        c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a3);
        c30 = _mm256_fmadd_ps(a, b0, c30);
        c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(a4);
        c40 = _mm256_fmadd_ps(a, b0, c40);
        c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(a5);
        c50 = _mm256_fmadd_ps(a, b0, c50);
        c51 = _mm256_fmadd_ps(a, b1, c51);
        a0 += ks, a1 += ks, a2 += ks, a3 += ks, a4 += ks, a5 += ks;
        bp += NR;
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (cb) { /* whole tile of a bf16 C: rounded from the registers */
        for (int r = 0; r < MR; r++) {
            store_bf16x8(cb + r * ldc, acc[r][0]);
            store_bf16x8(cb + r * ldc + 8, acc[r][1]);
        }
        return;
    }
    if (ct) {
        for (int r = 0; r < MR; r++) {
            float *d = ct + r * ldc;
            if (add) {
                acc[r][0] = _mm256_add_ps(_mm256_loadu_ps(d), acc[r][0]);
                acc[r][1] = _mm256_add_ps(_mm256_loadu_ps(d + 8), acc[r][1]);
            }
            _mm256_storeu_ps(d, acc[r][0]);
            _mm256_storeu_ps(d + 8, acc[r][1]);
        }
        return;
    }
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(t + r * NR, acc[r][0]);
        _mm256_storeu_ps(t + r * NR + 8, acc[r][1]);
    }
}

AVX2_FN static void ukr_avx2(int64_t kc, const float *ap, const float *bp, float *t, float *ct,
                     uint16_t *cb, int64_t ldc, bool add) {
    ukr_avx2_body(kc, ap, 1, MR, bp, t, ct, cb, ldc, add);
}

AVX2_FN static void ukr_avx2_rows(int64_t kc, const float *a, int64_t lda, const float *bp, float *t,
                          float *ct, uint16_t *cb, int64_t ldc, bool add) {
    ukr_avx2_body(kc, a, lda, 1, bp, t, ct, cb, ldc, add);
}
#endif

/* One micro-tile: C[i.., j..] (+)= Ap @ Bp over kc. */
static void micro_tile(int64_t kc, const float *ap, int64_t lda, const float *bp, const cdesc *c,
                       int64_t i, int64_t j, int rows, int cols, bool add) {
    float t[MR * NR] __attribute__((aligned(32)));
#if HAVE_AVX2
    if (c->avx2) {
        bool whole = rows == MR && cols == NR && (c->dtype == PL_F32 || !add);
        float *ct = whole && c->dtype == PL_F32 ? (float *)c->data + i * c->ld + j : NULL;
        uint16_t *cb = whole && c->dtype == PL_BF16 ? (uint16_t *)c->data + i * c->ld + j : NULL;
        if (lda)
            ukr_avx2_rows(kc, ap, lda, bp, t, ct, cb, c->ld, add);
        else
            ukr_avx2(kc, ap, bp, t, ct, cb, c->ld, add);
        if (!whole) store_tile(t, c, i, j, rows, cols, add);
        return;
    }
#endif
    ukr_generic(kc, ap, bp, t);
    store_tile(t, c, i, j, rows, cols, add);
}

/* ---- driver ------------------------------------------------------------------------------ */

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* One thread's GEMM on rows i0.. x columns j0.. of C (m x n), own packs. */
static void gemm_serial(int64_t i0, int64_t m, int64_t j0, int64_t n, int64_t K,
                        const pl_gemm_operand *A, const pl_gemm_operand *B, const cdesc *c,
                        bool accumulate, float *ap, float *bp) {
    int64_t M = i0 + m, N = j0 + n;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kc = min64(KC, K - k0);
        bool add = accumulate || k0 > 0;
        for (int64_t j = j0; j < N; j += NR)
            pack_b_panel(B, k0, kc, j, N, bp + ((j - j0) / NR) * NR * kc);
        for (int64_t ib = i0; ib < M; ib += MC) {
            int64_t mrows = min64(MC, M - ib);
            /* an untransposed f32 A is read in place by whole micro-tiles
             * (the MC x KC block stays in L2 across the column panels): the
             * backward dX = dY @ W reads the big f32 gradient only once */
            bool direct = c->avx2 && !A->trans && A->dtype == PL_F32;
            int64_t whole = direct ? mrows / MR * MR : 0;
            if (whole < mrows)
                pack_a_block(A, ib + whole, (mrows - whole + MR - 1) / MR * MR, M, k0, kc, ap);
            const float *a32 = (const float *)A->data;
            for (int64_t j = j0; j < N; j += NR)
                for (int64_t i = ib; i < ib + mrows; i += MR) {
                    bool in_place = i - ib < whole;
                    micro_tile(kc, in_place ? a32 + i * A->ld + k0 : ap + (i - ib - whole) * kc,
                               in_place ? A->ld : 0, bp + ((j - j0) / NR) * NR * kc, c, i, j,
                               (int)min64(MR, M - i), (int)min64(NR, N - j), add);
                }
        }
    }
}

pl_status pl_gemm_mixed(int64_t M, int64_t N, int64_t K, const pl_gemm_operand *A,
                        const pl_gemm_operand *B, void *C, pl_dtype c_dtype, int64_t ldc,
                        bool accumulate, bool parallel) {
    if (M <= 0 || N <= 0) return PL_OK;
    if (c_dtype != PL_F32 && c_dtype != PL_BF16)
        return pl_error_set(PL_ERR_DTYPE, "gemm_mixed: C must be f32 or bf16, not %s",
                            pl_dtype_name(c_dtype));
    if (accumulate && c_dtype != PL_F32)
        return pl_error_set(PL_ERR_INVALID, "gemm_mixed: accumulate needs an f32 C");
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++)
                memset((char *)C + (size_t)(i * ldc) * pl_dtype_size(c_dtype), 0,
                       (size_t)N * pl_dtype_size(c_dtype));
        return PL_OK;
    }
    int nth = 1;
#if defined(_OPENMP)
    if (parallel && 2.0 * M * N * K >= 4e6) nth = omp_get_max_threads();
#endif
    /* Threads take chunks of rows (when M >= N: each packs all of op(B), K x N)
     * or of columns (each packs all of op(A)); a few chunks per thread and
     * dynamic scheduling, and no barrier until the end, so a thread the OS
     * takes away on a busy machine delays one chunk, not every K block. */
    bool by_rows = M >= N;
    int64_t unit = by_rows ? MR : NR, extent = by_rows ? M : N;
    int64_t units = (extent + unit - 1) / unit;
    int64_t nchunks = nth > 1 ? min64(units, 4 * (int64_t)nth) : 1;
    int64_t per = (units + nchunks - 1) / nchunks * unit; /* rows / columns per chunk */
    nchunks = (extent + per - 1) / per;
    int64_t cm = by_rows ? per : M, cn = by_rows ? N : per; /* chunk shape */
    int64_t kcmax = min64(K, KC);
    size_t aper = (size_t)((min64(MC, (cm + MR - 1) / MR * MR) * kcmax + 15) / 16 * 16);
    size_t bper = (size_t)((cn + NR - 1) / NR * NR * kcmax);
    /* a bf16 C with several K blocks accumulates in f32 first */
    size_t ccap = 0, wcap = 0;
    float *cbuf = NULL;
    bool avx2 = HAVE_AVX2 && !pl_gemm_mixed_generic && pl_cpu_isa_active() >= PL_ISA_AVX2;
    cdesc cd = {C, c_dtype, ldc, avx2};
    if (c_dtype == PL_BF16 && K > KC) {
        cbuf = pl_alloc(PL_CPU, (size_t)(M * N) * sizeof(float), &ccap);
        cd = (cdesc){cbuf, PL_F32, N, avx2};
    }
    float *work = pl_alloc(PL_CPU, (size_t)nth * (aper + bper) * sizeof(float), &wcap);
    if (!work || (c_dtype == PL_BF16 && K > KC && !cbuf)) {
        if (work) pl_free(PL_CPU, work, wcap);
        if (cbuf) pl_free(PL_CPU, cbuf, ccap);
        return pl_error_set(PL_ERR_NOMEM, "gemm_mixed: out of memory");
    }
#pragma omp parallel num_threads(nth) if (nth > 1)
    {
#if defined(_OPENMP)
        float *bp = work + (size_t)omp_get_thread_num() * (aper + bper);
#else
        float *bp = work;
#endif
        float *ap = bp + bper;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < nchunks; t++) {
            int64_t i0 = by_rows ? t * per : 0, j0 = by_rows ? 0 : t * per;
            gemm_serial(i0, by_rows ? min64(per, M - i0) : M, j0, by_rows ? N : min64(per, N - j0),
                        K, A, B, &cd, accumulate, ap, bp);
        }
        if (cbuf) { /* round the f32 sums into the bf16 C once */
            uint16_t *d = C;
#pragma omp for schedule(static)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++)
                    d[i * ldc + j] = pl_bf16_round(cbuf[i * N + j]);
        }
    }
    if (cbuf) pl_free(PL_CPU, cbuf, ccap);
    pl_free(PL_CPU, work, wcap);
    return PL_OK;
}
