/* test_cpu_isa.c - the bf16 GEMM chosen at run time (cpu_isa.c,
 * bf16_gemm.c, bf16_gemm_avx512.c, gemm_mixed.c): on every
 * level this CPU has (AVX-512 BF16, AVX2/FMA, portable), forced in turn as
 * PL_CPU_ISA would, x @ W^T with bf16 operands equals the f64 product of the
 * same bf16 values within f32 accumulation's error, both through the kernel
 * and through pl_matmul; a level the CPU lacks is reported as skipped (one
 * line on stdout), the portable one always runs. And PL_CPU_ISA's parsing:
 * a cap, never a raise; a bad value ignored. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "pl_test.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64, [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* rows x cols bf16 values in [-2, 2), and the same values as doubles */
static uint16_t *make_bf16(int64_t rows, int64_t cols, double *v) {
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(rows * cols));
    ck_assert_ptr_nonnull(p);
    for (int64_t i = 0; i < rows * cols; i++) {
        p[i] = pl_f32_to_bf16((float)(urand() * 2.0));
        v[i] = pl_bf16_to_f32(p[i]);
    }
    return p;
}

/* shapes: M, N, K of 1, odd K (the AVX-512 kernel's last pair padded), N
 * not a multiple of 16 / 32, M not a multiple of the 4 or 6 row tiles, K
 * past gemm_mixed's 256-deep block, and one past the threading thresholds */
static const int64_t shapes[][3] = {
    {1, 1, 1}, {1, 33, 2}, {5, 17, 3}, {4, 32, 64}, {7, 37, 171}, {13, 16, 300}, {64, 96, 257},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* C = A @ B^T through `level` (forced as a cap); false: the AVX-512 BF16
 * kernel declined (the caller's check decides whether it may) */
static void check_level(pl_cpu_isa level, bool via_op) {
    pl_cpu_isa_force(level);
    ck_assert_int_eq(pl_cpu_isa_active(), level);
    ck_assert_str_eq(pl_cpu_gemm_bf16(), pl_cpu_isa_name(level));
    for (int s = 0; s < NSHAPES; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        double *va = malloc(sizeof(double) * (size_t)(M * K));
        double *vb = malloc(sizeof(double) * (size_t)(N * K));
        uint16_t *A = make_bf16(M, K, va), *B = make_bf16(N, K, vb);
        float *C = calloc((size_t)(M * N), sizeof(float));
        pl_tensor *out = NULL;
        if (via_op) { /* pl_matmul(x, W, false, true), f32 output under no autocast */
            pl_frame_begin();
            pl_tensor *x = PL_CK_NOTNULL(pl_tensor_from_data(PL_BF16, 2, (int64_t[]){M, K}, A, PL_CPU));
            pl_tensor *w = PL_CK_NOTNULL(pl_tensor_from_data(PL_BF16, 2, (int64_t[]){N, K}, B, PL_CPU));
            out = PL_CK_NOTNULL(pl_matmul(x, w, false, true));
            ck_assert_int_eq(out->dtype, PL_BF16);
            for (int64_t i = 0; i < M * N; i++) C[i] = (float)pl_tensor_get(out, i);
            pl_frame_end();
        } else if (level == PL_ISA_AVX512BF16) {
            ck_assert_msg(pl_bf16_gemm_nt(A, B, C, M, N, K),
                          "AVX-512 BF16 kernel declined M%lld N%lld K%lld on a CPU that has it",
                          (long long)M, (long long)N, (long long)K);
        } else {
            /* below AVX-512 BF16 the dispatcher declines, and the packed GEMM runs */
            ck_assert_msg(!pl_bf16_gemm_nt(A, B, C, M, N, K),
                          "the AVX-512 BF16 kernel ran although the level is capped at %s",
                          pl_cpu_isa_name(level));
            pl_gemm_operand oa = {A, PL_BF16, K, false}, ob = {B, PL_BF16, K, true};
            PL_CK_OK(pl_gemm_mixed(M, N, K, &oa, &ob, C, PL_F32, N, false, true));
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    ref += va[i * K + k] * vb[j * K + k];
                    mag += fabs(va[i * K + k] * vb[j * K + k]);
                }
                /* f32 accumulation: K + 1 roundings of at most 2^-24 of the
                 * running magnitude; through the op a bf16 output adds one
                 * rounding of 2^-8 */
                double tol = mag * (double)(K + 2) * 0x1p-24 + (via_op ? fabs(ref) * 0x1p-8 : 0) +
                             1e-30;
                double got = C[i * N + j];
                ck_assert_msg(fabs(got - ref) <= tol,
                              "%s%s M%lld N%lld K%lld: C[%lld, %lld] = %.9g, f64 reference of "
                              "the bf16 values %.9g (tol %.3g)",
                              pl_cpu_isa_name(level), via_op ? " (pl_matmul)" : "", (long long)M,
                              (long long)N, (long long)K, (long long)i, (long long)j, got, ref,
                              tol);
            }
        free(va), free(vb), free(A), free(B), free(C);
    }
    pl_cpu_isa_force(-1);
}

/* the level if this CPU has it, else a line saying it was skipped */
static bool have(pl_cpu_isa level) {
    if (pl_cpu_isa_detected() >= level) return true;
    char f[128];
    printf("test_cpu_isa: skipped the %s bf16 GEMM: this CPU (or build) lacks it (CPU "
           "features: %s)\n",
           pl_cpu_isa_name(level), pl_cpu_features(f, sizeof f));
    fflush(stdout);
    return false;
}

START_TEST(avx512bf16_kernel_matches_f64_reference) {
    if (!have(PL_ISA_AVX512BF16)) return;
    check_level(PL_ISA_AVX512BF16, false);
    check_level(PL_ISA_AVX512BF16, true);
}
END_TEST

START_TEST(avx2_fallback_matches_f64_reference) {
    if (!have(PL_ISA_AVX2)) return;
    check_level(PL_ISA_AVX2, false);
    check_level(PL_ISA_AVX2, true);
}
END_TEST

START_TEST(scalar_fallback_matches_f64_reference) {
    check_level(PL_ISA_SCALAR, false);
    check_level(PL_ISA_SCALAR, true);
}
END_TEST

/* The levels are a cap: PL_CPU_ISA never raises above what cpuid found, a
 * bad value is ignored (the detected level runs), and the run's name for
 * the kernel follows. The detected features are consistent with the level. */
START_TEST(pl_cpu_isa_env_caps_and_bad_values_are_ignored) {
    pl_cpu_isa best = pl_cpu_isa_detected();
    char f[128];
    const char *feat = pl_cpu_features(f, sizeof f);
    printf("test_cpu_isa: CPU features %s; best bf16 GEMM %s\n", feat, pl_cpu_isa_name(best));
    fflush(stdout);
    if (best >= PL_ISA_AVX512BF16) ck_assert_ptr_nonnull(strstr(feat, "avx512_bf16"));
    if (best >= PL_ISA_AVX2) ck_assert_ptr_nonnull(strstr(feat, "avx2"));
    static const struct {
        const char *value;
        pl_cpu_isa cap;
    } cases[] = {{"scalar", PL_ISA_SCALAR},
                 {"avx2", PL_ISA_AVX2},
                 {"avx512bf16", PL_ISA_AVX512BF16},
                 {"AVX9000", PL_ISA_AVX512BF16}, /* ignored: no cap */
                 {"", PL_ISA_AVX512BF16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("PL_CPU_ISA", cases[i].value, 1);
        pl_cpu_isa_force(-1); /* read PL_CPU_ISA again */
        pl_cpu_isa want = cases[i].cap < best ? cases[i].cap : best;
        ck_assert_msg(pl_cpu_isa_active() == want, "PL_CPU_ISA=%s on a CPU with %s: %s, want %s",
                      cases[i].value, pl_cpu_isa_name(best), pl_cpu_isa_name(pl_cpu_isa_active()),
                      pl_cpu_isa_name(want));
        ck_assert_str_eq(pl_cpu_gemm_bf16(), pl_cpu_isa_name(want));
    }
    unsetenv("PL_CPU_ISA");
    pl_cpu_isa_force(-1);
    ck_assert_int_eq(pl_cpu_isa_active(), best);
}
END_TEST

int main(void) {
    /* this program's copy of the CPU backend serves the CPU device (before
     * any CPU tensor; the cpu plugin is then not loaded): the levels forced
     * here are the ones pl_matmul runs on */
    if (pl_backend_register(pl_cpu_backend_table()) ||
        pl_backend_get(PL_DEVICE_CPU) != pl_cpu_backend_table()) {
        fprintf(stderr, "test_cpu_isa: registering the linked CPU backend: %s\n",
                pl_error_message());
        return 1;
    }
    Suite *s = suite_create("cpu_isa");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, avx512bf16_kernel_matches_f64_reference);
    tcase_add_test(tc, avx2_fallback_matches_f64_reference);
    tcase_add_test(tc, scalar_fallback_matches_f64_reference);
    tcase_add_test(tc, pl_cpu_isa_env_caps_and_bad_values_are_ignored);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
