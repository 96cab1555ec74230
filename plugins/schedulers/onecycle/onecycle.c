/* onecycle.c - torch.optim.lr_scheduler.OneCycleLR (Smith & Topin 2017,
 * "Super-Convergence"), per optimizer step, with momentum (beta1) cycling.
 *
 * Phases (end steps as floats, exactly as torch):
 *   two-phase:   [0, pct*T - 1]        initial_lr -> max_lr, max_m -> base_m
 *                (.., T - 1]           max_lr -> min_lr,     base_m -> max_m
 *   three-phase: [0, pct*T - 1]        initial_lr -> max_lr, max_m -> base_m
 *                (.., 2 pct*T - 2]     max_lr -> initial_lr, base_m -> max_m
 *                (.., T - 1]           initial_lr -> min_lr, max_m -> max_m
 * pct = (step - start) / (end - start); cos: end + (start - end)/2 (cos(pi pct) + 1);
 * linear: (end - start) pct + start. initial_lr = max_lr / div_factor,
 * min_lr = initial_lr / final_div_factor.
 * The factor returned is lr(step) / optimizer.lr (see sched_common.h).
 */
#include "onecycle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/sched_common.h"
#include "pipeline/pipeline.h"

static double anneal(bool cos_, double start, double end, double pct) {
    if (cos_) {
        double cos_out = cos(M_PI * pct) + 1.0;
        return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
}

double pl_onecycle_lr(const pl_onecycle *o, int64_t step, double *momentum) {
    const double T = (double)o->total_steps;
    const double initial = o->max_lr / o->div_factor;
    const double min_lr = initial / o->final_div_factor;
    struct {
        double end, lr0, lr1, m0, m1;
    } ph[3];
    int n;
    if (o->three_phase) {
        ph[0].end = o->pct_start * T - 1, ph[0].lr0 = initial, ph[0].lr1 = o->max_lr;
        ph[0].m0 = o->max_momentum, ph[0].m1 = o->base_momentum;
        ph[1].end = 2 * o->pct_start * T - 2, ph[1].lr0 = o->max_lr, ph[1].lr1 = initial;
        ph[1].m0 = o->base_momentum, ph[1].m1 = o->max_momentum;
        ph[2].end = T - 1, ph[2].lr0 = initial, ph[2].lr1 = min_lr;
        ph[2].m0 = o->max_momentum, ph[2].m1 = o->max_momentum;
        n = 3;
    } else {
        ph[0].end = o->pct_start * T - 1, ph[0].lr0 = initial, ph[0].lr1 = o->max_lr;
        ph[0].m0 = o->max_momentum, ph[0].m1 = o->base_momentum;
        ph[1].end = T - 1, ph[1].lr0 = o->max_lr, ph[1].lr1 = min_lr;
        ph[1].m0 = o->base_momentum, ph[1].m1 = o->max_momentum;
        n = 2;
    }
    if (step < 0) step = 0;
    if (step > o->total_steps - 1) step = o->total_steps - 1;
    const double s = (double)step;
    double start = 0.0, lr = o->max_lr, m = o->max_momentum;
    for (int i = 0; i < n; i++) {
        if (s <= ph[i].end || i == n - 1) {
            double pct = (s - start) / (ph[i].end - start);
            lr = anneal(o->cos, ph[i].lr0, ph[i].lr1, pct);
            m = anneal(o->cos, ph[i].m0, ph[i].m1, pct);
            break;
        }
        start = ph[i].end;
    }
    if (momentum && o->cycle_momentum) *momentum = m;
    return lr;
}

/* ---- plugin ------------------------------------------------------------ */

typedef struct onecycle {
    pl_onecycle oc;
    double base_lr; /* optimizer.lr: factor = lr / base_lr */
} onecycle;

static pl_status onecycle_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    *self = NULL;
    onecycle o = {0};
    o.oc.max_lr = pl_cfg_float(cfg, "max_lr", 0.0);
    o.oc.total_steps = pl_cfg_int(cfg, "total_steps", 0);
    if (o.oc.total_steps <= 0) o.oc.total_steps = ctx ? ctx->total_steps : 0;
    o.oc.pct_start = pl_cfg_float(cfg, "pct_start", 0.3);
    const char *strategy = pl_cfg_str(cfg, "anneal_strategy", "cos");
    if (strcmp(strategy, "cos") && strcmp(strategy, "linear"))
        return pl_error_set(PL_ERR_CONFIG, "onecycle: anneal_strategy = '%s': expected cos|linear",
                            strategy);
    o.oc.cos = !strcmp(strategy, "cos");
    o.oc.div_factor = pl_cfg_float(cfg, "div_factor", 25.0);
    o.oc.final_div_factor = pl_cfg_float(cfg, "final_div_factor", 1e4);
    o.oc.three_phase = pl_cfg_bool(cfg, "three_phase", false);
    o.oc.cycle_momentum = pl_cfg_bool(cfg, "cycle_momentum", true);
    o.oc.base_momentum = pl_cfg_float(cfg, "base_momentum", 0.85);
    o.oc.max_momentum = pl_cfg_float(cfg, "max_momentum", 0.95);
    if (o.oc.total_steps <= 0)
        return pl_error_set(PL_ERR_CONFIG,
                            "onecycle: total_steps = %lld: expected > 0 (set total_steps or let "
                            "the trainer provide the fit's optimizer steps)",
                            (long long)o.oc.total_steps);
    if (!(o.oc.div_factor > 0) || !(o.oc.final_div_factor > 0))
        return pl_error_set(PL_ERR_CONFIG,
                            "onecycle: div_factor = %g, final_div_factor = %g: expected > 0",
                            o.oc.div_factor, o.oc.final_div_factor);
    if (o.oc.max_lr > 0) {
        pl_status s = pl_sched_optimizer_lr(ctx, "onecycle", "max_lr", &o.base_lr);
        if (s) return s;
    } else {
        o.oc.max_lr = 1.0; /* peak = the optimizer's lr */
        o.base_lr = 1.0;
    }
    onecycle *p = malloc(sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "onecycle: out of memory");
    *p = o;
    *self = p;
    return PL_OK;
}

static void onecycle_destroy(void *self) { free(self); }

static double onecycle_factor(void *self, int64_t step) {
    const onecycle *o = self;
    double m = NAN;
    return pl_onecycle_lr(&o->oc, step, &m) / o->base_lr;
}

/* Momentum cycling as torch's OneCycleLR: the group's "momentum" (sgd) or,
 * for Adam-style optimizers, "beta1"; a group with neither is left alone. */
static void onecycle_drive(void *self, int64_t step, pl_param_group *g) {
    const onecycle *o = self;
    if (!o->oc.cycle_momentum) return;
    pl_hparam *h = pl_group_hparam(g, "momentum");
    if (!h) h = pl_group_hparam(g, "beta1");
    if (!h) return;
    double m = NAN;
    pl_onecycle_lr(&o->oc, step, &m);
    h->value = m;
}

/* A pure function of the step: nothing to save. */
static pl_status onecycle_state(void *self, const pl_state_visitor *v) { return PL_OK; }

static const pl_option_spec onecycle_options[] = {
    {"max_lr", PL_OPT_FLOAT, "0", 0, 1e9, NULL,
     "peak learning rate, absolute (0: the optimizer's lr)"},
    {"total_steps", PL_OPT_INT, "0", 0, 1e15, NULL,
     "optimizer steps of the cycle (0: the whole fit, from the trainer)"},
    {"pct_start", PL_OPT_FLOAT, "0.3", 0, 1, NULL, "fraction of the cycle spent increasing the lr"},
    {"anneal_strategy", PL_OPT_CHOICE, "cos", PL_NO_BOUNDS, "cos|linear", "annealing shape"},
    {"div_factor", PL_OPT_FLOAT, "25", 1e-12, 1e12, NULL, "initial_lr = max_lr / div_factor"},
    {"final_div_factor", PL_OPT_FLOAT, "1e4", 1e-12, 1e15, NULL,
     "min_lr = initial_lr / final_div_factor"},
    {"three_phase", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "third phase: back to initial_lr, then anneal to min_lr (fastai style)"},
    {"cycle_momentum", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "cycle the optimizer's momentum (sgd) or beta1 (adamw) inversely to the lr"},
    {"base_momentum", PL_OPT_FLOAT, "0.85", 0, 1, NULL, "lowest momentum (at the lr peak)"},
    {"max_momentum", PL_OPT_FLOAT, "0.95", 0, 1, NULL, "highest momentum (at the ends)"},
    PL_OPTIONS_END};

static const pl_scheduler_vtable onecycle_vtable = {
    .create = onecycle_create,
    .destroy = onecycle_destroy,
    .lr_factor = onecycle_factor,
    .drive = onecycle_drive,
    .on_validation = NULL,
    .state = onecycle_state,
    .monitor = NULL,
};

PL_PLUGIN_DEFINE(onecycle, PL_KIND_SCHEDULER, "1.0.0",
                 "one-cycle lr and momentum policy (torch.optim.lr_scheduler.OneCycleLR)",
                 onecycle_options, &onecycle_vtable)
