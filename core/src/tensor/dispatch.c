/* dispatch.c - what every op does at entry and to run its kernel: the
 * dtype / rank / device gates and the broadcast of two shapes (each error
 * names the op and the tensor), a contiguous operand, and the call of a
 * forward kernel through the backend registry (half widening, half_io.c;
 * PL_PROFILE_OPS timing, op_profile.c). Tensor + ops layer (internal.h). */
#include "internal.h"
#include "op_table.h"

/* ---- entry checks --------------------------------------------------------------- */

pl_status pl_check_float(const char *op, const pl_tensor *t, bool allow_half) {
    char buf[256];
    if (t->dtype == PL_F32 || (allow_half && (t->dtype == PL_BF16 || t->dtype == PL_F16)))
        return PL_OK;
    return pl_error_set(PL_ERR_DTYPE, "%s: tensor %s has dtype %s; expected f32%s", op,
                        pl_tensor_describe(t, buf, sizeof buf), pl_dtype_name(t->dtype),
                        allow_half ? ", bf16 or f16" : "");
}

pl_status pl_check_index(const char *op, const pl_tensor *t) {
    char buf[256];
    if (t->dtype == PL_I64 || t->dtype == PL_I32) return PL_OK;
    return pl_error_set(PL_ERR_DTYPE, "%s: index tensor %s must be i32 or i64", op,
                        pl_tensor_describe(t, buf, sizeof buf));
}

pl_status pl_check_same_device(const char *op, pl_tensor *const *ts, int n) {
    char b1[256], b2[256];
    const pl_tensor *first = NULL;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (!first) {
            first = ts[i];
            continue;
        }
        if (!pl_device_eq(first->device, ts[i]->device))
            return pl_error_set(PL_ERR_DEVICE, "%s: inputs on different devices: %s and %s", op,
                                pl_tensor_describe(first, b1, sizeof b1),
                                pl_tensor_describe(ts[i], b2, sizeof b2));
    }
    return PL_OK;
}

pl_status pl_check_ndim(const char *op, const pl_tensor *t, int lo, int hi) {
    char buf[256];
    if (t->ndim >= lo && t->ndim <= hi) return PL_OK;
    return pl_error_set(PL_ERR_SHAPE, "%s: tensor %s has rank %d, expected %d..%d", op,
                        pl_tensor_describe(t, buf, sizeof buf), t->ndim, lo, hi);
}

bool pl_any_requires_grad(pl_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        if (ts[i] && ts[i]->requires_grad) return true;
    return false;
}

pl_status pl_broadcast_shapes(const char *op, const pl_tensor *a, const pl_tensor *b, int *ndim,
                              int64_t *shape) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < nd; i++) {
        int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char b1[256], b2[256];
            return pl_error_set(PL_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                                op, pl_tensor_describe(a, b1, sizeof b1),
                                pl_tensor_describe(b, b2, sizeof b2), i, (long long)sa,
                                (long long)sb);
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    *ndim = nd;
    return PL_OK;
}

/* ---- kernels --------------------------------------------------------------------- */

pl_status pl_kernel_forward(pl_kernel_args *a) {
    pl_status ac = pl_op_check_call(a->op, a->n_in, a->n_out); /* its ops.def row */
    if (ac) return ac;
    const pl_tensor *ref = a->n_in > 0 && a->in[0] ? a->in[0] : a->out[0];
    const pl_backend *b = pl_backend_get(ref->device.type);
    if (!b) return pl_error_status();
    pl_kernel_fn fn = pl_backend_kernel(b, a->op, false);
    if (!fn)
        return pl_error_set(PL_ERR_UNSUPPORTED, "op '%s' has no forward kernel on backend '%s'",
                            pl_op_name(a->op), b->name);
    bool half = pl_half_io_needed(b, a, false); /* half_io.c */
    if (!pl_op_profile_on()) return half ? pl_half_io_call(b, fn, a) : fn(a);
    double t0 = pl_op_profile_begin(ref->device);
    pl_status st = half ? pl_half_io_call(b, fn, a) : fn(a);
    pl_op_profile_end(a->op, false, ref, ref->device, t0);
    return st;
}
