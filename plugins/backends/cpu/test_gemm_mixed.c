/* test_gemm_mixed.c - gemm_mixed.c, the packed GEMM for bf16 / f16 / f32
 * operands (autocast's matmuls, forward and backward), against an f64 GEMM
 * of the same (already rounded) inputs: every dtype mix, both transposes,
 * edge shapes (M, N, K of 1, odd, smaller than the 6 x 16 tile, past the
 * 256-deep K block and the 96-row A block), f32 and bf16 C,
 * accumulation, leading dimensions wider than the matrix, the AVX2 and the
 * portable micro-kernel, serial and threaded (row and column chunks). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "pl_test.h"

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* xorshift64, [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* rows x cols operand of dtype dt stored with leading dimension ld (>= cols),
 * and its values (after rounding to dt) as doubles in v[rows][cols] */
static void *make(pl_dtype dt, int64_t rows, int64_t cols, int64_t ld, double *v) {
    size_t es = pl_dtype_size(dt);
    char *p = malloc((size_t)(rows * ld) * es + 1);
    ck_assert_ptr_nonnull(p);
    memset(p, 0x7f, (size_t)(rows * ld) * es); /* garbage in the ld padding */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float f = (float)(urand() * 2.0);
            int64_t i = r * ld + c;
            if (dt == PL_BF16) {
                ((uint16_t *)p)[i] = pl_f32_to_bf16(f);
                v[r * cols + c] = pl_bf16_to_f32(((uint16_t *)p)[i]);
            } else if (dt == PL_F16) {
                ((uint16_t *)p)[i] = pl_f32_to_f16(f);
                v[r * cols + c] = pl_f16_to_f32(((uint16_t *)p)[i]);
            } else {
                ((float *)p)[i] = f;
                v[r * cols + c] = f;
            }
        }
    return p;
}

/* op(X)[i, k] from the stored values: stored [rows, cols] */
static double at(const double *v, int64_t cols, bool trans, int64_t i, int64_t k) {
    return trans ? v[k * cols + i] : v[i * cols + k];
}

static void check_one(int64_t M, int64_t N, int64_t K, pl_dtype da, pl_dtype db, bool ta, bool tb,
                      pl_dtype dc, bool accumulate, bool parallel) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + (ac % 3 == 1 ? 5 : 0), ldb = bc + (bc % 2), ldc = N + 3;
    double *va = malloc(sizeof(double) * (size_t)(ar * ac + 1));
    double *vb = malloc(sizeof(double) * (size_t)(br * bc + 1));
    void *A = make(da, ar, ac, lda, va), *B = make(db, br, bc, ldb, vb);
    size_t es = pl_dtype_size(dc);
    char *C = calloc((size_t)(M * ldc + 1), es);
    double *c0 = calloc((size_t)(M * N + 1), sizeof(double));
    if (accumulate)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                float f = (float)urand();
                ((float *)C)[i * ldc + j] = f;
                c0[i * N + j] = f;
            }
    pl_gemm_operand oa = {A, da, lda, ta}, ob = {B, db, ldb, tb};
    ck_assert_int_eq(pl_gemm_mixed(M, N, K, &oa, &ob, C, dc, ldc, accumulate, parallel), PL_OK);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = c0[i * N + j], mag = fabs(c0[i * N + j]);
            for (int64_t k = 0; k < K; k++) {
                double p = at(va, ac, ta, i, k) * at(vb, bc, tb, k, j);
                ref += p;
                mag += fabs(p);
            }
            double got = dc == PL_BF16 ? pl_bf16_to_f32(((uint16_t *)C)[i * ldc + j])
                                       : ((float *)C)[i * ldc + j];
            /* f32 accumulation: K + 1 roundings of at most 2^-24 of the
             * running magnitude; a bf16 C adds one rounding of 2^-8 */
            double tol = mag * (K + 2) * 0x1p-24 + (dc == PL_BF16 ? fabs(ref) * 0x1p-8 : 0) + 1e-30;
            ck_assert_msg(fabs(got - ref) <= tol,
                          "M%lld N%lld K%lld %s x %s ta%d tb%d C %s acc%d: C[%lld, %lld] = %.9g, "
                          "f64 reference %.9g (tol %.3g)",
                          (long long)M, (long long)N, (long long)K, pl_dtype_name(da),
                          pl_dtype_name(db), ta, tb, pl_dtype_name(dc), accumulate, (long long)i,
                          (long long)j, got, ref, tol);
        }
    /* nothing outside the [M, N] window of C is written */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++)
            for (size_t b = 0; b < es; b++)
                ck_assert_int_eq(C[(size_t)(i * ldc + j) * es + b], 0);
    free(va), free(vb), free(A), free(B), free(C), free(c0);
}

static const int64_t shapes[][3] = {
    {1, 1, 1},
    {1, 17, 1},
    {5, 1, 3},
    {6, 16, 8},
    {7, 17, 9},
    {3, 5, 2},
    {13, 33, 64},
    {97, 40, 31},
    {50, 50, 32},
    {12, 515, 7},
    {100, 20, 257},
    {31, 9, 600},
    /* past the 4 MFLOP threading threshold: chunks of rows, then of columns */
    {151, 70, 300},
    {40, 701, 161},
};

START_TEST(matches_f64_reference_for_every_dtype_mix_and_transpose) {
    static const pl_dtype dts[][2] = {{PL_BF16, PL_BF16},
                                      {PL_F32, PL_BF16},
                                      {PL_BF16, PL_F32},
                                      {PL_F16, PL_F16},
                                      {PL_F32, PL_F16}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (int t = 0; t < 4; t++)
                check_one(shapes[s][0], shapes[s][1], shapes[s][2], dts[d][0], dts[d][1], t & 1,
                          t & 2, PL_F32, false, s % 2 == 0);
}
END_TEST

START_TEST(bf16_output_is_rounded_once_from_f32_sums) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            check_one(shapes[s][0], shapes[s][1], shapes[s][2], PL_BF16, PL_BF16, t & 1, t & 2,
                      PL_BF16, false, true);
}
END_TEST

START_TEST(accumulate_adds_to_c) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_one(shapes[s][0], shapes[s][1], shapes[s][2], PL_F32, PL_BF16, s & 1, true, PL_F32,
                  true, true);
}
END_TEST

START_TEST(portable_micro_kernel_matches_too) {
    pl_gemm_mixed_generic = true;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            check_one(shapes[s][0], shapes[s][1], shapes[s][2], PL_BF16, PL_F32, t & 1, t & 2,
                      s % 3 ? PL_F32 : PL_BF16, false, s % 2 == 1);
    pl_gemm_mixed_generic = false;
}
END_TEST

/* the bf16 store: ties to even, NaN stays NaN, infinities and overflow to inf */
START_TEST(bf16_store_rounds_ties_to_even_and_keeps_nan) {
    /* A = [x] (1 x 1, f32), B = [1] (bf16): C = x rounded once; 16 columns
     * take the vector store, 3 the scalar one */
    static const float xs[] = {1.00390625f, 1.01171875f, 3.0e38f, -INFINITY, NAN, 1e-40f};
    for (int64_t n = 3; n <= 16; n += 13)
        for (size_t x = 0; x < sizeof xs / sizeof xs[0]; x++) {
            float a = xs[x];
            uint16_t b[16], c[16];
            for (int j = 0; j < 16; j++)
                b[j] = pl_f32_to_bf16(1.0f);
            pl_gemm_operand oa = {&a, PL_F32, 1, false}, ob = {b, PL_BF16, n, false};
            ck_assert_int_eq(pl_gemm_mixed(1, n, 1, &oa, &ob, c, PL_BF16, n, false, false), PL_OK);
            for (int j = 0; j < n; j++) {
                if (isnan(a)) {
                    ck_assert(isnan(pl_bf16_to_f32(c[j])));
                } else {
                    ck_assert_msg(c[j] == pl_f32_to_bf16(a), "x=%g n=%lld: %04x, expected %04x",
                                  (double)a, (long long)n, c[j], pl_f32_to_bf16(a));
                }
            }
        }
}
END_TEST

START_TEST(k_zero_clears_or_keeps_c) {
    float C[6] = {1, 2, 3, 4, 5, 6};
    float a = 0, b = 0;
    pl_gemm_operand oa = {&a, PL_F32, 1, false}, ob = {&b, PL_BF16, 3, false};
    ck_assert_int_eq(pl_gemm_mixed(2, 3, 0, &oa, &ob, C, PL_F32, 3, true, true), PL_OK);
    ck_assert(C[5] == 6.0f);
    ck_assert_int_eq(pl_gemm_mixed(2, 3, 0, &oa, &ob, C, PL_F32, 3, false, true), PL_OK);
    for (int i = 0; i < 6; i++)
        ck_assert(C[i] == 0.0f);
}
END_TEST

int main(void) {
    /* this program's copy of the CPU backend serves the CPU device (before
     * any CPU tensor; the cpu plugin is then not loaded): the levels forced
     * here are the ones pl_matmul runs on */
    if (pl_backend_register(pl_cpu_backend_table()) ||
        pl_backend_get(PL_DEVICE_CPU) != pl_cpu_backend_table()) {
        fprintf(stderr, "test_gemm_mixed: registering the linked CPU backend: %s\n",
                pl_error_message());
        return 1;
    }
    Suite *s = suite_create("gemm_mixed");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, matches_f64_reference_for_every_dtype_mix_and_transpose);
    tcase_add_test(tc, bf16_output_is_rounded_once_from_f32_sums);
    tcase_add_test(tc, accumulate_adds_to_c);
    tcase_add_test(tc, portable_micro_kernel_matches_too);
    tcase_add_test(tc, bf16_store_rounds_ties_to_even_and_keeps_nan);
    tcase_add_test(tc, k_zero_clears_or_keeps_c);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
