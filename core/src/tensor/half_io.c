/* half_io.c - half (bf16 / f16) tensors through f32-only kernels, inside
 * the dispatch (issue 31 item 2).
 *
 * The elementwise, reduction, loss and normalization kernels of a backend
 * compute in f32. Until 2026-11-27 the ops in ops_dense.c cast a half input
 * to f32 and the result back, both casts recorded on the tape: a bf16
 * rms_norm kept its input twice (bf16 and f32) and its f32 result beside the
 * bf16 one, and every op cost two recorded casts. Now such an op is recorded
 * once, with its half tensors, and the dispatch gives the kernel what it
 * reads: each half input widened into a transient f32 copy, each half output
 * computed in an f32 temporary and rounded into it (round to nearest even).
 * The temporaries live for the kernel call only, so the tape keeps the half
 * tensors (half the bytes) and the launches shrink to widen, op, round.
 *
 * Forward results are bit-identical to the old recorded casts: widening is
 * exact, the f32 kernel is the same, the output is rounded once. So are the
 * gradients, except for the ops whose backward reads their own output
 * (sigmoid, tanh, exp, relu, elu, sqrt, softmax, log_softmax): that output is now the rounded half
 * value, as in PyTorch, where a bf16 sigmoid saves its bf16 result.
 *
 * Kernels that read half directly are called as they are: whatever a
 * backend's half_native verb claims (backend.h, ABI 2.8): the CPU's
 * same-shape bf16 add / sub, bf16 scale / add_scalar and bf16 cross-entropy
 * (cpu_backend.c), the CUDA backend's elementwise, rms_norm and swiglu.
 */
#include <string.h>

#include "internal.h"

/* The ops whose kernels compute on f32 data only: ops_dense.c's dense math,
 * and topk (its half values are exact: the widened inputs rounded back). */
static bool f32_kernel_op(pl_op op) {
    switch (op) {
    case PL_OP_ADD:
    case PL_OP_SUB:
    case PL_OP_MUL:
    case PL_OP_DIV:
    case PL_OP_SCALE:
    case PL_OP_ADD_SCALAR:
    case PL_OP_CLAMP:
    case PL_OP_RELU:
    case PL_OP_LEAKY_RELU:
    case PL_OP_ELU:
    case PL_OP_GELU:
    case PL_OP_SILU:
    case PL_OP_SIGMOID:
    case PL_OP_TANH:
    case PL_OP_EXP:
    case PL_OP_LOG:
    case PL_OP_SQUARE:
    case PL_OP_SQRT:
    case PL_OP_SOFTMAX:
    case PL_OP_LOG_SOFTMAX:
    case PL_OP_SWIGLU:
    case PL_OP_SUM:
    case PL_OP_MEAN:
    case PL_OP_CROSS_ENTROPY:
    case PL_OP_MSE:
    case PL_OP_MAE:
    case PL_OP_HUBER:
    case PL_OP_LAYER_NORM:
    case PL_OP_TOPK:
    case PL_OP_RMS_NORM: return true;
    default: return false;
    }
}

static bool is_half(const pl_tensor *t) {
    return t && (t->dtype == PL_BF16 || t->dtype == PL_F16);
}

bool pl_half_io_needed(const pl_backend *b, const pl_kernel_args *a, bool backward) {
    if (!f32_kernel_op(a->op)) return false;
    bool any = false;
    for (int i = 0; i < a->n_in && !any; i++) any = is_half(a->in[i]);
    for (int i = 0; i < a->n_out && !any; i++) any = is_half(a->out[i]);
    return any &&
           !(b && PL_BACKEND_HAS(b, half_native) && b->half_native && b->half_native(a, backward));
}

/* backend b's cast of src into dst (same shape, contiguous) */
static pl_status cast_into(const pl_backend *b, pl_tensor *src, pl_tensor *dst) {
    pl_kernel_fn cast = pl_backend_kernel(b, PL_OP_CAST, false);
    if (!cast)
        return pl_error_set(PL_ERR_UNSUPPORTED, "backend '%s' has no cast kernel", b->name);
    pl_kernel_args k = {.op = PL_OP_CAST, .n_in = 1, .n_out = 1};
    k.p.dtype = dst->dtype;
    k.in[0] = src;
    k.out[0] = dst;
    return cast(&k);
}

/* A stub (no data) stays a stub, seen as f32: the kernel reads its shape only. */
static pl_tensor *widened(const pl_backend *b, pl_tensor *x, pl_status *st) {
    pl_tensor *w;
    if (pl_tensor_is_stub(x)) {
        w = pl_tensor_stub_owned(x);
        if (w) w->dtype = PL_F32;
    } else {
        w = pl_tensor_new_owned(PL_F32, x->ndim, x->shape, x->device);
        if (w && (*st = cast_into(b, x, w))) {
            pl_tensor_release(w);
            return NULL;
        }
    }
    if (!w && !*st) *st = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
    return w;
}

pl_status pl_half_io_call(const pl_backend *b, pl_kernel_fn fn, const pl_kernel_args *a) {
    pl_kernel_args k = *a;
    pl_tensor *tin[PL_MAX_OP_INPUTS] = {0}, *tout[PL_MAX_OP_OUTPUTS] = {0};
    pl_status st = PL_OK;
    for (int i = 0; i < a->n_in && !st; i++)
        if (is_half(a->in[i]) && (tin[i] = widened(b, a->in[i], &st))) k.in[i] = tin[i];
    for (int i = 0; i < a->n_out && !st; i++) {
        if (!is_half(a->out[i])) continue;
        const pl_tensor *o = a->out[i];
        tout[i] = pl_tensor_new_owned(PL_F32, o->ndim, o->shape, o->device);
        if (!tout[i]) st = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        else k.out[i] = tout[i];
    }
    if (!st) st = fn(&k);
    for (int i = 0; i < a->n_out && !st; i++)
        if (tout[i]) st = cast_into(b, tout[i], a->out[i]);
    for (int i = 0; i < a->n_in; i++) pl_tensor_release(tin[i]);
    for (int i = 0; i < a->n_out; i++) pl_tensor_release(tout[i]);
    return st;
}
