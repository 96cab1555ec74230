/* constant.c - constant learning rate (factor 1), optionally after a linear
 * warmup of warmup_steps steps from warmup_start_factor (torch LinearLR with
 * end_factor 1: start + (1 - start) step / W for step < W).
 */
#include <math.h>
#include <stdlib.h>

#include "../common/sched_common.h"
#include "pipeline/pipeline.h"

typedef struct constant {
    int64_t warmup_steps;
    double warmup_start;
} constant;

static pl_status constant_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    constant c = {0};
    int64_t total = ctx ? ctx->total_steps : 0;
    c.warmup_steps = pl_sched_warmup_steps(cfg, total);
    c.warmup_start = pl_cfg_float(cfg, "warmup_start_factor", 0.0);
    if (c.warmup_steps < 0)
        return pl_error_set(PL_ERR_CONFIG, "constant: warmup_steps = %lld: expected >= 0",
                            (long long)c.warmup_steps);
    constant *p = malloc(sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "constant: out of memory");
    *p = c;
    *self = p;
    return PL_OK;
}

static void constant_destroy(void *self) { free(self); }

static double constant_lr_factor(void *self, int64_t step) {
    const constant *c = self;
    return pl_sched_warmup(step, c->warmup_steps, c->warmup_start);
}

/* A pure function of the step: nothing to save. */
static pl_status constant_state(void *self, const pl_state_visitor *v) { return PL_OK; }

static const pl_option_spec constant_options[] = {
    {"warmup_steps", PL_OPT_INT, "0", 0, 1e15, NULL, "linear warmup steps (wins over warmup_pct)"},
    {"warmup_pct", PL_OPT_FLOAT, "0", 0, 1, NULL,
     "warmup as a fraction of the fit's optimizer steps (floored)"},
    {"warmup_start_factor", PL_OPT_FLOAT, "0", 0, 1, NULL, "lr factor at step 0 of the warmup"},
    PL_OPTIONS_END};

static const pl_scheduler_vtable constant_vtable = {
    .create = constant_create,
    .destroy = constant_destroy,
    .lr_factor = constant_lr_factor,
    .on_validation = NULL,
    .state = constant_state,
    .monitor = NULL,
};

PL_PLUGIN_DEFINE(constant, PL_KIND_SCHEDULER, "1.0.0",
                 "constant learning rate with optional linear warmup", constant_options,
                 &constant_vtable)
