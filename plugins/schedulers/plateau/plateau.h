/* plateau.h - ReduceLROnPlateau as a small state machine, exposed for the
 * plugin's test (not installed). */
#ifndef PL_PLATEAU_H
#define PL_PLATEAU_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pl_plateau {
    /* settings */
    bool mode_max;     /* mode: false min, true max */
    bool rel;          /* threshold_mode: true rel, false abs */
    double factor;     /* new_lr = lr * factor, < 1 */
    int64_t patience;
    double threshold;
    int64_t cooldown;
    double min_lr;     /* absolute */
    double eps;        /* absolute: reductions smaller than eps are ignored */
    /* state */
    double lr;         /* current lr (absolute; starts at the optimizer's lr) */
    double best;
    int64_t num_bad_epochs, cooldown_counter, last_epoch;
} pl_plateau;

/* Reset the state for a run starting at absolute lr `lr0`. */
void pl_plateau_reset(pl_plateau *p, double lr0);
/* torch ReduceLROnPlateau.step(metric): update best / counters, maybe
 * reduce p->lr. Returns true if the lr was reduced. */
bool pl_plateau_step(pl_plateau *p, double metric);

#endif
