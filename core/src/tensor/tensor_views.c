/* tensor_views.c - views of a tensor (rows, narrow, reshape, as_strided):
 * headers over the same storage, handed to the open frame (frame.c). */
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

/* ---- views ---------------------------------------------------------------- */

static pl_status check_view_bounds(const pl_tensor *v) {
    /* every reachable element must lie inside the storage */
    int64_t lo = v->offset, hi = v->offset;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return PL_OK;
        int64_t span = (v->shape[i] - 1) * v->stride[i];
        if (span < 0) lo += span; else hi += span;
    }
    int64_t cap = v->dtype == PL_NF4 ? (int64_t)v->storage->nbytes * 2
                                      : (int64_t)(v->storage->nbytes / pl_dtype_size(v->dtype));
    if (lo < 0 || hi >= cap)
        return pl_error_set(PL_ERR_SHAPE, "view [%lld, %lld] outside storage of %lld elements",
                            (long long)lo, (long long)hi, (long long)cap);
    return PL_OK;
}

pl_tensor *pl_tensor_view_rows(pl_tensor *t, int64_t start, int64_t len) {
    if (!t) return NULL;
    return pl_tensor_narrow(t, 0, start, len);
}

pl_tensor *pl_tensor_narrow(pl_tensor *t, int dim, int64_t start, int64_t len) {
    if (!t) return NULL;
    int d = pl_tensor_dim(t, dim);
    if (d < 0 || start < 0 || len < 0 || start + len > t->shape[d]) {
        char buf[256];
        pl_error_set(PL_ERR_SHAPE, "narrow(dim %d, start %lld, len %lld) out of range for %s", dim,
                     (long long)start, (long long)len, pl_tensor_describe(t, buf, sizeof buf));
        return NULL;
    }
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->offset += start * t->stride[d];
    v->shape[d] = len;
    return pl_op_result(v);
}

static pl_status infer_reshape(const pl_tensor *t, int ndim, const int64_t *shape, int64_t *out) {
    int64_t numel = pl_tensor_numel(t), known = 1;
    int infer = -1;
    if (ndim < 0 || ndim > PL_MAX_DIMS) return pl_error_set(PL_ERR_SHAPE, "reshape: bad rank %d", ndim);
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return pl_error_set(PL_ERR_SHAPE, "reshape: more than one -1");
            infer = i;
        } else
            known *= shape[i];
    }
    if (infer >= 0) out[infer] = known ? numel / known : 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= out[i];
    if (n != numel) {
        char buf[256];
        return pl_error_set(PL_ERR_SHAPE, "reshape: %lld elements cannot become %lld (%s)",
                            (long long)numel, (long long)n, pl_tensor_describe(t, buf, sizeof buf));
    }
    return PL_OK;
}

pl_tensor *pl_tensor_reshape(pl_tensor *t, int ndim, const int64_t *shape) {
    if (!t) return NULL;
    if (!pl_tensor_is_contiguous(t)) {
        pl_error_set(PL_ERR_SHAPE, "reshape of a non-contiguous view; call pl_contiguous first");
        return NULL;
    }
    int64_t sh[PL_MAX_DIMS];
    if (infer_reshape(t, ndim, shape, sh)) return NULL;
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->ndim = ndim;
    memcpy(v->shape, sh, sizeof(int64_t) * (size_t)ndim);
    pl_tensor_set_contiguous_strides(v);
    return pl_op_result(v);
}

pl_tensor *pl_tensor_as_strided(pl_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *stride, int64_t offset) {
    if (!t) return NULL;
    if (pl_tensor_check_shape(ndim, shape)) return NULL;
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->ndim = ndim;
    memcpy(v->shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(v->stride, stride, sizeof(int64_t) * (size_t)ndim);
    v->offset = offset;
    if (check_view_bounds(v)) {
        pl_tensor_release(v);
        return NULL;
    }
    return pl_op_result(v);
}
