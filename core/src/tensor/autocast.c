/* autocast.c - the dtype matmul-like ops compute in (plugin.h, "Autocast"),
 * read by pl_matmul, pl_linear and pl_nf4_matmul through pl_autocast_get.
 *
 * As torch.autocast keeps its state per thread, so does this file: the
 * calling thread's current run context (whose .autocast the run's precision
 * plugin set), and a stack of scopes opened by pl_autocast_begin that
 * override it. No process-wide state: two threads (two harnesses, a run and
 * a tool) each see their own. Tensor + ops layer; it reads the context's
 * field and calls nothing above. */
#include "internal.h"

#define MAX_SCOPES 32

static _Thread_local pl_run_context *tl_ctx;
static _Thread_local pl_dtype tl_scope[MAX_SCOPES];
static _Thread_local int tl_depth;
/* pl_autocast_set with no current context (deprecated path) */
static _Thread_local pl_dtype tl_fallback = PL_F32;

pl_run_context *pl_run_context_make_current(pl_run_context *ctx) {
    pl_run_context *prev = tl_ctx;
    tl_ctx = ctx;
    return prev;
}

pl_run_context *pl_run_context_current(void) { return tl_ctx; }

pl_status pl_autocast_begin(pl_dtype dt) {
    if (dt != PL_F32 && dt != PL_BF16 && dt != PL_F16)
        return pl_error_set(PL_ERR_DTYPE,
                            "pl_autocast_begin: dtype %s; expected f32 (autocast off), bf16 or f16",
                            pl_dtype_name(dt));
    if (tl_depth >= MAX_SCOPES)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_autocast_begin: %d scopes already open on this thread (the most); "
                            "is a pl_autocast_end missing?",
                            MAX_SCOPES);
    tl_scope[tl_depth++] = dt;
    return PL_OK;
}

void pl_autocast_end(void) {
    if (tl_depth > 0) tl_depth--;
}

pl_dtype pl_autocast_get(void) {
    if (tl_depth > 0) return tl_scope[tl_depth - 1];
    return tl_ctx ? tl_ctx->autocast : tl_fallback;
}

void pl_autocast_set(pl_dtype dt) {
    if (tl_ctx)
        tl_ctx->autocast = dt;
    else
        tl_fallback = dt;
}
