/* cb_checkpoint.c - checkpoints as a callback (Lightning's ModelCheckpoint):
 *  - best (save_best): after a validation the monitor callback found the
 *    best so far; at an epoch's end it records the next epoch, as last does;
 *  - step-NNNNNN and last every checkpoint_every_n_train_steps optimizer
 *    steps, after the step's validation (so it holds its outcome), unless
 *    that validation stopped the run;
 *  - last (save_last) and epoch-NNNN (checkpoint_every_n_epochs) after each
 *    epoch's validation; they record the next epoch to run.
 * Mid-epoch checkpoints are taken at optimizer-step boundaries only. */
#include <limits.h>
#include <stdio.h>

#include "callback.h"

static pl_status ckpt_validation_end(void *self, trainer *t, const pl_metrics *m, double seconds) {
    (void)self;
    (void)m;
    (void)seconds;
    if (!t->val_is_best || !t->save_best) return PL_OK;
    snprintf(t->best_path, sizeof t->best_path, "%s/checkpoints/best.safetensors", t->run_dir);
    /* at an epoch end, best records the next epoch to run, as last does: a
     * resume from it must not train the finished epoch again */
    if (t->epoch_done) t->epoch++;
    pl_status st = tr_save_checkpoint(t, t->best_path);
    if (t->epoch_done) t->epoch--;
    return st;
}

static pl_status ckpt_step_boundary(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    (void)s;
    if (t->should_stop || t->ckpt_every_steps <= 0 || t->step % t->ckpt_every_steps != 0)
        return PL_OK;
    pl_status st = tr_sv_flush(t);
    /* a skipped step found by the read is no step to checkpoint at */
    if (st || t->step % t->ckpt_every_steps != 0) return st;
    if (t->save_last) st = tr_save_checkpoint(t, t->last_path);
    if (!st) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/checkpoints/step-%06lld.safetensors", t->run_dir,
                 (long long)t->step);
        st = tr_save_checkpoint(t, p);
    }
    return st;
}

static pl_status ckpt_epoch_end(void *self, trainer *t) {
    (void)self;
    pl_status st = PL_OK;
    int64_t done = t->epoch + 1;
    t->epoch++; /* checkpoints record the next epoch to run */
    if (t->save_last) st = tr_save_checkpoint(t, t->last_path);
    if (!st && t->ckpt_every > 0 && done % t->ckpt_every == 0) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/checkpoints/epoch-%04lld.safetensors", t->run_dir,
                 (long long)done);
        st = tr_save_checkpoint(t, p);
    }
    t->epoch--;
    return st;
}

static tr_callback ckpt_cb = {.struct_size = sizeof(tr_callback), .name = "checkpoint",
                              .on_validation_end = ckpt_validation_end,
                              .on_step_boundary = ckpt_step_boundary,
                              .on_epoch_end = ckpt_epoch_end};

pl_status tr_cb_checkpoint_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = &ckpt_cb;
    return PL_OK;
}
