/* test_sgd.c - the sgd plugin against torch.optim.SGD step by step
 * (tests/data/optim/sgd.json, tools/gen_optim_reference.py), checkpoint
 * state and option checks; a first step skipped by found_inf on the host and
 * on the device (cpu, strict). */
#include <math.h>
#include <stdlib.h>
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

/* sgd_first_step_skipped: found_inf on step 0, momentum 0.9, dampening 0.5.
 * torch's GradScaler skips optimizer.step(), so the buffer is first set (to
 * the gradient) at step 1. On the device path the step runs with the flag:
 * the buffer and its count stay as they were, and step 1 initialises it, the
 * same bits as the host path's (no step). With the count advancing on the
 * skip, step 1 would take b = 0.9 * 0 + 0.5 g: half torch's update. */
START_TEST(skipped_first_step_leaves_the_buffer_uninitialised) {
    static const pl_device strict = {PL_DEVICE_CUDA, 0};
    const cJSON *c = tk_case(ref, "sgd_first_step_skipped");
    cJSON *pt = cJSON_Duplicate(c, true);
    ck_assert_ptr_nonnull(
        cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(pt, "options"), "foreach", "false"));
    int n0, n;
    float *host = tk_run_optimizer_case_on(c, "sgd", 0, PL_CPU, false, &n0);
    float *runs[4];
    runs[0] = tk_run_optimizer_case_on(c, "sgd", 0, PL_CPU, true, &n);
    runs[1] = tk_run_optimizer_case_on(pt, "sgd", 0, PL_CPU, true, &n);
    PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict"));
    runs[2] = tk_run_optimizer_case_on(c, "sgd", 1, strict, true, &n); /* resumed after the skip */
    runs[3] = tk_run_optimizer_case_on(pt, "sgd", 0, strict, true, &n);
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(memcmp(host, runs[r], sizeof(float) * (size_t)n0) == 0,
                      "device-path run %d differs from the host path", r);
        free(runs[r]);
    }
    free(host);
    cJSON_Delete(pt);
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
    tcase_add_test(tc, skipped_first_step_leaves_the_buffer_uninitialised);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
