/* test_sgd.c - the sgd plugin against torch.optim.SGD step by step
 * (tests/data/optim/sgd.json, tools/gen_optim_reference.py), checkpoint
 * state and option checks. */
#include <math.h>
#include <string.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("sgd.json"); }
static void teardown(void) { cJSON_Delete(ref); }

START_TEST(plain_sgd_matches_torch) { tk_run_optimizer_case(tk_case(ref, "sgd_plain"), "sgd", 0); }
END_TEST

START_TEST(momentum_dampening_weight_decay_match_torch) {
    tk_run_optimizer_case(tk_case(ref, "sgd_momentum"), "sgd", 0);
}
END_TEST

START_TEST(nesterov_matches_torch) {
    tk_run_optimizer_case(tk_case(ref, "sgd_nesterov"), "sgd", 0);
}
END_TEST

START_TEST(groups_and_missing_grads_match_torch) {
    tk_run_optimizer_case(tk_case(ref, "sgd_groups"), "sgd", 0);
}
END_TEST

START_TEST(resume_from_saved_state_is_exact) {
    /* resume after step 1 (buffers just initialised) and mid-run */
    tk_run_optimizer_case(tk_case(ref, "sgd_momentum"), "sgd", 1);
    tk_run_optimizer_case(tk_case(ref, "sgd_groups"), "sgd", 4);
}
END_TEST

START_TEST(nesterov_without_momentum_is_refused) {
    tk_run r;
    tk_init(&r);
    tk_add_param(&r, "w", PL_SHAPE(2), NULL, true);
    tk_open(&r, "optimizer", "sgd", NULL, "nesterov = true\n");
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    ck_assert_int_eq(vt->create(r.sec, r.ctx, &self), PL_ERR_CONFIG);
    ck_assert_msg(strstr(pl_error_message(), "nesterov"), "%s", pl_error_message());
    tk_close(&r);
}
END_TEST

START_TEST(momentum_follows_the_group_hyper_parameter) {
    /* a scheduler (onecycle) cycles momentum through the group's named
     * hyper-parameter "momentum": with 0.5 set on a momentum-free optimizer, two steps of grad 1 give
     * b1 = 1, b2 = 0.5 + 1 = 1.5: p = -lr (1 + 1.5) */
    tk_run r;
    tk_init(&r);
    pl_tensor *w = tk_add_param(&r, "w", PL_SHAPE(1), NULL, true);
    tk_open(&r, "optimizer", "sgd", NULL, "lr = 0.1\n");
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_ptr_null(pl_group_hparam(vt->group(self, 0), "beta1"));
    PL_CK_NOTNULL(pl_group_hparam(vt->group(self, 0), "momentum"))->value = 0.5;
    for (int s = 0; s < 2; s++) {
        pl_tensor_release(w->grad);
        w->grad = PL_CK_NOTNULL(pl_tensor_full(PL_F32, PL_SHAPE(1), 1.0, PL_CPU));
        PL_CK_OK(vt->step(self));
    }
    ck_assert_float_eq_tol(pl_tensor_f32(w)[0], -0.25f, 1e-7f);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("sgd");
    TCase *tc = tcase_create("sgd");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, plain_sgd_matches_torch);
    tcase_add_test(tc, momentum_dampening_weight_decay_match_torch);
    tcase_add_test(tc, nesterov_matches_torch);
    tcase_add_test(tc, groups_and_missing_grads_match_torch);
    tcase_add_test(tc, resume_from_saved_state_is_exact);
    tcase_add_test(tc, nesterov_without_momentum_is_refused);
    tcase_add_test(tc, momentum_follows_the_group_hyper_parameter);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
