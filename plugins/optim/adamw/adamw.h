/* adamw.h - the AdamW / Adam update of one parameter tensor, exposed for
 * the plugin's test (not installed). */
#ifndef PL_ADAMW_H
#define PL_ADAMW_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pl_adamw_hyper {
    double lr, beta1, beta2, eps, weight_decay;
    bool l2;      /* true: coupled L2 (torch.optim.Adam), false: decoupled (AdamW) */
    bool amsgrad;
    int64_t step; /* 1-based count of this update (bias correction) */
} pl_adamw_hyper;

/* One fused pass over n elements (OpenMP when n is large):
 *   p, m, v: f32 [n] updated in place; g: f32 [n] gradient (not modified);
 *   vmax: f32 [n] running max of v (amsgrad only, else NULL). */
void pl_adamw_update(float *p, const float *g, float *m, float *v, float *vmax, int64_t n,
                     const pl_adamw_hyper *h);

#endif
