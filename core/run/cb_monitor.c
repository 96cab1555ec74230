/* cb_monitor.c - the monitored validation metrics as a callback: the
 * plateau schedulers' step, the best values so far (which the checkpoint
 * callback saves at) and early stopping, after each validation. One metric:
 * Lightning's EarlyStopping and ModelCheckpoint rules; several
 * (monitor = val_loss,val_accuracy): the GAT rule (tr_monitor_step). Its
 * state (bests, es_best, bad_vals, have_best) stays in the trainer, where
 * checkpoints keep it under their existing keys. */
#include <math.h>
#include <string.h>

#include "callback.h"

static bool at_least(bool max, double v, double ref) { return max ? v >= ref : v <= ref; }

bool tr_monitor_step(trainer *t, const double *v) {
    bool improved, better_best;
    if (t->n_monitor == 1) {
        /* Lightning: patience resets on an improvement by more than min_delta; the
         * best checkpoint follows any strict improvement */
        bool mx = t->mode_maxes[0];
        better_best = !t->have_best || (mx ? v[0] > t->bests[0] : v[0] < t->bests[0]);
        /* EarlyStopping keeps its own best, moved only by an improvement that counts */
        improved = !t->have_best ||
                   (mx ? v[0] > t->es_best + t->min_delta : v[0] < t->es_best - t->min_delta);
        if (improved) t->es_best = v[0];
    } else {
        /* The GAT rule (Velickovic et al. 2018, reference execute_cora.py): patience
         * resets while any monitored metric reaches its best so far (ties count, by
         * min_delta beyond it when set); the best checkpoint is kept where all of them
         * are at their best together; each best is tracked on its own */
        improved = !t->have_best;
        better_best = true;
        for (int k = 0; k < t->n_monitor; k++) {
            bool mx = t->mode_maxes[k];
            double ref = !t->have_best ? v[k] : mx ? t->bests[k] + t->min_delta
                                                    : t->bests[k] - t->min_delta;
            improved |= at_least(mx, v[k], ref);
            better_best &= !t->have_best || at_least(mx, v[k], t->bests[k]);
        }
    }
    if (improved)
        t->bad_vals = 0;
    else
        t->bad_vals++;
    for (int k = 0; k < t->n_monitor; k++)
        if (!t->have_best || (t->n_monitor > 1 ? at_least(t->mode_maxes[k], v[k], t->bests[k])
                                               : better_best))
            t->bests[k] = v[k];
    t->best = t->bests[0];
    t->have_best = true;
    return better_best;
}

/* After a validation: the monitored values (all must be reported, else
 * nothing is decided), the plateau schedulers, best, early stopping. */
static pl_status monitor_validation_end(void *self, trainer *t, const pl_metrics *m,
                                        double seconds) {
    (void)self;
    (void)seconds;
    t->val_is_best = false;
    double v[PL_MONITOR_MAX];
    for (int k = 0; k < t->n_monitor; k++) {
        const char *mon = t->monitors[k];
        v[k] = strncmp(mon, "val_", 4) == 0 ? pl_metrics_get(m, mon + 4) : NAN;
        if (isnan(v[k])) return PL_OK; /* the model reports no such metric */
    }
    for (int k = 0; k < t->n_sched; k++)
        if (SCHED(&t->sched[k])->on_validation)
            SCHED(&t->sched[k])->on_validation(t->sched[k].self, v[0]);
    t->val_is_best = tr_monitor_step(t, v);
    if (t->early_stop && t->bad_vals >= t->patience) {
        tr_log(t, "early stopping: %s did not improve for %lld validations (best %.5f)\n",
               t->monitor, (long long)t->bad_vals, t->best);
        t->should_stop = true;
    }
    return PL_OK;
}

static tr_callback monitor_cb = {.struct_size = sizeof(tr_callback), .name = "monitor",
                                 .on_validation_end = monitor_validation_end};

pl_status tr_cb_monitor_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &monitor_cb;
    return PL_OK;
}
