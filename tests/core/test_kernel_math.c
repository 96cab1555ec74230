/* test_kernel_math.c - the per-element math of kernel_math.h checked on its
 * own, against double-precision references: pl_exp_f32 (the f32
 * cross-entropy's exp) within 1 ulp of exp over the whole float range and at
 * the edges where expf's behaviour is defined (0, -inf, NaN, overflow,
 * subnormal results). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/kernel_math.h"
#include "pl_test.h"

/* |y - exact| in units in the last place of the exact value's binade
 * (2^-149 for subnormal results): one ulp is the distance between the two
 * floats around the exact value. */
static double ulp_error(float y, double exact) {
    int e;
    frexp(exact, &e); /* exact in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, e - 24);
    if (ulp < 0x1p-149) ulp = 0x1p-149;
    return fabs((double)y - exact) / ulp;
}

/* The scalar path: a call GCC does not inline into the vectorized loop. */
__attribute__((noinline)) static float exp_scalar(float x) {
    return pl_exp_f32(x);
}

/* Every 13th float of [2^-30, hi] with sign `sign` (13 is odd: every
 * pattern of the low bits is visited), through the loop the cross-entropy
 * kernels use (vectorized: 8 lanes under AVX2) and the scalar path; returns
 * the worst error and where. Below 2^-30 exp rounds to 1 (or 1 - 2^-24). */
static double worst_ulp(float sign, float hi, float *where, long *count) {
    enum { B = 4096 };
    static float xs[B], ys[B];
    uint32_t lo_bits, hi_bits;
    float lo = 0x1p-30f;
    memcpy(&lo_bits, &lo, 4);
    memcpy(&hi_bits, &hi, 4);
    double worst = 0;
    long n = 0;
    for (uint64_t u = lo_bits; u <= hi_bits;) {
        int m = 0;
        for (; m < B && u <= hi_bits; m++, u += 13) {
            float f;
            uint32_t b = (uint32_t)u;
            memcpy(&f, &b, 4);
            xs[m] = sign * f;
        }
#pragma omp simd
        for (int i = 0; i < m; i++)
            ys[i] = pl_exp_f32(xs[i]);
        for (int i = 0; i < m; i++) {
            double ex = exp((double)xs[i]);
            double e = ulp_error(ys[i], ex);
            if (i % 64 == 0) { /* the scalar code on a sample */
                double es = ulp_error(exp_scalar(xs[i]), ex);
                e = es > e ? es : e;
            }
            if (e > worst) {
                worst = e;
                *where = xs[i];
            }
        }
        n += m;
    }
    *count = n;
    return worst;
}

START_TEST(exp_f32_within_one_ulp_of_double_exp) {
    float where = 0;
    long n_neg, n_pos;
    /* the cross-entropy's range: x - max <= 0, down to where e^x underflows */
    double neg = worst_ulp(-1.0f, 104.5f, &where, &n_neg);
    ck_assert_msg(neg <= 1.0, "pl_exp_f32: %.4f ulp at x = %a (%ld inputs <= 0)", neg, where,
                  n_neg);
    /* and the rest, up to the largest finite e^x */
    double pos = worst_ulp(1.0f, 88.72f, &where, &n_pos);
    ck_assert_msg(pos <= 1.0, "pl_exp_f32: %.4f ulp at x = %a (%ld inputs > 0)", pos, where, n_pos);
    ck_assert_int_gt(n_neg + n_pos, 40000000);
}
END_TEST

START_TEST(exp_f32_edges_behave_as_expf) {
    /* exact results: e^0 = 1, e^-inf = 0, overflow to inf, underflow to 0 */
    ck_assert(pl_exp_f32(0.0f) == 1.0f);
    ck_assert(pl_exp_f32(-0.0f) == 1.0f);
    ck_assert(pl_exp_f32(-INFINITY) == 0.0f);
    ck_assert(pl_exp_f32(-1e30f) == 0.0f);
    ck_assert(pl_exp_f32(-104.0f) == 0.0f); /* e^-104 < 2^-150: rounds to 0 */
    ck_assert(pl_exp_f32(INFINITY) == INFINITY);
    ck_assert(pl_exp_f32(88.73f) == INFINITY); /* just above ln(FLT_MAX) */
    ck_assert(isnan(pl_exp_f32(NAN)));
    ck_assert(isnan(pl_exp_f32(-NAN)));
    /* tiny inputs (a subnormal one included) give 1 or 1 - 2^-24, as expf */
    const float tiny[] = {1e-45f, -1e-45f, 1e-30f, -1e-30f, -3e-8f, 3e-8f};
    for (unsigned i = 0; i < sizeof tiny / sizeof *tiny; i++)
        ck_assert_msg(pl_exp_f32(tiny[i]) == expf(tiny[i]), "e^%a = %a, expf %a", tiny[i],
                      pl_exp_f32(tiny[i]), expf(tiny[i]));
    /* around the ends of the float range: the last normal result, the
     * subnormal ones down to 2^-149 (rounded once, not flushed), the
     * largest finite one */
    const float edge[] = {-87.3365402f, -87.3365479f, -87.5f,       -90.0f,
                          -100.0f,      -103.0f,      -103.278924f, -103.972076f,
                          -103.972092f, 88.7228241f,  88.7228317f,  88.0f,
                          0.34657359f,  -0.34657359f, 1.0f,         -1.0f};
    for (unsigned i = 0; i < sizeof edge / sizeof *edge; i++) {
        double e = ulp_error(pl_exp_f32(edge[i]), exp((double)edge[i]));
        ck_assert_msg(e <= 1.0, "e^%a = %a: %.3f ulp (expf %a)", edge[i], pl_exp_f32(edge[i]), e,
                      expf(edge[i]));
        ck_assert_msg(fabsf(pl_exp_f32(edge[i]) - expf(edge[i])) <=
                          fmaxf(0x1p-149f, 0x1p-23f * expf(edge[i])),
                      "e^%a = %a, expf %a: more than one ulp apart", edge[i], pl_exp_f32(edge[i]),
                      expf(edge[i]));
    }
    ck_assert(pl_exp_f32(-103.278924f) > 0.0f); /* 2^-149 survives */
    ck_assert(pl_exp_f32(-87.5f) < 0x1p-126f && pl_exp_f32(-87.5f) > 0.0f);
}
END_TEST

/* A NaN loss reaches the LSTM's cell (pl_tanh_fast, pl_sigmoid_fast) and the
 * bf16 cross-entropy (pl_exp_neg of x - lse); infinities reach them when a
 * logit overflows. pl_exp_parts cast NaN to int and shifted the negative int
 * x86 gives for it (undefined: the sanitizer build aborted here); now every
 * function of the family is defined on NaN, +-inf and huge inputs, and NaN
 * stays NaN. */
START_TEST(exp_neg_family_defined_on_nan_and_infinities) {
    ck_assert(isnan(pl_exp_neg(NAN)));
    ck_assert(isnan(pl_exp_neg(-NAN)));
    ck_assert(isnan(pl_expm1_neg(NAN)));
    ck_assert(isnan(pl_tanh_fast(NAN)));
    ck_assert(isnan(pl_sigmoid_fast(NAN)));
    ck_assert(isnan(pl_math_elu(NAN, 1.0f)));
    ck_assert(isnan(pl_math_elu_grad(1.0f, NAN, 1.0f)));
    ck_assert(isnan(pl_softmax_exp_bf16(NAN, 0.0f)));
    ck_assert(isnan(pl_softmax_exp_bf16(1.0f, NAN)));
    ck_assert(isnan(pl_softmax_exp_bf16(INFINITY, INFINITY))); /* inf - inf */
    ck_assert(isnan(pl_ce_grad_bf16(NAN, 0.0f, 1.0f, 0.0f)));
    /* the ends of the domain: e^-inf, e^-huge as e^-87; above 0 (+inf, a
     * max that is not the max) is taken as e^0 */
    ck_assert(pl_exp_neg(-INFINITY) == pl_exp_neg(-87.0f));
    ck_assert(pl_exp_neg(-1e30f) == pl_exp_neg(-87.0f));
    ck_assert(pl_exp_neg(-FLT_MAX) > 0.0f && pl_exp_neg(-FLT_MAX) < 1e-37f);
    ck_assert(pl_exp_neg(INFINITY) == 1.0f);
    ck_assert(pl_exp_neg(1e30f) == 1.0f);
    ck_assert(pl_exp_neg(FLT_MAX) == 1.0f);
    ck_assert(pl_exp_neg(0.0f) == 1.0f);
    ck_assert(pl_expm1_neg(-INFINITY) == -1.0f);
    ck_assert(pl_expm1_neg(INFINITY) == 0.0f);
    ck_assert(pl_expm1_neg(FLT_MAX) == 0.0f);
    ck_assert(pl_tanh_fast(INFINITY) == 1.0f && pl_tanh_fast(-INFINITY) == -1.0f);
    ck_assert(pl_tanh_fast(FLT_MAX) == 1.0f && pl_tanh_fast(-FLT_MAX) == -1.0f);
    ck_assert(pl_sigmoid_fast(INFINITY) == 1.0f);
    ck_assert(pl_sigmoid_fast(-INFINITY) < 1e-37f && pl_sigmoid_fast(-INFINITY) >= 0.0f);
    ck_assert(pl_sigmoid_fast(FLT_MAX) == 1.0f);
    ck_assert(pl_math_elu(-INFINITY, 1.0f) == -1.0f);
    ck_assert(pl_math_elu(INFINITY, 1.0f) == INFINITY);
    ck_assert(pl_softmax_exp_bf16(-INFINITY, 0.0f) == pl_exp_neg(-87.0f));
    ck_assert(pl_softmax_exp_bf16(1.0f, -INFINITY) == 1.0f); /* x above m */
    ck_assert(pl_ce_grad_bf16(0.0f, -INFINITY, 2.0f, 0.5f) == 1.0f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kernel_math");
    TCase *tc = tcase_create("exp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, exp_f32_within_one_ulp_of_double_exp);
    tcase_add_test(tc, exp_f32_edges_behave_as_expf);
    tcase_add_test(tc, exp_neg_family_defined_on_nan_and_infinities);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
