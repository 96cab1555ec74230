/* test_adamw.c - the adamw plugin against torch.optim.AdamW / Adam step by
 * step (tests/data/optim/adamw.json, tools/gen_optim_reference.py), its
 * parameter groups, checkpoint state and config errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optim_testkit.h"

static cJSON *ref;

static void setup(void) { ref = tk_json("adamw.json"); }
static void teardown(void) { cJSON_Delete(ref); }

START_TEST(decoupled_weight_decay_matches_torch_adamw) {
    tk_run_optimizer_case(tk_case(ref, "adamw_decoupled"), "adamw", 0);
}
END_TEST

START_TEST(amsgrad_with_custom_betas_matches_torch) {
    tk_run_optimizer_case(tk_case(ref, "adamw_amsgrad"), "adamw", 0);
}
END_TEST

START_TEST(l2_mode_matches_torch_adam_weight_decay) {
    tk_run_optimizer_case(tk_case(ref, "adam_l2"), "adamw", 0);
}
END_TEST

START_TEST(groups_with_lr_scale_and_missing_grads_match_torch) {
    tk_run_optimizer_case(tk_case(ref, "adamw_groups"), "adamw", 0);
}
END_TEST

START_TEST(resume_from_saved_state_is_exact) {
    tk_run_optimizer_case(tk_case(ref, "adamw_groups"), "adamw", 5);
    tk_run_optimizer_case(tk_case(ref, "adamw_amsgrad"), "adamw", 7);
}
END_TEST

START_TEST(groups_are_built_from_globs_and_tags) {
    tk_run r;
    tk_init(&r);
    tk_add_param(&r, "enc.weight", PL_SHAPE(2, 2), NULL, true);
    tk_add_param(&r, "enc.bias", PL_SHAPE(2), NULL, true);
    tk_add_param(&r, "enc.norm.weight", PL_SHAPE(2), NULL, true);
    tk_add_param(&r, "frozen.weight", PL_SHAPE(2), NULL, false);
    pl_tensor *h = tk_add_param(&r, "out.proj", PL_SHAPE(3), NULL, true);
    (void)h;
    snprintf(pl_params_find(r.ctx->params, "out.proj")->role, PL_ROLE_MAX, "head");
    tk_open(&r, "optimizer", "adamw", NULL,
            "lr = 0.1\nweight_decay = 0.03\ngroup.no_decay.match = *bias,*norm*\n"
            "group.head.tags = head\ngroup.head.lr_scale = 0.25\n");
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    ck_assert_int_eq(vt->num_groups(self), 3);
    pl_param_group *g0 = vt->group(self, 0), *g1 = vt->group(self, 1), *g2 = vt->group(self, 2);
    ck_assert_str_eq(g0->name, "default");
    ck_assert_int_eq(g0->n_params, 1); /* enc.weight; frozen.weight excluded */
    ck_assert_str_eq(pl_params_at(r.ctx->params, g0->param_index[0])->name, "enc.weight");
    ck_assert_double_eq_tol(g0->weight_decay, 0.03, 1e-15);
    ck_assert_double_eq_tol(g0->initial_lr, 0.1, 1e-15);
    ck_assert_str_eq(g1->name, "no_decay");
    ck_assert_int_eq(g1->n_params, 2);
    ck_assert_double_eq(g1->weight_decay, 0.0);
    ck_assert_str_eq(g2->name, "head");
    ck_assert_int_eq(g2->n_params, 1);
    ck_assert_double_eq_tol(g2->initial_lr, 0.025, 1e-15);
    ck_assert_double_eq_tol(g2->lr, 0.025, 1e-15);
    ck_assert_double_eq_tol(g2->weight_decay, 0.03, 1e-15);
    ck_assert_double_eq_tol(pl_group_hparam(g2, "beta1")->value, 0.9, 1e-15);
    ck_assert_double_eq_tol(pl_group_hparam(g2, "beta2")->value, 0.999, 1e-15);
    ck_assert_ptr_null(pl_group_hparam(g2, "momentum"));
    ck_assert_ptr_null(vt->group(self, 3));
    /* state lists step + two moments for each of the 4 trainable params */
    tk_state *st = tk_state_save(vt->state, self);
    ck_assert_int_eq(tk_state_count(st), 12);
    bool found;
    ck_assert_double_eq(tk_state_scalar(st, "adamw.step.enc.bias", &found), 0.0);
    ck_assert(found);
    tk_state_scalar(st, "adamw.step.frozen.weight", &found);
    ck_assert(!found);
    tk_state_free(st);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(group_without_selector_is_refused) {
    tk_run r;
    tk_init(&r);
    tk_add_param(&r, "w", PL_SHAPE(2), NULL, true);
    tk_open(&r, "optimizer", "adamw", NULL, "group.head.lr_scale = 2\n");
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    ck_assert_int_eq(vt->create(r.sec, r.ctx, &self), PL_ERR_CONFIG);
    ck_assert_ptr_null(self);
    ck_assert_msg(strstr(pl_error_message(), "group 'head' selects nothing"), "%s",
                  pl_error_message());
    tk_close(&r);
}
END_TEST

/* a group whose glob selects nothing is most often a typo: the run goes on, with a
 * warning naming the group and what the parameters are called */
START_TEST(group_matching_no_parameter_is_warned) {
    tk_run r;
    tk_init(&r);
    tk_add_param(&r, "enc.weight", PL_SHAPE(2), NULL, true);
    tk_open(&r, "optimizer", "adamw", NULL,
            "group.head.match = head.*\ngroup.head.lr_scale = 2\ngroup.r.tags = router\n");
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    char path[] = "/tmp/test_adamw_stderr_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    pl_status st = vt->create(r.sec, r.ctx, &self);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[1024] = {0};
    ck_assert_int_ge(pread(fd, buf, sizeof buf - 1, 0), 0);
    close(fd);
    unlink(path);
    ck_assert_int_eq(st, PL_OK);
    ck_assert_msg(strstr(buf, "group 'head' selects no trainable parameter (match 'head.*')") &&
                      strstr(buf, "enc.weight"),
                  "stderr: %s", buf);
    /* a tag no parameter has (moe_lora's router in a plain-LoRA run): warned, not refused */
    ck_assert_msg(strstr(buf, "group.r.tags: no parameter has the tag 'router'") &&
                      strstr(buf, "group 'r' selects no trainable parameter"),
                  "stderr: %s", buf);
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

START_TEST(wrong_gradient_dtype_is_an_error_naming_the_parameter) {
    tk_run r;
    tk_init(&r);
    pl_tensor *w = tk_add_param(&r, "layer.w", PL_SHAPE(4), NULL, true);
    tk_open(&r, "optimizer", "adamw", NULL, NULL);
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    w->grad = PL_CK_NOTNULL(pl_tensor_zeros(PL_F64, PL_SHAPE(4), PL_CPU));
    ck_assert_int_ne(vt->step(self), PL_OK);
    ck_assert_msg(strstr(pl_error_message(), "layer.w"), "%s", pl_error_message());
    vt->destroy(self);
    tk_close(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("adamw");
    TCase *tc = tcase_create("adamw");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, decoupled_weight_decay_matches_torch_adamw);
    tcase_add_test(tc, amsgrad_with_custom_betas_matches_torch);
    tcase_add_test(tc, l2_mode_matches_torch_adam_weight_decay);
    tcase_add_test(tc, groups_with_lr_scale_and_missing_grads_match_torch);
    tcase_add_test(tc, resume_from_saved_state_is_exact);
    tcase_add_test(tc, groups_are_built_from_globs_and_tags);
    tcase_add_test(tc, group_without_selector_is_refused);
    tcase_add_test(tc, group_matching_no_parameter_is_warned);
    tcase_add_test(tc, wrong_gradient_dtype_is_an_error_naming_the_parameter);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
