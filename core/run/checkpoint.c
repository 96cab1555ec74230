/* checkpoint.c - the trainer's checkpoints: every parameter under its own
 * name (except frozen PL_TAG_PRETRAINED weights, which their pretrained
 * source owns: neither saved nor loaded), every stage's state through the
 * state visitor (names prefixed with the stage's section), loop counters
 * and the config hash in __metadata__. Loading is checked: metadata is read
 * whole or refused naming the file and key. See trainer_internal.h. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "callback.h"
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
    /* callbacks with state (callback.h), under their names */
    for (int i = 0; i < t->n_cbs && !st; i++) {
        tr_callback *c = t->cbs[i];
        if (!TR_CB_HAS(c, state)) continue;
        io->prefix = c->name;
        pl_state_visitor v = {io, ck_tensor, ck_scalar, .loading = io->f != NULL};
        st = c->state(c->self, &v);
    }
    return st;
}

/* A frozen weight owned by its pretrained source (PL_TAG_PRETRAINED): the
 * model re-reads it at create, so checkpoints neither save nor load it. */
static bool from_source(const pl_param *p) {
    return (p->tags & PL_TAG_PRETRAINED) && !p->t->requires_grad;
}

/* ---- the configuration a checkpoint was written with -------------------------------
 * Metadata "config": the resolved configuration as "section.key=value" lines
 * (section names hold no '.', keys no '='). A resume compares it with its
 * own: changed keys are a warning; a different plugin in a stage section
 * whose state the checkpoint holds is refused. Checkpoints older than it
 * have only config_hash (and model): compared as far as they go. */

static char *config_lines(const pl_config *c) {
    size_t n = 1;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const pl_config_section *s = pl_config_section_at(c, i);
        for (int j = 0; j < pl_cfg_count(s); j++)
            n += strlen(pl_cfg_section_name(s)) + strlen(pl_cfg_key_at(s, j)) +
                 strlen(pl_cfg_value_at(s, j)) + 3;
    }
    char *text = malloc(n), *p = text;
    if (!text) return NULL;
    *p = 0;
    for (int i = 0; i < pl_config_section_count(c); i++) {
        const pl_config_section *s = pl_config_section_at(c, i);
        for (int j = 0; j < pl_cfg_count(s); j++)
            p += sprintf(p, "%s.%s=%s\n", pl_cfg_section_name(s), pl_cfg_key_at(s, j),
                         pl_cfg_value_at(s, j));
    }
    return text;
}

/* The value of section.key in "config" lines, or NULL; `len` its length. */
static const char *config_lines_get(const char *text, const char *sec, const char *key,
                                    size_t *len) {
    size_t ls = strlen(sec), lk = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, sec, ls) || l[ls] != '.' || strncmp(l + ls + 1, key, lk) ||
            l[ls + 1 + lk] != '=')
            continue;
        const char *v = l + ls + 2 + lk, *e = strchr(v, '\n');
        *len = e ? (size_t)(e - v) : strlen(v);
        return v;
    }
    return NULL;
}

/* Where a file goes, not what it trains: never worth a warning. */
static bool config_key_ignored(const char *sec, const char *key) {
    return (!strcmp(sec, "trainer") && !strcmp(key, "resume")) ||
           (!strcmp(sec, "pipeline") && (!strcmp(key, "run_dir") || !strcmp(key, "name")));
}

/* Stage sections whose state a checkpoint holds and whose plugin must stay:
 * model, optimizer, precision, averager, every scheduler (not data: a
 * loader keeps no state; its order is a function of (seed, epoch)). */
static bool stage_with_state(const char *sec) {
    int k = pl_stage_section_kind(sec);
    return k >= 0 && k != PL_KIND_LOADER;
}

typedef struct key_list {
    char text[1024];
    size_t n;
    int count;
} key_list;

static void key_list_add(key_list *kl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void key_list_add(key_list *kl, const char *fmt, ...) {
    kl->count++;
    if (kl->n >= sizeof kl->text) return;
    if (kl->count > 1) kl->n += (size_t)snprintf(kl->text + kl->n, sizeof kl->text - kl->n, ", ");
    if (kl->n >= sizeof kl->text) return;
    va_list ap;
    va_start(ap, fmt);
    kl->n += (size_t)vsnprintf(kl->text + kl->n, sizeof kl->text - kl->n, fmt, ap);
    va_end(ap);
}

/* The plugin of stage section `sec` in the checkpoint's config ("" when the
 * section was absent). */
static void old_plugin(const char *text, const char *sec, char *out, size_t n) {
    size_t len = 0;
    const char *v = config_lines_get(text, sec, "plugin", &len);
    if (!v) len = 0;
    snprintf(out, n, "%.*s", (int)len, v ? v : "");
}

static pl_status refuse_plugin(const char *path, const char *sec, const char *was, const char *is) {
    pl_hint_set("resume with the checkpoint's plugins (its run directory's config.ini has them), "
                "or start a new run from its weights with [trainer] init_from = %s", path);
    return pl_error_set(PL_ERR_CONFIG, "cannot resume from %s: it was written with [%s] %s%s%s, "
                        "this run has %s%s%s; that stage's state (or its absence) cannot continue "
                        "exactly", path, sec, was[0] ? "plugin '" : "no such section", was,
                        was[0] ? "'" : "", is[0] ? "plugin '" : "no such section", is,
                        is[0] ? "'" : "");
}

/* Compare this run's configuration with the checkpoint's before loading it
 * for a resume: refuse another plugin (or an added / removed section) where
 * the checkpoint holds a stage's state; warn naming every other changed key
 * (max_epochs, limits, log settings: how runs are extended). `model_diff`
 * gets the changed [model] keys, for the message of a shape mismatch. */
static pl_status compare_config(trainer *t, pl_st_file *f, const char *path, key_list *model_diff) {
    const char *old_hash = pl_st_meta(f, "config_hash");
    char hash[32];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)pl_config_hash(t->cfg));
    if (old_hash && !strcmp(old_hash, hash)) return PL_OK;
    const char *text = pl_st_meta(f, "config");
    if (!text) {
        if (old_hash)
            tr_log(t, "warning: resuming from %s, written with another configuration (config hash "
                   "%s, this run %s); the checkpoint predates the stored configuration, so the "
                   "changed keys cannot be named\n", path, old_hash, hash);
        return PL_OK;
    }
    /* plugins first: a refusal needs no list of keys */
    char was[PL_NAME_MAX];
    for (int i = 0; i < pl_config_section_count(t->cfg); i++) {
        const char *sec = pl_cfg_section_name(pl_config_section_at(t->cfg, i));
        if (!stage_with_state(sec)) continue;
        const pl_plugin_desc *d = pl_config_plugin(t->cfg, sec);
        old_plugin(text, sec, was, sizeof was);
        if (strcmp(was, d ? d->name : "")) return refuse_plugin(path, sec, was, d ? d->name : "");
    }
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n'), *dot = strchr(l, '.');
        size_t ll = e ? (size_t)(e - l) : strlen(l);
        if (dot && dot < l + ll) {
            char sec[PL_NAME_MAX];
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - l), l);
            if (stage_with_state(sec) && !pl_config_section_get(t->cfg, sec)) {
                old_plugin(text, sec, was, sizeof was);
                return refuse_plugin(path, sec, was, "");
            }
        }
        l += ll + (e ? 1 : 0);
    }
    /* every key of either side, in this run's order, then the ones it dropped */
    key_list diff = {0};
    for (int i = 0; i < pl_config_section_count(t->cfg); i++) {
        const pl_config_section *s = pl_config_section_at(t->cfg, i);
        const char *sec = pl_cfg_section_name(s);
        for (int j = 0; j < pl_cfg_count(s); j++) {
            const char *key = pl_cfg_key_at(s, j), *now = pl_cfg_value_at(s, j);
            if (config_key_ignored(sec, key)) continue;
            size_t len = 0;
            const char *v = config_lines_get(text, sec, key, &len);
            if (v && strlen(now) == len && !strncmp(v, now, len)) continue;
            if (v)
                key_list_add(&diff, "%s.%s %.*s -> %s", sec, key, (int)len, v, now);
            else
                key_list_add(&diff, "%s.%s (new) = %s", sec, key, now);
            if (!strcmp(sec, "model"))
                key_list_add(model_diff, "%s %.*s -> %s", key, (int)(v ? len : 6),
                             v ? v : "absent", now);
        }
    }
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n'), *dot = strchr(l, '.'), *eq = strchr(l, '=');
        size_t ll = e ? (size_t)(e - l) : strlen(l);
        if (dot && eq && dot < eq && eq < l + ll) {
            char sec[PL_NAME_MAX], key[PL_NAME_MAX];
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - l), l);
            snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
            const pl_config_section *s = pl_config_section_get(t->cfg, sec);
            if (!config_key_ignored(sec, key) && !pl_cfg_get(s, key))
                key_list_add(&diff, "%s.%s (dropped, was %.*s)", sec, key,
                             (int)(l + ll - eq - 1), eq + 1);
        }
        l += ll + (e ? 1 : 0);
    }
    if (diff.count)
        tr_log(t, "warning: resuming from %s with %d changed configuration key%s: %s%s\n", path,
               diff.count, diff.count == 1 ? "" : "s", diff.text,
               diff.n >= sizeof diff.text ? " ..." : "");
    return PL_OK;
}

pl_status tr_save_checkpoint(trainer *t, const char *path) {
    if (t->rank > 0) return PL_OK; /* data parallel: rank 0 writes, the ranks agree */
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
    /* data parallel: the world it was trained in, and the position in the epoch in
     * samples (batch_size x world size per step), so a run with another rank count
     * (and per-rank batch) resumes at the same data */
    META("world_size", "%d", t->world);
    int64_t bs = pl_cfg_int(pl_config_section_get(t->cfg, "data"), "batch_size", 0);
    if (bs > 0) META("samples_in_epoch", "%lld", (long long)(t->batch * bs * t->world));
    META("accumulation_pending", "%lld", (long long)t->accum_pending);
    META("epoch_train_loss_sum", "%.17g", t->ep_loss_sum);
    META("epoch_train_loss_count", "%lld", (long long)t->ep_loss_n);
    META("last_finite_loss", "%.17g", t->last_finite_loss);
    META("best", "%.17g", t->best);
    for (int k = 1; k < t->n_monitor; k++) { /* the GAT rule's other monitored metrics */
        char key[32];
        snprintf(key, sizeof key, "best_%d", k);
        META(key, "%.17g", t->bests[k]);
    }
    META("early_stopping_best", "%.17g", t->es_best);
    META("have_best", "%d", (int)t->have_best);
    META("bad_vals", "%lld", (long long)t->bad_vals);
    META("seed", "%llu", (unsigned long long)t->ctx.seed);
    META("config_hash", "%016llx", (unsigned long long)pl_config_hash(t->cfg));
    META("model", "%s", t->model.desc->name);
    META("nan_skips_in_a_row", "%lld", (long long)t->nan_skips);
    /* what a resume compares: the fit's planned optimizer steps (schedulers
     * that span the fit take their length from it) and the lr factor of the
     * next step */
    META("total_steps", "%lld", (long long)t->ctx.total_steps);
    META("lr_factor", "%.17g", tr_lr_factor(t));
#undef META
    if (!st) {
        char *text = config_lines(t->cfg);
        st = text ? pl_st_writer_meta(w, "config", text)
                  : pl_error_set(PL_ERR_NOMEM, "checkpoint %s: out of memory (config)", path);
        free(text);
    }
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

/* The loaded parameters on a device, checked together: the sum over them of
 * sum(x - x) is 0 when every value is finite (x - x is NaN for an Inf or a
 * NaN) and comes back in one read, where a read per parameter made a GPU
 * wait ~50 times per checkpoint load (the teacher's test phase); only when it
 * is not are they read one by one, to name the first (check_finite_param). */
static pl_status check_finite_device(const char *path, pl_param **ps, int n) {
    pl_status st = PL_OK;
    pl_no_grad_begin();
    pl_tensor *acc = NULL; /* owned; each parameter's temporaries go with its frame */
    for (int i = 0; i < n && !st; i++) {
        pl_tensor *x = ps[i]->t;
        pl_frame_begin();
        pl_tensor *z = pl_tensor_to(pl_sum(pl_sub(x, x), PL_ALL_DIMS, false), PL_F32, x->device);
        pl_tensor *a = z && acc ? pl_add(acc, z) : z;
        if (a) pl_frame_keep(a);
        pl_frame_end();
        pl_tensor_release(acc);
        if (!(acc = a)) st = pl_error_status();
    }
    double v = !st && acc ? pl_tensor_item(acc) : 0.0;
    pl_tensor_release(acc);
    pl_no_grad_end();
    for (int i = 0; i < n && !st && !isfinite(v); i++) st = check_finite_param(path, ps[i]);
    return st;
}

/* Load parameters (all must be present unless weights_only, or when
 * require_all) and, for a resume, every stage's state and the loop counters. */
static pl_status load_checkpoint(trainer *t, const char *path, bool weights_only,
                                 bool require_all) {
    pl_st_file *f = NULL;
    pl_status st = pl_st_open(path, &f);
    if (st) return st;
    key_list model_diff = {0};
    if (!weights_only) st = compare_config(t, f, path, &model_diff);
    int loaded = 0, missing = 0, kept = 0, n_dev = 0;
    char first_missing[PL_NAME_MAX] = "";
    pl_param **dev = calloc((size_t)pl_params_count(t->ctx.params) + 1, sizeof *dev);
    if (!st && !dev) st = pl_error_set(PL_ERR_NOMEM, "checkpoint %s: out of memory", path);
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
        if (st && model_diff.count) {
            /* a resume continues the model it saved: a configuration error
             * naming what changed */
            char why[1024];
            snprintf(why, sizeof why, "%s", pl_error_message());
            st = pl_error_set(PL_ERR_CONFIG, "cannot resume from %s: [model] changed since the "
                              "checkpoint (%s%s), and its weights do not fit: %s", path,
                              model_diff.text, model_diff.n >= sizeof model_diff.text ? " ..." : "",
                              why);
            pl_hint_set("resume with the checkpoint's [model] options (its run directory's "
                        "config.ini has them); a new model shape needs a new run");
        }
        pl_dtype pt = p->t->dtype;
        if (!st && p->t->device.type != PL_DEVICE_CPU &&
            (pt == PL_F32 || pt == PL_BF16 || pt == PL_F16))
            dev[n_dev++] = p; /* checked together below */
        else if (!st)
            st = check_finite_param(path, p);
        loaded++;
    }
    if (!st && n_dev) st = check_finite_device(path, dev, n_dev);
    free(dev);
    int n_ckpt = pl_params_count(t->ctx.params) - kept; /* parameters checkpoints hold */
    if (!st && (!weights_only || require_all) && missing)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: parameter '%s' missing (%d of %d missing; "
                          "checkpoint of another model?)", path, first_missing, missing, n_ckpt);
    if (!st && loaded == 0 && n_ckpt > 0)
        st = pl_error_set(PL_ERR_IO, "checkpoint %s: none of the model's %d parameters is in it "
                          "(first expected: '%s')", path, n_ckpt, first_missing);
    if (!st && kept)
        tr_log(t, "%d pretrained weights kept from their source (frozen; not in checkpoints)\n",
               kept);
    if (!st && weights_only && require_all)
        tr_log(t, "loaded %d parameter tensors from %s\n", loaded, path);
    else if (!st && weights_only)
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
            int64_t pos = meta_i64(&mr, "samples_in_epoch", -1);
            int64_t ws = meta_i64(&mr, "world_size", 1);
            int64_t bs_now = pl_cfg_int(pl_config_section_get(t->cfg, "data"), "batch_size", 0);
            if (batch > 0 && pos > 0 && bs_now > 0) {
                /* continue at the first whole step of this run at or after that sample */
                int64_t per_step = bs_now * t->world;
                t->batch = pos / per_step + (pos % per_step != 0); /* pos is untrusted: no overflow */
                if (t->batch != batch || ws != t->world)
                    tr_log(t, "resume: %s was saved %lld samples into epoch %lld by %lld "
                           "process(es); this run (%d x batch_size %lld) continues at its step "
                           "%lld of the epoch%s\n", path, (long long)pos, (long long)epoch,
                           (long long)ws, t->world, (long long)bs_now, (long long)t->batch,
                           pos % per_step ? " (the rest of a global batch is skipped)" : "");
            }
            t->accum_pending = 0;
            t->ep_loss_sum = batch > 0 ? meta_f64(&mr, "epoch_train_loss_sum", 0) : 0;
            t->ep_loss_n = batch > 0 ? meta_i64(&mr, "epoch_train_loss_count", 0) : 0;
            t->last_finite_loss = meta_f64(&mr, "last_finite_loss", 0);
            t->best = t->bests[0] = meta_f64(&mr, "best", 0);
            t->es_best = meta_f64(&mr, "early_stopping_best", t->best); /* older: the same */
            t->have_best = meta_i64(&mr, "have_best", 0) != 0;
            for (int k = 1; k < t->n_monitor; k++) {
                char key[32];
                snprintf(key, sizeof key, "best_%d", k);
                /* a checkpoint from a one-metric run: this metric starts afresh */
                t->bests[k] = meta_f64(&mr, key, t->mode_maxes[k] ? -INFINITY : INFINITY);
            }
            t->bad_vals = meta_i64(&mr, "bad_vals", 0);
            t->nan_skips = meta_i64(&mr, "nan_skips_in_a_row", 0);
            /* absent in checkpoints older than them: nothing to compare */
            t->resume_total_steps = meta_i64(&mr, "total_steps", -1);
            t->resume_lr_factor = meta_f64(&mr, "lr_factor", NAN);
            st = mr.st;
        }
    }
    pl_st_close(f);
    if (!st && MODEL(t)->on_load) st = MODEL(t)->on_load(t->model.self);
    return st;
}

pl_status tr_load_checkpoint(trainer *t, const char *path, bool weights_only) {
    return load_checkpoint(t, path, weights_only, false);
}

pl_status tr_load_weights(trainer *t, const char *path) {
    pl_st_file *f = NULL;
    pl_status st = pl_st_open(path, &f);
    if (st) return st;
    /* the model it was written by (absent in checkpoints of other tools) */
    const char *model = pl_st_meta(f, "model");
    if (model && strcmp(model, t->model.desc->name))
        st = pl_error_set(PL_ERR_IO, "checkpoint %s was written by model '%s', this config's "
                          "model is '%s'", path, model, t->model.desc->name);
    pl_st_close(f);
    return st ? st : load_checkpoint(t, path, true, true);
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
