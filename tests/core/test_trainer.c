/* The trainer end to end, with the mlp model, the hdf5_chunk loader and the
 * optimizer / scheduler plugins, on a small synthetic regression file:
 * exact resume, gradient accumulation, clipping, NaN handling, plugin swaps
 * from the INI or the command line, and corrupt-checkpoint refusal. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"
#include "pl_test.h"
#include "registry.h"
#include "trainer.h"

#define N_TRAIN 64
#define NF 5

static char g_dir[512], g_h5[600];

static void write_group(hid_t f, const char *g, int n, uint64_t seed) {
    hid_t grp = H5Gcreate2(f, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float *x = malloc(sizeof(float) * n * NF), *y = malloc(sizeof(float) * n);
    uint32_t s = (uint32_t)seed;
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int j = 0; j < NF; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * NF + j] = (float)((s >> 8) / 16777216.0 * 2 - 1);
            t += (j + 1) * x[i * NF + j];
        }
        y[i] = (float)(sin(t) + 0.5 * t);
    }
    hsize_t dx[2] = {(hsize_t)n, NF}, dy[2] = {(hsize_t)n, 1};
    hid_t sx = H5Screate_simple(2, dx, NULL), sy = H5Screate_simple(2, dy, NULL);
    hid_t ds = H5Dcreate2(grp, "x", H5T_IEEE_F32LE, sx, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    H5Dclose(ds);
    ds = H5Dcreate2(grp, "y", H5T_IEEE_F32LE, sy, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
    H5Dclose(ds);
    H5Sclose(sx);
    H5Sclose(sy);
    H5Gclose(grp);
    free(x);
    free(y);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/test_trainer_runs", PL_TEST_BINARY_DIR);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(g_h5, sizeof g_h5, "%s/data.h5", g_dir);
    hid_t f = H5Fcreate(g_h5, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    write_group(f, "/train", N_TRAIN, 1);
    write_group(f, "/val", 32, 2);
    write_group(f, "/test", 32, 3);
    H5Fclose(f);
}

static pl_registry *registry(void) {
    pl_registry *r = pl_registry_new();
    pl_registry_add_dir(r, PL_TEST_PLUGIN_DIR);
    return r;
}

/* Base config; `extra` lines are appended (sections may repeat keys via overrides). */
static const char *base_ini(char *buf, size_t n, const char *name) {
    snprintf(buf, n,
             "[pipeline]\nname = %s\nrun_dir = %s\nseed = 7\n"
             "[data]\nplugin = hdf5_chunk\npath = %s\ndatasets = x,y\nbatch_size = 8\n"
             "shuffle = true\nprefetch = false\n"
             "[model]\nplugin = mlp\nin_features = %d\nout_features = 1\nhidden = 16\n"
             "dropout = 0.1\n"
             "[optimizer]\nplugin = adamw\nlr = 0.01\n"
             "[scheduler]\nplugin = cosine\n"
             "[trainer]\nmax_epochs = 2\nlog_every_n_steps = 1\ntest = false\n",
             name, g_dir, g_h5, NF);
    return buf;
}

static int run(const char *name, int n_over, const char **over, const char *resume) {
    char ini[4096];
    base_ini(ini, sizeof ini, name);
    pl_registry *r = registry();
    pl_config *c = pl_config_load_string(ini, "test.ini", NULL, n_over, over, r);
    ck_assert_msg(c != NULL, "config: %s", pl_error_message());
    pl_run_options o = {.resume = resume, .config_path = "test.ini"};
    int code = pl_trainer_run(c, r, &o);
    pl_config_free(c);
    pl_registry_free(r);
    return code;
}

static pl_st_file *open_ckpt(const char *name, const char *which) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/latest/checkpoints/%s.safetensors", g_dir, name, which);
    pl_st_file *f = NULL;
    ck_assert_msg(pl_st_open(p, &f) == PL_OK, "%s", pl_error_message());
    return f;
}

/* max |a - b| over every tensor of two checkpoints (same names) */
static double ckpt_diff(const char *a, const char *b, int *n_compared) {
    pl_st_file *fa = open_ckpt(a, "last"), *fb = open_ckpt(b, "last");
    double m = 0;
    *n_compared = 0;
    for (int i = 0; i < pl_st_count(fa); i++) {
        const char *nm = pl_st_name_at(fa, i);
        pl_tensor *ta = pl_st_load(fa, nm), *tb = pl_st_load(fb, nm);
        ck_assert_msg(tb != NULL, "tensor %s missing in %s", nm, b);
        double d = pl_test_max_abs_diff(ta, tb);
        if (d > m) m = d;
        (*n_compared)++;
        pl_tensor_release(ta);
        pl_tensor_release(tb);
    }
    pl_st_close(fa);
    pl_st_close(fb);
    return m;
}

START_TEST(resume_is_bit_identical) {
    setup();
    /* the straight run keeps a checkpoint after every epoch; resuming the same
     * config from the epoch-1 checkpoint must reproduce epoch 2 bit for bit
     * (shuffling, dropout masks, AdamW moments, cosine schedule position) */
    const char *every[] = {"trainer.checkpoint_every_n_epochs=1"};
    ck_assert_int_eq(run("straight", 1, every, NULL), 0);
    char ep1[1024], resolved[1024];
    snprintf(ep1, sizeof ep1, "%s/straight/latest/checkpoints/epoch-0001.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(ep1, resolved));
    ck_assert_int_eq(run("split", 1, every, resolved), 0);
    int n;
    double d = ckpt_diff("straight", "split", &n);
    ck_assert_int_ge(n, 4 + 8); /* 4 weights + adamw moments */
    ck_assert_msg(d == 0.0, "resumed run differs from straight run by %g", d);
    /* the checkpoint records where it stopped */
    pl_st_file *f = open_ckpt("split", "last");
    ck_assert_str_eq(pl_st_meta(f, "epoch"), "2");
    ck_assert_str_eq(pl_st_meta(f, "step"), "16");
    pl_st_close(f);
}
END_TEST

START_TEST(resume_last_continues_the_newest_run) {
    setup();
    ck_assert_int_eq(run("again", 0, NULL, NULL), 0);
    const char *more[] = {"trainer.max_epochs=3"};
    ck_assert_int_eq(run("again", 1, more, "last"), 0);
    pl_st_file *f = open_ckpt("again", "last");
    ck_assert_str_eq(pl_st_meta(f, "epoch"), "3");
    ck_assert_str_eq(pl_st_meta(f, "step"), "24"); /* 2 epochs resumed + 1 trained, 8 steps each */
    pl_st_close(f);
    /* nothing to resume from is a clear error */
    ck_assert_int_eq(run("never_ran", 0, NULL, "last"), 1);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "no earlier run"));
}
END_TEST

START_TEST(gradient_accumulation_matches_larger_batch) {
    setup();
    /* same data order (no shuffle), no dropout, sgd: k=2 x batch 8 == 1 x batch 16 */
    const char *acc[] = {"data.shuffle=false", "model.dropout=0", "optimizer.plugin=sgd",
                         "optimizer.lr=0.05", "scheduler.plugin=constant",
                         "trainer.accumulate_grad_batches=2"};
    const char *big[] = {"data.shuffle=false", "model.dropout=0", "optimizer.plugin=sgd",
                         "optimizer.lr=0.05", "scheduler.plugin=constant", "data.batch_size=16"};
    ck_assert_int_eq(run("acc", 6, acc, NULL), 0);
    ck_assert_int_eq(run("big", 6, big, NULL), 0);
    int n;
    double d = ckpt_diff("acc", "big", &n);
    ck_assert_msg(d < 1e-6, "accumulated vs large batch differ by %g", d);
    /* and plain batch 8 without accumulation is really different */
    const char *small[] = {"data.shuffle=false", "model.dropout=0", "optimizer.plugin=sgd",
                           "optimizer.lr=0.05", "scheduler.plugin=constant"};
    ck_assert_int_eq(run("small", 5, small, NULL), 0);
    ck_assert(ckpt_diff("acc", "small", &n) > 1e-4);
}
END_TEST

START_TEST(clip_by_norm_bounds_the_update_like_clip_grad_norm) {
    setup();
    /* one sgd step with lr 1: the parameter change is the clipped gradient, whose
     * global L2 norm is max_norm * norm / (norm + 1e-6) (clip_grad_norm_) */
    const char *o[] = {"optimizer.plugin=sgd",      "optimizer.lr=1",
                       "scheduler.plugin=constant", "trainer.max_steps=1",
                       "trainer.max_epochs=1",      "trainer.gradient_clip_val=0.001",
                       "model.dropout=0",           "trainer.save_best=false"};
    const char *o0[] = {"optimizer.plugin=sgd", "optimizer.lr=0", "scheduler.plugin=constant",
                        "trainer.max_steps=1",  "trainer.max_epochs=1", "model.dropout=0",
                        "trainer.save_best=false"};
    ck_assert_int_eq(run("clip", 8, o, NULL), 0);
    ck_assert_int_eq(run("noclip", 7, o0, NULL), 0);
    pl_st_file *fa = open_ckpt("clip", "last"), *fb = open_ckpt("noclip", "last");
    double sq = 0;
    for (int i = 0; i < pl_st_count(fa); i++) {
        const char *nm = pl_st_name_at(fa, i);
        if (strncmp(nm, "mlp.", 4)) continue;
        pl_tensor *a = pl_st_load(fa, nm), *b = pl_st_load(fb, nm);
        for (int64_t j = 0; j < pl_tensor_numel(a); j++)
            sq += pow(pl_tensor_get(a, j) - pl_tensor_get(b, j), 2);
        pl_tensor_release(a);
        pl_tensor_release(b);
    }
    pl_st_close(fa);
    pl_st_close(fb);
    ck_assert_msg(fabs(sqrt(sq) - 0.001) < 2e-6, "update norm %.9f, expected 0.001", sqrt(sq));
}
END_TEST

START_TEST(nan_loss_stops_with_step_and_last_finite_loss) {
    setup();
    const char *o[] = {"optimizer.plugin=sgd", "optimizer.lr=1e8", "scheduler.plugin=constant"};
    ck_assert_int_eq(run("nan", 3, o, NULL), 1);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "non-finite training loss") && strstr(msg, "last finite loss"),
                  "message: %s", msg);
    const char *skip[] = {"optimizer.plugin=sgd", "optimizer.lr=1e8",
                          "scheduler.plugin=constant", "trainer.on_nan=skip"};
    ck_assert_int_eq(run("nan_skip", 4, skip, NULL), 0);
}
END_TEST

START_TEST(swapping_plugins_on_the_command_line_changes_the_run) {
    setup();
    const char *a[] = {"scheduler.plugin=constant", "model.dropout=0"};
    const char *b[] = {"scheduler.plugin=onecycle", "scheduler.max_lr=0.05", "model.dropout=0"};
    const char *c[] = {"optimizer.plugin=sgd", "optimizer.lr=0.01", "scheduler.plugin=constant",
                       "model.dropout=0"};
    ck_assert_int_eq(run("const", 2, a, NULL), 0);
    ck_assert_int_eq(run("one", 3, b, NULL), 0);
    ck_assert_int_eq(run("sgd", 4, c, NULL), 0);
    int n;
    ck_assert(ckpt_diff("const", "one", &n) > 1e-5);
    /* metrics.csv logged different learning rates */
    char p[1024], line[256];
    snprintf(p, sizeof p, "%s/one/latest/metrics.csv", g_dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    double lr_first = -1, lr_max = 0;
    while (fgets(line, sizeof line, f)) {
        char *k = strstr(line, ",lr,");
        if (!k) continue;
        double v = strtod(k + 4, NULL);
        if (lr_first < 0) lr_first = v;
        if (v > lr_max) lr_max = v;
    }
    fclose(f);
    /* OneCycleLR starts near max_lr / div_factor (25) and peaks at max_lr */
    ck_assert_msg(lr_first < 0.05 / 20 && fabs(lr_max - 0.05) < 0.05 * 0.2,
                  "onecycle lr first %g max %g", lr_first, lr_max);
}
END_TEST

START_TEST(corrupt_or_mismatched_checkpoint_is_refused) {
    setup();
    ck_assert_int_eq(run("good", 0, NULL, NULL), 0);
    char last[1024], bad[1100], rl[1024];
    snprintf(last, sizeof last, "%s/good/latest/checkpoints/last.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(last, rl));
    /* truncated copy */
    snprintf(bad, sizeof bad, "%s/truncated.safetensors", g_dir);
    FILE *in = fopen(rl, "rb"), *out = fopen(bad, "wb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, in);
    fwrite(buf, 1, n / 2, out);
    fclose(in);
    fclose(out);
    ck_assert_int_eq(run("good", 0, NULL, bad), 1);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "truncated.safetensors"));
    /* a checkpoint of another model shape: hidden 16 vs 32 names the tensor and shapes */
    const char *o[] = {"model.hidden=32"};
    ck_assert_int_eq(run("other", 1, o, rl), 1);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "mlp.0.weight") && strstr(msg, "32") && strstr(msg, "16"),
                  "message: %s", msg);
}
END_TEST

int main(void) {
    Suite *s = suite_create("trainer");
    TCase *tc = tcase_create("fit");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, resume_is_bit_identical);
    tcase_add_test(tc, resume_last_continues_the_newest_run);
    tcase_add_test(tc, gradient_accumulation_matches_larger_batch);
    tcase_add_test(tc, clip_by_norm_bounds_the_update_like_clip_grad_norm);
    tcase_add_test(tc, nan_loss_stops_with_step_and_last_finite_loss);
    tcase_add_test(tc, swapping_plugins_on_the_command_line_changes_the_run);
    tcase_add_test(tc, corrupt_or_mismatched_checkpoint_is_refused);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
