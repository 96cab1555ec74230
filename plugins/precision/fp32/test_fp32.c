/* test_fp32.c - fp32 precision, and the same model config trained under all
 * five precisions by changing one key (precision plugin / mode). */
#include <math.h>
#include <string.h>

#include "optim_testkit.h"
#include "prec_model.h"

typedef struct variant {
    const char *plugin, *body;
    pl_dtype autocast, base_dtype;
} variant;

static const variant k_variants[] = {
    {"fp32", "", PL_F32, PL_F32},
    {"bf16", "mode = bf16-mixed\n", PL_BF16, PL_F32},
    {"bf16", "mode = bf16-true\n", PL_BF16, PL_BF16},
    {"fp16", "", PL_F16, PL_F32},
    {"qlora4", "", PL_BF16, PL_NF4},
};

/* Train 30 SGD steps under one precision; returns first and last loss. */
static void run_variant(const variant *v, double *first, double *last, double *out0) {
    tk_run r;
    tk_init(&r);
    pm_add_params(r.ctx->params, 5);
    pl_status s = tk_try_open(&r, "precision", v->plugin, v->body);
    ck_assert_msg(s == PL_OK, "%s: %s", v->plugin, pl_error_message());
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(pl_autocast_get(), v->autocast);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "base.weight")->t->dtype, v->base_dtype);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "lora.A")->t->dtype, PL_F32);
    pl_tensor *x, *tg;
    pm_batch(&x, &tg);
    for (int i = 0; i < 30; i++) {
        bool stepped;
        double l = pm_train_step(vt, self, r.ctx->params, x, tg, 0.05, &stepped);
        ck_assert_msg(isfinite(l) && stepped, "%s %s step %d: loss %g", v->plugin, v->body, i, l);
        if (i == 0) *first = l;
        *last = l;
    }
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *y = pl_cast(pm_forward(r.ctx->params, x), PL_F32);
    *out0 = pl_tensor_get(y, 0);
    pl_frame_end();
    pl_no_grad_end();
    vt->destroy(self);
    pl_tensor_release(x);
    pl_tensor_release(tg);
    tk_close(&r);
}

START_TEST(same_model_trains_under_all_five_precisions) {
    double f0, l0, o0;
    run_variant(&k_variants[0], &f0, &l0, &o0);
    ck_assert_msg(l0 < 0.8 * f0, "fp32 did not learn: %g -> %g", f0, l0);
    for (size_t i = 1; i < sizeof k_variants / sizeof *k_variants; i++) {
        double f, l, o;
        run_variant(&k_variants[i], &f, &l, &o);
        ck_assert_msg(l < 0.8 * f, "%s %s did not learn: %g -> %g", k_variants[i].plugin,
                      k_variants[i].body, f, l);
        /* same data, same init: the first loss differs only by rounding
         * (half-precision matmuls; nf4 base ~ 10% weight error) */
        double tol = !strcmp(k_variants[i].plugin, "qlora4") ? 0.15 : 0.02;
        ck_assert_msg(fabs(f - f0) <= tol * f0, "%s %s: first loss %g vs fp32 %g",
                      k_variants[i].plugin, k_variants[i].body, f, f0);
    }
}
END_TEST

START_TEST(fp32_is_the_identity_precision) {
    tk_run r;
    tk_init(&r);
    pm_add_params(r.ctx->params, 5);
    PL_CK_OK(tk_try_open(&r, "precision", "fp32", "allow_tf32 = true\n"));
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    r.ctx->autocast = PL_BF16; /* setup must reset it */
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
    ck_assert_double_eq(vt->loss_scale(self), 1.0);
    for (int i = 0; i < pl_params_count(r.ctx->params); i++)
        ck_assert_int_eq(pl_params_at(r.ctx->params, i)->t->dtype, PL_F32);
    /* gradients pass through before_step untouched */
    pl_tensor *x, *tg;
    pm_batch(&x, &tg);
    pl_frame_begin();
    PL_CK_OK(pl_backward(pm_loss(r.ctx->params, x, tg), 1.0));
    pl_frame_end();
    pl_tensor *g = pl_params_find(r.ctx->params, "head.bias")->t->grad;
    double g0 = pl_tensor_get(g, 0);
    ck_assert(vt->before_step(self, r.ctx->params));
    ck_assert_double_eq(pl_tensor_get(g, 0), g0);
    vt->destroy(self);
    pl_tensor_release(x);
    pl_tensor_release(tg);
    tk_close(&r);
}
END_TEST

START_TEST(unknown_mode_is_refused_by_the_schema) {
    tk_run r;
    tk_init(&r);
    ck_assert_int_ne(tk_try_open(&r, "precision", "bf16", "mode = bf16-fast\n"), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "bf16-fast"), "%s", pl_error_message());
    tk_close(&r);
}
END_TEST

START_TEST(setup_converts_bf16_and_f16_parameters_to_f32) {
    /* lean loading: a model hands over checkpoint views in the file's dtype */
    pm_setup_converts_half_params("fp32", "", PL_F32, PL_F32);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp32");
    TCase *tc = tcase_create("fp32");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fp32_is_the_identity_precision);
    tcase_add_test(tc, same_model_trains_under_all_five_precisions);
    tcase_add_test(tc, unknown_mode_is_refused_by_the_schema);
    tcase_add_test(tc, setup_converts_bf16_and_f16_parameters_to_f32);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
