/* predict.c - `pipeline predict RUN_DIR INPUT.h5 OUT.h5`: a finished run's
 * model on new rows.
 *
 * The run is rebuilt from RUN_DIR/config.ini (the resolved config the run
 * wrote) with the trainer's own stage code (tr_stage_create, precision
 * setup, tr_load_weights), so a prediction sees exactly the model the run
 * evaluated. Only two things change, both generic:
 *   - the loader reads INPUT.h5: the core overrides `data.path` (the loader
 *     convention: a loader's input file is its `path` option; a loader
 *     without one is refused, naming it), and publishes meta
 *     "predict_split" before the loader's create (plugin.h, pl_model_vtable
 *     ABI 2.4), so the loader serves that one split and lets targets be
 *     absent;
 *   - batches go to the model's outputs_batch (PL_OUTPUTS_PREDICT, eval
 *     mode, grad off), not to forward: the model names its output tensors
 *     and the run's outputs.c writes them to OUT.h5 (libpipeline_hdf5; the
 *     core library reads and writes no HDF5), under a temporary name renamed
 *     when all went well.
 * The core checks the first batch against the model's predict_needs, so an
 * input file without a field the model needs is refused naming the file and
 * the field.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "predict.h"
#include "trainer_internal.h"

/* ---- the run directory and its checkpoint --------------------------------------------- */

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* best (default) -> RUN_DIR/checkpoints/best.safetensors, falling back to
 * last with a note; last; or a path. */
static pl_status resolve_checkpoint(const char *run_dir, const char *which, char *out, size_t n) {
    if (!which || !which[0]) which = "best";
    if (strcmp(which, "best") && strcmp(which, "last")) {
        if (!is_file(which))
            return pl_error_set(PL_ERR_IO, "--checkpoint %s: no such file", which);
        snprintf(out, n, "%s", which);
        return PL_OK;
    }
    snprintf(out, n, "%s/checkpoints/%s.safetensors", run_dir, which);
    if (is_file(out)) return PL_OK;
    if (!strcmp(which, "best")) {
        char last[PATH_MAX];
        snprintf(last, sizeof last, "%s/checkpoints/last.safetensors", run_dir);
        if (is_file(last)) {
            printf("note: %s has no best checkpoint (the run saved none: no validation, or "
                   "save_best = false); using %s\n", run_dir, last);
            snprintf(out, n, "%s", last);
            return PL_OK;
        }
    }
    pl_hint_set("give a checkpoint file with --checkpoint PATH");
    return pl_error_set(PL_ERR_IO, "%s: no %s checkpoint (%s)%s", run_dir, which, out,
                        !strcmp(which, "best") ? " and no last.safetensors" : "");
}

/* ---- the configuration ------------------------------------------------------------------ */

static bool has_option(const pl_plugin_desc *d, const char *name) {
    for (const pl_option_spec *o = d ? d->options : NULL; o && o->name; o++)
        if (!strcmp(o->name, name)) return true;
    return false;
}

/* RUN_DIR/config.ini with the user's overrides, then the core's: the loader's
 * `path` is INPUT.h5, and no `requires` / init_from / resume (the weights come
 * from the checkpoint). NULL with the error set. */
static pl_config *load_run_config(const char *ini, const pl_predict_options *o, pl_registry *reg) {
    int n = o->argc;
    const char **over = calloc((size_t)n + 4, sizeof *over);
    char path_over[PATH_MAX + 16];
    if (!over) {
        pl_error_set(PL_ERR_NOMEM, "predict: out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!strncmp(o->argv[i], "data.path=", 10) || !strcmp(o->argv[i], "~data.path")) {
            pl_error_set(PL_ERR_CONFIG, "predict: %s: INPUT.h5 names the file the model reads; "
                         "give it there, not as an override", o->argv[i]);
            free(over);
            return NULL;
        }
        over[i] = o->argv[i];
    }
    over[n++] = "pipeline.requires=";
    over[n++] = "trainer.init_from=";
    over[n++] = "trainer.resume=";
    /* first without the path: a loader with no `path` option is named, not
     * reported as an unknown key */
    pl_config *cfg = pl_config_load(ini, n, over, reg);
    const pl_plugin_desc *ld = cfg ? pl_config_plugin(cfg, "data") : NULL;
    if (cfg && ld && !has_option(ld, "path")) {
        pl_error_set(PL_ERR_CONFIG, "predict: the run's [data] plugin '%s' (%s) has no 'path' "
                     "option, so it cannot be pointed at %s (predict overrides data.path; see "
                     "docs/plugin-authors.md)", ld->name, pl_config_plugin_path(cfg, "data"),
                     o->input);
        pl_config_free(cfg);
        cfg = NULL;
    } else if (cfg) {
        pl_config_free(cfg);
        snprintf(path_over, sizeof path_over, "data.path=%s", o->input);
        over[n++] = path_over;
        cfg = pl_config_load(ini, n, over, reg);
    }
    if (!cfg && !pl_error_message()[0]) pl_error_set(PL_ERR_CONFIG, "%s: invalid", ini);
    free(over);
    return cfg;
}

/* The model's predict members: predict_needs (ABI 2.4) and the outputs
 * verbs (ABI 2.9; an older plugin's vtable ends before them: never read). */
static pl_status predict_vtable(const pl_config *cfg, const pl_model_vtable **out) {
    const pl_plugin_desc *md = pl_config_plugin(cfg, "model");
    if (!md) return pl_error_set(PL_ERR_CONFIG, "predict: the run's config has no [model]");
    const pl_model_vtable *M = md->vtable;
    bool has = md->abi_minor >= 9 && M && M->predict_needs && M->outputs_begin &&
               M->outputs_batch;
    /* ABI 2.4 - 2.8: the model writes the file itself (predict_begin / _batch /
     * _end), as then: a minor version adds, it never takes away */
    bool legacy = md->abi_minor >= 4 && md->abi_minor < 9 && M && M->predict_needs &&
                  M->predict_begin && M->predict_batch && M->predict_end;
    if (!has && !legacy) {
        pl_hint_set("models with predict: see docs/run-files.md (predict output)");
        return pl_error_set(PL_ERR_UNSUPPORTED, "model plugin '%s' (%s, ABI %u.%u) does not "
                            "support predict (no predict_needs/outputs_begin/outputs_batch, "
                            "plugin ABI 2.9)", md->name, pl_config_plugin_path(cfg, "model"),
                            md->abi_major, md->abi_minor);
    }
    *out = M;
    return PL_OK;
}

/* ---- the first batch against predict_needs ------------------------------------------------- */

static pl_status check_batch(const pl_field_list *need, const pl_batch *b, pl_data_split split,
                             const char *input, const char *loader, const char *model) {
    for (int i = 0; i < need->n; i++) {
        const pl_field_spec *f = &need->f[i];
        if (f->optional || !pl_field_in_split(f, split)) continue;
        const pl_tensor *t = pl_batch_find(b, f->name);
        if (t && pl_field_dtype_accepts(f->dtype, t->dtype) && (f->rank < 0 || f->rank == t->ndim))
            continue;
        char have[512] = "";
        size_t n = 0;
        for (int j = 0; j < b->n && n < sizeof have; j++)
            n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", j ? ", " : "", b->names[j]);
        char rank[32] = "any rank";
        if (f->rank >= 0) snprintf(rank, sizeof rank, "rank %d", f->rank);
        if (!t) {
            pl_hint_set("write the dataset '%s' into %s as the run's training file has it "
                        "(the run's config.ini [data] section lists the datasets)", f->name,
                        input);
            return pl_error_set(PL_ERR_IO, "%s: model '%s' needs batch field '%s' to predict, and "
                                "loader '%s' found no dataset for it in split '%s' of this file "
                                "(fields read: %s)", input, model, f->name, loader,
                                pl_split_name(split), have[0] ? have : "none");
        }
        return pl_error_set(PL_ERR_IO, "%s: field '%s' of split '%s' is %s rank %d; model '%s' "
                            "needs %s, %s", input, f->name, pl_split_name(split),
                            pl_dtype_name(t->dtype), t->ndim, model,
                            pl_field_dtype_name(f->dtype), rank);
    }
    return PL_OK;
}

/* ---- predict ----------------------------------------------------------------------------- */

/* The walk over the split: the first batch is checked against predict_needs,
 * each goes to the model's outputs_batch and its outputs to the file; rows
 * and batches are counted. */
typedef struct predict_walk {
    const pl_field_list *need;
    const char *input;
    struct pl_h5_out *file;
    bool legacy; /* a plugin of ABI 2.4 - 2.8: its predict_batch writes the rows */
    int64_t rows, batches;
} predict_walk;

static pl_status predict_batch(trainer *t, const pl_batch *b, pl_data_split split, void *arg) {
    predict_walk *w = arg;
    if (w->batches == 0) {
        pl_status cs = check_batch(w->need, b, split, w->input, t->loader.desc->name,
                                   t->model.desc->name);
        if (cs) return cs;
    }
    pl_status st = w->legacy ? MODEL(t)->predict_batch(t->model.self, b, split)
                             : tr_outputs_batch(t, PL_OUTPUTS_PREDICT, w->file, b, split);
    if (st)
        return pl_error_prefix(st, "predict: model '%s', %s batch %lld", t->model.desc->name,
                               pl_split_name(split), (long long)b->index);
    w->rows += b->size;
    w->batches++;
    return PL_OK;
}

static pl_status parse_split(const char *s, pl_data_split *out) {
    if (!s || !s[0]) s = "test";
    for (int i = 0; i < PL_SPLIT_COUNT; i++)
        if (!strcmp(s, pl_split_name((pl_data_split)i))) {
            *out = (pl_data_split)i;
            return PL_OK;
        }
    return pl_error_set(PL_ERR_CONFIG, "predict: --split %s: expected train, val or test", s);
}

/* Attributes the model writes on OUT.h5's root. */
static pl_status fill_attrs(pl_meta *a, const pl_predict_options *o, const char *ckpt,
                            const trainer *t, pl_data_split split) {
    char rd[PATH_MAX], hash[32];
    if (!realpath(o->run_dir, rd)) snprintf(rd, sizeof rd, "%s", o->run_dir);
    /* the hash of the configuration that trained the weights, as the
     * checkpoint records it (this process's config differs in data.path) */
    pl_st_file *f = NULL;
    const char *h = NULL;
    if (!pl_st_open(ckpt, &f)) h = pl_st_meta(f, "config_hash");
    pl_error_clear();
    snprintf(hash, sizeof hash, "%s", h ? h : "");
    if (f) pl_st_close(f);
    pl_status st = pl_meta_set_str(a, "run_dir", rd);
    if (!st) st = pl_meta_set_str(a, "checkpoint", ckpt);
    if (!st) st = pl_meta_set_str(a, "config_hash", hash);
    if (!st) st = pl_meta_set_str(a, "model", t->model.desc->name);
    if (!st) st = pl_meta_set_str(a, "model_version", t->model.desc->version);
    if (!st) st = pl_meta_set_str(a, "input", o->input);
    if (!st) st = pl_meta_set_str(a, "split", pl_split_name(split));
    if (!st) st = pl_meta_set_str(a, "pipeline_version", PL_VERSION_STRING);
    return st;
}

static int exit_code(pl_status st) {
    return st == PL_ERR_CONFIG || st == PL_ERR_UNSUPPORTED ? 2 : 1;
}

static void report(void) {
    fprintf(stderr, "error: %s\n", pl_error_message()[0] ? pl_error_message() : "predict failed");
    const char *hint = pl_hint_get();
    fprintf(stderr, "hint: %s\n",
            hint && hint[0] ? hint : "see `pipeline help predict` and docs/run-files.md");
}

int pl_predict_run(pl_registry *reg, const pl_predict_options *o) {
    double t0 = tr_now();
    pl_hint_clear();
    pl_data_split split = PL_SPLIT_TEST;
    char ini[PATH_MAX + 16], ckpt[PATH_MAX];
    struct stat sb;
    if (parse_split(o->split, &split)) return report(), 2;
    if (stat(o->run_dir, &sb) || !S_ISDIR(sb.st_mode)) {
        pl_hint_set("give the directory `pipeline run` wrote (e.g. runs/NAME/latest)");
        pl_error_set(PL_ERR_IO, "run directory %s: %s", o->run_dir,
                     errno == ENOENT ? "no such directory" : "not a directory");
        return report(), 2;
    }
    snprintf(ini, sizeof ini, "%s/config.ini", o->run_dir);
    if (!is_file(ini)) {
        pl_hint_set("give the directory `pipeline run` wrote (e.g. runs/NAME/latest)");
        pl_error_set(PL_ERR_IO, "%s is not a run directory: it has no config.ini", o->run_dir);
        return report(), 2;
    }
    if (!is_file(o->input)) {
        pl_error_set(PL_ERR_IO, "input %s: no such file", o->input);
        return report(), 2;
    }
    char ri[PATH_MAX], ro[PATH_MAX];
    if (realpath(o->input, ri) && realpath(o->output, ro) && !strcmp(ri, ro)) {
        pl_error_set(PL_ERR_CONFIG, "predict: OUT.h5 %s is the input file", o->output);
        return report(), 2;
    }
    pl_config *cfg = load_run_config(ini, o, reg);
    if (!cfg) return report(), 2;
    const pl_model_vtable *M = NULL;
    pl_field_list need = {0};
    pl_status st = predict_vtable(cfg, &M);
    if (!st) st = M->predict_needs(pl_config_section_get(cfg, "model"), &need);
    if (!st) st = resolve_checkpoint(o->run_dir, o->checkpoint, ckpt, sizeof ckpt);
    if (st) {
        pl_config_free(cfg);
        return report(), exit_code(st);
    }

    trainer T, *t = &T;
    /* loaders read what the run saved in its directory (never write) */
    st = tr_offline_init(t, cfg, reg, o->run_dir);
    if (!st) st = tr_setup_device(t);
    pl_meta *attrs = pl_meta_new();
    if (!st && !attrs) st = pl_error_set(PL_ERR_NOMEM, "predict: out of memory");
    if (!st) st = pl_meta_set_str(t->ctx.meta, "predict_split", pl_split_name(split));
    if (!st) st = tr_build_model(t, NULL);
    if (!st) st = tr_load_weights(t, ckpt);
    if (!st) st = fill_attrs(attrs, o, ckpt, t, split);

    /* written to a temporary file, renamed when everything succeeded
     * (outputs.c); removed on any error */
    predict_walk w = {&need, o->input, NULL, false, 0, 0};
    w.legacy = !st && t->model.desc->abi_minor < 9;
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", o->output, (long)getpid());
    if (!st && w.legacy) st = M->predict_begin(t->model.self, tmp, attrs);
    else if (!st)
        st = tr_outputs_begin(t, PL_OUTPUTS_PREDICT, o->output, attrs, &w.file, NULL, 0);
    if (st == PL_ERR_UNSUPPORTED) pl_hint_set("models with predict: see docs/run-files.md");
    bool begun = w.file != NULL || (w.legacy && !st);
    if (!st) st = tr_each_batch(t, split, -1, predict_batch, &w);
    pl_tape_clear();
    if (begun && !w.legacy) st = tr_outputs_finish(t, PL_OUTPUTS_PREDICT, &w.file, st);
    if (begun && w.legacy) {
        if (!st) st = M->predict_end(t->model.self);
        if (!st && rename(tmp, o->output))
            st = pl_error_set(PL_ERR_IO, "predict: cannot rename %s to %s: %s", tmp, o->output,
                              strerror(errno));
    }
    int code = 0;
    if (st) {
        code = exit_code(st);
        report();
    } else {
        printf("predict: %lld rows (%lld batches) of split '%s' of %s with model '%s' (%s) -> %s "
               "(%.1fs)\n", (long long)w.rows, (long long)w.batches, pl_split_name(split), o->input,
               t->model.desc->name, ckpt, o->output, tr_now() - t0);
    }
    tr_stage_destroy(&t->prec);
    tr_stage_destroy(&t->model);
    tr_stage_destroy(&t->loader);
    if (st && begun && w.legacy) unlink(tmp); /* destroy closed what predict_end did not */
    tr_offline_free(t);
    pl_meta_free(attrs);
    pl_config_free(cfg);
    return code;
}
