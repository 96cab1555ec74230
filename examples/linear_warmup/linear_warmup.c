/* linear_warmup.c - linear learning-rate warm-up, then constant.
 *
 * PyTorch's torch.optim.lr_scheduler.LinearLR, stepped once per optimizer
 * step:
 *   factor(step) = start_factor
 *                  + (end_factor - start_factor) * min(step, total_iters) / total_iters
 * so the lr climbs from start_factor x lr to end_factor x lr over total_iters
 * steps and stays there. total_iters = 0: end_factor from the first step.
 *
 * An example of the scheduler contract of <pipeline/plugin.h>: lr_factor is
 * a pure function of the step, so the plugin has no checkpoint state.
 * Built only against the installed headers. */
#include <stdlib.h>

#include <pipeline/pipeline.h>

typedef struct linear_warmup {
    double start_factor, end_factor;
    int64_t total_iters;
} linear_warmup;

static const pl_option_spec lw_options[] = {
    {"start_factor", PL_OPT_FLOAT, "0.3333333333333333", 1e-8, 1, NULL,
     "lr multiplier at step 0 (LinearLR start_factor, in (0, 1])"},
    {"end_factor", PL_OPT_FLOAT, "1", 0, 1, NULL,
     "lr multiplier from step total_iters on (LinearLR end_factor)"},
    {"total_iters", PL_OPT_INT, "5", 0, 1e15, NULL, "optimizer steps of the linear ramp"},
    PL_OPTIONS_END};

static pl_status lw_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    (void)ctx;
    linear_warmup *s = calloc(1, sizeof *s);
    if (!s) return pl_error_set(PL_ERR_NOMEM, "linear_warmup: out of memory");
    /* validated by the core against lw_options before create runs */
    s->start_factor = pl_cfg_float(cfg, "start_factor", 1.0 / 3.0);
    s->end_factor = pl_cfg_float(cfg, "end_factor", 1.0);
    s->total_iters = pl_cfg_int(cfg, "total_iters", 5);
    *self = s;
    return PL_OK;
}

static void lw_destroy(void *self) {
    free(self);
}

static double lw_lr_factor(void *self, int64_t step) {
    const linear_warmup *s = self;
    if (s->total_iters <= 0 || step >= s->total_iters) return s->end_factor;
    if (step < 0) step = 0;
    return s->start_factor +
           (s->end_factor - s->start_factor) * (double)step / (double)s->total_iters;
}

/* Stateless: the factor depends on the step only, which the trainer restores. */
static pl_status lw_state(void *self, const pl_state_visitor *v) {
    (void)self;
    (void)v;
    return PL_OK;
}

static const pl_scheduler_vtable lw_vtable = {
    .create = lw_create,
    .destroy = lw_destroy,
    .lr_factor = lw_lr_factor,
    .drive = NULL,         /* optional: drives no optimizer hyper-parameter */
    .on_validation = NULL, /* optional: needs no metric */
    .state = lw_state,
    .monitor = NULL,
};

PL_PLUGIN_DEFINE(linear_warmup, PL_KIND_SCHEDULER, "1.0.0",
                 "linear lr warm-up, then constant (torch LinearLR)", lw_options, &lw_vtable)
