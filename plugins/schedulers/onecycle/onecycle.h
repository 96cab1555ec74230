/* onecycle.h - the OneCycleLR schedule as a pure function, exposed for the
 * plugin's test (not installed). */
#ifndef PL_ONECYCLE_H
#define PL_ONECYCLE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pl_onecycle {
    double max_lr;         /* peak lr (absolute) */
    int64_t total_steps;   /* > 0 */
    double pct_start;      /* [0, 1] */
    bool cos;              /* anneal_strategy: true cos, false linear */
    double div_factor;     /* initial_lr = max_lr / div_factor */
    double final_div_factor; /* min_lr = initial_lr / final_div_factor */
    bool three_phase;
    bool cycle_momentum;
    double base_momentum, max_momentum;
} pl_onecycle;

/* torch.optim.lr_scheduler.OneCycleLR.get_lr() at scheduler step `step`
 * (= optimizer step, 0-based), clamped to [0, total_steps - 1]. Writes the
 * momentum (beta1) to *momentum when cycle_momentum and momentum != NULL. */
double pl_onecycle_lr(const pl_onecycle *o, int64_t step, double *momentum);

#endif
