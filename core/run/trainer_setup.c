/* trainer_setup.c - a run's setup: the [trainer] settings and the checks of
 * `pipeline check`, the device, the stages (tr_build_model and the optimizer,
 * schedulers, averager, callbacks), init_from and resume: the steps of
 * pl_trainer_run (trainer_phases.c) before the fit, and what `pipeline
 * export` / `predict` build a model with.
 *
 * Stages are created in this order: data, precision, model (a precision
 * with convert_param converts each parameter the model seals; its setup()
 * then converts the rest into the form it keeps), optimizer, schedulers,
 * averager; then init_from (weights only, precision setup again) and
 * resume. Without a [precision] section the parameters are kept as fp32
 * keeps them (Lightning's default precision "32-true"): a float parameter
 * the model created in another dtype (bf16 / f16 checkpoint views) is
 * converted to f32 with pl_param_convert, one tensor at a time.
 * Load time (summary.json load_seconds, load_peak_rss_bytes) is measured
 * from model create to the end of weight loading (precision setup and
 * init_from included; the optimizer, scheduler and averager creates in
 * between are counted too), the peak as getrusage's ru_maxrss.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend_loader.h"
#include "crash.h"
#include "callback.h"
#include "trainer_internal.h"


/* ---- settings and checks -------------------------------------------------------------------- */

static pl_status parse_monitors(const pl_config_section *tr, char names[][64], bool *maxes, int *n);

static void read_settings(trainer *t) {
    const pl_config_section *tr = t->tr;
    t->max_epochs = pl_cfg_int(tr, "max_epochs", 1000);
    t->max_steps = pl_cfg_int(tr, "max_steps", -1);
    if (t->max_epochs < 0) t->max_epochs = INT64_MAX / 2;
    t->accum = pl_cfg_int(tr, "accumulate_grad_batches", 1);
    t->clip = pl_cfg_float(tr, "gradient_clip_val", 0);
    t->clip_norm = strcmp(pl_cfg_str(tr, "gradient_clip_algorithm", "norm"), "value") != 0;
    t->val_interval = tr_cfg_limit(tr, "val_check_interval");
    t->val_every_epochs = pl_cfg_int(tr, "check_val_every_n_epoch", 1);
    t->limit[PL_SPLIT_TRAIN] = tr_cfg_limit(tr, "limit_train_batches");
    t->limit[PL_SPLIT_VAL] = tr_cfg_limit(tr, "limit_val_batches");
    t->limit[PL_SPLIT_TEST] = tr_cfg_limit(tr, "limit_test_batches");
    t->early_stop = pl_cfg_bool(tr, "early_stopping", false);
    t->monitor = pl_cfg_str(tr, "monitor", "val_loss");
    parse_monitors(tr, t->monitors, t->mode_maxes, &t->n_monitor); /* checked by pl_trainer_check_options */
    t->mode_max = t->mode_maxes[0];
    t->patience = pl_cfg_int(tr, "patience", 3);
    t->min_delta = pl_cfg_float(tr, "min_delta", 0);
    t->on_nan_skip = !strcmp(pl_cfg_str(tr, "on_nan", "stop"), "skip");
    t->max_nan_skips = pl_cfg_int(tr, "max_consecutive_nan_skips", 10);
    t->ckpt_every = pl_cfg_int(tr, "checkpoint_every_n_epochs", 0);
    t->ckpt_every_steps = pl_cfg_int(tr, "checkpoint_every_n_train_steps", 0);
    t->save_last = pl_cfg_bool(tr, "save_last", true);
    t->save_best = pl_cfg_bool(tr, "save_best", true);
    t->log_every = pl_cfg_int(tr, "log_every_n_steps", 50);
    t->do_test = pl_cfg_bool(tr, "test", true);
    t->do_export = pl_cfg_bool(tr, "export", false);
    const char *cg = pl_cfg_str(tr, "cuda_graphs", "auto");
    t->gs.mode = !strcmp(cg, "true") ? 1 : !strcmp(cg, "auto") ? 2 : 0; /* tr_graph_begin decides */
    t->gs.explicit_on = t->gs.mode == 1;
}

/* [trainer] monitor = M1[,M2...] and mode = min|max[,...] (one mode for all, or
 * one per metric) into names and directions. PL_ERR_CONFIG naming the key on
 * more than PL_MONITOR_MAX metrics, an empty or non-"val_" name, a mode other
 * than min/max, or a mode count that is neither 1 nor the metric count. */
static pl_status parse_monitors(const pl_config_section *tr, char names[][64], bool *maxes, int *n) {
    const char *mon = pl_cfg_str(tr, "monitor", "val_loss"), *mode = pl_cfg_str(tr, "mode", "min");
    char mb[512], db[256];
    snprintf(mb, sizeof mb, "%s", mon);
    snprintf(db, sizeof db, "%s", mode);
    *n = 0;
    names[0][0] = 0;
    maxes[0] = false;
    char *save = NULL;
    for (char *tok = strtok_r(mb, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t L = strlen(tok);
        while (L && tok[L - 1] == ' ') tok[--L] = 0;
        if (*n == PL_MONITOR_MAX)
            return pl_error_set(PL_ERR_CONFIG, "[trainer] monitor = %s: at most %d metrics", mon,
                                PL_MONITOR_MAX);
        if (!L || L >= 64)
            return pl_error_set(PL_ERR_CONFIG, "[trainer] monitor = %s: empty or overlong metric name",
                                mon);
        snprintf(names[(*n)++], 64, "%s", tok);
    }
    if (*n == 0) return pl_error_set(PL_ERR_CONFIG, "[trainer] monitor is empty");
    int nm = 0;
    bool mv[PL_MONITOR_MAX + 1];
    save = NULL;
    for (char *tok = strtok_r(db, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        size_t L = strlen(tok);
        while (L && tok[L - 1] == ' ') tok[--L] = 0;
        if (strcmp(tok, "min") && strcmp(tok, "max")) {
            pl_hint_set("mode is min or max, or a list with one per monitored metric (min,max)");
            return pl_error_set(PL_ERR_CONFIG, "[trainer] mode = %s: '%s' is neither min nor max",
                                mode, tok);
        }
        if (nm == PL_MONITOR_MAX) break;
        mv[nm++] = !strcmp(tok, "max");
    }
    if (nm != 1 && nm != *n) {
        pl_hint_set("give one mode for all metrics, or one per metric in the order of monitor");
        return pl_error_set(PL_ERR_CONFIG, "[trainer] monitor = %s names %d metrics but mode = %s "
                            "gives %d directions", mon, *n, mode, nm);
    }
    for (int k = 0; k < *n; k++)
        maxes[k] = nm == 1 ? mv[0] : mv[k];
    return PL_OK;
}

pl_status pl_trainer_check_options(const pl_config *cfg) {
    const pl_config_section *tr = pl_config_section_get(cfg, "trainer");
    char names[PL_MONITOR_MAX][64];
    bool maxes[PL_MONITOR_MAX];
    int n;
    return tr ? parse_monitors(tr, names, maxes, &n) : PL_OK;
}

int tr_fail(trainer *t, int code) {
    tr_progress_clear(t);
    const char *msg = pl_error_message();
    if (t->world > 1)
        fprintf(stderr, "error: rank %d of %d: %s\n", t->rank, t->world, msg[0] ? msg : "run failed");
    else
        fprintf(stderr, "error: %s\n", msg[0] ? msg : "run failed");
    if (t->log) fprintf(t->log, "error: %s\n", msg);
    const char *hint = pl_hint_get();
    if (!(hint && hint[0]))
        hint = pl_error_status() == PL_ERR_DEVICE ? "use pipeline.device=cpu, or a machine whose GPU "
                                                    "driver matches the CUDA runtime"
               : pl_error_status() == PL_ERR_NOMEM && strstr(msg, "out of memory allocating")
                   ? "a smaller batch size (tools/scale_batch_size.py CONFIG --capacity SIZE "
                     "finds the largest that fits), activation checkpointing, or a half or "
                     "4-bit precision stage"
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

/* ---- stages --------------------------------------------------------------------------------- */

/* After a resume: a learning-rate schedule that differs from the one the
 * checkpoint was trained on is allowed (extending a run is how max_epochs
 * is raised), but the result is then no continuation of the earlier run: a
 * scheduler that spans the whole fit (cosine, onecycle with total_steps = 0)
 * is planned over this run's length, so the earlier steps followed another
 * curve and the next step's lr jumps. Say so, with the numbers. */
static void warn_schedule_change(trainer *t) {
    if (isnan(t->resume_lr_factor)) return; /* a checkpoint older than the record */
    double f = tr_lr_factor(t);
    if (f == t->resume_lr_factor) return;
    char why[256] = "";
    if (t->resume_total_steps >= 0 && t->resume_total_steps != t->ctx.total_steps)
        snprintf(why, sizeof why, "; the fit now plans %lld optimizer steps, the checkpoint's run "
                 "planned %lld, and a scheduler that spans the fit (total_steps = 0) is re-planned "
                 "over the new length", (long long)t->ctx.total_steps,
                 (long long)t->resume_total_steps);
    tr_log(t, "warning: learning-rate factor of step %lld is %.6g here, %.6g in the run that wrote "
           "the checkpoint%s: the steps before the resume followed another schedule, so the "
           "result will not equal an uninterrupted run (set the scheduler's total_steps to keep "
           "one schedule across resumes)\n", (long long)t->step, f, t->resume_lr_factor, why);
}

/* No [precision] section: what fp32 does (Lightning's default precision
 * "32-true"): a parameter the model created in another float dtype (bf16 /
 * f16 checkpoint views) is converted to f32, one tensor at a time. */
pl_status tr_default_precision(trainer *t) {
    pl_status st = pl_params_convert(t->ctx.params, PL_F32, NULL);
    return st ? pl_error_prefix(st, "default precision (f32, no [precision] section)") : PL_OK;
}

pl_status tr_setup_device(trainer *t) {
    /* the cpu backend plugin, from the run's plugin path (--plugin-path too):
     * a missing cpu.so stops the run here, naming the dirs */
    if (pl_backend_load(t->reg, PL_DEVICE_CPU)) return pl_error_status();
    int64_t threads = pl_cfg_int(t->pipe, "threads", 0);
    if (threads > 0) {
        omp_set_num_threads((int)threads);
        /* OpenBLAS's pool, in the cpu backend: OpenMP's setting does not reach it */
        const pl_backend *cpu = pl_backend_get(PL_DEVICE_CPU);
        char n[32];
        snprintf(n, sizeof n, "%lld", (long long)threads);
        pl_status so = cpu && PL_BACKEND_HAS(cpu, set_option) && cpu->set_option
                           ? cpu->set_option("threads", n)
                           : PL_OK;
        if (!cpu || (so && so != PL_ERR_UNSUPPORTED)) return pl_error_status();
        if (so) pl_error_clear(); /* a CPU backend without the setting */
    }

    const char *dev = pl_cfg_str(t->pipe, "device", "cpu");
    /* NAME[:N] loads backend plugin NAME into the accelerator slot (cuda, or
     * strict: the GPU-like emulation of plugins/backends/strict); auto tries cuda */
    char backend[64];
    int dev_index;
    if (pl_device_spec(dev, backend, sizeof backend, &dev_index)) return pl_error_status();
    bool is_auto = !strcmp(backend, "auto");
    if (strcmp(backend, "cpu") != 0 &&
        pl_backend_load_named(t->reg, PL_DEVICE_CUDA, is_auto ? "cuda" : backend) != PL_OK) {
        if (!is_auto) return pl_error_status();
        printf("device = auto: no usable CUDA backend (%s); training on the CPU\n",
               pl_error_message());
        pl_error_clear();
    }
    if (pl_device_parse(dev, &t->ctx.device)) return pl_error_status();
    if (t->ctx.device.type != PL_DEVICE_CPU) {
        /* run-wide backend settings (allow_tf32: off by default, as in PyTorch) */
        const pl_backend *be = pl_backend_get(t->ctx.device.type);
        bool tf32 = pl_cfg_bool(t->pipe, "allow_tf32", false);
        pl_status so = PL_ERR_UNSUPPORTED;
        if (be && PL_BACKEND_HAS(be, set_option) && be->set_option)
            so = be->set_option("allow_tf32", tf32 ? "true" : "false");
        if (so && so != PL_ERR_UNSUPPORTED) return pl_error_status();
        if (so && tf32)
            printf("allow_tf32 = true: backend '%s' has no TF32 setting; f32 GEMMs stay f32\n",
                   be ? be->name : "?");
        pl_error_clear();
    }
    return PL_OK;
}

static pl_status prec_convert(void *ud, pl_params *ps, int i) {
    trainer *t = ud;
    return PREC(t)->convert_param(t->prec.self, ps, i);
}

pl_status tr_build_model(trainer *t, double *load_start) {
    pl_status st = tr_stage_create(t, &t->loader, "data");
    const char *data_line = pl_meta_get_str(t->ctx.meta, "data_summary");
    if (!st && data_line) tr_log(t, "data: %s\n", data_line);
    if (load_start) *load_start = tr_now();
    /* the precision first, so that it converts each parameter as the model
     * seals it (pl_params_seal: a backbone is never whole in its file dtype) */
    if (!st) st = tr_stage_create(t, &t->prec, "precision");
    if (!st && t->prec.self && t->prec.desc->abi_minor >= 7 && PREC(t)->convert_param)
        pl_params_set_seal(t->ctx.params, prec_convert, t);
    if (!st) st = tr_stage_create(t, &t->model, "model");
    pl_params_set_seal(t->ctx.params, NULL, NULL);
    if (!st && !t->model.self) st = pl_error_set(PL_ERR_CONFIG, "no [model] section");
    if (!st && t->prec.self) st = PREC(t)->setup(t->prec.self, t->ctx.params);
    if (!st && !t->prec.self) st = tr_default_precision(t);
    return st;
}

pl_status tr_offline_init(trainer *t, pl_config *cfg, pl_registry *reg, const char *run_dir) {
    memset(t, 0, sizeof *t);
    t->cfg = cfg;
    t->reg = reg;
    t->pipe = pl_config_section_get(cfg, "pipeline");
    t->tr = pl_config_section_get(cfg, "trainer");
    t->world = 1;
    t->stride = 1;
    t->ctx.seed = (uint64_t)pl_cfg_int(t->pipe, "seed", 42);
    t->ctx.verbose = pl_cfg_bool(t->pipe, "verbose", false);
    if (run_dir && run_dir[0]) {
        snprintf(t->run_dir, sizeof t->run_dir, "%s", run_dir);
        t->ctx.run_dir = t->run_dir;
    }
    t->ctx.meta = pl_meta_new();
    t->ctx.params = pl_params_new();
    if (!t->ctx.meta || !t->ctx.params) return pl_error_set(PL_ERR_NOMEM, "out of memory");
    /* current until tr_offline_free: the model's forward reads the
     * autocast the precision sets in it (plugin.h, "Autocast") */
    t->prev_ctx = pl_run_context_make_current(&t->ctx);
    return PL_OK;
}

void tr_offline_free(trainer *t) {
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    t->ctx.params = NULL;
    t->ctx.meta = NULL;
    if (pl_run_context_current() == &t->ctx) pl_run_context_make_current(t->prev_ctx);
}

void tr_destroy_stages(trainer *t) {
    tr_stage_destroy(&t->strat);
    tr_stage_destroy(&t->avg);
    for (int k = t->n_sched - 1; k >= 0; k--) tr_stage_destroy(&t->sched[k]);
    t->ctx.optimizer = NULL; /* borrowed from t->optim */
    t->ctx.optimizer_self = NULL;
    tr_stage_destroy(&t->optim);
    tr_stage_destroy(&t->prec);
    tr_stage_destroy(&t->model);
    tr_stage_destroy(&t->loader);
}

/* Bytes of frozen and trainable parameter storage as the precision stage
 * left them (nf4: packed codes plus quantization constants). */
static void count_parameter_bytes(trainer *t) {
    t->frozen_bytes = t->trainable_bytes = 0;
    for (int i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_tensor *p = pl_params_at(t->ctx.params, i)->t;
        size_t b = pl_tensor_storage_nbytes(p); /* NF4: codes + quantization state */
        if (p->requires_grad)
            t->trainable_bytes += b;
        else
            t->frozen_bytes += b;
    }
    tr_log(t, "parameter storage: frozen %.2f MiB, trainable %.2f MiB\n",
          t->frozen_bytes / 1048576.0, t->trainable_bytes / 1048576.0);
}

/* ---- the run's setup (pl_trainer_run's first steps) ----------------------------------------- */

/* The trainer's fields from the config and the options; the option checks,
 * the requirements (`[pipeline] requires`), init_from refs and the device.
 * Returns the exit code of a run that cannot start (0: go on). */
static int run_settings(trainer *t, pl_config *cfg, pl_registry *reg, const pl_run_options *opts) {
    t->t_start = tr_now();
    t->cfg = cfg;
    t->reg = reg;
    t->opts = opts;
    t->pipe = pl_config_section_get(cfg, "pipeline");
    t->tr = pl_config_section_get(cfg, "trainer");
    t->tty = isatty(STDOUT_FILENO);
    t->resume_total_steps = -1;
    t->resume_lr_factor = NAN;
    if (pl_trainer_check_options(cfg)) return tr_fail(t, 2);
    read_settings(t);
    const char *init0 = pl_cfg_str(t->tr, "init_from", "");
    const char *res0 = opts && opts->resume ? opts->resume : pl_cfg_str(t->tr, "resume", "");
    if (t->max_epochs == 0 && t->max_steps != 0 && !init0[0] && !(res0 && res0[0])) {
        /* it would test (and export) the untrained initialization and exit 0 */
        pl_error_set(PL_ERR_CONFIG, "[trainer] max_epochs = 0 trains nothing, and there are no "
                     "weights to evaluate (no init_from, no resume)");
        pl_hint_set("set max_epochs >= 1, or give [trainer] init_from (or --resume) to test "
                    "existing weights");
        return tr_fail(t, 2);
    }
    return 0;
}

/* After the requirements ran: the output references, the device and the
 * run's context. Returns the exit code of a run that cannot start. */
static int run_context(trainer *t) {
    if (tr_resolve_output_refs(t)) return tr_fail(t, 2);
    if (tr_setup_device(t)) return tr_fail(t, 2);
    t->ctx.seed = (uint64_t)pl_cfg_int(t->pipe, "seed", 42);
    t->ctx.verbose = pl_cfg_bool(t->pipe, "verbose", false);
    t->ctx.meta = pl_meta_new();
    t->ctx.params = pl_params_new();
    return 0;
}

/* The strategy (data parallel), the run directory with log.txt, metrics.csv
 * and config.ini (rank 0), and the run's first log line. Returns the exit
 * code of a run that cannot start (0: go on). */
static int open_run_dir(trainer *t) {
    /* data parallel: the strategy first, so that only rank 0 makes the run directory */
    if (tr_dist_create(t)) {
        tr_fail(t, 2);
        tr_destroy_stages(t);
        return 2;
    }
    if (t->rank > 0) t->tty = false;
    if (t->rank == 0 && tr_make_run_dir(t)) {
        tr_fail(t, 1);
        tr_dist_abort(t, 1);
        return 1;
    }
    if (tr_dist_share_run_dir(t)) {
        tr_fail(t, 1);
        tr_dist_abort(t, 1);
        return 1;
    }
    t->ctx.run_dir = t->run_dir;
    char path[PATH_MAX + 32];
    if (t->rank == 0) {
        snprintf(path, sizeof path, "%s/log.txt", t->run_dir);
        t->log = fopen(path, "w");
        snprintf(path, sizeof path, "%s/metrics.csv", t->run_dir);
        t->metrics = fopen(path, "w");
        if (t->metrics) fprintf(t->metrics, "step,epoch,key,value\n");
    }
    tr_set_message_run(t); /* pl_message from plugins: the terminal and log.txt */
    if (t->rank == 0) {
        snprintf(path, sizeof path, "%s/config.ini", t->run_dir);
        pl_config_write_ini(t->cfg, path);
    }
    /* the CPU kernel of bf16 GEMMs is chosen at run time (the cpu backend's cpuid) */
    char isa[128], bt[32], bp[32], gemm[32], bc[32];
    tr_log(t,
           "run %s: config %s, device %s, seed %llu, %d threads (OpenBLAS %s kernels, %d, %s), "
           "CPU bf16 GEMM %s (CPU: %s)\n",
           t->run_dir, pl_config_path(t->cfg), pl_cfg_str(t->pipe, "device", "cpu"),
           (unsigned long long)t->ctx.seed, omp_get_max_threads(),
           pl_backend_info(PL_DEVICE_CPU, "blas_core", bc, sizeof bc),
           atoi(pl_backend_info(PL_DEVICE_CPU, "blas_threads", bt, sizeof bt)),
           pl_backend_info(PL_DEVICE_CPU, "blas_parallel", bp, sizeof bp),
           pl_backend_info(PL_DEVICE_CPU, "cpu_gemm_bf16", gemm, sizeof gemm),
           pl_backend_info(PL_DEVICE_CPU, "cpu_features", isa, sizeof isa));
    if (t->world > 1)
        tr_log(t, "strategy %s: %d processes (data parallel)\n", t->strat.desc->name, t->world);
    if (t->rank == 0) tr_sweep_orphan_tmp(t); /* what killed runs left half-written */
    return 0;
}

int tr_run_settings(trainer *t, pl_config *cfg, pl_registry *reg, const pl_run_options *opts) {
    return run_settings(t, cfg, reg, opts);
}

int tr_run_open(trainer *t) {
    int code = run_context(t);
    return code ? code : open_run_dir(t);
}

/* Data parallel with the trainer's striding: every process needs at least one
 * training batch per epoch. */
static pl_status check_ddp_split(trainer *t) {
    int64_t nl = LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN);
    if (nl < t->stride)
        return pl_error_set(PL_ERR_CONFIG, "data parallel over %d processes: the training split "
                            "has %lld batch(es) per epoch, fewer than one per process, and "
                            "loader '%s' cannot split a batch (no shard function)", t->world,
                            (long long)nl, t->loader.desc->name);
    tr_log(t, "ddp: each of %d processes takes %lld of the %lld training batches per "
           "epoch (batches r, r+%d, ...)%s\n", t->world, (long long)(nl / t->stride),
           (long long)nl, t->stride, nl % t->stride ? "; the remainder is dropped" : "");
    return PL_OK;
}

/* steps for schedulers: optimizer steps per epoch and in the whole fit */
static void plan_steps(trainer *t) {
    int64_t nb = tr_limit_batches(t->limit[PL_SPLIT_TRAIN],
                                  LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN) /
                                      t->stride);
    t->ctx.steps_per_epoch = (nb + t->accum - 1) / t->accum;
    t->ctx.max_epochs = t->max_epochs;
    t->ctx.total_steps = t->ctx.steps_per_epoch * t->max_epochs;
    if (t->max_steps >= 0 && (t->max_steps < t->ctx.total_steps || t->max_epochs >= INT64_MAX / 4))
        t->ctx.total_steps = t->max_steps;
}

/* The optimizer and a strategy's learning-rate scaling; then the optimizer
 * goes into the run context (ctx.optimizer, ABI 2.9), where the schedulers
 * and averagers created next read its groups (their base lr). */
static pl_status create_optimizer(trainer *t) {
    pl_status st = tr_stage_create(t, &t->optim, "optimizer");
    if (!st && !t->optim.self)
        st = pl_error_set(PL_ERR_CONFIG, "no [optimizer] section (training needs one)");
    /* a strategy's learning-rate scaling rule (ddp lr_scaling = linear: x world size,
     * Goyal et al. 2017; sqrt; off by default), applied to every group's lr */
    double lr_mult = 1;
    if (!st && t->world > 1 && pl_meta_get_float(t->ctx.meta, "strategy.lr_scale", &lr_mult) == PL_OK &&
        lr_mult != 1) {
        for (int g = 0; g < OPTIM(t)->num_groups(t->optim.self); g++) {
            pl_param_group *pg = OPTIM(t)->group(t->optim.self, g);
            pg->initial_lr *= lr_mult;
            pg->lr *= lr_mult;
        }
        tr_log(t, "ddp: learning rates scaled by %g (lr_scaling, %d processes)\n", lr_mult,
               t->world);
    } else if (!st) {
        pl_error_clear(); /* no rule published: no scaling */
    }
    if (!st) {
        t->ctx.optimizer = OPTIM(t);
        t->ctx.optimizer_self = t->optim.self;
    }
    return st;
}

/* Every [scheduler*] section, in file order. */
static pl_status create_schedulers(trainer *t) {
    pl_status st = PL_OK;
    for (int i = 0; i < pl_config_section_count(t->cfg) && !st; i++) {
        const char *sec = pl_cfg_section_name(pl_config_section_at(t->cfg, i));
        if (pl_stage_section_kind(sec) != PL_KIND_SCHEDULER) continue;
        if (t->n_sched == PL_MAX_SCHEDULERS) {
            st = pl_error_set(PL_ERR_CONFIG, "[%s]: more than %d scheduler sections", sec,
                              PL_MAX_SCHEDULERS);
            break;
        }
        st = tr_stage_create(t, &t->sched[t->n_sched], sec);
        if (t->sched[t->n_sched].self) t->n_sched++;
    }
    return st;
}

pl_status tr_run_build(trainer *t, double *load_start) {
    pl_status st = pl_trainer_check_fields(t->cfg);
    pl_alloc_reset_peak(t->ctx.device); /* ph_load: model build, weights, precision */
    if (!st) st = tr_build_model(t, load_start);
    if (!st) st = tr_dist_shard(t);
    if (!st && t->stride > 1) st = check_ddp_split(t);
    if (!st) plan_steps(t);
    if (!st) st = create_optimizer(t);
    if (!st) st = create_schedulers(t);
    if (!st) st = tr_stage_create(t, &t->avg, "averager");
    /* the callbacks (callback.h): before a resume, which restores their state */
    if (!st) st = tr_callbacks_create(t);
    int64_t params_total = 0, params_trainable = 0; /* a 7B model overflows an int */
    for (int i = 0; i < pl_params_count(t->ctx.params); i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        int64_t n = pl_tensor_numel(p->t);
        params_total += n;
        if (p->t->requires_grad) params_trainable += n;
    }
    if (!st)
        tr_log(t, "model %s: %lld parameters (%lld trainable); %lld optimizer steps per epoch\n",
              t->model.desc->name, (long long)params_total, (long long)params_trainable,
              (long long)t->ctx.steps_per_epoch);
    return st;
}

/* --resume PATH|last or [trainer] resume: the checkpoint's weights, stage
 * states and loop counters. */
static pl_status resume_from(trainer *t, const char *resume) {
    pl_status st = PL_OK;
    char p[PATH_MAX];
    if (!strcmp(resume, "last")) {
        char latest[PATH_MAX];
        pl_trainer_latest_dir(t->cfg, latest, sizeof latest);
        *strrchr(latest, '/') = 0; /* RUN_DIR/NAME */
        if (tr_newest_last_checkpoint(latest, t->run_dir, p, sizeof p))
            st = pl_error_set(PL_ERR_IO, "--resume last: no earlier run of %s has a last "
                              "checkpoint under %s", pl_config_path(t->cfg), latest);
    } else {
        snprintf(p, sizeof p, "%s", resume);
    }
    if (!st) {
        st = tr_load_checkpoint(t, p, false);
        if (!st && t->batch > 0)
            tr_log(t, "resumed from %s at epoch %lld, batch %lld (mid-epoch), step %lld\n", p,
                  (long long)t->epoch, (long long)t->batch, (long long)t->step);
        else if (!st)
            tr_log(t, "resumed from %s at epoch %lld, step %lld\n", p, (long long)t->epoch,
                  (long long)t->step);
        if (!st) tr_adopt_earlier_best(t, p);
        if (!st) warn_schedule_change(t);
    }
    return st;
}

pl_status tr_run_load(trainer *t, double load_start) {
    pl_status st = PL_OK;
    /* weights init / resume */
    const char *init = pl_cfg_str(t->tr, "init_from", "");
    if (init[0]) {
        char p[PATH_MAX];
        st = tr_resolve_init_from(t, init, p, sizeof p);
        if (!st) st = tr_load_checkpoint(t, p, true);
        if (!st && t->prec.self) st = PREC(t)->setup(t->prec.self, t->ctx.params);
    }
    if (!st) {
        t->load_s = tr_now() - load_start;
        t->load_peak_rss = tr_peak_rss_bytes();
        tr_peak_fold(t, &t->ph_load, false);
        tr_log(t, "loaded model in %.2f s, peak resident %.1f MiB\n", t->load_s,
               t->load_peak_rss / 1048576.0);
    }
    const char *resume = t->opts && t->opts->resume ? t->opts->resume
                                                    : pl_cfg_str(t->tr, "resume", "");
    if (!st && resume && resume[0]) st = resume_from(t, resume);
    if (!st) st = tr_dist_check_params(t);
    if (!st) count_parameter_bytes(t);
    return st;
}
