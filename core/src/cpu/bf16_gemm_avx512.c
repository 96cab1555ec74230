/* bf16_gemm_avx512.c - C = A @ B^T with bf16 inputs and f32 accumulation on
 * AVX-512 BF16 (VDPBF16PS), the nn.Linear shape: A [M, K], B [N, K] (both
 * row-major bf16), C [M, N] f32.
 *
 * B is packed once per call into pairs along K ("VNNI" layout: Bp[k/2][n] =
 * (B[n, k], B[n, k+1]) in one 32-bit lane, N padded to 16); the micro-kernel
 * broadcasts the pair (A[m, k], A[m, k+1]) and VDPBF16PS adds both products
 * into 16 columns at once: 4 rows x 32 columns = 8 accumulators. An odd K
 * gets a zero partner for its last element. VDPBF16PS rounds to nearest even
 * and flushes bf16 denormals (Intel SDM), which is within bf16 tolerance.
 *
 * This file alone is compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512bf16 (core/CMakeLists.txt), whatever -march the rest of the build
 * uses; cpu/bf16_gemm.c calls it only where cpu/cpu_isa.c found the
 * instructions, so nothing here may be called, or inlined, elsewhere. */
#include <stdint.h>
#include <string.h>

#include "internal.h"

#if PL_HAVE_AVX512BF16_KERNEL /* else: not x86, or the compiler lacks the flags */
#if !defined(__AVX512BF16__) || !defined(__AVX512F__)
#error "bf16_gemm_avx512.c needs -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (core/CMakeLists.txt)"
#endif
#include <immintrin.h>

#define MR 4 /* rows per micro-tile: 4 x 32 columns = 8 accumulators (8 rows spilled: slower) */

static inline uint32_t pair_at(const uint16_t *row, int64_t k2, int64_t K) {
    uint32_t lo = row[2 * k2];
    uint32_t hi = 2 * k2 + 1 < K ? row[2 * k2 + 1] : 0;
    return lo | (hi << 16);
}

bool pl_bf16_gemm_nt_avx512(const uint16_t *A, const uint16_t *B, float *C, int64_t M, int64_t N,
                            int64_t K) {
    int64_t K2 = (K + 1) / 2, Np = (N + 31) / 32 * 32;
    size_t cap = 0;
    uint32_t *Bp = pl_alloc(PL_CPU, (size_t)(K2 * Np) * sizeof(uint32_t), &cap);
    if (!Bp) return false;
#pragma omp parallel for if (N * K > 65536) schedule(static)
    for (int64_t k2 = 0; k2 < K2; k2++) {
        uint32_t *dst = Bp + k2 * Np;
        for (int64_t n = 0; n < N; n++) dst[n] = pair_at(B + n * K, k2, K);
        for (int64_t n = N; n < Np; n++) dst[n] = 0;
    }
    /* column blocks outside, row blocks inside: a 32-column slice of Bp
     * (K/2 x 32 x 4 bytes) stays in L1 while every row of A streams past it;
     * A (M x K bf16) is the small operand and stays in L2 */
    int64_t mblocks = (M + MR - 1) / MR, nblocks = Np / 32;
#pragma omp parallel for if (M * N * K > 1 << 20) schedule(static)
    for (int64_t nb = 0; nb < nblocks; nb++) {
        int64_t n0 = nb * 32;
        for (int64_t mb = 0; mb < mblocks; mb++) {
            int64_t m0 = mb * MR, rows = M - m0 < MR ? M - m0 : MR;
            const uint16_t *arow[MR];
            for (int r = 0; r < MR; r++) arow[r] = A + (m0 + (r < rows ? r : 0)) * K;
            __m512 acc[MR][2];
            for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int64_t k2 = 0; k2 < K2; k2++) {
                const uint32_t *bp = Bp + k2 * Np + n0;
                __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
                __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
                for (int r = 0; r < MR; r++) {
                    __m512bh av = (__m512bh)_mm512_set1_epi32((int)pair_at(arow[r], k2, K));
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
                }
            }
            for (int r = 0; r < rows; r++)
                for (int h = 0; h < 2; h++) {
                    int64_t n = n0 + 16 * h;
                    if (n >= N) break;
                    int64_t cnt = N - n < 16 ? N - n : 16;
                    __mmask16 mk = (__mmask16)((1u << cnt) - 1u);
                    _mm512_mask_storeu_ps(C + (m0 + r) * N + n, mk, acc[r][h]);
                }
        }
    }
    pl_free(PL_CPU, Bp, cap);
    return true;
}

#else
typedef int pl_bf16_gemm_avx512_unused; /* ISO C: no empty translation unit */
#endif
