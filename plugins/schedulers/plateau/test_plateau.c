/* test_plateau.c - the plateau scheduler against
 * torch.optim.lr_scheduler.ReduceLROnPlateau (tests/data/optim/plateau.json,
 * tools/gen_optim_reference.py): min/max modes, rel/abs thresholds,
 * cooldown, min_lr and eps; resume from saved state. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("plateau.json"); }
static void teardown(void) { cJSON_Delete(ref); }

/* Feed every metric, compare lr = factor x optimizer.lr after each; with
 * resume_at > 0 the scheduler is rebuilt from its saved state there. */
static void check_case(const char *cname, int resume_at) {
    const cJSON *c = tk_case(ref, cname);
    double base = cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble;
    int n, nm;
    double *lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "lr"), &n);
    double *metric = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "metric"), &nm);
    ck_assert_int_eq(n, nm);
    tk_run r;
    tk_init(&r);
    tk_optimizer_lr(&r, base);
    tk_open(&r, "scheduler", "plateau", cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_double_eq(vt->lr_factor(self, 0), 1.0);
    int reductions = 0;
    for (int i = 0; i < n; i++) {
        if (resume_at > 0 && i == resume_at) {
            tk_state *st = tk_state_save(vt->state, self);
            vt->destroy(self);
            PL_CK_OK(vt->create(r.sec, r.ctx, &self));
            tk_state_load(st, vt->state, self);
            tk_state_free(st);
        }
        vt->on_validation(self, metric[i]);
        double got = vt->lr_factor(self, 1000 + i) * base;
        ck_assert_msg(tk_near(got, lr[i], 1e-9, 1e-15), "%s: validation %d lr %.17g, torch %.17g",
                      cname, i, got, lr[i]);
        if (i > 0 && lr[i] < lr[i - 1]) reductions++;
    }
    ck_assert_msg(reductions >= 2, "%s: reference should exercise reductions", cname);
    vt->destroy(self);
    tk_close(&r);
    free(lr);
    free(metric);
}

START_TEST(min_mode_relative_threshold_matches_torch) { check_case("plateau_min_rel", 0); }
END_TEST
START_TEST(max_mode_absolute_threshold_matches_torch) { check_case("plateau_max_abs", 0); }
END_TEST
START_TEST(cooldown_and_min_lr_match_torch) { check_case("plateau_min_cooldown_minlr", 0); }
END_TEST
START_TEST(reductions_below_eps_are_skipped_like_torch) { check_case("plateau_min_abs_eps", 0); }
END_TEST
START_TEST(resume_mid_cooldown_is_exact) {
    check_case("plateau_min_cooldown_minlr", 17);
    check_case("plateau_min_rel", 25);
}
END_TEST

START_TEST(monitor_defaults_to_val_loss_and_is_configurable) {
    tk_run r;
    tk_init(&r);
    tk_optimizer_lr(&r, 0.1);
    tk_open(&r, "scheduler", "plateau", NULL, NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_str_eq(vt->monitor(self), "val_loss");
    vt->destroy(self);
    tk_open(&r, "scheduler", "plateau", NULL, "monitor = val_accuracy\nmode = max\n");
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_str_eq(vt->monitor(self), "val_accuracy");
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(factor_of_one_is_refused_by_the_schema) {
    tk_run r;
    tk_init(&r);
    ck_assert_int_eq(tk_try_open(&r, "scheduler", "plateau", "factor = 1.0\n"), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "factor"), "%s", pl_error_message());
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plateau");
    TCase *tc = tcase_create("plateau");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, min_mode_relative_threshold_matches_torch);
    tcase_add_test(tc, max_mode_absolute_threshold_matches_torch);
    tcase_add_test(tc, cooldown_and_min_lr_match_torch);
    tcase_add_test(tc, reductions_below_eps_are_skipped_like_torch);
    tcase_add_test(tc, resume_mid_cooldown_is_exact);
    tcase_add_test(tc, monitor_defaults_to_val_loss_and_is_configurable);
    tcase_add_test(tc, factor_of_one_is_refused_by_the_schema);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
