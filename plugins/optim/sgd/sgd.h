/* sgd.h - the SGD update of one parameter tensor, exposed for the plugin's
 * test (not installed). */
#ifndef PL_SGD_H
#define PL_SGD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pl_sgd_hyper {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first; /* true: the momentum buffer is initialised to the gradient */
} pl_sgd_hyper;

/* One fused pass over n elements (OpenMP when n is large): p f32 [n] updated
 * in place, g f32 [n] gradient (not modified), buf f32 [n] momentum buffer
 * (NULL when momentum == 0). */
void pl_sgd_update(float *p, const float *g, float *buf, int64_t n, const pl_sgd_hyper *h);

#endif
