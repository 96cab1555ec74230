/* test_config.c - INI parsing, validation against plugin schemas, overrides,
 * provenance, the written INI and the config hash; fixture plugins from
 * tests/fixtures/good. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"
#include "pl_test.h"
#include "registry.h"

#ifndef PL_FIXTURE_DIR
#define PL_FIXTURE_DIR PL_TEST_BINARY_DIR "/tests/fixtures/plugins"
#endif
#define GOOD PL_FIXTURE_DIR "/good"

#define CK_HAS(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "expected '%s' in: %s", (needle), (msg))
#define CK_HASNT(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) == NULL, "did not expect '%s' in: %s", (needle), (msg))

static char tmpdir[PATH_MAX];
static char ini_path[PATH_MAX + 16];
static pl_registry *reg;

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pl_test_config_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(ini_path, sizeof ini_path, "%s/t.ini", tmpdir);
    reg = pl_registry_new();
    pl_registry_add_dir(reg, GOOD);
}

static void teardown(void) {
    pl_registry_free(reg);
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* Load `text` as t.ini with up to 4 overrides (NULL-terminated). */
static pl_config *load(const char *text, const char *o1, const char *o2) {
    pl_test_write_file(ini_path, text);
    const char *ov[2];
    int n = 0;
    if (o1) ov[n++] = o1;
    if (o2) ov[n++] = o2;
    return pl_config_load(ini_path, n, ov, reg);
}

/* Load `text` as t.ini with the NULL-terminated overrides `ov`. */
static pl_config *loadv(const char *text, const char *const *ov) {
    pl_test_write_file(ini_path, text);
    int n = 0;
    while (ov[n]) n++;
    return pl_config_load(ini_path, n, ov, reg);
}

/* Expect loadv() to fail with PL_ERR_CONFIG; return the message. */
static const char *loadv_fails(const char *text, const char *const *ov) {
    pl_config *c = loadv(text, ov);
    ck_assert_msg(c == NULL, "config unexpectedly valid:\n%s", text);
    ck_assert_int_eq(pl_error_status(), PL_ERR_CONFIG);
    return pl_error_message();
}

/* Expect a load failure with `status`; return the message. */
static const char *load_fails(const char *text, const char *o1, pl_status status) {
    pl_config *c = load(text, o1, NULL);
    ck_assert_msg(c == NULL, "config unexpectedly valid:\n%s", text);
    ck_assert_int_eq(pl_error_status(), status);
    return pl_error_message();
}

static char origin_buf[PATH_MAX + 32];
static const char *at(int line) {
    snprintf(origin_buf, sizeof origin_buf, "%s:%d", ini_path, line);
    return origin_buf;
}

#define BASE "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"

static const char *good_ini = "; a comment\n"         /* 1 */
                              "[pipeline]\n"          /* 2 */
                              "seed = 7\n"            /* 3 */
                              "\n"                    /* 4 */
                              "[data]\n"              /* 5 */
                              "plugin = fx_loader\n"  /* 6 */
                              "batch_size = 64\n"     /* 7 */
                              "[model]\n"             /* 8 */
                              "plugin = fx_model\n"   /* 9 */
                              "layer.enc.width = 32 ; inline comment\n" /* 10 */
                              "activation = gelu\n"   /* 11 */
                              "[optimizer]\n"         /* 12 */
                              "plugin = fx_optim\n"   /* 13 */
                              "lr = 0.5\n"            /* 14 */
                              "group.decay.lr_scale = 2\n" /* 15 */
                              "[trainer]\n"           /* 16 */
                              "max_epochs = 3\n";     /* 17 */

START_TEST(resolves_values_defaults_and_provenance) {
    pl_config *c = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.2", NULL));
    const pl_config_section *p = PL_CK_NOTNULL(pl_config_section_get(c, "pipeline"));
    ck_assert_int_eq(pl_cfg_int(p, "seed", 0), 7);
    ck_assert_str_eq(pl_cfg_origin(p, "seed"), at(3));
    ck_assert_str_eq(pl_cfg_str(p, "device", NULL), "cpu");
    ck_assert_str_eq(pl_cfg_origin(p, "device"), "default");
    ck_assert(!pl_cfg_is_set(p, "device"));
    ck_assert_str_eq(pl_cfg_str(p, "name", NULL), "t"); /* the file's stem */
    ck_assert_str_eq(pl_cfg_str(p, "run_dir", NULL), "runs");

    const pl_config_section *o = PL_CK_NOTNULL(pl_config_section_get(c, "optimizer"));
    ck_assert_str_eq(pl_cfg_section_name(o), "optimizer");
    ck_assert(pl_cfg_float(o, "lr", 0) == 0.5);
    ck_assert_str_eq(pl_cfg_origin(o, "lr"), at(14));
    ck_assert(pl_cfg_float(o, "weight_decay", 0) == 0.2);
    ck_assert_str_eq(pl_cfg_origin(o, "weight_decay"), "command line");
    ck_assert(pl_cfg_is_set(o, "weight_decay"));
    ck_assert(pl_cfg_bool(o, "amsgrad", true) == false);
    ck_assert_str_eq(pl_cfg_origin(o, "amsgrad"), "default");
    /* a plugin sees its own section; pl_cfg_sibling reaches the others of the same config */
    ck_assert_ptr_eq(pl_cfg_sibling(o, "pipeline"), p);
    ck_assert_int_eq(pl_cfg_int(pl_cfg_sibling(o, "trainer"), "max_epochs", 0), 3);
    ck_assert_ptr_null(pl_cfg_sibling(o, "averager"));
    ck_assert_ptr_null(pl_cfg_sibling(NULL, "pipeline"));
    ck_assert(pl_cfg_float(o, "group.decay.lr_scale", 0) == 2.0);
    ck_assert_ptr_null(pl_cfg_get(o, "nope"));
    ck_assert_int_eq(pl_cfg_int(o, "nope", -5), -5);
    /* order: plugin first, then schema order, pattern keys at their pattern */
    ck_assert_int_eq(pl_cfg_count(o), 5);
    const char *keys[] = {"plugin", "lr", "weight_decay", "amsgrad", "group.decay.lr_scale"};
    for (int i = 0; i < 5; i++) ck_assert_str_eq(pl_cfg_key_at(o, i), keys[i]);
    ck_assert_str_eq(pl_cfg_value_at(o, 0), "fx_optim");

    const pl_config_section *m = pl_config_section_get(c, "model");
    ck_assert_int_eq(pl_cfg_int(m, "layer.enc.width", 0), 32); /* inline comment stripped */
    ck_assert_str_eq(pl_cfg_str(m, "activation", NULL), "gelu");
    ck_assert_int_eq(pl_cfg_int(m, "hidden", 0), 16);
    ck_assert_str_eq(pl_config_plugin(c, "model")->name, "fx_model");
    ck_assert_str_eq(pl_config_plugin_path(c, "model"), GOOD "/fx_model.so");

    const pl_config_section *t = pl_config_section_get(c, "trainer");
    ck_assert_int_eq(pl_cfg_int(t, "max_epochs", 0), 3);
    ck_assert_int_eq(pl_cfg_int(t, "max_steps", 0), -1);
    ck_assert(pl_cfg_float(t, "limit_train_batches", 0) == 1.0);
    ck_assert(pl_cfg_bool(t, "save_last", false));
    ck_assert_str_eq(pl_cfg_str(t, "monitor", NULL), "val_loss");
    /* absent optional stage sections are absent */
    ck_assert_ptr_null(pl_config_section_get(c, "averager"));
    /* canonical section order */
    const char *order[] = {"pipeline", "data", "model", "optimizer", "trainer"};
    ck_assert_int_eq(pl_config_section_count(c), 5);
    for (int i = 0; i < 5; i++)
        ck_assert_str_eq(pl_cfg_section_name(pl_config_section_at(c, i)), order[i]);
    pl_config_free(c);
}
END_TEST

START_TEST(unknown_key_suggests_nearest_with_file_line) {
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nweight_decy = 0.1\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "unknown key 'weight_decy' in [optimizer]");
    CK_HAS(m, "did you mean 'weight_decay'");
    CK_HAS(pl_hint_get(), "weight_decay");
    /* nothing near: no suggestion */
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nzzzzzzzzz = 1\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "unknown key 'zzzzzzzzz'");
    CK_HASNT(m, "did you mean");
    /* core section key */
    m = load_fails(BASE "[trainer]\nmax_epoch = 3\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(6));
    CK_HAS(m, "did you mean 'max_epochs'");
}
END_TEST

START_TEST(bad_types_are_refused) {
    const char *m = load_fails("[data]\nplugin = fx_loader\nbatch_size = 1.5\n[model]\nplugin = "
                               "fx_model\n",
                               NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(3));
    CK_HAS(m, "expected an integer, found '1.5'");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = fast\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "expected a number, found 'fast'");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = nan\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "expected a number");
    /* numbers strtod cannot hold: 1e-400 used to be accepted as lr = 0 */
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = 1e-400\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "lr = 1e-400: the number underflows the range of a double");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = 1e-310\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "lr = 1e-310: the number underflows"); /* a denormal */
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = 1e999\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "lr = 1e999: the number overflows");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\n", "optimizer.lr=-1e-400", PL_ERR_CONFIG);
    CK_HAS(m, "lr = -1e-400: the number underflows");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\namsgrad = maybe\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "expected true or false, found 'maybe'");
    /* bool spellings accepted */
    pl_config *c = PL_CK_NOTNULL(load(BASE "[optimizer]\nplugin = fx_optim\namsgrad = Yes\n",
                                      NULL, NULL));
    ck_assert(pl_cfg_bool(pl_config_section_get(c, "optimizer"), "amsgrad", false));
    pl_config_free(c);
}
END_TEST

START_TEST(out_of_range_is_refused_with_bounds) {
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = 11\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "out of range, expected 0 <= lr <= 10");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nweight_decay = -0.1\n", NULL,
                   PL_ERR_CONFIG);
    CK_HAS(m, "out of range");
    m = load_fails(BASE "[trainer]\naccumulate_grad_batches = 0\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "1 <= accumulate_grad_batches");
    /* bounds are inclusive */
    pl_config *c = PL_CK_NOTNULL(load(BASE "[optimizer]\nplugin = fx_optim\nlr = 10\n", NULL, NULL));
    pl_config_free(c);
}
END_TEST

START_TEST(bad_choice_lists_choices_and_suggests) {
    const char *m = load_fails("[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                               "activation = gelo\n",
                               NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(5));
    CK_HAS(m, "expected one of relu|gelu|silu, found 'gelo'");
    CK_HAS(m, "did you mean 'gelu'");
    m = load_fails(BASE "[pipeline]\ndevice = tpu\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "cpu|cuda|strict|auto");
}
END_TEST

/* A choice "x:N" admits an index: device = cuda:3 (the README's `cuda:N`), not
 * cuda: or cuda:1x or cpu:1. */
START_TEST(choice_with_index_admits_digits_only) {
    pl_config *c = load(BASE "[pipeline]\ndevice = cuda:3\n", NULL, NULL);
    ck_assert_msg(c != NULL, "%s", pl_error_message());
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "pipeline"), "device", ""), "cuda:3");
    pl_config_free(c);
    const char *bad[] = {"cuda:", "cuda:1x", "cpu:1", "cuda:-1", "cuda:1234567890"};
    for (int i = 0; i < 5; i++) {
        char t[256];
        snprintf(t, sizeof t, BASE "[pipeline]\ndevice = %s\n", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "found '%s'", bad[i]);
        CK_HAS(load_fails(t, NULL, PL_ERR_CONFIG), want);
    }
}
END_TEST

START_TEST(number_or_fraction_accepts_counts_and_fractions) {
    const char *sched = BASE "[scheduler]\nplugin = fx_sched\nwarmup_steps = 5\nval_check = ";
    char buf[512];
    const char *ok[] = {"100", "0", "0.25", "1.0", "1e-1"};
    for (int i = 0; i < 5; i++) {
        snprintf(buf, sizeof buf, "%s%s\n", sched, ok[i]);
        pl_config *c = load(buf, NULL, NULL);
        ck_assert_msg(c != NULL, "%s refused: %s", ok[i], pl_error_message());
        pl_config_free(c);
    }
    const char *bad[] = {"1.5", "-3", "abc", "0.0"};
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "%s%s\n", sched, bad[i]);
        const char *m = load_fails(buf, NULL, PL_ERR_CONFIG);
        CK_HAS(m, "val_check");
    }
}
END_TEST

START_TEST(duplicate_key_names_both_lines) {
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_optim\nlr = 0.1\n\nlr = 0.2\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(9));
    char first[PATH_MAX + 64];
    snprintf(first, sizeof first, "first set at %s", at(7));
    CK_HAS(m, first);
    CK_HAS(m, "duplicate key 'lr' in [optimizer]");
}
END_TEST

START_TEST(duplicate_section_is_refused) {
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_optim\n[optimizer]\nlr = 0.2\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "section [optimizer] appears twice");
}
END_TEST

START_TEST(missing_required_key_names_section_and_key) {
    const char *m = load_fails(BASE "[scheduler]\nplugin = fx_sched\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "[scheduler] is missing the required key 'warmup_steps'");
    CK_HAS(m, at(5));
    m = load_fails(BASE "[optimizer]\nlr = 1\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "[optimizer] is missing the required key 'plugin'");
    m = load_fails("[data]\nplugin = fx_loader\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "missing section [model]");
}
END_TEST

START_TEST(unknown_section_suggests_nearest) {
    const char *m = load_fails(BASE "[optimiser]\nplugin = fx_optim\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(5));
    CK_HAS(m, "unknown section [optimiser]; did you mean [optimizer]?");
    m = load_fails(BASE "[wibble]\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "unknown section [wibble]");
    CK_HASNT(m, "did you mean");
}
END_TEST

/* Every [scheduler] / [scheduler<SUFFIX>] section is one scheduler of a list,
 * kept in file order at the place of [scheduler]; each is validated like any
 * stage section. */
START_TEST(schedulers_are_a_list_in_file_order) {
    pl_config *c = load(BASE "[scheduler_warm]\nplugin = fx_sched\nwarmup_steps = 1\n"
                             "[scheduler]\nplugin = fx_sched\nwarmup_steps = 2\n"
                             "[scheduler2]\nplugin = fx_sched\nwarmup_steps = 3\n",
                        "scheduler2.anneal=linear", NULL);
    ck_assert_msg(c != NULL, "%s", pl_error_message());
    const char *want[] = {"scheduler_warm", "scheduler", "scheduler2"};
    int k = 0;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const char *name = pl_cfg_section_name(pl_config_section_at(c, i));
        if (pl_stage_section_kind(name) != PL_KIND_SCHEDULER) continue;
        ck_assert_int_lt(k, 3);
        ck_assert_str_eq(name, want[k]);
        ck_assert_int_eq((int)pl_cfg_int(pl_config_section_at(c, i), "warmup_steps", -1), k + 1);
        k++;
    }
    ck_assert_int_eq(k, 3);
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "scheduler2"), "anneal", ""), "linear");
    pl_config_free(c);
    const char *m = load_fails(BASE "[scheduler2]\nplugin = fx_sched\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "[scheduler2] is missing the required key 'warmup_steps'");
    m = load_fails(BASE "[scheduler_x]\nplugin = fx_optim\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "expected a scheduler plugin");
    m = load_fails(BASE "[scheduler-x]\nplugin = fx_sched\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "unknown section [scheduler-x]");
}
END_TEST

/* Past the size where sections and keys are looked up through a hash index
 * (config.c's name_index, built at 32 names): 100 scheduler sections and 300
 * pattern keys resolve, in file order, with their values; a duplicate key
 * and a duplicate section deep in the file are still found; `~` removes a key
 * and a section (the index is rebuilt) and the rest stays reachable. The
 * time of a 100,000-section file is bench/config/ini_scale.sh's. */
START_TEST(many_sections_and_keys_resolve_through_the_index) {
    size_t cap = 64 * 1024, n = 0;
    char *t = malloc(cap);
    ck_assert_ptr_nonnull(t);
    n += (size_t)snprintf(t + n, cap - n, BASE "[optimizer]\nplugin = fx_optim\n");
    for (int k = 0; k < 300; k++)
        n += (size_t)snprintf(t + n, cap - n, "group.g%d.lr_scale = %g\n", k, (k + 1) / 8.0);
    for (int k = 0; k < 100; k++)
        n += (size_t)snprintf(t + n, cap - n, "[scheduler_s%d]\nplugin = fx_sched\nwarmup_steps = %d\n",
                              k, k);
    const char *none[] = {NULL};
    pl_config *c = loadv(t, none);
    ck_assert_msg(c != NULL, "%s", pl_error_message());
    const pl_config_section *o = pl_config_section_get(c, "optimizer");
    for (int k = 0; k < 300; k++) {
        char key[64];
        snprintf(key, sizeof key, "group.g%d.lr_scale", k);
        ck_assert_msg(pl_cfg_float(o, key, -1) == (k + 1) / 8.0, "%s", key);
    }
    int seen = 0;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const pl_config_section *s = pl_config_section_at(c, i);
        if (pl_stage_section_kind(pl_cfg_section_name(s)) != PL_KIND_SCHEDULER) continue;
        char want[32];
        snprintf(want, sizeof want, "scheduler_s%d", seen);
        ck_assert_str_eq(pl_cfg_section_name(s), want);
        ck_assert_ptr_eq(pl_config_section_get(c, want), s);
        ck_assert_int_eq((int)pl_cfg_int(s, "warmup_steps", -1), seen);
        seen++;
    }
    ck_assert_int_eq(seen, 100);
    pl_config_free(c);
    /* removals: positions move, lookups still find the rest */
    const char *rm[] = {"~optimizer.group.g7.lr_scale", "~scheduler_s3", NULL};
    c = loadv(t, rm);
    ck_assert_msg(c != NULL, "%s", pl_error_message());
    o = pl_config_section_get(c, "optimizer");
    ck_assert(pl_cfg_float(o, "group.g7.lr_scale", -1) == -1);
    ck_assert(pl_cfg_float(o, "group.g299.lr_scale", -1) == 300 / 8.0);
    ck_assert_ptr_null(pl_config_section_get(c, "scheduler_s3"));
    ck_assert_int_eq((int)pl_cfg_int(pl_config_section_get(c, "scheduler_s99"), "warmup_steps", -1), 99);
    pl_config_free(c);
    /* a duplicate key and a duplicate section among hundreds */
    size_t n0 = n;
    snprintf(t + n, cap - n, "[optimizer]\nlr = 1\n");
    CK_HAS(loadv_fails(t, none), "section [optimizer] appears twice");
    n = n0;
    snprintf(t + n, cap - n, "[scheduler_s50]\nplugin = fx_sched\nwarmup_steps = 1\n");
    CK_HAS(loadv_fails(t, none), "section [scheduler_s50] appears twice");
    char *dup = strstr(t, "group.g250.lr_scale");
    ck_assert_ptr_nonnull(dup);
    t[n0] = 0;
    char *t2 = malloc(cap);
    snprintf(t2, cap, "%.*sgroup.g10.lr_scale = 5\n%s", (int)(dup - t), t, dup);
    CK_HAS(loadv_fails(t2, none), "duplicate key 'group.g10.lr_scale' in [optimizer]");
    free(t2);
    free(t);
}
END_TEST

START_TEST(syntax_errors_have_line_numbers) {
    const char *m = load_fails(BASE "this is not ini\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(5));
    CK_HAS(m, "cannot parse 'this is not ini'");
    m = load_fails("lr = 1\n" BASE, NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(1));
    CK_HAS(m, "outside any section");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\n  lr = 0.1\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "multi-line values are not supported");
    /* a long line that is not INI is quoted cut short, not as "too long" */
    char longline[1200];
    snprintf(longline, sizeof longline, BASE "[pipeline]\nname %01000d\n", 1);
    m = load_fails(longline, NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(6));
    CK_HAS(m, "cannot parse 'name 0000");
    CK_HAS(m, "...'");
    m = load_fails(BASE "[pipeline]\nseed = 1\n  [data]\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "continues the value of 'seed' (line 6)");
    m = load_fails(BASE "[model\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(5));
    ck_assert_ptr_null(pl_config_load(PL_TEST_BINARY_DIR "/no/such.ini", 0, NULL, reg));
    ck_assert_int_eq(pl_error_status(), PL_ERR_IO);
    CK_HAS(pl_error_message(), "no/such.ini");
    /* a FIFO named as the config is refused by type, never opened for a read
     * that would wait for a writer (issue 34); alarm: a regression fails */
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s.fifo", ini_path);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    alarm(20);
    ck_assert_ptr_null(pl_config_load(fifo, 0, NULL, reg));
    alarm(0);
    ck_assert_int_eq(pl_error_status(), PL_ERR_IO);
    CK_HAS(pl_error_message(), fifo);
    CK_HAS(pl_error_message(), "is a FIFO, expected a regular file");
    unlink(fifo);
}
END_TEST

START_TEST(plugin_name_must_not_be_a_path) {
    const char *m = load_fails("[data]\nplugin = fx_loader\n[model]\nplugin = ../evil\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(4));
    CK_HAS(m, "invalid plugin name '../evil'");
    m = load_fails(BASE "[optimizer]\nplugin = /tmp/evil\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "invalid plugin name");
}
END_TEST

START_TEST(kind_mismatch_names_section_and_line) {
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_sched\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(6));
    CK_HAS(m, "[optimizer] plugin = fx_sched");
    CK_HAS(m, "scheduler plugin, expected an optimizer plugin");
}
END_TEST

START_TEST(override_syntax) {
    char s[64], k[64];
    const char *v = NULL;
    PL_CK_OK(pl_override_parse("optimizer.lr=5e-4", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(s, "optimizer");
    ck_assert_str_eq(k, "lr");
    ck_assert_str_eq(v, "5e-4");
    PL_CK_OK(pl_override_parse("optimizer.group.decay.lr_scale=2", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(k, "group.decay.lr_scale");
    PL_CK_OK(pl_override_parse("trainer.resume=", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(v, "");
    PL_CK_OK(pl_override_parse("data.path=a=b", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(v, "a=b");
    const char *bad[] = {"optimizer.lr", "lr=1", ".lr=1", "optimizer.=1", "opt imizer.lr=1",
                         "optimizer.l r=1", "optimizer.lr.=1", "=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(pl_override_parse(bad[i], s, sizeof s, k, sizeof k, &v) == PL_ERR_CONFIG,
                      "accepted '%s'", bad[i]);
        CK_HAS(pl_error_message(), bad[i]);
    }
    /* removals: value NULL, key "" for a whole section */
    v = "x";
    PL_CK_OK(pl_override_parse("~optimizer.group.decay.lr_scale", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(s, "optimizer");
    ck_assert_str_eq(k, "group.decay.lr_scale");
    ck_assert_ptr_null(v);
    v = "x";
    PL_CK_OK(pl_override_parse("~averager", s, sizeof s, k, sizeof k, &v));
    ck_assert_str_eq(s, "averager");
    ck_assert_str_eq(k, "");
    ck_assert_ptr_null(v);
    const char *bad_rm[] = {"~", "~.lr", "~optimizer.", "~optimizer.lr=1", "~opt imizer",
                            "~optimizer.l r", "~a/b"};
    for (size_t i = 0; i < sizeof bad_rm / sizeof bad_rm[0]; i++) {
        ck_assert_msg(pl_override_parse(bad_rm[i], s, sizeof s, k, sizeof k, &v) == PL_ERR_CONFIG,
                      "accepted '%s'", bad_rm[i]);
        CK_HAS(pl_error_message(), "bad removal");
    }
    ck_assert(pl_is_override("~optimizer.beta1"));
    ck_assert(pl_is_override("~averager"));
    ck_assert(!pl_is_override("~/configs/x.ini"));
    ck_assert(pl_is_override("a.b=c"));
    ck_assert(!pl_is_override("configs/x=1.ini"));
    ck_assert(!pl_is_override("teacher.ini"));
}
END_TEST

START_TEST(overrides_are_validated_like_file_keys) {
    const char *m = load_fails(good_ini, "optimizer.lr=100", PL_ERR_CONFIG);
    CK_HAS(m, "command line: [optimizer] lr = 100: out of range");
    m = load_fails(good_ini, "optimizer.lrr=1", PL_ERR_CONFIG);
    CK_HAS(m, "command line: unknown key 'lrr'");
    CK_HAS(m, "did you mean 'lr'");
    m = load_fails(good_ini, "optimzer.lr=1", PL_ERR_CONFIG);
    CK_HAS(m, "unknown section [optimzer]; did you mean [optimizer]?");
    m = load_fails(good_ini, "optimizer.lr", PL_ERR_CONFIG);
    CK_HAS(m, "missing '='");
    pl_config *c = load(good_ini, "optimizer.lr=1", "optimizer.lr=2");
    ck_assert_ptr_null(c);
    CK_HAS(pl_error_message(), "given twice");
    /* an override may add a whole section */
    c = PL_CK_NOTNULL(load(good_ini, "precision.plugin=fx_prec_b", "precision.block=128"));
    const pl_config_section *p = pl_config_section_get(c, "precision");
    ck_assert_int_eq(pl_cfg_int(p, "block", 0), 128);
    ck_assert_str_eq(pl_cfg_origin(p, "plugin"), "command line");
    pl_config_free(c);
}
END_TEST

START_TEST(plugin_override_validates_against_new_schema) {
    const char *ini = BASE "[precision]\nplugin = fx_prec_a\nloss_scale = 128\n";
    pl_config *c = PL_CK_NOTNULL(load(ini, NULL, NULL));
    ck_assert(pl_cfg_float(pl_config_section_get(c, "precision"), "loss_scale", 0) == 128);
    pl_config_free(c);
    /* loss_scale belongs to fx_prec_a, not fx_prec_b */
    const char *m = load_fails(ini, "precision.plugin=fx_prec_b", PL_ERR_CONFIG);
    CK_HAS(m, at(7));
    CK_HAS(m, "fx_prec_b does not know the key the file sets for fx_prec_a: 'loss_scale'");
    c = PL_CK_NOTNULL(
        load(BASE "[precision]\nplugin = fx_prec_a\n", "precision.plugin=fx_prec_b", NULL));
    const pl_config_section *p = pl_config_section_get(c, "precision");
    ck_assert_str_eq(pl_cfg_str(p, "plugin", NULL), "fx_prec_b");
    ck_assert_int_eq(pl_cfg_int(p, "block", 0), 64);
    ck_assert_ptr_null(pl_cfg_get(p, "loss_scale"));
    ck_assert_str_eq(pl_config_plugin(c, "precision")->name, "fx_prec_b");
    pl_config_free(c);
}
END_TEST

/* Swapping a stage's plugin on the command line: every key the file set for
 * the old plugin that the new one does not know is named in one error, with
 * its line, the old plugin and the ~ removals that fix it. */
#define PREC_A BASE "[precision]\nplugin = fx_prec_a\nloss_scale = 128\ngrowth_interval = 10\n"

START_TEST(plugin_swap_names_every_stray_key_and_how_to_drop_it) {
    const char *swap[] = {"precision.plugin=fx_prec_b", NULL};
    const char *m = loadv_fails(PREC_A, swap);
    CK_HAS(m, at(7)); /* the first stray key */
    CK_HAS(m, "[precision] plugin = fx_prec_b (command line) replaces fx_prec_a");
    CK_HAS(m, at(6)); /* where the file named the old plugin */
    CK_HAS(m, "fx_prec_b does not know 2 keys the file sets for fx_prec_a");
    CK_HAS(m, "'loss_scale' (line 7)");
    CK_HAS(m, "'growth_interval' (line 8)");
    const char *h = pl_hint_get();
    CK_HAS(h, "~precision.loss_scale ~precision.growth_interval");
    CK_HAS(h, "~precision to drop");
    CK_HAS(h, "pipeline plugins fx_prec_b");
    /* a stray key from the command line is an ordinary unknown key */
    const char *cli[] = {"precision.plugin=fx_prec_b", "precision.loss_scale=2", NULL};
    m = loadv_fails(BASE "[precision]\nplugin = fx_prec_a\n", cli);
    CK_HAS(m, "command line: unknown key 'loss_scale' in [precision] (plugin fx_prec_b)");
    /* without a swap, an unknown key keeps the ordinary message */
    m = load_fails(BASE "[precision]\nplugin = fx_prec_b\nloss_scale = 1\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "unknown key 'loss_scale' in [precision] (plugin fx_prec_b)");
}
END_TEST

START_TEST(tilde_drops_a_key_the_file_sets) {
    const char *ov[] = {"~optimizer.lr", NULL};
    pl_config *c = PL_CK_NOTNULL(loadv(good_ini, ov));
    const pl_config_section *o = pl_config_section_get(c, "optimizer");
    ck_assert(pl_cfg_float(o, "lr", 0) == 1e-3); /* fx_optim's default */
    ck_assert_str_eq(pl_cfg_origin(o, "lr"), "default");
    ck_assert(pl_cfg_float(o, "group.decay.lr_scale", 0) == 2.0); /* the rest stays */
    pl_config_free(c);
    /* a pattern key */
    const char *pat[] = {"~optimizer.group.decay.lr_scale", NULL};
    c = PL_CK_NOTNULL(loadv(good_ini, pat));
    ck_assert_ptr_null(pl_cfg_get(pl_config_section_get(c, "optimizer"), "group.decay.lr_scale"));
    pl_config_free(c);
    /* a removal acts on the file wherever it stands on the command line */
    const char *swap[] = {"precision.plugin=fx_prec_b", "~precision.loss_scale",
                          "~precision.growth_interval", "precision.block=128", NULL};
    c = PL_CK_NOTNULL(loadv(PREC_A, swap));
    const pl_config_section *p = pl_config_section_get(c, "precision");
    ck_assert_str_eq(pl_config_plugin(c, "precision")->name, "fx_prec_b");
    ck_assert_int_eq(pl_cfg_int(p, "block", 0), 128);
    ck_assert_ptr_null(pl_cfg_get(p, "loss_scale"));
    ck_assert_ptr_null(pl_cfg_get(p, "growth_interval"));
    pl_config_free(c);
}
END_TEST

START_TEST(tilde_section_drops_or_restarts_a_section) {
    const char *drop[] = {"~optimizer", NULL};
    pl_config *c = PL_CK_NOTNULL(loadv(good_ini, drop));
    ck_assert_ptr_null(pl_config_section_get(c, "optimizer"));
    ck_assert_ptr_null(pl_config_plugin(c, "optimizer"));
    pl_config_free(c);
    /* dropped, then rebuilt from the command line: none of the file's keys */
    const char *again[] = {"optimizer.plugin=fx_optim", "~optimizer", "optimizer.amsgrad=true",
                           NULL};
    c = PL_CK_NOTNULL(loadv(good_ini, again));
    const pl_config_section *o = pl_config_section_get(c, "optimizer");
    ck_assert_str_eq(pl_cfg_origin(o, "plugin"), "command line");
    ck_assert_str_eq(pl_cfg_origin(o, "lr"), "default");
    ck_assert(pl_cfg_bool(o, "amsgrad", false));
    ck_assert_ptr_null(pl_cfg_get(o, "group.decay.lr_scale"));
    pl_config_free(c);
    /* a required section stays required */
    const char *data[] = {"~data", NULL};
    CK_HAS(loadv_fails(good_ini, data), "missing section [data]");
}
END_TEST

/* Dropping what the file does not set is an error naming it (a typo would
 * otherwise pass silently), as are contradictory or repeated removals. */
START_TEST(tilde_refuses_what_the_file_does_not_set) {
    const char *typo[] = {"~optimizer.weight_decy", NULL};
    const char *m = loadv_fails(good_ini, typo);
    CK_HAS(m, "command line: ~optimizer.weight_decy: [optimizer] in ");
    CK_HAS(m, "has no key 'weight_decy'");
    CK_HAS(pl_hint_get(), "plugin, lr, group.decay.lr_scale");
    /* a key the plugin knows but the file does not set */
    const char *unset[] = {"~optimizer.amsgrad", NULL};
    CK_HAS(loadv_fails(good_ini, unset), "has no key 'amsgrad'");
    const char *sec[] = {"~optimiser", NULL};
    m = loadv_fails(good_ini, sec);
    CK_HAS(m, "has no section [optimiser]; did you mean [optimizer]?");
    const char *nosec[] = {"~averager", NULL};
    CK_HAS(loadv_fails(good_ini, nosec), "has no section [averager]");
    const char *both[] = {"optimizer.lr=0.1", "~optimizer.lr", NULL};
    CK_HAS(loadv_fails(good_ini, both),
           "optimizer.lr is both dropped (~optimizer.lr) and set (optimizer.lr=0.1)");
    const char *twice[] = {"~optimizer.lr", "~optimizer.lr", NULL};
    CK_HAS(loadv_fails(good_ini, twice), "'~optimizer.lr' given twice");
    const char *inner[] = {"~optimizer.lr", "~optimizer", NULL};
    CK_HAS(loadv_fails(good_ini, inner), "[optimizer] is already dropped by ~optimizer");
}
END_TEST

/* An empty value stays the empty string (`pipeline.requires=` clears the
 * list); for a key that cannot be empty the error points at `~`. */
START_TEST(empty_value_is_the_empty_string) {
    pl_config *c = PL_CK_NOTNULL(load(BASE "[pipeline]\nrequires = nope.ini\n",
                                      "pipeline.requires=", NULL));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "pipeline"), "requires", "x"), "");
    ck_assert_int_eq(pl_config_requires_count(c), 0);
    pl_config_free(c);
    const char *m = load_fails(good_ini, "trainer.max_epochs=", PL_ERR_CONFIG);
    CK_HAS(m, "command line: [trainer] max_epochs is empty: expected an integer");
    CK_HAS(pl_hint_get(), "~trainer.max_epochs");
}
END_TEST

/* Issue 34: `pipeline.run_dir=` wrote the run to /NAME/TIMESTAMP at the
 * filesystem root (RUN_DIR/NAME with RUN_DIR empty); refused, in the file
 * and on the command line, naming where it was set. */
START_TEST(empty_run_dir_is_refused) {
    const char *m = load_fails(good_ini, "pipeline.run_dir=", PL_ERR_CONFIG);
    CK_HAS(m, "command line: [pipeline] run_dir is empty");
    CK_HAS(m, "filesystem root");
    m = load_fails(BASE "[pipeline]\nrun_dir =\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, at(6));
    CK_HAS(m, "run_dir is empty");
    /* a directory, or "/" itself when asked for, stays accepted */
    pl_config *c = PL_CK_NOTNULL(load(good_ini, "pipeline.run_dir=/", NULL));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "pipeline"), "run_dir", ""), "/");
    pl_config_free(c);
}
END_TEST

START_TEST(pattern_options_match_one_segment) {
    pl_config *c = PL_CK_NOTNULL(load(BASE "[optimizer]\nplugin = fx_optim\ngroup.a.lr_scale = "
                                           "0.5\ngroup.b.lr_scale = 3\n",
                                      NULL, NULL));
    const pl_config_section *o = pl_config_section_get(c, "optimizer");
    int n = 0;
    for (int i = 0; i < pl_cfg_count(o); i++)
        n += strncmp(pl_cfg_key_at(o, i), "group.", 6) == 0;
    ck_assert_int_eq(n, 2);
    ck_assert(pl_cfg_float(o, "group.b.lr_scale", 0) == 3);
    pl_config_free(c);
    const char *m = load_fails(BASE "[optimizer]\nplugin = fx_optim\ngroup.a.b.lr_scale = 1\n",
                               NULL, PL_ERR_CONFIG);
    CK_HAS(m, "unknown key 'group.a.b.lr_scale'");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\ngroup..lr_scale = 1\n", NULL,
                   PL_ERR_CONFIG);
    CK_HAS(m, "unknown key");
    m = load_fails(BASE "[optimizer]\nplugin = fx_optim\ngroup.a.lr_scale = -1\n", NULL,
                   PL_ERR_CONFIG);
    CK_HAS(m, "out of range");
}
END_TEST

START_TEST(requires_resolve_relative_to_the_ini) {
    char sub[PATH_MAX + 32], pre[PATH_MAX + 48];
    snprintf(sub, sizeof sub, "%s/configs", tmpdir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    snprintf(pre, sizeof pre, "%s/pre.ini", sub);
    pl_test_write_file(pre, BASE);
    pl_config *c = PL_CK_NOTNULL(
        load(BASE "[pipeline]\nrequires = configs/pre.ini\n[trainer]\ninit_from = "
                  "@configs/pre.ini:best\n",
             NULL, NULL));
    ck_assert_int_eq(pl_config_requires_count(c), 1);
    ck_assert_str_eq(pl_config_requires_at(c, 0), pre);
    char path[PATH_MAX], which[16];
    ck_assert_int_eq(pl_config_parse_ref(c, "@configs/pre.ini:last", path, sizeof path, which,
                                         sizeof which),
                     1);
    ck_assert_str_eq(path, pre);
    ck_assert_str_eq(which, "last");
    ck_assert_int_eq(pl_config_parse_ref(c, "weights.safetensors", path, sizeof path, which,
                                         sizeof which),
                     0);
    ck_assert_int_eq(pl_config_parse_ref(c, "@configs/pre.ini:worst", path, sizeof path, which,
                                         sizeof which),
                     -1);
    pl_config_free(c);
    const char *m = load_fails(BASE "[pipeline]\nrequires = configs/nope.ini\n", NULL,
                               PL_ERR_CONFIG);
    CK_HAS(m, at(6));
    CK_HAS(m, "'configs/nope.ini' not found");
    m = load_fails(BASE "[trainer]\ninit_from = @configs/pre.ini:best\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "not listed in [pipeline] requires");
    m = load_fails(BASE "[pipeline]\nrequires = configs/pre.ini\n[trainer]\ninit_from = "
                        "@configs/pre.ini\n",
                   NULL, PL_ERR_CONFIG);
    CK_HAS(m, "init_from");
    /* a run's output file: @INI:outputs/FILE in any key, listed in requires */
    c = PL_CK_NOTNULL(load("[data]\nplugin = fx_loader\npath = @configs/pre.ini:outputs/t.h5\n"
                           "[model]\nplugin = fx_model\n[pipeline]\nrequires = configs/pre.ini\n",
                           NULL, NULL));
    char rel[PATH_MAX];
    ck_assert_int_eq(pl_config_parse_output_ref(c, "@configs/pre.ini:outputs/t.h5", path,
                                                sizeof path, rel, sizeof rel),
                     1);
    ck_assert_str_eq(path, pre);
    ck_assert_str_eq(rel, "outputs/t.h5");
    ck_assert_int_eq(pl_config_parse_output_ref(c, "@configs/pre.ini:best", path, sizeof path,
                                                rel, sizeof rel),
                     0);
    ck_assert_int_eq(pl_config_parse_output_ref(c, "@configs/pre.ini:outputs/../x", path,
                                                sizeof path, rel, sizeof rel),
                     -1);
    PL_CK_OK(pl_config_set_resolved(c, "data", "path", "/runs/pre/x/outputs/t.h5"));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "data"), "path", ""),
                     "/runs/pre/x/outputs/t.h5");
    pl_config_free(c);
    m = load_fails("[data]\nplugin = fx_loader\npath = @configs/pre.ini:outputs/t.h5\n"
                   "[model]\nplugin = fx_model\n", NULL, PL_ERR_CONFIG);
    CK_HAS(m, "[data] path = @configs/pre.ini:outputs/t.h5");
    CK_HAS(m, "not listed in [pipeline] requires");
    m = load_fails("[data]\nplugin = fx_loader\npath = @configs/pre.ini:outputs/\n"
                   "[model]\nplugin = fx_model\n[pipeline]\nrequires = configs/pre.ini\n",
                   NULL, PL_ERR_CONFIG);
    CK_HAS(m, "@PATH.ini:outputs/FILE");
}
END_TEST

/* Independent FNV-1a 64 over "section.key=value\n" of every resolved key. */
static uint64_t fnv_of(const pl_config *c) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const pl_config_section *s = pl_config_section_at(c, i);
        for (int j = 0; j < pl_cfg_count(s); j++) {
            char line[1024];
            snprintf(line, sizeof line, "%s.%s=%s\n", pl_cfg_section_name(s), pl_cfg_key_at(s, j),
                     pl_cfg_value_at(s, j));
            for (const char *p = line; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
        }
    }
    return h;
}

START_TEST(written_ini_reloads_to_same_values_and_hash) {
    pl_config *c = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.2", NULL));
    ck_assert_uint_eq(pl_config_hash(c), fnv_of(c));
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/resolved.ini", tmpdir);
    PL_CK_OK(pl_config_write_ini(c, out));
    pl_config *r = PL_CK_NOTNULL(pl_config_load(out, 0, NULL, reg));
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    /* every key now comes from the written file */
    const pl_config_section *o = pl_config_section_get(r, "optimizer");
    ck_assert(pl_cfg_float(o, "weight_decay", 0) == 0.2);
    CK_HAS(pl_cfg_origin(o, "weight_decay"), "resolved.ini:");
    pl_config_free(r);
    /* same values set another way: same hash; one value changed: different hash */
    pl_config *d = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.2", NULL));
    ck_assert_uint_eq(pl_config_hash(d), pl_config_hash(c));
    pl_config_free(d);
    d = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.3", NULL));
    ck_assert_uint_ne(pl_config_hash(d), pl_config_hash(c));
    pl_config_free(d);
    pl_config_free(c);
}
END_TEST

/* Issue 34: `pipeline predict RUN` and `pipeline run RUN/config.ini` refused
 * every run trained on a Hugging Face backbone: config.ini records every key,
 * the defaults too, and read back they counted as set by the user
 * (pl_cfg_is_set), so ilora compared the default dim = 64 with config.json's
 * hidden_size. A key marked `; default` (after the value, or alone on the
 * line above) loads with its value but as not set; the mark survives another
 * write, and an override makes the key set. */
START_TEST(written_defaults_read_back_as_defaults) {
    pl_config *c = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.2", NULL));
    char out[PATH_MAX + 32], out2[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/resolved.ini", tmpdir);
    snprintf(out2, sizeof out2, "%s/resolved2.ini", tmpdir);
    PL_CK_OK(pl_config_write_ini(c, out));
    pl_config *r = PL_CK_NOTNULL(pl_config_load(out, 0, NULL, reg));
    PL_CK_OK(pl_config_write_ini(r, out2));
    pl_config *r2 = PL_CK_NOTNULL(pl_config_load(out2, 0, NULL, reg));
    int n_default = 0, n_set = 0;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const pl_config_section *s = pl_config_section_at(c, i);
        const pl_config_section *rs = pl_config_section_get(r, pl_cfg_section_name(s));
        const pl_config_section *rs2 = pl_config_section_get(r2, pl_cfg_section_name(s));
        for (int j = 0; j < pl_cfg_count(s); j++) {
            const char *k = pl_cfg_key_at(s, j);
            bool set = pl_cfg_is_set(s, k);
            ck_assert_msg(pl_cfg_is_set(rs, k) == set && pl_cfg_is_set(rs2, k) == set,
                          "[%s] %s: set %d in the config, %d read back, %d read back twice",
                          pl_cfg_section_name(s), k, set, pl_cfg_is_set(rs, k),
                          pl_cfg_is_set(rs2, k));
            ck_assert_str_eq(pl_cfg_get(rs2, k), pl_cfg_get(s, k));
            n_default += !set;
            n_set += set;
        }
    }
    ck_assert_int_gt(n_default, 10);
    ck_assert_int_gt(n_set, 3);
    ck_assert_uint_eq(pl_config_hash(r2), pl_config_hash(c));
    const pl_config_section *t = pl_config_section_get(r, "trainer");
    ck_assert(!pl_cfg_is_set(t, "max_steps"));
    CK_HAS(pl_cfg_origin(t, "max_steps"), "resolved.ini:");
    CK_HAS(pl_cfg_origin(t, "max_steps"), "(default)");
    ck_assert(pl_cfg_is_set(t, "max_epochs"));
    ck_assert(pl_cfg_is_set(pl_config_section_get(r, "optimizer"), "weight_decay"));
    pl_config_free(r2);
    pl_config_free(r);
    pl_config_free(c);
    /* an override of a recorded default sets it */
    const char *ov[] = {"trainer.max_steps=3", NULL};
    r = PL_CK_NOTNULL(pl_config_load(out, 1, ov, reg));
    ck_assert(pl_cfg_is_set(pl_config_section_get(r, "trainer"), "max_steps"));
    pl_config_free(r);
    /* the mark on the line above; only right above, and only exactly */
    c = PL_CK_NOTNULL(load(BASE "[pipeline]\n; default\nseed = 5\nname = n  ; default\n; default\n\n"
                                "threads = 2\nverbose = true ; defaults\n",
                           NULL, NULL));
    const pl_config_section *p = pl_config_section_get(c, "pipeline");
    ck_assert(!pl_cfg_is_set(p, "seed"));
    ck_assert_int_eq(pl_cfg_int(p, "seed", 0), 5);
    ck_assert(!pl_cfg_is_set(p, "name"));
    ck_assert_str_eq(pl_cfg_str(p, "name", ""), "n");
    ck_assert(pl_cfg_is_set(p, "threads"));
    ck_assert(pl_cfg_is_set(p, "verbose"));
    pl_config_free(c);
}
END_TEST

/* Found by fuzz/fuzz_ini.c: a long key widened the alignment of every line
 * of config.ini and a long value left no room for the origin comment, so a
 * run's config.ini held lines longer than the INI parser then read (198
 * bytes) and could not be loaded again on resume. Lines have no limit now
 * (long_paths_in_file_and_on_command_line); the round trip stays checked. */
START_TEST(written_ini_with_long_keys_and_values_reloads) {
    char key[128], mid[81], tight[187], text[1024];
    memset(mid, 'v', sizeof mid - 1);
    mid[sizeof mid - 1] = '\0';
    memset(tight, 't', sizeof tight - 1);
    tight[sizeof tight - 1] = '\0';
    char name[101];
    memset(name, 'k', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(key, sizeof key, "layer.%s.width", name);
    /* input_field=<186 bytes> is a 198-byte line: the longest inih's buffer read */
    snprintf(text, sizeof text, BASE "%s = 32\ninput_field=%s\n[optimizer]\nplugin = fx_optim\n",
             key, tight);
    pl_config *c = PL_CK_NOTNULL(load(text, NULL, NULL));
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/resolved.ini", tmpdir);
    PL_CK_OK(pl_config_write_ini(c, out));
    pl_config *r = pl_config_load(out, 0, NULL, reg);
    ck_assert_msg(r != NULL, "config.ini does not load: %s", pl_error_message());
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    pl_config_free(r);
    pl_config_free(c);
    /* a middle-sized value set on the command line: its line gets no padding room */
    char over[128];
    snprintf(over, sizeof over, "data.path=%s", mid);
    snprintf(text, sizeof text, BASE "%s = 32\n", key);
    c = PL_CK_NOTNULL(load(text, over, NULL));
    PL_CK_OK(pl_config_write_ini(c, out));
    r = pl_config_load(out, 0, NULL, reg);
    ck_assert_msg(r != NULL, "config.ini does not load: %s", pl_error_message());
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    pl_config_free(r);
    pl_config_free(c);
}
END_TEST

/* Issue 34: a path longer than ~190 bytes could not be given, neither in the
 * INI (inih's 200-byte line buffer: "line too long ... (255 bytes)") nor on
 * the command line (refused so that config.ini would read back). Lines have
 * no length limit now: a 600-byte path in the file and on the command line
 * loads exactly, and the run's config.ini reads back to the same hash. */
START_TEST(long_paths_in_file_and_on_command_line) {
    char path[601], text[2048], over[700];
    memcpy(path, "/tmp/", 5);
    for (size_t i = 5; i < sizeof path - 1; i++) path[i] = i % 50 == 0 ? '/' : 'a' + (char)(i % 26);
    path[sizeof path - 1] = '\0';
    ck_assert_uint_eq(strlen(path), 600);
    /* in the file, with an inline comment and white space around the value */
    snprintf(text, sizeof text, BASE "[pipeline]\nrun_dir =   %s  ; where runs go\n", path);
    pl_config *c = PL_CK_NOTNULL(load(text, NULL, NULL));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "pipeline"), "run_dir", ""), path);
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/resolved.ini", tmpdir);
    PL_CK_OK(pl_config_write_ini(c, out));
    pl_config *r = pl_config_load(out, 0, NULL, reg);
    ck_assert_msg(r != NULL, "config.ini does not load: %s", pl_error_message());
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(r, "pipeline"), "run_dir", ""), path);
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    pl_config_free(r);
    pl_config_free(c);
    /* on the command line, and a value starting with ';' that long */
    snprintf(over, sizeof over, "pipeline.run_dir=%s", path);
    snprintf(text, sizeof text, "model.input_field=;%s", path);
    c = PL_CK_NOTNULL(load(BASE, over, text));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "pipeline"), "run_dir", ""), path);
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "model"), "input_field", ""), text + 18);
    PL_CK_OK(pl_config_write_ini(c, out));
    r = pl_config_load(out, 0, NULL, reg);
    ck_assert_msg(r != NULL, "config.ini does not load: %s", pl_error_message());
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(r, "pipeline"), "run_dir", ""), path);
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(r, "model"), "input_field", ""), text + 18);
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    pl_config_free(r);
    pl_config_free(c);
    /* a 100 kB line too */
    size_t big = 100000;
    char *t = malloc(big + 256);
    ck_assert_ptr_nonnull(t);
    int n = snprintf(t, big + 256, BASE "[pipeline]\nname = ");
    memset(t + n, 'n', big);
    snprintf(t + n + big, 256, "\nseed = 3\n");
    c = PL_CK_NOTNULL(load(t, NULL, NULL));
    ck_assert_uint_eq(strlen(pl_cfg_str(pl_config_section_get(c, "pipeline"), "name", "")), big);
    ck_assert_int_eq(pl_cfg_int(pl_config_section_get(c, "pipeline"), "seed", 0), 3);
    pl_config_free(c);
    free(t);
}
END_TEST

/* Found by fuzz/fuzz_ini.c: a value starting with ';' ("key =;x" in the
 * file) was written "key = ;x" to config.ini, which inih reads as an empty
 * value and a comment: the run's config.ini loaded to another config. */
START_TEST(written_ini_keeps_values_that_look_like_comments) {
    pl_config *c = PL_CK_NOTNULL(load(BASE "input_field =;x, y\n", NULL, NULL));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(c, "model"), "input_field", ""), ";x, y");
    char out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/resolved.ini", tmpdir);
    PL_CK_OK(pl_config_write_ini(c, out));
    pl_config *r = PL_CK_NOTNULL(pl_config_load(out, 0, NULL, reg));
    ck_assert_str_eq(pl_cfg_str(pl_config_section_get(r, "model"), "input_field", ""), ";x, y");
    ck_assert_uint_eq(pl_config_hash(r), pl_config_hash(c));
    pl_config_free(r);
    pl_config_free(c);
    /* overrides no INI line can hold are refused, naming the key */
    const char *m = load_fails(BASE, "model.input_field=a ;b", PL_ERR_CONFIG);
    CK_HAS(m, "model.input_field");
    CK_HAS(m, "';'");
    m = load_fails(BASE, "model.input_field= a", PL_ERR_CONFIG);
    CK_HAS(m, "starts with white space");
}
END_TEST

START_TEST(printed_table_shows_every_key_with_origin) {
    pl_config *c = PL_CK_NOTNULL(load(good_ini, "optimizer.weight_decay=0.2", NULL));
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    pl_config_print(c, f);
    fclose(f);
    CK_HAS(buf, "[optimizer]  optimizer fx_optim 0.0.1");
    /* find the weight_decay row and check value and origin */
    const char *row = strstr(buf, "  weight_decay ");
    ck_assert_ptr_nonnull(row);
    const char *eol = strchr(row, '\n');
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)(eol - row), row);
    CK_HAS(line, "= 0.2");
    CK_HAS(line, "command line");
    row = strstr(buf, "  lr ");
    ck_assert_ptr_nonnull(row);
    eol = strchr(row, '\n');
    snprintf(line, sizeof line, "%.*s", (int)(eol - row), row);
    CK_HAS(line, at(14));
    /* every row has '=' in the same column */
    int col = -1;
    for (char *p = buf; (p = strstr(p, "\n  ")); p++) {
        const char *eq = strstr(p, " = ");
        const char *e2 = strchr(p + 1, '\n');
        if (!eq || (e2 && eq > e2)) continue;
        int c2 = (int)(eq - p);
        if (col < 0) col = c2;
        ck_assert_int_eq(c2, col);
    }
    free(buf);
    pl_config_free(c);
}
END_TEST

START_TEST(edit_distance_reference_values) {
    ck_assert_int_eq(pl_edit_distance("kitten", "sitting"), 3);
    ck_assert_int_eq(pl_edit_distance("weight_decy", "weight_decay"), 1);
    ck_assert_int_eq(pl_edit_distance("", "abc"), 3);
    ck_assert_int_eq(pl_edit_distance("abc", "abc"), 0);
}
END_TEST

/* pl_cfg_list: items trimmed, empty ones skipped, in order; fn's error stops
 * the walk; an over-long item is refused naming the option, never cut. */
typedef struct list_seen {
    char items[8][32];
    int n;
} list_seen;

static pl_status collect(const char *item, int index, void *ud) {
    list_seen *s = ud;
    ck_assert_int_eq(index, s->n);
    if (!strcmp(item, "stop")) return pl_error_set(PL_ERR_CONFIG, "stop at %d", index);
    snprintf(s->items[s->n++], sizeof s->items[0], "%s", item);
    return PL_OK;
}

START_TEST(cfg_list_splits_trims_and_refuses_long_items) {
    list_seen s = {.n = 0};
    int n = -1;
    PL_CK_OK(pl_cfg_list(" a, b ,,\tc d ,", "[x] k", collect, &s, &n));
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(s.items[0], "a");
    ck_assert_str_eq(s.items[1], "b");
    ck_assert_str_eq(s.items[2], "c d");
    s.n = 0;
    PL_CK_OK(pl_cfg_list("", "[x] k", collect, &s, &n));
    ck_assert_int_eq(n, 0);
    PL_CK_OK(pl_cfg_list(NULL, "[x] k", collect, &s, &n));
    ck_assert_int_eq(n, 0);
    s.n = 0;
    ck_assert_int_eq(pl_cfg_list("a,stop,b", "[x] k", collect, &s, &n), PL_ERR_CONFIG);
    ck_assert_int_eq(s.n, 1);
    ck_assert_int_eq(n, 1);
    char longer[PL_CFG_LIST_ITEM_MAX + 8];
    memset(longer, 'z', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    s.n = 0;
    ck_assert_int_eq(pl_cfg_list(longer, "[data] datasets", collect, &s, NULL), PL_ERR_CONFIG);
    ck_assert_int_eq(s.n, 0);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "[data] datasets"));
    pl_error_clear();
}
END_TEST

int main(void) {
    Suite *s = suite_create("config");
    TCase *t = tcase_create("config");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, resolves_values_defaults_and_provenance);
    tcase_add_test(t, unknown_key_suggests_nearest_with_file_line);
    tcase_add_test(t, bad_types_are_refused);
    tcase_add_test(t, out_of_range_is_refused_with_bounds);
    tcase_add_test(t, bad_choice_lists_choices_and_suggests);
    tcase_add_test(t, number_or_fraction_accepts_counts_and_fractions);
    tcase_add_test(t, duplicate_key_names_both_lines);
    tcase_add_test(t, choice_with_index_admits_digits_only);
    tcase_add_test(t, many_sections_and_keys_resolve_through_the_index);
    tcase_add_test(t, duplicate_section_is_refused);
    tcase_add_test(t, missing_required_key_names_section_and_key);
    tcase_add_test(t, unknown_section_suggests_nearest);
    tcase_add_test(t, schedulers_are_a_list_in_file_order);
    tcase_add_test(t, syntax_errors_have_line_numbers);
    tcase_add_test(t, plugin_name_must_not_be_a_path);
    tcase_add_test(t, kind_mismatch_names_section_and_line);
    tcase_add_test(t, override_syntax);
    tcase_add_test(t, overrides_are_validated_like_file_keys);
    tcase_add_test(t, plugin_override_validates_against_new_schema);
    tcase_add_test(t, plugin_swap_names_every_stray_key_and_how_to_drop_it);
    tcase_add_test(t, tilde_drops_a_key_the_file_sets);
    tcase_add_test(t, tilde_section_drops_or_restarts_a_section);
    tcase_add_test(t, tilde_refuses_what_the_file_does_not_set);
    tcase_add_test(t, empty_value_is_the_empty_string);
    tcase_add_test(t, empty_run_dir_is_refused);
    tcase_add_test(t, pattern_options_match_one_segment);
    tcase_add_test(t, requires_resolve_relative_to_the_ini);
    tcase_add_test(t, written_ini_reloads_to_same_values_and_hash);
    tcase_add_test(t, written_defaults_read_back_as_defaults);
    tcase_add_test(t, written_ini_with_long_keys_and_values_reloads);
    tcase_add_test(t, long_paths_in_file_and_on_command_line);
    tcase_add_test(t, written_ini_keeps_values_that_look_like_comments);
    tcase_add_test(t, printed_table_shows_every_key_with_origin);
    tcase_add_test(t, edit_distance_reference_values);
    tcase_add_test(t, cfg_list_splits_trims_and_refuses_long_items);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
