/* The trainer's callbacks (core/run/callback.h; issue 32, item 0): a user
 * callback sees every hook, in the documented order and counts, after the
 * built-ins; the step's values reach it as device tensors; the built-in
 * monitor (early stopping, the GAT rule) and NaN policy decide as
 * documented; the EMA callback matches torch's EMA formula
 * (AveragedModel + get_ema_multi_avg_fn: ema = ema + (1 - decay)(w - ema),
 * torch._foreach_lerp_) after N steps on the CPU and on the strict device,
 * validation runs on the averaged weights and the best checkpoint holds
 * them, and a quiet step with the EMA on makes no host read and no
 * allocation on the strict device. */
#define _GNU_SOURCE /* realpath */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "callback.h"
#include "config_internal.h"
#include "pl_test.h"
#include "regression_h5.h"
#include "registry.h"
#include "trainer.h"
#include "trainer_internal.h"

#define N_TRAIN 64
#define NF 5
#define BATCH 8
#define NB (N_TRAIN / BATCH) /* training batches per epoch */

static char g_dir[512], g_h5[600];

static void write_group(hid_t f, const char *g, int n, uint64_t seed) {
    pl_test_write_regression_group(f, g, n, NF, seed);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/test_callbacks_runs", PL_TEST_BINARY_DIR);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "setup: %s failed\n", cmd);
        exit(1);
    }
    snprintf(g_h5, sizeof g_h5, "%s/data.h5", g_dir);
    hid_t f = H5Fcreate(g_h5, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    write_group(f, "/train", N_TRAIN, 1);
    write_group(f, "/val", 32, 2);
    write_group(f, "/test", 32, 3);
    H5Fclose(f);
}

static int run_r(const char *name, int n_over, const char **over, const char *resume) {
    char ini[4096];
    snprintf(ini, sizeof ini,
             "[pipeline]\nname = %s\nrun_dir = %s\nseed = 7\n"
             "[data]\nplugin = hdf5_rows\npath = %s\ndatasets = x,y\nbatch_size = %d\n"
             "shuffle = true\nprefetch = false\n"
             "[model]\nplugin = mlp\nin_features = %d\nout_features = 1\nhidden = 16\n"
             "dropout = 0.1\n"
             "[optimizer]\nplugin = adamw\nlr = 0.01\n"
             "[scheduler]\nplugin = cosine\n"
             "[trainer]\nmax_epochs = 2\nlog_every_n_steps = 1\ntest = false\n",
             name, g_dir, g_h5, BATCH, NF);
    pl_registry *r = pl_registry_new();
    pl_registry_add_dir(r, PL_TEST_PLUGIN_DIR);
    pl_config *c = pl_config_load_string(ini, "test.ini", NULL, n_over, over, r);
    ck_assert_msg(c != NULL, "config: %s", pl_error_message());
    pl_run_options o = {.config_path = "test.ini", .resume = resume};
    int code = pl_trainer_run(c, r, &o);
    pl_config_free(c);
    pl_registry_free(r);
    return code;
}

static int run(const char *name, int n_over, const char **over) {
    return run_r(name, n_over, over, NULL);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static void run_path(char *buf, size_t n, const char *name, const char *file) {
    snprintf(buf, n, "%s/%s/latest/%s", g_dir, name, file);
}

/* ---- a user callback that counts its hooks and checks what it is handed ---- */

enum { H_FIT_START, H_EPOCH_START, H_LOSS_READ, H_STEP_END, H_BATCH_END, H_BOUNDARY,
       H_TRAIN_EPOCH_END, H_VAL_START, H_VAL_END, H_EPOCH_END, H_FIT_END, H_TEST_END, H_N };

typedef struct counter {
    int n[H_N];
    char order[256];       /* the first call of each hook, in order: "F E L S B ..." */
    bool seen[H_N];
    char names[256];       /* the callback list at on_fit_start */
    int64_t last_step;     /* the step numbers it was handed, in order */
    bool steps_in_order, tensors_ok, best_before_me, best_file_before_me;
    double gnorm[64];      /* the device-side grad norm, read back here (a test may) */
} counter;

static void hit(counter *c, int h, const char *tag) {
    c->n[h]++;
    if (!c->seen[h]) {
        c->seen[h] = true;
        strncat(c->order, tag, sizeof c->order - strlen(c->order) - 1);
    }
}

static pl_status c_fit_start(void *self, trainer *t) {
    counter *c = self;
    hit(c, H_FIT_START, "F");
    for (int i = 0; i < t->n_cbs; i++) {
        strncat(c->names, t->cbs[i]->name, sizeof c->names - strlen(c->names) - 2);
        strncat(c->names, ",", sizeof c->names - strlen(c->names) - 1);
    }
    return PL_OK;
}
static pl_status c_epoch_start(void *self, trainer *t) { hit(self, H_EPOCH_START, "E"); return PL_OK; }
static pl_status c_loss_read(void *self, trainer *t, const tr_loss_value *r) {
    hit(self, H_LOSS_READ, "L");
    return PL_OK;
}
static pl_status c_step_end(void *self, trainer *t, const tr_step_info *s) {
    counter *c = self;
    hit(c, H_STEP_END, "S");
    if (s->step != c->last_step + 1 || !s->stepped) c->steps_in_order = false;
    c->last_step = s->step;
    bool ok = s->loss && s->grad_norm && s->found_inf && pl_tensor_numel(s->loss) == 1 &&
              pl_tensor_numel(s->grad_norm) == 1 && s->loss->dtype == PL_F32 &&
              isnan(s->host_loss);
    if (!ok) c->tensors_ok = false;
    if (ok && s->step <= 64) c->gnorm[s->step - 1] = pl_tensor_item(s->grad_norm);
    return PL_OK;
}
static pl_status c_batch_end(void *self, trainer *t, const tr_step_info *s) {
    hit(self, H_BATCH_END, "B");
    return PL_OK;
}
static pl_status c_boundary(void *self, trainer *t, const tr_step_info *s) {
    hit(self, H_BOUNDARY, "K");
    return PL_OK;
}
static pl_status c_train_epoch_end(void *self, trainer *t, const tr_epoch_info *e) {
    hit(self, H_TRAIN_EPOCH_END, "T");
    return PL_OK;
}
static pl_status c_val_start(void *self, trainer *t) { hit(self, H_VAL_START, "V"); return PL_OK; }
static pl_status c_val_end(void *self, trainer *t, const pl_metrics *m, double s) {
    counter *c = self;
    hit(c, H_VAL_END, "W");
    if (c->n[H_VAL_END] == 1) {
        /* the first validation is always the best so far: the monitor ran before me,
         * and the checkpoint callback wrote best.safetensors */
        c->best_before_me = t->val_is_best && t->have_best;
        c->best_file_before_me = t->best_path[0] && access(t->best_path, R_OK) == 0;
    }
    return PL_OK;
}
static pl_status c_epoch_end(void *self, trainer *t) { hit(self, H_EPOCH_END, "X"); return PL_OK; }
static pl_status c_fit_end(void *self, trainer *t) { hit(self, H_FIT_END, "Z"); return PL_OK; }
static pl_status c_test_end(void *self, trainer *t) { hit(self, H_TEST_END, "Q"); return PL_OK; }

static tr_callback counter_cb(counter *c) {
    memset(c, 0, sizeof *c);
    c->steps_in_order = c->tensors_ok = true;
    return (tr_callback){.struct_size = sizeof(tr_callback), .name = "counter", .self = c,
                         .on_fit_start = c_fit_start, .on_epoch_start = c_epoch_start,
                         .on_loss_read = c_loss_read, .on_train_step_end = c_step_end,
                         .on_train_batch_end = c_batch_end, .on_step_boundary = c_boundary,
                         .on_train_epoch_end = c_train_epoch_end,
                         .on_validation_start = c_val_start, .on_validation_end = c_val_end,
                         .on_epoch_end = c_epoch_end, .on_fit_end = c_fit_end,
                         .on_test_end = c_test_end};
}

/* grad_norm rows of metrics.csv (log_every_n_steps = 1: one per step) */
static int grad_norm_rows(const char *name, double *out, int max) {
    char p[1200];
    run_path(p, sizeof p, name, "metrics.csv");
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        long long step, epoch;
        char key[64];
        double v;
        if (sscanf(line, "%lld,%lld,%63[^,],%lf", &step, &epoch, key, &v) == 4 &&
            !strcmp(key, "grad_norm") && step >= 1 && step <= max) {
            out[step - 1] = v;
            n++;
        }
    }
    fclose(f);
    return n;
}

START_TEST(user_callback_sees_every_hook_in_order_after_the_builtins) {
    counter c;
    tr_callback cb = counter_cb(&c);
    tr_callback *list[] = {&cb};
    tr_callbacks_set_extra(list, 1);
    const char *o[] = {"trainer.test=true"};
    int code = run("count", 1, o);
    tr_callbacks_set_extra(NULL, 0);
    ck_assert_msg(code == 0, "%s", pl_error_message());
    /* 2 epochs of 8 batches, one step each, a validation per epoch, then the test */
    const int want[H_N] = {[H_FIT_START] = 1, [H_EPOCH_START] = 2, [H_LOSS_READ] = 2 * NB,
                           [H_STEP_END] = 2 * NB, [H_BATCH_END] = 2 * NB,
                           [H_BOUNDARY] = 2 * NB, [H_TRAIN_EPOCH_END] = 2, [H_VAL_START] = 2,
                           [H_VAL_END] = 2, [H_EPOCH_END] = 2, [H_FIT_END] = 1,
                           [H_TEST_END] = 1};
    for (int h = 0; h < H_N; h++)
        ck_assert_msg(c.n[h] == want[h], "hook %d called %d times, expected %d", h, c.n[h],
                      want[h]);
    /* first calls: fit start, epoch start, step end, batch end, the read (log step 1:
     * the logging callback reads inside step end, before me: so L before S), ... */
    ck_assert_str_eq(c.order, "FELSBKTVWXZQ");
    ck_assert_str_eq(c.names, "nan_policy,logging,monitor,checkpoint,signals,throughput,counter,");
    ck_assert(c.steps_in_order);
    ck_assert_msg(c.tensors_ok, "the step's loss / grad norm / found_inf as f32 [1] device tensors");
    ck_assert(c.best_before_me);
    ck_assert(c.best_file_before_me);
    /* the device-side gradient norm handed to callbacks is the one logged */
    double logged[2 * NB];
    ck_assert_int_eq(grad_norm_rows("count", logged, 2 * NB), 2 * NB);
    for (int i = 0; i < 2 * NB; i++)
        ck_assert_msg(fabs(c.gnorm[i] - logged[i]) <= 1e-6 * fmax(1, fabs(logged[i])),
                      "step %d: grad norm %g handed, %g logged", i + 1, c.gnorm[i], logged[i]);

    /* accumulation: a step every 2 batches; batch end still every batch */
    counter c2;
    tr_callback cb2 = counter_cb(&c2);
    tr_callback *list2[] = {&cb2};
    tr_callbacks_set_extra(list2, 1);
    const char *o2[] = {"trainer.accumulate_grad_batches=2", "trainer.max_epochs=1",
                        "averager.plugin=swa", "averager.swa_start_epoch=0"};
    code = run("count_accum", 4, o2);
    tr_callbacks_set_extra(NULL, 0);
    ck_assert_msg(code == 0, "%s", pl_error_message());
    ck_assert_int_eq(c2.n[H_STEP_END], NB / 2);
    ck_assert_int_eq(c2.n[H_BOUNDARY], NB / 2);
    ck_assert_int_eq(c2.n[H_BATCH_END], NB);
    ck_assert_int_eq(c2.n[H_LOSS_READ], NB);
    ck_assert_int_eq(c2.n[H_TEST_END], 0); /* test = false */
    ck_assert_str_eq(c2.names, "nan_policy,averager,logging,monitor,checkpoint,signals,throughput,counter,");
}
END_TEST

/* ---- the built-in monitor: early stopping (Lightning) and the GAT rule ---- */

static void monitor_trainer(trainer *t, int n, const char *const *names, const bool *maxes,
                            int64_t patience) {
    memset(t, 0, sizeof *t);
    t->n_monitor = n;
    for (int k = 0; k < n; k++) {
        snprintf(t->monitors[k], sizeof t->monitors[k], "%s", names[k]);
        t->mode_maxes[k] = maxes[k];
    }
    t->early_stop = true;
    t->patience = patience;
    t->monitor = names[0];
    t->world = 1;
}

static pl_status validation(tr_callback *c, trainer *t, double loss, double acc) {
    pl_metrics m;
    pl_metrics_reset(&m);
    pl_metrics_add(&m, "loss", loss, 1);
    if (!isnan(acc)) pl_metrics_add(&m, "accuracy", acc, 1);
    return c->on_validation_end(c->self, t, &m, 0.0);
}

START_TEST(early_stopping_callback_stops_after_patience) {
    trainer t;
    tr_callback *c = NULL;
    const char *one[] = {"val_loss"};
    const bool min1[] = {false};
    monitor_trainer(&t, 1, one, min1, 2);
    PL_CK_OK(tr_cb_monitor_create(&t, &c));
    ck_assert_ptr_nonnull(c);
    /* 1.0 best; 0.9 best; 0.95, 0.92: two without improvement -> stop */
    const double seq[] = {1.0, 0.9, 0.95, 0.92};
    const bool best[] = {true, true, false, false}, stop[] = {false, false, false, true};
    for (int i = 0; i < 4; i++) {
        PL_CK_OK(validation(c, &t, seq[i], NAN));
        ck_assert_msg(t.val_is_best == best[i] && t.should_stop == stop[i],
                      "validation %d: best %d stop %d", i, t.val_is_best, t.should_stop);
    }
    ck_assert_double_eq(t.best, 0.9);
    /* a monitored metric the model does not report decides nothing */
    monitor_trainer(&t, 1, (const char *[]){"val_mrr"}, min1, 0);
    PL_CK_OK(validation(c, &t, 1.0, NAN));
    ck_assert(!t.val_is_best && !t.have_best && !t.should_stop);

    /* the GAT rule: patience resets while either metric reaches its best (ties count) */
    const char *two[] = {"val_loss", "val_accuracy"};
    const bool mm[] = {false, true};
    monitor_trainer(&t, 2, two, mm, 2);
    const double gl[] = {1.0, 0.9, 0.95, 0.95, 0.96}, ga[] = {0.5, 0.4, 0.5, 0.45, 0.44};
    const bool gstop[] = {false, false, false, false, true};
    for (int i = 0; i < 5; i++) {
        PL_CK_OK(validation(c, &t, gl[i], ga[i]));
        ck_assert_msg(t.should_stop == gstop[i], "GAT validation %d: stop %d", i, t.should_stop);
    }
    ck_assert_int_eq(t.bad_vals, 2);
    /* early_stopping = false: tracked, never stops */
    monitor_trainer(&t, 1, one, min1, 0);
    t.early_stop = false;
    for (int i = 0; i < 4; i++) PL_CK_OK(validation(c, &t, 1.0, NAN));
    ck_assert(!t.should_stop);
    ck_assert_int_eq(t.bad_vals, 3);
}
END_TEST

/* ---- the built-in NaN policy ---- */

START_TEST(nan_policy_callback_skips_counts_and_stops) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.world = 1;
    t.on_nan_skip = true;
    t.max_nan_skips = 2;
    tr_callback *c = NULL;
    PL_CK_OK(tr_cb_nan_create(&t, &c));
    tr_loss_value v = {1.5, 0, 3, 3};
    PL_CK_OK(c->on_loss_read(c->self, &t, &v));
    ck_assert_double_eq(t.last_finite_loss, 1.5);
    v.value = NAN;
    PL_CK_OK(c->on_loss_read(c->self, &t, &v)); /* skipped, 1 in a row */
    v.value = INFINITY;
    PL_CK_OK(c->on_loss_read(c->self, &t, &v)); /* 2 in a row: still allowed */
    ck_assert_int_eq(t.nan_skips, 2);
    v.value = NAN;
    v.step = 5;
    ck_assert_int_eq(c->on_loss_read(c->self, &t, &v), PL_ERR_NUMERIC);
    const char *msg = pl_error_message();
    ck_assert_msg(strstr(msg, "3 in a row") && strstr(msg, "step 5") && strstr(msg, "1.5"),
                  "message: %s", msg);
    /* a finite loss resets the count */
    t.nan_skips = 2;
    v.value = 0.25;
    PL_CK_OK(c->on_loss_read(c->self, &t, &v));
    ck_assert_int_eq(t.nan_skips, 0);
    ck_assert_double_eq(t.last_finite_loss, 0.25);
    /* on_nan = stop: the first one ends the run, naming the last finite loss */
    t.on_nan_skip = false;
    v.value = NAN;
    ck_assert_int_eq(c->on_loss_read(c->self, &t, &v), PL_ERR_NUMERIC);
    msg = pl_error_message();
    ck_assert_msg(strstr(msg, "on_nan = skip") && strstr(msg, "0.25"), "message: %s", msg);
}
END_TEST

/* ---- the EMA callback against torch's formula ---- */

#define MAXP 8

typedef struct ema_rec {
    int np;
    int64_t numel[MAXP];
    float *live[MAXP];   /* the live weights after the last step */
    float *ema[MAXP];    /* the expected average: torch's lerp in f32 */
    float *ema_best[MAXP]; /* the expected average at the best validation */
    char name[MAXP][PL_NAME_MAX];
    double decay;
    int64_t start, n_averaged;
    double val_diff, back_diff; /* params vs expected EMA at validation; vs live after */
    int vals;
    bool pending_back;
} ema_rec;

static float *host_copy(pl_tensor *p) {
    pl_frame_begin(); /* the copy belongs to the frame (hooks may run inside the trainer's) */
    pl_tensor *h = pl_tensor_to(p, PL_F32, PL_CPU);
    ck_assert_ptr_nonnull(h);
    int64_t n = pl_tensor_numel(h);
    float *out = malloc((size_t)n * sizeof(float));
    memcpy(out, pl_tensor_data(h), (size_t)n * sizeof(float));
    pl_frame_end();
    return out;
}

static double max_diff_params(trainer *t, ema_rec *r, float *const *want) {
    double d = 0;
    for (int k = 0, i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        float *h = host_copy(p->t);
        for (int64_t j = 0; j < r->numel[k]; j++) d = fmax(d, fabs((double)h[j] - want[k][j]));
        free(h);
        k++;
    }
    return d;
}

static pl_status r_step_end(void *self, trainer *t, const tr_step_info *s) {
    ema_rec *r = self;
    bool update = s->step - 1 >= r->start;
    for (int k = 0, i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        ck_assert_int_lt(k, MAXP);
        free(r->live[k]);
        r->live[k] = host_copy(p->t);
        r->numel[k] = pl_tensor_numel(p->t);
        snprintf(r->name[k], PL_NAME_MAX, "%s", p->name);
        if (update) {
            if (!r->ema[k]) r->ema[k] = calloc((size_t)r->numel[k], sizeof(float));
            float w = (float)(1.0 - r->decay);
            for (int64_t j = 0; j < r->numel[k]; j++)
                /* torch: AveragedModel copies at n_averaged 0, then
                 * _foreach_lerp_(ema, w, 1 - decay) = ema + w (w - ema) */
                r->ema[k][j] = r->n_averaged == 0 ? r->live[k][j]
                                                  : r->ema[k][j] + w * (r->live[k][j] - r->ema[k][j]);
        }
        k++;
        r->np = k;
    }
    if (update) r->n_averaged++;
    return PL_OK;
}

/* after the EMA callback's on_validation_start: the parameters are the average */
static pl_status r_val_start(void *self, trainer *t) {
    ema_rec *r = self;
    if (r->n_averaged == 0) return PL_OK;
    r->val_diff = fmax(r->val_diff, max_diff_params(t, r, r->ema));
    r->vals++;
    return PL_OK;
}

static pl_status r_val_end(void *self, trainer *t, const pl_metrics *m, double s) {
    ema_rec *r = self;
    if (t->val_is_best && r->n_averaged > 0)
        for (int k = 0; k < r->np; k++) {
            free(r->ema_best[k]);
            r->ema_best[k] = malloc((size_t)r->numel[k] * sizeof(float));
            memcpy(r->ema_best[k], r->ema[k], (size_t)r->numel[k] * sizeof(float));
        }
    r->pending_back = true;
    return PL_OK;
}

/* after a validation the live weights are back */
static pl_status r_epoch_end(void *self, trainer *t) {
    ema_rec *r = self;
    if (r->pending_back) r->back_diff = fmax(r->back_diff, max_diff_params(t, r, r->live));
    r->pending_back = false;
    return PL_OK;
}

static void ema_rec_free(ema_rec *r) {
    for (int k = 0; k < MAXP; k++) {
        free(r->live[k]);
        free(r->ema[k]);
        free(r->ema_best[k]);
    }
}

/* max |file[name] - want| over the recorded parameters, names prefixed */
static double ckpt_vs(const char *path, const char *prefix, ema_rec *r, float *const *want) {
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(path, &f));
    double d = 0;
    for (int k = 0; k < r->np; k++) {
        char n[PL_NAME_MAX + 16];
        snprintf(n, sizeof n, "%s%s", prefix, r->name[k]);
        pl_tensor *x = pl_st_load(f, n);
        ck_assert_msg(x != NULL, "%s: no tensor %s", path, n);
        const float *v = pl_tensor_f32(x);
        for (int64_t j = 0; j < r->numel[k]; j++) d = fmax(d, fabs((double)v[j] - want[k][j]));
        pl_tensor_release(x);
    }
    pl_st_close(f);
    return d;
}

static void ema_reference_on(const char *device) {
    char name[64], dev[64];
    snprintf(name, sizeof name, "ema_%s", device);
    snprintf(dev, sizeof dev, "pipeline.device=%s", device);
    ema_rec r;
    memset(&r, 0, sizeof r);
    r.decay = 0.9;
    r.start = 3;
    tr_callback cb = {.struct_size = sizeof(tr_callback), .name = "recorder", .self = &r,
                      .on_train_step_end = r_step_end, .on_validation_start = r_val_start,
                      .on_validation_end = r_val_end, .on_epoch_end = r_epoch_end};
    tr_callback *list[] = {&cb};
    tr_callbacks_set_extra(list, 1);
    const char *o[] = {dev, "trainer.ema_decay=0.9", "trainer.ema_start_step=3",
                       "trainer.max_epochs=3", "trainer.test=true"};
    int code = run(name, 5, o);
    tr_callbacks_set_extra(NULL, 0);
    ck_assert_msg(code == 0, "%s: %s", device, pl_error_message());
    ck_assert_int_eq(r.n_averaged, 3 * NB - 3); /* steps 3 .. 23 (0-based) */
    ck_assert_int_gt(r.np, 0);
    /* the average after N steps is torch's, in the last checkpoint's state */
    char p[1200];
    run_path(p, sizeof p, name, "checkpoints/last.safetensors");
    double d = ckpt_vs(p, "ema.avg.", &r, r.ema);
    ck_assert_msg(d <= 1e-6, "%s: ema.avg differs from the torch formula by %g", device, d);
    pl_st_file *f = NULL;
    PL_CK_OK(pl_st_open(p, &f));
    ck_assert_str_eq(pl_st_meta(f, "ema.n_averaged"), "21");
    ck_assert_str_eq(pl_st_meta(f, "ema.swapped"), "0");
    pl_st_close(f);
    /* and the live weights are the live ones */
    d = ckpt_vs(p, "", &r, r.live);
    ck_assert_msg(d == 0, "%s: last holds other live weights (%g)", device, d);
    /* validation ran on the average, and the live weights came back after it */
    ck_assert_int_eq(r.vals, 3);
    ck_assert_msg(r.val_diff <= 1e-6, "%s: validated weights differ from the EMA by %g", device,
                  r.val_diff);
    ck_assert_msg(r.back_diff == 0, "%s: live weights not restored (%g)", device, r.back_diff);
    /* the best checkpoint holds the averaged weights validated */
    run_path(p, sizeof p, name, "checkpoints/best.safetensors");
    ck_assert_ptr_nonnull(r.ema_best[0]);
    d = ckpt_vs(p, "", &r, r.ema_best);
    ck_assert_msg(d <= 1e-6, "%s: best differs from the EMA validated by %g", device, d);
    /* the final average, evaluated after the test and saved */
    run_path(p, sizeof p, name, "checkpoints/ema.safetensors");
    d = ckpt_vs(p, "", &r, r.ema);
    ck_assert_msg(d <= 1e-6, "%s: ema.safetensors differs from the final EMA by %g", device, d);
    run_path(p, sizeof p, name, "log.txt");
    char *log = slurp(p);
    ck_assert_msg(strstr(log, "ema_test_loss") && strstr(log, "ema_val_loss"), "log: %s", log);
    free(log);
    ema_rec_free(&r);
}

START_TEST(ema_matches_torch_formula_and_validates_the_average_cpu) { ema_reference_on("cpu"); }
END_TEST

START_TEST(ema_matches_torch_formula_and_validates_the_average_strict) {
    ema_reference_on("strict");
}
END_TEST

/* ema_validate = false: validation (and best) on the live weights; resume
 * restores the average; a non-logged step with the EMA on reads nothing
 * back and allocates nothing on the strict device */
START_TEST(ema_state_resumes_and_quiet_steps_stay_on_the_device) {
    const char *o[] = {"pipeline.device=strict", "trainer.ema_decay=0.5",
                       "trainer.max_epochs=4", "trainer.log_every_n_steps=3",
                       "scheduler.plugin=constant"};
    ck_assert_msg(run("ema_quiet", 5, o) == 0, "%s", pl_error_message());
    char p[1200];
    run_path(p, sizeof p, "ema_quiet", "summary.json");
    char *js = slurp(p);
    const char *ds = strstr(js, "\"device_stats\"");
    ck_assert_ptr_nonnull(ds);
    const char *steps = strstr(ds, "\"steps\":"), *reads = strstr(ds, "\"host_reads_max\":"),
               *allocs = strstr(ds, "\"allocations_max\":");
    ck_assert(steps && reads && allocs);
    ck_assert_msg(atof(steps + 8) > 0, "no quiet steps measured: %.300s", ds);
    ck_assert_msg(atof(reads + 17) == 0 && atof(allocs + 18) == 0,
                  "quiet steps with the EMA on: %.400s", ds);
    free(js);

    /* 2 epochs, then resume to 4: the same average and weights as the straight run */
    const char *o2[] = {"pipeline.device=strict", "trainer.ema_decay=0.5",
                        "trainer.max_epochs=2", "trainer.log_every_n_steps=3",
                        "scheduler.plugin=constant", "trainer.ema_validate=false"};
    ck_assert_msg(run("ema_half", 6, o2) == 0, "%s", pl_error_message());
    char last[1200];
    run_path(last, sizeof last, "ema_half", "checkpoints/last.safetensors");
    char resumed_from[1200];
    ck_assert_ptr_nonnull(realpath(last, resumed_from));
    const char *o3[] = {"pipeline.device=strict", "trainer.ema_decay=0.5",
                        "trainer.max_epochs=4", "trainer.log_every_n_steps=3",
                        "scheduler.plugin=constant", "trainer.ema_validate=false"};
    ck_assert_msg(run_r("ema_half", 6, o3, resumed_from) == 0, "%s", pl_error_message());
    const char *o4[] = {"pipeline.device=strict", "trainer.ema_decay=0.5",
                        "trainer.max_epochs=4", "trainer.log_every_n_steps=3",
                        "scheduler.plugin=constant", "trainer.ema_validate=false"};
    ck_assert_msg(run("ema_straight", 6, o4) == 0, "%s", pl_error_message());
    char a[1200], b[1200];
    run_path(a, sizeof a, "ema_half", "checkpoints/last.safetensors");
    run_path(b, sizeof b, "ema_straight", "checkpoints/last.safetensors");
    pl_st_file *fa = NULL, *fb = NULL;
    PL_CK_OK(pl_st_open(a, &fa));
    PL_CK_OK(pl_st_open(b, &fb));
    ck_assert_str_eq(pl_st_meta(fa, "ema.n_averaged"), "32");
    ck_assert_str_eq(pl_st_meta(fb, "ema.n_averaged"), "32");
    int compared = 0;
    for (int i = 0; i < pl_st_count(fb); i++) {
        const char *n = pl_st_name_at(fb, i);
        pl_tensor *x = pl_st_load(fa, n), *y = pl_st_load(fb, n);
        ck_assert_msg(x && y, "tensor %s", n);
        ck_assert_int_eq(pl_tensor_numel(x), pl_tensor_numel(y));
        ck_assert_msg(memcmp(pl_tensor_data(x), pl_tensor_data(y), pl_tensor_nbytes(x)) == 0,
                      "%s differs between the resumed and the straight run", n);
        compared += strncmp(n, "ema.avg.", 8) == 0;
        pl_tensor_release(x);
        pl_tensor_release(y);
    }
    ck_assert_int_gt(compared, 0);
    pl_st_close(fa);
    pl_st_close(fb);
    /* a resume of a checkpoint without the EMA's state is refused, naming the key */
    const char *o5[] = {"pipeline.device=strict", "trainer.ema_decay=0.5", "trainer.max_epochs=3"};
    char nolast[1200];
    run_path(last, sizeof last, "count", "checkpoints/last.safetensors");
    ck_assert_ptr_nonnull(realpath(last, nolast));
    ck_assert_int_ne(run_r("ema_refused", 3, o5, nolast), 0);
    ck_assert_msg(strstr(pl_error_message(), "ema.n_averaged"), "message: %s", pl_error_message());
}
END_TEST

/* cb_throughput.c: after 5 warm-up steps the steady window covers the other
 * 2 * NB - 5 steps (epoch 0's rest, then epoch 1 whole); every batch holds
 * BATCH samples, so samples/s times s/step is BATCH exactly when the window's
 * samples and steps were counted right. */
START_TEST(steady_throughput_is_measured_after_the_warm_up) {
    const char *o[] = {"pipeline.device=strict"};
    ck_assert_msg(run("steady", 1, o) == 0, "%s", pl_error_message());
    char p[1200];
    run_path(p, sizeof p, "steady", "summary.json");
    char *js = slurp(p);
    const char *a = strstr(js, "\"steady_seconds_per_step\":"),
               *b = strstr(js, "\"steady_samples_per_second\":");
    ck_assert_msg(a && b, "summary.json lacks the steady figures: %.400s", js);
    double sps = atof(strchr(a, ':') + 1), sams = atof(strchr(b, ':') + 1);
    free(js);
    ck_assert_msg(sps > 0 && sams > 0, "steady %g s/step, %g samples/s", sps, sams);
    ck_assert_msg(fabs(sps * sams - BATCH) <= 1e-6 * BATCH,
                  "samples per steady step %g, expected %d", sps * sams, BATCH);
}
END_TEST

int main(void) {
    setup();
    Suite *s = suite_create("callbacks");
    TCase *tc = tcase_create("callbacks");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, user_callback_sees_every_hook_in_order_after_the_builtins);
    tcase_add_test(tc, steady_throughput_is_measured_after_the_warm_up);
    tcase_add_test(tc, early_stopping_callback_stops_after_patience);
    tcase_add_test(tc, nan_policy_callback_skips_counts_and_stops);
    tcase_add_test(tc, ema_matches_torch_formula_and_validates_the_average_cpu);
    tcase_add_test(tc, ema_matches_torch_formula_and_validates_the_average_strict);
    tcase_add_test(tc, ema_state_resumes_and_quiet_steps_stay_on_the_device);
    suite_add_tcase(s, tc);
    return pl_test_run(s);
}
