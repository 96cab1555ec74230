/* callback.h - the trainer's callbacks (core only; issue 32, item 0).
 *
 * The training loop (trainer.c: fit) fetches a batch, runs forward,
 * backward and the optimizer step, keeps the counters, and hands every other
 * concern to callbacks, as PyTorch Lightning's Trainer / Callback split:
 *
 *   cb_nan.c        the NaN policy (on_nan, max_consecutive_nan_skips)
 *   cb_averager.c   the [averager] stage's updates (swa): after each step, at each epoch's end
 *   cb_logging.c    the progress line, metrics.csv rows, the epoch and validation lines;
 *                   the only callback that reads a step's values back (at log_every_n_steps)
 *   cb_monitor.c    the monitored metrics: plateau schedulers, the best so far, early
 *                   stopping (Lightning's EarlyStopping, or the GAT rule)
 *   cb_checkpoint.c best, last, epoch-N and step-N checkpoints (Lightning's ModelCheckpoint)
 *   cb_ema.c        an exponential moving average of the weights ([trainer] ema_decay),
 *                   validated on the averaged weights when asked (Lightning's
 *                   EMAWeightAveraging); after cb_checkpoint, so that a best checkpoint
 *                   written at a validation holds the weights validated
 *   cb_signal.c     SIGINT / SIGTERM: finish the step, save last, stop
 *
 * Callbacks run in that order (tr_callbacks_create), then the extra ones of
 * tr_callbacks_set_extra, in the order given. Every hook is optional (NULL:
 * not called); the first hook that fails stops the dispatch and its error is
 * the run's. Hooks in the order one fit calls them:
 *
 *   on_fit_start
 *   per epoch:    on_epoch_start
 *     per batch:  on_loss_read       each training loss when the host reads it (the
 *                                    device path: at the next read, in order; data
 *                                    parallel: every micro-batch)
 *                 on_train_step_end  a batch that ended an optimizer step
 *                 on_train_batch_end every batch
 *                 [validation when due: on_validation_start, on_validation_end]
 *                 on_step_boundary   a batch that ended an optimizer step, after its
 *                                    validation (step checkpoints, the interrupt's save)
 *     on_train_epoch_end             the epoch's training is done (before its validation)
 *     [validation when due]
 *     on_epoch_end                   after the epoch's validation (checkpoints)
 *   on_fit_end
 *   on_test_end                      after the test phase evaluated the chosen weights
 *
 * A callback with state (state != NULL) has it saved in every checkpoint and
 * restored on resume, under "<name>.<key>" (a checkpoint without it is refused
 * on resume, naming the key, as for a stage).
 *
 * Values on the device: in one process, tr_step_info carries the step's loss,
 * gradient norm and found_inf as one-element f32 device tensors. A callback
 * that reads them back (pl_tensor_item, pl_tensor_to) makes the host wait for
 * the device at every step; the built-ins read only through tr_sv_flush, at
 * log steps, validation, checkpoints and the epoch's end.
 */
#ifndef PL_CALLBACK_H
#define PL_CALLBACK_H

#include <stddef.h>

#include "trainer_internal.h"

/* One training batch, as on_train_step_end / on_train_batch_end /
 * on_step_boundary see it. Tensors are borrowed for the call (NULL where
 * not kept on the device: data parallel, or a backend without found_inf). */
typedef struct tr_step_info {
    int64_t epoch;   /* 0-based */
    int64_t batch;   /* index of this batch in the epoch */
    int64_t batch0;  /* the epoch's first batch in this process (> 0 after a mid-epoch resume) */
    int64_t batches; /* training batches per epoch (this rank's) */
    int64_t step;    /* optimizer steps done (t->step, after this batch's step) */
    bool stepped;    /* this batch ended an optimizer step */
    bool logged;     /* stepped and step % log_every_n_steps == 0 */
    double lr;       /* group 0's learning rate of the last step */
    double step_seconds; /* stepped: wall seconds of the step (its micro-batches and update) */
    double epoch_t0;     /* tr_now() when the epoch began in this process */
    /* device path: f32 [1] each, on the run's device */
    pl_tensor *loss;      /* this micro-batch's loss */
    pl_tensor *grad_norm; /* stepped: the step's total gradient 2-norm (before clipping) */
    pl_tensor *found_inf; /* stepped: 0, or NaN when a loss of the step was not finite,
                           * or 1 when the precision's device scaler skipped it (fp16) */
    /* host path (data parallel): the values as read; NaN on the device path */
    double host_loss, host_grad_norm;
} tr_step_info;

/* One training loss read back by the host (on_loss_read). */
typedef struct tr_loss_value {
    double value;
    int64_t epoch, step, batch; /* when it was computed (step: the optimizer step it belongs to) */
} tr_loss_value;

/* The epoch's training, for on_train_epoch_end. */
typedef struct tr_epoch_info {
    double seconds;      /* wall seconds of the epoch's training in this process */
    double samples;      /* samples trained on (every rank's) */
    double data_wait;    /* seconds the loop waited for the loader */
    double train_loss;   /* the epoch's mean training loss (NaN: none) */
} tr_epoch_info;

typedef struct tr_callback {
    uint32_t struct_size; /* sizeof(tr_callback) the callback was built with; hooks appended
                           * later are called only when struct_size covers them */
    const char *name;     /* log lines and the checkpoint state's prefix; static string */
    void *self;           /* the callback's own data, handed to every hook */
    pl_status (*on_fit_start)(void *self, trainer *t);
    pl_status (*on_epoch_start)(void *self, trainer *t);
    /* PL_OK, or the error that ends the run (on_nan = stop). A non-finite
     * value the policy allows is a skipped step (the loop takes it back). */
    pl_status (*on_loss_read)(void *self, trainer *t, const tr_loss_value *r);
    pl_status (*on_train_step_end)(void *self, trainer *t, const tr_step_info *s);
    pl_status (*on_train_batch_end)(void *self, trainer *t, const tr_step_info *s);
    pl_status (*on_step_boundary)(void *self, trainer *t, const tr_step_info *s);
    pl_status (*on_train_epoch_end)(void *self, trainer *t, const tr_epoch_info *e);
    pl_status (*on_validation_start)(void *self, trainer *t);
    /* m: the validation metrics (borrowed); seconds: how long it took */
    pl_status (*on_validation_end)(void *self, trainer *t, const pl_metrics *m, double seconds);
    pl_status (*on_epoch_end)(void *self, trainer *t);
    pl_status (*on_fit_end)(void *self, trainer *t);
    pl_status (*on_test_end)(void *self, trainer *t);
    /* checkpoint state through the stages' visitor (plugin.h) */
    pl_status (*state)(void *self, const pl_state_visitor *v);
    void (*destroy)(void *self); /* frees self (and the tr_callback when it owns it) */
} tr_callback;

/* Hook `f` is present in callback c (struct_size covers it and it is set). */
#define TR_CB_HAS(c, f) ((c)->struct_size >= offsetof(tr_callback, f) + sizeof((c)->f) && (c)->f)

/* Call hook `f` of every callback in order with (self, t, args...); stops at
 * the first error. Evaluates to the pl_status. */
#define TR_CB_DISPATCH(t, f, ...)                                                                 \
    __extension__({                                                                                \
        pl_status st_ = PL_OK;                                                                     \
        for (int i_ = 0; i_ < (t)->n_cbs && !st_; i_++) {                                          \
            tr_callback *c_ = (t)->cbs[i_];                                                        \
            if (TR_CB_HAS(c_, f)) st_ = c_->f(c_->self, (t), ##__VA_ARGS__);                       \
        }                                                                                          \
        st_;                                                                                       \
    })

/* The built-in callbacks in their order, then the extra ones. PL_ERR_CONFIG
 * / PL_ERR_NOMEM naming the callback. After the stages exist (the EMA reads
 * the parameter list), before a checkpoint is resumed. */
pl_status tr_callbacks_create(trainer *t);
void tr_callbacks_destroy(trainer *t); /* NULL-safe, idempotent */
/* Extra callbacks appended after the built-ins in every run this process
 * starts afterwards (tests; borrowed: they must outlive the runs; their
 * destroy is not called). n = 0 clears them. At most TR_MAX_CALLBACKS - 8. */
void tr_callbacks_set_extra(tr_callback *const *cbs, int n);

/* Each callback's state under its name (checkpoint.c's visitor). */
typedef pl_status (*tr_cb_state_visit)(void *ctx, tr_callback *c);

/* ---- the built-ins (constructors; NULL self where a callback is off) ---- */
pl_status tr_cb_nan_create(trainer *t, tr_callback **out);
pl_status tr_cb_averager_create(trainer *t, tr_callback **out);
pl_status tr_cb_ema_create(trainer *t, tr_callback **out); /* *out NULL: ema_decay = 0 */
pl_status tr_cb_logging_create(trainer *t, tr_callback **out);
pl_status tr_cb_monitor_create(trainer *t, tr_callback **out);
pl_status tr_cb_checkpoint_create(trainer *t, tr_callback **out);
pl_status tr_cb_signal_create(trainer *t, tr_callback **out);
pl_status tr_cb_throughput_create(trainer *t, tr_callback **out); /* cb_throughput.c */

/* ---- cb_signal.c: SIGINT / SIGTERM ---- */
void tr_signals_install(void);
/* An interrupted run that saved keeps the handler (it then ignores signals)
 * until the process exits; any other run restores the previous handlers. */
void tr_signals_restore(void);
int tr_signal_pending(void);    /* the signal number received, 0: none */
void tr_signals_mark_saved(void); /* the interrupted run wrote its summary */

#endif
