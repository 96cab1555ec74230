/* trainer.c - the training loop: fit (train + validate), test, export,
 * checkpoints and resume, metrics, progress and the run report.
 *
 * Semantics follow PyTorch Lightning's Trainer where it has the same thing:
 *  - accumulate_grad_batches = k: each micro-batch's loss is scaled by 1/k,
 *    gradients accumulate, the optimizer steps every k micro-batches and at
 *    the end of the epoch (Lightning's behaviour for a trailing remainder).
 *  - gradient_clip_val with algorithm norm = torch.nn.utils.clip_grad_norm_
 *    over every trainable parameter (coef = max_norm / (norm + 1e-6), clamped
 *    to 1), or value = clip_grad_value_.
 *  - Learning rate of group g for optimizer step s (0-based):
 *      lr = g.initial_lr * prod over schedulers k of k.lr_factor(s)
 *    (every [scheduler*] section, in file order; `plateau` is stepped after
 *    each validation); an averager (SWALR) may override the product once its
 *    phase starts; a scheduler may also drive named optimizer
 *    hyper-parameters (onecycle's momentum).
 *  - Metrics a model reports as "loss", "accuracy", ... are logged as
 *    "train_loss", "val_loss", "val_accuracy", "test_..."; `monitor` names one.
 *  - Early stopping = Lightning's EarlyStopping (improvement: better than the
 *    best by more than min_delta; patience counts validations).
 * Dropout / init randomness is counter-based (seed, step), so resuming from a
 * checkpoint continues bit-identically: one written at an epoch boundary, or
 * one written mid-epoch (checkpoint_every_n_train_steps, a best checkpoint of
 * a mid-epoch validation), which also records the batch position and the
 * epoch's running train-loss sums; a loader's batch order is a pure function
 * of (seed, epoch), so epoch_begin(train, epoch, batch) continues the epoch.
 * Mid-epoch checkpoints are taken at optimizer-step boundaries, so no
 * partial gradient accumulation is pending.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "pipeline/nf4.h"
#include "backend_loader.h"
#include "runobjs.h"
#include "trainer.h"

#define CKPT_FORMAT "pipeline-checkpoint-1"

typedef struct stage {
    const char *section;
    const pl_plugin_desc *desc;
    const pl_config_section *cfg;
    const void *vt;
    void *self;
} stage;

typedef struct phase_time {
    double seconds;
    size_t peak_bytes;
} phase_time;

typedef struct trainer {
    pl_config *cfg;
    pl_registry *reg;
    const pl_run_options *opts;
    const pl_config_section *pipe, *tr;
    pl_run_context ctx;
    char run_dir[PATH_MAX];
    char name[128];
    stage loader, model, optim, avg, prec;
    stage sched[PL_MAX_SCHEDULERS]; /* every [scheduler*] section, file order */
    int n_sched;
    FILE *log, *metrics;
    bool tty;

    /* settings */
    int64_t max_epochs, max_steps, accum, log_every;
    double clip;
    bool clip_norm, early_stop, mode_max, on_nan_skip, save_last, save_best, do_test, do_export;
    double min_delta;
    int64_t patience, val_every_epochs, ckpt_every, ckpt_every_steps;
    double limit[PL_SPLIT_COUNT];
    double val_interval;
    const char *monitor;

    /* state (saved in checkpoints) */
    int64_t epoch, step, micro;
    int64_t batch;         /* next batch of `epoch` (0: at an epoch boundary) */
    int64_t accum_pending; /* micro-batches accumulated since the last step */
    double ep_loss_sum;    /* the epoch's train-loss sum and count so far */
    int64_t ep_loss_n;
    double best;
    int64_t bad_vals;
    bool have_best;
    double last_finite_loss;

    /* report */
    double t_start, fit_s, test_s, export_s;
    double *epoch_s;
    int64_t n_epoch_s;
    phase_time ph_fit, ph_test, ph_export;
    pl_metrics last_val, test_metrics, avg_test_metrics;
    bool have_test, have_avg_test;
    char best_path[PATH_MAX], last_path[PATH_MAX], outputs_path[PATH_MAX];
    double train_samples, train_seconds, data_wait;
    size_t frozen_bytes, trainable_bytes; /* parameter storage after precision setup */
    bool stopped_early;
} trainer;

/* ---- small utilities ------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void logf_(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (t->tty) fputs("\r\033[K", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (t->log) {
        va_start(ap, fmt);
        vfprintf(t->log, fmt, ap);
        va_end(ap);
        fflush(t->log);
    }
}

static int mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
    return 0;
}

static void metric_row(trainer *t, const char *key, double v) {
    if (t->metrics) fprintf(t->metrics, "%lld,%lld,%s,%.9g\n", (long long)t->step,
                            (long long)t->epoch, key, v);
}

static int64_t limit_batches(double lim, int64_t n) {
    if (lim < 0) return n;
    if (lim <= 1.0 && lim != floor(lim)) return (int64_t)floor(lim * (double)n);
    if (lim == 1.0) return n; /* 1.0 = all (Lightning: float 1.0 means 100 %) */
    return (int64_t)lim < n ? (int64_t)lim : n;
}

const char *pl_trainer_latest_dir(const pl_config *cfg, char *buf, size_t n) {
    const pl_config_section *p = pl_config_section_get(cfg, "pipeline");
    const char *rd = pl_cfg_str(p, "run_dir", "runs");
    const char *name = pl_cfg_str(p, "name", "");
    char stem[128];
    if (!name[0]) {
        const char *path = pl_config_path(cfg), *b = strrchr(path, '/');
        snprintf(stem, sizeof stem, "%s", b ? b + 1 : path);
        char *dot = strrchr(stem, '.');
        if (dot) *dot = 0;
        name = stem;
    }
    snprintf(buf, n, "%s/%s/latest", rd, name);
    return buf;
}

/* ---- stages ------------------------------------------------------------------ */

/* Name of the first required vtable member that is NULL, or NULL. */
static const char *missing_member(pl_plugin_kind kind, const void *vt) {
#define REQ(type, member)                                                                          \
    if (!((const type *)vt)->member) return #member
    switch (kind) {
    case PL_KIND_LOADER:
        REQ(pl_loader_vtable, epoch_begin);
        REQ(pl_loader_vtable, next);
        REQ(pl_loader_vtable, num_batches);
        REQ(pl_loader_vtable, batch_fields);
        break;
    case PL_KIND_MODEL:
        REQ(pl_model_vtable, forward);
        REQ(pl_model_vtable, batch_needs);
        break;
    case PL_KIND_OPTIMIZER:
        REQ(pl_optimizer_vtable, num_groups);
        REQ(pl_optimizer_vtable, group);
        REQ(pl_optimizer_vtable, step);
        break;
    case PL_KIND_SCHEDULER:
        REQ(pl_scheduler_vtable, lr_factor);
        break;
    case PL_KIND_AVERAGER:
        REQ(pl_averager_vtable, update);
        REQ(pl_averager_vtable, swap);
        REQ(pl_averager_vtable, has_average);
        break;
    case PL_KIND_PRECISION:
        REQ(pl_precision_vtable, setup);
        REQ(pl_precision_vtable, loss_scale);
        break;
    default:
        break;
    }
#undef REQ
    return NULL;
}

static pl_status stage_create(trainer *t, stage *s, const char *section) {
    s->section = section;
    s->cfg = pl_config_section_get(t->cfg, section);
    s->desc = pl_config_plugin(t->cfg, section);
    if (!s->cfg || !s->desc) return PL_OK; /* optional stage absent */
    s->vt = s->desc->vtable;
    /* every kind's vtable starts with create and destroy; refuse a plugin
     * that leaves them out instead of crashing on it */
    if (!s->vt || !((void *const *)s->vt)[0] || !((void *const *)s->vt)[1])
        return pl_error_set(PL_ERR_ABI, "[%s] plugin '%s' (%s) has no %s; it cannot run as a "
                            "%s stage", section, s->desc->name,
                            pl_config_plugin_path(t->cfg, section),
                            !s->vt ? "vtable" : "create/destroy function",
                            pl_plugin_kind_name(s->desc->kind));
    /* every kind's vtable starts with create(cfg, ctx, &self) */
    const char *missing = missing_member(s->desc->kind, s->vt);
    if (missing)
        return pl_error_set(PL_ERR_ABI, "[%s] plugin '%s' (%s): required function '%s' of a %s "
                            "vtable is NULL", section, s->desc->name,
                            pl_config_plugin_path(t->cfg, section), missing,
                            pl_plugin_kind_name(s->desc->kind));
    typedef pl_status (*create_fn)(const pl_config_section *, pl_run_context *, void **);
    create_fn create = *(const create_fn *)s->vt;
    pl_status st = create(s->cfg, &t->ctx, &s->self);
    if (st)
        return pl_error_prefix(st, "[%s] plugin '%s' (%s)", section, s->desc->name,
                               pl_config_plugin_path(t->cfg, section));
    return PL_OK;
}

static void stage_destroy(stage *s) {
    if (!s->desc || !s->self) return;
    typedef void (*destroy_fn)(void *);
    destroy_fn d = ((const destroy_fn *)s->vt)[1];
    if (d) d(s->self);
    s->self = NULL;
}

#define LOADER(t) ((const pl_loader_vtable *)(t)->loader.vt)
#define MODEL(t) ((const pl_model_vtable *)(t)->model.vt)
#define OPTIM(t) ((const pl_optimizer_vtable *)(t)->optim.vt)
#define SCHED(s) ((const pl_scheduler_vtable *)(s)->vt)
#define AVG(t) ((const pl_averager_vtable *)(t)->avg.vt)
#define PREC(t) ((const pl_precision_vtable *)(t)->prec.vt)

/* ---- checkpoints --------------------------------------------------------------- */

typedef struct ckpt_io {
    const char *prefix;
    pl_st_writer *w; /* saving */
    pl_st_file *f;   /* loading */
    const char *path;
} ckpt_io;

static pl_status ck_tensor(void *ctx, const char *name, pl_tensor *tt) {
    ckpt_io *io = ctx;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", io->prefix, name);
    if (io->w) return pl_st_writer_add(io->w, full, tt);
    pl_status s = pl_st_load_into(io->f, full, tt);
    return s ? pl_error_prefix(s, "checkpoint %s", io->path) : PL_OK;
}

static pl_status ck_scalar(void *ctx, const char *name, double *v) {
    ckpt_io *io = ctx;
    char full[256], buf[64];
    snprintf(full, sizeof full, "%s.%s", io->prefix, name);
    if (io->w) {
        snprintf(buf, sizeof buf, "%.17g", *v);
        return pl_st_writer_meta(io->w, full, buf);
    }
    const char *s = pl_st_meta(io->f, full);
    if (!s)
        return pl_error_set(PL_ERR_IO, "checkpoint %s: metadata '%s' missing (checkpoint from another "
                            "configuration?)", io->path, full);
    char *end;
    *v = strtod(s, &end);
    if (end == s || *end)
        return pl_error_set(PL_ERR_IO, "checkpoint %s: metadata '%s' = '%s'; expected a number "
                            "(corrupt checkpoint?)", io->path, full, s);
    return PL_OK;
}

typedef pl_status (*state_fn)(void *self, const pl_state_visitor *v);

static pl_status visit_stage(stage *s, size_t state_offset, ckpt_io *io) {
    if (!s->desc || !s->self) return PL_OK;
    state_fn fn = *(const state_fn *)((const char *)s->vt + state_offset);
    if (!fn) return PL_OK;
    io->prefix = s->section;
    pl_state_visitor v = {io, ck_tensor, ck_scalar, .loading = io->f != NULL};
    return fn(s->self, &v);
}

static pl_status visit_all_state(trainer *t, ckpt_io *io) {
    pl_status st = PL_OK;
    if (!st) st = visit_stage(&t->optim, offsetof(pl_optimizer_vtable, state), io);
    for (int k = 0; k < t->n_sched && !st; k++)
        st = visit_stage(&t->sched[k], offsetof(pl_scheduler_vtable, state), io);
    if (!st) st = visit_stage(&t->avg, offsetof(pl_averager_vtable, state), io);
    if (!st) st = visit_stage(&t->prec, offsetof(pl_precision_vtable, state), io);
    return st;
}

static pl_status save_checkpoint(trainer *t, const char *path) {
    pl_st_writer *w = pl_st_writer_new(path);
    if (!w) return pl_error_status();
    pl_status st = PL_OK;
    for (int i = 0; i < pl_params_count(t->ctx.params) && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        st = pl_st_writer_add(w, p->name, p->t);
    }
    ckpt_io io = {.w = w, .path = path};
    if (!st) st = visit_all_state(t, &io);
    char buf[64];
#define META(k, fmt, v)                                                                            \
    do {                                                                                           \
        snprintf(buf, sizeof buf, fmt, v);                                                         \
        if (!st) st = pl_st_writer_meta(w, k, buf);                                                \
    } while (0)
    META("format", "%s", CKPT_FORMAT);
    META("epoch", "%lld", (long long)t->epoch);
    META("step", "%lld", (long long)t->step);
    META("micro_step", "%lld", (long long)t->micro);
    META("batch_in_epoch", "%lld", (long long)t->batch);
    META("accumulation_pending", "%lld", (long long)t->accum_pending);
    META("epoch_train_loss_sum", "%.17g", t->ep_loss_sum);
    META("epoch_train_loss_count", "%lld", (long long)t->ep_loss_n);
    META("last_finite_loss", "%.17g", t->last_finite_loss);
    META("best", "%.17g", t->best);
    META("have_best", "%d", (int)t->have_best);
    META("bad_vals", "%lld", (long long)t->bad_vals);
    META("seed", "%llu", (unsigned long long)t->ctx.seed);
    META("config_hash", "%016llx", (unsigned long long)pl_config_hash(t->cfg));
    META("model", "%s", t->model.desc->name);
#undef META
    if (!st) st = pl_st_writer_commit(w);
    pl_st_writer_free(w);
    return st;
}

/* Checkpoint metadata is untrusted text: a value is read whole or refused,
 * naming the file and the key. The first error sticks in `st` (later reads
 * return their defaults), so a loader reads everything and checks once. */
typedef struct meta_reader {
    const pl_st_file *f;
    const char *path;
    pl_status st;
} meta_reader;

/* Integer >= 0; `dflt` when the key is absent (checkpoints older than it). */
static int64_t meta_i64(meta_reader *r, const char *key, int64_t dflt) {
    const char *s = r->st ? NULL : pl_st_meta(r->f, key);
    if (!s) return dflt;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < 0) {
        r->st = pl_error_set(PL_ERR_IO, "checkpoint %s: metadata '%s' = '%s'; expected an integer >= 0 "
                             "(corrupt checkpoint?)", r->path, key, s);
        return dflt;
    }
    return v;
}

/* Any number strtod reads whole (inf/nan included: `best` may be either). */
static double meta_f64(meta_reader *r, const char *key, double dflt) {
    const char *s = r->st ? NULL : pl_st_meta(r->f, key);
    if (!s) return dflt;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) {
        r->st = pl_error_set(PL_ERR_IO, "checkpoint %s: metadata '%s' = '%s'; expected a number "
                             "(corrupt checkpoint?)", r->path, key, s);
        return dflt;
    }
    return v;
}

/* Load parameters (all must be present unless weights_only) and, for a
 * resume, every stage's state and the loop counters. */
static pl_status load_checkpoint(trainer *t, const char *path, bool weights_only) {
    pl_st_file *f = NULL;
    pl_status st = pl_st_open(path, &f);
    if (st) return st;
    int loaded = 0, missing = 0;
    char first_missing[PL_NAME_MAX] = "";
    for (int i = 0; i < pl_params_count(t->ctx.params) && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        pl_dtype dt;
        int nd;
        int64_t sh[PL_MAX_DIMS];
        if (pl_st_info(f, p->name, &dt, &nd, sh)) {
            pl_error_clear();
            if (!first_missing[0]) snprintf(first_missing, sizeof first_missing, "%s", p->name);
            missing++;
            continue;
        }
        /* the precision stage loads into the form it keeps (a quantized
         * base, say); without one, a plain load with float conversions */
        if (t->prec.self && PREC(t)->load_param)
            st = PREC(t)->load_param(t->prec.self, f, path, p);
        else
            st = pl_st_load_into(f, p->name, p->t);
        if (st && !strstr(pl_error_message(), path)) pl_error_prefix(st, "checkpoint %s", path);
        loaded++;
    }
    if (!st && !weights_only && missing)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: parameter '%s' missing (%d of %d missing; "
                          "checkpoint of another model?)", path, first_missing, missing,
                          pl_params_count(t->ctx.params));
    if (!st && loaded == 0)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: none of the model's %d parameters is in it "
                          "(first expected: '%s')", path, pl_params_count(t->ctx.params),
                          first_missing);
    if (!st && weights_only)
        logf_(t, "loaded %d parameter tensors from %s (%d not in the file keep their init)\n",
              loaded, path, missing);
    if (!st && !weights_only) {
        const char *fmt = pl_st_meta(f, "format");
        if (!fmt || strcmp(fmt, CKPT_FORMAT))
            st = pl_error_set(PL_ERR_IO, "checkpoint %s: format '%s', expected '%s'", path,
                              fmt ? fmt : "(none)", CKPT_FORMAT);
        const char *model = pl_st_meta(f, "model");
        if (!st && model && strcmp(model, t->model.desc->name))
            st = pl_error_set(PL_ERR_IO, "checkpoint %s was written by model '%s', this run's "
                              "model is '%s'", path, model, t->model.desc->name);
        /* mid-epoch: the loop position; absent in checkpoints older than it */
        meta_reader mr = {f, path, st};
        int64_t epoch = meta_i64(&mr, "epoch", 0), batch = meta_i64(&mr, "batch_in_epoch", 0);
        int64_t acc = meta_i64(&mr, "accumulation_pending", 0);
        st = mr.st;
        if (!st && batch > 0 && acc > 0)
            st = pl_error_set(PL_ERR_IO, "checkpoint %s was written by a validation in the middle of "
                              "a gradient accumulation (epoch %lld, before batch %lld, %lld "
                              "micro-batches accumulated); their gradients are not saved, so "
                              "training cannot continue exactly from it: resume from "
                              "last.safetensors or a step-N checkpoint, or load its weights with "
                              "[trainer] init_from", path, (long long)epoch, (long long)batch,
                              (long long)acc);
        ckpt_io io = {.f = f, .path = path};
        if (!st) st = visit_all_state(t, &io);
        if (!st) {
            t->epoch = epoch;
            t->step = meta_i64(&mr, "step", 0);
            t->micro = meta_i64(&mr, "micro_step", 0);
            t->batch = batch;
            t->accum_pending = 0;
            t->ep_loss_sum = batch > 0 ? meta_f64(&mr, "epoch_train_loss_sum", 0) : 0;
            t->ep_loss_n = batch > 0 ? meta_i64(&mr, "epoch_train_loss_count", 0) : 0;
            t->last_finite_loss = meta_f64(&mr, "last_finite_loss", 0);
            t->best = meta_f64(&mr, "best", 0);
            t->have_best = meta_i64(&mr, "have_best", 0) != 0;
            t->bad_vals = meta_i64(&mr, "bad_vals", 0);
            st = mr.st;
        }
    }
    pl_st_close(f);
    if (!st && MODEL(t)->on_load) st = MODEL(t)->on_load(t->model.self);
    return st;
}

/* After a resume: the best checkpoint so far is the earlier run's
 * best.safetensors next to the resumed file, if that file is the one the
 * restored best value came from (same monitor value, written at or before
 * the resumed step; a later best of the earlier run is not ours). Test then
 * uses it unless this run finds a better one (Lightning restores
 * ModelCheckpoint.best_model_path the same way). */
static void adopt_earlier_best(trainer *t, const char *resumed) {
    if (!t->have_best || !t->save_best) return;
    char dir[PATH_MAX], cand[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s", resumed);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    snprintf(cand, sizeof cand, "%s/best.safetensors", dir);
    if (access(cand, R_OK) != 0) return;
    pl_st_file *f = NULL;
    if (pl_st_open(cand, &f)) {
        pl_error_clear();
        return;
    }
    const char *b = pl_st_meta(f, "best");
    char want[64];
    snprintf(want, sizeof want, "%.17g", t->best);
    meta_reader mr = {f, cand, PL_OK};
    bool same = b && !strcmp(b, want) && meta_i64(&mr, "step", INT64_MAX) <= t->step && !mr.st;
    if (mr.st) pl_error_clear(); /* not a usable best: test uses this run's weights */
    pl_st_close(f);
    if (!same) return;
    snprintf(t->best_path, sizeof t->best_path, "%s", cand);
    logf_(t, "best checkpoint so far: %s (%s = %.5f)\n", cand, t->monitor, t->best);
}

/* ---- optimization step -------------------------------------------------------------- */

static double grad_norm_and_clip(trainer *t) {
    double total = 0;
    int n = pl_params_count(t->ctx.params);
    for (int i = 0; i < n; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad || !p->t->grad) continue;
        const float *g = pl_tensor_data(p->t->grad);
        int64_t m = pl_tensor_numel(p->t->grad);
        double s = 0;
#pragma omp parallel for reduction(+ : s) if (m > 65536)
        for (int64_t j = 0; j < m; j++) s += (double)g[j] * g[j];
        total += s;
    }
    double norm = sqrt(total);
    if (t->clip > 0) {
        for (int i = 0; i < n; i++) {
            pl_param *p = pl_params_at(t->ctx.params, i);
            if (!p->t->requires_grad || !p->t->grad) continue;
            float *g = pl_tensor_data(p->t->grad);
            int64_t m = pl_tensor_numel(p->t->grad);
            if (t->clip_norm) {
                double coef = t->clip / (norm + 1e-6);
                if (coef < 1.0)
                    for (int64_t j = 0; j < m; j++) g[j] = (float)(g[j] * coef);
            } else {
                float c = (float)t->clip;
                for (int64_t j = 0; j < m; j++) g[j] = g[j] > c ? c : (g[j] < -c ? -c : g[j]);
            }
        }
    }
    return norm;
}

static void zero_grads(trainer *t) {
    for (int i = 0; i < pl_params_count(t->ctx.params); i++)
        pl_tensor_zero_grad(pl_params_at(t->ctx.params, i)->t);
}

/* The product of every scheduler's factor for the current step, unless the
 * averager overrides it (SWALR). */
static double current_factor(trainer *t) {
    double f = 1.0;
    for (int k = 0; k < t->n_sched; k++)
        f *= SCHED(&t->sched[k])->lr_factor(t->sched[k].self, t->step);
    if (t->avg.self && AVG(t)->lr_factor) {
        double o = AVG(t)->lr_factor(t->avg.self, t->epoch, t->step, f);
        if (!isnan(o)) f = o;
    }
    return f;
}

/* Set every group's lr and let schedulers drive their hyper-parameters;
 * returns group 0's lr (logged). */
static double apply_lr(trainer *t) {
    double f = current_factor(t);
    double lr0 = NAN;
    int ng = OPTIM(t)->num_groups(t->optim.self);
    for (int g = 0; g < ng; g++) {
        pl_param_group *pg = OPTIM(t)->group(t->optim.self, g);
        pg->lr = pg->initial_lr * f;
        for (int k = 0; k < t->n_sched; k++)
            if (SCHED(&t->sched[k])->drive) SCHED(&t->sched[k])->drive(t->sched[k].self, t->step, pg);
        if (g == 0) lr0 = pg->lr;
    }
    return lr0;
}

static pl_status optimizer_step(trainer *t, double *gnorm, double *lr) {
    bool do_step = true;
    if (t->prec.self && PREC(t)->before_step)
        do_step = PREC(t)->before_step(t->prec.self, t->ctx.params);
    *gnorm = grad_norm_and_clip(t);
    *lr = apply_lr(t);
    pl_status st = PL_OK;
    if (do_step) {
        st = OPTIM(t)->step(t->optim.self);
        if (!st && t->prec.self && PREC(t)->after_step)
            st = PREC(t)->after_step(t->prec.self, t->ctx.params);
    }
    zero_grads(t);
    t->step++;
    if (!st && t->avg.self) st = AVG(t)->update(t->avg.self, t->epoch, t->step);
    return st;
}

/* ---- evaluation ------------------------------------------------------------------------ */

static pl_status evaluate(trainer *t, pl_data_split split, pl_metrics *m, double lim) {
    pl_metrics_reset(m);
    const pl_loader_vtable *L = LOADER(t);
    pl_status st = L->epoch_begin(t->loader.self, split, 0, 0);
    if (st) return st;
    int64_t nb = limit_batches(lim, L->num_batches(t->loader.self, split));
    pl_no_grad_begin();
    pl_batch b;
    for (int64_t i = 0; i < nb && !st; i++) {
        int r = L->next(t->loader.self, &b);
        if (r < 0) st = pl_error_status();
        if (r <= 0) break;
        pl_frame_begin();
        pl_tensor *loss = NULL;
        st = MODEL(t)->forward(t->model.self, &b, split, false, &loss, m);
        pl_frame_end();
    }
    pl_no_grad_end();
    pl_tape_clear();
    return st;
}

static void print_metrics(trainer *t, const char *prefix, const pl_metrics *m) {
    for (int i = 0; i < m->n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s_%s", prefix, m->name[i]);
        double v = m->count[i] ? m->sum[i] / m->count[i] : NAN;
        logf_(t, "%s%s %.5f", i ? "  " : "  ", key, v);
        metric_row(t, key, v);
    }
    logf_(t, "\n");
}

static double monitored(trainer *t, const pl_metrics *val, bool *found) {
    const char *mon = t->monitor;
    *found = false;
    if (strncmp(mon, "val_", 4) != 0) return NAN;
    double v = pl_metrics_get(val, mon + 4);
    *found = !isnan(v);
    return v;
}

static pl_status validate(trainer *t, bool *stop) {
    double t0 = now_s();
    pl_status st = evaluate(t, PL_SPLIT_VAL, &t->last_val, t->limit[PL_SPLIT_VAL]);
    if (st) return st;
    logf_(t, "epoch %lld step %lld validation (%.1fs):", (long long)t->epoch, (long long)t->step,
          now_s() - t0);
    print_metrics(t, "val", &t->last_val);
    bool found;
    double v = monitored(t, &t->last_val, &found);
    if (!found) return PL_OK;
    for (int k = 0; k < t->n_sched; k++)
        if (SCHED(&t->sched[k])->on_validation)
            SCHED(&t->sched[k])->on_validation(t->sched[k].self, v);
    bool better_best = !t->have_best || (t->mode_max ? v > t->best : v < t->best);
    bool improved = !t->have_best ||
                    (t->mode_max ? v > t->best + t->min_delta : v < t->best - t->min_delta);
    if (improved)
        t->bad_vals = 0;
    else
        t->bad_vals++;
    if (better_best) {
        t->best = v;
        t->have_best = true;
        if (t->save_best) {
            snprintf(t->best_path, sizeof t->best_path, "%s/checkpoints/best.safetensors",
                     t->run_dir);
            st = save_checkpoint(t, t->best_path);
        }
    }
    if (t->early_stop && t->bad_vals >= t->patience) {
        logf_(t, "early stopping: %s did not improve for %lld validations (best %.5f)\n",
              t->monitor, (long long)t->bad_vals, t->best);
        *stop = true;
    }
    return st;
}

/* Bytes of frozen and trainable parameter storage as the precision stage
 * left them (nf4: packed codes plus quantization constants). */
static void count_parameter_bytes(trainer *t) {
    t->frozen_bytes = t->trainable_bytes = 0;
    for (int i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_tensor *p = pl_params_at(t->ctx.params, i)->t;
        size_t b = pl_tensor_nbytes(p);
        if (p->dtype == PL_NF4) b = pl_nf4_code_nbytes(p) + pl_nf4_state_nbytes(p);
        if (p->requires_grad)
            t->trainable_bytes += b;
        else
            t->frozen_bytes += b;
    }
    logf_(t, "parameter storage: frozen %.2f MiB, trainable %.2f MiB\n",
          t->frozen_bytes / 1048576.0, t->trainable_bytes / 1048576.0);
}

/* ---- fit ---------------------------------------------------------------------------------- */

/* b0: the batch this process started the epoch at (> 0 after a mid-epoch resume) */
static void progress(trainer *t, int64_t b0, int64_t b, int64_t nb, double t_epoch0, double loss,
                     double lr) {
    double el = now_s() - t_epoch0;
    double ips = el > 0 ? (double)(b + 1 - b0) / el : 0;
    double eta = ips > 0 ? (double)(nb - b - 1) / ips : 0;
    if (t->tty) {
        printf("\r\033[Kepoch %lld/%lld  %lld/%lld  %.2f it/s  eta %.0fs  loss %.4f  lr %.3g",
               (long long)t->epoch + 1, (long long)t->max_epochs, (long long)b + 1, (long long)nb,
               ips, eta, loss, lr);
        fflush(stdout);
    } else if ((t->step % t->log_every) == 0 || b + 1 == nb) {
        logf_(t, "epoch %lld/%lld  batch %lld/%lld  %.2f it/s  eta %.0fs  loss %.4f  lr %.3g\n",
              (long long)t->epoch + 1, (long long)t->max_epochs, (long long)b + 1, (long long)nb,
              ips, eta, loss, lr);
    }
}

/* A mid-epoch validation served val batches through the loader: start the
 * train epoch again at batch t->batch (the order is a function of
 * (seed, epoch), so this continues where training was). */
static pl_status continue_train_epoch(trainer *t) {
    return LOADER(t)->epoch_begin(t->loader.self, PL_SPLIT_TRAIN, t->epoch, t->batch);
}

/* checkpoint_every_n_train_steps: last (when save_last) and step-NNNNNN. */
static pl_status save_step_checkpoint(trainer *t) {
    pl_status st = PL_OK;
    if (t->save_last) st = save_checkpoint(t, t->last_path);
    if (!st) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/checkpoints/step-%06lld.safetensors", t->run_dir,
                 (long long)t->step);
        st = save_checkpoint(t, p);
    }
    return st;
}

static pl_status fit(trainer *t) {
    const pl_loader_vtable *L = LOADER(t);
    int64_t nb_full = L->num_batches(t->loader.self, PL_SPLIT_TRAIN);
    int64_t nb = limit_batches(t->limit[PL_SPLIT_TRAIN], nb_full);
    if (nb <= 0)
        return pl_error_set(PL_ERR_CONFIG, "no training batches (split has %lld, "
                            "limit_train_batches gives 0)", (long long)nb_full);
    int64_t val_every = nb;
    if (t->val_interval > 0 && t->val_interval < 1.0)
        val_every = (int64_t)fmax(1.0, floor(t->val_interval * (double)nb));
    else if (t->val_interval > 1.0)
        val_every = (int64_t)t->val_interval;
    pl_status st = PL_OK;
    bool stop = false;
    double t_fit0 = now_s();
    pl_alloc_reset_peak(t->ctx.device);
    for (; t->epoch < t->max_epochs && !stop && !st; t->epoch++) {
        if (t->max_steps >= 0 && t->step >= t->max_steps) break;
        double te0 = now_s();
        int64_t b0 = t->batch; /* > 0: resumed from a mid-epoch checkpoint */
        if (b0 > nb) {
            st = pl_error_set(PL_ERR_CONFIG, "the checkpoint resumed from is at batch %lld of epoch "
                              "%lld, but this configuration has %lld training batches per epoch "
                              "(batch_size or limit_train_batches changed?)", (long long)b0,
                              (long long)t->epoch, (long long)nb);
            break;
        }
        if (b0 == 0) {
            t->ep_loss_sum = 0;
            t->ep_loss_n = 0;
        }
        st = L->epoch_begin(t->loader.self, PL_SPLIT_TRAIN, t->epoch, b0);
        if (!st && b0 > 0)
            logf_(t, "continuing epoch %lld at batch %lld of %lld\n", (long long)t->epoch,
                  (long long)b0, (long long)nb);
        int64_t pending = 0;
        double lr = NAN, gnorm = NAN;
        pl_loader_stats ls0 = L->stats ? L->stats(t->loader.self) : (pl_loader_stats){0};
        int64_t samples = 0;
        for (int64_t b = b0; b < nb && !st && !stop; b++) {
            pl_batch batch;
            int r = L->next(t->loader.self, &batch);
            if (r < 0) {
                st = pl_error_status();
                break;
            }
            if (r == 0) break;
            samples += batch.size;
            t->ctx.epoch = t->epoch;
            t->ctx.global_step = t->step;
            t->ctx.micro_step = t->micro;
            pl_frame_begin();
            pl_tensor *loss = NULL;
            pl_metrics m;
            pl_metrics_reset(&m);
            st = MODEL(t)->forward(t->model.self, &batch, PL_SPLIT_TRAIN, true, &loss, &m);
            double lv = st ? NAN : pl_tensor_item(loss);
            if (!st && !isfinite(lv)) {
                if (!t->on_nan_skip) {
                    st = pl_error_set(PL_ERR_NUMERIC, "non-finite training loss %g at epoch %lld "
                                      "step %lld batch %lld (last finite loss %.6g); "
                                      "set [trainer] on_nan = skip to skip such steps",
                                      lv, (long long)t->epoch, (long long)t->step, (long long)b,
                                      t->last_finite_loss);
                } else {
                    logf_(t, "warning: non-finite loss at step %lld batch %lld: step skipped\n",
                          (long long)t->step, (long long)b);
                    pl_tape_clear();
                    zero_grads(t);
                    pending = 0;
                    t->batch = b + 1;
                    t->accum_pending = 0;
                }
                pl_frame_end();
                continue;
            }
            if (!st) {
                t->last_finite_loss = lv;
                double scale = t->prec.self ? PREC(t)->loss_scale(t->prec.self) : 1.0;
                st = pl_backward(loss, scale / (double)t->accum);
            }
            pl_frame_end();
            if (st) break;
            t->ep_loss_sum += lv;
            t->ep_loss_n++;
            t->micro++;
            bool stepped = false;
            if (++pending == t->accum || b + 1 == nb) {
                st = optimizer_step(t, &gnorm, &lr);
                pending = 0;
                stepped = true;
                if (t->step % t->log_every == 0) {
                    metric_row(t, "train_loss", lv);
                    metric_row(t, "lr", lr);
                    metric_row(t, "grad_norm", gnorm);
                }
            }
            t->batch = b + 1;
            t->accum_pending = pending;
            progress(t, b0, b, nb, te0, t->ep_loss_n ? t->ep_loss_sum / t->ep_loss_n : NAN, lr);
            if (!st && (b + 1) % val_every == 0 && b + 1 < nb &&
                ((t->epoch + 1) % t->val_every_epochs == 0)) {
                st = validate(t, &stop);
                if (!st && !stop) st = continue_train_epoch(t);
            }
            /* after the validation of this batch, so the checkpoint holds its outcome; a
             * validation that stops the run leaves the epoch-end checkpoint only */
            if (!st && stepped && !stop && t->ckpt_every_steps > 0 &&
                t->step % t->ckpt_every_steps == 0)
                st = save_step_checkpoint(t);
            if (t->max_steps >= 0 && t->step >= t->max_steps) break;
        }
        t->batch = 0;
        t->accum_pending = 0;
        if (st) break;
        double te = now_s() - te0;
        pl_loader_stats ls1 = L->stats ? L->stats(t->loader.self) : (pl_loader_stats){0};
        double wait = ls1.wait_seconds - ls0.wait_seconds;
        t->data_wait += wait;
        t->train_samples += (double)samples;
        t->train_seconds += te;
        if (t->tty) printf("\n");
        double ep_loss = t->ep_loss_n ? t->ep_loss_sum / t->ep_loss_n : NAN;
        logf_(t, "epoch %lld: train_loss %.5f  %.1fs  %.0f samples/s  data-wait %.1f%%\n",
              (long long)t->epoch, ep_loss, te, samples / te, 100.0 * wait / te);
        metric_row(t, "epoch_train_loss", ep_loss);
        metric_row(t, "samples_per_s", samples / te);
        metric_row(t, "data_wait_ms", wait * 1e3);
        if (t->avg.self) st = AVG(t)->update(t->avg.self, t->epoch, -1);
        if (!st && (t->epoch + 1) % t->val_every_epochs == 0) st = validate(t, &stop);
        double *ne = realloc(t->epoch_s, (size_t)(t->n_epoch_s + 1) * sizeof(double));
        if (ne) {
            t->epoch_s = ne;
            t->epoch_s[t->n_epoch_s++] = now_s() - te0;
        }
        if (t->metrics) fflush(t->metrics);
        int64_t done = t->epoch + 1;
        t->epoch++; /* checkpoints record the next epoch to run */
        if (!st && t->save_last) st = save_checkpoint(t, t->last_path);
        if (!st && t->ckpt_every > 0 && done % t->ckpt_every == 0) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/checkpoints/epoch-%04lld.safetensors", t->run_dir,
                     (long long)done);
            st = save_checkpoint(t, p);
        }
        t->epoch--;
        if (stop) t->stopped_early = true;
    }
    t->fit_s = now_s() - t_fit0;
    t->ph_fit.seconds = t->fit_s;
    t->ph_fit.peak_bytes = pl_alloc_get_stats(t->ctx.device).peak_bytes;
    return st;
}

/* ---- test and export ------------------------------------------------------------------------ */

static pl_status run_test(trainer *t) {
    pl_status st = PL_OK;
    double t0 = now_s();
    pl_alloc_reset_peak(t->ctx.device);
    if (t->best_path[0] && access(t->best_path, R_OK) == 0) {
        logf_(t, "test: using the best checkpoint %s (%s = %.5f)\n", t->best_path, t->monitor,
              t->best);
        st = load_checkpoint(t, t->best_path, true);
    } else {
        logf_(t, "test: using the last weights\n");
    }
    if (!st) st = evaluate(t, PL_SPLIT_TEST, &t->test_metrics, t->limit[PL_SPLIT_TEST]);
    if (!st) {
        t->have_test = true;
        logf_(t, "test:");
        print_metrics(t, "test", &t->test_metrics);
    }
    if (!st && t->avg.self && AVG(t)->has_average(t->avg.self)) {
        /* averaged weights are reported under the averager's own name */
        const char *who = t->avg.desc->name;
        st = AVG(t)->swap(t->avg.self);
        if (!st) st = evaluate(t, PL_SPLIT_TEST, &t->avg_test_metrics, t->limit[PL_SPLIT_TEST]);
        if (!st) {
            t->have_avg_test = true;
            char prefix[96];
            snprintf(prefix, sizeof prefix, "%s_test", who);
            logf_(t, "test (%s averaged weights):", who);
            print_metrics(t, prefix, &t->avg_test_metrics);
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/checkpoints/%s.safetensors", t->run_dir, who);
            st = save_checkpoint(t, p);
        }
        if (!st) st = AVG(t)->swap(t->avg.self);
    }
    t->test_s = now_s() - t0;
    t->ph_test.seconds = t->test_s;
    t->ph_test.peak_bytes = pl_alloc_get_stats(t->ctx.device).peak_bytes;
    return st;
}

static pl_status run_export(trainer *t) {
    const pl_model_vtable *M = MODEL(t);
    if (!M->export_begin) {
        logf_(t, "export: model '%s' has no export; skipped\n", t->model.desc->name);
        return PL_OK;
    }
    double t0 = now_s();
    pl_alloc_reset_peak(t->ctx.device);
    snprintf(t->outputs_path, sizeof t->outputs_path, "%s/outputs", t->run_dir);
    if (mkdir_p(t->outputs_path))
        return pl_error_set(PL_ERR_IO, "cannot create %s: %s", t->outputs_path, strerror(errno));
    pl_status st = M->export_begin(t->model.self, t->outputs_path);
    const pl_loader_vtable *L = LOADER(t);
    pl_no_grad_begin();
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        st = L->epoch_begin(t->loader.self, (pl_data_split)s, 0, 0);
        pl_batch b;
        int r;
        while (!st && (r = L->next(t->loader.self, &b)) != 0) {
            if (r < 0) {
                st = pl_error_status();
                break;
            }
            pl_frame_begin();
            st = M->export_batch(t->model.self, &b, (pl_data_split)s);
            pl_frame_end();
        }
    }
    pl_no_grad_end();
    if (!st) st = M->export_end(t->model.self);
    t->export_s = now_s() - t0;
    t->ph_export.seconds = t->export_s;
    t->ph_export.peak_bytes = pl_alloc_get_stats(t->ctx.device).peak_bytes;
    if (!st) logf_(t, "export: outputs in %s (%.1fs)\n", t->outputs_path, t->export_s);
    return st;
}

/* ---- report ----------------------------------------------------------------------------------- */

static cJSON *metrics_json(const pl_metrics *m) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < m->n; i++)
        cJSON_AddNumberToObject(o, m->name[i], m->count[i] ? m->sum[i] / m->count[i] : NAN);
    return o;
}

static void add_phase(cJSON *o, const char *name, const phase_time *p) {
    cJSON *ph = cJSON_AddObjectToObject(o, name);
    cJSON_AddNumberToObject(ph, "seconds", p->seconds);
    cJSON_AddNumberToObject(ph, "peak_memory_bytes", (double)p->peak_bytes);
}

static void write_summary(trainer *t, int status) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "config", pl_config_path(t->cfg));
    cJSON_AddStringToObject(o, "run_dir", t->run_dir);
    cJSON_AddStringToObject(o, "status", status ? "failed" : "ok");
    cJSON_AddNumberToObject(o, "total_wall_seconds", now_s() - t->t_start);
    cJSON_AddNumberToObject(o, "fit_seconds", t->fit_s);
    cJSON *ep = cJSON_AddArrayToObject(o, "epoch_seconds");
    double sum = 0;
    for (int64_t i = 0; i < t->n_epoch_s; i++) {
        cJSON_AddItemToArray(ep, cJSON_CreateNumber(t->epoch_s[i]));
        sum += t->epoch_s[i];
    }
    cJSON_AddNumberToObject(o, "time_per_epoch_seconds", t->n_epoch_s ? sum / t->n_epoch_s : 0);
    cJSON_AddNumberToObject(o, "test_seconds", t->test_s);
    cJSON_AddNumberToObject(o, "export_seconds", t->export_s);
    cJSON_AddNumberToObject(o, "epochs", (double)t->epoch);
    cJSON_AddNumberToObject(o, "optimizer_steps", (double)t->step);
    cJSON_AddNumberToObject(o, "seconds_per_step",
                            t->step > 0 && t->train_seconds > 0 ? t->train_seconds / (double)t->step
                                                                 : 0);
    cJSON_AddNumberToObject(o, "frozen_parameter_bytes", (double)t->frozen_bytes);
    cJSON_AddNumberToObject(o, "trainable_parameter_bytes", (double)t->trainable_bytes);
    cJSON_AddBoolToObject(o, "stopped_early", t->stopped_early);
    cJSON_AddNumberToObject(o, "train_samples_per_second",
                            t->train_seconds > 0 ? t->train_samples / t->train_seconds : 0);
    cJSON_AddNumberToObject(o, "data_wait_fraction",
                            t->train_seconds > 0 ? t->data_wait / t->train_seconds : 0);
    char dev[32];
    cJSON *mem = cJSON_AddObjectToObject(o, "phases");
    add_phase(mem, "fit", &t->ph_fit);
    add_phase(mem, "test", &t->ph_test);
    add_phase(mem, "export", &t->ph_export);
    cJSON_AddStringToObject(o, "device", pl_device_str(t->ctx.device, dev, sizeof dev));
    pl_alloc_stats as = pl_alloc_get_stats(t->ctx.device);
    cJSON_AddNumberToObject(o, "peak_memory_bytes",
                            (double)fmax(fmax((double)t->ph_fit.peak_bytes,
                                              (double)t->ph_test.peak_bytes),
                                         (double)t->ph_export.peak_bytes));
    cJSON_AddNumberToObject(o, "allocator_system_allocs", (double)as.system_allocs);
    cJSON_AddNumberToObject(o, "allocator_cache_hits", (double)as.cache_hits);
    cJSON_AddItemToObject(o, "val_metrics", metrics_json(&t->last_val));
    if (t->have_best) {
        cJSON_AddStringToObject(o, "monitor", t->monitor);
        cJSON_AddNumberToObject(o, "best_monitor", t->best);
    }
    if (t->have_test) cJSON_AddItemToObject(o, "test_metrics", metrics_json(&t->test_metrics));
    if (t->have_avg_test) {
        char key[96];
        snprintf(key, sizeof key, "%s_test_metrics", t->avg.desc->name);
        cJSON_AddItemToObject(o, key, metrics_json(&t->avg_test_metrics));
    }
    cJSON_AddStringToObject(o, "best_checkpoint", t->best_path);
    cJSON_AddStringToObject(o, "last_checkpoint", t->last_path);
    cJSON_AddStringToObject(o, "outputs", t->outputs_path);
    char *txt = cJSON_Print(o);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/summary.json", t->run_dir);
    FILE *f = fopen(path, "w");
    if (f && txt) {
        fputs(txt, f);
        fputc('\n', f);
        fclose(f);
    }
    if (status) { /* a failed run: summary.json records what there is; no report */
        free(txt);
        cJSON_Delete(o);
        return;
    }
    /* the report printed at the end */
    logf_(t, "\n== run report (%s) ==\n", t->run_dir);
    logf_(t, "  total wall time    %10.1f s\n", now_s() - t->t_start);
    logf_(t, "  fit                %10.1f s   (%lld epochs, %.2f s/epoch)\n", t->fit_s,
          (long long)t->epoch, t->n_epoch_s ? sum / t->n_epoch_s : 0);
    logf_(t, "  test               %10.1f s\n", t->test_s);
    logf_(t, "  export             %10.1f s\n", t->export_s);
    logf_(t, "  peak memory (%s)  fit %.1f MiB  test %.1f MiB  export %.1f MiB\n", dev,
          t->ph_fit.peak_bytes / 1048576.0, t->ph_test.peak_bytes / 1048576.0,
          t->ph_export.peak_bytes / 1048576.0);
    if (t->have_test)
        for (int i = 0; i < t->test_metrics.n; i++)
            logf_(t, "  test_%-18s %10.5f\n", t->test_metrics.name[i],
                  pl_metrics_get(&t->test_metrics, t->test_metrics.name[i]));
    if (t->best_path[0]) logf_(t, "  best checkpoint    %s\n", t->best_path);
    if (t->outputs_path[0]) logf_(t, "  outputs            %s\n", t->outputs_path);
    logf_(t, "  summary            %s\n", path);
    free(txt);
    cJSON_Delete(o);
}

/* ---- stage chaining -------------------------------------------------------------------------- */

static int run_requirements(trainer *t) {
    int n = pl_config_requires_count(t->cfg);
    for (int i = 0; i < n; i++) {
        const char *req = pl_config_requires_at(t->cfg, i);
        pl_config *rc = pl_config_load(req, 0, NULL, t->reg);
        if (!rc) {
            fprintf(stderr, "error: %s (required by %s): %s\n", req, pl_config_path(t->cfg),
                    pl_error_message());
            return 2;
        }
        char latest[PATH_MAX], ck[PATH_MAX + 64];
        pl_trainer_latest_dir(rc, latest, sizeof latest);
        snprintf(ck, sizeof ck, "%s/checkpoints/last.safetensors", latest);
        if (access(ck, R_OK) == 0) {
            printf("%s: requirement %s satisfied by %s\n", pl_config_path(t->cfg), req, latest);
            pl_config_free(rc);
            continue;
        }
        printf("%s needs %s, which has no finished run (%s missing): running it first\n",
               pl_config_path(t->cfg), req, ck);
        pl_config_print(rc, stdout);
        pl_run_options o = {.config_path = req};
        int rc_code = pl_trainer_run(rc, t->reg, &o);
        pl_config_free(rc);
        if (rc_code) return rc_code;
    }
    return 0;
}

/* init_from: a path or @INI:best|last */
static pl_status resolve_init_from(trainer *t, const char *v, char *out, size_t n) {
    char ini[PATH_MAX], which[32];
    int r = pl_config_parse_ref(t->cfg, v, ini, sizeof ini, which, sizeof which);
    if (r < 0) return pl_error_status();
    if (r == 0) {
        snprintf(out, n, "%s", v);
        return PL_OK;
    }
    pl_config *rc = pl_config_load(ini, 0, NULL, t->reg);
    if (!rc) return pl_error_prefix(pl_error_status(), "init_from %s", v);
    char latest[PATH_MAX];
    pl_trainer_latest_dir(rc, latest, sizeof latest);
    pl_config_free(rc);
    snprintf(out, n, "%s/checkpoints/%s.safetensors", latest, which);
    if (access(out, R_OK) != 0) {
        /* a config without validation writes no best: fall back to last */
        if (!strcmp(which, "best")) {
            snprintf(out, n, "%s/checkpoints/last.safetensors", latest);
            if (access(out, R_OK) == 0) return PL_OK;
        }
        return pl_error_set(PL_ERR_IO, "init_from %s: %s does not exist (run %s first, or list it "
                            "in [pipeline] requires)", v, out, ini);
    }
    return PL_OK;
}

/* ---- setup ----------------------------------------------------------------------------------- */

/* The newest run directory under `base` (timestamped names sort in time
 * order) other than `self` that holds checkpoints/last.safetensors. */
static int newest_last_checkpoint(const char *base, const char *self, char *out, size_t n) {
    struct dirent **ents = NULL;
    int k = scandir(base, &ents, NULL, alphasort), found = -1;
    const char *self_leaf = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
    for (int i = k - 1; i >= 0; i--) {
        const char *d = ents[i]->d_name;
        if (found < 0 && d[0] != '.' && strcmp(d, "latest") && strcmp(d, self_leaf)) {
            snprintf(out, n, "%s/%s/checkpoints/last.safetensors", base, d);
            if (access(out, R_OK) == 0) found = 0;
        }
        free(ents[i]);
    }
    free(ents);
    return found;
}

static pl_status make_run_dir(trainer *t) {
    const char *rd = pl_cfg_str(t->pipe, "run_dir", "runs");
    char latest[PATH_MAX];
    pl_trainer_latest_dir(t->cfg, latest, sizeof latest);
    char base[PATH_MAX];
    snprintf(base, sizeof base, "%s", latest);
    *strrchr(base, '/') = 0;
    const char *slash = strrchr(base, '/');
    snprintf(t->name, sizeof t->name, "%s", slash ? slash + 1 : base);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    for (int k = 0; k < 100; k++) {
        if (k)
            snprintf(t->run_dir, sizeof t->run_dir, "%s/%s-%d", base, stamp, k);
        else
            snprintf(t->run_dir, sizeof t->run_dir, "%s/%s", base, stamp);
        if (access(t->run_dir, F_OK) != 0) break;
    }
    char ck[PATH_MAX + 16];
    snprintf(ck, sizeof ck, "%s/checkpoints", t->run_dir);
    if (mkdir_p(ck))
        return pl_error_set(PL_ERR_IO, "cannot create run directory %s (run_dir = %s): %s",
                            t->run_dir, rd, strerror(errno));
    unlink(latest);
    const char *leaf = strrchr(t->run_dir, '/') + 1;
    if (symlink(leaf, latest))
        fprintf(stderr, "warning: cannot update %s: %s\n", latest, strerror(errno));
    snprintf(t->last_path, sizeof t->last_path, "%s/checkpoints/last.safetensors", t->run_dir);
    return PL_OK;
}

static void read_settings(trainer *t) {
    const pl_config_section *tr = t->tr;
    t->max_epochs = pl_cfg_int(tr, "max_epochs", 1000);
    t->max_steps = pl_cfg_int(tr, "max_steps", -1);
    if (t->max_epochs < 0) t->max_epochs = INT64_MAX / 2;
    t->accum = pl_cfg_int(tr, "accumulate_grad_batches", 1);
    t->clip = pl_cfg_float(tr, "gradient_clip_val", 0);
    t->clip_norm = strcmp(pl_cfg_str(tr, "gradient_clip_algorithm", "norm"), "value") != 0;
    t->val_interval = pl_cfg_float(tr, "val_check_interval", 1.0);
    t->val_every_epochs = pl_cfg_int(tr, "check_val_every_n_epoch", 1);
    t->limit[PL_SPLIT_TRAIN] = pl_cfg_float(tr, "limit_train_batches", 1.0);
    t->limit[PL_SPLIT_VAL] = pl_cfg_float(tr, "limit_val_batches", 1.0);
    t->limit[PL_SPLIT_TEST] = pl_cfg_float(tr, "limit_test_batches", 1.0);
    t->early_stop = pl_cfg_bool(tr, "early_stopping", false);
    t->monitor = pl_cfg_str(tr, "monitor", "val_loss");
    t->mode_max = !strcmp(pl_cfg_str(tr, "mode", "min"), "max");
    t->patience = pl_cfg_int(tr, "patience", 3);
    t->min_delta = pl_cfg_float(tr, "min_delta", 0);
    t->on_nan_skip = !strcmp(pl_cfg_str(tr, "on_nan", "stop"), "skip");
    t->ckpt_every = pl_cfg_int(tr, "checkpoint_every_n_epochs", 0);
    t->ckpt_every_steps = pl_cfg_int(tr, "checkpoint_every_n_train_steps", 0);
    t->save_last = pl_cfg_bool(tr, "save_last", true);
    t->save_best = pl_cfg_bool(tr, "save_best", true);
    t->log_every = pl_cfg_int(tr, "log_every_n_steps", 50);
    t->do_test = pl_cfg_bool(tr, "test", true);
    t->do_export = pl_cfg_bool(tr, "export", false);
}

static int fail(trainer *t, int code) {
    const char *msg = pl_error_message();
    fprintf(stderr, "error: %s\n", msg[0] ? msg : "run failed");
    if (t->log) fprintf(t->log, "error: %s\n", msg);
    const char *hint = pl_hint_get();
    if (!(hint && hint[0]))
        hint = pl_error_status() == PL_ERR_DEVICE ? "use pipeline.device=cpu, or a machine whose GPU "
                                                    "driver matches the CUDA runtime"
               : t->log ? "see log.txt in the run directory"
                        : "`pipeline check FILE.ini` validates the config";
    fprintf(stderr, "hint: %s\n", hint);
    return code;
}

pl_status pl_trainer_check_fields(const pl_config *cfg) {
    const pl_plugin_desc *ld = pl_config_plugin(cfg, "data"), *md = pl_config_plugin(cfg, "model");
    if (!ld || !md) return PL_OK; /* a config error reported elsewhere */
    const pl_loader_vtable *L = ld->vtable;
    const pl_model_vtable *M = md->vtable;
    if (!L || !L->batch_fields)
        return pl_error_set(PL_ERR_ABI, "[data] plugin '%s' (%s) declares no batch fields "
                            "(batch_fields is required since plugin ABI 2.0)", ld->name,
                            pl_config_plugin_path(cfg, "data"));
    if (!M || !M->batch_needs)
        return pl_error_set(PL_ERR_ABI, "[model] plugin '%s' (%s) declares no batch fields it reads "
                            "(batch_needs is required since plugin ABI 2.0)", md->name,
                            pl_config_plugin_path(cfg, "model"));
    pl_field_list have = {0}, need = {0};
    pl_status st = L->batch_fields(pl_config_section_get(cfg, "data"), &have);
    if (st) return pl_error_prefix(st, "[data] plugin '%s' batch fields", ld->name);
    st = M->batch_needs(pl_config_section_get(cfg, "model"), &need);
    if (st) return pl_error_prefix(st, "[model] plugin '%s' batch fields", md->name);
    st = pl_fields_match(&have, ld->name, &need, md->name);
    if (st) pl_hint_set("make [data] yield the fields [model] reads (see `pipeline plugins %s` and "
                        "`pipeline plugins %s`)", ld->name, md->name);
    return st;
}

int pl_trainer_run(pl_config *cfg, pl_registry *reg, const pl_run_options *opts) {
    trainer T = {0}, *t = &T;
    t->t_start = now_s();
    t->cfg = cfg;
    t->reg = reg;
    t->opts = opts;
    t->pipe = pl_config_section_get(cfg, "pipeline");
    t->tr = pl_config_section_get(cfg, "trainer");
    t->tty = isatty(STDOUT_FILENO);
    read_settings(t);
    int code = run_requirements(t);
    if (code) return code;
    int64_t threads = pl_cfg_int(t->pipe, "threads", 0);
    if (threads > 0) omp_set_num_threads((int)threads);

    const char *dev = pl_cfg_str(t->pipe, "device", "cpu");
    if (strcmp(dev, "cpu") != 0 && pl_backend_load(reg, PL_DEVICE_CUDA) != PL_OK) {
        if (strcmp(dev, "auto") != 0) return fail(t, 2);
        printf("device = auto: no usable CUDA backend (%s); training on the CPU\n",
               pl_error_message());
        pl_error_clear();
    }
    if (pl_device_parse(dev, &t->ctx.device)) return fail(t, 2);
    t->ctx.seed = (uint64_t)pl_cfg_int(t->pipe, "seed", 42);
    t->ctx.meta = pl_meta_new();
    t->ctx.params = pl_params_new();
    if (make_run_dir(t)) return fail(t, 1);
    t->ctx.run_dir = t->run_dir;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/log.txt", t->run_dir);
    t->log = fopen(path, "w");
    snprintf(path, sizeof path, "%s/metrics.csv", t->run_dir);
    t->metrics = fopen(path, "w");
    if (t->metrics) fprintf(t->metrics, "step,epoch,key,value\n");
    snprintf(path, sizeof path, "%s/config.ini", t->run_dir);
    pl_config_write_ini(cfg, path);
    logf_(t, "run %s: config %s, device %s, seed %llu, %d threads\n", t->run_dir,
          pl_config_path(cfg), pl_cfg_str(t->pipe, "device", "cpu"),
          (unsigned long long)t->ctx.seed, omp_get_max_threads());

    pl_status st = pl_trainer_check_fields(cfg);
    if (!st) st = stage_create(t, &t->loader, "data");
    if (!st) st = stage_create(t, &t->model, "model");
    if (!st && !t->model.self) st = pl_error_set(PL_ERR_CONFIG, "no [model] section");
    if (!st) st = stage_create(t, &t->prec, "precision");
    if (!st && t->prec.self) st = PREC(t)->setup(t->prec.self, t->ctx.params);
    /* steps for schedulers */
    if (!st) {
        int64_t nb = limit_batches(t->limit[PL_SPLIT_TRAIN],
                                   LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN));
        t->ctx.steps_per_epoch = (nb + t->accum - 1) / t->accum;
        t->ctx.max_epochs = t->max_epochs;
        t->ctx.total_steps = t->ctx.steps_per_epoch * t->max_epochs;
        if (t->max_steps >= 0 && (t->max_steps < t->ctx.total_steps || t->max_epochs >= INT64_MAX / 4))
            t->ctx.total_steps = t->max_steps;
    }
    if (!st) st = stage_create(t, &t->optim, "optimizer");
    if (!st && !t->optim.self)
        st = pl_error_set(PL_ERR_CONFIG, "no [optimizer] section (training needs one)");
    /* schedulers and averagers scale the optimizer's base lr: group 0's
     * configured lr (initial_lr without its lr_scale) */
    if (!st && OPTIM(t)->num_groups(t->optim.self) > 0) {
        pl_param_group *g0 = OPTIM(t)->group(t->optim.self, 0);
        pl_meta_set_float(t->ctx.meta, "optimizer.lr",
                          g0->lr_scale > 0 ? g0->initial_lr / g0->lr_scale : g0->initial_lr);
    }
    for (int i = 0; i < pl_config_section_count(cfg) && !st; i++) {
        const char *sec = pl_cfg_section_name(pl_config_section_at(cfg, i));
        if (pl_stage_section_kind(sec) != PL_KIND_SCHEDULER) continue;
        if (t->n_sched == PL_MAX_SCHEDULERS) {
            st = pl_error_set(PL_ERR_CONFIG, "[%s]: more than %d scheduler sections", sec,
                              PL_MAX_SCHEDULERS);
            break;
        }
        st = stage_create(t, &t->sched[t->n_sched], sec);
        if (t->sched[t->n_sched].self) t->n_sched++;
    }
    if (!st) st = stage_create(t, &t->avg, "averager");
    int params_total = 0, params_trainable = 0;
    for (int i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        int64_t n = pl_tensor_numel(p->t);
        params_total += (int)n;
        if (p->t->requires_grad) params_trainable += (int)n;
    }
    if (!st)
        logf_(t, "model %s: %d parameters (%d trainable); %lld optimizer steps per epoch\n",
              t->model.desc->name, params_total, params_trainable,
              (long long)t->ctx.steps_per_epoch);

    /* weights init / resume */
    const char *init = pl_cfg_str(t->tr, "init_from", "");
    if (!st && init[0]) {
        char p[PATH_MAX];
        st = resolve_init_from(t, init, p, sizeof p);
        if (!st) st = load_checkpoint(t, p, true);
        if (!st && t->prec.self) st = PREC(t)->setup(t->prec.self, t->ctx.params);
    }
    const char *resume = opts && opts->resume ? opts->resume : pl_cfg_str(t->tr, "resume", "");
    if (!st && resume && resume[0]) {
        char p[PATH_MAX];
        if (!strcmp(resume, "last")) {
            char latest[PATH_MAX];
            pl_trainer_latest_dir(cfg, latest, sizeof latest);
            *strrchr(latest, '/') = 0; /* RUN_DIR/NAME */
            if (newest_last_checkpoint(latest, t->run_dir, p, sizeof p))
                st = pl_error_set(PL_ERR_IO, "--resume last: no earlier run of %s has a last "
                                  "checkpoint under %s", pl_config_path(cfg), latest);
        } else {
            snprintf(p, sizeof p, "%s", resume);
        }
        if (!st) {
            st = load_checkpoint(t, p, false);
            if (!st && t->batch > 0)
                logf_(t, "resumed from %s at epoch %lld, batch %lld (mid-epoch), step %lld\n", p,
                      (long long)t->epoch, (long long)t->batch, (long long)t->step);
            else if (!st)
                logf_(t, "resumed from %s at epoch %lld, step %lld\n", p, (long long)t->epoch,
                      (long long)t->step);
            if (!st) adopt_earlier_best(t, p);
        }
    }
    if (!st) count_parameter_bytes(t);
    if (!st) st = fit(t);
    if (!st && t->do_test) st = run_test(t);
    if (!st && t->do_export) st = run_export(t);
    code = st ? (st == PL_ERR_CONFIG ? 2 : 1) : 0;
    /* the error goes last, where the user looks, not above a report of nothing */
    write_summary(t, code);
    if (st) fail(t, code);

    stage_destroy(&t->avg);
    for (int k = t->n_sched - 1; k >= 0; k--) stage_destroy(&t->sched[k]);
    stage_destroy(&t->optim);
    stage_destroy(&t->prec);
    stage_destroy(&t->model);
    stage_destroy(&t->loader);
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    free(t->epoch_s);
    if (t->log) fclose(t->log);
    if (t->metrics) fclose(t->metrics);
    pl_autocast_set(PL_F32);
    return code;
}
