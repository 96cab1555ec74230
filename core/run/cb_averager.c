/* cb_averager.c - the [averager] stage (swa) driven as a callback: its
 * update after every optimizer step (`step`: the steps done) and at each
 * epoch's end (step -1), as pl_averager_vtable.update asks. The SWALR
 * learning-rate override stays with the schedulers (trainer.c). */
#include "callback.h"

static pl_status avg_step_end(void *self, trainer *t, const tr_step_info *s) {
    (void)self;
    return AVG(t)->update(t->avg.self, s->epoch, s->step);
}

static pl_status avg_train_epoch_end(void *self, trainer *t, const tr_epoch_info *e) {
    (void)self;
    (void)e;
    return AVG(t)->update(t->avg.self, t->epoch, -1);
}

static tr_callback avg_cb = {.struct_size = sizeof(tr_callback), .name = "averager",
                             .on_train_step_end = avg_step_end,
                             .on_train_epoch_end = avg_train_epoch_end};

pl_status tr_cb_averager_create(trainer *t, tr_callback **out) {
    *out = t->avg.self ? &avg_cb : NULL;
    return PL_OK;
}
