/* test_registry.c - plugin search, loading and every refusal of the
 * registry, on the fixture plugins of tests/fixtures; and the run objects
 * handed to plugins (runobjs.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pl_test.h"
#include "config_internal.h"
#include "registry.h"
#include "pipeline/testing.h"
#include "stage.h"

#ifndef PL_FIXTURE_DIR
#define PL_FIXTURE_DIR PL_TEST_BINARY_DIR "/tests/fixtures/plugins"
#endif
#define GOOD PL_FIXTURE_DIR "/good"
#define BROKEN PL_FIXTURE_DIR "/broken"
#define DUP1 PL_FIXTURE_DIR "/dup1"
#define DUP2 PL_FIXTURE_DIR "/dup2"

static pl_registry *reg_with(const char *d1, const char *d2) {
    pl_registry *r = PL_CK_NOTNULL(pl_registry_new());
    if (d1) PL_CK_OK(pl_registry_add_dir(r, d1));
    if (d2) PL_CK_OK(pl_registry_add_dir(r, d2));
    return r;
}

#define CK_HAS(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "expected '%s' in: %s", (needle), (msg))

START_TEST(finds_valid_plugin_with_expected_kind) {
    pl_registry *r = reg_with(GOOD, NULL);
    const pl_plugin_desc *d = NULL;
    const char *err = "unset";
    PL_CK_OK(pl_registry_find(r, "fx_optim", PL_KIND_OPTIMIZER, &d, &err));
    ck_assert_ptr_nonnull(d);
    ck_assert_ptr_null(err);
    ck_assert_str_eq(d->name, "fx_optim");
    ck_assert_int_eq(d->kind, PL_KIND_OPTIMIZER);
    ck_assert_str_eq(d->version, "0.0.1");
    ck_assert_str_eq(d->options[1].name, "weight_decay");
    ck_assert_str_eq(pl_registry_path_of(r, "fx_optim"), GOOD "/fx_optim.so");
    /* any kind; and a second lookup returns the same descriptor */
    const pl_plugin_desc *d2 = NULL;
    PL_CK_OK(pl_registry_find(r, "fx_optim", PL_KIND_COUNT, &d2, NULL));
    ck_assert_ptr_eq(d, d2);
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_wrong_abi_major_naming_both_versions) {
    pl_registry *r = reg_with(GOOD, BROKEN);
    const pl_plugin_desc *d = (const pl_plugin_desc *)1;
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_badmajor", PL_KIND_OPTIMIZER, &d, &err), PL_ERR_ABI);
    ck_assert_ptr_null(d);
    ck_assert_ptr_nonnull(err);
    CK_HAS(err, BROKEN "/fx_badmajor.so");
    char want[64];
    snprintf(want, sizeof want, "ABI %d.0", PL_ABI_MAJOR + 1);
    CK_HAS(err, want);
    snprintf(want, sizeof want, "ABI %d.%d", PL_ABI_MAJOR, PL_ABI_MINOR);
    CK_HAS(err, want);
    ck_assert_str_ne(pl_hint_get(), "");
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_newer_abi_minor_naming_both_versions) {
    pl_registry *r = reg_with(BROKEN, NULL);
    const pl_plugin_desc *d = NULL;
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_newminor", PL_KIND_COUNT, &d, &err), PL_ERR_ABI);
    CK_HAS(err, BROKEN "/fx_newminor.so");
    char want[64];
    snprintf(want, sizeof want, "ABI %d.%d", PL_ABI_MAJOR, PL_ABI_MINOR + 1);
    CK_HAS(err, want);
    snprintf(want, sizeof want, "ABI %d.%d", PL_ABI_MAJOR, PL_ABI_MINOR);
    CK_HAS(err, want);
    CK_HAS(err, "newer");
    /* the refusal is cached and repeated identically */
    ck_assert_int_eq(pl_registry_find(r, "fx_newminor", PL_KIND_COUNT, &d, &err), PL_ERR_ABI);
    CK_HAS(err, "fx_newminor.so");
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_missing_entry_symbol) {
    pl_registry *r = reg_with(BROKEN, NULL);
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_nosym", PL_KIND_COUNT, NULL, &err), PL_ERR_ABI);
    CK_HAS(err, BROKEN "/fx_nosym.so");
    CK_HAS(err, PL_PLUGIN_ENTRY_SYMBOL);
    CK_HAS(pl_hint_get(), "PL_PLUGIN_DEFINE");
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_kind_mismatch_naming_section) {
    pl_registry *r = reg_with(GOOD, NULL);
    const pl_plugin_desc *d = NULL;
    ck_assert_int_eq(pl_registry_find_for(r, "fx_sched", PL_KIND_OPTIMIZER, "optimizer",
                                          "t.ini:7", &d),
                     PL_ERR_CONFIG);
    const char *m = pl_error_message();
    CK_HAS(m, "t.ini:7");
    CK_HAS(m, "[optimizer] plugin = fx_sched");
    CK_HAS(m, "is a scheduler plugin, expected an optimizer plugin");
    CK_HAS(m, GOOD "/fx_sched.so");
    CK_HAS(pl_hint_get(), "[scheduler]");
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_same_name_from_two_files) {
    pl_registry *r = reg_with(DUP1, DUP2);
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_dup", PL_KIND_OPTIMIZER, NULL, &err), PL_ERR_CONFIG);
    CK_HAS(err, DUP1 "/fx_dup.so");
    CK_HAS(err, DUP2 "/fx_dup.so");
    /* the listing agrees with the loader: neither file is listed as usable
     * (both used to be listed as valid plugins) */
    const pl_plugin_info *info = NULL;
    int n = pl_registry_list(r, &info), seen = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(info[i].name, "fx_dup")) continue;
        seen++;
        ck_assert_msg(!info[i].desc, "%s listed as usable", info[i].path);
        ck_assert_ptr_nonnull(info[i].error);
        CK_HAS(info[i].error, "is provided by two files");
        CK_HAS(info[i].error, DUP1 "/fx_dup.so");
        CK_HAS(info[i].error, DUP2 "/fx_dup.so");
    }
    ck_assert_int_eq(seen, 2);
    pl_registry_free(r);
    /* one dir given twice (or via a trailing slash) is searched once: no error */
    r = reg_with(DUP1, DUP1 "/");
    ck_assert_int_eq(pl_registry_dir_count(r), 1);
    PL_CK_OK(pl_registry_find(r, "fx_dup", PL_KIND_OPTIMIZER, NULL, NULL));
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_descriptor_name_differing_from_file) {
    pl_registry *r = reg_with(BROKEN, NULL);
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_misnamed", PL_KIND_COUNT, NULL, &err), PL_ERR_ABI);
    CK_HAS(err, "fx_misnamed.so");
    CK_HAS(err, "'fx_other'");
    pl_registry_free(r);
}
END_TEST

START_TEST(refuses_paths_as_plugin_names) {
    pl_registry *r = reg_with(GOOD, NULL);
    const char *bad[] = {"../evil", "..", "a/b", "/abs/x", "fx_optim.so", "", "x y", "a;b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *err = NULL;
        ck_assert_int_eq(pl_registry_find(r, bad[i], PL_KIND_COUNT, NULL, &err), PL_ERR_CONFIG);
        CK_HAS(err, "invalid plugin name");
        ck_assert(!pl_plugin_name_valid(bad[i]));
    }
    ck_assert(pl_plugin_name_valid("adamw"));
    ck_assert(pl_plugin_name_valid("hdf5_chunk-2"));
    pl_registry_free(r);
}
END_TEST

START_TEST(not_found_lists_search_dirs) {
    pl_registry *r = reg_with(GOOD, BROKEN);
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find(r, "fx_nothere", PL_KIND_COUNT, NULL, &err), PL_ERR_CONFIG);
    CK_HAS(err, "fx_nothere");
    CK_HAS(err, GOOD ":" BROKEN);
    pl_registry_free(r);
}
END_TEST

/* a mistyped plugin name gets the nearest name of the kind asked for: a
 * case-only difference first, then the fewest edits; the hint lists the
 * plugins of that kind */
START_TEST(not_found_suggests_nearest_plugin_of_the_kind) {
    pl_registry *r = reg_with(GOOD, BROKEN);
    const char *err = NULL;
    ck_assert_int_eq(pl_registry_find_for(r, "FX_Optim", PL_KIND_OPTIMIZER, "optim", "a.ini", NULL),
                     PL_ERR_CONFIG);
    err = pl_error_message();
    CK_HAS(err, "a.ini: [optim] plugin = FX_Optim: plugin 'FX_Optim' not found");
    CK_HAS(err, "did you mean 'fx_optim'?");
    CK_HAS(pl_hint_get(), "optimizer plugins here: fx_optim");
    ck_assert_int_eq(pl_registry_find(r, "fx_optm", PL_KIND_OPTIMIZER, NULL, &err), PL_ERR_CONFIG);
    CK_HAS(err, "did you mean 'fx_optim'?");
    /* fx_model is near but a model: not offered for an optimizer */
    ck_assert_int_eq(pl_registry_find(r, "fx_mode", PL_KIND_OPTIMIZER, NULL, &err), PL_ERR_CONFIG);
    ck_assert_msg(!strstr(err, "did you mean"), "%s", err);
    ck_assert_int_eq(pl_registry_find(r, "fx_mode", PL_KIND_MODEL, NULL, &err), PL_ERR_CONFIG);
    CK_HAS(err, "did you mean 'fx_model'?");
    /* prec_a and prec_b are both one edit away: the first by name */
    ck_assert_int_eq(pl_registry_find(r, "FX_PREC_C", PL_KIND_PRECISION, NULL, &err),
                     PL_ERR_CONFIG);
    CK_HAS(err, "did you mean 'fx_prec_a'?");
    CK_HAS(pl_hint_get(), "precision plugins here: fx_prec_a, fx_prec_b");
    /* nothing near: no suggestion */
    ck_assert_int_eq(pl_registry_find(r, "zzzzzz", PL_KIND_COUNT, NULL, &err), PL_ERR_CONFIG);
    ck_assert_msg(!strstr(err, "did you mean"), "%s", err);
    pl_registry_free(r);
}
END_TEST

START_TEST(search_order_flag_then_env_then_build_dirs) {
    setenv("PIPELINE_PLUGIN_PATH", BROKEN ":" DUP1, 1);
    pl_registry *r = reg_with(GOOD, NULL);
    PL_CK_OK(pl_registry_add_default_dirs(r));
    ck_assert_int_ge(pl_registry_dir_count(r), 3);
    ck_assert_str_eq(pl_registry_dir_at(r, 0), GOOD);
    ck_assert_str_eq(pl_registry_dir_at(r, 1), BROKEN);
    ck_assert_str_eq(pl_registry_dir_at(r, 2), DUP1);
    /* the build-tree plugin dir follows when it exists */
    bool has_build = false;
    for (int i = 3; i < pl_registry_dir_count(r); i++)
        has_build |= strcmp(pl_registry_dir_at(r, i), PL_TEST_PLUGIN_DIR) == 0;
    ck_assert(has_build || access(PL_TEST_PLUGIN_DIR, F_OK) != 0);
    unsetenv("PIPELINE_PLUGIN_PATH");
    pl_registry_free(r);
}
END_TEST

START_TEST(list_sorts_and_reports_refused_plugins) {
    pl_registry *r = reg_with(GOOD, BROKEN);
    const pl_plugin_info *info = NULL;
    int n = pl_registry_list(r, &info);
    ck_assert_int_eq(n, 10);
    const char *want[] = {"fx_badmajor", "fx_loader", "fx_misnamed", "fx_model",  "fx_newminor",
                          "fx_nosym",    "fx_optim",  "fx_prec_a",   "fx_prec_b", "fx_sched"};
    int refused = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(info[i].name, want[i]);
        if (!info[i].desc) {
            refused++;
            ck_assert_ptr_nonnull(info[i].error);
            CK_HAS(info[i].error, info[i].path);
        }
    }
    ck_assert_int_eq(refused, 4);
    pl_registry_free(r);
}
END_TEST

/* ---- run objects ---------------------------------------------------- */

START_TEST(params_keep_order_retain_and_refuse_duplicates) {
    pl_params *ps = PL_CK_NOTNULL(pl_params_new());
    int64_t shape[2] = {2, 3};
    pl_tensor *a = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 2, shape, PL_CPU));
    pl_tensor *b = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, shape, PL_CPU));
    PL_CK_OK(pl_params_add(ps, "layer.0.weight", a, PL_TAG_BASE, NULL));
    PL_CK_OK(pl_params_add(ps, "layer.0.bias", b, PL_TAG_NO_DECAY, "head"));
    ck_assert_int_eq(a->refcount, 2);
    ck_assert_str_eq(a->name, "layer.0.weight");
    ck_assert_int_eq(pl_params_add(ps, "layer.0.bias", a, 0, NULL), PL_ERR_INVALID);
    CK_HAS(pl_error_message(), "layer.0.bias");
    ck_assert_int_eq(pl_params_count(ps), 2);
    ck_assert_str_eq(pl_params_at(ps, 1)->name, "layer.0.bias");
    ck_assert_ptr_eq(pl_params_find(ps, "layer.0.weight")->t, a);
    ck_assert_ptr_null(pl_params_find(ps, "nope"));
    ck_assert_ptr_null(pl_params_at(ps, 2));
    /* replace: new tensor retained and renamed, old one released */
    pl_tensor *c = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 2, shape, PL_CPU));
    PL_CK_OK(pl_params_replace(ps, 0, c));
    ck_assert_int_eq(a->refcount, 1);
    ck_assert_int_eq(c->refcount, 2);
    ck_assert_str_eq(c->name, "layer.0.weight");
    pl_params_free(ps);
    ck_assert_int_eq(c->refcount, 1);
    pl_tensor_release(a);
    pl_tensor_release(b);
    pl_tensor_release(c);
}
END_TEST

START_TEST(name_globs_match_comma_separated_alternatives) {
    ck_assert(pl_name_matches("layer.0.bias", "*bias,*norm*"));
    ck_assert(pl_name_matches("model.norm.weight", "*bias, *norm*"));
    ck_assert(!pl_name_matches("layer.0.weight", "*bias,*norm*"));
    ck_assert(pl_name_matches("router.gate", "router.*"));
    ck_assert(!pl_name_matches("xrouter.gate", "router.*"));
    ck_assert(!pl_name_matches("a", ""));
    ck_assert(pl_name_matches("lora_A", "lora_?"));
}
END_TEST

START_TEST(meta_stores_typed_values_and_names_missing_keys) {
    pl_meta *m = PL_CK_NOTNULL(pl_meta_new());
    PL_CK_OK(pl_meta_set_int(m, "num_items", 3706));
    PL_CK_OK(pl_meta_set_float(m, "mean", 3.5));
    PL_CK_OK(pl_meta_set_str(m, "task", "ranking"));
    int64_t i = 0;
    double f = 0;
    PL_CK_OK(pl_meta_get_int(m, "num_items", &i));
    ck_assert_int_eq(i, 3706);
    PL_CK_OK(pl_meta_get_float(m, "num_items", &f));
    ck_assert(f == 3706.0);
    PL_CK_OK(pl_meta_get_float(m, "mean", &f));
    ck_assert(f == 3.5);
    ck_assert_int_eq(pl_meta_get_int(m, "mean", &i), PL_ERR_CONFIG); /* 3.5 not an integer */
    ck_assert_str_eq(pl_meta_get_str(m, "task"), "ranking");
    ck_assert_ptr_null(pl_meta_get_str(m, "num_items"));
    ck_assert_int_eq(pl_meta_get_int(m, "num_users", &i), PL_ERR_CONFIG);
    ck_assert_str_eq(pl_error_message(), "'num_users' was not provided by the loader");
    /* numbers a file holds (found by fuzz_hdf5: 9.3e18 converted to int64_t, UB):
     * stored as floats, refused as integers naming the key */
    const double odd[] = {9.3e18, -1e300, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        PL_CK_OK(pl_meta_set_float(m, "odd", odd[k]));
        ck_assert_int_eq(pl_meta_get_int(m, "odd", &i), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), "meta 'odd': expected an integer"), "%s",
                      pl_error_message());
        PL_CK_OK(pl_meta_get_float(m, "odd", &f));
        ck_assert(f == odd[k] || (isnan(f) && isnan(odd[k])));
    }
    PL_CK_OK(pl_meta_set_float(m, "whole", 4096.0));
    PL_CK_OK(pl_meta_get_int(m, "whole", &i));
    ck_assert_int_eq(i, 4096);
    PL_CK_OK(pl_meta_set_int(m, "num_items", 7)); /* overwrite */
    PL_CK_OK(pl_meta_get_int(m, "num_items", &i));
    ck_assert_int_eq(i, 7);
    ck_assert_int_eq(pl_meta_count(m), 5);
    pl_meta_free(m);
}
END_TEST

START_TEST(metrics_average_sum_over_count) {
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_metrics_add(&m, "loss", 6.0, 3.0);
    pl_metrics_add(&m, "accuracy", 1.0, 4.0);
    pl_metrics_add(&m, "loss", 2.0, 1.0);
    ck_assert(pl_metrics_get(&m, "loss") == 2.0); /* (6+2)/(3+1) */
    ck_assert(pl_metrics_get(&m, "accuracy") == 0.25);
    ck_assert(isnan(pl_metrics_get(&m, "missing")));
    ck_assert_int_eq(m.n, 2);
    pl_metrics_reset(&m);
    ck_assert(isnan(pl_metrics_get(&m, "loss")));
}
END_TEST

START_TEST(batch_get_names_missing_field) {
    int64_t shape[1] = {4};
    pl_tensor *x = PL_CK_NOTNULL(pl_tensor_zeros(PL_F32, 1, shape, PL_CPU));
    pl_batch b = {.n = 2, .names = {"x", "y"}, .fields = {x, x}, .size = 4};
    ck_assert_ptr_eq(pl_batch_get(&b, "y"), x);
    ck_assert_ptr_null(pl_batch_get(&b, "label"));
    CK_HAS(pl_error_message(), "'label'");
    CK_HAS(pl_error_message(), "x, y");
    /* pl_batch_find: the same lookup for an optional field, leaving the error alone */
    pl_error_set(PL_ERR_IO, "earlier error");
    ck_assert_ptr_eq(pl_batch_find(&b, "x"), x);
    ck_assert_ptr_null(pl_batch_find(&b, "label"));
    ck_assert_ptr_null(pl_batch_find(NULL, "x"));
    CK_HAS(pl_error_message(), "earlier error");
    pl_error_clear();
    pl_tensor_release(x);
}
END_TEST

START_TEST(enum_names) {
    ck_assert_str_eq(pl_plugin_kind_name(PL_KIND_LOADER), "loader");
    ck_assert_str_eq(pl_plugin_kind_name(PL_KIND_BACKEND), "backend");
    ck_assert_str_eq(pl_plugin_kind_name(PL_KIND_COUNT), "unknown");
    ck_assert_str_eq(pl_split_name(PL_SPLIT_TRAIN), "train");
    ck_assert_str_eq(pl_split_name(PL_SPLIT_VAL), "val");
    ck_assert_str_eq(pl_split_name(PL_SPLIT_TEST), "test");
}
END_TEST

/* The trainer and the test harness read a stage's vtable through one check:
 * a vtable missing create/destroy or a member its kind requires is refused
 * naming the plugin, its file and the member; a complete one gives its
 * functions, with the state function of kinds that have one. */
static pl_status fx_create(const pl_config_section *c, pl_run_context *x, void **self) {
    (void)c, (void)x;
    *self = NULL;
    return PL_OK;
}
static void fx_destroy(void *self) { (void)self; }
static double fx_factor(void *self, int64_t step) { return (void)self, (double)step; }
static pl_status fx_state(void *self, const pl_state_visitor *v) { return (void)self, (void)v, PL_OK; }
static int fx_next(void *self, pl_batch *b) { return (void)self, (void)b, 0; }

START_TEST(stage_vtables_are_checked_for_required_members) {
    pl_stage_fns f;
    const pl_scheduler_vtable sched = {.create = fx_create, .destroy = fx_destroy,
                                       .lr_factor = fx_factor, .state = fx_state};
    pl_plugin_desc d = {PL_ABI_MAJOR, PL_ABI_MINOR, "fx_s", PL_KIND_SCHEDULER, "1", "", NULL, &sched};
    PL_CK_OK(pl_stage_fns_of(&d, "/x/fx_s.so", &f));
    ck_assert(f.create == fx_create && f.destroy == fx_destroy && f.state == fx_state);
    /* a loader without batch_fields (required since ABI 2.0) */
    const pl_loader_vtable ld = {.create = fx_create, .destroy = fx_destroy,
                                 .epoch_begin = NULL, .next = fx_next};
    pl_plugin_desc dl = {PL_ABI_MAJOR, PL_ABI_MINOR, "fx_l", PL_KIND_LOADER, "1", "", NULL, &ld};
    ck_assert_int_eq(pl_stage_fns_of(&dl, "/x/fx_l.so", &f), PL_ERR_ABI);
    const char *m = pl_error_message();
    ck_assert_msg(strstr(m, "fx_l") && strstr(m, "/x/fx_l.so") && strstr(m, "'epoch_begin'"), "%s", m);
    /* no vtable at all; no destroy */
    pl_plugin_desc dn = {PL_ABI_MAJOR, PL_ABI_MINOR, "fx_n", PL_KIND_MODEL, "1", "", NULL, NULL};
    ck_assert_int_eq(pl_stage_fns_of(&dn, "", &f), PL_ERR_ABI);
    ck_assert_msg(strstr(pl_error_message(), "has no vtable"), "%s", pl_error_message());
    const pl_model_vtable md = {.create = fx_create};
    dn.vtable = &md;
    ck_assert_int_eq(pl_stage_fns_of(&dn, "", &f), PL_ERR_ABI);
    ck_assert_msg(strstr(pl_error_message(), "create/destroy"), "%s", pl_error_message());
    /* a backend is no stage */
    dn.kind = PL_KIND_BACKEND;
    ck_assert_int_eq(pl_stage_fns_of(&dn, "", &f), PL_ERR_INVALID);
}
END_TEST

/* pl_harness_new_in finds a plugin in the extra directories and validates the
 * snippet against its schema; without the directory the plugin is unknown. */
START_TEST(harness_searches_extra_plugin_dirs) {
    pl_harness *h = pl_harness_new_in(PL_FIXTURE_DIR "/good", "model", "fx_model", "hidden = 8\n");
    ck_assert_msg(h != NULL, "%s", pl_error_message());
    ck_assert_str_eq(pl_harness_desc(h)->name, "fx_model");
    ck_assert_int_eq((int)pl_cfg_int(pl_harness_section(h), "hidden", 0), 8);
    pl_harness_free(h);
    h = pl_harness_new_in(PL_FIXTURE_DIR "/good", "model", "fx_model", "hidden = 0\n");
    ck_assert_ptr_null(h);
    ck_assert_int_eq(pl_error_status(), PL_ERR_CONFIG);
    ck_assert_ptr_null(pl_harness_new("model", "fx_model", NULL));
}
END_TEST

int main(void) {
    Suite *s = suite_create("registry");
    TCase *t = tcase_create("registry");
    tcase_add_test(t, finds_valid_plugin_with_expected_kind);
    tcase_add_test(t, refuses_wrong_abi_major_naming_both_versions);
    tcase_add_test(t, refuses_newer_abi_minor_naming_both_versions);
    tcase_add_test(t, refuses_missing_entry_symbol);
    tcase_add_test(t, refuses_kind_mismatch_naming_section);
    tcase_add_test(t, refuses_same_name_from_two_files);
    tcase_add_test(t, refuses_descriptor_name_differing_from_file);
    tcase_add_test(t, refuses_paths_as_plugin_names);
    tcase_add_test(t, not_found_lists_search_dirs);
    tcase_add_test(t, not_found_suggests_nearest_plugin_of_the_kind);
    tcase_add_test(t, search_order_flag_then_env_then_build_dirs);
    tcase_add_test(t, list_sorts_and_reports_refused_plugins);
    suite_add_tcase(s, t);
    TCase *o = tcase_create("runobjs");
    tcase_add_test(o, params_keep_order_retain_and_refuse_duplicates);
    tcase_add_test(o, name_globs_match_comma_separated_alternatives);
    tcase_add_test(o, meta_stores_typed_values_and_names_missing_keys);
    tcase_add_test(o, metrics_average_sum_over_count);
    tcase_add_test(o, batch_get_names_missing_field);
    tcase_add_test(o, enum_names);
    tcase_add_test(o, stage_vtables_are_checked_for_required_members);
    tcase_add_test(o, harness_searches_extra_plugin_dirs);
    suite_add_tcase(s, o);
    return pl_test_run(s);
}
