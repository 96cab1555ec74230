/* test_ops_dense.c - dense ops (ops_dense.c + cpu/kernels_dense.c): forward
 * values against double-precision reference loops written here or hand
 * computed values, backward against central differences (pl_gradcheck). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pl_test.h"

#define EPS 1e-3
#define ATOL 3e-3
#define RTOL 3e-2

static pl_tensor *randn_g(int nd, const int64_t *shape, uint64_t seed) {
    pl_tensor *t = pl_test_randn(nd, shape, seed);
    ck_assert_ptr_nonnull(t);
    pl_tensor_set_requires_grad(t, true);
    return t;
}

static void check_grad(pl_test_fn f, pl_tensor **in, int n, void *ctx, const char *what) {
    char msg[512];
    bool ok = pl_gradcheck(f, in, n, ctx, EPS, ATOL, RTOL, msg, sizeof msg);
    ck_assert_msg(ok, "gradcheck %s: %s", what, msg);
}

static void check_close(const pl_tensor *t, const double *ref, int64_t n, double atol, double rtol,
                        const char *what) {
    ck_assert_int_eq(pl_tensor_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        double v = pl_tensor_get(t, i);
        ck_assert_msg(fabs(v - ref[i]) <= atol + rtol * fabs(ref[i]),
                      "%s: element %lld = %.8g, expected %.8g", what, (long long)i, v, ref[i]);
    }
}

static void check_shape(const pl_tensor *t, int nd, const int64_t *shape) {
    ck_assert_int_eq(t->ndim, nd);
    for (int d = 0; d < nd; d++)
        ck_assert_int_eq(t->shape[d], shape[d]);
}

/* ---- matmul ---------------------------------------------------------------- */

/* Double reference of op(A) @ op(B) with NumPy batch broadcasting. */
static void ref_matmul(const pl_tensor *a, const pl_tensor *b, bool ta, bool tb,
                       const pl_tensor *out, double *ref) {
    int na = a->ndim, nb = b->ndim, no = out->ndim;
    int64_t M = out->shape[no - 2], N = out->shape[no - 1];
    int64_t K = ta ? a->shape[na - 2] : a->shape[na - 1];
    int64_t nbatch = pl_tensor_numel(out) / (M * N);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        /* decompose bi over out batch dims, map to a / b batch indices */
        int64_t rem = bi, ia = 0, ib = 0, mula = 1, mulb = 1;
        for (int d = no - 3; d >= 0; d--) {
            int64_t idx = rem % out->shape[d];
            rem /= out->shape[d];
            int da = d - (no - na), db = d - (no - nb);
            if (da >= 0) {
                ia += (a->shape[da] == 1 ? 0 : idx) * mula;
                mula *= a->shape[da];
            }
            if (db >= 0) {
                ib += (b->shape[db] == 1 ? 0 : idx) * mulb;
                mulb *= b->shape[db];
            }
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ai = ia * M * K + (ta ? k * M + m : m * K + k);
                    int64_t bj = ib * K * N + (tb ? n * K + k : k * N + n);
                    s += pl_tensor_get(a, ai) * pl_tensor_get(b, bj);
                }
                ref[(bi * M + m) * N + n] = s;
            }
    }
}

typedef struct mm_case {
    int na, nb;
    int64_t sa[4], sb[4];
    bool ta, tb;
} mm_case;

static pl_tensor *f_matmul(pl_tensor **in, int n, void *ctx) {
    mm_case *c = ctx;
    return pl_matmul(in[0], in[1], c->ta, c->tb);
}

static const mm_case mm_cases[] = {
    {2, 2, {7, 5}, {5, 3}, false, false},          {2, 2, {5, 7}, {5, 3}, true, false},
    {2, 2, {7, 5}, {3, 5}, false, true},           {2, 2, {5, 7}, {3, 5}, true, true},
    {3, 3, {2, 7, 5}, {2, 5, 3}, false, false},    /* batched */
    {3, 3, {2, 5, 7}, {2, 3, 5}, true, true},      /* batched, both transposed */
    {3, 2, {3, 7, 5}, {4, 5}, false, true},        /* shared 2-D B (nn.Linear) */
    {3, 2, {3, 5, 7}, {5, 4}, true, false},        /* shared B, transposed A */
    {4, 3, {2, 1, 7, 5}, {3, 5, 1}, false, false}, /* broadcast batch, N = 1 */
    {2, 3, {1, 5}, {2, 5, 3}, false, false},       /* shared A, M = 1 */
};

START_TEST(matmul_matches_reference_loop_all_transposes_and_batches) {
    pl_frame_begin();
    for (size_t i = 0; i < sizeof mm_cases / sizeof mm_cases[0]; i++) {
        const mm_case *c = &mm_cases[i];
        pl_tensor *a = pl_test_randn(c->na, c->sa, 10 + i),
                  *b = pl_test_randn(c->nb, c->sb, 20 + i);
        pl_tensor *o = PL_CK_NOTNULL(pl_matmul(a, b, c->ta, c->tb));
        ck_assert_int_eq(o->dtype, PL_F32);
        double ref[512];
        ck_assert_int_le(pl_tensor_numel(o), 512);
        ref_matmul(a, b, c->ta, c->tb, o, ref);
        char what[64];
        snprintf(what, sizeof what, "matmul case %zu", i);
        check_close(o, ref, pl_tensor_numel(o), 1e-5, 1e-5, what);
    }
    /* expected output shapes of the broadcast cases */
    pl_tensor *o = pl_matmul(pl_test_randn(PL_SHAPE(2, 1, 7, 5), 1),
                             pl_test_randn(PL_SHAPE(3, 5, 1), 2), false, false);
    check_shape(o, 4, (int64_t[]){2, 3, 7, 1});
    pl_frame_end();
}
END_TEST

START_TEST(matmul_gradients_match_finite_differences) {
    for (size_t i = 0; i < sizeof mm_cases / sizeof mm_cases[0]; i++) {
        mm_case c = mm_cases[i];
        pl_tensor *in[2] = {randn_g(c.na, c.sa, 30 + i), randn_g(c.nb, c.sb, 40 + i)};
        char what[64];
        snprintf(what, sizeof what, "matmul case %zu", i);
        check_grad(f_matmul, in, 2, &c, what);
        pl_tensor_release(in[0]);
        pl_tensor_release(in[1]);
    }
}
END_TEST

START_TEST(matmul_rejects_mismatched_inner_dims_and_dtypes) {
    pl_frame_begin();
    pl_tensor *a = pl_test_randn(PL_SHAPE(3, 4), 1), *b = pl_test_randn(PL_SHAPE(5, 2), 2);
    ck_assert_ptr_null(pl_matmul(a, b, false, false));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "matmul"));
    pl_tensor *b2 = pl_test_randn(PL_SHAPE(4, 2), 3);
    ck_assert_ptr_null(pl_matmul(a, pl_cast(b2, PL_BF16), false, false));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    ck_assert_ptr_null(pl_matmul(NULL, b2, false, false)); /* NULL-propagating */
    pl_tensor *x3 = pl_test_randn(PL_SHAPE(2, 3, 4), 4), *y3 = pl_test_randn(PL_SHAPE(3, 4, 2), 5);
    ck_assert_ptr_null(pl_matmul(x3, y3, false, false)); /* batch 2 vs 3 */
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST

/* bf16 x bf16 -> bf16 with f32 accumulation: equals the exact product of the
 * bf16-rounded inputs up to one bf16 rounding of the result. */
START_TEST(matmul_bf16_is_f32_accumulated_and_rounded_once) {
    pl_frame_begin();
    pl_tensor *a = pl_test_randn(PL_SHAPE(2, 9, 65), 7), *b = pl_test_randn(PL_SHAPE(65, 11), 8);
    pl_tensor *ah = pl_cast(a, PL_BF16), *bh = pl_cast(b, PL_BF16);
    pl_tensor *o = PL_CK_NOTNULL(pl_matmul(ah, bh, false, false));
    ck_assert_int_eq(o->dtype, PL_BF16);
    check_shape(o, 3, (int64_t[]){2, 9, 11});
    double ref[2 * 9 * 11];
    ref_matmul(ah, bh, false, false, o, ref);
    for (int i = 0; i < 2 * 9 * 11; i++) {
        double v = pl_tensor_get(o, i);
        ck_assert_msg(fabs(v - ref[i]) <= fabs(ref[i]) * 0x1p-8 + 1e-5,
                      "bf16 matmul element %d = %g, exact %g", i, v, ref[i]);
    }
    /* and within bf16 tolerance of the f32 product of the unrounded inputs */
    pl_tensor *o32 = pl_matmul(a, b, false, false);
    ck_assert_double_le(pl_test_max_abs_diff(o, o32), 0.15);
    /* transposed bf16 path */
    pl_tensor *ot = PL_CK_NOTNULL(pl_matmul(bh, ah, true, true)); /* [2, 11, 9] = (a b)^T */
    for (int bi = 0; bi < 2; bi++)
        for (int m = 0; m < 9; m++)
            for (int n = 0; n < 11; n++)
                ck_assert_float_eq(pl_tensor_get(ot, (bi * 11 + n) * 9 + m),
                                   pl_tensor_get(o, (bi * 9 + m) * 11 + n));
    pl_frame_end();
}
END_TEST

/* The nn.Linear shape x @ W^T with bf16 operands takes the AVX-512 BF16
 * kernel where the CPU has it: same contract (f32 accumulation, one rounding),
 * odd K (last pair padded), N not a multiple of 16, M not a multiple of 4. */
START_TEST(matmul_bf16_linear_shape_matches_exact_product) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 7, 171), 21), *w = pl_test_randn(PL_SHAPE(37, 171), 22);
    pl_tensor *xh = pl_cast(x, PL_BF16), *wh = pl_cast(w, PL_BF16);
    pl_tensor *o = PL_CK_NOTNULL(pl_matmul(xh, wh, false, true));
    check_shape(o, 3, (int64_t[]){2, 7, 37});
    for (int m = 0; m < 14; m++)
        for (int n = 0; n < 37; n++) {
            double ref = 0;
            for (int k = 0; k < 171; k++)
                ref += pl_tensor_get(xh, m * 171 + k) * pl_tensor_get(wh, n * 171 + k);
            double v = pl_tensor_get(o, m * 37 + n);
            ck_assert_msg(fabs(v - ref) <= fabs(ref) * 0x1p-8 + 1e-4,
                          "bf16 x @ W^T [%d, %d] = %g, exact %g", m, n, v, ref);
        }
    pl_frame_end();
}
END_TEST

static pl_tensor *f_mm_via_bf16(pl_tensor **in, int n, void *ctx) {
    (void)ctx;
    return pl_matmul(pl_cast(in[0], PL_BF16), pl_cast(in[1], PL_BF16), false, true);
}

START_TEST(matmul_bf16_gradients_reach_f32_leaves) {
    pl_tensor *a = randn_g(PL_SHAPE(3, 7, 33), 11), *b = randn_g(PL_SHAPE(5, 33), 12);
    pl_frame_begin();
    pl_tensor *loss =
        pl_sum(pl_cast(f_mm_via_bf16((pl_tensor *[]){a, b}, 2, NULL), PL_F32), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    ck_assert_ptr_nonnull(a->grad);
    ck_assert_ptr_nonnull(b->grad);
    ck_assert_int_eq(a->grad->dtype, PL_F32);
    /* d sum(A B^T)/dA[i,k] = sum_n B[n,k] (of bf16-rounded B) */
    for (int64_t i = 0; i < 3 * 7; i++)
        for (int64_t k = 0; k < 33; k++) {
            double s = 0;
            for (int64_t nn = 0; nn < 5; nn++)
                s += pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(b, nn * 33 + k)));
            ck_assert_double_eq_tol(pl_tensor_get(a->grad, i * 33 + k), s, 1e-4);
        }
    for (int64_t nn = 0; nn < 5; nn++)
        for (int64_t k = 0; k < 33; k++) {
            double s = 0;
            for (int64_t i = 0; i < 21; i++)
                s += pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(a, i * 33 + k)));
            ck_assert_double_eq_tol(pl_tensor_get(b->grad, nn * 33 + k), s, 1e-4);
        }
    pl_tensor_release(a);
    pl_tensor_release(b);
}
END_TEST

START_TEST(autocast_bf16_runs_matmul_and_linear_in_bf16) {
    pl_tensor *x = randn_g(PL_SHAPE(4, 6), 21), *w = randn_g(PL_SHAPE(3, 6), 22),
              *bias = randn_g(PL_SHAPE(3), 23);
    pl_frame_begin();
    pl_tensor *ref = pl_linear(x, w, bias);
    pl_tape_clear();
    PL_CK_OK(pl_autocast_begin(PL_BF16));
    pl_tensor *y = pl_linear(x, w, bias);
    pl_tensor *z = pl_matmul(x, w, false, true);
    pl_autocast_end();
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(y->dtype, PL_BF16);
    ck_assert_int_eq(z->dtype, PL_BF16);
    ck_assert_double_le(pl_test_max_abs_diff(y, ref), 0.08);
    PL_CK_OK(pl_backward(pl_sum(y, PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    ck_assert_ptr_nonnull(w->grad);
    ck_assert_int_eq(w->grad->dtype, PL_F32);
    /* d sum(x W^T + b)/db = N rows */
    for (int j = 0; j < 3; j++)
        ck_assert_double_eq_tol(pl_tensor_get(bias->grad, j), 4.0, 1e-6);
    pl_tensor_release(x);
    pl_tensor_release(w);
    pl_tensor_release(bias);
}
END_TEST

static pl_tensor *f_linear(pl_tensor **in, int n, void *ctx) {
    return pl_linear(in[0], in[1], n > 2 ? in[2] : NULL);
}

START_TEST(linear_matches_reference_and_gradients) {
    pl_tensor *in[3] = {randn_g(PL_SHAPE(2, 7, 5), 31), randn_g(PL_SHAPE(3, 5), 32),
                        randn_g(PL_SHAPE(3), 33)};
    pl_frame_begin();
    pl_tensor *y = PL_CK_NOTNULL(pl_linear(in[0], in[1], in[2]));
    check_shape(y, 3, (int64_t[]){2, 7, 3});
    for (int r = 0; r < 14; r++)
        for (int o = 0; o < 3; o++) {
            double s = pl_tensor_get(in[2], o);
            for (int k = 0; k < 5; k++)
                s += pl_tensor_get(in[0], r * 5 + k) * pl_tensor_get(in[1], o * 5 + k);
            ck_assert_double_eq_tol(pl_tensor_get(y, r * 3 + o), s, 1e-5);
        }
    /* 1-D input, as nn.Linear accepts: [5] -> [3] */
    pl_tensor *x1 = pl_test_randn(PL_SHAPE(5), 34);
    pl_tensor *y1 = PL_CK_NOTNULL(pl_linear(x1, in[1], in[2]));
    check_shape(y1, 1, (int64_t[]){3});
    for (int o = 0; o < 3; o++) {
        double s = pl_tensor_get(in[2], o);
        for (int k = 0; k < 5; k++)
            s += pl_tensor_get(x1, k) * pl_tensor_get(in[1], o * 5 + k);
        ck_assert_double_eq_tol(pl_tensor_get(y1, o), s, 1e-5);
    }
    pl_tape_clear();
    pl_frame_end();
    check_grad(f_linear, in, 3, NULL, "linear with bias");
    check_grad(f_linear, in, 2, NULL, "linear without bias");
    for (int i = 0; i < 3; i++)
        pl_tensor_release(in[i]);
}
END_TEST

/* ---- broadcasting arithmetic ------------------------------------------------- */

static const char *bin_names[] = {"add", "sub", "mul", "div"};

static pl_tensor *f_binary(pl_tensor **in, int n, void *ctx) {
    switch (*(int *)ctx) {
    case 0:
        return pl_add(in[0], in[1]);
    case 1:
        return pl_sub(in[0], in[1]);
    case 2:
        return pl_mul(in[0], in[1]);
    default:
        return pl_div(in[0], in[1]);
    }
}

static double ref_bin(int op, double x, double y) {
    return op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
}

START_TEST(binary_ops_broadcast_forward) {
    pl_frame_begin();
    /* [7,1,5] (op) [3,5] -> [7,3,5] */
    pl_tensor *a = pl_test_randn(PL_SHAPE(7, 1, 5), 41);
    pl_tensor *b = pl_test_rand(PL_SHAPE(3, 5), 0.5, 2.0, 42);
    for (int op = 0; op < 4; op++) {
        pl_tensor *o = PL_CK_NOTNULL(f_binary((pl_tensor *[]){a, b}, 2, &op));
        check_shape(o, 3, (int64_t[]){7, 3, 5});
        double ref[105];
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 5; k++)
                    ref[(i * 3 + j) * 5 + k] =
                        ref_bin(op, pl_tensor_get(a, i * 5 + k), pl_tensor_get(b, j * 5 + k));
        check_close(o, ref, 105, 1e-6, 1e-6, bin_names[op]);
        /* reversed operand order: [3,5] (op) [7,1,5] */
        pl_tensor *o2 = PL_CK_NOTNULL(f_binary((pl_tensor *[]){b, a}, 2, &op));
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < 3; j++)
                for (int k = 0; k < 5; k++)
                    ref[(i * 3 + j) * 5 + k] =
                        ref_bin(op, pl_tensor_get(b, j * 5 + k), pl_tensor_get(a, i * 5 + k));
        check_close(o2, ref, 105, 1e-6, 1e-6, bin_names[op]);
    }
    /* 0-dim scalar operand */
    pl_tensor *s = pl_tensor_scalar(2.5f, PL_CPU);
    pl_tensor *o = pl_mul(a, s);
    check_shape(o, 3, (int64_t[]){7, 1, 5});
    for (int i = 0; i < 35; i++)
        ck_assert_double_eq_tol(pl_tensor_get(o, i), 2.5 * pl_tensor_get(a, i), 1e-6);
    /* incompatible shapes */
    ck_assert_ptr_null(pl_add(pl_test_randn(PL_SHAPE(3, 4), 1), pl_test_randn(PL_SHAPE(5), 2)));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST


/* Broadcast forward against a plain index-arithmetic reference, over shape
 * pairs whose dims the kernel merges (or must not merge). */
START_TEST(binary_ops_broadcast_forward_merged_dims) {
    static const int64_t shapes[][2][4] = {
        {{4, 3, 5}, {4, 3, 1}}, {{6, 2, 8}, {2, 8}},     {{2, 3, 4, 5}, {2, 1, 4, 5}},
        {{3, 1, 4}, {1, 5, 1}}, {{2, 1, 3, 1}, {4, 1, 2}}, {{7, 1}, {7, 9}},
    };
    static const int nds[][2] = {{3, 3}, {3, 2}, {4, 4}, {3, 3}, {4, 3}, {2, 2}};
    pl_frame_begin();
    for (int c = 0; c < 6; c++) {
        pl_tensor *a = pl_test_randn(nds[c][0], shapes[c][0], 80 + c);
        pl_tensor *b = pl_test_rand(nds[c][1], shapes[c][1], 0.5, 2.0, 90 + c);
        int nd = nds[c][0] > nds[c][1] ? nds[c][0] : nds[c][1];
        int64_t os[4], as[4], bs[4]; /* right-aligned shapes */
        for (int d = 0; d < nd; d++) {
            int da = d - (nd - nds[c][0]), db = d - (nd - nds[c][1]);
            as[d] = da >= 0 ? shapes[c][0][da] : 1;
            bs[d] = db >= 0 ? shapes[c][1][db] : 1;
            os[d] = as[d] > bs[d] ? as[d] : bs[d];
        }
        int64_t n = 1;
        for (int d = 0; d < nd; d++) n *= os[d];
        for (int op = 0; op < 4; op++) {
            pl_tensor *o = PL_CK_NOTNULL(f_binary((pl_tensor *[]){a, b}, 2, &op));
            check_shape(o, nd, os);
            double ref[512];
            ck_assert_int_le(n, 512);
            for (int64_t i = 0; i < n; i++) {
                int64_t r = i, ia = 0, ib = 0, sa = 1, sb = 1;
                for (int d = nd - 1; d >= 0; d--) {
                    int64_t k = r % os[d];
                    r /= os[d];
                    ia += (as[d] == 1 ? 0 : k) * sa;
                    ib += (bs[d] == 1 ? 0 : k) * sb;
                    sa *= as[d];
                    sb *= bs[d];
                }
                ref[i] = ref_bin(op, pl_tensor_get(a, ia), pl_tensor_get(b, ib));
            }
            char what[64];
            snprintf(what, sizeof what, "%s case %d", bin_names[op], c);
            check_close(o, ref, n, 1e-6, 1e-6, what);
        }
    }
    pl_frame_end();
}
END_TEST


/* ELU's exp runs on a polynomial kernel: forward and gradient against
 * double expm1 / exp over [-100, 5] (incl. tiny |x| where expm1 matters and
 * the clamp below -87), and NaN still propagates. */
START_TEST(elu_matches_double_expm1) {
    enum { N = 4099 };
    static float v[N];
    for (int i = 0; i < N - 3; i++) v[i] = -100.0f + 105.0f * (float)i / (N - 4);
    v[N - 3] = -1e-7f;
    v[N - 2] = -3e-4f;
    v[N - 1] = NAN;
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(N), v, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_frame_begin();
    pl_tensor *y = PL_CK_NOTNULL(pl_elu(x, 1.3));
    double worst = 0, worst_g = 0;
    for (int i = 0; i < N - 1; i++) {
        double xv = v[i], ref = xv > 0 ? xv : 1.3 * expm1(xv), got = pl_tensor_get(y, i);
        double err = fabs(got - ref) / fmax(fabs(ref), 1e-30);
        if (xv != 0 && err > worst) worst = err;
    }
    ck_assert_msg(worst < 4e-7, "ELU forward: max relative error %g vs double expm1", worst);
    ck_assert_msg(isnan(pl_tensor_get(y, N - 1)), "ELU(NaN) = %g, expected NaN", pl_tensor_get(y, N - 1));
    /* d/dx of sum(ELU(x)) = 1 (x > 0) or 1.3 e^x */
    pl_tensor *fin = pl_slice(y, 0, 0, N - 1);
    PL_CK_OK(pl_backward(pl_sum(fin, PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    for (int i = 0; i < N - 1; i++) {
        double xv = v[i], ref = xv > 0 ? 1.0 : 1.3 * exp(xv), got = pl_tensor_get(x->grad, i);
        double err = fabs(got - ref) / fmax(ref, 1e-30);
        if (ref > 1e-30 && err > worst_g) worst_g = err;
    }
    ck_assert_msg(worst_g < 4e-7, "ELU gradient: max relative error %g vs double exp", worst_g);
    pl_tensor_release(x);
}
END_TEST

START_TEST(binary_ops_gradients_reduce_over_broadcast_dims) {
    static const int64_t shapes[][2][4] = {
        {{7, 1, 5}, {3, 5}},
        {{1, 7}, {33, 1}},
        {{2, 3, 7}, {2, 3, 7}},
        {{1}, {7, 3}},
        {{4, 3, 5}, {4, 3, 1}},       /* GAT messages: coalesced to [12, 5] x [12, 1] */
        {{2, 3, 4, 5}, {2, 1, 4, 5}}, /* only the last two dims merge */
        {{5, 1, 1}, {5, 3, 4}},
    };
    static const int nds[][2] = {{3, 2}, {2, 2}, {3, 3}, {1, 2}, {3, 3}, {4, 4}, {3, 3}};
    for (int s = 0; s < 7; s++)
        for (int op = 0; op < 4; op++) {
            pl_tensor *in[2] = {randn_g(nds[s][0], shapes[s][0], 50 + s),
                                pl_test_rand(nds[s][1], shapes[s][1], 0.5, 2.0, 60 + s)};
            pl_tensor_set_requires_grad(in[1], true);
            char what[64];
            snprintf(what, sizeof what, "%s shapes case %d", bin_names[op], s);
            check_grad(f_binary, in, 2, &op, what);
            pl_tensor_release(in[0]);
            pl_tensor_release(in[1]);
        }
}
END_TEST

START_TEST(same_tensor_twice_gets_both_gradients) {
    pl_tensor *x = randn_g(PL_SHAPE(7), 71);
    pl_frame_begin();
    PL_CK_OK(pl_backward(pl_sum(pl_mul(x, x), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    for (int i = 0; i < 7; i++)
        ck_assert_double_eq_tol(pl_tensor_get(x->grad, i), 2 * pl_tensor_get(x, i), 1e-6);
    pl_tensor_release(x);
}
END_TEST

static pl_tensor *f_scalar_ops(pl_tensor **in, int n, void *ctx) {
    return pl_add_scalar(pl_scale(in[0], -1.75), 0.5);
}

START_TEST(scale_and_add_scalar) {
    pl_tensor *x = randn_g(PL_SHAPE(33), 72);
    pl_frame_begin();
    pl_tensor *y = f_scalar_ops(&x, 1, NULL);
    for (int i = 0; i < 33; i++)
        ck_assert_double_eq_tol(pl_tensor_get(y, i), -1.75 * pl_tensor_get(x, i) + 0.5, 1e-6);
    pl_tape_clear();
    pl_frame_end();
    check_grad(f_scalar_ops, &x, 1, NULL, "scale/add_scalar");
    pl_tensor_release(x);
}
END_TEST

START_TEST(half_dtypes_promote_like_torch) {
    pl_frame_begin();
    pl_tensor *a = pl_test_randn(PL_SHAPE(3, 5), 73), *b = pl_test_randn(PL_SHAPE(5), 74);
    pl_tensor *ah = pl_cast(a, PL_BF16), *bh = pl_cast(b, PL_BF16);
    pl_tensor *s = pl_add(ah, bh);
    ck_assert_int_eq(s->dtype, PL_BF16);
    pl_tensor *m = pl_mul(ah, b);
    ck_assert_int_eq(m->dtype, PL_F32);
    for (int i = 0; i < 15; i++) {
        double e = pl_bf16_to_f32(
            pl_f32_to_bf16((float)(pl_tensor_get(ah, i) + pl_tensor_get(bh, i % 5))));
        ck_assert_double_eq(pl_tensor_get(s, i), e);
        ck_assert_double_eq_tol(pl_tensor_get(m, i), pl_tensor_get(ah, i) * pl_tensor_get(b, i % 5),
                                1e-6);
    }
    pl_tensor *g = pl_gelu(pl_cast(a, PL_F16), false);
    ck_assert_int_eq(g->dtype, PL_F16);
    pl_frame_end();
}
END_TEST

/* ---- reductions ------------------------------------------------------------------ */

typedef struct red_case {
    int dim;
    bool keep, mean;
} red_case;

static pl_tensor *f_reduce(pl_tensor **in, int n, void *ctx) {
    red_case *c = ctx;
    return c->mean ? pl_mean(in[0], c->dim, c->keep) : pl_sum(in[0], c->dim, c->keep);
}

START_TEST(sum_and_mean_over_dims) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(3, 7, 5), 80);
    for (int dim = 0; dim < 3; dim++)
        for (int mean = 0; mean < 2; mean++)
            for (int keep = 0; keep < 2; keep++) {
                red_case c = {dim == 2 ? -1 : dim, keep, mean};
                pl_tensor *o = PL_CK_NOTNULL(f_reduce(&x, 1, &c));
                int64_t shp[3] = {3, 7, 5};
                int64_t n = shp[dim];
                ck_assert_int_eq(o->ndim, keep ? 3 : 2);
                if (keep) ck_assert_int_eq(o->shape[dim], 1);
                double ref[35];
                int idx = 0;
                int64_t st[3] = {35, 5, 1};
                for (int64_t i = 0; i < 3; i++)
                    for (int64_t j = 0; j < 7; j++)
                        for (int64_t k = 0; k < 5; k++) {
                            int64_t pos[3] = {i, j, k};
                            if (pos[dim] != 0) continue;
                            double s = 0;
                            for (int64_t r = 0; r < n; r++)
                                s += pl_tensor_get(x, i * 35 + j * 5 + k + r * st[dim]);
                            ref[idx++] = mean ? s / n : s;
                        }
                check_close(o, ref, idx, 1e-5, 1e-5, mean ? "mean" : "sum");
            }
    pl_tensor *all = pl_sum(x, PL_ALL_DIMS, false);
    ck_assert_int_eq(all->ndim, 0);
    double s = 0;
    for (int i = 0; i < 105; i++)
        s += pl_tensor_get(x, i);
    ck_assert_double_eq_tol(pl_tensor_item(all), s, 1e-4);
    pl_tensor *allk = pl_mean(x, PL_ALL_DIMS, true);
    check_shape(allk, 3, (int64_t[]){1, 1, 1});
    ck_assert_double_eq_tol(pl_tensor_item(allk), s / 105, 1e-5);
    ck_assert_ptr_null(pl_sum(x, 3, false));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST

START_TEST(sum_and_mean_gradients) {
    pl_tensor *x = randn_g(PL_SHAPE(3, 7, 5), 81);
    int dims[] = {0, 1, -1, PL_ALL_DIMS};
    for (int d = 0; d < 4; d++)
        for (int mean = 0; mean < 2; mean++) {
            red_case c = {dims[d], d % 2 == 0, mean};
            check_grad(f_reduce, &x, 1, &c, mean ? "mean" : "sum");
        }
    pl_tensor_release(x);
}
END_TEST

/* ---- activations ----------------------------------------------------------------- */

enum {
    A_RELU,
    A_LEAKY,
    A_ELU,
    A_GELU,
    A_GELU_T,
    A_SILU,
    A_SIGM,
    A_TANH,
    A_EXP,
    A_LOG,
    A_SQ,
    A_SQRT,
    A_COUNT
};
static const char *act_names[] = {"relu",    "leaky_relu", "elu", "gelu", "gelu_tanh", "silu",
                                  "sigmoid", "tanh",       "exp", "log",  "square",    "sqrt"};

static pl_tensor *f_act(pl_tensor **in, int n, void *ctx) {
    pl_tensor *x = in[0];
    switch (*(int *)ctx) {
    case A_RELU:
        return pl_relu(x);
    case A_LEAKY:
        return pl_leaky_relu(x, 0.07);
    case A_ELU:
        return pl_elu(x, 1.3);
    case A_GELU:
        return pl_gelu(x, false);
    case A_GELU_T:
        return pl_gelu(x, true);
    case A_SILU:
        return pl_silu(x);
    case A_SIGM:
        return pl_sigmoid(x);
    case A_TANH:
        return pl_tanh(x);
    case A_EXP:
        return pl_exp(x);
    case A_LOG:
        return pl_log(x);
    case A_SQ:
        return pl_square(x);
    default:
        return pl_sqrt(x);
    }
}

/* PyTorch's formulas, in double. */
static double ref_act(int op, double x) {
    switch (op) {
    case A_RELU:
        return x > 0 ? x : 0;
    case A_LEAKY:
        return x > 0 ? x : 0.07 * x;
    case A_ELU:
        return x > 0 ? x : 1.3 * (exp(x) - 1);
    case A_GELU:
        return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case A_GELU_T:
        return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case A_SILU:
        return x / (1 + exp(-x));
    case A_SIGM:
        return 1 / (1 + exp(-x));
    case A_TANH:
        return tanh(x);
    case A_EXP:
        return exp(x);
    case A_LOG:
        return log(x);
    case A_SQ:
        return x * x;
    default:
        return sqrt(x);
    }
}

START_TEST(activations_match_torch_formulas) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(7, 33), 90);
    pl_tensor *xp = pl_test_rand(PL_SHAPE(7, 33), 0.1, 3.0, 91); /* log, sqrt domain */
    for (int op = 0; op < A_COUNT; op++) {
        pl_tensor *in = op == A_LOG || op == A_SQRT ? xp : x;
        pl_tensor *o = PL_CK_NOTNULL(f_act(&in, 1, &op));
        check_shape(o, 2, (int64_t[]){7, 33});
        double ref[231];
        for (int i = 0; i < 231; i++)
            ref[i] = ref_act(op, pl_tensor_get(in, i));
        check_close(o, ref, 231, 1e-6, 1e-5, act_names[op]);
    }
    /* hand values: gelu(1) = 0.841344746, gelu_tanh(1) = 0.841191990, silu(1) = 0.731058579 */
    pl_tensor *one = pl_tensor_from_data(PL_F32, PL_SHAPE(1), (float[]){1.0f}, PL_CPU);
    ck_assert_double_eq_tol(pl_tensor_item(pl_gelu(one, false)), 0.841344746, 1e-6);
    ck_assert_double_eq_tol(pl_tensor_item(pl_gelu(one, true)), 0.841191990, 1e-6);
    ck_assert_double_eq_tol(pl_tensor_item(pl_silu(one)), 0.731058579, 1e-6);
    pl_frame_end();
}
END_TEST

START_TEST(activation_gradients) {
    for (int op = 0; op < A_COUNT; op++) {
        pl_tensor *x = op == A_LOG || op == A_SQRT ? pl_test_rand(PL_SHAPE(7, 33), 0.3, 3.0, 92)
                                                   : pl_test_randn(PL_SHAPE(7, 33), 93);
        /* keep central differences away from the kink at 0 (relu, leaky_relu, elu) */
        float *xd = pl_tensor_f32(x);
        for (int i = 0; i < 231; i++)
            if (fabsf(xd[i]) < 0.01f) xd[i] = 0.5f;
        pl_tensor_set_requires_grad(x, true);
        check_grad(f_act, &x, 1, &op, act_names[op]);
        pl_tensor_release(x);
    }
}
END_TEST

/* ---- swiglu ---------------------------------------------------------------------------- */

static pl_tensor *f_swiglu(pl_tensor **in, int n, void *ctx) { return pl_swiglu(in[0], in[1]); }

/* Values and gradients of pl_swiglu(gate, up) and of pl_mul(pl_silu(gate), up)
 * on the same inputs of dtype dt, under the loss sum(out * w): the same bits
 * (the fused op is a memory saving, not a numerics change). */
static void swiglu_vs_unfused(pl_dtype dt, uint64_t seed) {
    pl_frame_begin();
    pl_tensor *g0 = pl_test_randn(PL_SHAPE(5, 37), seed), *u0 = pl_test_randn(PL_SHAPE(5, 37), seed + 1);
    pl_tensor *w = pl_test_randn(PL_SHAPE(5, 37), seed + 2);
    float out[2][185], dg[2][185], du[2][185];
    for (int fused = 0; fused < 2; fused++) {
        pl_tensor *g = PL_CK_NOTNULL(pl_tensor_to(g0, dt, PL_CPU));
        pl_tensor *u = PL_CK_NOTNULL(pl_tensor_to(u0, dt, PL_CPU));
        pl_tensor_set_requires_grad(g, true);
        pl_tensor_set_requires_grad(u, true);
        pl_tensor *y = PL_CK_NOTNULL(fused ? pl_swiglu(g, u) : pl_mul(pl_silu(g), u));
        ck_assert_int_eq(y->dtype, dt);
        pl_tensor *y32 = PL_CK_NOTNULL(pl_cast(y, PL_F32));
        memcpy(out[fused], pl_tensor_f32(y32), sizeof out[0]);
        PL_CK_OK(pl_backward(pl_sum(pl_mul(y32, w), PL_ALL_DIMS, false), 1.0));
        memcpy(dg[fused], pl_tensor_f32(g->grad), sizeof dg[0]);
        memcpy(du[fused], pl_tensor_f32(u->grad), sizeof du[0]);
    }
    ck_assert_msg(!memcmp(out[0], out[1], sizeof out[0]), "swiglu %s: values differ from mul(silu)",
                  pl_dtype_name(dt));
    ck_assert_msg(!memcmp(dg[0], dg[1], sizeof dg[0]), "swiglu %s: d gate differs",
                  pl_dtype_name(dt));
    ck_assert_msg(!memcmp(du[0], du[1], sizeof du[0]), "swiglu %s: d up differs",
                  pl_dtype_name(dt));
    pl_frame_end();
}

/* silu(gate) * up (transformers' LlamaMLP): values against double, gradients
 * of both inputs against central differences, bit-identical to the unfused
 * chain in f32, bf16 and f16, shapes that differ refused. */
START_TEST(swiglu_matches_silu_times_up) {
    pl_frame_begin();
    pl_tensor *g = pl_test_randn(PL_SHAPE(7, 33), 95), *u = pl_test_randn(PL_SHAPE(7, 33), 96);
    pl_tensor *y = PL_CK_NOTNULL(pl_swiglu(g, u));
    check_shape(y, 2, (int64_t[]){7, 33});
    double ref[231];
    for (int i = 0; i < 231; i++) {
        double x = pl_tensor_get(g, i);
        ref[i] = x / (1 + exp(-x)) * pl_tensor_get(u, i);
    }
    check_close(y, ref, 231, 1e-6, 1e-5, "swiglu");
    pl_tensor *bad = pl_test_randn(PL_SHAPE(7, 32), 97);
    ck_assert_ptr_null(pl_swiglu(g, bad));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_error_clear();
    pl_frame_end();
    pl_tensor *in[2] = {randn_g(PL_SHAPE(7, 33), 98), randn_g(PL_SHAPE(7, 33), 99)};
    check_grad(f_swiglu, in, 2, NULL, "swiglu");
    pl_tensor_release(in[0]);
    pl_tensor_release(in[1]);
    swiglu_vs_unfused(PL_F32, 100);
    swiglu_vs_unfused(PL_BF16, 110);
    swiglu_vs_unfused(PL_F16, 120);
}
END_TEST

/* ---- lora_add ----------------------------------------------------------------------------- */

static pl_tensor *f_lora(pl_tensor **in, int n, void *ctx) { /* y, x, A, B[, gexp] */
    return pl_lora_add(in[0], in[1], in[2], in[3], n > 4 ? in[4] : NULL, 0.75);
}
static pl_tensor *f_lora_no_y(pl_tensor **in, int n, void *ctx) { /* x, A, B, gexp */
    return pl_lora_add(NULL, in[0], in[1], in[2], in[3], -1.5);
}

/* The unfused chain ilora ran before pl_lora_add (ilora_layers.c):
 * y + scale * linear(linear(x, A) * gexp, B). */
static pl_tensor *lora_chain(pl_tensor *y, pl_tensor *x, pl_tensor *a, pl_tensor *b, pl_tensor *g,
                             double scale) {
    pl_tensor *t = pl_linear(x, a, NULL);
    if (g) t = pl_mul(t, g);
    pl_tensor *d = pl_scale(pl_linear(t, b, NULL), scale);
    return y ? pl_add(y, d) : d;
}

/* Values and the gradients of every input of pl_lora_add and of the chain,
 * on the same inputs (x, y of dtype dt; A, B, gexp f32 leaves), under the
 * loss sum(out * w), with autocast `ac` (PL_F32: off). Tolerances: f32, the
 * chain's float reassociation; bf16 / f16, the fused op skips the chain's
 * two roundings of the branch (u B^T and its scaled copy) to the half
 * dtype, so the outputs differ by about one half ulp of the branch. */
static void lora_vs_chain(pl_dtype dt, pl_dtype ac, const int64_t *gshape, double atol, double rtol,
                          uint64_t seed) {
    pl_frame_begin();
    if (ac != PL_F32) PL_CK_OK(pl_autocast_begin(ac));
    pl_tensor *x0 = pl_test_randn(PL_SHAPE(3, 5, 24), seed);
    pl_tensor *y0 = pl_test_randn(PL_SHAPE(3, 5, 20), seed + 1);
    pl_tensor *w = pl_test_randn(PL_SHAPE(3, 5, 20), seed + 2);
    pl_tensor *g0 = pl_test_randn(3, gshape, seed + 3);
    pl_tensor *a0 = pl_test_randn(PL_SHAPE(8, 24), seed + 4);
    pl_tensor *b0 = pl_test_randn(PL_SHAPE(20, 8), seed + 5);
    int64_t ng = pl_tensor_numel(g0);
    double out[2][300], dx[2][360], dy[2][300], da[2][192], db[2][160], dg[2][120];
    for (int fused = 0; fused < 2; fused++) {
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(x0, dt, PL_CPU));
        pl_tensor *y = PL_CK_NOTNULL(pl_tensor_to(y0, dt, PL_CPU));
        pl_tensor *g = PL_CK_NOTNULL(pl_tensor_to(g0, PL_F32, PL_CPU));
        pl_tensor *a = PL_CK_NOTNULL(pl_tensor_to(a0, ac == PL_F32 ? dt : PL_F32, PL_CPU));
        pl_tensor *b = PL_CK_NOTNULL(pl_tensor_to(b0, ac == PL_F32 ? dt : PL_F32, PL_CPU));
        pl_tensor *ts[5] = {x, y, g, a, b};
        for (int i = 0; i < 5; i++)
            pl_tensor_set_requires_grad(ts[i], true);
        /* gexp in the chain: f32 (pl_mul promotes the half t to f32) */
        pl_tensor *o =
            PL_CK_NOTNULL(fused ? pl_lora_add(y, x, a, b, g, 0.5) : lora_chain(y, x, a, b, g, 0.5));
        ck_assert_msg(fused == 0 || o->dtype == y->dtype || o->dtype == PL_F32, "dtype");
        pl_tensor *o32 = PL_CK_NOTNULL(pl_cast(o, PL_F32));
        for (int i = 0; i < 300; i++)
            out[fused][i] = pl_tensor_get(o32, i);
        PL_CK_OK(pl_backward(pl_sum(pl_mul(o32, w), PL_ALL_DIMS, false), 1.0));
        for (int i = 0; i < 360; i++)
            dx[fused][i] = pl_tensor_get(x->grad, i);
        for (int i = 0; i < 300; i++)
            dy[fused][i] = pl_tensor_get(y->grad, i);
        for (int i = 0; i < 192; i++)
            da[fused][i] = pl_tensor_get(a->grad, i);
        for (int i = 0; i < 160; i++)
            db[fused][i] = pl_tensor_get(b->grad, i);
        for (int i = 0; i < ng; i++)
            dg[fused][i] = pl_tensor_get(g->grad, i);
    }
    if (ac != PL_F32) pl_autocast_end();
    struct {
        const char *what;
        const double *f, *c;
        int n;
    } cmp[] = {{"out", out[1], out[0], 300}, {"dx", dx[1], dx[0], 360},
               {"dy", dy[1], dy[0], 300},    {"dA", da[1], da[0], 192},
               {"dB", db[1], db[0], 160},    {"dgexp", dg[1], dg[0], (int)ng}};
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < cmp[k].n; i++)
            ck_assert_msg(fabs(cmp[k].f[i] - cmp[k].c[i]) <= atol + rtol * fabs(cmp[k].c[i]),
                          "lora_add %s (autocast %s), gexp [%lld,%lld,%lld]: %s[%d] = %.8g, the "
                          "chain's %.8g",
                          pl_dtype_name(dt), pl_dtype_name(ac), (long long)gshape[0],
                          (long long)gshape[1], (long long)gshape[2], cmp[k].what, i, cmp[k].f[i],
                          cmp[k].c[i]);
    pl_frame_end();
}

/* pl_lora_add: every input's gradient against central differences (per
 * position and per row gates, without y, plain LoRA), values and gradients
 * equal to the chain it replaces in f32, under bf16 / f16 autocast and with
 * bf16 operands, the saved t, and the shape / dtype errors. */
START_TEST(lora_add_matches_the_chain_and_central_differences) {
    pl_tensor *in[5] = {randn_g(PL_SHAPE(2, 3, 6), 301), randn_g(PL_SHAPE(2, 3, 5), 302),
                        randn_g(PL_SHAPE(4, 5), 303), randn_g(PL_SHAPE(6, 4), 304),
                        randn_g(PL_SHAPE(2, 3, 4), 305)};
    check_grad(f_lora, in, 5, NULL, "lora_add, gexp per position");
    check_grad(f_lora, in, 4, NULL, "lora_add, plain LoRA");
    pl_tensor *gr = randn_g(PL_SHAPE(2, 1, 4), 306);
    pl_tensor *in2[5] = {in[0], in[1], in[2], in[3], gr};
    check_grad(f_lora, in2, 5, NULL, "lora_add, gexp per row");
    pl_tensor *in3[4] = {in[1], in[2], in[3], gr};
    check_grad(f_lora_no_y, in3, 4, NULL, "lora_add without y");
    for (int i = 0; i < 5; i++)
        pl_tensor_release(in[i]);
    pl_tensor_release(gr);

    static const int64_t per_pos[3] = {3, 5, 8}, per_row[3] = {3, 1, 8};
    lora_vs_chain(PL_F32, PL_F32, per_pos, 1e-5, 1e-5, 310);
    lora_vs_chain(PL_F32, PL_F32, per_row, 1e-5, 1e-5, 320);
    /* bf16-mixed (f32 x, y; A, B f32 leaves cast by autocast) and bf16-true-like
     * (bf16 x, y under autocast): one bf16 ulp of |out| ~ 4e-3 relative */
    lora_vs_chain(PL_F32, PL_BF16, per_pos, 2e-2, 1e-2, 330);
    lora_vs_chain(PL_BF16, PL_BF16, per_row, 3e-2, 1.6e-2, 340);
    lora_vs_chain(PL_F32, PL_F16, per_pos, 4e-3, 2e-3, 350);

    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 5), 1), *a = pl_test_randn(PL_SHAPE(4, 5), 2);
    pl_tensor *b = pl_test_randn(PL_SHAPE(6, 4), 3), *y = pl_test_randn(PL_SHAPE(2, 3, 6), 4);
    pl_tensor *o = PL_CK_NOTNULL(pl_lora_add(y, x, a, b, NULL, 1.0));
    check_shape(o, 3, (int64_t[]){2, 3, 6});
    ck_assert_int_eq(o->dtype, PL_F32);
    /* y + 2 x A^T B^T against a double loop */
    double ref[36];
    for (int n = 0; n < 6; n++)
        for (int j = 0; j < 6; j++) {
            double s = 0;
            for (int r = 0; r < 4; r++) {
                double t = 0;
                for (int d = 0; d < 5; d++)
                    t += pl_tensor_get(x, n * 5 + d) * pl_tensor_get(a, r * 5 + d);
                s += t * pl_tensor_get(b, j * 4 + r);
            }
            ref[n * 6 + j] = pl_tensor_get(y, n * 6 + j) + s;
        }
    check_close(o, ref, 36, 1e-5, 1e-5, "lora_add");
    struct {
        pl_tensor *y, *x, *a, *b, *g;
        pl_status want;
    } bad[] = {
        {y, x, b, b, NULL, PL_ERR_SHAPE},                                   /* A [6, 4] for D = 5 */
        {pl_test_randn(PL_SHAPE(2, 3, 7), 5), x, a, b, NULL, PL_ERR_SHAPE}, /* y's last dim */
        {y, x, a, b, pl_test_randn(PL_SHAPE(2, 3, 5), 6), PL_ERR_SHAPE},    /* gexp R */
        {y, x, a, b, pl_test_randn(PL_SHAPE(1, 3, 4), 7), PL_ERR_SHAPE},    /* not a prefix */
        {y, pl_cast(x, PL_BF16), a, b, NULL, PL_ERR_DTYPE},                 /* mixed, no autocast */
    };
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        ck_assert_msg(pl_lora_add(bad[i].y, bad[i].x, bad[i].a, bad[i].b, bad[i].g, 1.0) == NULL,
                      "bad case %d accepted", i);
        ck_assert_int_eq(pl_error_status(), bad[i].want);
        pl_error_clear();
    }
    pl_frame_end();
}
END_TEST

/* ---- lora_add with dropout inside (pl_lora_add_dropout) ------------------------------------ */

static pl_tensor *f_lora_drop(pl_tensor **in, int n, void *ctx) { /* y, x, A, B[, gexp] */
    return pl_lora_add_dropout(in[0], in[1], in[2], in[3], n > 4 ? in[4] : NULL, 0.75, 0.3, 21, 7,
                               true);
}
static pl_tensor *f_lora_drop_no_y(pl_tensor **in, int n, void *ctx) { /* x, A, B, gexp */
    return pl_lora_add_dropout(NULL, in[0], in[1], in[2], in[3], -1.5, 0.45, 22,
                               (1ull << 33) | 5u, true);
}

/* How the chain and the fused op are compared: 0 = the fused op with
 * dropout against pl_lora_add(y, pl_dropout(x)); 1 = with p = 0 against
 * pl_lora_add; 2 = training false against pl_lora_add; 3 = as 0 with A
 * frozen (backward draws the mask for dx alone, not beside drop(x)). */
enum { LD_CHAIN, LD_P0, LD_EVAL, LD_CHAIN_A_FROZEN };

/* out and the gradient of every input of pl_lora_add_dropout and of its
 * reference (mode), same inputs, loss sum(out * w); x [3, 5, 24] (360
 * elements: five full 64-element blocks of the CPU's 16-lane Philox draws
 * and a partial one) of dtype dt, y of dt unless no_y. Exact (every bit)
 * when atol = rtol = 0. Returns how many elements of out differ from
 * pl_lora_add without dropout (the dropout is real when > 0). */
static int lora_drop_vs(int mode, pl_dtype dt, pl_dtype ac, bool no_y, double p, double atol,
                        double rtol, uint64_t seed) {
    pl_frame_begin();
    if (ac != PL_F32) PL_CK_OK(pl_autocast_begin(ac));
    pl_tensor *x0 = pl_test_randn(PL_SHAPE(3, 5, 24), seed);
    pl_tensor *y0 = pl_test_randn(PL_SHAPE(3, 5, 20), seed + 1);
    pl_tensor *w = pl_test_randn(PL_SHAPE(3, 5, 20), seed + 2);
    pl_tensor *g0 = pl_test_randn(PL_SHAPE(3, 5, 8), seed + 3);
    pl_tensor *a0 = pl_test_randn(PL_SHAPE(8, 24), seed + 4);
    pl_tensor *b0 = pl_test_randn(PL_SHAPE(20, 8), seed + 5);
    const uint64_t dseed = seed * 7 + 1, dctr = (seed << 32) | 3u;
    double r[3][5][360];
    const int nel[5] = {300, 360, 300, 192, 160}, ngrad = 5;
    for (int k = 0; k < 3; k++) { /* 0: reference, 1: fused, 2: no dropout at all */
        pl_tensor *x = PL_CK_NOTNULL(pl_tensor_to(x0, dt, PL_CPU));
        pl_tensor *y = no_y ? NULL : PL_CK_NOTNULL(pl_tensor_to(y0, dt, PL_CPU));
        pl_tensor *g = PL_CK_NOTNULL(pl_tensor_to(g0, PL_F32, PL_CPU));
        pl_tensor *a = PL_CK_NOTNULL(pl_tensor_to(a0, ac == PL_F32 ? dt : PL_F32, PL_CPU));
        pl_tensor *b = PL_CK_NOTNULL(pl_tensor_to(b0, ac == PL_F32 ? dt : PL_F32, PL_CPU));
        pl_tensor *ts[5] = {x, y, g, a, b};
        for (int i = 0; i < 5; i++)
            if (ts[i] && !(i == 3 && mode == LD_CHAIN_A_FROZEN)) pl_tensor_set_requires_grad(ts[i], true);
        pl_tensor *o;
        if (k == 1)
            o = pl_lora_add_dropout(y, x, a, b, g, 0.5, mode == LD_P0 ? 0.0 : p, dseed, dctr,
                                    mode != LD_EVAL);
        else if (k == 0 && (mode == LD_CHAIN || mode == LD_CHAIN_A_FROZEN))
            o = pl_lora_add(y, pl_dropout(x, p, dseed, dctr, true), a, b, g, 0.5);
        else
            o = pl_lora_add(y, x, a, b, g, 0.5);
        PL_CK_NOTNULL(o);
        pl_tensor *o32 = PL_CK_NOTNULL(pl_cast(o, PL_F32));
        PL_CK_OK(pl_backward(pl_sum(pl_mul(o32, w), PL_ALL_DIMS, false), 1.0));
        pl_tensor *src[5] = {o32, x->grad, y ? y->grad : NULL, a->grad, b->grad};
        if (mode == LD_CHAIN_A_FROZEN) ck_assert_ptr_null(a->grad);
        for (int j = 0; j < ngrad; j++)
            for (int i = 0; i < nel[j]; i++)
                r[k][j][i] = src[j] ? pl_tensor_get(src[j], i) : 0.0;
        for (int i = 0; i < 120; i++) /* dgexp [3, 5, 8] in the spare tail of slot 4 */
            r[k][4][160 + i] = pl_tensor_get(g->grad, i);
    }
    if (ac != PL_F32) pl_autocast_end();
    static const char *names[5] = {"out", "dx", "dy", "dA", "dB (then dgexp)"};
    for (int j = 0; j < ngrad; j++)
        for (int i = 0; i < (j == 4 ? 280 : nel[j]); i++) {
            double f = r[1][j][i], c = r[0][j][i];
            bool ok = atol == 0 && rtol == 0 ? f == c : fabs(f - c) <= atol + rtol * fabs(c);
            ck_assert_msg(ok,
                          "lora_add_dropout mode %d, %s (autocast %s)%s: %s[%d] = %.9g, the "
                          "reference's %.9g",
                          mode, pl_dtype_name(dt), pl_dtype_name(ac), no_y ? ", no y" : "",
                          names[j], i, f, c);
        }
    int differ = 0;
    for (int i = 0; i < 300; i++) differ += r[1][0][i] != r[2][0][i];
    pl_frame_end();
    return differ;
}

/* pl_lora_add_dropout: every input's gradient against central differences
 * with p > 0 (a fixed seed and counter: the mask is deterministic); out and
 * every gradient bit-identical to the chain pl_lora_add(y, pl_dropout(x))
 * in f32, with bf16 / f16 operands and under autocast; p = 0 and training false are
 * exactly pl_lora_add; p outside [0, 1] is an error. */
/* Empty products: x [2, 3, 0] (D = 0) gives out = y, t = 0; A [0, 5] (R = 0) gives out = y,
 * and the backward dy = G, dx = 0. The CPU kernel took N = numel(x) / D and, backward,
 * numel(t) / R: 0, so it left out unwritten for D = 0 and dy, dx for R = 0 (the CUDA
 * kernel the first; found by test_kernels_emu). */
START_TEST(lora_add_empty_products) {
    for (int c = 0; c < 2; c++) {
        int64_t D = c ? 5 : 0, R = c ? 0 : 4;
        pl_tensor *x = randn_g(PL_SHAPE(2, 3, D), 401), *a = randn_g(PL_SHAPE(R, D), 402);
        pl_tensor *b = randn_g(PL_SHAPE(6, R), 403), *y = randn_g(PL_SHAPE(2, 3, 6), 404);
        pl_tensor *w = pl_test_randn(PL_SHAPE(2, 3, 6), 405);
        pl_frame_begin();
        pl_tensor *o = PL_CK_NOTNULL(pl_lora_add(y, x, a, b, NULL, 0.5));
        for (int64_t i = 0; i < 36; i++)
            ck_assert_msg(pl_tensor_get(o, i) == pl_tensor_get(y, i),
                          "lora_add D %lld R %lld: out[%lld] = %g, y %g", (long long)D,
                          (long long)R, (long long)i, pl_tensor_get(o, i), pl_tensor_get(y, i));
        PL_CK_OK(pl_backward(pl_sum(pl_mul(o, w), PL_ALL_DIMS, false), 1.0));
        pl_frame_end();
        ck_assert_ptr_nonnull(y->grad);
        for (int64_t i = 0; i < 36; i++)
            ck_assert_msg(pl_tensor_get(y->grad, i) == pl_tensor_get(w, i),
                          "lora_add D %lld R %lld: dy[%lld] = %g, G %g", (long long)D, (long long)R,
                          (long long)i, pl_tensor_get(y->grad, i), pl_tensor_get(w, i));
        for (int64_t i = 0; x->grad && i < pl_tensor_numel(x); i++)
            ck_assert_msg(pl_tensor_get(x->grad, i) == 0.0, "lora_add R 0: dx[%lld] = %g",
                          (long long)i, pl_tensor_get(x->grad, i));
        pl_tensor *all[5] = {x, a, b, y, w};
        for (int i = 0; i < 5; i++)
            pl_tensor_release(all[i]);
    }
}
END_TEST

START_TEST(lora_add_dropout_matches_the_chain_bit_for_bit) {
    pl_tensor *in[5] = {randn_g(PL_SHAPE(2, 3, 6), 401), randn_g(PL_SHAPE(2, 3, 5), 402),
                        randn_g(PL_SHAPE(4, 5), 403), randn_g(PL_SHAPE(6, 4), 404),
                        randn_g(PL_SHAPE(2, 3, 4), 405)};
    check_grad(f_lora_drop, in, 5, NULL, "lora_add_dropout, gexp per position");
    check_grad(f_lora_drop, in, 4, NULL, "lora_add_dropout, plain LoRA");
    pl_tensor *gr = randn_g(PL_SHAPE(2, 1, 4), 406);
    pl_tensor *in3[4] = {in[1], in[2], in[3], gr};
    check_grad(f_lora_drop_no_y, in3, 4, NULL, "lora_add_dropout without y, gexp per row");
    for (int i = 0; i < 5; i++) pl_tensor_release(in[i]);
    pl_tensor_release(gr);

    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F32, PL_F32, false, 0.3, 0, 0, 410), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F32, PL_F32, true, 0.6, 0, 0, 420), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN_A_FROZEN, PL_F32, PL_F32, false, 0.3, 0, 0, 422), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F32, PL_F32, false, 1.0, 0, 0, 425), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_BF16, PL_F32, false, 0.3, 0, 0, 430), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F16, PL_F32, true, 0.1, 0, 0, 440), 0);
    /* bf16-mixed / f16 autocast: the chain drops f32 x then casts; the op
     * drops f32 x and rounds drop(x) once, the same bits */
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F32, PL_BF16, false, 0.3, 0, 0, 450), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_F32, PL_F16, true, 0.2, 0, 0, 455), 0);
    ck_assert_int_gt(lora_drop_vs(LD_CHAIN, PL_BF16, PL_BF16, false, 0.3, 0, 0, 457), 0);
    ck_assert_int_eq(lora_drop_vs(LD_P0, PL_F32, PL_F32, false, 0.3, 0, 0, 460), 0);
    ck_assert_int_eq(lora_drop_vs(LD_EVAL, PL_F32, PL_F32, false, 0.3, 0, 0, 470), 0);
    ck_assert_int_eq(lora_drop_vs(LD_EVAL, PL_BF16, PL_F32, true, 0.3, 0, 0, 480), 0);

    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 5), 1), *a = pl_test_randn(PL_SHAPE(4, 5), 2);
    pl_tensor *b = pl_test_randn(PL_SHAPE(6, 4), 3), *y = pl_test_randn(PL_SHAPE(2, 3, 6), 4);
    const double bad_p[3] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(pl_lora_add_dropout(y, x, a, b, NULL, 1.0, bad_p[i], 1, 2, true) == NULL,
                      "dropout probability %g accepted", bad_p[i]);
        ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
        ck_assert_msg(strstr(pl_error_message(), "lora_add") != NULL, "%s", pl_error_message());
        pl_error_clear();
    }
    pl_frame_end();
}
END_TEST

/* ---- clamp ---------------------------------------------------------------------------- */

static pl_tensor *f_clamp(pl_tensor **in, int n, void *ctx) { return pl_clamp(in[0], -0.5, 0.8); }

/* torch.clamp(x, -0.5, 0.8): values, NaN kept, gradient 1 inside [min, max]
 * (boundaries included, derivatives.yaml) and 0 outside; central differences
 * away from the two kinks; min > max refused. */
START_TEST(clamp_matches_torch) {
    pl_frame_begin();
    float v[6] = {-2.0f, -0.5f, 0.1f, 0.8f, 3.0f, NAN};
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(6), v, PL_CPU);
    pl_tensor_set_requires_grad(x, true);
    pl_tensor *y = PL_CK_NOTNULL(pl_clamp(x, -0.5, 0.8));
    const float want[5] = {-0.5f, -0.5f, 0.1f, 0.8f, 0.8f};
    for (int i = 0; i < 5; i++) ck_assert_float_eq(pl_tensor_f32(y)[i], want[i]);
    ck_assert(isnan(pl_tensor_f32(y)[5]));
    pl_tensor *w = pl_tensor_from_data(PL_F32, PL_SHAPE(6), (float[]){1, 2, 3, 4, 5, 0}, PL_CPU);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(y, w), PL_ALL_DIMS, false), 1.0));
    const float gwant[5] = {0, 2, 3, 4, 0};
    for (int i = 0; i < 5; i++) ck_assert_float_eq(pl_tensor_f32(x->grad)[i], gwant[i]);
    ck_assert_ptr_null(pl_clamp(x, 1.0, -1.0));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_error_clear();
    pl_frame_end();
    pl_tensor *g = pl_test_randn(PL_SHAPE(7, 33), 94);
    float *gd = pl_tensor_f32(g);
    for (int i = 0; i < 231; i++)
        if (fabsf(gd[i] + 0.5f) < 0.01f || fabsf(gd[i] - 0.8f) < 0.01f) gd[i] = 0.2f;
    pl_tensor_set_requires_grad(g, true);
    check_grad(f_clamp, &g, 1, NULL, "clamp");
    pl_tensor_release(g);
}
END_TEST

/* ---- softmax -------------------------------------------------------------------------- */

static pl_tensor *f_softmax(pl_tensor **in, int n, void *ctx) {
    return *(int *)ctx ? pl_log_softmax(in[0]) : pl_softmax(in[0]);
}

START_TEST(softmax_and_log_softmax) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 7), 100);
    pl_tensor *x2 = pl_scale(x, 30.0); /* large logits: needs the max shift */
    for (int lg = 0; lg < 2; lg++)
        for (int v = 0; v < 2; v++) {
            pl_tensor *in = v ? x2 : x;
            pl_tensor *o = PL_CK_NOTNULL(f_softmax(&in, 1, &lg));
            double ref[42];
            for (int r = 0; r < 6; r++) {
                double m = -INFINITY, s = 0;
                for (int j = 0; j < 7; j++)
                    m = fmax(m, pl_tensor_get(in, r * 7 + j));
                for (int j = 0; j < 7; j++)
                    s += exp(pl_tensor_get(in, r * 7 + j) - m);
                for (int j = 0; j < 7; j++) {
                    double l = pl_tensor_get(in, r * 7 + j) - m - log(s);
                    ref[r * 7 + j] = lg ? l : exp(l);
                }
            }
            check_close(o, ref, 42, 1e-5, 1e-5, lg ? "log_softmax" : "softmax");
        }
    pl_frame_end();
    for (int lg = 0; lg < 2; lg++) {
        pl_tensor *g = randn_g(PL_SHAPE(3, 33), 101);
        check_grad(f_softmax, &g, 1, &lg, lg ? "log_softmax" : "softmax");
        pl_tensor_release(g);
        pl_tensor *g1 = randn_g(PL_SHAPE(7), 102);
        check_grad(f_softmax, &g1, 1, &lg, lg ? "log_softmax 1-D" : "softmax 1-D");
        pl_tensor_release(g1);
    }
}
END_TEST

/* ---- losses ----------------------------------------------------------------------------- */

/* torch.nn.functional.cross_entropy(x, t, ignore_index, label_smoothing), mean. */
static double ref_ce(const pl_tensor *x, const int64_t *t, int64_t N, int64_t C, int64_t ign,
                     double eps) {
    double nll = 0, smooth = 0;
    int64_t valid = 0;
    for (int64_t i = 0; i < N; i++) {
        if (t[i] == ign) continue;
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < C; c++)
            m = fmax(m, pl_tensor_get(x, i * C + c));
        for (int64_t c = 0; c < C; c++)
            s += exp(pl_tensor_get(x, i * C + c) - m);
        double lse = m + log(s);
        nll += lse - pl_tensor_get(x, i * C + t[i]);
        for (int64_t c = 0; c < C; c++)
            smooth += lse - pl_tensor_get(x, i * C + c);
        valid++;
    }
    return (1 - eps) * nll / valid + eps / C * smooth / valid;
}

typedef struct ce_ctx {
    pl_tensor *target;
    int64_t ign;
    double eps;
} ce_ctx;

static pl_tensor *f_ce(pl_tensor **in, int n, void *ctx) {
    ce_ctx *c = ctx;
    return pl_cross_entropy(in[0], c->target, c->ign, c->eps);
}

START_TEST(cross_entropy_hand_values) {
    pl_frame_begin();
    /* logits [1,2,3], target 2: nll = log(e + e^2 + e^3) - 3 = 0.40760596;
     * smoothing 0.1: 0.9 * 0.40760596 + 0.1 * (3 lse - 6) / 3 = 0.50760596 */
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(1, 3), (float[]){1, 2, 3}, PL_CPU);
    pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(1), (int64_t[]){2}, PL_CPU);
    ck_assert_double_eq_tol(pl_tensor_item(pl_cross_entropy(x, t, -100, 0.0)), 0.40760596, 1e-6);
    ck_assert_double_eq_tol(pl_tensor_item(pl_cross_entropy(x, t, -100, 0.1)), 0.50760596, 1e-6);
    /* i32 targets are accepted too */
    pl_tensor *t32 = pl_tensor_from_data(PL_I32, PL_SHAPE(1), (int32_t[]){2}, PL_CPU);
    ck_assert_double_eq_tol(pl_tensor_item(pl_cross_entropy(x, t32, -100, 0.0)), 0.40760596, 1e-6);
    /* every target ignored -> NaN, as in PyTorch */
    pl_tensor *ti = pl_tensor_from_data(PL_I64, PL_SHAPE(1), (int64_t[]){-100}, PL_CPU);
    ck_assert(isnan(pl_tensor_item(pl_cross_entropy(x, ti, -100, 0.0))));
    /* a masked class (-inf logit) without smoothing: finite, as in PyTorch
     * (log(e + e^3) - 3 = 0.12692801); its gradient is 0, the others finite */
    pl_tensor *xm = pl_tensor_from_data(PL_F32, PL_SHAPE(1, 3), (float[]){1, -INFINITY, 3}, PL_CPU);
    pl_tensor_set_requires_grad(xm, true);
    pl_tensor *lm = pl_cross_entropy(xm, t, -100, 0.0);
    ck_assert_double_eq_tol(pl_tensor_item(lm), 0.12692801, 1e-6);
    ck_assert_int_eq(pl_backward(lm, 1.0), PL_OK);
    ck_assert(pl_tensor_get(xm->grad, 1) == 0.0);
    ck_assert(isfinite(pl_tensor_get(xm->grad, 0)) && isfinite(pl_tensor_get(xm->grad, 2)));
    /* with smoothing the -inf class is in the loss: +inf, as in PyTorch */
    ck_assert(isinf(pl_tensor_item(pl_cross_entropy(xm, t, -100, 0.1))));
    /* out-of-range target -> error naming the op */
    pl_tensor *tb = pl_tensor_from_data(PL_I64, PL_SHAPE(1), (int64_t[]){3}, PL_CPU);
    ck_assert_ptr_null(pl_cross_entropy(x, tb, -100, 0.0));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "cross_entropy"));
    pl_frame_end();
}
END_TEST

/* bf16 logits (autocast's logits GEMM) are read in place on the CPU, with
 * the vectorized exp (pl_softmax_exp_bf16): loss and gradient within 1e-6
 * relative of casting them to f32 first (libm expf), and the loss within
 * that of an f64 cross-entropy of the same bf16 values; sizes on both sides
 * of the parallel threshold, an ignored row, smoothing, a logit of -1e30 */
START_TEST(cross_entropy_reads_bf16_logits_as_if_cast) {
    static const int64_t shapes[][2] = {{7, 5}, {64, 1031}};
    for (int sh = 0; sh < 2; sh++) {
        int64_t n = shapes[sh][0], c = shapes[sh][1];
        pl_tensor *x = randn_g(PL_SHAPE(n, c), 120 + sh);
        ((float *)pl_tensor_data(x))[2 * c + 1] = -1e30f; /* exp underflows */
        int64_t tg[64];
        for (int64_t i = 0; i < n; i++)
            tg[i] = i == 3 ? -1 : (i * 7919 + 2) % c;
        pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(n), tg, PL_CPU);
        double eps = sh ? 0.1 : 0.0;
        double loss[2];
        pl_tensor *grad[2];
        for (int via_cast = 0; via_cast < 2; via_cast++) {
            pl_frame_begin();
            pl_tensor *xb = pl_cast(x, PL_BF16);
            pl_tensor *l = pl_cross_entropy(via_cast ? pl_cast(xb, PL_F32) : xb, t, -1, eps);
            PL_CK_NOTNULL(l);
            loss[via_cast] = pl_tensor_item(l);
            PL_CK_OK(pl_backward(l, 1.0));
            pl_frame_end();
            grad[via_cast] = x->grad;
            x->grad = NULL;
        }
        /* f64 reference on the bf16 values */
        double nll = 0, smooth = 0;
        int valid = 0;
        for (int64_t i = 0; i < n; i++) {
            if (tg[i] == -1) continue;
            double m = -INFINITY, se = 0, sx = 0, v;
            for (int64_t j = 0; j < c; j++)
                m = fmax(m, pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(x, i * c + j))));
            for (int64_t j = 0; j < c; j++) {
                v = pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(x, i * c + j)));
                se += exp(v - m);
                sx += v;
            }
            double lse = m + log(se);
            nll += lse - pl_bf16_to_f32(pl_f32_to_bf16((float)pl_tensor_get(x, i * c + tg[i])));
            smooth += c * lse - sx;
            valid++;
        }
        double ref = ((1 - eps) * nll + eps / c * smooth) / valid;
        ck_assert_msg(fabs(loss[0] - loss[1]) <= 1e-6 * fabs(loss[1]) || loss[0] == loss[1],
                      "loss %.9g vs cast %.9g", loss[0], loss[1]);
        ck_assert_msg(fabs(loss[0] - ref) <= 1e-6 * fabs(ref) || loss[0] == ref,
                      "loss %.9g vs f64 %.9g", loss[0], ref);
        ck_assert_int_eq(grad[0]->dtype, PL_F32);
        for (int64_t i = 0; i < n * c; i++) {
            double g0 = pl_tensor_get(grad[0], i), g1 = pl_tensor_get(grad[1], i);
            /* g = (p - eps/C) / valid: p's relative error, not g's, is what is bounded */
            double tol = 1e-6 * (fabs(g1) + eps / (double)c / valid) + 1e-30;
            ck_assert_msg(fabs(g0 - g1) <= tol, "grad[%lld] %.9g vs cast %.9g",
                          (long long)i, g0, g1);
        }
        pl_tensor_release(grad[0]);
        pl_tensor_release(grad[1]);
        pl_tensor_release(t);
        pl_tensor_release(x);
    }
}
END_TEST

/* ---- linear_cross_entropy: the head and its loss fused (pl_linear_cross_entropy) ---- */

/* ctx: a ce_ctx (target, ignore_index, label smoothing), as f_ce's */
static pl_tensor *f_lce(pl_tensor **in, int n, void *ctx) {
    ce_ctx *c = ctx;
    return pl_linear_cross_entropy(in[0], in[1], c->target, c->ign, c->eps);
}

/* The gradients of x and W against central differences, with an ignored
 * row, with and without smoothing (the loss is a scalar: L = R loss). */
START_TEST(linear_cross_entropy_gradcheck) {
    pl_tensor *in[2] = {randn_g(PL_SHAPE(5, 6), 140), randn_g(PL_SHAPE(7, 6), 141)};
    pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(5), (int64_t[]){1, -100, 6, 0, 3}, PL_CPU);
    ce_ctx c = {t, -100, 0.0};
    check_grad(f_lce, in, 2, &c, "linear_cross_entropy");
    c.eps = 0.2;
    check_grad(f_lce, in, 2, &c, "linear_cross_entropy, smoothing 0.2");
    pl_tensor_release(t);
    pl_tensor_release(in[0]);
    pl_tensor_release(in[1]);
}
END_TEST

/* loss, dx and dW of the fused op against the chain it replaces,
 * pl_cross_entropy(pl_matmul(x, W, false, true)), on the CPU: the loss
 * within 2e-6 relative (the same per-row math; the blocked GEMM and the row
 * sums' order move the last bits), each gradient element within 1e-6 of the
 * gradient's largest magnitude (dW's sum over the rows goes block by block).
 * Shapes: N not a multiple of the 128-row block, V prime, N = 1, the
 * pretraining head's V and K, ignored rows, every row ignored (NaN loss,
 * zero gradients on both paths), smoothing, i32 targets, an incoming
 * gradient of 3 (the loss scaled before backward), a frozen W (a frozen
 * head: no dW) and a frozen x. */
START_TEST(linear_cross_entropy_matches_the_chain) {
    static const struct {
        int64_t n, k, v;
        int ign_every; /* every ign_every-th row ignored; 1: all; 0: none */
        double eps, g;
        bool i32;
        int frozen; /* 1: x needs no gradient, 2: W needs none (a frozen head) */
    } cs[] = {
        {200, 24, 1031, 7, 0.0, 1.0, false, 0}, {1, 5, 3, 0, 0.0, 1.0, false, 0},
        {130, 64, 9067, 5, 0.0, 1.0, false, 0}, {65, 16, 257, 3, 0.1, 3.0, true, 0},
        {9, 8, 11, 1, 0.0, 1.0, false, 0},      {64, 33, 100, 0, 0.0, 0.5, false, 0},
        {150, 12, 333, 4, 0.0, 1.0, false, 2},  {150, 12, 333, 4, 0.0, 1.0, false, 1},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int64_t n = cs[ci].n, k = cs[ci].k, v = cs[ci].v;
        pl_tensor *x = randn_g(PL_SHAPE(n, k), 150 + ci), *w = randn_g(PL_SHAPE(v, k), 160 + ci);
        if (cs[ci].frozen) pl_tensor_set_requires_grad(cs[ci].frozen == 1 ? x : w, false);
        int64_t tg[256];
        int32_t tg32[256];
        for (int64_t i = 0; i < n; i++) {
            bool ig = cs[ci].ign_every && i % cs[ci].ign_every == 0;
            tg[i] = ig ? -7 : (i * 7919 + 3) % v;
            tg32[i] = (int32_t)tg[i];
        }
        pl_tensor *t = cs[ci].i32 ? pl_tensor_from_data(PL_I32, PL_SHAPE(n), tg32, PL_CPU)
                                  : pl_tensor_from_data(PL_I64, PL_SHAPE(n), tg, PL_CPU);
        double loss[2];
        pl_tensor *gx[2], *gw[2];
        for (int fused = 0; fused < 2; fused++) {
            pl_frame_begin();
            pl_tensor *l = fused ? pl_linear_cross_entropy(x, w, t, -7, cs[ci].eps)
                                 : pl_cross_entropy(pl_matmul(x, w, false, true), t, -7,
                                                    cs[ci].eps);
            PL_CK_NOTNULL(l);
            ck_assert_int_eq(l->ndim, 0);
            loss[fused] = pl_tensor_item(l);
            PL_CK_OK(pl_backward(pl_scale(l, cs[ci].g), 1.0));
            pl_frame_end();
            gx[fused] = x->grad;
            gw[fused] = w->grad;
            x->grad = w->grad = NULL;
        }
        if (cs[ci].ign_every == 1)
            ck_assert_msg(isnan(loss[0]) && isnan(loss[1]), "case %zu: all ignored: %g, %g", ci,
                          loss[0], loss[1]);
        else
            ck_assert_msg(fabs(loss[1] - loss[0]) <= 2e-6 * fabs(loss[0]),
                          "case %zu: fused loss %.9g, chain %.9g", ci, loss[1], loss[0]);
        for (int which = 0; which < 2; which++) {
            pl_tensor *a = which ? gw[1] : gx[1], *b = which ? gw[0] : gx[0];
            if (cs[ci].frozen == which + 1) {
                ck_assert_msg(!a && !b, "case %zu: a gradient of the frozen input", ci);
                continue;
            }
            int64_t m = pl_tensor_numel(b);
            ck_assert_int_eq(pl_tensor_numel(a), m);
            double mx = 0;
            for (int64_t i = 0; i < m; i++) mx = fmax(mx, fabs(pl_tensor_get(b, i)));
            if (cs[ci].ign_every == 1) ck_assert(mx == 0);
            for (int64_t i = 0; i < m; i++)
                ck_assert_msg(fabs(pl_tensor_get(a, i) - pl_tensor_get(b, i)) <= 1e-6 * mx,
                              "case %zu: d%s[%lld] fused %.9g, chain %.9g (max %.3g)", ci,
                              which ? "W" : "x", (long long)i, pl_tensor_get(a, i),
                              pl_tensor_get(b, i), mx);
            pl_tensor_release(a);
            pl_tensor_release(b);
        }
        pl_tensor_release(t);
        pl_tensor_release(x);
        pl_tensor_release(w);
    }
}
END_TEST

/* Without a gradient (grad mode off, or no input requiring one) the op
 * records nothing and gives the same loss; bad arguments are refused with
 * the op's name: a target outside [0, V), shapes, smoothing, dtypes. */
START_TEST(linear_cross_entropy_no_grad_and_errors) {
    pl_frame_begin();
    pl_tensor *x = randn_g(PL_SHAPE(70, 12), 170), *w = randn_g(PL_SHAPE(300, 12), 171);
    int64_t tg[70];
    for (int i = 0; i < 70; i++) tg[i] = (i * 31) % 300;
    pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(70), tg, PL_CPU);
    pl_tensor *l = PL_CK_NOTNULL(pl_linear_cross_entropy(x, w, t, -100, 0.0));
    ck_assert_ptr_nonnull(l->grad_fn);
    pl_no_grad_begin();
    pl_tensor *l0 = PL_CK_NOTNULL(pl_linear_cross_entropy(x, w, t, -100, 0.0));
    pl_no_grad_end();
    ck_assert_ptr_null(l0->grad_fn);
    ck_assert(pl_tensor_item(l0) == pl_tensor_item(l));
    pl_tensor *xd = pl_test_randn(PL_SHAPE(70, 12), 170), *wd = pl_test_randn(PL_SHAPE(300, 12), 171);
    pl_tensor *l1 = PL_CK_NOTNULL(pl_linear_cross_entropy(xd, wd, t, -100, 0.0));
    ck_assert_ptr_null(l1->grad_fn);
    ck_assert(pl_tensor_item(l1) == pl_tensor_item(l));
    tg[5] = 300;
    pl_tensor *tb = pl_tensor_from_data(PL_I64, PL_SHAPE(70), tg, PL_CPU);
    ck_assert_ptr_null(pl_linear_cross_entropy(x, w, tb, -100, 0.0));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "linear_cross_entropy: target[5] = 300"));
    pl_tensor *w2 = randn_g(PL_SHAPE(300, 11), 172);
    ck_assert_ptr_null(pl_linear_cross_entropy(x, w2, t, -100, 0.0));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "linear_cross_entropy"));
    ck_assert_ptr_null(pl_linear_cross_entropy(x, w, t, -100, 1.5));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_ptr_null(pl_linear_cross_entropy(x, w, x, -100, 0.0));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    pl_frame_end(); /* releases every tensor made above */
}
END_TEST

/* add / sub of same-shape f32 / bf16 operands and scale / add_scalar of bf16
 * run without casts on the CPU: values bit-identical to cast, f32 op, cast;
 * output dtype as torch promotes; gradients reach the f32 leaves */
START_TEST(bf16_add_sub_scale_match_the_cast_round_trip) {
    int64_t n = 40000; /* past the parallel threshold */
    pl_tensor *x = randn_g(PL_SHAPE(n), 130), *y = randn_g(PL_SHAPE(n), 131);
    for (int c = 0; c < 6; c++) {
        pl_frame_begin();
        pl_tensor *xb = pl_cast(x, PL_BF16), *yb = pl_cast(y, PL_BF16);
        pl_tensor *a = c == 4 ? xb : (c & 1 ? xb : x), *b = c == 4 ? yb : (c & 1 ? y : yb);
        pl_tensor *got, *want;
        if (c < 5) {
            pl_tensor *(*f)(pl_tensor *, pl_tensor *) = c & 2 ? pl_sub : pl_add;
            got = f(a, b);
            pl_tensor *w = f(pl_cast(a, PL_F32), pl_cast(b, PL_F32));
            want = a->dtype == b->dtype ? pl_cast(w, a->dtype) : w;
        } else {
            got = pl_add_scalar(pl_scale(xb, 0.3), -1.7);
            want = pl_cast(pl_add_scalar(pl_cast(pl_cast(pl_scale(pl_cast(xb, PL_F32), 0.3),
                                                                 PL_BF16), PL_F32), -1.7), PL_BF16);
        }
        PL_CK_NOTNULL(got);
        ck_assert_int_eq(got->dtype, want->dtype);
        ck_assert_int_eq(got->dtype, c >= 4 ? PL_BF16 : (a->dtype == b->dtype ? a->dtype : PL_F32));
        ck_assert(memcmp(pl_tensor_data(got), pl_tensor_data(want),
                         (size_t)n * pl_dtype_size(got->dtype)) == 0);
        PL_CK_OK(pl_backward(pl_sum(pl_cast(got, PL_F32), PL_ALL_DIMS, false), 1.0));
        pl_frame_end();
        double gx = c == 5 ? 0.3 : 1.0, gy = c & 2 ? -1.0 : 1.0;
        ck_assert_double_eq_tol(pl_tensor_get(x->grad, 7), gx, 1e-7);
        if (c < 5) ck_assert_double_eq_tol(pl_tensor_get(y->grad, 7), gy, 1e-7);
        pl_tensor_release(x->grad);
        x->grad = NULL;
        if (y->grad) pl_tensor_release(y->grad);
        y->grad = NULL;
    }
    pl_tensor_release(x);
    pl_tensor_release(y);
}
END_TEST

START_TEST(cross_entropy_ignore_index_and_smoothing) {
    int64_t tg[7] = {0, 4, -1, 2, 2, -1, 1};
    pl_tensor *x = randn_g(PL_SHAPE(7, 5), 110);
    pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(7), tg, PL_CPU);
    double epss[] = {0.0, 0.1, 0.35};
    for (int e = 0; e < 3; e++) {
        pl_frame_begin();
        pl_tensor *l = PL_CK_NOTNULL(pl_cross_entropy(x, t, -1, epss[e]));
        ck_assert_int_eq(l->ndim, 0);
        ck_assert_double_eq_tol(pl_tensor_item(l), ref_ce(x, tg, 7, 5, -1, epss[e]), 1e-5);
        pl_tape_clear();
        pl_frame_end();
        ce_ctx c = {t, -1, epss[e]};
        check_grad(f_ce, &x, 1, &c, "cross_entropy");
    }
    /* ignored rows get zero gradient */
    pl_frame_begin();
    pl_tensor_zero_grad(x);
    PL_CK_OK(pl_backward(pl_cross_entropy(x, t, -1, 0.1), 1.0));
    pl_frame_end();
    for (int c = 0; c < 5; c++) {
        ck_assert_double_eq(pl_tensor_get(x->grad, 2 * 5 + c), 0.0);
        ck_assert_double_eq(pl_tensor_get(x->grad, 5 * 5 + c), 0.0);
    }
    pl_tensor_release(x);
    pl_tensor_release(t);
}
END_TEST

/* Rows as long as a vocabulary (the vectorized row max, 32 floats a step,
 * and its scalar tail; the vectorized exp, pl_ce_exp) against the double
 * reference: the max in the tail, logits far enough below it that e^x
 * underflows to 0, label smoothing on and off. The gradient against double
 * softmax, element by element: the f32 exp is within 1 ulp and lse is
 * rounded to f32 once, so a few parts in 10^6 of each probability, plus the
 * f32 rounding of the stored gradient. */
START_TEST(cross_entropy_long_rows_match_double_reference) {
    static const int64_t Cs[] = {1000, 45, 31};
    for (int k = 0; k < 3; k++) {
        int64_t N = 4, C = Cs[k];
        pl_tensor *x = randn_g(PL_SHAPE(N, C), 300 + (uint64_t)k);
        float *xd = pl_tensor_data(x);
        for (int64_t c = 0; c < N * C; c++)
            xd[c] *= 8.0f;
        xd[0 * C + C - 1] = 60.0f; /* row 0: the max in the last column */
        xd[1 * C + 3] = -150.0f;   /* row 1: e^(x - m) underflows to 0 */
        xd[1 * C + C / 2] = -1e4f;
        xd[2 * C + 7] = 90.0f; /* row 2: one logit dominates */
        int64_t tg[4] = {C - 1, 3, 7, C / 3};
        pl_tensor *t = pl_tensor_from_data(PL_I64, PL_SHAPE(4), tg, PL_CPU);
        for (int e = 0; e < 2; e++) {
            double eps = e ? 0.1 : 0.0;
            pl_frame_begin();
            pl_tensor_zero_grad(x);
            pl_tensor *l = PL_CK_NOTNULL(pl_cross_entropy(x, t, -100, eps));
            double ref = ref_ce(x, tg, N, C, -100, eps);
            ck_assert_msg(fabs(pl_tensor_item(l) - ref) <= 1e-6 * fabs(ref) + 1e-6,
                          "C %lld eps %g: loss %.9g, double %.9g", (long long)C, eps,
                          pl_tensor_item(l), ref);
            PL_CK_OK(pl_backward(l, 1.0));
            pl_frame_end();
            for (int64_t i = 0; i < N; i++) {
                double m = -INFINITY, s = 0;
                for (int64_t c = 0; c < C; c++)
                    m = fmax(m, xd[i * C + c]);
                for (int64_t c = 0; c < C; c++)
                    s += exp(xd[i * C + c] - m);
                for (int64_t c = 0; c < C; c++) {
                    double p = exp(xd[i * C + c] - m) / s;
                    double want = (p - (c == tg[i]) * (1 - eps) - eps / C) / N;
                    double got = pl_tensor_get(x->grad, i * C + c);
                    ck_assert_msg(fabs(got - want) <= 4e-6 * p / N + 2.4e-7 * fabs(want) + 1e-12,
                                  "C %lld eps %g: grad[%lld, %lld] %.9g, double %.9g", (long long)C,
                                  eps, (long long)i, (long long)c, got, want);
                }
            }
        }
        pl_tensor_release(x);
        pl_tensor_release(t);
    }
}
END_TEST

enum { L_MSE, L_MAE, L_HUBER };

static pl_tensor *f_loss(pl_tensor **in, int n, void *ctx) {
    switch (*(int *)ctx) {
    case L_MSE:
        return pl_mse_loss(in[0], in[1]);
    case L_MAE:
        return pl_mae_loss(in[0], in[1]);
    default:
        return pl_huber_loss(in[0], in[1], 0.8);
    }
}

START_TEST(regression_losses) {
    pl_tensor *in[2] = {randn_g(PL_SHAPE(7, 3), 120), randn_g(PL_SHAPE(7, 3), 121)};
    for (int op = 0; op < 3; op++) {
        pl_frame_begin();
        pl_tensor *l = PL_CK_NOTNULL(f_loss(in, 2, &op));
        double s = 0;
        for (int i = 0; i < 21; i++) {
            double d = pl_tensor_get(in[0], i) - pl_tensor_get(in[1], i);
            s += op == L_MSE   ? d * d
                 : op == L_MAE ? fabs(d)
                               : (fabs(d) < 0.8 ? 0.5 * d * d : 0.8 * (fabs(d) - 0.4));
        }
        ck_assert_double_eq_tol(pl_tensor_item(l), s / 21, 1e-6);
        pl_tape_clear();
        pl_frame_end();
        check_grad(f_loss, in, 2, &op, op == L_MSE ? "mse" : op == L_MAE ? "mae" : "huber");
    }
    /* hand values: pred [0, 3], target [1, 1]: mse 2.5, mae 1.5, huber(1) (0.5 + 1.5)/2 = 1 */
    pl_frame_begin();
    pl_tensor *p = pl_tensor_from_data(PL_F32, PL_SHAPE(2), (float[]){0, 3}, PL_CPU);
    pl_tensor *t = pl_tensor_from_data(PL_F32, PL_SHAPE(2), (float[]){1, 1}, PL_CPU);
    ck_assert_double_eq_tol(pl_tensor_item(pl_mse_loss(p, t)), 2.5, 1e-7);
    ck_assert_double_eq_tol(pl_tensor_item(pl_mae_loss(p, t)), 1.5, 1e-7);
    ck_assert_double_eq_tol(pl_tensor_item(pl_huber_loss(p, t, 1.0)), 1.0, 1e-7);
    ck_assert_ptr_null(pl_mse_loss(p, pl_test_randn(PL_SHAPE(3), 1)));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
    pl_tensor_release(in[0]);
    pl_tensor_release(in[1]);
}
END_TEST

/* ---- normalization ----------------------------------------------------------------------- */

static pl_tensor *f_layer_norm(pl_tensor **in, int n, void *ctx) {
    return pl_layer_norm(in[0], n > 1 ? in[1] : NULL, n > 2 ? in[2] : NULL, 1e-5);
}

static pl_tensor *f_rms_norm(pl_tensor **in, int n, void *ctx) {
    return pl_rms_norm(in[0], n > 1 ? in[1] : NULL, 1e-6);
}

START_TEST(layer_norm_and_rms_norm_forward) {
    pl_frame_begin();
    pl_tensor *x = pl_test_randn(PL_SHAPE(2, 3, 33), 130);
    pl_tensor *w = pl_test_randn(PL_SHAPE(33), 131), *b = pl_test_randn(PL_SHAPE(33), 132);
    for (int variant = 0; variant < 2; variant++) {
        pl_tensor *ln = PL_CK_NOTNULL(variant ? pl_layer_norm(x, NULL, NULL, 1e-5)
                                              : pl_layer_norm(x, w, b, 1e-5));
        pl_tensor *rn =
            PL_CK_NOTNULL(variant ? pl_rms_norm(x, NULL, 1e-6) : pl_rms_norm(x, w, 1e-6));
        double rl[198], rr[198];
        for (int r = 0; r < 6; r++) {
            double mu = 0, var = 0, ms = 0;
            for (int j = 0; j < 33; j++)
                mu += pl_tensor_get(x, r * 33 + j) / 33;
            for (int j = 0; j < 33; j++) {
                double v = pl_tensor_get(x, r * 33 + j);
                var += (v - mu) * (v - mu) / 33;
                ms += v * v / 33;
            }
            for (int j = 0; j < 33; j++) {
                double v = pl_tensor_get(x, r * 33 + j);
                double wj = variant ? 1 : pl_tensor_get(w, j),
                       bj = variant ? 0 : pl_tensor_get(b, j);
                rl[r * 33 + j] = (v - mu) / sqrt(var + 1e-5) * wj + bj;
                rr[r * 33 + j] = v / sqrt(ms + 1e-6) * wj;
            }
        }
        check_close(ln, rl, 198, 1e-5, 1e-5, "layer_norm");
        check_close(rn, rr, 198, 1e-5, 1e-5, "rms_norm");
    }
    ck_assert_ptr_null(pl_layer_norm(x, pl_test_randn(PL_SHAPE(32), 1), NULL, 1e-5));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_frame_end();
}
END_TEST

START_TEST(layer_norm_and_rms_norm_gradients) {
    pl_tensor *in[3] = {randn_g(PL_SHAPE(3, 7), 140), randn_g(PL_SHAPE(7), 141),
                        randn_g(PL_SHAPE(7), 142)};
    check_grad(f_layer_norm, in, 3, NULL, "layer_norm x,w,b");
    check_grad(f_layer_norm, in, 1, NULL, "layer_norm x");
    check_grad(f_rms_norm, in, 2, NULL, "rms_norm x,w");
    check_grad(f_rms_norm, in, 1, NULL, "rms_norm x");
    pl_tensor *x33[2] = {randn_g(PL_SHAPE(2, 33), 143), randn_g(PL_SHAPE(33), 144)};
    check_grad(f_rms_norm, x33, 2, NULL, "rms_norm D=33");
    check_grad(f_layer_norm, x33, 2, NULL, "layer_norm D=33");
    pl_tensor *x1 = randn_g(PL_SHAPE(1, 1), 145); /* D = 1: layer_norm output is b */
    check_grad(f_rms_norm, &x1, 1, NULL, "rms_norm D=1");
    for (int i = 0; i < 3; i++)
        pl_tensor_release(in[i]);
    pl_tensor_release(x33[0]);
    pl_tensor_release(x33[1]);
    pl_tensor_release(x1);
}
END_TEST

/* ---- cast --------------------------------------------------------------------------------- */

START_TEST(cast_rounds_to_nearest_even_and_passes_gradient) {
    pl_frame_begin();
    float v[5] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 65520.0f, 1.0f + 0x1p-11f};
    pl_tensor *x = pl_tensor_from_data(PL_F32, PL_SHAPE(5), v, PL_CPU);
    pl_tensor *hb = PL_CK_NOTNULL(pl_cast(x, PL_BF16));
    ck_assert_int_eq(hb->dtype, PL_BF16);
    ck_assert_double_eq(pl_tensor_get(hb, 0), 1.0);      /* tie -> even */
    ck_assert_double_eq(pl_tensor_get(hb, 1), 1.015625); /* tie -> even (up) */
    ck_assert_double_eq(pl_tensor_get(hb, 2), -2.5);
    ck_assert_double_eq(pl_tensor_get(hb, 3), 65536.0);
    pl_tensor *hf = PL_CK_NOTNULL(pl_cast(x, PL_F16));
    ck_assert_double_eq(pl_tensor_get(hf, 2), -2.5);
    ck_assert(isinf(pl_tensor_get(hf, 3)));         /* above f16 max after rounding */
    ck_assert_double_eq(pl_tensor_get(hf, 4), 1.0); /* tie -> even */
    pl_tensor *back = pl_cast(hf, PL_BF16);         /* f16 -> bf16 */
    ck_assert_double_eq(pl_tensor_get(back, 2), -2.5);
    ck_assert_ptr_null(pl_cast(x, PL_I64));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    pl_frame_end();

    pl_tensor *g = randn_g(PL_SHAPE(7, 3), 150);
    pl_tensor *w = pl_test_randn(PL_SHAPE(7, 3), 151);
    pl_frame_begin();
    /* d sum(cast(g) * w)/dg = w: the cast's gradient is the identity, in f32 */
    PL_CK_OK(pl_backward(
        pl_sum(pl_mul(pl_cast(pl_cast(g, PL_BF16), PL_F32), w), PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    for (int i = 0; i < 21; i++)
        ck_assert_double_eq(pl_tensor_get(g->grad, i), pl_tensor_get(w, i));
    pl_tensor_release(g);
    pl_tensor_release(w);
}
END_TEST

/* Sizes above the kernels' OpenMP threshold take the parallel loops. */
/* pl_sum_squares_multi / pl_mul_multi_ (clip_grad_norm_'s foreach ops) on
 * the CPU: hand-computed totals (an empty tensor, 40 tensors in two calls),
 * NaN / inf propagation, the bits of the per-tensor chain they replace
 * (a tensor past the sum's OpenMP threshold; a strided one takes that chain
 * itself), and the argument errors. */
static pl_tensor *vec(int64_t n, const float *v) {
    return PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, &n, v, PL_CPU));
}
static float ssq_of(int n, pl_tensor **t) {
    return pl_tensor_item(PL_CK_NOTNULL(pl_sum_squares_multi(n, t)));
}
START_TEST(foreach_sum_squares_and_mul) {
    pl_frame_begin();
    pl_tensor *a[4] = {vec(3, (float[]){1, 2, 3}), vec(1, (float[]){4}), vec(0, (float[]){0}),
                       vec(2, (float[]){0.5f, -0.5f})};
    ck_assert(ssq_of(4, a) == 30.5f);
    ck_assert_int_eq(PL_CK_NOTNULL(pl_sum_squares_multi(1, &a[2]))->ndim, 0);
    ck_assert(ssq_of(1, &a[2]) == 0.0f); /* an empty tensor adds 0 */
    pl_tensor *s = PL_CK_NOTNULL(pl_tensor_scalar(0.5f, PL_CPU));
    PL_CK_OK(pl_mul_multi_(4, a, s));
    const float *v = pl_tensor_data(a[0]);
    ck_assert(v[0] == 0.5f && v[1] == 1.0f && v[2] == 1.5f && *(float *)pl_tensor_data(a[1]) == 2.0f);
    ck_assert(ssq_of(4, a) == 30.5f / 4);
    /* 40 tensors: two calls (32 + 8), the total 1^2 + ... + 40^2 */
    pl_tensor *m[40];
    for (int i = 0; i < 40; i++) m[i] = vec(1, (float[]){(float)(i + 1)});
    ck_assert(ssq_of(40, m) == 22140.0f);
    PL_CK_OK(pl_mul_multi_(40, m, PL_CK_NOTNULL(pl_tensor_scalar(-2.0f, PL_CPU))));
    ck_assert(*(float *)pl_tensor_data(m[39]) == -80.0f);
    ck_assert(ssq_of(40, m) == 4 * 22140.0f);
    /* NaN and inf propagate: an inf square is inf, NaN wins over inf */
    pl_tensor *inf[2] = {vec(2, (float[]){1, -INFINITY}), vec(1, (float[]){2})};
    ck_assert(isinf(ssq_of(2, inf)) && ssq_of(2, inf) > 0);
    pl_tensor *nan[3] = {inf[0], vec(1, (float[]){NAN}), inf[1]};
    ck_assert(isnan(ssq_of(3, nan)));
    PL_CK_OK(pl_mul_multi_(1, &inf[0], PL_CK_NOTNULL(pl_tensor_scalar(0.0f, PL_CPU))));
    ck_assert(isnan(((float *)pl_tensor_data(inf[0]))[1])); /* inf * 0 */
    PL_CK_OK(pl_mul_multi_(1, &inf[1], PL_CK_NOTNULL(pl_tensor_scalar(NAN, PL_CPU))));
    ck_assert(isnan(*(float *)pl_tensor_data(inf[1])));
    /* the chain's bits: 40 random tensors, one of 100003 elements; then with a
     * strided one (the list then takes the chain itself) */
    pl_tensor *r[41], *q[41];
    for (int i = 0; i < 40; i++) {
        int64_t n = i == 5 ? 100003 : 1 + (i * 53) % 777;
        r[i] = PL_CK_NOTNULL(pl_test_randn(1, &n, 900 + i));
        q[i] = PL_CK_NOTNULL(pl_tensor_to(r[i], PL_F32, PL_CPU));
    }
    for (int k = 0; k < 3; k++) { /* 40; after a multiply; 41 with the strided one first */
        int n = k < 2 ? 40 : 41;
        if (k == 2) {
            memmove(r + 1, r, 40 * sizeof *r);
            memmove(q + 1, q, 40 * sizeof *q);
            r[0] = q[0] = PL_CK_NOTNULL(pl_transpose(PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(7, 9), 77)), 0, 1));
        }
        pl_tensor *want = NULL;
        for (int i = 0; i < n; i++) {
            pl_tensor *t = PL_CK_NOTNULL(pl_sum(pl_square(q[i]), PL_ALL_DIMS, false));
            want = i ? PL_CK_NOTNULL(pl_add(want, t)) : t;
        }
        float got = ssq_of(n, r), w = pl_tensor_item(want);
        ck_assert_msg(memcmp(&got, &w, 4) == 0, "round %d: %.9g, the chain %.9g", k, got, w);
        pl_tensor *c = PL_CK_NOTNULL(pl_tensor_scalar(0.731f, PL_CPU));
        PL_CK_OK(pl_mul_multi_(n, r, c));
        for (int i = k == 2; i < n; i++) { /* r[0] is q[0] in round 2: multiplied once */
            PL_CK_OK(pl_tensor_copy_(q[i], PL_CK_NOTNULL(pl_mul(q[i], c))));
            ck_assert(memcmp(pl_tensor_data(r[i]), pl_tensor_data(q[i]), (size_t)pl_tensor_nbytes(r[i])) == 0);
        }
    }
    /* errors */
    ck_assert_ptr_null(pl_sum_squares_multi(0, a));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_tensor *holes[2] = {a[0], NULL};
    ck_assert_ptr_null(pl_sum_squares_multi(2, holes));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    ck_assert_int_eq(pl_mul_multi_(2, holes, s), PL_ERR_INVALID);
    ck_assert_int_eq(pl_mul_multi_(-1, a, s), PL_ERR_INVALID);
    ck_assert_int_eq(pl_mul_multi_(1, a, a[0]), PL_ERR_SHAPE); /* s of 3 elements */
    PL_CK_OK(pl_mul_multi_(0, NULL, s));
    pl_error_clear();
    pl_frame_end();
}
END_TEST

START_TEST(large_inputs_take_parallel_paths) {
    pl_tensor *x = randn_g(PL_SHAPE(300, 200), 160), *bias = randn_g(PL_SHAPE(200), 161);
    pl_frame_begin();
    pl_tensor *y = pl_add(x, bias);
    pl_tensor *sm = pl_softmax(y);
    for (int r = 0; r < 300; r += 37) {
        double s = 0;
        for (int j = 0; j < 200; j++)
            s += pl_tensor_get(sm, r * 200 + j);
        ck_assert_double_eq_tol(s, 1.0, 1e-5);
    }
    pl_tensor *g = pl_gelu(y, false);
    for (int i = 0; i < 60000; i += 997)
        ck_assert_double_eq_tol(pl_tensor_get(g, i), ref_act(A_GELU, pl_tensor_get(y, i)), 1e-5);
    pl_tensor *ln = pl_layer_norm(y, NULL, NULL, 1e-5);
    pl_tensor *m = pl_mean(pl_square(ln), -1, false); /* each row: variance / (var + eps) ~ 1 */
    for (int r = 0; r < 300; r += 29)
        ck_assert_double_eq_tol(pl_tensor_get(m, r), 1.0, 1e-3);
    /* d sum(x + bias)/dbias = 300 per column; d/dx = 1 */
    PL_CK_OK(pl_backward(pl_sum(y, PL_ALL_DIMS, false), 1.0));
    pl_frame_end();
    for (int j = 0; j < 200; j++)
        ck_assert_double_eq(pl_tensor_get(bias->grad, j), 300.0);
    for (int i = 0; i < 60000; i += 101)
        ck_assert_double_eq(pl_tensor_get(x->grad, i), 1.0);
    pl_tensor_release(x);
    pl_tensor_release(bias);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ops_dense");
    TCase *tc = tcase_create("dense");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, matmul_matches_reference_loop_all_transposes_and_batches);
    tcase_add_test(tc, matmul_gradients_match_finite_differences);
    tcase_add_test(tc, matmul_rejects_mismatched_inner_dims_and_dtypes);
    tcase_add_test(tc, matmul_bf16_is_f32_accumulated_and_rounded_once);
    tcase_add_test(tc, matmul_bf16_linear_shape_matches_exact_product);
    tcase_add_test(tc, matmul_bf16_gradients_reach_f32_leaves);
    tcase_add_test(tc, autocast_bf16_runs_matmul_and_linear_in_bf16);
    tcase_add_test(tc, linear_matches_reference_and_gradients);
    tcase_add_test(tc, binary_ops_broadcast_forward);
    tcase_add_test(tc, elu_matches_double_expm1);
    tcase_add_test(tc, binary_ops_broadcast_forward_merged_dims);
    tcase_add_test(tc, binary_ops_gradients_reduce_over_broadcast_dims);
    tcase_add_test(tc, same_tensor_twice_gets_both_gradients);
    tcase_add_test(tc, scale_and_add_scalar);
    tcase_add_test(tc, half_dtypes_promote_like_torch);
    tcase_add_test(tc, sum_and_mean_over_dims);
    tcase_add_test(tc, sum_and_mean_gradients);
    tcase_add_test(tc, activations_match_torch_formulas);
    tcase_add_test(tc, activation_gradients);
    tcase_add_test(tc, swiglu_matches_silu_times_up);
    tcase_add_test(tc, lora_add_matches_the_chain_and_central_differences);
    tcase_add_test(tc, lora_add_dropout_matches_the_chain_bit_for_bit);
    tcase_add_test(tc, lora_add_empty_products);
    tcase_add_test(tc, clamp_matches_torch);
    tcase_add_test(tc, softmax_and_log_softmax);
    tcase_add_test(tc, cross_entropy_hand_values);
    tcase_add_test(tc, cross_entropy_ignore_index_and_smoothing);
    tcase_add_test(tc, cross_entropy_long_rows_match_double_reference);
    tcase_add_test(tc, bf16_add_sub_scale_match_the_cast_round_trip);
    tcase_add_test(tc, cross_entropy_reads_bf16_logits_as_if_cast);
    tcase_add_test(tc, linear_cross_entropy_gradcheck);
    tcase_add_test(tc, linear_cross_entropy_matches_the_chain);
    tcase_add_test(tc, linear_cross_entropy_no_grad_and_errors);
    tcase_add_test(tc, regression_losses);
    tcase_add_test(tc, layer_norm_and_rms_norm_forward);
    tcase_add_test(tc, layer_norm_and_rms_norm_gradients);
    tcase_add_test(tc, cast_rounds_to_nearest_even_and_passes_gradient);
    tcase_add_test(tc, large_inputs_take_parallel_paths);
    tcase_add_test(tc, foreach_sum_squares_and_mul);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
