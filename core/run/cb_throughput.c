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
#include "callback.h"

#define TR_STEADY_AFTER 5 /* as bench/teacher's PyTorch side: 5 warm-up steps */

typedef struct throughput {
    bool open, reopen;
    double t0;
    int64_t step0;
    int64_t seen, in_window; /* this epoch's batches, and those inside the window */
} throughput;

static throughput g_tp;

static void sync_device(trainer *t) {
    pl_device d = t->ctx.device;
    const pl_backend *b = pl_backend_get(d.type);
    if (d.type != PL_DEVICE_CPU && b && b->synchronize) (void)b->synchronize(d.index);
}

static void open_window(trainer *t) {
    sync_device(t);
    g_tp.t0 = tr_now();
    g_tp.step0 = t->step;
    g_tp.open = true;
}

static pl_status tp_fit_start(void *self, trainer *t) {
    (void)self;
    (void)t;
    g_tp = (throughput){0};
    t->steady_seconds = 0;
    t->steady_steps = 0;
    t->steady_samples = 0;
    return PL_OK;
}

static pl_status tp_epoch_start(void *self, trainer *t) {
    (void)self;
    g_tp.seen = g_tp.in_window = 0;
    if (g_tp.reopen) open_window(t);
    g_tp.reopen = false;
    return PL_OK;
}

static pl_status tp_batch_end(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    g_tp.seen++;
    if (g_tp.open) g_tp.in_window++;
    else if (s->stepped && t->step >= TR_STEADY_AFTER && !g_tp.reopen) open_window(t);
    return PL_OK;
}

static pl_status tp_train_epoch_end(void *self, trainer *t, const tr_epoch_info *e) {
    (void)self;
    if (!g_tp.open) return PL_OK;
    sync_device(t);
    t->steady_seconds += tr_now() - g_tp.t0;
    t->steady_steps += t->step - g_tp.step0;
    if (g_tp.seen > 0) t->steady_samples += e->samples * (double)g_tp.in_window / (double)g_tp.seen;
    g_tp.open = false;
    g_tp.reopen = true;
    return PL_OK;
}

static tr_callback throughput_cb = {.struct_size = sizeof(tr_callback), .name = "throughput",
                                    .on_fit_start = tp_fit_start,
                                    .on_epoch_start = tp_epoch_start,
                                    .on_train_batch_end = tp_batch_end,
                                    .on_train_epoch_end = tp_train_epoch_end};

pl_status tr_cb_throughput_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &throughput_cb;
    return PL_OK;
}
