/* cb_nan.c - the NaN policy as a callback: [trainer] on_nan = stop|skip and
 * max_consecutive_nan_skips, decided for each training loss when the host
 * reads it (on_loss_read): at the next read on the device path
 * (step_values.c replays the values in order), every micro-batch on the
 * host path (data parallel). Its state (t->nan_skips, t->last_finite_loss)
 * stays in the trainer, where checkpoints keep it under their existing keys. */
#include <math.h>
#include <stdlib.h>

#include "callback.h"

static pl_status nan_on_loss_read(void *self, trainer *t, const tr_loss_value *r) {
    (void)self;
    double lv = r->value;
    if (isfinite(lv)) {
        t->last_finite_loss = lv;
        t->nan_skips = 0;
        return PL_OK;
    }
    t->nan_skips++;
    if (!t->on_nan_skip)
        return pl_error_set(PL_ERR_NUMERIC, "non-finite training loss %g at epoch %lld step %lld "
                            "batch %lld (last finite loss %.6g); set [trainer] on_nan = skip to "
                            "skip such steps", lv, (long long)r->epoch, (long long)r->step,
                            (long long)r->batch, t->last_finite_loss);
    if (t->max_nan_skips > 0 && t->nan_skips > t->max_nan_skips) {
        pl_hint_set("look for NaN/Inf rows in the training data and at the last finite training "
                    "loss in log.txt (a diverging run: lower lr, gradient_clip_val); [trainer] "
                    "max_consecutive_nan_skips = 0 skips without limit");
        return pl_error_set(PL_ERR_NUMERIC, "non-finite training loss %g at epoch %lld step %lld "
                            "batch %lld, %lld in a row: on_nan = skip allows at most %lld "
                            "consecutive skipped steps (max_consecutive_nan_skips; last finite "
                            "loss %.6g)", lv, (long long)r->epoch, (long long)r->step,
                            (long long)r->batch, (long long)t->nan_skips,
                            (long long)t->max_nan_skips, t->last_finite_loss);
    }
    tr_log(t, "warning: non-finite loss at step %lld batch %lld: step skipped\n",
           (long long)r->step, (long long)r->batch);
    return PL_OK;
}

static tr_callback nan_cb = {.struct_size = sizeof(tr_callback), .name = "nan_policy",
                             .on_loss_read = nan_on_loss_read};

pl_status tr_cb_nan_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &nan_cb;
    return PL_OK;
}
