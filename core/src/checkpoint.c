/* checkpoint.c - the trainer's checkpoints: every parameter under its own
 * name (except frozen PL_TAG_PRETRAINED weights, which their pretrained
 * source owns: neither saved nor loaded), every stage's state through the
 * state visitor (names prefixed with the stage's section), loop counters
 * and the config hash in __metadata__. Loading is checked: metadata is read
 * whole or refused naming the file and key. See trainer_internal.h. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer_internal.h"

/* ---- checkpoints --------------------------------------------------------------- */

typedef struct ckpt_io {
    const char *prefix;
    pl_st_writer *w; /* saving */
    pl_st_file *f;   /* loading */
    const char *path;
} ckpt_io;

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
    if (!pl_st_meta(io->f, full))
        return pl_error_set(PL_ERR_IO, "checkpoint %s: metadata '%s' missing (checkpoint from another "
                            "configuration?)", io->path, full);
    meta_reader r = {io->f, io->path, PL_OK};
    *v = meta_f64(&r, full, 0);
    return r.st;
}

static pl_status visit_stage(stage *s, ckpt_io *io) {
    if (!s->desc || !s->self || !s->fns.state) return PL_OK;
    io->prefix = s->section;
    pl_state_visitor v = {io, ck_tensor, ck_scalar, .loading = io->f != NULL};
    return s->fns.state(s->self, &v);
}

static pl_status visit_all_state(trainer *t, ckpt_io *io) {
    pl_status st = visit_stage(&t->optim, io);
    for (int k = 0; k < t->n_sched && !st; k++) st = visit_stage(&t->sched[k], io);
    if (!st) st = visit_stage(&t->avg, io);
    if (!st) st = visit_stage(&t->prec, io);
    return st;
}

/* A frozen weight owned by its pretrained source (PL_TAG_PRETRAINED): the
 * model re-reads it at create, so checkpoints neither save nor load it. */
static bool from_source(const pl_param *p) {
    return (p->tags & PL_TAG_PRETRAINED) && !p->t->requires_grad;
}

pl_status tr_save_checkpoint(trainer *t, const char *path) {
    pl_st_writer *w = pl_st_writer_new(path);
    if (!w) return pl_error_status();
    pl_status st = PL_OK;
    for (int i = 0; i < pl_params_count(t->ctx.params) && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (from_source(p)) continue;
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

/* A loaded parameter must hold finite values: a NaN or Inf weight would
 * train or evaluate to NaN far from its cause. PL_ERR_NUMERIC naming the
 * checkpoint, the parameter, how many and the first position. */
static pl_status check_finite_param(const char *path, const pl_param *p) {
    pl_tensor *t = p->t;
    if (t->dtype != PL_F32 && t->dtype != PL_BF16 && t->dtype != PL_F16) return PL_OK;
    pl_frame_begin();
    pl_tensor *h = (t->dtype == PL_F32 && t->device.type == PL_DEVICE_CPU &&
                    pl_tensor_is_contiguous(t))
                       ? t
                       : pl_tensor_to(t, PL_F32, PL_CPU);
    pl_status st = PL_OK;
    if (!h) {
        st = pl_error_status();
    } else {
        const float *v = pl_tensor_f32(h);
        int64_t n = pl_tensor_numel(h), bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(v[i]) && bad++ == 0) first = i;
        if (bad)
            st = pl_error_set(PL_ERR_NUMERIC, "checkpoint %s: parameter '%s' holds %lld non-finite "
                              "values of %lld (first at flat index %lld: %g); the run that wrote it "
                              "diverged, or the file is corrupt", path, p->name, (long long)bad,
                              (long long)n, (long long)first, (double)v[first]);
    }
    pl_frame_end();
    return st;
}

/* Load parameters (all must be present unless weights_only) and, for a
 * resume, every stage's state and the loop counters. */
pl_status tr_load_checkpoint(trainer *t, const char *path, bool weights_only) {
    pl_st_file *f = NULL;
    pl_status st = pl_st_open(path, &f);
    if (st) return st;
    int loaded = 0, missing = 0, kept = 0;
    char first_missing[PL_NAME_MAX] = "";
    for (int i = 0; i < pl_params_count(t->ctx.params) && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (from_source(p)) { /* as the model's create read it; never missing */
            kept++;
            continue;
        }
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
        if (!st) st = check_finite_param(path, p);
        loaded++;
    }
    int n_ckpt = pl_params_count(t->ctx.params) - kept; /* parameters checkpoints hold */
    if (!st && !weights_only && missing)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: parameter '%s' missing (%d of %d missing; "
                          "checkpoint of another model?)", path, first_missing, missing, n_ckpt);
    if (!st && loaded == 0 && n_ckpt > 0)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: none of the model's %d parameters is in it "
                          "(first expected: '%s')", path, n_ckpt, first_missing);
    if (!st && kept)
        tr_log(t, "%d pretrained weights kept from their source (frozen; not in checkpoints)\n",
               kept);
    if (!st && weights_only)
        tr_log(t, "loaded %d parameter tensors from %s (%d not in the file keep their init)\n",
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
void tr_adopt_earlier_best(trainer *t, const char *resumed) {
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
    tr_log(t, "best checkpoint so far: %s (%s = %.5f)\n", cand, t->monitor, t->best);
}
