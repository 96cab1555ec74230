/* test_cosine.c - the cosine scheduler against torch's
 * SequentialLR(LinearLR, CosineAnnealingLR) and CosineAnnealingLR
 * (tests/data/optim/cosine.json, tools/gen_optim_reference.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("cosine.json"); }
static void teardown(void) { cJSON_Delete(ref); }

static void check_case(const char *cname) {
    const cJSON *c = tk_case(ref, cname);
    double base = cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble;
    int n;
    double *lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "lr"), &n);
    tk_run r;
    tk_init(&r);
    tk_optimizer_lr(&r, base);
    tk_open(&r, "scheduler", "cosine", cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    for (int s = 0; s < n; s++) {
        double got = vt->lr_factor(self, s) * base;
        ck_assert_msg(tk_near(got, lr[s], 1e-9, 1e-15), "%s: step %d lr %.17g, torch %.17g", cname,
                      s, got, lr[s]);
    }
    /* after total_steps the lr stays at eta_min */
    ck_assert(tk_near(vt->lr_factor(self, n + 10) * base, lr[n - 1], 1e-9, 1e-15));
    vt->destroy(self);
    tk_close(&r);
    free(lr);
}

START_TEST(warmup_then_cosine_matches_torch) { check_case("cosine_warmup"); }
END_TEST
START_TEST(warmup_then_cosine_to_eta_min_matches_torch) { check_case("cosine_warmup_eta"); }
END_TEST
START_TEST(cosine_without_warmup_matches_torch) { check_case("cosine_nowarmup"); }
END_TEST

START_TEST(warmup_pct_and_fit_length_come_from_the_run) {
    /* total 40 steps from the trainer, warmup 25% -> 10 steps from 0:
     * factor(0) = 0, factor(5) = 0.5, factor(10) = 1, factor(25) = 0.5 */
    tk_run r;
    tk_init(&r);
    r.ctx->total_steps = 40;
    tk_open(&r, "scheduler", "cosine", NULL, "warmup_pct = 0.25\n");
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_double_eq_tol(vt->lr_factor(self, 0), 0.0, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 5), 0.5, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 10), 1.0, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 25), 0.5, 1e-15);
    ck_assert_double_eq_tol(vt->lr_factor(self, 40), 0.0, 1e-15);
    vt->destroy(self);
    /* eta_min > 0 is absolute: needs the optimizer's base lr */
    tk_open(&r, "scheduler", "cosine", NULL, "eta_min = 1e-5\n");
    ck_assert_int_eq(vt->create(r.sec, r.ctx, &self), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "eta_min is an absolute learning rate") &&
                      strstr(pl_error_message(), "no optimizer"),
                  "%s", pl_error_message());
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cosine");
    TCase *tc = tcase_create("cosine");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, warmup_then_cosine_matches_torch);
    tcase_add_test(tc, warmup_then_cosine_to_eta_min_matches_torch);
    tcase_add_test(tc, cosine_without_warmup_matches_torch);
    tcase_add_test(tc, warmup_pct_and_fit_length_come_from_the_run);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
