/* test_bf16.c - bf16-mixed autocast and bf16-true storage of frozen weights;
 * bf16 matmul within bf16 tolerance of f32. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim_testkit.h"
#include "prec_model.h"

START_TEST(bf16_matmul_is_within_bf16_tolerance_of_f32) {
    pl_tensor *a = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(33, 96), 1));
    pl_tensor *b = PL_CK_NOTNULL(pl_test_randn(PL_SHAPE(40, 96), 2));
    pl_frame_begin();
    pl_tensor *ref = PL_CK_NOTNULL(pl_matmul(a, b, false, true));
    PL_CK_OK(pl_autocast_begin(PL_BF16)); /* with torch.autocast(dtype=bfloat16) */
    pl_tensor *y = PL_CK_NOTNULL(pl_matmul(a, b, false, true));
    pl_autocast_end();
    ck_assert_int_eq(y->dtype, PL_BF16);
    /* inputs rounded to bf16 (rel 2^-9 each), f32 accumulation, output
     * rounded (rel 2^-9): |err| <= 2^-8 * sum|a||b| + 2^-9 |y| per element */
    for (int64_t i = 0; i < 33; i++)
        for (int64_t j = 0; j < 40; j++) {
            double s = 0;
            for (int64_t k = 0; k < 96; k++)
                s += fabs(pl_tensor_f32(a)[i * 96 + k] * pl_tensor_f32(b)[j * 96 + k]);
            double r = pl_tensor_get(ref, i * 40 + j), v = pl_tensor_get(y, i * 40 + j);
            ck_assert_msg(fabs(v - r) <= s / 256 + fabs(r) / 512, "(%lld,%lld): %g vs %g",
                          (long long)i, (long long)j, v, r);
        }
    double md = pl_test_max_abs_diff(y, ref);
    ck_assert_msg(md > 0, "bf16 result identical to f32: autocast had no effect");
    pl_frame_end();
    pl_tensor_release(a);
    pl_tensor_release(b);
}
END_TEST

static void *open_bf16(tk_run *r, const char *mode) {
    tk_init(r);
    pm_add_params(r->ctx->params, 5);
    char body[64];
    snprintf(body, sizeof body, "mode = %s\n", mode);
    PL_CK_OK(tk_try_open(r, "precision", "bf16", body));
    void *self = NULL;
    PL_CK_OK(((const pl_precision_vtable *)r->vtable)->create(r->sec, r->ctx, &self));
    return self;
}

START_TEST(bf16_mixed_keeps_f32_weights_and_saves_bf16_activations) {
    tk_run r;
    void *self = open_bf16(&r, "bf16-mixed");
    const pl_precision_vtable *vt = r.vtable;
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(pl_autocast_get(), PL_BF16);
    for (int i = 0; i < pl_params_count(r.ctx->params); i++)
        ck_assert_int_eq(pl_params_at(r.ctx->params, i)->t->dtype, PL_F32);
    pl_tensor *x, *tg;
    pm_batch(&x, &tg);
    pl_frame_begin();
    pl_tensor *y = pm_forward(r.ctx->params, x);
    ck_assert_int_eq(y->dtype, PL_BF16); /* the head linear ran in bf16 */
    pl_tensor *loss = pl_mse_loss(pl_cast(y, PL_F32), tg);
    ck_assert_int_eq(loss->dtype, PL_F32);
    PL_CK_OK(pl_backward(loss, 1.0));
    pl_frame_end();
    ck_assert_int_eq(pl_params_find(r.ctx->params, "lora.A")->t->grad->dtype, PL_F32);
    vt->destroy(self);
    pl_tensor_release(x);
    pl_tensor_release(tg);
    tk_close(&r);
}
END_TEST

START_TEST(bf16_true_stores_frozen_weights_in_bf16_in_place) {
    tk_run r;
    void *self = open_bf16(&r, "bf16-true");
    const pl_precision_vtable *vt = r.vtable;
    pl_tensor *w = pl_params_find(r.ctx->params, "base.weight")->t;
    pl_tensor *keep = pl_tensor_retain(w); /* a model's own pointer */
    pl_tensor *before = PL_CK_NOTNULL(pl_tensor_to(w, PL_F32, PL_CPU));
    size_t nb = pl_tensor_nbytes(w);
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    PL_CK_OK(vt->setup(self, r.ctx->params));
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert_ptr_eq(pl_params_find(r.ctx->params, "base.weight")->t, keep);
    ck_assert_int_eq(keep->dtype, PL_BF16);
    ck_assert_int_eq(pl_tensor_nbytes(keep), nb / 2);
    ck_assert_msg(s1.bytes_in_use < s0.bytes_in_use, "no memory freed: %zu -> %zu",
                  s0.bytes_in_use, s1.bytes_in_use);
    /* values are the bf16 rounding of the f32 weights */
    for (int64_t i = 0; i < pl_tensor_numel(keep); i++)
        ck_assert_float_eq((float)pl_tensor_get(keep, i),
                           pl_bf16_to_f32(pl_f32_to_bf16(pl_tensor_f32(before)[i])));
    /* trainable parameters stay f32 masters */
    ck_assert_int_eq(pl_params_find(r.ctx->params, "lora.A")->t->dtype, PL_F32);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "head.bias")->t->dtype, PL_F32);
    /* a second setup (after init_from) changes nothing */
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(keep->dtype, PL_BF16);
    pl_tensor_release(keep);
    pl_tensor_release(before);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(setup_keeps_each_mode_s_dtypes_for_bf16_and_f16_parameters) {
    /* lean loading: a model hands over checkpoint views in the file's dtype;
     * bf16-mixed keeps f32 weights, bf16-true keeps frozen weights in bf16
     * (a bf16 one as it is, an f16 one rounded) and trainable ones in f32 */
    pm_setup_converts_half_params("bf16", "mode = bf16-mixed\n", PL_F32, PL_F32);
    pm_setup_converts_half_params("bf16", "mode = bf16-true\n", PL_BF16, PL_BF16);
}
END_TEST

int main(void) {
    Suite *s = suite_create("bf16");
    TCase *tc = tcase_create("bf16");
    tcase_add_test(tc, bf16_matmul_is_within_bf16_tolerance_of_f32);
    tcase_add_test(tc, bf16_mixed_keeps_f32_weights_and_saves_bf16_activations);
    tcase_add_test(tc, bf16_true_stores_frozen_weights_in_bf16_in_place);
    tcase_add_test(tc, setup_keeps_each_mode_s_dtypes_for_bf16_and_f16_parameters);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
