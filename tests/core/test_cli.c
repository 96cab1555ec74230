/* test_cli.c - runs the built `pipeline` binary: exit codes (0 ok, 2 usage /
 * config error) and the two-line "error: ... / hint: ..." messages. Uses the
 * fixture plugins (tests/fixtures), never runs training. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pl_test.h"

#ifndef PL_FIXTURE_DIR
#define PL_FIXTURE_DIR PL_TEST_BINARY_DIR "/tests/fixtures/plugins"
#endif
#define BIN PL_TEST_BINARY_DIR "/core/pipeline"
#define PP " --plugin-path " PL_FIXTURE_DIR "/good"

#define CK_HAS(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "expected '%s' in: %s", (needle), (msg))

static char tmpdir[PATH_MAX];
static char out_s[65536], err_s[65536];

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pl_test_cli_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

static void slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    size_t r = f ? fread(buf, 1, n - 1, f) : 0;
    buf[r] = '\0';
    if (f) fclose(f);
}

/* Run `pipeline ARGS`; stdout/stderr into out_s/err_s; returns the exit code. */
static int run(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >out.txt 2>err.txt", tmpdir, BIN, args);
    int st = system(cmd);
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/out.txt", tmpdir);
    slurp(p, out_s, sizeof out_s);
    snprintf(p, sizeof p, "%s/err.txt", tmpdir);
    slurp(p, err_s, sizeof err_s);
    ck_assert_msg(WIFEXITED(st), "pipeline %s did not exit normally", args);
    return WEXITSTATUS(st);
}

static void write_ini(const char *name, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* stderr is "error: ..." then a line starting with "hint:" */
static void ck_error_format(void) {
    ck_assert_msg(strncmp(err_s, "error: ", 7) == 0, "stderr: %s", err_s);
    const char *nl = strchr(err_s, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert_msg(strncmp(nl + 1, "hint: ", 6) == 0, "stderr: %s", err_s);
}

static const char *good = "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                          "[optimizer]\nplugin = fx_optim\nlr = 0.5\n";

START_TEST(version_and_help_exit_zero) {
    ck_assert_int_eq(run("--version"), 0);
    CK_HAS(out_s, "pipeline " PL_VERSION_STRING);
    ck_assert_int_eq(run("help"), 0);
    CK_HAS(out_s, "usage: pipeline COMMAND");
    ck_assert_int_eq(run("help run"), 0);
    CK_HAS(out_s, "--resume");
    ck_assert_int_eq(run("check --help"), 0);
    CK_HAS(out_s, "pipeline check");
}
END_TEST

/* every command the general help lists has its own `pipeline help CMD` */
START_TEST(help_covers_every_command) {
    ck_assert_int_eq(run("help"), 0);
    char general[sizeof out_s];
    memcpy(general, out_s, sizeof general);
    const char *p = strstr(general, "commands:\n");
    ck_assert_ptr_nonnull(p);
    int n = 0;
    for (p = strchr(p, '\n') + 1; p[0] == ' ' && p[1] == ' '; p = strchr(p, '\n') + 1) {
        char cmd[32] = "", args[64];
        if (sscanf(p, "%31s", cmd) == 1 && p[2] != ' ') {
            snprintf(args, sizeof args, "help %s", cmd);
            ck_assert_msg(run(args) == 0, "pipeline %s: %s", args, err_s);
            char want[64];
            snprintf(want, sizeof want, "usage: pipeline %s", cmd);
            CK_HAS(out_s, want);
            n++;
        }
    }
    ck_assert_int_ge(n, 6); /* run check plugins plot help --version */
    ck_assert_int_eq(run("plot --help"), 0);
    CK_HAS(out_s, "usage: pipeline plot RUN_DIR");
}
END_TEST

START_TEST(usage_errors_exit_two_with_hint) {
    ck_assert_int_eq(run(""), 2);
    CK_HAS(err_s, "no command");
    ck_assert_int_eq(run("frobnicate"), 2);
    ck_error_format();
    CK_HAS(err_s, "unknown command 'frobnicate'");
    ck_assert_int_eq(run("help frobnicate"), 2);
    ck_error_format();
    ck_assert_int_eq(run("check"), 2);
    ck_error_format();
    ck_assert_int_eq(run("check x.ini --bogus"), 2);
    CK_HAS(err_s, "unknown option '--bogus'");
    ck_assert_int_eq(run("run x.ini --resume"), 2);
    ck_error_format();
    ck_assert_int_eq(run("check x.ini --plugin-path"), 2);
    ck_error_format();
}
END_TEST

/* `pipeline export`: what it refuses before building anything, exit 2 with
 * the two-line message (the ilora export itself: plugins/models/ilora/
 * test_hf_export.sh) */
START_TEST(export_refuses_with_a_message) {
    ck_assert_int_eq(run("help export"), 0);
    CK_HAS(out_s, "usage: pipeline export RUN_DIR --format");
    ck_assert_int_eq(run("export"), 2);
    ck_error_format();
    CK_HAS(err_s, "needs RUN_DIR and OUT_DIR");
    ck_assert_int_eq(run("export r exported"), 2);
    CK_HAS(err_s, "--format is required");
    ck_assert_int_eq(run("export r --format hf exported --bogus"), 2);
    CK_HAS(err_s, "unknown option '--bogus'");
    ck_assert_int_eq(run("export r --format"), 2);
    CK_HAS(err_s, "--format needs a value");
    ck_assert_int_eq(run("export missing_run --format hf exported" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "run directory missing_run does not exist");
    /* a directory that is no run */
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/notarun' '%s/run/checkpoints' '%s/full'", tmpdir,
             tmpdir, tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(run("export notarun --format hf exported" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "not a run directory (no config.ini)");
    /* a run without checkpoints, then one whose model plugin has no export */
    write_ini("run/config.ini", good);
    ck_assert_int_eq(run("export run --format hf exported" PP), 2);
    CK_HAS(err_s, "has no best or last checkpoint");
    ck_assert_int_eq(run("export run --format hf exported --checkpoint last" PP), 2);
    CK_HAS(err_s, "has no last checkpoint");
    write_ini("run/checkpoints/last.safetensors", "");
    ck_assert_int_eq(run("export run --format hf exported" PP), 2);
    ck_error_format();
    CK_HAS(out_s, "using the last one");
    CK_HAS(err_s, "model plugin 'fx_model'");
    CK_HAS(err_s, "has no export (export_model)");
    /* OUT_DIR must be new or empty; nothing is created on a refusal */
    write_ini("full/x", "");
    ck_assert_int_eq(run("export run --format hf full" PP), 2);
    CK_HAS(err_s, "exists and is not empty");
    snprintf(cmd, sizeof cmd, "ls -d '%s'/exported* >/dev/null 2>&1", tmpdir);
    ck_assert_int_ne(system(cmd), 0);
}
END_TEST

START_TEST(check_valid_config_prints_resolved_table) {
    write_ini("good.ini", good);
    ck_assert_int_eq(run("check good.ini optimizer.weight_decay=0.2" PP), 0);
    CK_HAS(out_s, "config OK");
    CK_HAS(out_s, "good.ini:7");
    CK_HAS(out_s, "command line");
    CK_HAS(out_s, "default");
    CK_HAS(out_s, "[trainer]");
    CK_HAS(out_s, "batch fields OK");
    ck_assert_str_eq(err_s, "");
}
END_TEST

/* The typed data contract: a model reading a field the loader does not yield
 * is a config error before any run, naming the field and both plugins. */
START_TEST(check_refuses_a_model_reading_a_field_the_loader_lacks) {
    write_ini("fields.ini", "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                            "input_field = features\n");
    ck_assert_int_eq(run("check fields.ini" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "batch field 'features'");
    CK_HAS(err_s, "fx_model");
    CK_HAS(err_s, "fx_loader");
    CK_HAS(err_s, "it yields: x, y");
    /* a field of the wrong rank / dtype class */
    write_ini("fields2.ini", "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                             "input_field = y\n");
    ck_assert_int_eq(run("check fields2.ini" PP), 2);
    CK_HAS(err_s, "a float dtype");
    CK_HAS(err_s, "loader 'fx_loader' yields i64, rank 1");
}
END_TEST

START_TEST(check_config_errors_exit_two) {
    write_ini("typo.ini", "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                          "[optimizer]\nplugin = fx_optim\nweight_decy = 0.1\n");
    ck_assert_int_eq(run("check typo.ini" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "typo.ini:7");
    CK_HAS(err_s, "did you mean 'weight_decay'");
    ck_assert_int_eq(run("check missing.ini" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "missing.ini");
    write_ini("good.ini", good);
    ck_assert_int_eq(run("check good.ini optimizer.lr" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "optimizer.lr");
    ck_assert_int_eq(run("check good.ini notanoverride" PP), 2);
    ck_error_format();
    ck_assert_int_eq(run("check good.ini optimizer.plugin=fx_sched" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "scheduler plugin");
    ck_assert_int_eq(run("check good.ini model.plugin=../evil" PP), 2);
    CK_HAS(err_s, "invalid plugin name");
    /* run refuses the same way before training */
    ck_assert_int_eq(run("run typo.ini" PP), 2);
    ck_error_format();
    ck_assert_int_eq(run("run good.ini --resume last trainer.resume=x" PP), 2);
    ck_error_format();
}
END_TEST


/* A requires cycle (itself, or a -> b -> a) is refused by check and by run,
 * naming the cycle, instead of recursing until the stack overflows. */
START_TEST(requires_cycles_are_refused) {
    char t[1024];
    snprintf(t, sizeof t, "[pipeline]\nrequires = self.ini\n%s", good);
    write_ini("self.ini", t);
    snprintf(t, sizeof t, "[pipeline]\nrequires = cyc_b.ini\n%s", good);
    write_ini("cyc_a.ini", t);
    snprintf(t, sizeof t, "[pipeline]\nrequires = cyc_a.ini\n%s", good);
    write_ini("cyc_b.ini", t);
    snprintf(t, sizeof t, "[pipeline]\nrequires = cyc_a.ini\n%s", good);
    write_ini("into_cycle.ini", t);
    const char *cmds[] = {"check self.ini" PP, "run self.ini" PP, "check cyc_a.ini" PP,
                          "run cyc_a.ini" PP, "check into_cycle.ini" PP, "run into_cycle.ini" PP};
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(run(cmds[i]) == 2, "%s: exit code not 2; stderr %s", cmds[i], err_s);
        ck_error_format();
        CK_HAS(err_s, "requires forms a cycle");
    }
    CK_HAS(err_s, "cyc_a.ini -> ");
    CK_HAS(err_s, "cyc_b.ini -> ");
    /* a chain without a cycle passes */
    write_ini("base.ini", good);
    snprintf(t, sizeof t, "[pipeline]\nrequires = base.ini\n%s", good);
    write_ini("on_base.ini", t);
    ck_assert_int_eq(run("check on_base.ini" PP), 0);
}
END_TEST

/* Swapping a stage's plugin on the command line: the error names the file's
 * keys the new plugin does not know and the ~ removals; with them the same
 * command is clean. (~ is quoted: some shells expand ~word.) */
START_TEST(plugin_swap_with_removals_checks_clean) {
    write_ini("prec.ini", "[data]\nplugin = fx_loader\n[model]\nplugin = fx_model\n"
                          "[precision]\nplugin = fx_prec_a\nloss_scale = 128\n"
                          "growth_interval = 10\n");
    ck_assert_int_eq(run("check prec.ini precision.plugin=fx_prec_b" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "prec.ini:7: [precision] plugin = fx_prec_b (command line) replaces fx_prec_a");
    CK_HAS(err_s, "'loss_scale' (line 7), 'growth_interval' (line 8)");
    CK_HAS(err_s, "hint: add ~precision.loss_scale ~precision.growth_interval to the command line");
    ck_assert_int_eq(run("check prec.ini precision.plugin=fx_prec_b '~precision.loss_scale' "
                         "'~precision.growth_interval'" PP),
                     0);
    CK_HAS(out_s, "config OK");
    CK_HAS(out_s, "fx_prec_b");
    ck_assert_str_eq(err_s, "");
    /* the whole section, rebuilt from the command line */
    ck_assert_int_eq(run("check prec.ini '~precision' precision.plugin=fx_prec_b "
                         "precision.block=32" PP),
                     0);
    CK_HAS(out_s, "config OK");
    /* a removal of what the file does not set exits 2 naming it */
    ck_assert_int_eq(run("check prec.ini '~precision.loss_scal'" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "has no key 'loss_scal'; did you mean 'loss_scale'?");
    ck_assert_int_eq(run("check prec.ini '~precision.'" PP), 2);
    ck_error_format();
    CK_HAS(err_s, "bad removal");
    ck_assert_int_eq(run("help run"), 0);
    CK_HAS(out_s, "~section.key");
    /* a shipped config: gat_cora's [optimizer] sets adamw's l2, which sgd lacks */
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' check configs/gat_cora.ini optimizer.plugin=sgd '~optimizer.l2' "
             ">'%s/out.txt' 2>'%s/err.txt'",
             PL_TEST_SOURCE_DIR, BIN, tmpdir, tmpdir);
    int st = system(cmd);
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/err.txt", tmpdir);
    slurp(p, err_s, sizeof err_s);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gat_cora with sgd: %s", err_s);
}
END_TEST

/* Every config the project ships passes `pipeline check` against the real
 * plugins (keys, types, ranges, plugin names), so no config rots unnoticed. */
START_TEST(shipped_configs_pass_check) {
    DIR *d = opendir(PL_TEST_SOURCE_DIR "/configs");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".ini")) continue;
        char cmd[PATH_MAX * 2];
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' check 'configs/%s' >'%s/out.txt' 2>'%s/err.txt'",
                 PL_TEST_SOURCE_DIR, BIN, e->d_name, tmpdir, tmpdir);
        int st = system(cmd);
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/err.txt", tmpdir);
        slurp(p, err_s, sizeof err_s);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "pipeline check configs/%s: %s", e->d_name, err_s);
        n++;
    }
    closedir(d);
    ck_assert_int_ge(n, 5);
}
END_TEST

START_TEST(plugins_lists_and_describes) {
    ck_assert_int_eq(run("plugins" PP), 0);
    CK_HAS(out_s, "fx_optim");
    CK_HAS(out_s, "optimizer");
    CK_HAS(out_s, PL_FIXTURE_DIR "/good/fx_optim.so");
    ck_assert_int_eq(run("plugins fx_optim" PP), 0);
    CK_HAS(out_s, "weight_decay");
    CK_HAS(out_s, "decoupled weight decay");
    ck_assert_int_eq(run("plugins fx_sched" PP), 0);
    CK_HAS(out_s, "(required)");
    ck_assert_int_eq(run("plugins fx_nothere" PP), 2);
    ck_error_format();
    ck_assert_int_eq(run("plugins --plugin-path " PL_FIXTURE_DIR "/broken"), 0);
    CK_HAS(out_s, "REFUSED");
    CK_HAS(out_s, "fx_badmajor.so");
    ck_assert_int_eq(run("plugins fx_nosym --plugin-path " PL_FIXTURE_DIR "/broken"), 2);
    ck_error_format();
    CK_HAS(err_s, "pl_plugin_entry");
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *t = tcase_create("cli");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, version_and_help_exit_zero);
    tcase_add_test(t, help_covers_every_command);
    tcase_add_test(t, requires_cycles_are_refused);
    tcase_add_test(t, usage_errors_exit_two_with_hint);
    tcase_add_test(t, export_refuses_with_a_message);
    tcase_add_test(t, check_valid_config_prints_resolved_table);
    tcase_add_test(t, check_refuses_a_model_reading_a_field_the_loader_lacks);
    tcase_add_test(t, check_config_errors_exit_two);
    tcase_add_test(t, plugins_lists_and_describes);
    tcase_add_test(t, shipped_configs_pass_check);
    tcase_add_test(t, plugin_swap_with_removals_checks_clean);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
