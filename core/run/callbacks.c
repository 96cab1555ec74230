/* callbacks.c - the trainer's callback list: the built-ins in their order,
 * then the extra ones (callback.h). */
#include <string.h>

#include "callback.h"

static tr_callback *g_extra[TR_MAX_CALLBACKS];
static int g_n_extra;

void tr_callbacks_set_extra(tr_callback *const *cbs, int n) {
    if (n < 0) n = 0;
    if (n > TR_MAX_CALLBACKS - 8) n = TR_MAX_CALLBACKS - 8;
    for (int i = 0; i < n; i++) g_extra[i] = cbs[i];
    g_n_extra = n;
}

typedef pl_status (*cb_ctor)(trainer *t, tr_callback **out);

pl_status tr_callbacks_create(trainer *t) {
    /* the order is the call order (callback.h): the NaN policy decides a loss
     * before anything logs it; the monitor decides best and stop before the
     * checkpoint callback saves; the EMA swaps the averaged weights back after
     * the best checkpoint was written with them */
    static const cb_ctor builtin[] = {tr_cb_nan_create,        tr_cb_averager_create,
                                      tr_cb_logging_create,    tr_cb_monitor_create,
                                      tr_cb_checkpoint_create, tr_cb_ema_create,
                                      tr_cb_signal_create,     tr_cb_throughput_create};
    tr_callbacks_destroy(t);
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        tr_callback *c = NULL;
        pl_status st = builtin[i](t, &c);
        if (st) return st;
        if (c) t->cbs[t->n_cbs++] = c;
    }
    t->n_builtin_cbs = t->n_cbs;
    for (int i = 0; i < g_n_extra && t->n_cbs < TR_MAX_CALLBACKS; i++) t->cbs[t->n_cbs++] = g_extra[i];
    return PL_OK;
}

void tr_callbacks_destroy(trainer *t) {
    for (int i = 0; i < t->n_builtin_cbs; i++) {
        tr_callback *c = t->cbs[i];
        if (c && TR_CB_HAS(c, destroy)) c->destroy(c->self);
    }
    memset(t->cbs, 0, sizeof t->cbs);
    t->n_cbs = t->n_builtin_cbs = 0;
}

pl_status tr_loss_read(trainer *t, double lv, int64_t epoch, int64_t step, int64_t batch) {
    tr_loss_value r = {lv, epoch, step, batch};
    return TR_CB_DISPATCH(t, on_loss_read, &r);
}
