/* sched_common.h - small helpers shared by the scheduler plugins and the
 * swa averager (header-only, compiled into each plugin; not installed).
 *
 * Factor convention (see plugins/schedulers/README.md): a scheduler returns
 * the multiplier of each group's initial_lr (= optimizer lr x lr_scale).
 * Options given as absolute learning rates (onecycle max_lr, cosine eta_min,
 * plateau min_lr, swa swa_lr) are divided by the optimizer's base lr, read
 * from the optimizer itself: ctx->optimizer (plugin.h, ABI 2.9), which the
 * trainer sets before creating schedulers and averagers.
 */
#ifndef PL_SCHED_COMMON_H
#define PL_SCHED_COMMON_H

#include <stdint.h>

#include "pipeline/pipeline.h"

/* The optimizer's base lr through its public groups (ctx->optimizer):
 * group 0's configured lr, initial_lr / lr_scale (initial_lr when lr_scale
 * <= 0), i.e. the `[optimizer] lr` of the config after a strategy's lr
 * scaling. `who` and `why` (the option that needs it) go into the error
 * message: PL_ERR_CONFIG when the context has no optimizer, it has no group,
 * or the lr is not > 0. */
static inline pl_status pl_sched_optimizer_lr(const pl_run_context *ctx, const char *who,
                                              const char *why, double *lr) {
    const pl_optimizer_vtable *o = ctx ? ctx->optimizer : NULL;
    if (!o || !o->num_groups || !o->group)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: %s is an absolute learning rate but the run has no optimizer "
                            "to read the base lr from (run context field 'optimizer' not set: "
                            "the trainer sets it before creating schedulers and averagers)",
                            who, why);
    const pl_param_group *g0 =
        o->num_groups(ctx->optimizer_self) > 0 ? o->group(ctx->optimizer_self, 0) : NULL;
    if (!g0)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: %s is an absolute learning rate but the optimizer has no "
                            "parameter group to read the base lr from",
                            who, why);
    double v = g0->lr_scale > 0 ? g0->initial_lr / g0->lr_scale : g0->initial_lr;
    if (!(v > 0))
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: the optimizer's base lr (group '%s': initial_lr %g / lr_scale "
                            "%g) = %g: expected > 0 to convert %s",
                            who, g0->name, g0->initial_lr, g0->lr_scale, v, why);
    *lr = v;
    return PL_OK;
}

/* Linear warmup factor as torch.optim.lr_scheduler.LinearLR(start_factor,
 * end_factor=1, total_iters=warmup): start + (1 - start) * step / warmup for
 * step < warmup, 1 afterwards. */
static inline double pl_sched_warmup(int64_t step, int64_t warmup, double start) {
    if (step >= warmup || warmup <= 0) return 1.0;
    if (step < 0) step = 0;
    return start + (1.0 - start) * (double)step / (double)warmup;
}

/* Warmup length from the options warmup_steps (>= 0 wins when set) or
 * warmup_pct (fraction of total_steps, floored). */
static inline int64_t pl_sched_warmup_steps(const pl_config_section *cfg, int64_t total_steps) {
    if (pl_cfg_is_set(cfg, "warmup_steps") || !pl_cfg_is_set(cfg, "warmup_pct"))
        return pl_cfg_int(cfg, "warmup_steps", 0);
    double pct = pl_cfg_float(cfg, "warmup_pct", 0.0);
    return (int64_t)(pct * (double)total_steps);
}

#endif
