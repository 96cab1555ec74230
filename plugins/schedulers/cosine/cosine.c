/* cosine.c - linear warmup then cosine annealing to eta_min, per optimizer
 * step. Equals torch's SequentialLR([LinearLR(start_factor=warmup_start,
 * total_iters=W), CosineAnnealingLR(T_max=T-W, eta_min)], milestones=[W])
 * for steps 0..T (torch's cosine would rise again after T; this one stays at
 * eta_min). With W = 0 it is CosineAnnealingLR alone (Loshchilov & Hutter
 * 2017, SGDR, without restarts).
 */
#include "cosine.h"

#include <math.h>
#include <stdlib.h>

#include "../common/sched_common.h"
#include "pipeline/pipeline.h"

double pl_cosine_factor(const pl_cosine *c, int64_t step) {
    if (step < 0) step = 0;
    if (step < c->warmup_steps) return pl_sched_warmup(step, c->warmup_steps, c->warmup_start);
    int64_t span = c->total_steps - c->warmup_steps;
    if (step >= c->total_steps || span <= 0) return step >= c->total_steps ? c->eta_min : 1.0;
    double t = (double)(step - c->warmup_steps) / (double)span;
    return c->eta_min + (1.0 - c->eta_min) * (1.0 + cos(M_PI * t)) / 2.0;
}

/* ---- plugin ------------------------------------------------------------ */

static pl_status cosine_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    pl_cosine c = {0};
    c.total_steps = pl_cfg_int(cfg, "total_steps", 0);
    if (c.total_steps <= 0) c.total_steps = ctx ? ctx->total_steps : 0;
    if (c.total_steps <= 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "cosine: total_steps = %lld: expected > 0 (set total_steps or let the "
                            "trainer provide the fit's optimizer steps)",
                            (long long)c.total_steps);
    c.warmup_steps = pl_sched_warmup_steps(cfg, c.total_steps);
    c.warmup_start = pl_cfg_float(cfg, "warmup_start_factor", 0.0);
    if (c.warmup_steps < 0 || c.warmup_steps > c.total_steps)
        return pl_error_set(PL_ERR_CONFIG, "cosine: warmup of %lld steps: expected 0..%lld",
                            (long long)c.warmup_steps, (long long)c.total_steps);
    double eta_min = pl_cfg_float(cfg, "eta_min", 0.0);
    if (eta_min > 0) {
        double base = 1.0;
        pl_status s = pl_sched_optimizer_lr(ctx, "cosine", "eta_min", &base);
        if (s) return s;
        c.eta_min = eta_min / base;
    }
    pl_cosine *p = malloc(sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "cosine: out of memory");
    *p = c;
    *self = p;
    return PL_OK;
}

static void cosine_destroy(void *self) { free(self); }

static double cosine_lr_factor(void *self, int64_t step) {
    return pl_cosine_factor(self, step);
}

/* A pure function of the step: nothing to save. */
static pl_status cosine_state(void *self, const pl_state_visitor *v) { return PL_OK; }

static const pl_option_spec cosine_options[] = {
    {"total_steps", PL_OPT_INT, "0", 0, 1e15, NULL,
     "optimizer steps of the schedule incl. warmup (0: the whole fit, from the trainer)"},
    {"warmup_steps", PL_OPT_INT, "0", 0, 1e15, NULL, "linear warmup steps (wins over warmup_pct)"},
    {"warmup_pct", PL_OPT_FLOAT, "0", 0, 1, NULL,
     "warmup as a fraction of total_steps (floored), used when warmup_steps is not set"},
    {"warmup_start_factor", PL_OPT_FLOAT, "0", 0, 1, NULL, "lr factor at step 0 of the warmup"},
    {"eta_min", PL_OPT_FLOAT, "0", 0, 1e9, NULL, "final learning rate, absolute"},
    PL_OPTIONS_END};

static const pl_scheduler_vtable cosine_vtable = {
    .create = cosine_create,
    .destroy = cosine_destroy,
    .lr_factor = cosine_lr_factor,
    .on_validation = NULL,
    .state = cosine_state,
    .monitor = NULL,
};

PL_PLUGIN_DEFINE(cosine, PL_KIND_SCHEDULER, "1.0.0",
                 "linear warmup then cosine decay (torch LinearLR + CosineAnnealingLR)",
                 cosine_options, &cosine_vtable)
