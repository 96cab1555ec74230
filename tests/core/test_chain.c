/* test_chain.c - `pipeline run` of a `requires` chain with command-line
 * overrides (issue 32, item 3): the run-wide [pipeline] keys (device,
 * run_dir, ...) reach every run of the chain, and each run's config.ini says
 * where the value came from; the other overrides stay with the config named
 * on the command line, and the run says so. Runs the built binary on a tiny
 * mlp regression (three configs, two epochs of 8 batches each) on the strict
 * device, the GPU stand-in that refuses host access to device memory. */
#include <hdf5.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pl_test.h"

#define BIN PL_TEST_BINARY_DIR "/core/pipeline"
#define CK_HAS(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) != NULL, "expected '%s' in: %s", (needle), (msg))
#define CK_HASNT(msg, needle) \
    ck_assert_msg(strstr((msg), (needle)) == NULL, "did not expect '%s' in: %s", (needle), (msg))

static char tmpdir[PATH_MAX];
static char out_s[1 << 17], err_s[1 << 16];

static void write_split(hid_t f, const char *g, int n, uint32_t s) {
    hid_t grp = H5Gcreate2(f, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float x[64 * 3], y[64];
    for (int i = 0; i < n; i++) {
        float t = 0;
        for (int j = 0; j < 3; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * 3 + j] = (float)((s >> 8) / 16777216.0 * 2 - 1);
            t += (float)(j + 1) * x[i * 3 + j];
        }
        y[i] = t;
    }
    const char *names[2] = {"x", "y"};
    float *bufs[2] = {x, y};
    for (int k = 0; k < 2; k++) {
        hsize_t d[2] = {(hsize_t)n, k ? 1 : 3};
        hid_t sp = H5Screate_simple(2, d, NULL);
        hid_t ds = H5Dcreate2(grp, names[k], H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, bufs[k]);
        H5Dclose(ds);
        H5Sclose(sp);
    }
    H5Gclose(grp);
}

static void write_file(const char *name, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    size_t r = f ? fread(buf, 1, n - 1, f) : 0;
    buf[r] = '\0';
    if (f) fclose(f);
}

/* the contents of RUN_DIR/NAME/latest/FILE under tmpdir */
static void run_file(const char *run_dir, const char *name, const char *file, char *buf,
                     size_t n) {
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s/%s/latest/%s", tmpdir, run_dir, name, file);
    ck_assert_msg(access(p, R_OK) == 0, "%s missing; stdout: %s; stderr: %s", p, out_s, err_s);
    slurp(p, buf, n);
}

/* the line of `key = ` in an INI text (its first), or "" */
static const char *ini_line(const char *ini, const char *key, char *buf, size_t n) {
    char needle[128];
    snprintf(needle, sizeof needle, "\n%s ", key);
    const char *p = strstr(ini, needle);
    buf[0] = 0;
    if (!p) return buf;
    p++;
    const char *e = strchr(p, '\n');
    snprintf(buf, n, "%.*s", e ? (int)(e - p) : (int)strlen(p), p);
    return buf;
}

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

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pl_test_chain_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/data.h5", tmpdir);
    hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    write_split(f, "/train", 64, 1);
    write_split(f, "/val", 16, 2);
    write_split(f, "/test", 16, 3);
    H5Fclose(f);
    /* base <- mid <- top; each starts from the previous one's weights, so the
     * @INI:last references resolve under the overridden run_dir too */
    static const char *body =
        "[data]\nplugin = hdf5_rows\npath = data.h5\ndatasets = x,y\nbatch_size = 8\n"
        "shuffle = true\n"
        "[model]\nplugin = mlp\nin_features = 3\nout_features = 1\nhidden = 8\n"
        "[optimizer]\nplugin = adamw\nlr = 0.01\n";
    char t[2048];
    snprintf(t, sizeof t, "[pipeline]\ndevice = cpu\nseed = 3\n%s[trainer]\nmax_epochs = 2\n"
             "test = false\n", body);
    write_file("base.ini", t);
    snprintf(t, sizeof t, "[pipeline]\nrequires = base.ini\n%s[trainer]\nmax_epochs = 2\n"
             "test = false\ninit_from = @base.ini:last\n", body);
    write_file("mid.ini", t);
    snprintf(t, sizeof t, "[pipeline]\nrequires = mid.ini\n%s[trainer]\nmax_epochs = 2\n"
             "test = false\ninit_from = @mid.ini:last\n", body);
    write_file("top.ini", t);
}

static void teardown(void) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* `pipeline run top.ini pipeline.device=strict pipeline.run_dir=R`: the
 * required runs (base's file even says device = cpu) train on strict under R,
 * and their config.ini names the command line they inherited it from. */
START_TEST(runwide_overrides_reach_every_run_of_the_chain) {
    int rc = run("run top.ini pipeline.device=strict pipeline.run_dir=chain "
                 "trainer.max_epochs=1");
    ck_assert_msg(rc == 0, "exit %d; stdout: %s; stderr: %s", rc, out_s, err_s);
    CK_HAS(out_s, "top.ini: the runs it requires inherit pipeline.device=strict (command line "
                  "of top.ini)");
    CK_HAS(out_s, "top.ini: the runs it requires inherit pipeline.run_dir=chain");
    CK_HAS(out_s, "not to the runs it requires (only [pipeline] device, threads, run_dir, "
                  "allow_tf32, verbose are handed on): trainer.max_epochs=1");
    char ini[16384], log[65536], line[512];
    const char *names[3] = {"base", "mid", "top"};
    for (int i = 0; i < 3; i++) {
        run_file("chain", names[i], "log.txt", log, sizeof log);
        ck_assert_msg(strstr(log, ", device strict,") != NULL, "%s ran on: %s", names[i], log);
        run_file("chain", names[i], "config.ini", ini, sizeof ini);
        const char *want = i < 2 ? "; command line of top.ini" : "; command line";
        ini_line(ini, "device", line, sizeof line);
        CK_HAS(line, "= strict");
        CK_HAS(line, want);
        ini_line(ini, "run_dir", line, sizeof line);
        CK_HAS(line, "= chain");
        CK_HAS(line, want);
        /* what to train stays the file's: max_epochs (overridden for top only), the seed */
        char own[64];
        snprintf(own, sizeof own, "; %s.ini:", names[i]);
        ini_line(ini, "max_epochs", line, sizeof line);
        CK_HAS(line, i < 2 ? "= 2" : "= 1");
        CK_HAS(line, i < 2 ? own : "; command line");
        ini_line(ini, "seed", line, sizeof line);
        CK_HAS(line, i == 0 ? "= 3  ; base.ini:" : "= 42  ; default");
    }
    /* nothing went to the default run_dir */
    char p[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/runs", tmpdir);
    ck_assert_msg(access(p, F_OK) != 0, "%s exists: a run ignored pipeline.run_dir", p);
    /* the chain is finished under chain/: a second run reuses it, and a run
     * without the override (default run_dir) does not find it there */
    rc = run("run top.ini pipeline.device=strict pipeline.run_dir=chain");
    ck_assert_msg(rc == 0, "exit %d; stderr: %s", rc, err_s);
    CK_HAS(out_s, "top.ini: requirement mid.ini satisfied by chain/mid/latest");
    CK_HASNT(out_s, "apply to it alone");
    rc = run("run mid.ini");
    ck_assert_msg(rc == 0, "exit %d; stderr: %s", rc, err_s);
    CK_HAS(out_s, "needs base.ini, which has no finished run");
    CK_HASNT(out_s, "inherit");
    run_file("runs", "base", "config.ini", ini, sizeof ini);
    CK_HAS(ini_line(ini, "device", line, sizeof line), "= cpu");
    CK_HAS(line, "; base.ini:");
    /* `pipeline help run` says which overrides reach the required runs */
    ck_assert_int_eq(run("help run"), 0);
    CK_HAS(out_s, "overrides\nof pipeline.device, threads, run_dir, allow_tf32 and verbose apply to them");
}
END_TEST

int main(void) {
    Suite *s = suite_create("chain");
    TCase *t = tcase_create("chain");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 300);
    tcase_add_test(t, runwide_overrides_reach_every_run_of_the_chain);
    suite_add_tcase(s, t);
    return pl_test_run(s);
}
