/* status.c - per-thread error context (see status.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/status.h"

static _Thread_local char tl_msg[1024];
static _Thread_local pl_status tl_status = PL_OK;

pl_status pl_error_set(pl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    va_end(ap);
    tl_status = status;
    return status;
}

pl_status pl_error_prefix(pl_status status, const char *fmt, ...) {
    char prefix[512], old[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tl_msg, sizeof old);
    if (!old[0]) /* the callee failed without a word: say so, not "prefix: " */
        snprintf(tl_msg, sizeof tl_msg, "%s: failed without setting an error message (status %s)",
                 prefix, pl_status_name(status));
    else
        snprintf(tl_msg, sizeof tl_msg, "%s: %s", prefix, old);
    tl_status = status;
    return status;
}

const char *pl_error_message(void) { return tl_msg; }
pl_status pl_error_status(void) { return tl_status; }
void pl_error_clear(void) {
    tl_msg[0] = 0;
    tl_status = PL_OK;
}

static __thread char tl_hint[512];

void pl_hint_set(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_hint, sizeof tl_hint, fmt, ap);
    va_end(ap);
}
const char *pl_hint_get(void) { return tl_hint; }
void pl_hint_clear(void) { tl_hint[0] = '\0'; }

const char *pl_status_name(pl_status s) {
    static const char *names[] = {"PL_OK",          "PL_ERR_INVALID", "PL_ERR_CONFIG",
                                  "PL_ERR_IO",      "PL_ERR_NOMEM",   "PL_ERR_ABI",
                                  "PL_ERR_SHAPE",   "PL_ERR_DTYPE",   "PL_ERR_DEVICE",
                                  "PL_ERR_NUMERIC", "PL_ERR_UNSUPPORTED", "PL_ERR_INTERNAL"};
    if ((unsigned)s < sizeof names / sizeof names[0]) return names[s];
    return "PL_ERR_?";
}
