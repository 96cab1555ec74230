#define _GNU_SOURCE /* memmem */
/* The trainer end to end, with the mlp model, the hdf5_rows loader and the
 * optimizer / scheduler plugins, on a small synthetic regression file:
 * exact resume (from epoch-end and mid-epoch checkpoints), gradient
 * accumulation, clipping, NaN handling, plugin swaps from the INI or the
 * command line, and corrupt-checkpoint refusal. */
#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config_internal.h"
#include "pl_test.h"
#include "regression_h5.h"
#include "registry.h"
#include "trainer.h"
#include "trainer_internal.h"

#define N_TRAIN 64
#define NF 5

static char g_dir[512], g_h5[600];

static void write_group(hid_t f, const char *g, int n, uint64_t seed) {
    pl_test_write_regression_group(f, g, n, NF, seed);
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
             "[data]\nplugin = hdf5_rows\npath = %s\ndatasets = x,y\nbatch_size = 8\n"
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

/* max |a - b| over every tensor of two checkpoint files */
static double file_diff(const char *pa, const char *pb, int *n_compared);

/* Run with a config given whole (other loaders); `resume` may be NULL. */
static int run_ini(const char *ini, int n_over, const char **over, const char *resume) {
    pl_registry *r = registry();
    char tp[700];
    snprintf(tp, sizeof tp, "%s/test_plugins", PL_TEST_BINARY_DIR);
    pl_registry_add_dir(r, tp);
    pl_config *c = pl_config_load_string(ini, "test.ini", NULL, n_over, over, r);
    ck_assert_msg(c != NULL, "config: %s", pl_error_message());
    pl_run_options o = {.resume = resume, .config_path = "test.ini"};
    int code = pl_trainer_run(c, r, &o);
    pl_config_free(c);
    pl_registry_free(r);
    return code;
}

static void ckpt_path(char *buf, size_t n, const char *name, const char *which) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/latest/checkpoints/%s.safetensors", g_dir, name, which);
    ck_assert_msg(realpath(p, buf) != NULL, "%s missing", p);
    (void)n;
}

/* checkpoint `which` of the newest run of `name` that ended ok (latest) or,
 * with open_attempt_ckpt, of the newest run started (last_attempt) */
static pl_st_file *open_link_ckpt(const char *name, const char *link, const char *which) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s/checkpoints/%s.safetensors", g_dir, name, link, which);
    pl_st_file *f = NULL;
    ck_assert_msg(pl_st_open(p, &f) == PL_OK, "%s", pl_error_message());
    return f;
}

static pl_st_file *open_ckpt(const char *name, const char *which) {
    return open_link_ckpt(name, "latest", which);
}

static pl_st_file *open_attempt_ckpt(const char *name, const char *which) {
    return open_link_ckpt(name, "last_attempt", which);
}

/* max |a - b| over every tensor of two checkpoints (same names) */
static double ckpt_diff(const char *a, const char *b, int *n_compared) {
    char pa[1024], pb[1024];
    ckpt_path(pa, sizeof pa, a, "last");
    ckpt_path(pb, sizeof pb, b, "last");
    return file_diff(pa, pb, n_compared);
}

static double file_diff(const char *pa, const char *pb, int *n_compared) {
    pl_st_file *fa = NULL, *fb = NULL;
    ck_assert_msg(pl_st_open(pa, &fa) == PL_OK, "%s", pl_error_message());
    ck_assert_msg(pl_st_open(pb, &fb) == PL_OK, "%s", pl_error_message());
    double m = 0;
    *n_compared = 0;
    for (int i = 0; i < pl_st_count(fa); i++) {
        const char *nm = pl_st_name_at(fa, i);
        pl_tensor *ta = pl_st_load(fa, nm), *tb = pl_st_load(fb, nm);
        ck_assert_msg(tb != NULL, "tensor %s missing in %s", nm, pb);
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

/* ---- pretrained weights owned by their source (PL_TAG_PRETRAINED) ---------- */

/* The pretrained source: backbone.weight bf16 [16, 5] (deterministic). */
static void write_source(char *path, size_t n) {
    snprintf(path, n, "%s/source.safetensors", g_dir);
    uint16_t w[16 * NF];
    for (int i = 0; i < 16 * NF; i++) w[i] = pl_f32_to_bf16((float)sin(0.7 * i + 0.3) * 0.8f);
    pl_tensor *t = PL_CK_NOTNULL(pl_tensor_from_data(PL_BF16, PL_SHAPE(16, NF), w, PL_CPU));
    pl_st_writer *wr = PL_CK_NOTNULL(pl_st_writer_new(path));
    PL_CK_OK(pl_st_writer_add(wr, "backbone.weight", t));
    PL_CK_OK(pl_st_writer_commit(wr));
    pl_st_writer_free(wr);
    pl_tensor_release(t);
}

static void pretrained_ini(char *ini, size_t n, const char *name, const char *model_extra,
                           const char *trainer_extra) {
    char src[700];
    write_source(src, sizeof src);
    snprintf(ini, n,
             "[pipeline]\nname = %s\nrun_dir = %s\nseed = 7\n"
             "[data]\nplugin = test_stateless_loader\nbatch_size = 8\n"
             "[model]\nplugin = test_pretrained_model\nsource = %s\n%s"
             "[optimizer]\nplugin = adamw\nlr = 0.01\n"
             "[trainer]\nmax_epochs = 2\ntest = false\nlog_every_n_steps = 1\n"
             "checkpoint_every_n_train_steps = 3\n%s",
             name, g_dir, src, model_extra, trainer_extra);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s missing", path);
    static char buf[1 << 16];
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    buf[r] = 0;
    fclose(f);
    return buf;
}

static char *run_file(const char *name, const char *file) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/latest/%s", g_dir, name, file);
    return slurp(p);
}

/* summary.json's load time and resident-memory keys exist and are > 0. */
static void expect_load_keys(const char *name) {
    const char *js = run_file(name, "summary.json");
    const char *keys[] = {"\"load_seconds\"", "\"load_peak_rss_bytes\"", "\"peak_rss_bytes\""};
    for (int i = 0; i < 3; i++) {
        const char *k = strstr(js, keys[i]);
        ck_assert_msg(k != NULL, "%s: summary.json lacks %s:\n%s", name, keys[i], js);
        double v = strtod(strchr(k, ':') + 1, NULL);
        ck_assert_msg(v > 0, "%s: %s = %g, expected > 0", name, keys[i], v);
    }
    ck_assert_ptr_nonnull(strstr(run_file(name, "log.txt"), "loaded model in "));
    /* device peaks with torch.cuda's meaning: allocated <= reserved, both > 0
     * (the parameters alone are on the device), per epoch in metrics.csv too */
    double v[2];
    js = run_file(name, "summary.json"); /* one static buffer: log.txt replaced it */
    const char *pk[] = {"\"peak_memory_allocated_bytes\"", "\"peak_memory_reserved_bytes\""};
    for (int i = 0; i < 2; i++) {
        const char *k = strstr(js, pk[i]);
        ck_assert_msg(k != NULL, "%s: summary.json lacks %s:\n%s", name, pk[i], js);
        v[i] = strtod(strchr(k, ':') + 1, NULL);
        ck_assert_msg(v[i] > 0, "%s: %s = %g, expected > 0", name, pk[i], v[i]);
    }
    ck_assert_msg(v[0] <= v[1], "%s: peak allocated %g > peak reserved %g", name, v[0], v[1]);
    /* each phase's wall seconds on every device (the CPU here): the fit trained */
    const char *ps = strstr(js, "\"phase_seconds\"");
    const char *tr = ps ? strstr(ps, "\"train\"") : NULL;
    ck_assert_msg(tr != NULL, "%s: summary.json lacks phase_seconds.train:\n%s", name, js);
    ck_assert_msg(strtod(strchr(tr, ':') + 1, NULL) > 0, "%s: phase_seconds.train is not > 0",
                  name);
    const char *csv = run_file(name, "metrics.csv");
    ck_assert_msg(strstr(csv, ",peak_memory_allocated_bytes,") &&
                      strstr(csv, ",peak_memory_reserved_bytes,"),
                  "%s: metrics.csv has no per-epoch peak_memory_*_bytes rows", name);
    ck_assert_msg(strstr(run_file(name, "log.txt"), "device peak ") != NULL,
                  "%s: the run report has no 'device peak' line", name);
}

START_TEST(frozen_pretrained_weight_stays_out_of_checkpoints_and_resume_is_bit_identical) {
    setup();
    char so[700];
    snprintf(so, sizeof so, "%s/test_plugins/test_pretrained_model.so", PL_TEST_BINARY_DIR);
    ck_assert_msg(access(so, R_OK) == 0, "%s not built (build the whole tree)", so);
    char ini[4096];
    pretrained_ini(ini, sizeof ini, "pre", "", "");
    ck_assert_int_eq(run_ini(ini, 0, NULL, NULL), 0);
    expect_load_keys("pre");
    pl_st_file *f = open_ckpt("pre", "last");
    ck_assert_int_eq(pl_st_info(f, "backbone.weight", NULL, NULL, NULL), PL_ERR_INVALID);
    pl_error_clear();
    PL_CK_OK(pl_st_info(f, "head.weight", NULL, NULL, NULL));
    PL_CK_OK(pl_st_info(f, "head.bias", NULL, NULL, NULL));
    pl_st_close(f);
    /* resume from step 3: the backbone is re-read from the source */
    char straight[1024], p[1024], ck[1024];
    ckpt_path(straight, sizeof straight, "pre", "last");
    snprintf(p, sizeof p, "%s/pre/latest/checkpoints/step-000003.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(p, ck));
    ck_assert_int_eq(run_ini(ini, 0, NULL, ck), 0);
    ck_assert_ptr_nonnull(strstr(run_file("pre", "log.txt"),
                                 "1 pretrained weights kept from their source"));
    char resumed[1024];
    ckpt_path(resumed, sizeof resumed, "pre", "last");
    ck_assert_str_ne(resumed, straight);
    int n;
    double d = file_diff(straight, resumed, &n);
    ck_assert_int_ge(n, 2);
    ck_assert_msg(d == 0.0, "resumed from step 3 with a pretrained backbone: differs by %g", d);
    expect_load_keys("pre");
}
END_TEST

START_TEST(init_from_keeps_the_pretrained_weight_from_its_source) {
    setup();
    char ini[4096];
    pretrained_ini(ini, sizeof ini, "pre_a", "", "");
    ck_assert_int_eq(run_ini(ini, 0, NULL, NULL), 0);
    char last[1024], tr[1200];
    ckpt_path(last, sizeof last, "pre_a", "last");
    snprintf(tr, sizeof tr, "init_from = %s\n", last);
    pretrained_ini(ini, sizeof ini, "pre_b", "", tr);
    ck_assert_int_eq(run_ini(ini, 0, NULL, NULL), 0);
    const char *log = run_file("pre_b", "log.txt");
    ck_assert_msg(strstr(log, "1 pretrained weights kept from their source") != NULL, "%s", log);
    ck_assert_msg(strstr(log, "loaded 2 parameter tensors from") != NULL, "%s", log);
    expect_load_keys("pre_b");
}
END_TEST

START_TEST(trainable_pretrained_weight_is_saved_and_trained_in_f32) {
    setup();
    char ini[4096];
    pretrained_ini(ini, sizeof ini, "pre_t", "train_backbone = true\n", "");
    ck_assert_int_eq(run_ini(ini, 0, NULL, NULL), 0);
    pl_st_file *f = open_ckpt("pre_t", "last");
    pl_dtype dt;
    PL_CK_OK(pl_st_info(f, "backbone.weight", &dt, NULL, NULL));
    /* the bf16 view was converted to f32 (no [precision]: as fp32) and trained */
    ck_assert_int_eq(dt, PL_F32);
    pl_tensor *w = PL_CK_NOTNULL(pl_st_load(f, "backbone.weight"));
    double moved = 0;
    for (int i = 0; i < 16 * NF; i++)
        moved = fmax(moved, fabs(pl_tensor_get(w, i) -
                                 pl_bf16_to_f32(pl_f32_to_bf16((float)sin(0.7 * i + 0.3) * 0.8f))));
    ck_assert_msg(moved > 0, "the trainable backbone did not change");
    pl_tensor_release(w);
    pl_st_close(f);
    /* and a resume loads it back */
    char straight[1024], p[1024], ck[1024], resumed[1024];
    ckpt_path(straight, sizeof straight, "pre_t", "last");
    snprintf(p, sizeof p, "%s/pre_t/latest/checkpoints/step-000003.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(p, ck));
    ck_assert_int_eq(run_ini(ini, 0, NULL, ck), 0);
    ckpt_path(resumed, sizeof resumed, "pre_t", "last");
    int n;
    double d = file_diff(straight, resumed, &n);
    ck_assert_int_ge(n, 3);
    ck_assert_msg(d == 0.0, "resume with a trainable pretrained backbone differs by %g", d);
}
END_TEST

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

/* Every metrics.csv row of run `b` (timings aside) is a row of run `a`,
 * byte for byte; returns how many were compared. */
static int metrics_rows_in(const char *a, const char *b) {
    char pa[1024], pb[1024], line[256];
    snprintf(pa, sizeof pa, "%s/%s/latest/metrics.csv", g_dir, a);
    snprintf(pb, sizeof pb, "%s/%s/latest/metrics.csv", g_dir, b);
    static char all[1 << 16];
    snprintf(all, sizeof all, "%s", slurp(pa));
    FILE *f = fopen(pb, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, ",samples_per_s,") || strstr(line, ",data_wait_ms,") ||
            strstr(line, ",step_seconds,") || !strncmp(line, "step,", 5))
            continue;
        char want[260];
        snprintf(want, sizeof want, "\n%s", line);
        ck_assert_msg(strstr(all, want) != NULL, "%s logged %s%s has no such row", b, line, a);
        n++;
    }
    fclose(f);
    return n;
}

/* The text of summary.json's `"key": {...}` object or `"key": value`, up to
 * its end (compared as text between two runs). */
static void summary_part(const char *name, const char *key, char *out, size_t n) {
    const char *js = run_file(name, "summary.json");
    char k[128];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *at = strstr(js, k);
    ck_assert_msg(at != NULL, "%s: summary.json lacks %s", name, key);
    const char *v = at + strlen(k) + strspn(at + strlen(k), " \t");
    size_t len = *v == '{' ? (size_t)(strchr(v, '}') + 1 - at) : (size_t)(v - at) + strcspn(v, ",\n");
    snprintf(out, n, "%.*s", (int)len, at);
}

/* Issue 16: "1 epoch, then --resume last with max_epochs = 2" reported other
 * metrics than a straight 2-epoch run. The cause was no lost state: the
 * 1-epoch run's cosine schedule (total_steps from the fit) decayed to 0 over
 * its own 8 steps, so its epoch 0 already trained differently. With the
 * schedule pinned (total_steps) the extended run equals the straight one in
 * weights, every logged metric (validation, train loss, lr, test) and the
 * summary; unpinned, the resume says that the schedule changed. */
START_TEST(extended_run_equals_the_straight_run_in_metrics_and_summary) {
    setup();
    const char *straight[] = {"scheduler.total_steps=16", "trainer.test=true"};
    ck_assert_int_eq(run("straight", 2, straight, NULL), 0);
    const char *first[] = {"scheduler.total_steps=16", "trainer.test=true",
                           "trainer.max_epochs=1"};
    ck_assert_int_eq(run("ext", 3, first, NULL), 0);
    ck_assert_int_eq(run("ext", 2, straight, "last"), 0);
    int n;
    ck_assert_msg(ckpt_diff("straight", "ext", &n) == 0.0, "weights differ");
    /* 8 steps x (train_loss, lr, grad_norm) + epoch_train_loss + 2 x 5 val/test metrics */
    ck_assert_int_ge(metrics_rows_in("straight", "ext"), 8 * 3 + 1 + 2);
    const char *keys[] = {"val_metrics", "test_metrics", "best_monitor", "epochs",
                          "optimizer_steps", "status"};
    for (int i = 0; i < 6; i++) {
        char a[1024], b[1024];
        summary_part("straight", keys[i], a, sizeof a);
        summary_part("ext", keys[i], b, sizeof b);
        ck_assert_msg(!strcmp(a, b), "summary %s: straight %s, extended %s", keys[i], a, b);
    }
    const char *log = run_file("ext", "log.txt");
    ck_assert_msg(strstr(log, "1 changed configuration key: trainer.max_epochs 1 -> 2"), "%s", log);
    ck_assert_msg(!strstr(log, "learning-rate factor"), "%s", log);

    /* unpinned: the fit's length sets the cosine schedule; the resume says so */
    const char *one[] = {"trainer.max_epochs=1"};
    ck_assert_int_eq(run("unpinned", 1, one, NULL), 0);
    ck_assert_int_eq(run("unpinned", 0, NULL, "last"), 0);
    log = run_file("unpinned", "log.txt");
    ck_assert_msg(strstr(log, "warning: learning-rate factor of step 8 is 0.5 here, 0 in the run") &&
                      strstr(log, "now plans 16 optimizer steps, the checkpoint's run planned 8"),
                  "%s", log);
}
END_TEST

/* Issue 16: a resume compares the checkpoint's configuration with its own:
 * another plugin (or an added / removed section) where the checkpoint holds
 * a stage's state is refused; a changed model shape is refused naming the
 * changed key; other changes are allowed with a warning naming them;
 * init_from (weights only) compares nothing. */
START_TEST(resume_refuses_another_stage_plugin_and_names_changed_keys) {
    setup();
    ck_assert_int_eq(run("cfg", 0, NULL, NULL), 0);
    char last[1024];
    ckpt_path(last, sizeof last, "cfg", "last");
    const char *sgd[] = {"optimizer.plugin=sgd"};
    ck_assert_int_eq(run("cfg2", 1, sgd, last), 2);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "[optimizer] plugin 'adamw'") && strstr(msg, "plugin 'sgd'"),
                  "message: %s", msg);
    const char *no_sched[] = {"~scheduler"};
    ck_assert_int_eq(run("cfg2", 1, no_sched, last), 2);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "[scheduler] plugin 'cosine'") && strstr(msg, "no such section"),
                  "message: %s", msg);
    const char *swa[] = {"averager.plugin=swa"};
    ck_assert_int_eq(run("cfg2", 1, swa, last), 2);
    ck_assert_msg(strstr(pl_error_message(), "[averager] no such section"), "message: %s",
                  pl_error_message());
    const char *wide[] = {"model.hidden=32"};
    ck_assert_int_eq(run("cfg2", 1, wide, last), 2);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "[model] changed") && strstr(msg, "hidden 16 -> 32") &&
                      strstr(msg, "mlp.0.weight"), "message: %s", msg);
    /* allowed: more epochs, another dropout and lr; each named */
    const char *more[] = {"trainer.max_epochs=3", "model.dropout=0.2", "optimizer.lr=0.005"};
    ck_assert_int_eq(run("cfg2", 3, more, last), 0);
    const char *log = run_file("cfg2", "log.txt");
    ck_assert_msg(strstr(log, "with 3 changed configuration keys: model.dropout 0.1 -> 0.2, "
                              "optimizer.lr 0.01 -> 0.005, trainer.max_epochs 2 -> 3"),
                  "%s", log);
    /* init_from loads weights into any optimizer */
    char init[1100];
    snprintf(init, sizeof init, "trainer.init_from=%s", last);
    const char *from[] = {init, "optimizer.plugin=sgd", "scheduler.plugin=constant"};
    ck_assert_msg(run("cfg3", 3, from, NULL) == 0, "%s", pl_error_message());

    /* a checkpoint from before the stored config (and lr record) still resumes;
     * the changed hash is a warning that cannot name keys */
    FILE *in = fopen(last, "rb");
    ck_assert_ptr_nonnull(in);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    const char *hide[][2] = {{"\"config\":", "\"cxnfig\":"}, {"\"lr_factor\":", "\"lr_fxctor\":"}};
    for (int i = 0; i < 2; i++) {
        char *at = memmem(buf, n, hide[i][0], strlen(hide[i][0]));
        ck_assert_msg(at != NULL, "no %s in the checkpoint header", hide[i][0]);
        memcpy(at, hide[i][1], strlen(hide[i][1]));
    }
    char old[1100];
    snprintf(old, sizeof old, "%s/old.safetensors", g_dir);
    FILE *out = fopen(old, "wb");
    fwrite(buf, 1, n, out);
    fclose(out);
    const char *three[] = {"trainer.max_epochs=3"};
    ck_assert_msg(run("cfg4", 1, three, old) == 0, "%s", pl_error_message());
    ck_assert_ptr_nonnull(strstr(run_file("cfg4", "log.txt"), "predates the stored configuration"));
}
END_TEST

/* The metrics.csv row `key` logged at `step` (as text), or "" */
static void metric_at(const char *name, long step, const char *key, char *out, size_t n) {
    char p[1024], line[256], want[128];
    snprintf(p, sizeof p, "%s/%s/latest/metrics.csv", g_dir, name);
    snprintf(want, sizeof want, "%ld,", step);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        char *k = strchr(line, ',');
        if (strncmp(line, want, strlen(want)) || !k || !(k = strchr(k + 1, ',')) ||
            strncmp(k + 1, key, strlen(key)) || k[1 + strlen(key)] != ',')
            continue;
        snprintf(out, n, "%s", k + 2 + strlen(key));
        out[strcspn(out, "\r\n")] = 0;
    }
    fclose(f);
}

static void expect_meta(pl_st_file *f, const char *key, const char *want) {
    const char *v = pl_st_meta(f, key);
    ck_assert_msg(v && !strcmp(v, want), "metadata %s = %s, expected %s", key, v ? v : "(none)", want);
}

/* Lightning's rule for limit_*_batches and val_check_interval: an integer is a
 * count of batches, a float a fraction; so 1 is one batch and 1.0 the whole
 * split (8 batches per epoch here). */
static int val_rows(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/latest/metrics.csv", g_dir, name);
    char *csv = pl_test_read_file(p);
    ck_assert_msg(csv != NULL, "%s unreadable", p);
    int rows = 0;
    for (const char *q = csv; (q = strstr(q, ",val_loss,")) != NULL; q++) rows++;
    free(csv);
    return rows;
}

START_TEST(limit_batches_integer_is_a_count_float_a_fraction) {
    setup();
    const char *lims[] = {"1", "1.0", "0.5", "3", "1e0"};
    const char *steps[] = {"1", "8", "4", "3", "8"};
    for (int i = 0; i < 5; i++) {
        char name[32], o0[64];
        snprintf(name, sizeof name, "limit%d", i);
        snprintf(o0, sizeof o0, "trainer.limit_train_batches=%s", lims[i]);
        const char *o[] = {o0, "trainer.max_epochs=1"};
        ck_assert_int_eq(run(name, 2, o, NULL), 0);
        pl_st_file *f = open_ckpt(name, "last");
        expect_meta(f, "step", steps[i]);
        pl_st_close(f);
    }
    /* val_check_interval = 1: after every batch; 1.0: once, at the end of the epoch */
    const char *every[] = {"trainer.val_check_interval=1", "trainer.max_epochs=1"};
    ck_assert_int_eq(run("val_every", 2, every, NULL), 0);
    ck_assert_int_eq(val_rows("val_every"), 8);
    const char *once[] = {"trainer.val_check_interval=1.0", "trainer.max_epochs=1"};
    ck_assert_int_eq(run("val_once", 2, once, NULL), 0);
    ck_assert_int_eq(val_rows("val_once"), 1);
}
END_TEST

/* `[pipeline] threads` sizes OpenBLAS's own pool too (OpenMP's setting does not
 * reach it); summary.json records both. */
START_TEST(threads_govern_openblas_too) {
    setup();
    const char *o[] = {"pipeline.threads=1", "trainer.max_epochs=1"};
    ck_assert_int_eq(run("one_thread", 2, o, NULL), 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/one_thread/latest/summary.json", g_dir);
    char *js = pl_test_read_file(p);
    ck_assert_msg(js != NULL, "%s unreadable", p);
    /* and the data: the loader's split sizes under "data" */
    ck_assert_msg(strstr(js, "\"data\":") && strstr(js, "\"num_train\":"),
                  "summary.json has no data.num_train");
    const char *keys[] = {"\"openblas_threads\":", "\"openmp_threads\":"};
    for (int i = 0; i < 2; i++) {
        const char *v = strstr(js, keys[i]);
        ck_assert_msg(v != NULL, "summary.json has no %s", keys[i]);
        ck_assert_msg(strtol(v + strlen(keys[i]), NULL, 10) == 1, "summary.json: %s %s",
                      keys[i], v + strlen(keys[i]));
    }
    /* and which OpenBLAS build runs the GEMMs (CMake links the OpenMP one when installed) */
    const char *par = strstr(js, "\"openblas_parallel\":");
    ck_assert_msg(par && (strstr(par, "\"openmp\"") || strstr(par, "\"pthreads\"") ||
                          strstr(par, "\"serial\"")),
                  "summary.json: no openblas_parallel of openmp / pthreads / serial");
    /* and which CPU kernel the bf16 GEMMs ran on (chosen by cpuid at run time) */
    const char *gk = strstr(js, "\"cpu_gemm_bf16\":");
    ck_assert_msg(gk && (strstr(gk, "\"avx512bf16\"") || strstr(gk, "\"avx2\"") ||
                         strstr(gk, "\"scalar\"")),
                  "summary.json: no cpu_gemm_bf16 of avx512bf16 / avx2 / scalar");
    free(js);
}
END_TEST

/* The monitor rules on hand-made validation sequences: one metric as Lightning
 * (min_delta gates patience, any strict improvement is the best checkpoint);
 * val_loss,val_accuracy as the GAT reference code (patience resets while
 * either reaches its best, ties included; best where both are best). */
START_TEST(monitor_rules_lightning_and_gat) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.n_monitor = 1;
    t.mode_maxes[0] = false;
    t.min_delta = 0.1;
    const double one[] = {1.0, 0.95, 0.85, 0.9};
    const bool one_best[] = {true, true, true, false};
    const int64_t one_bad[] = {0, 1, 0, 1};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(tr_monitor_step(&t, &one[i]), one_best[i]);
        ck_assert_int_eq(t.bad_vals, one_bad[i]);
    }
    ck_assert_double_eq(t.best, 0.85);

    memset(&t, 0, sizeof t);
    t.n_monitor = 2;
    t.mode_maxes[0] = false; /* val_loss */
    t.mode_maxes[1] = true;  /* val_accuracy */
    const double seq[][2] = {{1.0, 0.5}, {0.9, 0.4}, {0.95, 0.5}, {0.95, 0.45},
                             {0.9, 0.55}, {0.92, 0.5}, {0.91, 0.54}};
    const bool best[] = {true, false, false, false, true, false, false};
    const int64_t bad[] = {0, 0, 0, 1, 0, 1, 2};
    for (int i = 0; i < 7; i++) {
        ck_assert_msg(tr_monitor_step(&t, seq[i]) == best[i], "validation %d: best", i);
        ck_assert_msg(t.bad_vals == bad[i], "validation %d: bad_vals %lld, expected %lld", i,
                      (long long)t.bad_vals, (long long)bad[i]);
    }
    ck_assert_double_eq(t.bests[0], 0.9);
    ck_assert_double_eq(t.bests[1], 0.55);
}
END_TEST

/* monitor / mode lists are checked before a run (and by `pipeline check`) */
START_TEST(monitor_and_mode_lists_are_checked) {
    const char *bad[][2] = {{"val_loss,val_accuracy", "min,max,min"},
                            {"val_loss", "down"},
                            {"val_a,val_b,val_c,val_d,val_e", "min"}};
    const char *want[] = {"names 2 metrics but mode = min,max,min gives 3", "'down' is neither",
                          "at most 4 metrics"};
    for (int i = 0; i < 3; i++) {
        char ini[512];
        snprintf(ini, sizeof ini,
                 "[pipeline]\nname = m\n[data]\nplugin = hdf5_rows\npath = x.h5\n[model]\nplugin = mlp\n"
                 "in_features = 2\nout_features = 1\n[optimizer]\nplugin = adamw\n"
                 "[trainer]\nmonitor = %s\nmode = %s\n", bad[i][0], bad[i][1]);
        pl_registry *r = registry();
        pl_config *c = pl_config_load_string(ini, "m.ini", NULL, 0, NULL, r);
        ck_assert_msg(c != NULL, "config: %s", pl_error_message());
        ck_assert_int_eq(pl_trainer_check_options(c), PL_ERR_CONFIG);
        ck_assert_msg(strstr(pl_error_message(), want[i]), "%s", pl_error_message());
        pl_config_free(c);
        pl_registry_free(r);
    }
}
END_TEST

START_TEST(mid_epoch_resume_is_bit_identical) {
    setup();
    /* 8 batches = 8 steps per epoch, shuffled, dropout on, AdamW, cosine: a checkpoint
     * every 3 steps lands mid-epoch (steps 3, 6 in epoch 0; 9, 12, 15 in epoch 1) */
    const char *every[] = {"trainer.checkpoint_every_n_train_steps=3"};
    ck_assert_int_eq(run("straight", 1, every, NULL), 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/straight/latest/checkpoints/step-000012.safetensors", g_dir);
    pl_st_file *f = NULL;
    ck_assert_msg(pl_st_open(p, &f) == PL_OK, "%s", pl_error_message());
    expect_meta(f, "epoch", "1");
    expect_meta(f, "step", "12");
    expect_meta(f, "batch_in_epoch", "4");
    expect_meta(f, "micro_step", "12");
    expect_meta(f, "accumulation_pending", "0");
    /* the trainer's counter is the only record of the position (ABI 2) */
    ck_assert_ptr_null(pl_st_meta(f, "data.hdf5_rows.next_batch"));
    pl_st_close(f);
    /* an epoch-end checkpoint: the start of the next epoch */
    f = open_ckpt("straight", "last");
    expect_meta(f, "epoch", "2");
    expect_meta(f, "batch_in_epoch", "0");
    pl_st_close(f);

    /* resume in epoch 1, and in epoch 0 (the resumed run then crosses an epoch end) */
    const char *from[] = {"step-000012", "step-000006"};
    const char *name[] = {"mid1", "mid0"};
    for (int i = 0; i < 2; i++) {
        char ck[1024];
        snprintf(p, sizeof p, "%s/straight/latest/checkpoints/%s.safetensors", g_dir, from[i]);
        ck_assert_ptr_nonnull(realpath(p, ck));
        ck_assert_int_eq(run(name[i], 1, every, ck), 0);
        int n;
        double d = ckpt_diff("straight", name[i], &n);
        ck_assert_int_ge(n, 4 + 8); /* 4 weights + adamw moments */
        ck_assert_msg(d == 0.0, "run resumed from %s differs from the straight run by %g", from[i], d);
        f = open_ckpt(name[i], "last");
        expect_meta(f, "step", "16");
        pl_st_close(f);
        /* the resumed epoch's logged train-loss average covers the whole epoch */
        char a[64], b[64];
        metric_at("straight", 16, "epoch_train_loss", a, sizeof a);
        metric_at(name[i], 16, "epoch_train_loss", b, sizeof b);
        ck_assert_msg(a[0] && !strcmp(a, b), "epoch 1 train loss %s (straight) vs %s (%s)", a, b,
                      name[i]);
        /* and the learning rate of the steps after the resume is the straight run's */
        metric_at("straight", 14, "lr", a, sizeof a);
        metric_at(name[i], 14, "lr", b, sizeof b);
        ck_assert_msg(a[0] && !strcmp(a, b), "lr at step 14: %s vs %s", a, b);
    }

    /* a killed run leaves its newest step checkpoint as last.safetensors; `--resume
     * last` continues it exactly (the run directory is made by hand here) */
    char dir[1024], cmd[3200];
    snprintf(dir, sizeof dir, "%s/killed/20000101-000000/checkpoints", g_dir);
    snprintf(p, sizeof p, "%s/straight/latest/checkpoints/step-000009.safetensors", g_dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/last.safetensors'", dir, p, dir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(run("killed", 1, every, "last"), 0);
    int n;
    double d = ckpt_diff("straight", "killed", &n);
    ck_assert_msg(d == 0.0, "run resumed from a killed run's last differs by %g", d);
}
END_TEST

START_TEST(mid_epoch_resume_streaming_accumulation_validation) {
    setup();
    /* 4 chunks of 16 rows read by the prefetch thread; 2 micro-batches per step (4 steps
     * per epoch); validation every 3 batches, so in the middle of epochs and of an
     * accumulation; a checkpoint after every step */
    const char *o[] = {"data.chunk_samples=16", "data.prefetch=true",
                       "trainer.accumulate_grad_batches=2", "trainer.val_check_interval=3",
                       "trainer.checkpoint_every_n_train_steps=1"};
    ck_assert_int_eq(run("straight", 5, o, NULL), 0);
    pl_st_file *f = open_ckpt("straight", "last");
    /* the validations in the middle of an epoch no longer cut it short */
    expect_meta(f, "step", "8");
    expect_meta(f, "micro_step", "16");
    pl_st_close(f);
    /* step 3 = batch 6, right after the validation of batches 0..5; step 4 = batch 8, the
     * end of epoch 0 before its epoch-end work; step 6 = batch 4 of epoch 1 */
    const char *from[] = {"step-000003", "step-000004", "step-000006"};
    const char *batch[] = {"6", "8", "4"};
    for (int i = 0; i < 3; i++) {
        char p[1024], ck[1024], name[32];
        snprintf(p, sizeof p, "%s/straight/latest/checkpoints/%s.safetensors", g_dir, from[i]);
        ck_assert_ptr_nonnull(realpath(p, ck));
        f = NULL;
        ck_assert_msg(pl_st_open(ck, &f) == PL_OK, "%s", pl_error_message());
        expect_meta(f, "batch_in_epoch", batch[i]);
        pl_st_close(f);
        snprintf(name, sizeof name, "resumed%d", i);
        ck_assert_int_eq(run(name, 5, o, ck), 0);
        int n;
        double d = ckpt_diff("straight", name, &n);
        ck_assert_msg(d == 0.0, "run resumed from %s differs from the straight run by %g", from[i], d);
        /* the validation after the resume saw the same weights */
        char a[64], b[64];
        metric_at("straight", 7, "val_loss", a, sizeof a);
        metric_at(name, 7, "val_loss", b, sizeof b);
        ck_assert_msg(a[0] && !strcmp(a, b), "val_loss at step 7: %s vs %s", a, b);
    }
}
END_TEST

/* Any loader continues an epoch mid-way (ABI 2): its batch order is a function
 * of (seed, epoch), so epoch_begin(train, epoch, batch) resumes it. A loader
 * with no state of any kind, resumed from a mid-epoch step checkpoint, gives
 * the straight run's weights exactly. */
START_TEST(mid_epoch_resume_needs_no_loader_state) {
    setup();
    char so[700];
    snprintf(so, sizeof so, "%s/test_plugins/test_stateless_loader.so", PL_TEST_BINARY_DIR);
    ck_assert_msg(access(so, R_OK) == 0, "%s not built (build the whole tree)", so);
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[pipeline]\nname = stateless\nrun_dir = %s\nseed = 7\n"
             "[data]\nplugin = test_stateless_loader\nbatch_size = 8\n"
             "[model]\nplugin = mlp\nin_features = %d\nout_features = 1\nhidden = 16\n"
             "[optimizer]\nplugin = adamw\nlr = 0.01\n"
             "[trainer]\nmax_epochs = 2\ntest = false\nlog_every_n_steps = 1\n"
             "checkpoint_every_n_train_steps = 3\nval_check_interval = 0.5\n",
             g_dir, NF);
    ck_assert_int_eq(run_ini(ini, 0, NULL, NULL), 0);
    /* the mid-epoch validations did not cut the epochs short */
    pl_st_file *f = open_ckpt("stateless", "last");
    expect_meta(f, "step", "16");
    pl_st_close(f);
    char p[1024], ck[1024], straight[1024];
    ckpt_path(straight, sizeof straight, "stateless", "last");
    snprintf(p, sizeof p, "%s/stateless/latest/checkpoints/step-000003.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(p, ck));
    ck_assert_int_eq(run_ini(ini, 0, NULL, ck), 0);
    char resumed[1024];
    ckpt_path(resumed, sizeof resumed, "stateless", "last");
    int n;
    double d = file_diff(straight, resumed, &n);
    ck_assert_int_ge(n, 4);
    ck_assert_msg(d == 0.0, "resumed from step 3 of a stateless loader: differs by %g", d);
}
END_TEST

/* A run that fails mid-epoch leaves its newest step checkpoint as last.safetensors,
 * recording where it was. */
START_TEST(failed_run_leaves_a_mid_epoch_last) {
    setup();
    const char *o[] = {"optimizer.plugin=sgd", "optimizer.lr=1e8", "scheduler.plugin=constant",
                       "trainer.checkpoint_every_n_train_steps=1", "trainer.save_best=false"};
    ck_assert_int_eq(run("nan", 5, o, NULL), 1);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "non-finite training loss"));
    pl_st_file *f = open_attempt_ckpt("nan", "last");
    const char *step = pl_st_meta(f, "step"), *batch = pl_st_meta(f, "batch_in_epoch");
    ck_assert_ptr_nonnull(step);
    ck_assert_ptr_nonnull(batch);
    ck_assert_msg(atoi(step) >= 1 && atoi(step) < 8, "step %s", step);
    ck_assert_str_eq(batch, step); /* epoch 0, one step per batch */
    expect_meta(f, "epoch", "0");
    pl_st_close(f);
}
END_TEST


/* A resumed run that finds no better validation tests the earlier run's
 * best checkpoint (Lightning restores best_model_path), not its last weights. */
/* best.safetensors written at an epoch end records the next epoch to run,
 * like the epoch checkpoint of the same step: a resume from best does not
 * train that epoch twice (it did: best recorded the finished epoch) */
START_TEST(best_records_the_same_position_as_the_epoch_checkpoint) {
    setup();
    const char *every[] = {"trainer.checkpoint_every_n_epochs=1", "trainer.max_epochs=3"};
    ck_assert_int_eq(run("bestpos", 2, every, NULL), 0);
    pl_st_file *b = open_ckpt("bestpos", "best");
    int matched = 0;
    for (int e = 1; e <= 3; e++) {
        char p[1024], w[32];
        snprintf(w, sizeof w, "epoch-%04d", e);
        ckpt_path(p, sizeof p, "bestpos", w);
        pl_st_file *f = NULL;
        PL_CK_OK(pl_st_open(p, &f));
        if (!strcmp(pl_st_meta(f, "step"), pl_st_meta(b, "step"))) {
            matched++;
            expect_meta(b, "epoch", pl_st_meta(f, "epoch"));
            expect_meta(b, "batch_in_epoch", "0");
        }
        pl_st_close(f);
    }
    ck_assert_int_eq(matched, 1);
    pl_st_close(b);
}
END_TEST

START_TEST(resumed_run_tests_the_earlier_best) {
    setup();
    const char *every[] = {"trainer.checkpoint_every_n_epochs=1"};
    ck_assert_int_eq(run("orig", 1, every, NULL), 0);
    char last[1024], best[1024];
    ckpt_path(last, sizeof last, "orig", "last");
    ckpt_path(best, sizeof best, "orig", "best");
    /* resume at the end of training: nothing left to fit, then test */
    const char *test_on[] = {"trainer.test=true"};
    ck_assert_int_eq(run("again", 1, test_on, last), 0);
    char sp[1024], js[65536];
    snprintf(sp, sizeof sp, "%s/again/latest/summary.json", g_dir);
    FILE *f = fopen(sp, "r");
    ck_assert_ptr_nonnull(f);
    size_t r = fread(js, 1, sizeof js - 1, f);
    js[r] = 0;
    fclose(f);
    ck_assert_msg(strstr(js, best) != NULL, "summary of the resumed run does not name %s as its best "
                  "checkpoint:\n%s", best, js);
    ck_assert_msg(strstr(js, "\"test_metrics\"") != NULL, "no test metrics: %s", js);
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

/* Replace test target 3 by `v` in the test data file. */
static void set_test_target(float v) {
    hid_t f = H5Fopen(g_h5, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/test/y", H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    hsize_t n;
    H5Sget_simple_extent_dims(sp, &n, NULL);
    float *y = malloc(sizeof *y * n);
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
    y[3] = v;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, y);
    free(y);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
}

/* summary.json of the newest run started (last_attempt) says failed */
static void expect_last_attempt_failed(const char *name) {
    char sp2[1024], js[65536];
    snprintf(sp2, sizeof sp2, "%s/%s/last_attempt/summary.json", g_dir, name);
    FILE *fp = fopen(sp2, "r");
    ck_assert_ptr_nonnull(fp);
    size_t r = fread(js, 1, sizeof js - 1, fp);
    js[r] = 0;
    fclose(fp);
    ck_assert_msg(strstr(js, "\"status\": \"failed\"") || strstr(js, "\"status\":\t\"failed\""),
                  "%s", js);
}

/* A test metric that overflows to Inf: the run fails naming the test metric
 * instead of ending with exit 0 and Inf metrics; summary.json says failed.
 * (NaN in the test data never gets that far: the loader refuses it, naming
 * the dataset, row and column; also checked here.) */
START_TEST(non_finite_test_metrics_fail_the_run) {
    setup();
    set_test_target(3e38f); /* finite, but its squared error is not */
    const char *o[] = {"trainer.test=true", "trainer.max_epochs=1"};
    ck_assert_int_eq(run("nan_test", 2, o, NULL), 1);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "test metric") && strstr(msg, "inf"), "message: %s", msg);
    expect_last_attempt_failed("nan_test");
    set_test_target(NAN);
    ck_assert_int_eq(run("nan_test", 2, o, NULL), 1);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "data.h5: dataset '/test/y' row 3, column 0 is nan"), "message: %s",
                  msg);
    expect_last_attempt_failed("nan_test");
}
END_TEST

/* run directories (timestamped) of config `name` */
static int count_runs(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    DIR *d = opendir(p);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] >= '0' && e->d_name[0] <= '9' && !strstr(e->d_name, ".tmp.");
    closedir(d);
    return n;
}

/* target of RUN_DIR/name/link ("" when absent) */
static const char *link_target(const char *name, const char *link, char *buf, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s", g_dir, name, link);
    ssize_t k = readlink(p, buf, n - 1);
    buf[k > 0 ? k : 0] = 0;
    return buf;
}

/* Run an INI file (requirements resolved from its directory). */
static int run_ini_file(const char *path) {
    pl_registry *r = registry();
    pl_config *c = pl_config_load(path, 0, NULL, r);
    ck_assert_msg(c != NULL, "config: %s", pl_error_message());
    pl_run_options o = {.config_path = path};
    int code = pl_trainer_run(c, r, &o);
    pl_config_free(c);
    pl_registry_free(r);
    return code;
}

/* `latest` names the newest run that ended ok: a failed run moves only
 * `last_attempt`, so a config requiring this one finds the finished run and
 * does not run it again; a `latest` left on a failed run (older versions
 * moved it at start) does not satisfy a requirement. */
START_TEST(failed_run_keeps_latest_on_the_finished_run) {
    setup();
    char ini[4096], p[1024], ok_dir[256], buf[256];
    FILE *f;
    snprintf(p, sizeof p, "%s/keep.ini", g_dir);
    ck_assert_ptr_nonnull(f = fopen(p, "w"));
    fputs(base_ini(ini, sizeof ini, "keep"), f);
    fclose(f);
    char child[1024];
    snprintf(child, sizeof child, "%s/child.ini", g_dir);
    base_ini(ini, sizeof ini, "child");
    char *seed = strstr(ini, "seed = 7\n") + strlen("seed = 7\n");
    ck_assert_ptr_nonnull(f = fopen(child, "w"));
    fprintf(f, "%.*srequires = keep.ini\n%s", (int)(seed - ini), ini, seed);
    fclose(f);

    ck_assert_int_eq(run_ini_file(p), 0);
    link_target("keep", "latest", ok_dir, sizeof ok_dir);
    ck_assert_str_ne(ok_dir, "");
    ck_assert_str_eq(link_target("keep", "last_attempt", buf, sizeof buf), ok_dir);
    /* a run that fails after its directory is made (NaN loss) */
    const char *o[] = {"optimizer.plugin=sgd", "optimizer.lr=1e8", "scheduler.plugin=constant"};
    ck_assert_int_eq(run("keep", 3, o, NULL), 1);
    ck_assert_int_eq(count_runs("keep"), 2);
    ck_assert_str_eq(link_target("keep", "latest", buf, sizeof buf), ok_dir);
    char failed_dir[256];
    link_target("keep", "last_attempt", failed_dir, sizeof failed_dir);
    ck_assert_str_ne(failed_dir, ok_dir);
    expect_last_attempt_failed("keep");
    /* the requirement is satisfied by the finished run: not run again */
    ck_assert_int_eq(run_ini_file(child), 0);
    ck_assert_int_eq(count_runs("keep"), 2);
    ck_assert_str_ne(link_target("child", "latest", buf, sizeof buf), "");
    /* latest on a failed run (as older versions left it): the requirement runs again */
    char lp[1024];
    snprintf(lp, sizeof lp, "%s/keep/latest", g_dir);
    unlink(lp);
    ck_assert_int_eq(symlink(failed_dir, lp), 0);
    ck_assert_int_eq(run_ini_file(child), 0);
    ck_assert_int_eq(count_runs("keep"), 3);
    link_target("keep", "latest", buf, sizeof buf);
    ck_assert_str_ne(buf, failed_dir);
    ck_assert_str_ne(buf, ok_dir);
}
END_TEST

/* a pid that no longer runs: a child that has exited and been reaped */
static long dead_pid(void) {
    pid_t c = fork();
    if (c == 0) _exit(0);
    ck_assert_int_gt(c, 0);
    waitpid(c, NULL, 0);
    return (long)c;
}

/* create `path` (a link when `link`), modified `age` seconds ago */
static void make_tmp(const char *path, bool link, int age) {
    if (link) {
        ck_assert_int_eq(symlink("nowhere", path), 0);
    } else {
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fputs("half-written", f);
        fclose(f);
    }
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= age;
    ts[1] = ts[0];
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW), 0);
}

/* NAME.tmp.<pid> files a killed run left (checkpoints, summary.json,
 * exports, the links) are removed when the next run of the config starts,
 * and log.txt says so; a live pid's, a recent one and other names stay. */
START_TEST(orphan_tmp_files_of_killed_runs_are_removed_at_start) {
    setup();
    ck_assert_int_eq(run("orph", 0, NULL, NULL), 0);
    char dir[1024], p[1400];
    snprintf(p, sizeof p, "%s/orph/latest", g_dir);
    ck_assert_ptr_nonnull(realpath(p, dir));
    long dead = dead_pid();
    char gone[4][1400], kept[4][1400];
    snprintf(p, sizeof p, "%s/outputs", dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(gone[0], sizeof gone[0], "%s/checkpoints/last.safetensors.tmp.%ld", dir, dead);
    snprintf(gone[1], sizeof gone[1], "%s/summary.json.tmp.%ld", dir, dead);
    snprintf(gone[2], sizeof gone[2], "%s/outputs/teacher_outputs.h5.tmp.%ld", dir, dead);
    snprintf(gone[3], sizeof gone[3], "%s/orph/latest.tmp.%ld", g_dir, dead);
    snprintf(kept[0], sizeof kept[0], "%s/checkpoints/best.safetensors.tmp.%ld", dir,
             (long)getpid()); /* a live process */
    snprintf(kept[1], sizeof kept[1], "%s/checkpoints/step.safetensors.tmp.%ld", dir, dead);
    snprintf(kept[2], sizeof kept[2], "%s/checkpoints/notes.tmp.txt", dir);
    snprintf(kept[3], sizeof kept[3], "%s/checkpoints/x.tmp.", dir);
    for (int i = 0; i < 4; i++) {
        make_tmp(gone[i], i == 3, 3600);
        make_tmp(kept[i], false, i == 1 ? 0 : 3600); /* kept[1]: written just now */
    }
    ck_assert_int_eq(run("orph", 0, NULL, NULL), 0);
    struct stat st;
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(lstat(gone[i], &st) != 0, "%s was not removed", gone[i]);
        ck_assert_msg(lstat(kept[i], &st) == 0, "%s was removed", kept[i]);
    }
    const char *log = run_file("orph", "log.txt");
    for (int i = 0; i < 4; i++) {
        char want[1600];
        snprintf(want, sizeof want, "removed %s: a temporary file left by process %ld", gone[i],
                 dead);
        ck_assert_msg(strstr(log, want), "log.txt lacks '%s':\n%s", want, log);
    }
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
                          "scheduler.plugin=constant", "trainer.on_nan=skip",
                          "trainer.max_consecutive_nan_skips=0"};
    /* skipping non-finite steps without limit goes on training, but the
     * weights already diverged: the validation metrics are non-finite and the
     * run fails naming them rather than ending with exit 0 */
    ck_assert_int_eq(run("nan_skip", 5, skip, NULL), 1);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "validation metric"), "message: %s", msg);
}
END_TEST

/* Set rows [r0, r1) of dataset `name` (float, 2-D) of the test file to 3e38:
 * finite, so the loader accepts the file (it refuses NaN data), but its
 * squared error overflows f32 and the loss is +Inf (as setup() wrote it; the
 * next setup() writes it again). */
static void poison_rows(const char *name, int r0, int r1) {
    hid_t f = H5Fopen(g_h5, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t sp = H5Dget_space(ds);
    hsize_t d[2];
    H5Sget_simple_extent_dims(sp, d, NULL);
    float *v = malloc(sizeof *v * d[0] * d[1]);
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    for (size_t i = (size_t)r0 * d[1]; i < (size_t)r1 * d[1]; i++) v[i] = 3e38f;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    free(v);
    H5Sclose(sp);
    H5Dclose(ds);
    H5Fclose(f);
}

/* on_nan = skip: a bad row skips its batch's step once per epoch and the
 * run goes on; a run of more than max_consecutive_nan_skips non-finite
 * losses in a row fails naming the epoch, step, batch and the count. */
START_TEST(nan_skips_in_a_row_are_limited) {
    setup();
    poison_rows("/train/y", 5, 6); /* (a bad input is no test: ReLU may map it away) */
    const char *skip1[] = {"trainer.on_nan=skip", "trainer.max_consecutive_nan_skips=1"};
    ck_assert_msg(run("nan_row", 2, skip1, NULL) == 0, "%s", pl_error_message());
    const char *log = run_file("nan_row", "log.txt");
    int skipped = 0;
    for (const char *p = log; (p = strstr(p, "step skipped")); p++) skipped++;
    ck_assert_msg(skipped == 2, "%d skipped steps (one per epoch expected):\n%s", skipped, log);

    setup();
    poison_rows("/train/y", 0, N_TRAIN);
    const char *skip3[] = {"trainer.on_nan=skip", "trainer.max_consecutive_nan_skips=3"};
    ck_assert_int_eq(run("nan_all", 2, skip3, NULL), 1);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "at epoch 0 step 0 batch 3, 4 in a row") &&
                      strstr(msg, "at most 3 consecutive skipped steps") &&
                      strstr(msg, "max_consecutive_nan_skips"), "message: %s", msg);
    /* 0: no limit; every step is skipped, the untouched weights validate finely */
    const char *unlimited[] = {"trainer.on_nan=skip", "trainer.max_consecutive_nan_skips=0"};
    ck_assert_msg(run("nan_all", 2, unlimited, NULL) == 0, "%s", pl_error_message());
}
END_TEST

/* One process keeps the loss on the device between reads (step_values.c):
 * with log_every_n_steps = 4 a non-finite loss is decided at the next read
 * (the step ran with found_inf set, a no-op, and is taken back), and the run
 * equals the one that reads every step (sgd without momentum, constant lr,
 * no dropout: nothing depends on when the skip was noticed); on_nan = stop
 * names the bad loss's own epoch, step and batch, not the read's. */
START_TEST(nan_decided_at_the_next_read_as_at_once) {
    setup();
    poison_rows("/train/y", 5, 6);
    const char *o1[] = {"trainer.on_nan=skip", "optimizer.plugin=sgd", "scheduler.plugin=constant",
                        "model.dropout=0"};
    const char *o4[] = {"trainer.on_nan=skip", "optimizer.plugin=sgd", "scheduler.plugin=constant",
                        "model.dropout=0", "trainer.log_every_n_steps=4"};
    ck_assert_msg(run("read1", 4, o1, NULL) == 0, "%s", pl_error_message());
    ck_assert_msg(run("read4", 5, o4, NULL) == 0, "%s", pl_error_message());
    const char *log = run_file("read4", "log.txt");
    int skipped = 0;
    for (const char *p = log; (p = strstr(p, "step skipped")); p++) skipped++;
    ck_assert_msg(skipped == 2, "%d skipped steps (one per epoch expected):\n%s", skipped, log);
    char a[1024], b[1024];
    ckpt_path(a, sizeof a, "read1", "last");
    ckpt_path(b, sizeof b, "read4", "last");
    int n;
    double d = file_diff(a, b, &n);
    ck_assert_int_ge(n, 4);
    ck_assert_msg(d == 0.0, "reading every 4 steps differs from every step by %g", d);
    pl_st_file *f = open_ckpt("read4", "last");
    expect_meta(f, "step", "14"); /* 2 epochs x 8 batches, 2 steps skipped */
    pl_st_close(f);

    const char *s1[] = {"optimizer.plugin=sgd", "scheduler.plugin=constant", "model.dropout=0"};
    const char *s4[] = {"optimizer.plugin=sgd", "scheduler.plugin=constant", "model.dropout=0",
                        "trainer.log_every_n_steps=4"};
    ck_assert_int_eq(run("stop1", 3, s1, NULL), 1);
    char m1[2048];
    snprintf(m1, sizeof m1, "%s", pl_error_message());
    ck_assert_int_eq(run("stop4", 4, s4, NULL), 1);
    ck_assert_msg(strstr(m1, "non-finite training loss") && !strcmp(m1, pl_error_message()),
                  "every step: %s\nevery 4 steps: %s", m1, pl_error_message());
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


/* Checkpoint metadata is untrusted: a loop counter that is not a whole
 * non-negative integer is refused naming the file and the key. */
START_TEST(corrupt_checkpoint_metadata_is_refused) {
    setup();
    ck_assert_int_eq(run("meta", 0, NULL, NULL), 0);
    char last[1024], rl[1024], bad[1100];
    snprintf(last, sizeof last, "%s/meta/latest/checkpoints/last.safetensors", g_dir);
    ck_assert_ptr_nonnull(realpath(last, rl));
    FILE *in = fopen(rl, "rb");
    ck_assert_ptr_nonnull(in);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, in);
    fclose(in);
    ck_assert_int_lt(n, sizeof buf);
    /* same length, so every offset in the header stays valid */
    const char *key = "\"step\":\"16\"";
    char *at = memmem(buf, n, key, strlen(key));
    ck_assert_msg(at != NULL, "no %s in the checkpoint header", key);
    memcpy(at, "\"step\":\"1x\"", strlen(key));
    snprintf(bad, sizeof bad, "%s/badmeta.safetensors", g_dir);
    FILE *out = fopen(bad, "wb");
    fwrite(buf, 1, n, out);
    fclose(out);
    ck_assert_int_eq(run("meta", 0, NULL, bad), 1);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "badmeta.safetensors") && strstr(msg, "'step'") && strstr(msg, "1x"),
                  "message: %s", msg);
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
    ck_assert_int_eq(run("other", 1, o, rl), 2);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "mlp.0.weight") && strstr(msg, "32") && strstr(msg, "16"),
                  "message: %s", msg);
    /* max_epochs = 0 with nothing to load would test untrained weights: refused;
     * with init_from it evaluates the given weights */
    const char *z[] = {"trainer.max_epochs=0"};
    ck_assert_int_eq(run("zero", 1, z, NULL), 2);
    ck_assert_ptr_nonnull(strstr(pl_error_message(), "max_epochs = 0"));
    char init0[1200];
    snprintf(init0, sizeof init0, "trainer.init_from=%s", rl);
    const char *zi[] = {"trainer.max_epochs=0", init0, "trainer.test=true",
                        "scheduler.plugin=constant"};
    ck_assert_msg(run("zero_init", 4, zi, NULL) == 0, "%s", pl_error_message());
    /* a NaN weight is refused at load, naming the file and the parameter */
    char nanp[1100];
    snprintf(nanp, sizeof nanp, "%s/nan_weight.safetensors", g_dir);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(rl, &f));
    pl_tensor *w0 = PL_CK_NOTNULL(pl_st_load(f, "mlp.0.weight"));
    pl_st_close(f);
    pl_tensor_f32(w0)[5] = NAN;
    pl_test_st_replace(rl, nanp, "mlp.0.weight", w0);
    pl_tensor_release(w0);
    char init[1200];
    snprintf(init, sizeof init, "trainer.init_from=%s", nanp);
    const char *oi[] = {init};
    ck_assert_int_eq(run("nan_init", 1, oi, NULL), 1);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "nan_weight.safetensors") && strstr(msg, "mlp.0.weight") &&
                      strstr(msg, "non-finite"), "message: %s", msg);
}
END_TEST

int main(void) {
    Suite *s = suite_create("trainer");
    TCase *tc = tcase_create("fit");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, resume_is_bit_identical);
    tcase_add_test(tc, mid_epoch_resume_is_bit_identical);
    tcase_add_test(tc, limit_batches_integer_is_a_count_float_a_fraction);
    tcase_add_test(tc, threads_govern_openblas_too);
    tcase_add_test(tc, monitor_rules_lightning_and_gat);
    tcase_add_test(tc, monitor_and_mode_lists_are_checked);
    tcase_add_test(tc, extended_run_equals_the_straight_run_in_metrics_and_summary);
    tcase_add_test(tc, resume_refuses_another_stage_plugin_and_names_changed_keys);
    tcase_add_test(tc, mid_epoch_resume_streaming_accumulation_validation);
    tcase_add_test(tc, mid_epoch_resume_needs_no_loader_state);
    tcase_add_test(tc, failed_run_leaves_a_mid_epoch_last);
    tcase_add_test(tc, resume_last_continues_the_newest_run);
    tcase_add_test(tc, resumed_run_tests_the_earlier_best);
    tcase_add_test(tc, best_records_the_same_position_as_the_epoch_checkpoint);
    tcase_add_test(tc, non_finite_test_metrics_fail_the_run);
    tcase_add_test(tc, failed_run_keeps_latest_on_the_finished_run);
    tcase_add_test(tc, orphan_tmp_files_of_killed_runs_are_removed_at_start);
    tcase_add_test(tc, gradient_accumulation_matches_larger_batch);
    tcase_add_test(tc, clip_by_norm_bounds_the_update_like_clip_grad_norm);
    tcase_add_test(tc, nan_loss_stops_with_step_and_last_finite_loss);
    tcase_add_test(tc, nan_skips_in_a_row_are_limited);
    tcase_add_test(tc, nan_decided_at_the_next_read_as_at_once);
    tcase_add_test(tc, swapping_plugins_on_the_command_line_changes_the_run);
    tcase_add_test(tc, corrupt_or_mismatched_checkpoint_is_refused);
    tcase_add_test(tc, corrupt_checkpoint_metadata_is_refused);
    tcase_add_test(tc, frozen_pretrained_weight_stays_out_of_checkpoints_and_resume_is_bit_identical);
    tcase_add_test(tc, init_from_keeps_the_pretrained_weight_from_its_source);
    tcase_add_test(tc, trainable_pretrained_weight_is_saved_and_trained_in_f32);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
