/* bf16_gemm_avx512.c - C = A @ B^T with bf16 inputs and f32 accumulation on
 * AVX-512 BF16 (VDPBF16PS), the nn.Linear shape: A [M, K], B [N, K] (both
 * row-major bf16), C [M, N] f32.
 *
 * VDPBF16PS multiplies pairs along K: lane l of its operands holds (x[k],
 * x[k+1]). A row of B (a weight row) already is such a sequence of pairs, so
 * B is only copied block by block (contiguous rows) and one pair of it
 * broadcast; A, the small operand, is
 * packed once per call into panels of 32 rows with the pairs of its 32 rows
 * in the lanes ("VNNI" layout, Ap[m/32][k/2][m%32]). The micro-kernel thus
 * computes a 32 x 8 tile of C transposed (lanes run along M): 16 zmm
 * accumulators, two A loads and eight broadcasts per pair, the tile
 * transposed into C through a buffer at the end; K in blocks of 128 pairs
 * (later blocks add into C). Packing B instead (one scattered 32-bit move
 * per pair of a weight, every call) cost as much as the products at M = 32.
 * An odd K gets a zero partner for its last element. VDPBF16PS rounds to nearest even
 * and flushes bf16 denormals (Intel SDM), which is within bf16 tolerance.
 *
 * This file alone is compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512bf16 (this folder's CMakeLists.txt), whatever -march the rest of the build
 * uses; bf16_gemm.c calls it only where cpu_isa.c found the
 * instructions, so nothing here may be called, or inlined, elsewhere. */
#include <stdint.h>
#include <string.h>

#include "cpu_internal.h"

#if PL_HAVE_AVX512BF16_KERNEL /* else: not x86, or the compiler lacks the flags */
#if !defined(__AVX512BF16__) || !defined(__AVX512F__)
#error "bf16_gemm_avx512.c needs -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (plugins/backends/cpu/CMakeLists.txt)"
#endif
#include <immintrin.h>
#if defined(_OPENMP)
#include <omp.h>
#else
#define omp_get_max_threads() 1
#define omp_get_thread_num() 0
#endif

#define MV 32   /* rows of A (C) per micro-tile: two zmm of 16 lanes */
#define NB 8    /* rows of B (columns of C) per micro-tile: 16 zmm accumulators */
#define KC2 128 /* pairs of K per block: an A panel slice is 16 KiB (L1) */
#define NG 32   /* rows of B per unit of work: their K block is copied, 16 KiB (L1) */

static inline uint32_t pair_at(const uint16_t *row, int64_t k2, int64_t K) {
    uint32_t lo = row[2 * k2];
    uint32_t hi = 2 * k2 + 1 < K ? row[2 * k2 + 1] : 0;
    return lo | (hi << 16);
}

/* C[m0 + 0..31, n0 + 0..7] (+)= sum over kc2 pairs of Ap[k2][m] .
 * (Bg[n][2 k2], Bg[n][2 k2 + 1]); Bg rows of 2 KC2 bf16 */
static inline __attribute__((always_inline)) void micro(int64_t kc2, const uint32_t *ap,
                                                        const uint32_t *bg, float *c, int64_t ldc,
                                                        int rows, int cols, bool add) {
    __m512 acc[NB][2];
    for (int j = 0; j < NB; j++) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
    for (int64_t k2 = 0; k2 < kc2; k2++) {
        __m512bh a0 = (__m512bh)_mm512_loadu_si512(ap);
        __m512bh a1 = (__m512bh)_mm512_loadu_si512(ap + 16);
        for (int j = 0; j < NB; j++) {
            __m512bh bv = (__m512bh)_mm512_set1_epi32((int)bg[j * KC2 + k2]);
            acc[j][0] = _mm512_dpbf16_ps(acc[j][0], a0, bv);
            acc[j][1] = _mm512_dpbf16_ps(acc[j][1], a1, bv);
        }
        ap += MV;
    }
    /* acc[j][h] lane l is C[16 h + l, j]: transposed through a buffer (32 x
     * 8 stores per tile against 16 x kc2 dot products) */
    float t[NB][MV] __attribute__((aligned(64)));
    for (int j = 0; j < NB; j++) {
        _mm512_store_ps(t[j], acc[j][0]);
        _mm512_store_ps(t[j] + 16, acc[j][1]);
    }
    for (int r = 0; r < rows; r++) {
        float *d = c + r * ldc;
        if (add)
            for (int j = 0; j < cols; j++) d[j] += t[j][r];
        else
            for (int j = 0; j < cols; j++) d[j] = t[j][r];
    }
}

bool pl_bf16_gemm_nt_avx512(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                            int64_t K) {
    int64_t K2 = (K + 1) / 2, Mp = (M + MV - 1) / MV * MV;
    bool par = M * N * K > 1 << 20;
    int nth = par ? omp_get_max_threads() : 1;
    size_t capa = 0, capb = 0;
    uint32_t *Ap = pl_alloc(PL_CPU, (size_t)(K2 * Mp) * sizeof(uint32_t), &capa);
    uint32_t *Bw = Ap ? pl_alloc(PL_CPU, (size_t)nth * NG * KC2 * sizeof(uint32_t), &capb) : NULL;
    if (!Bw) {
        if (Ap) pl_free(PL_CPU, Ap, capa);
        return false;
    }
    int64_t ngroups = (N + NG - 1) / NG;
#pragma omp parallel num_threads(nth) if (par)
    {
        /* A (the small operand) as panels of 32 rows, Ap[m / 32][k2][m % 32]
         * (rows past M zero) */
#pragma omp for schedule(static)
        for (int64_t mp = 0; mp < Mp / MV; mp++) {
            uint32_t *dst = Ap + mp * K2 * MV;
            for (int64_t k2 = 0; k2 < K2; k2++)
                for (int l = 0; l < MV; l++) {
                    int64_t m = mp * MV + l;
                    dst[k2 * MV + l] = m < M ? pair_at(A + m * K, k2, K) : 0;
                }
        }
        /* groups of 32 rows of B across threads; per group and block of
         * 128 pairs of K, the rows' block is copied (a row of B already is
         * a sequence of pairs; the copy keeps rows 4 KiB apart from
         * aliasing in L1, and zero-pads an odd K) and stays in L1 while
         * every panel of A passes it */
        uint32_t *bg = Bw + (size_t)omp_get_thread_num() * NG * KC2;
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < ngroups; g++) {
            int64_t g0 = g * NG, n1 = g0 + NG < N ? g0 + NG : N;
            for (int64_t k0 = 0; k0 < K2; k0 += KC2) {
                int64_t kc2 = K2 - k0 < KC2 ? K2 - k0 : KC2;
                int64_t kel = 2 * kc2 <= K - 2 * k0 ? 2 * kc2 : K - 2 * k0; /* bf16 in block */
                for (int64_t n = g0; n < g0 + NG; n++) {
                    uint16_t *d = (uint16_t *)(bg + (n - g0) * KC2);
                    int64_t len = n < n1 ? kel : 0;
                    if (len) memcpy(d, B + n * K + 2 * k0, (size_t)len * sizeof(uint16_t));
                    memset(d + len, 0, (size_t)(2 * kc2 - len) * sizeof(uint16_t));
                }
                for (int64_t m0 = 0; m0 < M; m0 += MV)
                    for (int64_t n0 = g0; n0 < n1; n0 += NB)
                        micro(kc2, Ap + m0 * K2 + k0 * MV, bg + (n0 - g0) * KC2, C + m0 * N + n0,
                              N, (int)(M - m0 < MV ? M - m0 : MV),
                              (int)(n1 - n0 < NB ? n1 - n0 : NB), k0 > 0);
            }
        }
    }
    pl_free(PL_CPU, Bw, capb);
    pl_free(PL_CPU, Ap, capa);
    return true;
}

#else
typedef int pl_bf16_gemm_avx512_unused; /* ISO C: no empty translation unit */
#endif
