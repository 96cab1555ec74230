/* test_qlora4.c - qlora4 precision: which parameters are quantized, the
 * checkpoint round trip (codes + versioned quantization state -> identical
 * outputs), loading a qlora4 checkpoint onto an fp32 base, and nf4 refusal
 * by ordinary ops. Checkpoints are written the way the trainer writes them:
 * every parameter under its name, the plugin's state under "precision.". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optim_testkit.h"
#include "prec_model.h"
#include "../common/prec_load.h"
#include "pipeline/nf4.h"
#include "pipeline/testing.h"

typedef struct ck {
    pl_st_writer *w;
    pl_st_file *f;
} ck;

static pl_status ck_tensor(void *ctx, const char *name, pl_tensor *t) {
    ck *c = ctx;
    char full[256];
    snprintf(full, sizeof full, "precision.%s", name);
    return c->w ? pl_st_writer_add(c->w, full, t) : pl_st_load_into(c->f, full, t);
}

static pl_status ck_scalar(void *ctx, const char *name, double *v) {
    ck *c = ctx;
    char full[256], buf[64];
    snprintf(full, sizeof full, "precision.%s", name);
    if (c->w) {
        snprintf(buf, sizeof buf, "%.17g", *v);
        return pl_st_writer_meta(c->w, full, buf);
    }
    const char *s = pl_st_meta(c->f, full);
    if (!s) return pl_error_set(PL_ERR_IO, "metadata '%s' missing", full);
    *v = strtod(s, NULL);
    return PL_OK;
}

static void *open_q(tk_run *r, uint64_t seed, const char *body) {
    tk_init(r);
    pm_add_params(r->ctx->params, seed);
    PL_CK_OK(tk_try_open(r, "precision", "qlora4", body));
    void *self = NULL;
    PL_CK_OK(((const pl_precision_vtable *)r->vtable)->create(r->sec, r->ctx, &self));
    return self;
}

static void outputs(pl_params *ps, pl_tensor *x, float *out) {
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *y = PL_CK_NOTNULL(pl_cast(pm_forward(ps, x), PL_F32));
    memcpy(out, pl_tensor_f32(y), sizeof(float) * PM_B);
    pl_frame_end();
    pl_no_grad_end();
}

START_TEST(only_frozen_2d_base_weights_are_quantized) {
    tk_run r;
    void *self = open_q(&r, 5, "");
    const pl_precision_vtable *vt = r.vtable;
    pl_alloc_stats s0 = pl_alloc_get_stats(PL_CPU);
    PL_CK_OK(vt->setup(self, r.ctx->params));
    pl_alloc_stats s1 = pl_alloc_get_stats(PL_CPU);
    ck_assert_int_eq(pl_autocast_get(), PL_BF16);
    pl_tensor *w = pl_params_find(r.ctx->params, "base.weight")->t;
    ck_assert_int_eq(w->dtype, PL_NF4);
    ck_assert_str_eq(w->name, "base.weight");
    ck_assert_int_eq(w->quant.block, 64);
    ck_assert_int_eq(w->quant.absmax->dtype, PL_U8); /* double_quant default */
    ck_assert_ptr_nonnull(w->quant.absmax_scale);
    ck_assert_msg(s1.bytes_in_use < s0.bytes_in_use, "f32 base not freed: %zu -> %zu",
                  s0.bytes_in_use, s1.bytes_in_use);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "lora.A")->t->dtype, PL_F32);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "lora.B")->t->dtype, PL_F32);
    ck_assert_int_eq(pl_params_find(r.ctx->params, "head.weight")->t->dtype, PL_F32);
    /* idempotent (the trainer calls setup again after init_from) */
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_ptr_eq(pl_params_find(r.ctx->params, "base.weight")->t, w);
    /* any other op refuses the nf4 parameter, naming it */
    pl_tensor *x, *tg;
    pm_batch(&x, &tg);
    pl_frame_begin();
    pl_error_clear();
    ck_assert_ptr_null(pl_linear(x, w, NULL));
    ck_assert_int_eq(pl_error_status(), PL_ERR_DTYPE);
    ck_assert_msg(strstr(pl_error_message(), "base.weight"), "%s", pl_error_message());
    pl_frame_end();
    pl_tensor_release(x);
    pl_tensor_release(tg);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

static void save_ckpt(const char *path, tk_run *r, const pl_precision_vtable *vt, void *self) {
    ck c = {.w = PL_CK_NOTNULL(pl_st_writer_new(path))};
    for (int i = 0; i < pl_params_count(r->ctx->params); i++) {
        pl_param *p = pl_params_at(r->ctx->params, i);
        PL_CK_OK(pl_st_writer_add(c.w, p->name, p->t));
    }
    pl_state_visitor v = {&c, ck_tensor, ck_scalar};
    PL_CK_OK(vt->state(self, &v));
    PL_CK_OK(pl_st_writer_commit(c.w));
    pl_st_writer_free(c.w);
}

/* convert_param (ABI 2.7): a parameter sealed while the model is built is
 * quantized at once, exactly as setup() would, inside whatever frame the
 * model has open; setup() then leaves it; a trainable one is not touched. */
START_TEST(convert_param_quantizes_a_sealed_base_weight_as_setup_would) {
    tk_run a, b;
    void *sa = open_q(&a, 5, ""), *sb = open_q(&b, 5, "");
    const pl_precision_vtable *vt = a.vtable;
    ck_assert_ptr_nonnull(vt->convert_param);
    PL_CK_OK(vt->setup(sb, b.ctx->params)); /* the reference: all at once */
    pl_params *ps = a.ctx->params;
    pl_frame_begin(); /* a model's create has one open */
    for (int i = 0; i < pl_params_count(ps); i++) PL_CK_OK(vt->convert_param(sa, ps, i));
    pl_frame_end();
    pl_tensor *w = pl_params_find(ps, "base.weight")->t;
    ck_assert_int_eq(w->dtype, PL_NF4);
    ck_assert_int_eq(pl_params_find(ps, "lora.A")->t->dtype, PL_F32);
    pl_tensor *wr = pl_params_find(b.ctx->params, "base.weight")->t;
    ck_assert_int_eq(memcmp(pl_tensor_data(w), pl_tensor_data(wr), pl_nf4_code_nbytes(w)), 0);
    PL_CK_OK(vt->setup(sa, ps));
    ck_assert_ptr_eq(pl_params_find(ps, "base.weight")->t, w); /* left as it was */
    /* a core params list without a precision hook: sealing does nothing */
    pl_tensor *lw = pl_params_find(ps, "lora.A")->t;
    int li = -1;
    for (int i = 0; i < pl_params_count(ps); i++)
        if (pl_params_at(ps, i)->t == lw) li = i;
    PL_CK_OK(pl_params_seal(ps, li));
    ck_assert_ptr_eq(pl_params_at(ps, li)->t, lw);
    ck_assert_int_eq(pl_params_seal(ps, pl_params_count(ps)), PL_ERR_INVALID);
    pl_error_clear();
    vt->destroy(sa);
    vt->destroy(sb);
    tk_close(&a);
    tk_close(&b);
}
END_TEST

START_TEST(checkpoint_round_trip_gives_identical_outputs) {
    for (int dq = 0; dq < 2; dq++) {
        char path[] = "/tmp/pl_test_qlora4_XXXXXX";
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        close(fd);
        const char *body = dq ? "double_quant = true\n" : "double_quant = false\n";
        tk_run a;
        void *sa = open_q(&a, 5, body);
        const pl_precision_vtable *vt = a.vtable;
        PL_CK_OK(vt->setup(sa, a.ctx->params));
        pl_tensor *x, *tg;
        pm_batch(&x, &tg);
        for (int s = 0; s < 3; s++) pm_train_step(vt, sa, a.ctx->params, x, tg, 0.05, NULL);
        float ya[PM_B], yb[PM_B];
        outputs(a.ctx->params, x, ya);
        save_ckpt(path, &a, vt, sa);

        /* a fresh run with another init: resume = load params, then state */
        tk_run b;
        void *sb = open_q(&b, 77, body);
        PL_CK_OK(vt->setup(sb, b.ctx->params));
        outputs(b.ctx->params, x, yb);
        ck_assert_msg(memcmp(ya, yb, sizeof ya) != 0, "different inits gave the same outputs");
        ck c = {0};
        PL_CK_OK(pl_st_open(path, &c.f));
        for (int i = 0; i < pl_params_count(b.ctx->params); i++) {
            pl_param *p = pl_params_at(b.ctx->params, i);
            PL_CK_OK(pl_st_load_into(c.f, p->name, p->t));
        }
        pl_state_visitor v = {&c, ck_tensor, ck_scalar};
        PL_CK_OK(vt->state(sb, &v));
        outputs(b.ctx->params, x, yb);
        for (int i = 0; i < PM_B; i++) ck_assert_float_eq(yb[i], ya[i]);
        pl_st_close(c.f);

        vt->destroy(sa);
        vt->destroy(sb);
        tk_close(&a);
        tk_close(&b);
        pl_tensor_release(x);
        pl_tensor_release(tg);
        unlink(path);
    }
}
END_TEST

START_TEST(state_of_another_base_is_refused) {
    char path[] = "/tmp/pl_test_qlora4_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    tk_run a, b;
    void *sa = open_q(&a, 5, ""), *sb = open_q(&b, 77, "");
    const pl_precision_vtable *vt = a.vtable;
    PL_CK_OK(vt->setup(sa, a.ctx->params));
    PL_CK_OK(vt->setup(sb, b.ctx->params));
    save_ckpt(path, &a, vt, sa);
    ck c = {0};
    PL_CK_OK(pl_st_open(path, &c.f));
    pl_state_visitor v = {&c, ck_tensor, ck_scalar};
    /* state loaded without the matching codes (b keeps its own base) */
    ck_assert_int_eq(vt->state(sb, &v), PL_ERR_IO);
    ck_assert_msg(strstr(pl_error_message(), "base.weight"), "%s", pl_error_message());
    pl_st_close(c.f);
    vt->destroy(sa);
    vt->destroy(sb);
    tk_close(&a);
    tk_close(&b);
    unlink(path);
}
END_TEST

START_TEST(qlora4_checkpoint_loads_onto_an_fp32_base) {
    char path[] = "/tmp/pl_test_qlora4_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    tk_run a;
    void *sa = open_q(&a, 5, "compute_dtype = f32\n");
    const pl_precision_vtable *vt = a.vtable;
    PL_CK_OK(vt->setup(sa, a.ctx->params));
    pl_tensor *x, *tg;
    pm_batch(&x, &tg);
    for (int s = 0; s < 3; s++) pm_train_step(vt, sa, a.ctx->params, x, tg, 0.05, NULL);
    float ya[PM_B], yc[PM_B];
    outputs(a.ctx->params, x, ya);
    save_ckpt(path, &a, vt, sa);
    vt->destroy(sa);
    tk_close(&a);

    /* an fp32 model: no precision plugin, base weight f32; a's context,
     * with its bf16 autocast, went with its harness */
    ck_assert_int_eq(pl_autocast_get(), PL_F32);
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    pm_add_params(ps, 99);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(path, &f));
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_param *p = pl_params_at(ps, i);
        PL_CK_OK(pl_nf4_load_into(f, p->name, PL_QLORA4_STATE_PREFIX, p->t));
    }
    pl_st_close(f);
    ck_assert_int_eq(pl_params_find(ps, "base.weight")->t->dtype, PL_F32);
    outputs(ps, x, yc);
    for (int i = 0; i < PM_B; i++) ck_assert_float_eq_tol(yc[i], ya[i], 1e-5f);
    pl_params_free(ps);
    pl_tensor_release(x);
    pl_tensor_release(tg);
    unlink(path);
}
END_TEST

START_TEST(setup_quantizes_bf16_base_and_converts_the_rest_to_f32) {
    /* lean loading: a model hands over checkpoint views in the file's dtype */
    pm_setup_converts_half_params("qlora4", "", PL_NF4, PL_F32);
}
END_TEST

/* A stand-in for a checkpoint view: external bf16 memory whose release
 * records how many parameters were nf4 at that moment. */
typedef struct view_probe {
    pl_params *ps;
    int released, nf4_at_release[4];
} view_probe;

static void probe_free(void *data, void *ctx) {
    view_probe *p = ctx;
    int nf4 = 0;
    for (int i = 0; i < pl_params_count(p->ps); i++) nf4 += pl_params_at(p->ps, i)->t->dtype == PL_NF4;
    p->nf4_at_release[p->released++] = nf4;
    free(data);
}

START_TEST(each_base_view_is_released_right_after_it_is_quantized) {
    tk_run r;
    tk_init(&r);
    view_probe probe = {.ps = r.ctx->params};
    for (int k = 0; k < 3; k++) {
        uint16_t *d = malloc(64 * 64 * sizeof *d);
        for (int i = 0; i < 64 * 64; i++) d[i] = pl_f32_to_bf16((float)((i * 7 + k) % 17) - 8.0f);
        pl_tensor *t = PL_CK_NOTNULL(
            pl_tensor_from_external(PL_BF16, PL_SHAPE(64, 64), d, probe_free, &probe));
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", k);
        PL_CK_OK(pl_params_add(r.ctx->params, name, t, PL_TAG_BASE, NULL));
        pl_tensor_release(t); /* the list holds the only reference, as for a model's view */
    }
    PL_CK_OK(tk_try_open(&r, "precision", "qlora4", ""));
    const pl_precision_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    PL_CK_OK(vt->setup(self, r.ctx->params));
    ck_assert_int_eq(probe.released, 3);
    /* view k went as its codes took its place (the list still named it),
     * with views 0..k-1 already nf4 and k+1.. not yet quantized: one float
     * tensor at a time, never the whole base next to its codes */
    for (int k = 0; k < 3; k++) ck_assert_int_eq(probe.nf4_at_release[k], k);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("qlora4");
    TCase *tc = tcase_create("qlora4");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, only_frozen_2d_base_weights_are_quantized);
    tcase_add_test(tc, convert_param_quantizes_a_sealed_base_weight_as_setup_would);
    tcase_add_test(tc, checkpoint_round_trip_gives_identical_outputs);
    tcase_add_test(tc, state_of_another_base_is_refused);
    tcase_add_test(tc, qlora4_checkpoint_loads_onto_an_fp32_base);
    tcase_add_test(tc, setup_quantizes_bf16_base_and_converts_the_rest_to_f32);
    tcase_add_test(tc, each_base_view_is_released_right_after_it_is_quantized);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
