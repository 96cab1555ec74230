/* test_onecycle.c - the onecycle scheduler against
 * torch.optim.lr_scheduler.OneCycleLR (tests/data/optim/onecycle.json,
 * tools/gen_optim_reference.py): lr and beta1 for every step, cos and
 * linear, two and three phases. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("onecycle.json"); }
static void teardown(void) { cJSON_Delete(ref); }

/* Factor x optimizer.lr (= the lr of a group with lr_scale 1) and beta1 for
 * every step vs torch. `drop_total`: leave total_steps to ctx->total_steps. */
static void check_case(const cJSON *c, bool drop_total) {
    const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
    double base = cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble;
    int n, nb = 0;
    double *lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "lr"), &n);
    const cJSON *jb = cJSON_GetObjectItemCaseSensitive(c, "beta1");
    double *b1 = cJSON_IsArray(jb) ? tk_doubles(jb, &nb) : NULL;
    cJSON *opts = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "options"), 1);
    tk_run r;
    tk_init(&r);
    tk_optimizer_lr(&r, base);
    if (drop_total) {
        r.ctx->total_steps = n;
        cJSON_DeleteItemFromObject(opts, "total_steps");
    }
    tk_open(&r, "scheduler", "onecycle", opts, NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_ptr_null(vt->monitor);
    /* an Adam-style group (beta1) and an SGD-style one (momentum): torch
     * cycles betas[0] or momentum, whichever the optimizer has */
    pl_param_group adam = {0}, sgd = {0}, plain = {0};
    PL_CK_OK(pl_group_hparam_set(&adam, "beta1", 0.9));
    PL_CK_OK(pl_group_hparam_set(&adam, "beta2", 0.999));
    PL_CK_OK(pl_group_hparam_set(&sgd, "momentum", 0.9));
    for (int s = 0; s < n; s++) {
        vt->drive(self, s, &adam);
        vt->drive(self, s, &sgd);
        vt->drive(self, s, &plain);
        double beta1 = pl_group_hparam(&adam, "beta1")->value;
        ck_assert_double_eq(pl_group_hparam(&sgd, "momentum")->value, beta1);
        ck_assert_double_eq(pl_group_hparam(&adam, "beta2")->value, 0.999);
        ck_assert_int_eq(plain.n_hparams, 0);
        double f = vt->lr_factor(self, s);
        ck_assert_msg(tk_near(f * base, lr[s], 1e-9, 1e-15), "%s: step %d lr %.17g, torch %.17g",
                      name, s, f * base, lr[s]);
        if (b1)
            ck_assert_msg(tk_near(beta1, b1[s], 1e-9, 1e-15),
                          "%s: step %d beta1 %.17g, torch %.17g", name, s, beta1, b1[s]);
        else
            ck_assert_msg(beta1 == 0.9, "%s: cycle_momentum off but beta1 = %g", name, beta1);
    }
    /* past the end: stays at the final lr */
    double f_end = vt->lr_factor(self, n + 5);
    ck_assert(tk_near(f_end * base, lr[n - 1], 1e-12, 1e-18));
    vt->destroy(self);
    tk_close(&r);
    cJSON_Delete(opts);
    free(lr);
    free(b1);
}

START_TEST(cos_two_phase_matches_torch) { check_case(tk_case(ref, "onecycle_0"), false); }
END_TEST
START_TEST(linear_two_phase_matches_torch) { check_case(tk_case(ref, "onecycle_1"), false); }
END_TEST
START_TEST(cos_three_phase_with_div_factors_matches_torch) {
    check_case(tk_case(ref, "onecycle_2"), false);
}
END_TEST
START_TEST(linear_three_phase_custom_momentum_matches_torch) {
    check_case(tk_case(ref, "onecycle_3"), false);
}
END_TEST
START_TEST(no_momentum_cycling_leaves_beta1_alone) { check_case(tk_case(ref, "onecycle_4"), false); }
END_TEST
START_TEST(total_steps_defaults_to_the_fit) { check_case(tk_case(ref, "onecycle_0"), true); }
END_TEST

START_TEST(absolute_max_lr_needs_the_optimizer_lr) {
    tk_run r;
    tk_init(&r);
    r.ctx->total_steps = 10;
    tk_open(&r, "scheduler", "onecycle", NULL, "max_lr = 0.1\n");
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    ck_assert_int_eq(vt->create(r.sec, r.ctx, &self), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "max_lr is an absolute learning rate") &&
                      strstr(pl_error_message(), "no optimizer"),
                  "%s", pl_error_message());
    /* max_lr unset: the peak is the optimizer's lr, factor 1 at the peak:
     * pct_start 0.3 of 10 steps -> peak at step 2 (end_step 3 - 1) */
    tk_open(&r, "scheduler", "onecycle", NULL, NULL);
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_double_eq_tol(vt->lr_factor(self, 2), 1.0, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 0), 1.0 / 25, 1e-15);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("onecycle");
    TCase *tc = tcase_create("onecycle");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, cos_two_phase_matches_torch);
    tcase_add_test(tc, linear_two_phase_matches_torch);
    tcase_add_test(tc, cos_three_phase_with_div_factors_matches_torch);
    tcase_add_test(tc, linear_three_phase_custom_momentum_matches_torch);
    tcase_add_test(tc, no_momentum_cycling_leaves_beta1_alone);
    tcase_add_test(tc, total_steps_defaults_to_the_fit);
    tcase_add_test(tc, absolute_max_lr_needs_the_optimizer_lr);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
