/* kernels_dense_common.h - what the CPU's dense kernel files share
 * (kernels_dense.c: elementwise, reductions, activations, cast;
 * kernels_norm.c: softmax, losses, normalization; kernels_matmul.c: matmul):
 * f32 views of a tensor's data, conversions to and from f32 and scratch from
 * the caching allocator. Kernel conventions: kernels_dense.c. */
#ifndef PL_CPU_KERNELS_DENSE_COMMON_H
#define PL_CPU_KERNELS_DENSE_COMMON_H

#include <string.h>

#include "cpu_internal.h" /* and pipeline/backend_util.h: matmul and broadcast geometry,
                        * pipeline/kernel_math.h: the per-element math */

#define PAR_MIN 32768 /* elements below which loops stay serial */

/* ---- small helpers ----------------------------------------------------- */

static inline const float *cf32(const pl_tensor *t) {
    return (const float *)pl_tensor_data(t);
}
static inline float *f32p(const pl_tensor *t) {
    return (float *)pl_tensor_data(t);
}

/* Convert n elements of a float tensor's data (f32/bf16/f16/f64) to f32. */
static inline pl_status to_f32(const pl_tensor *t, float *dst, int64_t n) {
    const void *src = pl_tensor_data(t);
    switch (t->dtype) {
    case PL_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return PL_OK;
    case PL_BF16: {
        const uint16_t *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = pl_bf16_widen(s[i]);
        return PL_OK;
    }
    case PL_F16: {
        const uint16_t *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = pl_f16_widen(s[i]);
        return PL_OK;
    }
    case PL_F64: {
        const double *s = src;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)s[i];
        return PL_OK;
    }
    default:
        return pl_error_set(PL_ERR_DTYPE, "cpu dense kernel: cannot read %s as f32",
                            pl_dtype_name(t->dtype));
    }
}

/* Store n f32 values into a float tensor's data in its dtype. */
static inline pl_status from_f32(const float *src, pl_tensor *t, int64_t n) {
    void *dst = pl_tensor_data(t);
    switch (t->dtype) {
    case PL_F32:
        if (dst != (const void *)src) memcpy(dst, src, (size_t)n * sizeof(float));
        return PL_OK;
    case PL_BF16: {
        uint16_t *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = pl_bf16_round(src[i]);
        return PL_OK;
    }
    case PL_F16: {
        uint16_t *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = pl_f16_round(src[i]);
        return PL_OK;
    }
    case PL_F64: {
        double *d = dst;
#pragma omp parallel for if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            d[i] = src[i];
        return PL_OK;
    }
    default:
        return pl_error_set(PL_ERR_DTYPE, "cpu dense kernel: cannot write f32 as %s",
                            pl_dtype_name(t->dtype));
    }
}

/* Scratch from the caching allocator (no system malloc in steady state). */
typedef struct scratch {
    void *p;
    size_t cap;
} scratch;

static inline float *scratch_f32(scratch *s, int64_t n) {
    s->p = pl_alloc(PL_CPU, (size_t)(n > 0 ? n : 1) * sizeof(float), &s->cap);
    return s->p;
}

static inline void scratch_free(scratch *s) {
    if (s->p) pl_free(PL_CPU, s->p, s->cap);
    s->p = NULL;
}

/* f32 view of a tensor: its own data when f32, else a converted scratch copy. */
static inline const float *as_f32(const pl_tensor *t, scratch *s, pl_status *st) {
    if (t->dtype == PL_F32) return cf32(t);
    int64_t n = pl_tensor_numel(t);
    float *p = scratch_f32(s, n);
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    *st = to_f32(t, p, n);
    return p;
}


/* The softmax, loss and normalization kernels (kernels_norm.c) and matmul
 * (kernels_matmul.c) into the CPU's table; pl_cpu_register_dense calls them. */
__attribute__((visibility("hidden"))) void pl_cpu_register_dense_norm(pl_kernel_table *b);
__attribute__((visibility("hidden"))) void pl_cpu_register_dense_matmul(pl_kernel_table *b);

#endif
