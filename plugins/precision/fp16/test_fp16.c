/* test_fp16.c - GradScaler behaviour step by step (torch.cuda.amp.GradScaler:
 * unscale by 1/scale, skip on inf/NaN with backoff, growth after
 * growth_interval finite steps), state round trip, f16 autocast. */
#include <math.h>
#include <string.h>

#include "optim_testkit.h"
#include "pipeline/testing.h"
#include "prec_model.h"

static void set_grad(pl_tensor *t, const float *g) {
    if (!t->grad) t->grad = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, t->ndim, t->shape, PL_CPU));
    memcpy(pl_tensor_f32(t->grad), g, sizeof(float) * (size_t)pl_tensor_numel(t));
}

START_TEST(grad_scaler_unscales_grows_backs_off_and_skips) {
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(3), NULL, true);
    pl_tensor *frozen = tk_add_param(&r, "f", PL_SHAPE(2), NULL, false);
    tk_open(&r, "precision", "fp16", NULL, "init_scale = 1024\ngrowth_interval = 3\n");
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(pl_autocast_get(), PL_F16);
    (void)frozen;
    double expect_scale[] = {1024, 1024, 2048, 1024, 512, 512, 512, 1024};
    /* steps: finite, finite, finite (-> grow), inf (skip), nan (skip),
     * finite, finite, finite (-> grow) */
    for (int s = 0; s < 8; s++) {
        double sc = vt->loss_scale(self);
        float g[3] = {(float)(1.0 * sc), (float)(-2.5 * sc), (float)(0.25 * sc)};
        bool bad = s == 3 || s == 4;
        if (s == 3) g[1] = INFINITY;
        if (s == 4) g[2] = NAN;
        set_grad(p, g);
        bool stepped = vt->before_step(self, r.ctx->params);
        ck_assert_msg(stepped == !bad, "step %d: stepped %d", s, stepped);
        if (!bad) {
            /* unscaled in place before clipping / the optimizer */
            ck_assert_float_eq(pl_tensor_f32(p->grad)[0], 1.0f);
            ck_assert_float_eq(pl_tensor_f32(p->grad)[1], -2.5f);
            ck_assert_float_eq(pl_tensor_f32(p->grad)[2], 0.25f);
        }
        ck_assert_msg(vt->loss_scale(self) == expect_scale[s], "after step %d: scale %g, expected %g",
                      s, vt->loss_scale(self), expect_scale[s]);
    }
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

/* The same scaler on gradients that live on a device (the strict backend:
 * memory the host cannot touch): unscaled there, an inf or NaN found without
 * reading the gradients on the host, the same skips and scales as above. */
START_TEST(grad_scaler_on_device_gradients) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    const pl_device dev = {PL_DEVICE_CUDA, 0};
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(3), NULL, true);
    tk_open(&r, "precision", "fp16", NULL, "init_scale = 1024\ngrowth_interval = 3\n");
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    double expect_scale[] = {1024, 1024, 2048, 1024, 512, 512};
    for (int s = 0; s < 6; s++) {
        double sc = vt->loss_scale(self);
        float g[3] = {(float)(1.0 * sc), (float)(-2.5 * sc), (float)(0.25 * sc)};
        bool bad = s == 3 || s == 4;
        if (s == 3) g[1] = INFINITY;
        if (s == 4) g[2] = NAN;
        pl_tensor_release(p->grad);
        p->grad = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, PL_SHAPE(3), g, dev));
        bool stepped = vt->before_step(self, r.ctx->params);
        ck_assert_msg(stepped == !bad, "step %d: stepped %d", s, stepped);
        if (!bad) {
            pl_tensor *h = PL_CK_NOTNULL(pl_tensor_to(p->grad, PL_F32, PL_CPU));
            ck_assert_float_eq(pl_tensor_f32(h)[0], 1.0f);
            ck_assert_float_eq(pl_tensor_f32(h)[1], -2.5f);
            ck_assert_float_eq(pl_tensor_f32(h)[2], 0.25f);
            pl_tensor_release(h);
        }
        ck_assert_msg(vt->loss_scale(self) == expect_scale[s], "after step %d: scale %g, expected %g",
                      s, vt->loss_scale(self), expect_scale[s]);
    }
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(defaults_are_torch_grad_scaler_defaults) {
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(1), NULL, true);
    tk_open(&r, "precision", "fp16", NULL, NULL);
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_double_eq(vt->loss_scale(self), 65536.0);
    /* 1999 finite steps keep the scale, the 2000th doubles it */
    float g = 1.0f;
    for (int s = 0; s < 1999; s++) {
        set_grad(p, &g);
        ck_assert(vt->before_step(self, r.ctx->params));
    }
    ck_assert_double_eq(vt->loss_scale(self), 65536.0);
    set_grad(p, &g);
    ck_assert(vt->before_step(self, r.ctx->params));
    ck_assert_double_eq(vt->loss_scale(self), 131072.0);
    g = INFINITY;
    set_grad(p, &g);
    ck_assert(!vt->before_step(self, r.ctx->params));
    ck_assert_double_eq(vt->loss_scale(self), 65536.0);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(scale_and_tracker_survive_a_checkpoint) {
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(1), NULL, true);
    tk_open(&r, "precision", "fp16", NULL, "init_scale = 8\ngrowth_interval = 4\n");
    const pl_precision_vtable *vt = r.vtable;
    void *a = NULL, *b = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &a));
    float g = 8.0f;
    for (int s = 0; s < 3; s++) { /* tracker 3, scale 8 */
        set_grad(p, &g);
        ck_assert(vt->before_step(a, r.ctx->params));
    }
    tk_state *st = tk_state_save((tk_state_fn)vt->state, a);
    bool found;
    ck_assert_double_eq(tk_state_scalar(st, "fp16.v1.scale", &found), 8.0);
    ck_assert(found);
    ck_assert_double_eq(tk_state_scalar(st, "fp16.v1.growth_tracker", &found), 3.0);
    PL_CK_OK(vt->create(r.sec, r.ctx, &b));
    tk_state_load(st, (tk_state_fn)vt->state, b);
    /* one more finite step grows the scale in the restored scaler */
    set_grad(p, &g);
    ck_assert(vt->before_step(b, r.ctx->params));
    ck_assert_double_eq(vt->loss_scale(b), 16.0);
    tk_state_free(st);
    vt->destroy(a);
    vt->destroy(b);
    tk_close(&r);
}
END_TEST

START_TEST(setup_converts_bf16_and_f16_parameters_to_f32_masters) {
    /* lean loading: a model hands over checkpoint views in the file's dtype */
    pm_setup_converts_half_params("fp16", "", PL_F32, PL_F32);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fp16");
    TCase *tc = tcase_create("fp16");
    tcase_add_test(tc, grad_scaler_unscales_grows_backs_off_and_skips);
    tcase_add_test(tc, grad_scaler_on_device_gradients);
    tcase_add_test(tc, defaults_are_torch_grad_scaler_defaults);
    tcase_add_test(tc, scale_and_tracker_survive_a_checkpoint);
    tcase_add_test(tc, setup_converts_bf16_and_f16_parameters_to_f32_masters);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
