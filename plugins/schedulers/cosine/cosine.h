/* cosine.h - linear warmup + cosine decay as a pure function, exposed for
 * the plugin's test (not installed). */
#ifndef PL_COSINE_H
#define PL_COSINE_H

#include <stdint.h>

typedef struct pl_cosine {
    int64_t total_steps;   /* optimizer steps of the schedule */
    int64_t warmup_steps;  /* W, 0 for none */
    double warmup_start;   /* factor at step 0 of the warmup */
    double eta_min;        /* final factor (eta_min lr / optimizer lr) */
} pl_cosine;

/* Factor of initial_lr at optimizer step `step` (0-based):
 *   step < W:        warmup_start + (1 - warmup_start) step / W
 *   W <= step <= T:  eta_min + (1 - eta_min) (1 + cos(pi (step - W) / (T - W))) / 2
 *   step > T:        eta_min */
double pl_cosine_factor(const pl_cosine *c, int64_t step);

#endif
