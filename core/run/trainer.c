/* trainer.c - the training loop: fit (train + validate), and what the
 * trainer's phases share (log, metrics rows, stages, the optimizer step,
 * evaluation). The run's setup is in trainer_setup.c; test, export and
 * pl_trainer_run in trainer_phases.c.
 *
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
#include "message.h"
#include "callback.h"
#include "trainer_internal.h"

/* ---- evaluation ----------------------------------------------------------------------------- */

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
    int64_t nb = tr_limit_batches(lim, t->stride > 1 ? (nl - t->rank + t->stride - 1) / t->stride : nl);
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
    int prev = tr_devstats_phase(t, TR_PH_VALIDATE, true); /* a mid-epoch one pauses train */
    pl_status st = TR_CB_DISPATCH(t, on_validation_start);
    if (!st) st = tr_evaluate(t, PL_SPLIT_VAL, &t->last_val, t->limit[PL_SPLIT_VAL]);
    if (!st) st = tr_check_finite("validation", &t->last_val);
    if (!st) st = TR_CB_DISPATCH(t, on_validation_end, &t->last_val, tr_now() - t0);
    tr_devstats_phase(t, prev, false);
    return st;
}

/* ---- fit ------------------------------------------------------------------------------------ */

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
                    ? OPTIM(t)->group(t->optim.self, 0)->initial_lr * tr_lr_factor(t)
                    : NAN;
    pl_status st = PL_OK;
    for (int64_t b = b0; b < nb && !st && !t->should_stop; b++) {
        if (pending == 0) tr_devstats_step_begin(t); /* a step's first micro-batch */
        pl_batch batch;
        int r = tr_next_batch(t, &batch);
        if (r < 0) st = pl_error_status();
        if (r <= 0) break;
        *samples += (double)batch.size;
        /* [trainer] cuda_graphs: the micro-batch as a captured graph (1: with the optimizer
         * step, 2: without it, accumulation), or eager (0) */
        int r2 = t->gs.mode ? tr_graph_try(t, &batch, b, pending, &lr, &st) : 0;
        bool graphed = r2 == 1; /* the graph took the optimizer step (2: a micro-batch without it) */
        if (r2 == 0) r2 = tr_train_micro_batch(t, &batch, b, &pending, &lv, &st);
        if (r2 < 0) break;
        if (r2 == 0) continue; /* skipped (on_nan = skip, host path) */
        tr_step_info si = {.epoch = t->epoch, .batch = b, .batch0 = b0, .batches = nb,
                           .epoch_t0 = te0, .host_loss = lv, .host_grad_norm = NAN};
        if (graphed || ++pending == t->accum || b + 1 == nb) {
            if (!graphed) st = tr_optimizer_step(t, &gnorm, &lr);
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
    tr_devstats_phase(t, TR_PH_TRAIN, true);
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
    tr_devstats_phase(t, TR_PH_NONE, false);
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
pl_status tr_fit(trainer *t) {
    /* DDP striding: each rank takes every stride-th batch; a remainder that not every
     * rank can have is dropped (all ranks must take the same number of steps) */
    int64_t nb_full = LOADER(t)->num_batches(t->loader.self, PL_SPLIT_TRAIN) / t->stride;
    int64_t nb = tr_limit_batches(t->limit[PL_SPLIT_TRAIN], nb_full);
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
