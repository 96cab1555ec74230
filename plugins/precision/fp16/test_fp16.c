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

/* ---- the device GradScaler (ABI 2.11: loss_scale_tensor, before_step_device) ---- */

static const pl_device g_strict = {PL_DEVICE_CUDA, 0};

static uint64_t host_reads(void) {
    const pl_backend *b = pl_backend_get(PL_DEVICE_CUDA);
    pl_backend_counters c = {.struct_size = sizeof c};
    ck_assert(b && PL_BACKEND_HAS(b, counters) && b->counters);
    PL_CK_OK(b->counters(&c));
    return c.host_reads;
}

static pl_tensor *dev_f32(const float *v, int64_t n, pl_device d) {
    return PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, (int64_t[]){n}, v, d));
}

static float read_f32(const pl_tensor *t, int64_t i) {
    pl_frame_begin();
    pl_tensor *h = PL_CK_NOTNULL(pl_tensor_to(t, t->dtype, PL_CPU));
    float v = (float)pl_tensor_get(h, i);
    pl_frame_end();
    return v;
}

/* The first test's sequence with the scaler on the strict device, as the
 * trainer drives it: found_inf zeroed for the step (the trainer's loss * 0),
 * before_step_device; the same skips (found_inf 1, so the optimizer kernels
 * skip), the same scales, the gradients unscaled in place, and not one host
 * read in the 8 steps (the scale is read back only after them). */
START_TEST(device_grad_scaler_same_sequence_no_host_read) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(3), NULL, true);
    tk_open(&r, "precision", "fp16", NULL, "init_scale = 1024\ngrowth_interval = 3\n");
    const pl_precision_vtable *vt = r.vtable;
    ck_assert_ptr_nonnull(vt->loss_scale_tensor);
    ck_assert_ptr_nonnull(vt->before_step_device);
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    pl_tensor *sc = PL_CK_NOTNULL(vt->loss_scale_tensor(self, g_strict));
    ck_assert_ptr_eq(vt->loss_scale_tensor(self, g_strict), sc); /* one tensor for the run */
    ck_assert(sc->dtype == PL_F32 && pl_tensor_numel(sc) == 1 && sc->device.type == PL_DEVICE_CUDA);
    pl_tensor *found = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, g_strict));
    const double expect_scale[] = {1024, 1024, 2048, 1024, 512, 512, 512, 1024};
    double sc_host = 1024; /* the scale the step's gradients were made with */
    for (int s = 0; s < 8; s++) {
        float g[3] = {(float)(1.0 * sc_host), (float)(-2.5 * sc_host), (float)(0.25 * sc_host)};
        if (s == 3) g[1] = INFINITY;
        if (s == 4) g[2] = NAN;
        pl_tensor_release(p->grad);
        p->grad = dev_f32(g, 3, g_strict);
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        uint64_t r0 = host_reads();
        PL_CK_OK(vt->before_step_device(self, r.ctx->params, found));
        ck_assert_uint_eq(host_reads(), r0);
        bool bad = s == 3 || s == 4;
        ck_assert_msg(read_f32(found, 0) == (bad ? 1.0f : 0.0f), "step %d: found_inf %g", s,
                      read_f32(found, 0));
        if (!bad) {
            ck_assert_float_eq(read_f32(p->grad, 0), 1.0f);
            ck_assert_float_eq(read_f32(p->grad, 1), -2.5f);
            ck_assert_float_eq(read_f32(p->grad, 2), 0.25f);
        }
        sc_host = vt->loss_scale(self); /* reads the device scale back (the test's read) */
        ck_assert_msg(sc_host == expect_scale[s], "after step %d: scale %g, expected %g", s,
                      sc_host, expect_scale[s]);
        ck_assert_float_eq(read_f32(sc, 0), (float)expect_scale[s]);
    }
    /* a NaN found_inf (the trainer's non-finite loss) backs off too */
    PL_CK_OK(pl_tensor_fill_(found, NAN));
    PL_CK_OK(vt->before_step_device(self, r.ctx->params, found));
    ck_assert_double_eq(vt->loss_scale(self), 512.0);
    /* checkpoint state: read from the device, and written back on load */
    tk_state *st = tk_state_save((tk_state_fn)vt->state, self);
    bool ok;
    ck_assert_double_eq(tk_state_scalar(st, "fp16.v1.scale", &ok), 512.0);
    ck_assert(ok);
    ck_assert_double_eq(tk_state_scalar(st, "fp16.v1.growth_tracker", &ok), 0.0);
    void *b = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &b));
    pl_tensor *scb = PL_CK_NOTNULL(vt->loss_scale_tensor(b, g_strict));
    ck_assert_float_eq(read_f32(scb, 0), 1024.0f);
    tk_state_load(st, (tk_state_fn)vt->state, b);
    ck_assert_float_eq(read_f32(scb, 0), 512.0f);
    tk_state_free(st);
    pl_tensor_release(found);
    vt->destroy(b);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

/* The host path (CPU) and the device path (strict) on the same gradients,
 * with a scale that is no power of two (init_scale 3, growth 1.5, backoff
 * 0.3): the same unscaled gradients and scales, bit for bit. */
START_TEST(host_and_device_scalers_agree_bit_for_bit) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    tk_run r;
    tk_init(&r);
    pl_tensor *p = tk_add_param(&r, "w", PL_SHAPE(5), NULL, true);
    tk_open(&r, "precision", "fp16", NULL,
            "init_scale = 3\ngrowth_interval = 2\ngrowth_factor = 1.5\nbackoff_factor = 0.3\n");
    const pl_precision_vtable *vt = r.vtable;
    void *h = NULL, *d = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &h));
    PL_CK_OK(vt->create(r.sec, r.ctx, &d));
    PL_CK_NOTNULL(vt->loss_scale_tensor(d, g_strict));
    pl_tensor *found = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, g_strict));
    for (int s = 0; s < 9; s++) {
        float g[5];
        for (int i = 0; i < 5; i++) g[i] = (float)((i + 1) * 0.7311 * (s + 1) - 1.9);
        if (s == 4) g[2] = -INFINITY;
        set_grad(p, g);
        bool stepped = vt->before_step(h, r.ctx->params);
        float gh[5];
        memcpy(gh, pl_tensor_f32(p->grad), sizeof gh);
        pl_tensor_release(p->grad);
        p->grad = dev_f32(g, 5, g_strict);
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        PL_CK_OK(vt->before_step_device(d, r.ctx->params, found));
        ck_assert_int_eq(stepped, read_f32(found, 0) == 0.0f);
        for (int i = 0; i < 5 && stepped; i++)
            ck_assert_msg(memcmp(&gh[i], &(float){read_f32(p->grad, i)}, 4) == 0,
                          "step %d element %d: host %a, device %a", s, i, gh[i], read_f32(p->grad, i));
        ck_assert_msg(vt->loss_scale(h) == vt->loss_scale(d), "step %d: host scale %a, device %a", s,
                      vt->loss_scale(h), vt->loss_scale(d));
        pl_tensor_release(p->grad);
        p->grad = NULL;
    }
    pl_tensor_release(found);
    vt->destroy(h);
    vt->destroy(d);
    tk_close(&r);
}
END_TEST

/* fp16's GradScaler with adamw: 9 steps, an -inf gradient at step 4 and a
 * NaN at step 5, both skipped. Host path (CPU): before_step answers false and
 * the trainer calls no optimizer step (torch's GradScaler with a non-fused
 * optimizer). Device path (strict): before_step_device sets found_inf and
 * the optimizer step runs with it (torch's fused AdamW: state_steps += 1 -
 * found_inf), reading nothing back. The same weights bit for bit, and AdamW's
 * step count 7 in both: the skips advanced neither (before ABI 2.12 the
 * device path counted 9, and its last three steps used t two higher). */
START_TEST(scaler_skips_leave_adamw_step_count_on_both_paths) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    float final[2][5];
    for (int dev = 0; dev < 2; dev++) {
        tk_run r;
        tk_init(&r);
        tk_add_param(&r, "w", PL_SHAPE(5), (const double[]){0.5, -1, 0.25, 2, -0.125}, true);
        if (dev) {
            pl_tensor *d = PL_CK_NOTNULL(pl_tensor_to(pl_params_at(r.ctx->params, 0)->t, PL_F32, g_strict));
            pl_tensor_set_requires_grad(d, true);
            PL_CK_OK(pl_params_replace(r.ctx->params, 0, d));
            pl_tensor_release(d);
        }
        pl_tensor *p = pl_params_at(r.ctx->params, 0)->t;
        tk_open(&r, "precision", "fp16", NULL, "init_scale = 8\ngrowth_interval = 3\n");
        const pl_precision_vtable *vt = r.vtable;
        void *prec = NULL;
        PL_CK_OK(vt->create(r.sec, r.ctx, &prec));
        tk_optimizer(&r, "adamw", "lr = 0.05\nweight_decay = 0.01\n");
        const pl_optimizer_vtable *opt = r.ctx->optimizer;
        pl_tensor *found = NULL;
        if (dev) {
            PL_CK_NOTNULL(vt->loss_scale_tensor(prec, g_strict));
            found = PL_CK_NOTNULL(pl_tensor_zeros_owned(PL_F32, 1, (int64_t[]){1}, g_strict));
        }
        for (int s = 0; s < 9; s++) {
            float g[5];
            for (int i = 0; i < 5; i++) g[i] = (float)(8.0 * ((i + 1) * 0.37 * (s % 4 + 1) - 0.9));
            if (s == 4) g[1] = -INFINITY;
            if (s == 5) g[3] = NAN;
            pl_tensor_release(p->grad);
            p->grad = dev_f32(g, 5, p->device);
            if (!dev) {
                if (vt->before_step(prec, r.ctx->params)) PL_CK_OK(opt->step(r.optim_self));
                continue;
            }
            uint64_t r0 = host_reads();
            PL_CK_OK(pl_tensor_fill_(found, 0.0));
            PL_CK_OK(vt->before_step_device(prec, r.ctx->params, found));
            pl_optim_set_found_inf(found);
            pl_status st = opt->step(r.optim_self);
            pl_optim_set_found_inf(NULL);
            PL_CK_OK(st);
            ck_assert_uint_eq(host_reads(), r0);
        }
        for (int i = 0; i < 5; i++) final[dev][i] = read_f32(p, i);
        tk_state *st = tk_state_save((tk_state_fn)opt->state, r.optim_self);
        bool ok;
        ck_assert_double_eq(tk_state_scalar(st, "adamw.step.w", &ok), 7.0);
        ck_assert(ok);
        tk_state_free(st);
        pl_tensor_release(found);
        vt->destroy(prec);
        tk_close(&r);
    }
    for (int i = 0; i < 5; i++)
        ck_assert_msg(memcmp(&final[0][i], &final[1][i], 4) == 0, "w[%d]: host path %a, device %a",
                      i, final[0][i], final[1][i]);
}
END_TEST

/* ---- the ops (pl_amp_unscale_multi_, pl_amp_update_scale_) vs hand-computed
 * values, on the CPU and on the strict device ---- */

static pl_device amp_dev(int i) { return i ? g_strict : PL_CPU; }

START_TEST(amp_unscale_multi_by_hand) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    for (int di = 0; di < 2; di++) {
        pl_device d = amp_dev(di);
        pl_frame_begin();
        pl_tensor *inv = dev_f32((float[]){0.25f}, 1, d), *one = dev_f32((float[]){1.0f}, 1, d);
        pl_tensor *found = dev_f32((float[]){0.0f}, 1, d);
        pl_tensor *g[2] = {dev_f32((float[]){2, -4, 8}, 3, d), dev_f32((float[]){-0.5f, 1e-40f}, 2, d)};
        PL_CK_OK(pl_amp_unscale_multi_(2, g, found, inv));
        ck_assert_float_eq(read_f32(found, 0), 0.0f);
        ck_assert_float_eq(read_f32(g[0], 0), 0.5f);
        ck_assert_float_eq(read_f32(g[0], 1), -1.0f);
        ck_assert_float_eq(read_f32(g[0], 2), 2.0f);
        ck_assert_float_eq(read_f32(g[1], 0), -0.125f);
        ck_assert_float_eq(read_f32(g[1], 1), 1e-40f * 0.25f); /* a subnormal, f32 product */
        /* an inf: found_inf 1, the other elements still unscaled, the inf stays inf */
        pl_tensor *gi = dev_f32((float[]){4, INFINITY, -8}, 3, d);
        PL_CK_OK(pl_amp_unscale_multi_(1, &gi, found, inv));
        ck_assert_float_eq(read_f32(found, 0), 1.0f);
        ck_assert_float_eq(read_f32(gi, 0), 1.0f);
        ck_assert(isinf(read_f32(gi, 1)) && read_f32(gi, 1) > 0);
        ck_assert_float_eq(read_f32(gi, 2), -2.0f);
        /* never cleared: finite gradients leave found_inf at 1 */
        pl_tensor *gf = dev_f32((float[]){4}, 1, d);
        PL_CK_OK(pl_amp_unscale_multi_(1, &gf, found, inv));
        ck_assert_float_eq(read_f32(found, 0), 1.0f);
        ck_assert_float_eq(read_f32(gf, 0), 1.0f);
        /* a NaN, found as it arrives; inv_scale 1 leaves the values as they are */
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        pl_tensor *gn = dev_f32((float[]){3, NAN}, 2, d);
        PL_CK_OK(pl_amp_unscale_multi_(1, &gn, found, one));
        ck_assert_float_eq(read_f32(found, 0), 1.0f);
        ck_assert_float_eq(read_f32(gn, 0), 3.0f);
        ck_assert(isnan(read_f32(gn, 1)));
        /* checked as it arrives, as torch's: a finite value that the multiply
         * overflows (inv_scale > 1: a scale below 1) is not found */
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        pl_tensor *four = dev_f32((float[]){4.0f}, 1, d), *gb = dev_f32((float[]){3e38f}, 1, d);
        PL_CK_OK(pl_amp_unscale_multi_(1, &gb, found, four));
        ck_assert_float_eq(read_f32(found, 0), 0.0f);
        ck_assert(isinf(read_f32(gb, 0)));
        /* 40 tensors (two calls of at most 32): an inf in tensor 35 is found,
         * every tensor unscaled; n = 0 does nothing */
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        pl_tensor *many[40];
        for (int i = 0; i < 40; i++) many[i] = dev_f32((float[]){(float)i, i == 35 ? -INFINITY : 8.0f}, 2, d);
        PL_CK_OK(pl_amp_unscale_multi_(40, many, found, inv));
        ck_assert_float_eq(read_f32(found, 0), 1.0f);
        for (int i = 0; i < 40; i++) {
            ck_assert_float_eq(read_f32(many[i], 0), (float)i * 0.25f);
            if (i != 35) ck_assert_float_eq(read_f32(many[i], 1), 2.0f);
        }
        PL_CK_OK(pl_tensor_fill_(found, 0.0));
        PL_CK_OK(pl_amp_unscale_multi_(0, NULL, found, inv));
        ck_assert_float_eq(read_f32(found, 0), 0.0f);
        /* errors name what is wrong */
        pl_tensor *f2 = dev_f32((float[]){0, 0}, 2, d);
        ck_assert_int_eq(pl_amp_unscale_multi_(1, g, f2, inv), PL_ERR_SHAPE);
        ck_assert_ptr_nonnull(strstr(pl_error_message(), "found_inf"));
        ck_assert_int_eq(pl_amp_unscale_multi_(-1, g, found, inv), PL_ERR_INVALID);
        if (di) {
            pl_tensor *hc = dev_f32((float[]){1}, 1, PL_CPU);
            ck_assert_int_eq(pl_amp_unscale_multi_(1, &hc, found, inv), PL_ERR_DEVICE);
        }
        pl_frame_end();
        pl_error_clear();
    }
}
END_TEST

/* Steps of _amp_update_scale_ from (scale, tracker, found_inf), growth 2,
 * backoff 0.5 unless given. */
static void upd(pl_device d, float s0, int32_t t0, float found, double gf, double bf, int64_t gi,
                float s1, int32_t t1) {
    pl_frame_begin();
    pl_tensor *s = dev_f32(&s0, 1, d), *f = dev_f32(&found, 1, d);
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_data(PL_I32, 1, (int64_t[]){1}, &t0, d));
    PL_CK_OK(pl_amp_update_scale_(s, t, f, gf, bf, gi));
    pl_tensor *th = PL_CK_NOTNULL(pl_tensor_to(t, PL_I32, PL_CPU));
    int32_t tr = *(const int32_t *)pl_tensor_data(th);
    float sv = read_f32(s, 0);
    ck_assert_msg(memcmp(&sv, &s1, sizeof sv) == 0 && tr == t1,
                  "(scale %a, tracker %d, found %g, growth %g, backoff %g, interval %lld): "
                  "scale %a tracker %d, expected %a %d", s0, t0, found, gf, bf, (long long)gi, sv,
                  tr, s1, t1);
    pl_frame_end();
}

START_TEST(amp_update_scale_by_hand) {
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    for (int di = 0; di < 2; di++) {
        pl_device d = amp_dev(di);
        upd(d, 1024, 0, 0, 2, 0.5, 3, 1024, 1);     /* finite: count */
        upd(d, 1024, 1, 0, 2, 0.5, 3, 1024, 2);
        upd(d, 1024, 2, 0, 2, 0.5, 3, 2048, 0);     /* the interval's boundary: grow, reset */
        upd(d, 1024, 0, 0, 2, 0.5, 1, 2048, 0);     /* interval 1: every finite step grows */
        upd(d, 1024, 2, 1, 2, 0.5, 3, 512, 0);      /* found: back off, reset */
        upd(d, 1024, 1, NAN, 2, 0.5, 3, 512, 0);    /* NaN counts as found */
        upd(d, 1024, 1, -1, 2, 0.5, 3, 512, 0);     /* any non-zero */
        upd(d, 0x1p127f, 2, 0, 2, 0.5, 3, 0x1p127f, 0); /* growth to inf: kept, reset */
        upd(d, 3e38f, 0, 0, 2, 0.5, 1, 3e38f, 0);
        /* products in double, rounded to f32 once */
        upd(d, 3, 0, 1, 2, 0.1, 3, (float)(3.0 * 0.1), 0);
        upd(d, 3, 4, 0, 1.1, 0.5, 5, (float)(3.0 * 1.1), 0);
        pl_frame_begin();
        pl_tensor *s = dev_f32((float[]){1}, 1, d), *f = dev_f32((float[]){0}, 1, d);
        pl_tensor *tf = dev_f32((float[]){0}, 1, d);
        int32_t z = 0;
        pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_data(PL_I32, 1, (int64_t[]){1}, &z, d));
        ck_assert_int_eq(pl_amp_update_scale_(s, tf, f, 2, 0.5, 3), PL_ERR_SHAPE);
        ck_assert_ptr_nonnull(strstr(pl_error_message(), "growth_tracker"));
        ck_assert_int_eq(pl_amp_update_scale_(s, t, f, 2, 0.5, 0), PL_ERR_INVALID);
        ck_assert_int_eq(pl_amp_update_scale_(s, t, f, 2, 0.5, (int64_t)INT32_MAX + 1), PL_ERR_INVALID);
        ck_assert_int_eq(pl_amp_update_scale_(s, t, NULL, 2, 0.5, 3), PL_ERR_INVALID);
        pl_frame_end();
        pl_error_clear();
    }
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
    tcase_add_test(tc, device_grad_scaler_same_sequence_no_host_read);
    tcase_add_test(tc, host_and_device_scalers_agree_bit_for_bit);
    tcase_add_test(tc, scaler_skips_leave_adamw_step_count_on_both_paths);
    tcase_add_test(tc, amp_unscale_multi_by_hand);
    tcase_add_test(tc, amp_update_scale_by_hand);
    tcase_add_test(tc, defaults_are_torch_grad_scaler_defaults);
    tcase_add_test(tc, scale_and_tracker_survive_a_checkpoint);
    tcase_add_test(tc, setup_converts_bf16_and_f16_parameters_to_f32_masters);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
