/* backend_util.c - the exported part of backend_util.h: the RoPE cos/sin
 * table every backend uses (the formulas and their source: kernel_math.h). */
#include <math.h>

#include "pipeline/backend_util.h"

void pl_rope_cos_sin(float *tab, int64_t T, int64_t half, int64_t pos_offset, double theta) {
    for (int64_t i = 0; i < half; i++) {
        float inv = pl_rope_inv_freq(theta, i, half);
        for (int64_t t = 0; t < T; t++) {
            float ang = pl_rope_angle(pos_offset + t, inv);
            tab[(t * half + i) * 2] = (float)cos((double)ang);
            tab[(t * half + i) * 2 + 1] = (float)sin((double)ang);
        }
    }
}
