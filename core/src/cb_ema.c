/* cb_ema.c - placeholder until the EMA callback lands. */
#include "callback.h"

pl_status tr_cb_ema_create(trainer *t, tr_callback **out) {
    (void)t;
    *out = NULL;
    return PL_OK;
}
