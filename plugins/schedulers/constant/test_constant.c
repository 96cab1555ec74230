/* test_constant.c - the constant scheduler: factor 1, and its linear warmup
 * against torch.optim.lr_scheduler.LinearLR (tests/data/optim/cosine.json,
 * case constant_warmup, tools/gen_optim_reference.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim_testkit.h"

START_TEST(factor_is_one_without_warmup) {
    tk_run r;
    tk_init(&r);
    tk_open(&r, "scheduler", "constant", NULL, NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    for (int64_t s = 0; s < 1000; s += 97) {
        ck_assert_double_eq(vt->lr_factor(self, s), 1.0);
    }
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(warmup_matches_torch_linear_lr) {
    cJSON *ref = tk_json("cosine.json");
    const cJSON *c = tk_case(ref, "constant_warmup");
    double base = cJSON_GetObjectItemCaseSensitive(c, "optimizer_lr")->valuedouble;
    int n;
    double *lr = tk_doubles(cJSON_GetObjectItemCaseSensitive(c, "lr"), &n);
    tk_run r;
    tk_init(&r);
    tk_open(&r, "scheduler", "constant", cJSON_GetObjectItemCaseSensitive(c, "options"), NULL);
    const pl_scheduler_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    for (int s = 0; s < n; s++) {
        double got = vt->lr_factor(self, s) * base;
        ck_assert_msg(tk_near(got, lr[s], 1e-9, 1e-15), "step %d lr %.17g, torch %.17g", s, got,
                      lr[s]);
    }
    vt->destroy(self);
    tk_close(&r);
    free(lr);
    cJSON_Delete(ref);
}
END_TEST

int main(void) {
    Suite *s = suite_create("constant");
    TCase *tc = tcase_create("constant");
    tcase_add_test(tc, factor_is_one_without_warmup);
    tcase_add_test(tc, warmup_matches_torch_linear_lr);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
