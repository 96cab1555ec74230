/* test_adamw.c - the adamw plugin against torch.optim.AdamW / Adam step by
 * step (tests/data/optim/adamw.json, tools/gen_optim_reference.py), its
 * parameter groups, checkpoint state and config errors; steps skipped by
 * found_inf on the host and on the device (cpu, strict) against torch's
 * GradScaler skip and fused step count; the counted ops against the host-step
 * ops, bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "optim_testkit.h"
#include "pipeline/optim_math.h"

static const pl_device STRICT = {PL_DEVICE_CUDA, 0};

static void use_strict(void) { PL_CK_OK(pl_harness_load_backend_named(PL_DEVICE_CUDA, "strict")); }

/* c with options.foreach = v (a copy; cJSON_Delete it). */
static cJSON *with_foreach(const cJSON *c, const char *v) {
    cJSON *d = cJSON_Duplicate(c, true);
    ck_assert_ptr_nonnull(d);
    cJSON *o = cJSON_GetObjectItemCaseSensitive(d, "options");
    cJSON_DeleteItemFromObjectCaseSensitive(o, "foreach");
    ck_assert_ptr_nonnull(cJSON_AddStringToObject(o, "foreach", v));
    return d;
}

static void assert_bits(const float *a, const float *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s: value %d: %.9g vs %.9g", what,
                      i, (double)a[i], (double)b[i]);
}

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

/* found_inf at steps 3 and 4 of 8 (adamw_found_inf): torch skips
 * optimizer.step() (GradScaler, non-fused), and its fused AdamW ends with
 * state["step"] 6 (state_steps += 1, then -= found_inf). The host path (no
 * step) and the device path (the step runs with the flag; the kernels
 * neither update nor count) give torch's values, the same bits, and a step
 * count of 6, on the CPU and the strict device, foreach or per tensor. With
 * the count advancing on a skip (before ABI 2.12) steps 5.. used t one or
 * two higher: bias corrections 1 - 0.9^t that differ by 10% and more. */
START_TEST(found_inf_skips_match_torch_on_host_and_device_paths) {
    const cJSON *c = tk_case(ref, "adamw_found_inf");
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(c, "steps_after"));
    int n0, n;
    float *host = tk_run_optimizer_case_on(c, "adamw", 0, PL_CPU, false, &n0);
    float *dev = tk_run_optimizer_case_on(c, "adamw", 0, PL_CPU, true, &n);
    assert_bits(host, dev, n0, "cpu: host skip vs device skip");
    free(dev);
    cJSON *pt = with_foreach(c, "false");
    dev = tk_run_optimizer_case_on(pt, "adamw", 0, PL_CPU, true, &n);
    assert_bits(host, dev, n0, "cpu per tensor: device skip vs host skip");
    free(dev);
    use_strict();
    dev = tk_run_optimizer_case_on(c, "adamw", 0, STRICT, true, &n);
    assert_bits(host, dev, n0, "strict device skip vs cpu host skip");
    free(dev);
    dev = tk_run_optimizer_case_on(pt, "adamw", 0, STRICT, true, &n);
    assert_bits(host, dev, n0, "strict per tensor: device skip vs cpu host skip");
    free(dev);
    /* the count on the device through a checkpoint: save after step 4 (both
     * skips done, count 3) and after step 6 */
    dev = tk_run_optimizer_case_on(c, "adamw", 4, STRICT, true, &n);
    assert_bits(host, dev, n0, "strict, resumed after the skips");
    free(dev);
    dev = tk_run_optimizer_case_on(c, "adamw", 6, PL_CPU, true, &n);
    assert_bits(host, dev, n0, "cpu, resumed at step 6");
    free(dev);
    cJSON_Delete(pt);
    free(host);
}
END_TEST

/* Every reference case on the device path (the flag set, 0 on every step)
 * on the strict device: torch's values, and the bits of the CPU's host path. */
START_TEST(device_counted_steps_match_torch_and_the_host_path) {
    static const char *const names[] = {"adamw_decoupled", "adamw_amsgrad", "adam_l2",
                                        "adamw_groups"};
    use_strict();
    for (int k = 0; k < 4; k++) {
        const cJSON *c = tk_case(ref, names[k]);
        int n0, n;
        float *host = tk_run_optimizer_case_on(c, "adamw", 0, PL_CPU, false, &n0);
        float *dev = tk_run_optimizer_case_on(c, "adamw", 3, STRICT, true, &n);
        assert_bits(host, dev, n0, names[k]);
        free(dev);
        free(host);
    }
}
END_TEST

/* The counted ops (count on the device) against the host-step ops, 30 steps,
 * per tensor and multi-tensor, AdamW / amsgrad / L2: the same bits, i.e. the
 * path every run without a skip now takes computes what it computed before;
 * the count ends at 30. A flagged step changes nothing, the count included. */
START_TEST(counted_ops_equal_host_step_ops_bit_for_bit) {
    const int64_t n = 300;
    for (int variant = 0; variant < 3; variant++) {
        pl_tensor *t[2][5], *cnt = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, (int64_t[]){1}, PL_CPU));
        pl_tensor *flag = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, (int64_t[]){1}, PL_CPU));
        float *v = malloc(sizeof(float) * (size_t)n);
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 5; k++) {
                for (int64_t e = 0; e < n; e++)
                    v[e] = k == 0 ? sinf((float)e * 0.37f) : k >= 2 ? 0.0f : 0.0f;
                t[r][k] = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, &n, v, PL_CPU));
            }
        pl_adamw_hyper h = {.lr = 0.003, .beta1 = 0.85, .beta2 = 0.995, .eps = 1e-7,
                            .weight_decay = 0.02, .l2 = variant == 2, .amsgrad = variant == 1};
        for (int s = 1; s <= 30; s++) {
            for (int64_t e = 0; e < n; e++) v[e] = cosf((float)(e * s) * 0.11f) * (float)(s % 5 + 1);
            for (int r = 0; r < 2; r++) {
                pl_tensor_release(t[r][1]);
                t[r][1] = PL_CK_NOTNULL(pl_tensor_from_data(PL_F32, 1, &n, v, PL_CPU));
            }
            h.step = s;
            PL_CK_OK(pl_adamw_step_(t[0][0], t[0][1], t[0][2], t[0][3], t[0][4], &h));
            h.step = 12345; /* ignored by a counted call */
            if (s % 2)
                PL_CK_OK(pl_adamw_step_counted_(t[1][0], t[1][1], t[1][2], t[1][3], t[1][4], cnt, &h));
            else
                PL_CK_OK(pl_adamw_step_multi_counted_(1, &t[1][0], &t[1][1], &t[1][2], &t[1][3],
                                                      &t[1][4], &cnt, &h));
            if (s == 10) { /* a skipped call between two steps: nothing moves */
                PL_CK_OK(pl_tensor_fill_(flag, 1.0));
                pl_optim_set_found_inf(flag);
                PL_CK_OK(pl_adamw_step_multi_counted_(1, &t[1][0], &t[1][1], &t[1][2], &t[1][3],
                                                      &t[1][4], &cnt, &h));
                PL_CK_OK(pl_adamw_step_counted_(t[1][0], t[1][1], t[1][2], t[1][3], t[1][4], cnt, &h));
                pl_optim_set_found_inf(NULL);
            }
            for (int k = 0; k < 5; k++) {
                if (k == 1 || (k == 4 && variant != 1)) continue;
                char what[64];
                snprintf(what, sizeof what, "variant %d step %d tensor %d", variant, s, k);
                assert_bits(pl_tensor_f32(t[0][k]), pl_tensor_f32(t[1][k]), (int)n, what);
            }
        }
        ck_assert_float_eq(pl_tensor_f32(cnt)[0], 30.0f);
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 5; k++) pl_tensor_release(t[r][k]);
        pl_tensor_release(cnt);
        pl_tensor_release(flag);
        free(v);
    }
}
END_TEST

/* A loading visitor that sets every scalar to *ctx and leaves the tensors. */
static pl_status keep_tensor(void *ctx, const char *name, pl_tensor *t) {
    (void)ctx, (void)name, (void)t;
    return PL_OK;
}
static pl_status load_scalar(void *ctx, const char *name, double *v) {
    (void)name;
    *v = *(const double *)ctx;
    return PL_OK;
}

/* A checkpoint's step is the count on the device; an old checkpoint's count
 * (a host count, the same name) loads into it; a count past 2^24 is refused. */
START_TEST(device_count_is_the_checkpointed_step) {
    tk_run r;
    tk_init(&r);
    pl_tensor *w = tk_add_param(&r, "w", PL_SHAPE(3), NULL, true);
    tk_open(&r, "optimizer", "adamw", NULL, NULL);
    const pl_optimizer_vtable *vt = r.vtable;
    void *self = NULL;
    PL_CK_OK(vt->create(r.sec, r.ctx, &self));
    w->grad = PL_CK_NOTNULL(pl_tensor_full(PL_F32, PL_SHAPE(3), 0.5, PL_CPU));
    PL_CK_OK(vt->step(self));
    PL_CK_OK(vt->step(self));
    tk_state *st = tk_state_save(vt->state, self);
    bool found;
    ck_assert_double_eq(tk_state_scalar(st, "adamw.step.w", &found), 2.0);
    ck_assert(found);
    tk_state_free(st);
    /* a load of 41 (what a checkpoint of the host count holds), then of 2^24 + 1 */
    double load = 41.0;
    pl_state_visitor lv = {&load, keep_tensor, load_scalar, true};
    PL_CK_OK(vt->state(self, &lv));
    st = tk_state_save(vt->state, self);
    ck_assert_double_eq(tk_state_scalar(st, "adamw.step.w", &found), 41.0);
    tk_state_free(st);
    PL_CK_OK(vt->step(self)); /* the same gradient */
    st = tk_state_save(vt->state, self);
    ck_assert_double_eq(tk_state_scalar(st, "adamw.step.w", &found), 42.0);
    tk_state_free(st);
    load = 16777217.0;
    ck_assert_int_eq(vt->state(self, &lv), PL_ERR_INVALID);
    ck_assert_msg(strstr(pl_error_message(), "adamw.step.w") && strstr(pl_error_message(), "f32"),
                  "%s", pl_error_message());
    vt->destroy(self);
    tk_close(&r);
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
    tcase_add_test(tc, found_inf_skips_match_torch_on_host_and_device_paths);
    tcase_add_test(tc, device_counted_steps_match_torch_and_the_host_path);
    tcase_add_test(tc, counted_ops_equal_host_step_ops_bit_for_bit);
    tcase_add_test(tc, device_count_is_the_checkpointed_step);
    tcase_add_test(tc, groups_are_built_from_globs_and_tags);
    tcase_add_test(tc, group_without_selector_is_refused);
    tcase_add_test(tc, group_matching_no_parameter_is_warned);
    tcase_add_test(tc, wrong_gradient_dtype_is_an_error_naming_the_parameter);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
