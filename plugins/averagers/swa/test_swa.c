/* test_swa.c - the swa averager against torch.optim.swa_utils
 * (tests/data/optim/swa.json, tools/gen_optim_reference.py): the running
 * average of AveragedModel after each epoch from swa_start_epoch, the SWALR
 * learning rate per epoch on top of a main schedule, swap, state; the base lr
 * that swa_lr is divided by, read from the run's optimizer (ctx->optimizer,
 * a real sgd here, as the trainer sets it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("swa.json"); }
static void teardown(void) { cJSON_Delete(ref); }

static void set_values(pl_tensor *t, const cJSON *vals) {
    int n;
    double *v = tk_doubles(vals, &n);
    ck_assert_int_eq(n, pl_tensor_numel(t));
    float *d = pl_tensor_f32(t);
    for (int i = 0; i < n; i++) d[i] = (float)v[i];
    free(v);
}

static void expect_values(const char *what, int epoch, const pl_tensor *t, const cJSON *vals) {
    int n;
    double *v = tk_doubles(vals, &n);
    const float *d = pl_tensor_f32(t);
    for (int i = 0; i < n; i++)
        ck_assert_msg(tk_near(d[i], v[i], 1e-6, 1e-7), "%s: epoch %d %s[%d] = %.9g, torch %.9g",
                      what, epoch, t->name, i, (double)d[i], v[i]);
    free(v);
}

/* The trainer's loop for one reference case: lr factor per epoch (the main
 * schedule's factor as current_factor), weights at each epoch end, update,
 * swap-compare-swap. resume_at > 0: rebuild the averager from its saved
 * state before that epoch. */
static void check_case(const char *cname, int resume_at) {
    const cJSON *c = tk_case(ref, cname);
    double base = cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble;
    int epochs = cJSON_GetObjectItemCaseSensitive(c, "epochs")->valueint;
    int start = atoi(cJSON_GetObjectItemCaseSensitive(
                         cJSON_GetObjectItemCaseSensitive(c, "options"), "swa_start_epoch")
                         ->valuestring);
    int n;
    double *lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "lr"), &n);
    double *main_lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "main_lr"), &n);
    const cJSON *weights = cJSON_GetObjectItemCaseSensitive(c, "weights");
    const cJSON *averaged = cJSON_GetObjectItemCaseSensitive(c, "averaged");
    tk_run r;
    tk_init(&r);
    r.ctx->max_epochs = epochs;
    pl_tensor *p[2];
    const cJSON *pj;
    int np = 0;
    cJSON_ArrayForEach(pj, cJSON_GetObjectItemCaseSensitive(c, "params")) {
        int nd;
        double *shp = tk_doubles(cJSON_GetObjectItemCaseSensitive(pj, "shape"), &nd);
        int64_t shape[PL_MAX_DIMS];
        for (int i = 0; i < nd; i++) shape[i] = (int64_t)shp[i];
        p[np++] = tk_add_param(&r, cJSON_GetObjectItemCaseSensitive(pj, "name")->valuestring, nd,
                               shape, NULL, true);
        free(shp);
    }
    tk_add_param(&r, "bn.running_mean", PL_SHAPE(2), NULL, false); /* buffer: not averaged */
    char opt[64];
    snprintf(opt, sizeof opt, "lr = %.17g\n", base);
    tk_optimizer(&r, "sgd", opt); /* the base lr of swa_lr's factor */
    tk_open(&r, "averager", "swa", cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_averager_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert(!vt->has_average(self));
    ck_assert_int_eq(vt->swap(self), PL_ERR_INVALID);
    for (int e = 0; e < epochs; e++) {
        if (resume_at > 0 && e == resume_at) {
            tk_state *st = tk_state_save(vt->state, self);
            vt->destroy(self);
            PL_CK_OK(vt->create(r.sec, r.ctx, &self));
            tk_state_load(st, vt->state, self);
            tk_state_free(st);
        }
        double fmain = main_lr[e] / base;
        for (int64_t step = e * 4; step < e * 4 + 4; step++) {
            double o = vt->lr_factor(self, e, step, fmain);
            ck_assert_msg(e >= start || isnan(o), "%s: override before the SWA start", cname);
            double got = (isnan(o) ? fmain : o) * base;
            ck_assert_msg(tk_near(got, lr[e], 1e-9, 1e-15), "%s: epoch %d lr %.17g, torch %.17g",
                          cname, e, got, lr[e]);
            PL_CK_OK(vt->update(self, e, step + 1)); /* per-step calls: no averaging here */
        }
        const cJSON *w = cJSON_GetArrayItem(weights, e);
        for (int i = 0; i < np; i++) set_values(p[i], cJSON_GetArrayItem(w, i));
        PL_CK_OK(vt->update(self, e, -1));
        const cJSON *a = cJSON_GetArrayItem(averaged, e);
        ck_assert(vt->has_average(self) == !cJSON_IsNull(a));
        if (cJSON_IsNull(a)) continue;
        PL_CK_OK(vt->swap(self));
        for (int i = 0; i < np; i++) expect_values(cname, e, p[i], cJSON_GetArrayItem(a, i));
        PL_CK_OK(vt->swap(self));
        for (int i = 0; i < np; i++) expect_values("swapped back", e, p[i], cJSON_GetArrayItem(w, i));
    }
    vt->destroy(self);
    tk_close(&r);
    free(lr);
    free(main_lr);
}

START_TEST(cos_annealing_and_average_match_torch) { check_case("swa_0", 0); }
END_TEST
START_TEST(linear_annealing_and_average_match_torch) { check_case("swa_1", 0); }
END_TEST
START_TEST(zero_annealing_epochs_jumps_to_swa_lr_like_torch) { check_case("swa_2", 0); }
END_TEST
START_TEST(resume_mid_swa_is_exact) {
    check_case("swa_0", 7);
    check_case("swa_1", 2);
}
END_TEST

START_TEST(update_every_n_steps_and_fractional_start) {
    /* max_epochs 10, swa_start 0.3 -> epoch 3; average every 2 steps */
    tk_run r;
    tk_init(&r);
    r.ctx->max_epochs = 10;
    pl_tensor *w = tk_add_param(&r, "w", PL_SHAPE(2), NULL, true);
    tk_open(&r, "averager", "swa", NULL, "swa_start = 0.3\nupdate_every_n_steps = 2\n");
    const pl_averager_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    float *d = pl_tensor_f32(w);
    d[0] = 1, d[1] = 2;
    PL_CK_OK(vt->update(self, 2, 2)); /* before the start epoch */
    ck_assert(!vt->has_average(self));
    PL_CK_OK(vt->update(self, 3, 5)); /* odd count */
    ck_assert(!vt->has_average(self));
    PL_CK_OK(vt->update(self, 3, 6)); /* avg = (1, 2) */
    d[0] = 3, d[1] = -2;
    PL_CK_OK(vt->update(self, 3, -1)); /* epoch end: ignored in step mode */
    PL_CK_OK(vt->update(self, 3, 7));
    PL_CK_OK(vt->update(self, 4, 8)); /* avg = (2, 0) */
    ck_assert(isnan(vt->lr_factor(self, 5, 50, 0.7))); /* no swa_lr: no override */
    PL_CK_OK(vt->swap(self));
    ck_assert_float_eq(d[0], 2.0f);
    ck_assert_float_eq(d[1], 0.0f);
    tk_state *st = tk_state_save(vt->state, self);
    bool found;
    ck_assert_double_eq(tk_state_scalar(st, "swa.n_averaged", &found), 2.0);
    ck_assert(found);
    ck_assert_int_eq(tk_state_count(st), 3); /* n_averaged, lr_start_factor, swa.avg.w */
    tk_state_free(st);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

/* swa_lr is divided by the optimizer's base lr, read through its groups:
 * group 0's initial_lr / lr_scale, here 0.05 / 0.5 = 0.1 (reading
 * initial_lr alone would give 0.05 and a factor twice too large). Linear,
 * one annealing epoch: the factor is f0 in epoch S, swa_lr / base after. */
START_TEST(swa_lr_is_divided_by_the_optimizers_base_lr) {
    tk_run r;
    tk_init(&r);
    r.ctx->max_epochs = 10;
    tk_add_param(&r, "w", PL_SHAPE(2), NULL, true);
    tk_optimizer(&r, "sgd", "lr = 0.1\ngroup.default.lr_scale = 0.5\n");
    const pl_param_group *g0 = r.ctx->optimizer->group(r.ctx->optimizer_self, 0);
    ck_assert_double_eq_tol(g0->initial_lr, 0.05, 1e-15); /* the case this test is about */
    tk_open(&r, "averager", "swa", NULL,
            "swa_start_epoch = 2\nswa_lr = 0.02\nanneal_strategy = linear\n"
            "annealing_epochs = 1\n");
    const pl_averager_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert(isnan(vt->lr_factor(self, 1, 10, 0.9)));                 /* before S */
    ck_assert_double_eq_tol(vt->lr_factor(self, 2, 20, 0.9), 0.9, 1e-15); /* f0 */
    ck_assert_double_eq_tol(vt->lr_factor(self, 3, 30, 0.5), 0.2, 1e-15); /* 0.02 / 0.1 */
    vt->destroy(self);
    /* the trainer's ddp lr scaling multiplies every group's initial_lr: the
     * base lr follows (x2 here), so the factor halves */
    pl_param_group *g = r.ctx->optimizer->group(r.ctx->optimizer_self, 0);
    g->initial_lr *= 2;
    g->lr *= 2;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_double_eq_tol(vt->lr_factor(self, 2, 20, 1.0), 1.0, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 3, 30, 1.0), 0.1, 1e-15); /* 0.02 / 0.2 */
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

/* an absolute swa_lr without an optimizer in the run context is refused
 * naming the option and what is missing; without swa_lr none is needed */
START_TEST(swa_lr_without_an_optimizer_is_refused) {
    tk_run r;
    tk_init(&r);
    r.ctx->max_epochs = 10;
    tk_add_param(&r, "w", PL_SHAPE(2), NULL, true);
    tk_open(&r, "averager", "swa", NULL, "swa_lr = 0.02\n");
    const pl_averager_vtable *vt = r.vtable;
    void *self = NULL;
    ck_assert_int_eq(vt->create(r.sec, r.ctx, &self), PL_ERR_CONFIG);
    ck_assert_ptr_null(self);
    ck_assert_msg(strstr(pl_error_message(), "swa: swa_lr is an absolute learning rate") &&
                      strstr(pl_error_message(), "no optimizer"),
                  "%s", pl_error_message());
    tk_open(&r, "averager", "swa", NULL, "swa_start_epoch = 2\n");
    vt = r.vtable;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert(isnan(vt->lr_factor(self, 3, 30, 0.5)));
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("swa");
    TCase *tc = tcase_create("swa");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, cos_annealing_and_average_match_torch);
    tcase_add_test(tc, linear_annealing_and_average_match_torch);
    tcase_add_test(tc, zero_annealing_epochs_jumps_to_swa_lr_like_torch);
    tcase_add_test(tc, resume_mid_swa_is_exact);
    tcase_add_test(tc, update_every_n_steps_and_fractional_start);
    tcase_add_test(tc, swa_lr_is_divided_by_the_optimizers_base_lr);
    tcase_add_test(tc, swa_lr_without_an_optimizer_is_refused);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
