/* test_attention.c - the fused attention op (pl_attention, issue 35 item 2).
 *
 * Against the unfused chain it replaces in ilora (kv heads expanded with
 * index_select, matmul, add of the bias, causal_softmax, matmul): output
 * and the gradients of q, k, v, f32 at a tight tolerance, for T == L and
 * T < L (the last T queries), grouped-query heads (KV < H), with and without
 * a bias, causal or not; central differences of the op itself; bf16 inputs
 * within bf16 rounding of the f32 op; the errors of its checks; on the
 * strict device, the CPU's bits from one forward kernel launch. What the tape keeps
 * (q, k, v, out, logsumexp) is test_autograd_saved's row. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend_loader.h"
#include "internal.h"
#include "pl_test.h"
#include "registry.h"

typedef struct acase {
    int64_t B, H, KV, T, L, D;
    bool bias, causal;
    const char *what;
} acase;

static const acase g_cases[] = {
    {2, 4, 4, 6, 6, 8, true, true, "T == L, MHA, bias"},
    {2, 4, 2, 6, 6, 8, false, true, "T == L, GQA rep 2, no bias"},
    {1, 6, 2, 3, 7, 5, true, true, "T < L (last 3 of 7), GQA rep 3, bias"},
    {2, 2, 1, 1, 9, 16, true, true, "T 1 of L 9 (last_only), MQA"},
    {1, 2, 2, 4, 6, 8, true, false, "not causal, T < L"},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

/* A padding mask as ilora builds it: 0, or `masked` at the first b + 1 keys of
 * row b (-1e9 there; central differences need a bias that leaves every
 * score's change visible, so the gradient check uses -2.5). */
static pl_tensor *make_bias_v(const acase *c, float masked) {
    pl_tensor *t = pl_tensor_zeros(PL_F32, 4, (int64_t[]){c->B, 1, 1, c->L}, PL_CPU);
    float *p = pl_tensor_data(t);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < b + 1 && j < c->L - 1; j++)
            p[b * c->L + j] = masked;
    return t;
}
static pl_tensor *make_bias(const acase *c) {
    return make_bias_v(c, -1e9f);
}

/* The eager chain: softmax(scale (q k^T + bias / scale)) v on expanded kv heads. */
static pl_tensor *chain(pl_tensor *q, pl_tensor *k, pl_tensor *v, pl_tensor *bias, double scale,
                        bool causal) {
    int64_t H = q->shape[1], KV = k->shape[1], rep = H / KV;
    if (KV < H) {
        int64_t idx[64];
        for (int64_t h = 0; h < H; h++)
            idx[h] = h / rep;
        pl_tensor *ix = pl_tensor_from_data(PL_I64, 1, &H, idx, PL_CPU);
        k = pl_index_select(k, 1, ix);
        v = pl_index_select(v, 1, ix);
    }
    pl_tensor *sc = pl_matmul(q, k, false, true);
    if (bias) sc = pl_add(sc, pl_scale(bias, 1.0 / scale));
    pl_tensor *p = causal ? pl_causal_softmax(sc, scale) : pl_softmax(pl_scale(sc, scale));
    return pl_matmul(p, v, false, false);
}

static pl_tensor *leaf(int64_t B, int64_t H, int64_t T, int64_t D, uint64_t seed) {
    pl_tensor *t = pl_test_randn(4, (int64_t[]){B, H, T, D}, seed);
    pl_tensor_set_requires_grad(t, true);
    return t;
}

static void close_to(const char *what, const pl_tensor *got, const pl_tensor *want, double atol,
                     double rtol) {
    ck_assert_msg(got && want, "%s: missing (%s)", what, pl_error_message());
    ck_assert_int_eq(pl_tensor_numel(got), pl_tensor_numel(want));
    for (int64_t i = 0; i < pl_tensor_numel(got); i++) {
        double a = pl_tensor_get(got, i), b = pl_tensor_get(want, i);
        ck_assert_msg(fabs(a - b) <= atol + rtol * fabs(b), "%s[%lld]: %.8g, expected %.8g", what,
                      (long long)i, a, b);
    }
}

/* out, then the grads of q, k, v of sum(out * R), fused or chained: res[]
 * survive the frame, the caller releases them */
static void run(const acase *c, bool fused, pl_tensor *const in[3], pl_tensor *bias,
                pl_tensor *res[4]) {
    double scale = 1.0 / sqrt((double)c->D);
    for (int i = 0; i < 3; i++)
        pl_tensor_zero_grad(in[i]);
    pl_frame_begin();
    pl_tensor *y = fused ? pl_attention(in[0], in[1], in[2], bias, scale, c->causal)
                         : chain(in[0], in[1], in[2], bias, scale, c->causal);
    ck_assert_msg(y != NULL, "%s: %s", c->what, pl_error_message());
    pl_tensor *r = pl_test_rand(4, y->shape, -1, 1, 99);
    PL_CK_OK(pl_backward(pl_sum(pl_mul(pl_cast(y, PL_F32), r), PL_ALL_DIMS, false), 1.0));
    res[0] = pl_tensor_to(y, PL_F32, PL_CPU);
    for (int i = 0; i < 3; i++)
        res[1 + i] = pl_tensor_to(in[i]->grad, PL_F32, PL_CPU);
    for (int i = 0; i < 4; i++)
        pl_frame_keep(res[i]);
    pl_frame_end();
}

START_TEST(matches_the_unfused_chain_f32) {
    const acase *c = &g_cases[_i];
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    pl_frame_begin();
    pl_tensor *in[3] = {leaf(c->B, c->H, c->T, c->D, 1), leaf(c->B, c->KV, c->L, c->D, 2),
                        leaf(c->B, c->KV, c->L, c->D, 3)};
    pl_tensor *bias = c->bias ? make_bias(c) : NULL;
    pl_tensor *f[4], *e[4];
    run(c, true, in, bias, f);
    run(c, false, in, bias, e);
    char what[160];
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "%s: %s", c->what, names[i]);
        close_to(what, f[i], e[i], 2e-6, 2e-5);
    }
    pl_tensors_release(f, 4);
    pl_tensors_release(e, 4);
    pl_frame_end();
}
END_TEST

static pl_tensor *fn_fused(pl_tensor **in, int n, void *ctx) {
    const acase *c = ctx;
    (void)n;
    pl_tensor *bias = c->bias ? make_bias_v(c, -2.5f) : NULL;
    return pl_attention(in[0], in[1], in[2], bias, 1.0 / sqrt((double)c->D), c->causal);
}

START_TEST(gradients_match_central_differences) {
    const acase *c = &g_cases[_i];
    char msg[512];
    pl_frame_begin();
    pl_tensor *in[3] = {leaf(c->B, c->H, c->T, c->D, 11), leaf(c->B, c->KV, c->L, c->D, 12),
                        leaf(c->B, c->KV, c->L, c->D, 13)};
    bool ok = pl_gradcheck(fn_fused, in, 3, (void *)c, 1e-2, 2e-3, 2e-2, msg, sizeof msg);
    ck_assert_msg(ok, "%s: %s", c->what, msg);
    pl_frame_end();
}
END_TEST

/* bf16 q, k, v: the same f32 math on the rounded values, the output rounded
 * once to bf16 (8 significant bits); gradients (f32) read that output
 * through D_i = dO . O only, so they move at its rounding too. */
START_TEST(bf16_inputs_within_bf16_rounding) {
    const acase *c = &g_cases[_i];
    static const char *names[4] = {"out", "dq", "dk", "dv"};
    pl_frame_begin();
    int64_t sh[3][4] = {
        {c->B, c->H, c->T, c->D}, {c->B, c->KV, c->L, c->D}, {c->B, c->KV, c->L, c->D}};
    pl_tensor *hb[3], *hf[3];
    for (int i = 0; i < 3; i++) {
        hb[i] = pl_tensor_to(pl_test_randn(4, sh[i], 21 + i), PL_BF16, PL_CPU);
        hf[i] = pl_tensor_to(hb[i], PL_F32, PL_CPU); /* the same values, f32 */
        pl_tensor_set_requires_grad(hb[i], true);
        pl_tensor_set_requires_grad(hf[i], true);
    }
    pl_tensor *bias = c->bias ? pl_tensor_to(make_bias(c), PL_BF16, PL_CPU) : NULL;
    pl_tensor *b[4], *f[4];
    run(c, true, hb, bias, b);
    run(c, true, hf, bias, f);
    ck_assert_int_eq(hb[0]->grad->dtype, PL_F32);
    char what[160];
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "%s: bf16 %s", c->what, names[i]);
        close_to(what, b[i], f[i], 1e-2, 8e-3);
    }
    pl_tensors_release(b, 4);
    pl_tensors_release(f, 4);
    pl_frame_end();
}
END_TEST

START_TEST(checks_name_the_bad_input) {
    pl_frame_begin();
    pl_tensor *q = pl_test_randn(4, (int64_t[]){2, 6, 4, 8}, 1);
    pl_tensor *k = pl_test_randn(4, (int64_t[]){2, 4, 4, 8}, 2);
    ck_assert_ptr_null(pl_attention(q, k, k, NULL, 0.3, true));
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "multiple of KV"));
    pl_tensor *k2 = pl_test_randn(4, (int64_t[]){2, 2, 3, 8}, 3);
    ck_assert_ptr_null(pl_attention(q, k2, k2, NULL, 0.3, true)); /* T 4 > L 3 */
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "T <= L"));
    ck_assert_ptr_nonnull(pl_attention(q, k2, k2, NULL, 0.3, false)); /* fine without causal */
    pl_tensor *k3 = pl_test_randn(4, (int64_t[]){2, 2, 4, 4}, 4);
    ck_assert_ptr_null(pl_attention(q, k3, k3, NULL, 0.3, true)); /* Dh 4 vs 8 */
    ck_assert_int_eq(pl_error_status(), PL_ERR_SHAPE);
    pl_tensor *k4 = pl_test_randn(4, (int64_t[]){2, 2, 4, 8}, 5);
    pl_tensor *bad = pl_tensor_zeros(PL_F32, 4, (int64_t[]){2, 1, 4, 4}, PL_CPU);
    ck_assert_ptr_null(pl_attention(q, k4, k4, bad, 0.3, true));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "bias"));
    ck_assert_ptr_null(pl_attention(q, k4, pl_tensor_to(k4, PL_BF16, PL_CPU), NULL, 0.3, true));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    ck_assert_ptr_null(pl_attention(q, k4, k4, NULL, NAN, true));
    ck_assert_int_eq(pl_error_status(), PL_ERR_INVALID);
    pl_tensor *gb = pl_tensor_zeros(PL_F32, 4, (int64_t[]){1, 1, 1, 4}, PL_CPU);
    pl_tensor_set_requires_grad(gb, true);
    ck_assert_ptr_null(pl_attention(q, k4, k4, gb, 0.3, true));
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "fixed additive mask"));
    ck_assert_ptr_null(pl_attention(q, NULL, k4, NULL, 0.3, true));
    pl_frame_end();
}
END_TEST

static pl_device strict_device(void) {
    pl_registry *reg = pl_registry_new();
    ck_assert_ptr_nonnull(reg);
    PL_CK_OK(pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR));
    PL_CK_OK(pl_backend_load_named(reg, PL_DEVICE_CUDA, "strict"));
    pl_registry_free(reg);
    return (pl_device){PL_DEVICE_CUDA, 0};
}

static uint64_t launches(const pl_backend *b) {
    pl_backend_counters n = {.struct_size = sizeof n};
    PL_CK_OK(b->counters(&n));
    return n.kernel_calls;
}

/* On the strict device (GPU-like memory, the CPU's kernels): the forward is
 * one launch, and forward and backward give the CPU's bits. */
START_TEST(strict_device_one_launch_same_bits) {
    const acase *c = &g_cases[2];
    pl_device dev = strict_device();
    const pl_backend *be = pl_backend_get(PL_DEVICE_CUDA);
    ck_assert_ptr_nonnull(be);
    ck_assert_str_eq(be->name, "strict");
    pl_frame_begin();
    int64_t sh[3][4] = {
        {c->B, c->H, c->T, c->D}, {c->B, c->KV, c->L, c->D}, {c->B, c->KV, c->L, c->D}};
    pl_tensor *hin[3], *din[3];
    for (int i = 0; i < 3; i++) {
        hin[i] = pl_test_randn(4, sh[i], 31 + i);
        din[i] = pl_tensor_to(hin[i], PL_F32, dev);
        pl_tensor_set_requires_grad(din[i], true);
        pl_tensor_set_requires_grad(hin[i], true);
    }
    pl_tensor *bias = pl_tensor_to(make_bias(c), PL_F32, dev);
    double scale = 1.0 / sqrt((double)c->D);
    uint64_t n0 = launches(be);
    pl_tensor *y = pl_attention(din[0], din[1], din[2], bias, scale, true);
    ck_assert_msg(y != NULL, "%s", pl_error_message());
    ck_assert_uint_eq(launches(be) - n0, 1);
    pl_tensor *g = pl_tensor_to(pl_test_rand(4, y->shape, -1, 1, 5), PL_F32, dev);
    pl_tensor *l = pl_sum(pl_mul(y, g), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(l, 1.0));
    pl_tensor *hb = make_bias(c);
    pl_tensor *hy = pl_attention(hin[0], hin[1], hin[2], hb, scale, true);
    pl_tensor *hl = pl_sum(pl_mul(hy, pl_tensor_to(g, PL_F32, PL_CPU)), PL_ALL_DIMS, false);
    PL_CK_OK(pl_backward(hl, 1.0));
    ck_assert(pl_test_max_abs_diff(pl_tensor_to(y, PL_F32, PL_CPU), hy) == 0.0);
    for (int i = 0; i < 3; i++)
        ck_assert(pl_test_max_abs_diff(pl_tensor_to(din[i]->grad, PL_F32, PL_CPU), hin[i]->grad) ==
                  0.0);
    pl_frame_end();
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, matches_the_unfused_chain_f32, 0, N_CASES);
    tcase_add_loop_test(tc, gradients_match_central_differences, 0, N_CASES);
    tcase_add_loop_test(tc, bf16_inputs_within_bf16_rounding, 0, N_CASES);
    tcase_add_test(tc, checks_name_the_bad_input);
    tcase_add_test(tc, strict_device_one_launch_same_bits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return pl_test_run(suite());
}
