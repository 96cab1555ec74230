/* cb_throughput.c - the steady-state step time (summary.json
 * `steady_seconds_per_step`, `steady_samples_per_second`): what a step costs
 * once the run is warm, measured as benchmarks time PyTorch (after warm-up
 * steps, device synchronized at both ends). `train_samples_per_second`
 * counts the whole fit, so a short run is dominated by its first steps: the
 * eager warm-up, a CUDA graph's capture and instantiation (127 ms for the
 * pretraining step on an H200, 2026-11-27), cuBLAS's first calls.
 *
 * The window opens after the optimizer step TR_STEADY_AFTER of each fit (the
 * device synchronized, a clock read) and closes at the end of each epoch's
 * training (synchronized again; validation is outside); later epochs reopen
 * it at their first batch. Samples: the epoch's samples times the share of
 * its batches inside the window (a short last batch counts as a full one).
 * Two synchronizes per epoch and nothing per step: the step stays without
 * host waits. */
#include <stdlib.h>

#include "callback.h"

#define TR_STEADY_AFTER 5 /* as bench/teacher's PyTorch side: 5 warm-up steps */

typedef struct throughput {
    tr_callback cb; /* first: the callback list holds &tp->cb */
    bool open, reopen;
    double t0;
    int64_t step0;
    int64_t seen, in_window; /* this epoch's batches, and those inside the window */
} throughput;

static void open_window(throughput *tp, trainer *t) {
    (void)pl_device_synchronize(t->ctx.device);
    tp->t0 = tr_now();
    tp->step0 = t->step;
    tp->open = true;
}

static pl_status tp_fit_start(void *self, trainer *t) {
    throughput *tp = self;
    tp->open = tp->reopen = false;
    tp->t0 = 0;
    tp->step0 = tp->seen = tp->in_window = 0;
    t->steady_seconds = 0;
    t->steady_steps = 0;
    t->steady_samples = 0;
    return PL_OK;
}

static pl_status tp_epoch_start(void *self, trainer *t) {
    throughput *tp = self;
    tp->seen = tp->in_window = 0;
    if (tp->reopen) open_window(tp, t);
    tp->reopen = false;
    return PL_OK;
}

static pl_status tp_batch_end(void *self, trainer *t, const tr_step_info *s) {
    throughput *tp = self;
    tp->seen++;
    if (tp->open) tp->in_window++;
    else if (s->stepped && t->step >= TR_STEADY_AFTER && !tp->reopen) open_window(tp, t);
    return PL_OK;
}

static pl_status tp_train_epoch_end(void *self, trainer *t, const tr_epoch_info *e) {
    throughput *tp = self;
    if (!tp->open) return PL_OK;
    (void)pl_device_synchronize(t->ctx.device);
    t->steady_seconds += tr_now() - tp->t0;
    t->steady_steps += t->step - tp->step0;
    if (tp->seen > 0) t->steady_samples += e->samples * (double)tp->in_window / (double)tp->seen;
    tp->open = false;
    tp->reopen = true;
    return PL_OK;
}

static void tp_destroy(void *self) { free(self); }

/* The callback and its window state, one per trainer (a chain's required
 * runs each have their own). */
pl_status tr_cb_throughput_create(trainer *t, tr_callback **out) {
    (void)t;
    throughput *tp = calloc(1, sizeof *tp);
    if (!tp) return pl_error_set(PL_ERR_NOMEM, "throughput callback: out of memory");
    tp->cb = (tr_callback){.struct_size = sizeof(tr_callback), .name = "throughput", .self = tp,
                           .on_fit_start = tp_fit_start,
                           .on_epoch_start = tp_epoch_start,
                           .on_train_batch_end = tp_batch_end,
                           .on_train_epoch_end = tp_train_epoch_end,
                           .destroy = tp_destroy};
    *out = &tp->cb;
    return PL_OK;
}
