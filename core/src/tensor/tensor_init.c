/* tensor_init.c - tensors made with contents, on any device: zeros, full,
 * from host data or external memory, copies and conversions (pl_tensor_copy_,
 * pl_tensor_to, item), fills and random init. They run kernels (dispatch.c)
 * and hand their results to the open frame (frame.c), so they sit above
 * both; tensor.c below them makes the headers and storage. */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

pl_tensor *pl_tensor_new_owned_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (t && pl_tensor_fill_(t, 0.0)) {
        pl_tensor_release(t);
        return NULL;
    }
    return t;
}

pl_tensor *pl_tensor_empty_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_tensor_new_owned(dt, ndim, shape, dev);
}
pl_tensor *pl_tensor_zeros_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_tensor_new_owned_zeros(dt, ndim, shape, dev);
}

pl_tensor *pl_tensor_empty(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_op_result(pl_tensor_new_owned(dt, ndim, shape, dev));
}
pl_tensor *pl_tensor_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_op_result(pl_tensor_new_owned_zeros(dt, ndim, shape, dev));
}
pl_tensor *pl_tensor_full(pl_dtype dt, int ndim, const int64_t *shape, double value,
                          pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (t && pl_tensor_fill_(t, value)) {
        pl_tensor_release(t);
        return NULL;
    }
    return pl_op_result(t);
}
pl_tensor *pl_tensor_empty_like(const pl_tensor *like) {
    if (!like) return NULL;
    return pl_tensor_empty(like->dtype, like->ndim, like->shape, like->device);
}
pl_tensor *pl_tensor_zeros_like(const pl_tensor *like) {
    if (!like) return NULL;
    return pl_tensor_zeros(like->dtype, like->ndim, like->shape, like->device);
}
pl_tensor *pl_tensor_scalar(float v, pl_device dev) {
    return pl_tensor_full(PL_F32, 0, NULL, v, dev);
}

pl_tensor *pl_tensor_from_data(pl_dtype dt, int ndim, const int64_t *shape, const void *data,
                               pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (!t) return NULL;
    size_t nb = pl_tensor_nbytes(t);
    if (dev.type == PL_DEVICE_CPU) {
        if (nb) memcpy(t->storage->data, data, nb);
    } else {
        const pl_backend *b = pl_backend_get(dev.type);
        if (!b || b->memcpy(t->storage->data, dev, data, PL_CPU, nb)) {
            pl_tensor_release(t);
            return NULL;
        }
    }
    return pl_op_result(t);
}

pl_tensor *pl_tensor_from_external(pl_dtype dt, int ndim, const int64_t *shape, void *data,
                                   void (*free_fn)(void *, void *), void *ctx) {
    return pl_op_result(pl_tensor_from_external_owned(dt, ndim, shape, data, free_fn, ctx));
}

double pl_tensor_item(const pl_tensor *t) {
    if (!t || pl_tensor_numel(t) != 1) {
        pl_error_set(PL_ERR_SHAPE, "item() needs a 1-element tensor");
        return NAN;
    }
    if (t->device.type == PL_DEVICE_CPU) return pl_tensor_get(t, 0);
    /* owned, not adopted by the open frame (pl_tensor_to's result would be) */
    pl_tensor *h = pl_tensor_new_owned(PL_F64, t->ndim, t->shape, PL_CPU);
    double v = h && !pl_tensor_copy_(h, t) ? ((double *)pl_tensor_data(h))[0] : NAN;
    pl_tensor_release(h);
    return v;
}

/* ---- copy / convert ----------------------------------------------------- */

pl_status pl_tensor_copy_(pl_tensor *dst, const pl_tensor *src) {
    char b1[256], b2[256];
    if (!dst || !src) return pl_error_set(PL_ERR_INVALID, "copy: NULL tensor");
    if (pl_tensor_numel(dst) != pl_tensor_numel(src))
        return pl_error_set(PL_ERR_SHAPE, "copy: %s <- %s: element counts differ",
                            pl_tensor_describe(dst, b1, sizeof b1),
                            pl_tensor_describe(src, b2, sizeof b2));
    if (dst->dtype == PL_NF4 || src->dtype == PL_NF4) {
        if (dst->dtype != src->dtype)
            return pl_error_set(PL_ERR_DTYPE, "copy: cannot convert %s <- %s (nf4 converts only via "
                                "the NF4 quantizer, pl_nf4_quantize)", pl_tensor_describe(dst, b1, sizeof b1),
                                pl_tensor_describe(src, b2, sizeof b2));
    }
    bool same_dev = pl_device_eq(dst->device, src->device);
    if (same_dev && dst->device.type == PL_DEVICE_CPU && pl_tensor_is_contiguous(dst)) {
        /* the CPU backend's copy kernel (any source strides and dtype) */
        pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {(pl_tensor *)src}, .n_out = 1,
                            .out = {dst}};
        return pl_kernel_forward(&k);
    }
    if (same_dev && dst->device.type == PL_DEVICE_CPU) {
        int64_t n = pl_tensor_numel(dst);
        for (int64_t i = 0; i < n; i++)
            pl_elem_store(dst->storage->data, dst->dtype, pl_strided_offset(dst, i),
                       pl_elem_load(src->storage->data, src->dtype, pl_strided_offset(src, i)));
        return PL_OK;
    }
    /* cross-device: stage through contiguous tensors of the destination dtype */
    if (!pl_tensor_is_contiguous(dst))
        return pl_error_set(PL_ERR_UNSUPPORTED, "copy: cross-device copy into a strided view");
    pl_tensor *s = (pl_tensor *)src;
    pl_tensor *tmp = NULL;
    if (!pl_tensor_is_contiguous(src) || src->dtype != dst->dtype) {
        tmp = pl_tensor_new_owned(dst->dtype, src->ndim, src->shape, src->device);
        if (!tmp) return pl_error_status();
        pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {s}, .n_out = 1, .out = {tmp}};
        pl_status st = pl_kernel_forward(&k);
        if (st) {
            pl_tensor_release(tmp);
            return st;
        }
        s = tmp;
    }
    const pl_backend *b = pl_backend_get(dst->device.type != PL_DEVICE_CPU ? dst->device.type
                                                                            : src->device.type);
    pl_status st = b ? b->memcpy(pl_tensor_data(dst), dst->device, pl_tensor_data(s), s->device,
                                 pl_tensor_nbytes(dst))
                     : pl_error_status();
    pl_tensor_release(tmp);
    return st;
}

pl_tensor *pl_tensor_to(const pl_tensor *t, pl_dtype dt, pl_device dev) {
    if (!t) return NULL;
    pl_tensor *o = pl_tensor_new_owned(dt, t->ndim, t->shape, dev);
    if (!o) return NULL;
    if (pl_tensor_copy_(o, t)) {
        pl_tensor_release(o);
        return NULL;
    }
    return pl_op_result(o);
}

pl_status pl_tensor_fill_(pl_tensor *t, double v) {
    if (!t) return pl_error_set(PL_ERR_INVALID, "fill: NULL tensor");
    if (t->dtype == PL_NF4) return pl_error_set(PL_ERR_DTYPE, "fill: nf4 tensor '%s'", t->name);
    int64_t n = pl_tensor_numel(t);
    if (t->device.type != PL_DEVICE_CPU) {
        if (v == 0.0 && pl_tensor_is_contiguous(t)) {
            const pl_backend *b = pl_backend_get(t->device.type);
            return b ? b->memset(pl_tensor_data(t), t->device, 0, pl_tensor_nbytes(t))
                     : pl_error_status();
        }
        if (pl_tensor_is_contiguous(t) && (t->dtype == PL_F32 || t->dtype == PL_BF16)) {
            /* on the device, no copy from the host (a captured graph cannot
             * contain one, graph.h, and a GPU waits for a pageable one): zero,
             * then add v in place (the same value: 0 + (float)v, rounded to
             * t's dtype as the host's store would) */
            const pl_backend *b = pl_backend_get(t->device.type);
            pl_status s = b ? b->memset(pl_tensor_data(t), t->device, 0, pl_tensor_nbytes(t))
                            : pl_error_status();
            pl_kernel_args k = {.op = PL_OP_ADD_SCALAR, .n_in = 1, .in = {t}, .n_out = 1,
                                .out = {t}, .p.alpha = v};
            return s ? s : pl_kernel_forward(&k);
        }
        pl_tensor *h = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, PL_CPU);
        if (!h) return pl_error_status();
        pl_status s = pl_tensor_fill_(h, v);
        if (!s) s = pl_tensor_copy_(t, h);
        pl_tensor_release(h);
        return s;
    }
    if (pl_tensor_is_contiguous(t)) {
        void *d = pl_tensor_data(t);
        if (v == 0.0) {
            memset(d, 0, pl_tensor_nbytes(t));
            return PL_OK;
        }
        if (t->dtype == PL_F32) {
            float *f = d, fv = (float)v;
#pragma omp parallel for if (n > 65536) schedule(static)
            for (int64_t i = 0; i < n; i++) f[i] = fv;
            return PL_OK;
        }
        for (int64_t i = 0; i < n; i++) pl_elem_store(d, t->dtype, i, v);
        return PL_OK;
    }
    for (int64_t i = 0; i < n; i++) pl_elem_store(t->storage->data, t->dtype, pl_strided_offset(t, i), v);
    return PL_OK;
}

/* ---- random init --------------------------------------------------------- */

static pl_status random_fill(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                             uint64_t stream) {
    if (!t) return pl_error_set(PL_ERR_INVALID, "random init: NULL tensor");
    if (!pl_dtype_is_float(t->dtype))
        return pl_error_set(PL_ERR_DTYPE, "random init of non-float tensor '%s'", t->name);
    int64_t n = pl_tensor_numel(t);
    if (t->device.type != PL_DEVICE_CPU && pl_tensor_is_contiguous(t) &&
        (t->dtype == PL_F32 || t->dtype == PL_BF16 || t->dtype == PL_F16)) {
        const pl_backend *be = pl_backend_get(t->device.type);
        if (be && PL_BACKEND_HAS(be, fill_random) && be->fill_random)
            return n ? be->fill_random(t, normal, a, b, seed, stream) : PL_OK; /* on the device */
        pl_error_clear(); /* pl_backend_get's miss: the host draws */
    }
    pl_tensor *h = t;
    if (t->device.type != PL_DEVICE_CPU || t->dtype != PL_F32 || !pl_tensor_is_contiguous(t)) {
        h = pl_tensor_new_owned(PL_F32, t->ndim, t->shape, PL_CPU);
        if (!h) return pl_error_status();
    }
    float *d = pl_tensor_data(h);
    int64_t nblk = (n + 3) / 4;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        float v[4];
        pl_init_draw((uint64_t)blk, seed, stream, normal, a, b, v); /* kernel_math.h */
        for (int k = 0; k < 4; k++)
            if (blk * 4 + k < n) d[blk * 4 + k] = v[k];
    }
    if (h != t) {
        pl_status s = pl_tensor_copy_(t, h);
        pl_tensor_release(h);
        return s;
    }
    return PL_OK;
}

pl_status pl_tensor_uniform_(pl_tensor *t, double lo, double hi, uint64_t seed, uint64_t stream) {
    return random_fill(t, 0, lo, hi, seed, stream);
}
pl_status pl_tensor_normal_(pl_tensor *t, double mean, double std, uint64_t seed,
                            uint64_t stream) {
    return random_fill(t, 1, mean, std, seed, stream);
}
