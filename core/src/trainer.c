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

/* ---- small utilities ------------------------------------------------------- */

double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Peak resident memory of this process image: /proc/self/status VmHWM, the
 * high-water mark of the current address space. getrusage's ru_maxrss is not
 * it: Linux keeps ru_maxrss across execve, so a pipeline started from a
 * Python process that holds 500 MB reported the launcher's 500 MB. Falls
 * back to ru_maxrss where /proc is missing. */
size_t tr_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
        fclose(f);
        if (found) return (size_t)kib * 1024;
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: KiB */
}

void tr_progress_clear(trainer *t) {
    if (!t->progress_shown) return;
    fputs("\r\033[K", stdout);
    t->progress_shown = false;
}

static void tr_vlog(trainer *t, const char *fmt, va_list ap) {
    if (t->rank > 0) return; /* rank 0 speaks for a data-parallel run */
    va_list aq;
    va_copy(aq, ap);
    tr_progress_clear(t);
    vprintf(fmt, ap);
    fflush(stdout);
    if (t->log) {
        vfprintf(t->log, fmt, aq);
        fflush(t->log);
    }
    va_end(aq);
}

void tr_log(trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tr_vlog(t, fmt, ap);
    va_end(ap);
}

/* the run pl_message writes into (NULL outside pl_trainer_run: stderr only) */
static trainer *g_log_run;

void pl_message(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    const char *nl = n && line[n - 1] == '\n' ? "" : "\n";
    if (g_log_run)
        tr_log(g_log_run, "%s%s", line, nl);
    else
        fprintf(stderr, "%s%s", line, nl);
}

int tr_mkdir_p(const char *path) {
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

void tr_metric_row(trainer *t, const char *key, double v) {
    if (t->metrics) fprintf(t->metrics, "%lld,%lld,%s,%.9g\n", (long long)t->step,
                            (long long)t->epoch, key, v);
}

/* A `limit_*_batches` / `val_check_interval` value, as Lightning reads it: an
 * integer ("1", "20") is a count of batches, a float ("1.0", "0.25") a
 * fraction of the split. The spelling decides, so 1 is one batch and 1.0 all. */
static pl_limit cfg_limit(const pl_config_section *s, const char *key) {
    const char *v = pl_cfg_get(s, key);
    pl_limit l = {1.0, false};
    if (!v) return l;
    l.value = pl_cfg_float(s, key, 1.0);
    l.is_count = strpbrk(v, ".eE") == NULL;
    return l;
}

static int64_t limit_batches(pl_limit lim, int64_t n) {
    if (lim.is_count) return (int64_t)lim.value < n ? (int64_t)lim.value : n;
    if (lim.value >= 1.0) return n; /* 1.0 = all (Lightning: float 1.0 means 100 %) */
    return (int64_t)floor(lim.value * (double)n);
}

/* ---- stages ------------------------------------------------------------------ */

pl_status tr_stage_create(trainer *t, stage *s, const char *section) {
    s->section = section;
    s->cfg = pl_config_section_get(t->cfg, section);
    s->desc = pl_config_plugin(t->cfg, section);
    if (!s->cfg || !s->desc) return PL_OK; /* optional stage absent */
    s->vt = s->desc->vtable;
    const char *path = pl_config_plugin_path(t->cfg, section);
    pl_status st = pl_stage_fns_of(s->desc, path, &s->fns);
    if (st) return pl_error_prefix(st, "[%s] plugin '%s' (%s)", section, s->desc->name, path);
    pl_crash_context_push("[%s] plugin '%s' (%s): create", section, s->desc->name, path);
    st = s->fns.create(s->cfg, &t->ctx, &s->self);
    pl_crash_context_pop();
    /* "create()" named: a plugin that fails without a message is then told apart */
    if (st) return pl_error_prefix(st, "[%s] plugin '%s' (%s): create()", section, s->desc->name,
                                   path);
    return PL_OK;
}

void tr_stage_destroy(stage *s) {
    if (!s->desc || !s->self) return;
    s->fns.destroy(s->self);
    s->self = NULL;
}

/* ---- optimization step -------------------------------------------------------------- */

/* Total 2-norm of all gradients (as torch.nn.utils.clip_grad_norm_: the norm
 * of the per-tensor norms, i.e. sqrt of the sum of squares) and, when
 * gradient_clip_val > 0, clipping by norm (g *= clip / (norm + 1e-6) when
 * that is < 1) or by value (clamp to [-clip, clip]). Runs as ops on the
 * gradients' device; only the norm comes back to the host. NaN when an op
 * fails (the step's finite check then stops the run). */
static double grad_norm_and_clip(trainer *t) {
    int n = pl_params_count(t->ctx.params);
    pl_no_grad_begin();
    pl_frame_begin();
    pl_tensor *total = NULL;
    bool failed = false;
    for (int i = 0; i < n && !failed; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad || !p->t->grad) continue; /* frozen ones too, wherever they sit */
        pl_tensor *ssq = pl_sum(pl_square(p->t->grad), PL_ALL_DIMS, false);
        total = total ? pl_add(total, ssq) : ssq;
        failed = !total;
    }
    double norm = failed ? NAN : total ? sqrt(pl_tensor_item(total)) : 0.0;
    pl_frame_end();
    if (t->clip > 0 && (!t->clip_norm || t->clip / (norm + 1e-6) < 1.0)) {
        double coef = t->clip / (norm + 1e-6);
        for (int i = 0; i < n; i++) {
            pl_param *p = pl_params_at(t->ctx.params, i);
            if (!p->t->requires_grad || !p->t->grad) continue;
            pl_frame_begin();
            pl_tensor *c = t->clip_norm ? pl_scale(p->t->grad, coef)
                                        : pl_clamp(p->t->grad, -t->clip, t->clip);
            pl_status st = c ? pl_tensor_copy_(p->t->grad, c) : PL_ERR_NOMEM;
            pl_frame_end();
            if (st) norm = NAN;
        }
    }
    pl_no_grad_end();
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

double tr_lr_factor(trainer *t) { return current_factor(t); }

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

double tr_apply_lr(trainer *t) { return apply_lr(t); }

/* An optimizer step up to the gradients' zeroing: what a captured step
 * records (graph_step.c); tr_optimizer_step_tail follows on the host. */
pl_status tr_optimizer_step_body(trainer *t, double *gnorm, double *lr) {
    bool do_step = true;
    /* DDP: the global batch's gradient, before the unscale, inf check and clip */
    pl_status dst = tr_dist_reduce_grads(t);
    if (dst) return dst;
    if (t->prec.self && PREC(t)->before_step)
        do_step = PREC(t)->before_step(t->prec.self, t->ctx.params);
    pl_status st = PL_OK;
    if (t->dev_loop) /* the norm stays on the device (step_values.c) */
        st = tr_sv_grad_norm_and_clip(t);
    else
        *gnorm = grad_norm_and_clip(t);
    *lr = apply_lr(t);
    if (do_step && !st) {
        /* one process: the kernels skip the update when the step's loss was not
         * finite (found_inf), decided on the device */
        if (t->dev_loop) pl_optim_set_found_inf(t->sv.found);
        st = OPTIM(t)->step(t->optim.self);
        pl_optim_set_found_inf(NULL);
        if (!st && t->prec.self && PREC(t)->after_step)
            st = PREC(t)->after_step(t->prec.self, t->ctx.params);
    }
    zero_grads(t);
    return st;
}

/* The step count and the averager (host decisions: never captured). */
pl_status tr_optimizer_step_tail(trainer *t) {
    t->step++;
    return t->avg.self ? AVG(t)->update(t->avg.self, t->epoch, t->step) : PL_OK;
}

static pl_status optimizer_step(trainer *t, double *gnorm, double *lr) {
    pl_status st = tr_optimizer_step_body(t, gnorm, lr);
    pl_status ts = tr_optimizer_step_tail(t);
    return st ? st : ts;
}

/* ---- evaluation ------------------------------------------------------------------------ */

pl_status tr_each_batch(trainer *t, pl_data_split split, int64_t max_batches, tr_batch_fn fn,
                        void *arg) {
    const pl_loader_vtable *L = LOADER(t);
    pl_status st = L->epoch_begin(t->loader.self, split, 0, 0);
    t->pass_start = true;
    pl_no_grad_begin();
    pl_batch b;
    for (int64_t i = 0; !st && (max_batches < 0 || i < max_batches); i++) {
        int r = tr_next_batch(t, &b);
        if (r < 0) st = pl_error_status();
        if (r <= 0) break;
        pl_frame_begin();
        st = fn(t, &b, split, arg);
        pl_frame_end();
    }
    pl_no_grad_end();
    return st;
}

static pl_status eval_batch(trainer *t, const pl_batch *b, pl_data_split split, void *m) {
    pl_tensor *loss = NULL;
    pl_autocast_cache_begin(); /* a parameter is cast once per forward (autocast_cache.c) */
    pl_status st = MODEL(t)->forward(t->model.self, b, split, false, &loss, m);
    pl_autocast_cache_end();
    return st;
}

pl_status tr_evaluate(trainer *t, pl_data_split split, pl_metrics *m, pl_limit lim) {
    pl_metrics_reset(m);
    /* DDP striding: this rank's batches r, r + N, ... (the limit counts them) */
    int64_t nl = LOADER(t)->num_batches(t->loader.self, split);
    int64_t nb = limit_batches(lim, t->stride > 1 ? (nl - t->rank + t->stride - 1) / t->stride : nl);
    pl_status st = tr_each_batch(t, split, nb, eval_batch, m);
    pl_tape_clear();
    /* every rank reaches the reduction, a failed one with its error to tell */
    double failed = st ? 1 : 0;
    if (t->world > 1) {
        pl_status rs = STRAT(t)->all_reduce_f64(t->strat.self, &failed, 1);
        if (!st && rs) st = rs;
        if (!st && failed > 0)
            st = pl_error_set(PL_ERR_IO, "ddp: another rank failed evaluating %s (see its message)",
                              pl_split_name(split));
    }
    if (!st) st = tr_dist_reduce_metrics(t, m);
    return st;
}

void tr_print_metrics(trainer *t, const char *heading, const char *prefix, const pl_metrics *m) {
    /* one line, printed at once, so the terminal shows it whole */
    char line[4096];
    size_t n = (size_t)snprintf(line, sizeof line, "%s", heading);
    for (int i = 0; i < m->n; i++) {
        char key[96];
        snprintf(key, sizeof key, "%s_%s", prefix, m->name[i]);
        double v = pl_metrics_value_at(m, i);
        if (n < sizeof line) n += (size_t)snprintf(line + n, sizeof line - n, "  %s %.5f", key, v);
        tr_metric_row(t, key, v);
    }
    tr_log(t, "%s\n", line);
}

static pl_status parse_monitors(const pl_config_section *tr, char names[][64], bool *maxes, int *n);

/* A run never reports non-finite metrics as a success: the first one fails
 * the run, naming the split and the metric. */
pl_status tr_check_finite(const char *split, const pl_metrics *m) {
    for (int i = 0; i < m->n; i++) {
        if (m->count[i] <= 0) continue;
        double v = pl_metrics_value_at(m, i);
        if (isfinite(v)) continue;
        pl_hint_set("non-finite values in the %s data, or weights that diverged: check the data "
                    "(NaN/Inf rows) and the last finite training loss in log.txt", split);
        return pl_error_set(PL_ERR_NUMERIC, "%s metric '%s' is %g over %g samples", split,
                            m->name[i], v, m->count[i]);
    }
    return PL_OK;
}

/* A validation: evaluate (finite metrics only), then the callbacks decide
 * (logging, monitor, best checkpoint, early stopping: t->should_stop). */
static pl_status validate(trainer *t) {
    double t0 = tr_now();
    pl_status st = TR_CB_DISPATCH(t, on_validation_start);
    if (!st) st = tr_evaluate(t, PL_SPLIT_VAL, &t->last_val, t->limit[PL_SPLIT_VAL]);
    if (!st) st = tr_check_finite("validation", &t->last_val);
    if (!st) st = TR_CB_DISPATCH(t, on_validation_end, &t->last_val, tr_now() - t0);
    return st;
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

/* ---- fit ---------------------------------------------------------------------------------- */

/* Training batches the fit plans, counted from epoch 0 batch 0: max_epochs
 * epochs of nb batches, fewer when max_steps ends it first (an optimizer step
 * every `accum` batches and at each epoch's end); -1 when neither bounds it.
 * Early stopping may end the run sooner. */
int64_t tr_planned_batches(const trainer *t, int64_t nb) {
    int64_t total = t->max_epochs < INT64_MAX / 4 ? t->max_epochs * nb : -1;
    if (t->max_steps >= 0) {
        int64_t spe = (nb + t->accum - 1) / t->accum;
        int64_t q = t->max_steps / spe, r = t->max_steps % spe;
        int64_t by_steps = q < INT64_MAX / 4 / nb ? q * nb + r * t->accum : INT64_MAX / 4;
        if (total < 0 || by_steps < total) total = by_steps;
    }
    return total;
}

/* A mid-epoch validation served val batches through the loader: start the
 * train epoch again at batch t->batch (the order is a function of
 * (seed, epoch), so this continues where training was). */
static pl_status continue_train_epoch(trainer *t) {
    t->pass_start = true;
    return LOADER(t)->epoch_begin(t->loader.self, PL_SPLIT_TRAIN, t->epoch, t->batch * t->stride);
}

/* A micro-batch's loss decided on the host, as data parallel needs it (the
 * ranks agree on the global batch's loss before backward; one process keeps
 * it on the device instead, step_values.c): read back, the on_nan policy
 * (on_loss_read), backward scaled by this rank's share. Ends the batch's
 * frame. Returns 1 to go on to the step, 0 when on_nan = skip dropped the
 * step's micro-batches, -1 on an error (*st). */
static int host_micro_batch(trainer *t, pl_tensor *loss, pl_status *st, double *lv,
                            pl_metrics *m, int64_t size, int64_t b, int64_t *pending) {
    *lv = *st ? NAN : pl_tensor_item(loss);
    /* DDP: the loss of the global batch (every rank decides on the same value),
     * this rank's share of it, which scales its backward, and whether any rank
     * has seen a signal (all stop at the same step boundary) */
    double share = 1.0;
    if (!*st) *st = tr_dist_loss(t, lv, m, size, &share, tr_signal_pending(), &t->peer_signal);
    if (!*st) *st = tr_loss_read(t, *lv, t->epoch, t->step, b);
    if (!*st && !isfinite(*lv)) { /* skipped: the step's micro-batches so far go too */
        pl_tape_clear();
        zero_grads(t);
        tr_devstats_step_abort(t);
        *pending = 0;
        t->batch = b + 1;
        t->accum_pending = 0;
        pl_frame_end();
        return 0;
    }
    if (!*st) {
        double scale = t->prec.self ? PREC(t)->loss_scale(t->prec.self) : 1.0;
        *st = pl_backward(loss, scale * share / (double)t->accum);
    }
    pl_frame_end();
    if (*st) return -1;
    t->ep_loss_sum += *lv;
    t->ep_loss_n++;
    t->micro++;
    return 1;
}

/* One training micro-batch: forward, then the loss kept on the device (one
 * process: nothing is read back; its finiteness and the on_nan policy are
 * decided at the next read, step_values.c) or decided on the host (data
 * parallel), and backward. 1 / 0 / -1 as host_micro_batch. */
int tr_train_micro_batch(trainer *t, const pl_batch *batch, int64_t b, int64_t *pending,
                         double *lv, pl_status *st) {
    t->ctx.epoch = t->epoch;
    t->ctx.global_step = t->step;
    t->ctx.micro_step = t->micro;
    pl_frame_begin();
    pl_tensor *loss = NULL;
    pl_metrics m;
    pl_metrics_reset(&m);
    /* one process asks for no training metrics (NULL): a model then reads
     * nothing back; data parallel needs the loss's count to weight the ranks */
    pl_autocast_cache_begin(); /* a parameter is cast once per forward */
    *st = MODEL(t)->forward(t->model.self, batch, PL_SPLIT_TRAIN, true, &loss,
                            t->dev_loop ? NULL : &m);
    pl_autocast_cache_end(); /* before backward: the tape keeps what it reads */
    if (!t->dev_loop) return host_micro_batch(t, loss, st, lv, &m, batch->size, b, pending);
    if (!*st) *st = tr_sv_loss(t, loss, *pending == 0, b);
    if (!*st) {
        double scale = t->prec.self ? PREC(t)->loss_scale(t->prec.self) : 1.0;
        *st = pl_backward(loss, scale / (double)t->accum);
    }
    pl_frame_end();
    if (*st) return -1;
    t->micro++;
    return 1;
}

/* The training batches of one epoch, from b0 (nb per epoch; te0: when the
 * epoch began): fetch, forward, backward, the optimizer step every
 * accumulate_grad_batches micro-batches and at the epoch's end, the
 * callbacks, a validation every val_check_interval batches. Adds the
 * samples trained on to *samples. */
static pl_status train_batches(trainer *t, int64_t nb, int64_t b0, double te0, double *samples) {
    int64_t val_every = nb;
    if (t->val_interval.is_count && t->val_interval.value >= 1)
        val_every = (int64_t)t->val_interval.value; /* every N training batches */
    else if (!t->val_interval.is_count && t->val_interval.value < 1.0)
        val_every = (int64_t)fmax(1.0, floor(t->val_interval.value * (double)nb));
    bool val_epoch = (t->epoch + 1) % t->val_every_epochs == 0;
    int64_t pending = 0;
    t->peer_signal = 0;
    double gnorm = NAN, lv = NAN, t_prev = te0; /* t_prev: end of the previous step */
    /* shown until this epoch's first optimizer step (accumulation): the lr that
     * step will use, not NaN (the factors are functions of the step; SWA's f0 is
     * taken at this same step either way) */
    double lr = OPTIM(t)->num_groups(t->optim.self) > 0
                    ? OPTIM(t)->group(t->optim.self, 0)->initial_lr * current_factor(t)
                    : NAN;
    pl_status st = PL_OK;
    for (int64_t b = b0; b < nb && !st && !t->should_stop; b++) {
        if (pending == 0) tr_devstats_step_begin(t); /* a step's first micro-batch */
        pl_batch batch;
        int r = tr_next_batch(t, &batch);
        if (r < 0) st = pl_error_status();
        if (r <= 0) break;
        *samples += (double)batch.size;
        /* [trainer] cuda_graphs: the whole step as the captured graph (1), or eager (0) */
        int r2 = t->gs.mode ? tr_graph_try(t, &batch, b, &lr, &st) : 0;
        bool graphed = r2 == 1;
        if (r2 == 0) r2 = tr_train_micro_batch(t, &batch, b, &pending, &lv, &st);
        if (r2 < 0) break;
        if (r2 == 0) continue; /* skipped (on_nan = skip, host path) */
        tr_step_info si = {.epoch = t->epoch, .batch = b, .batch0 = b0, .batches = nb,
                           .epoch_t0 = te0, .host_loss = lv, .host_grad_norm = NAN};
        if (graphed || ++pending == t->accum || b + 1 == nb) {
            if (!graphed) st = optimizer_step(t, &gnorm, &lr);
            pending = 0;
            si.stepped = true;
            si.logged = t->step % t->log_every == 0;
            si.step_seconds = tr_now() - t_prev;
            si.host_grad_norm = gnorm;
        }
        si.step = t->step;
        si.lr = lr;
        t->batch = b + 1;
        t->accum_pending = pending;
        pl_frame_begin(); /* the step's values as device views, for the callbacks */
        tr_sv_last(t, &si.loss, &si.grad_norm);
        si.found_inf = t->dev_loop && si.stepped ? t->sv.found : NULL;
        if (!st && si.stepped) st = TR_CB_DISPATCH(t, on_train_step_end, &si);
        if (si.stepped) t_prev = tr_now();
        if (!st) st = TR_CB_DISPATCH(t, on_train_batch_end, &si);
        pl_frame_end();
        si.loss = si.grad_norm = si.found_inf = NULL;
        if (si.stepped) tr_devstats_step_end(t, si.logged);
        if (!st && (b + 1) % val_every == 0 && b + 1 < nb && val_epoch) {
            st = tr_sv_flush(t); /* a best checkpoint records the running loss */
            if (!st) st = validate(t);
            if (!st && !t->should_stop) st = continue_train_epoch(t);
            t_prev = tr_now(); /* validation is not a step's time */
        }
        /* after the validation of this batch, so that a checkpoint holds its outcome */
        if (!st && si.stepped) st = TR_CB_DISPATCH(t, on_step_boundary, &si);
        if (t->interrupted) break;
        if (t->max_steps >= 0 && t->step >= t->max_steps) {
            if (!st) st = tr_sv_flush(t);
            break;
        }
    }
    return st;
}

/* One epoch: its training batches, the epoch's read and numbers, the
 * callbacks' epoch end (the epoch line, averaging), its validation when due,
 * then the checkpoints (on_epoch_end). nb: training batches per epoch. */
static pl_status run_epoch(trainer *t, int64_t nb) {
    const pl_loader_vtable *L = LOADER(t);
    tr_peak_fold(t, &t->ph_fit, true); /* metrics.csv: each epoch's own device peaks */
    double te0 = tr_now();
    int64_t b0 = t->batch; /* > 0: resumed from a mid-epoch checkpoint */
    if (b0 > nb)
        return pl_error_set(PL_ERR_CONFIG, "the checkpoint resumed from is at batch %lld of epoch "
                            "%lld, but this configuration has %lld training batches per epoch "
                            "(batch_size or limit_train_batches changed?)", (long long)b0,
                            (long long)t->epoch, (long long)nb);
    if (b0 == 0) {
        t->ep_loss_sum = 0;
        t->ep_loss_n = 0;
    }
    pl_status st = L->epoch_begin(t->loader.self, PL_SPLIT_TRAIN, t->epoch, b0 * t->stride);
    t->pass_start = true;
    if (!st && b0 > 0)
        tr_log(t, "continuing epoch %lld at batch %lld of %lld\n", (long long)t->epoch,
               (long long)b0, (long long)nb);
    if (!st) st = TR_CB_DISPATCH(t, on_epoch_start);
    pl_loader_stats ls0 = L->stats ? L->stats(t->loader.self) : (pl_loader_stats){0};
    double samples = 0;
    if (!st) st = train_batches(t, nb, b0, te0, &samples);
    if (!st) st = tr_sv_flush(t); /* the epoch's end reads its values */
    if (t->interrupted) return st;
    t->batch = 0;
    t->accum_pending = 0;
    if (st) return st;
    double te = tr_now() - te0;
    pl_loader_stats ls1 = L->stats ? L->stats(t->loader.self) : (pl_loader_stats){0};
    tr_epoch_info e = {.seconds = te, .samples = samples * t->world, /* every rank's share */
                       .data_wait = ls1.wait_seconds - ls0.wait_seconds,
                       .train_loss = t->ep_loss_n ? t->ep_loss_sum / t->ep_loss_n : NAN};
    t->data_wait += e.data_wait;
    t->train_samples += e.samples;
    t->train_seconds += te;
    st = TR_CB_DISPATCH(t, on_train_epoch_end, &e);
    t->epoch_done = true; /* validating at the end of an epoch: checkpoints record the next one */
    if (!st && (t->epoch + 1) % t->val_every_epochs == 0) st = validate(t);
    t->epoch_done = false;
    double *ne = realloc(t->epoch_s, (size_t)(t->n_epoch_s + 1) * sizeof(double));
    if (ne) {
        t->epoch_s = ne;
        t->epoch_s[t->n_epoch_s++] = tr_now() - te0;
    }
    if (!st) st = TR_CB_DISPATCH(t, on_epoch_end);
    if (t->should_stop) t->stopped_early = true;
    return st;
}

/* The fit: epochs until max_epochs, max_steps, early stopping or a signal. */
static pl_status fit(trainer *t) {
    /* DDP striding: each rank takes every stride-th batch; a remainder that not every
     * rank can have is dropped (all ranks must take the same number of steps) */
    int64_t nb_full = LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN) / t->stride;
    int64_t nb = limit_batches(t->limit[PL_SPLIT_TRAIN], nb_full);
    if (nb <= 0)
        return pl_error_set(PL_ERR_CONFIG, "no training batches (split has %lld, "
                            "limit_train_batches gives 0)", (long long)nb_full);
    double t_fit0 = tr_now();
    t->fit_t0 = t_fit0;
    t->fit_batch0 = t->epoch * nb + t->batch;
    t->should_stop = false;
    pl_alloc_reset_peak(t->ctx.device);
    tr_devstats_begin(t);
    pl_status st = tr_sv_begin(t);
    if (st) return st;
    tr_graph_begin(t);
    st = TR_CB_DISPATCH(t, on_fit_start);
    for (; !st && t->epoch < t->max_epochs && !t->should_stop; t->epoch++) {
        if (t->max_steps >= 0 && t->step >= t->max_steps) break;
        st = run_epoch(t, nb);
        if (st || t->interrupted) break;
    }
    if (!st) st = TR_CB_DISPATCH(t, on_fit_end);
    t->fit_s = tr_now() - t_fit0;
    tr_graph_end(t); /* before the step values: the graph wrote into them */
    tr_sv_end(t);
    tr_devstats_log(t);
    t->ph_fit.seconds = t->fit_s;
    tr_peak_fold(t, &t->ph_fit, false);
    return st;
}

/* ---- test and export ------------------------------------------------------------------------ */

static pl_status run_test(trainer *t) {
    pl_status st = PL_OK;
    double t0 = tr_now();
    pl_alloc_reset_peak(t->ctx.device);
    st = tr_dist_barrier(t); /* DDP: rank 0 has finished writing the checkpoints */
    if (st) return st;
    if (t->best_path[0] && access(t->best_path, R_OK) == 0) {
        tr_log(t, "test: using the best checkpoint %s (%s = %.5f)\n", t->best_path, t->monitor,
              t->best);
        st = tr_load_checkpoint(t, t->best_path, true);
    } else {
        tr_log(t, "test: using the last weights\n");
    }
    if (!st) st = tr_evaluate(t, PL_SPLIT_TEST, &t->test_metrics, t->limit[PL_SPLIT_TEST]);
    if (!st) st = tr_check_finite("test", &t->test_metrics);
    if (!st) {
        t->have_test = true;
        tr_print_metrics(t, "test:", "test", &t->test_metrics);
    }
    if (!st && t->avg.self && AVG(t)->has_average(t->avg.self)) {
        /* averaged weights are reported under the averager's own name */
        const char *who = t->avg.desc->name;
        st = AVG(t)->swap(t->avg.self);
        /* validation of the averaged weights too: whether averaging pays is
         * then decided on validation, like every other choice */
        if (!st) st = tr_evaluate(t, PL_SPLIT_VAL, &t->avg_val_metrics, t->limit[PL_SPLIT_VAL]);
        if (!st) st = tr_check_finite("val (averaged weights)", &t->avg_val_metrics);
        if (!st) st = tr_evaluate(t, PL_SPLIT_TEST, &t->avg_test_metrics, t->limit[PL_SPLIT_TEST]);
        if (!st) st = tr_check_finite("test (averaged weights)", &t->avg_test_metrics);
        if (!st) {
            t->have_avg_test = true;
            char prefix[96], heading[128];
            snprintf(prefix, sizeof prefix, "%s_val", who);
            snprintf(heading, sizeof heading, "val (%s averaged weights):", who);
            tr_print_metrics(t, heading, prefix, &t->avg_val_metrics);
            snprintf(prefix, sizeof prefix, "%s_test", who);
            snprintf(heading, sizeof heading, "test (%s averaged weights):", who);
            tr_print_metrics(t, heading, prefix, &t->avg_test_metrics);
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/checkpoints/%s.safetensors", t->run_dir, who);
            st = tr_save_checkpoint(t, p);
        }
        if (!st) st = AVG(t)->swap(t->avg.self);
    }
    if (!st) st = TR_CB_DISPATCH(t, on_test_end);
    t->test_s = tr_now() - t0;
    t->ph_test.seconds = t->test_s;
    tr_peak_fold(t, &t->ph_test, false);
    return st;
}

static pl_status export_batch(trainer *t, const pl_batch *b, pl_data_split split, void *arg) {
    (void)arg;
    return MODEL(t)->export_batch(t->model.self, b, split);
}

static pl_status run_export_all(trainer *t);

static pl_status run_export(trainer *t) {
    const pl_model_vtable *M = MODEL(t);
    if (!M->export_begin) {
        tr_log(t, "export: model '%s' has no export; skipped\n", t->model.desc->name);
        return PL_OK;
    }
    if (t->rank > 0) return PL_OK; /* data parallel: rank 0 exports every split whole */
    if (t->world > 1 && t->stride == 1) {
        /* a loader that shards itself serves rank 0's part: undo it for the export */
        pl_status us = LOADER(t)->shard(t->loader.self, 0, 1);
        if (us) return pl_error_prefix(us, "export: unsharding the loader");
    }
    int stride = t->stride;
    t->stride = 1;
    pl_status st = run_export_all(t);
    t->stride = stride; /* the run's sharding, as summary.json reports it */
    return st;
}

static pl_status run_export_all(trainer *t) {
    const pl_model_vtable *M = MODEL(t);
    double t0 = tr_now();
    pl_alloc_reset_peak(t->ctx.device);
    snprintf(t->outputs_path, sizeof t->outputs_path, "%s/outputs", t->run_dir);
    if (tr_mkdir_p(t->outputs_path))
        return pl_error_set(PL_ERR_IO, "cannot create %s: %s", t->outputs_path, strerror(errno));
    pl_status st = M->export_begin(t->model.self, t->outputs_path);
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++)
        st = tr_each_batch(t, (pl_data_split)s, -1, export_batch, NULL);
    if (!st) st = M->export_end(t->model.self);
    t->export_s = tr_now() - t0;
    t->ph_export.seconds = t->export_s;
    tr_peak_fold(t, &t->ph_export, false);
    if (!st) tr_log(t, "export: outputs in %s (%.1fs)\n", t->outputs_path, t->export_s);
    return st;
}

/* ---- setup ----------------------------------------------------------------------------------- */

static void read_settings(trainer *t) {
    const pl_config_section *tr = t->tr;
    t->max_epochs = pl_cfg_int(tr, "max_epochs", 1000);
    t->max_steps = pl_cfg_int(tr, "max_steps", -1);
    if (t->max_epochs < 0) t->max_epochs = INT64_MAX / 2;
    t->accum = pl_cfg_int(tr, "accumulate_grad_batches", 1);
    t->clip = pl_cfg_float(tr, "gradient_clip_val", 0);
    t->clip_norm = strcmp(pl_cfg_str(tr, "gradient_clip_algorithm", "norm"), "value") != 0;
    t->val_interval = cfg_limit(tr, "val_check_interval");
    t->val_every_epochs = pl_cfg_int(tr, "check_val_every_n_epoch", 1);
    t->limit[PL_SPLIT_TRAIN] = cfg_limit(tr, "limit_train_batches");
    t->limit[PL_SPLIT_VAL] = cfg_limit(tr, "limit_val_batches");
    t->limit[PL_SPLIT_TEST] = cfg_limit(tr, "limit_test_batches");
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

static int fail(trainer *t, int code) {
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

/* After a resume: a learning-rate schedule that differs from the one the
 * checkpoint was trained on is allowed (extending a run is how max_epochs
 * is raised), but the result is then no continuation of the earlier run: a
 * scheduler that spans the whole fit (cosine, onecycle with total_steps = 0)
 * is planned over this run's length, so the earlier steps followed another
 * curve and the next step's lr jumps. Say so, with the numbers. */
static void warn_schedule_change(trainer *t) {
    if (isnan(t->resume_lr_factor)) return; /* a checkpoint older than the record */
    double f = current_factor(t);
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
    int64_t threads = pl_cfg_int(t->pipe, "threads", 0);
    if (threads > 0) {
        omp_set_num_threads((int)threads);
        pl_blas_set_threads((int)threads); /* its own pool: OpenMP's setting does not reach it */
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
    return PL_OK;
}

void tr_offline_free(trainer *t) {
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    t->ctx.params = NULL;
    t->ctx.meta = NULL;
    pl_autocast_set(PL_F32);
}

void tr_destroy_stages(trainer *t) {
    tr_stage_destroy(&t->strat);
    tr_stage_destroy(&t->avg);
    for (int k = t->n_sched - 1; k >= 0; k--) tr_stage_destroy(&t->sched[k]);
    tr_stage_destroy(&t->optim);
    tr_stage_destroy(&t->prec);
    tr_stage_destroy(&t->model);
    tr_stage_destroy(&t->loader);
}

int pl_trainer_run(pl_config *cfg, pl_registry *reg, const pl_run_options *opts) {
    trainer T = {0}, *t = &T;
    t->t_start = tr_now();
    t->cfg = cfg;
    t->reg = reg;
    t->opts = opts;
    t->pipe = pl_config_section_get(cfg, "pipeline");
    t->tr = pl_config_section_get(cfg, "trainer");
    t->tty = isatty(STDOUT_FILENO);
    t->resume_total_steps = -1;
    t->resume_lr_factor = NAN;
    if (pl_trainer_check_options(cfg)) return fail(t, 2);
    read_settings(t);
    const char *init0 = pl_cfg_str(t->tr, "init_from", "");
    const char *res0 = opts && opts->resume ? opts->resume : pl_cfg_str(t->tr, "resume", "");
    if (t->max_epochs == 0 && t->max_steps != 0 && !init0[0] && !(res0 && res0[0])) {
        /* it would test (and export) the untrained initialization and exit 0 */
        pl_error_set(PL_ERR_CONFIG, "[trainer] max_epochs = 0 trains nothing, and there are no "
                     "weights to evaluate (no init_from, no resume)");
        pl_hint_set("set max_epochs >= 1, or give [trainer] init_from (or --resume) to test "
                    "existing weights");
        return fail(t, 2);
    }
    int code = tr_run_requirements(t);
    if (code) return code;
    if (tr_resolve_output_refs(t)) return fail(t, 2);
    if (tr_setup_device(t)) return fail(t, 2);
    t->ctx.seed = (uint64_t)pl_cfg_int(t->pipe, "seed", 42);
    t->ctx.verbose = pl_cfg_bool(t->pipe, "verbose", false);
    t->ctx.meta = pl_meta_new();
    t->ctx.params = pl_params_new();
    /* data parallel: the strategy first, so that only rank 0 makes the run directory */
    if (tr_dist_create(t)) {
        fail(t, 2);
        tr_destroy_stages(t);
        return 2;
    }
    if (t->rank > 0) t->tty = false;
    if (t->rank == 0 && tr_make_run_dir(t)) {
        fail(t, 1);
        tr_dist_abort(t, 1);
        return 1;
    }
    if (tr_dist_share_run_dir(t)) {
        fail(t, 1);
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
    g_log_run = t; /* pl_message from plugins: the terminal and log.txt */
    if (t->rank == 0) {
        snprintf(path, sizeof path, "%s/config.ini", t->run_dir);
        pl_config_write_ini(cfg, path);
    }
    /* the CPU kernel of bf16 GEMMs is chosen at run time (cpu/cpu_isa.c) */
    char isa[128];
    tr_log(t,
           "run %s: config %s, device %s, seed %llu, %d threads (OpenBLAS %d, %s), "
           "CPU bf16 GEMM %s (CPU: %s)\n",
           t->run_dir, pl_config_path(cfg), pl_cfg_str(t->pipe, "device", "cpu"),
           (unsigned long long)t->ctx.seed, omp_get_max_threads(), pl_blas_threads(),
           pl_blas_parallel(), pl_cpu_gemm_bf16(), pl_cpu_features(isa, sizeof isa));
    if (t->world > 1)
        tr_log(t, "strategy %s: %d processes (data parallel)\n", t->strat.desc->name, t->world);
    if (t->rank == 0) tr_sweep_orphan_tmp(t); /* what killed runs left half-written */

    double load_start = 0;
    pl_status st = pl_trainer_check_fields(cfg);
    pl_alloc_reset_peak(t->ctx.device); /* ph_load: model build, weights, precision */
    if (!st) st = tr_build_model(t, &load_start);
    if (!st) st = tr_dist_shard(t);
    if (!st && t->stride > 1) {
        int64_t nl = LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN);
        if (nl < t->stride)
            st = pl_error_set(PL_ERR_CONFIG, "data parallel over %d processes: the training split "
                              "has %lld batch(es) per epoch, fewer than one per process, and "
                              "loader '%s' cannot split a batch (no shard function)", t->world,
                              (long long)nl, t->loader.desc->name);
        else
            tr_log(t, "ddp: each of %d processes takes %lld of the %lld training batches per "
                   "epoch (batches r, r+%d, ...)%s\n", t->world, (long long)(nl / t->stride),
                   (long long)nl, t->stride, nl % t->stride ? "; the remainder is dropped" : "");
    }
    /* steps for schedulers */
    if (!st) {
        int64_t nb = limit_batches(t->limit[PL_SPLIT_TRAIN],
                                   LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN) /
                                       t->stride);
        t->ctx.steps_per_epoch = (nb + t->accum - 1) / t->accum;
        t->ctx.max_epochs = t->max_epochs;
        t->ctx.total_steps = t->ctx.steps_per_epoch * t->max_epochs;
        if (t->max_steps >= 0 && (t->max_steps < t->ctx.total_steps || t->max_epochs >= INT64_MAX / 4))
            t->ctx.total_steps = t->max_steps;
    }
    if (!st) st = tr_stage_create(t, &t->optim, "optimizer");
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
        st = tr_stage_create(t, &t->sched[t->n_sched], sec);
        if (t->sched[t->n_sched].self) t->n_sched++;
    }
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

    /* weights init / resume */
    const char *init = pl_cfg_str(t->tr, "init_from", "");
    if (!st && init[0]) {
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
    const char *resume = opts && opts->resume ? opts->resume : pl_cfg_str(t->tr, "resume", "");
    if (!st && resume && resume[0]) {
        char p[PATH_MAX];
        if (!strcmp(resume, "last")) {
            char latest[PATH_MAX];
            pl_trainer_latest_dir(cfg, latest, sizeof latest);
            *strrchr(latest, '/') = 0; /* RUN_DIR/NAME */
            if (tr_newest_last_checkpoint(latest, t->run_dir, p, sizeof p))
                st = pl_error_set(PL_ERR_IO, "--resume last: no earlier run of %s has a last "
                                  "checkpoint under %s", pl_config_path(cfg), latest);
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
    }
    if (!st) st = tr_dist_check_params(t);
    if (!st) count_parameter_bytes(t);
    tr_signals_install();
    if (!st) st = fit(t);
    /* a signal during validation, test or export: the phase ends, the next is skipped */
    if (!st && tr_signal_pending()) t->interrupted = tr_signal_pending();
    if (!st && t->do_test && !t->interrupted) st = run_test(t);
    if (!st && tr_signal_pending()) t->interrupted = tr_signal_pending();
    if (!st && t->do_export && !t->interrupted) st = run_export(t);
    code = st ? (st == PL_ERR_CONFIG ? 2 : 1) : t->interrupted ? 128 + t->interrupted : 0;
    /* the error goes last, where the user looks, not above a report of nothing */
    if (t->rank == 0) tr_write_summary(t, code);
    if (t->interrupted && !st) tr_signals_mark_saved();
    if (!code && t->rank == 0) tr_mark_latest(t);
    /* the next run of a chain (or the caller) sees this one's files on every rank */
    if (!code && tr_dist_barrier(t)) code = 1;
    tr_signals_restore();
    if (st || code == 1) {
        fail(t, code);
        tr_dist_abort(t, code); /* a failing rank stops the others (no return when N > 1) */
    }
    if (!st && t->interrupted)
        tr_log(t, "run interrupted: resume with `pipeline run %s --resume last`\n",
               pl_config_path(cfg));

    tr_callbacks_destroy(t);
    tr_destroy_stages(t);
    pl_params_free(t->ctx.params);
    pl_meta_free(t->ctx.meta);
    free(t->epoch_s);
    free(t->dist_grads);
    g_log_run = NULL;
    if (t->log) fclose(t->log);
    if (t->metrics) fclose(t->metrics);
    pl_autocast_set(PL_F32);
    return code;
}
