/* autograd.h - tape-based reverse-mode autodiff, grad mode and frames.
 *
 * While grad mode is on (the default), every op whose inputs include a
 * tensor with requires_grad appends a node to the thread's tape. pl_backward
 * walks the tape in reverse, computes each node's input gradients with the
 * op's backward kernel and ACCUMULATES (+=) them into the .grad of leaf
 * tensors (parameters), so several backward calls before an optimizer step
 * implement gradient accumulation. After backward the tape is cleared and
 * the saved activations it held are released.
 *
 * An op that has no backward kernel refuses to be recorded (PL_ERR_UNSUPPORTED
 * naming the op) when one of its inputs requires grad: the failure happens at
 * graph-build time, not deep inside backward.
 *
 * Frames: model code calls ops without releasing their results. A frame
 * (pl_frame_begin/pl_frame_end) owns every tensor created on this thread
 * while it is the innermost open frame and releases them when it ends
 * (the tape keeps what backward needs alive on its own). Use
 * pl_frame_keep(t) to take a reference that outlives the frame.
 */
#ifndef PIPELINE_AUTOGRAD_H
#define PIPELINE_AUTOGRAD_H

#include "pipeline/backend.h"
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- grad mode ------------------------------------------------------ */

bool pl_grad_enabled(void);
/* Enter / leave a no-grad scope (nestable); nothing is recorded inside. */
void pl_no_grad_begin(void);
void pl_no_grad_end(void);

/* Mark a leaf tensor as a trainable parameter (allocates nothing yet; .grad
 * is created on first accumulation, zero-filled, same dtype f32). */
void pl_tensor_set_requires_grad(pl_tensor *t, bool on);
/* Zero (not free) the .grad of a leaf, if any. */
void pl_tensor_zero_grad(pl_tensor *t);

/* ---- backward ------------------------------------------------------- */

/* d(loss)/d(leaf) accumulated into every leaf's .grad. `loss` must be a
 * 1-element floating tensor produced with grad mode on; `grad_scale` seeds
 * the gradient (1.0 normally; the loss scale for fp16, 1/k for accumulation).
 * Clears the tape. Errors: PL_ERR_INVALID if loss has no grad_fn. */
pl_status pl_backward(pl_tensor *loss, double grad_scale);
/* Drop everything recorded (e.g. after an evaluation forward with grad on). */
void pl_tape_clear(void);
/* Number of nodes on the tape (tests). */
int64_t pl_tape_size(void);

/* ---- frames --------------------------------------------------------- */

void pl_frame_begin(void);
void pl_frame_end(void);
/* Retain `t` so it survives the current frame; caller releases it later. */
pl_tensor *pl_frame_keep(pl_tensor *t);
/* End the innermost frame but hand `t` (created inside it) to the enclosing
 * frame, which then owns it; returns t (NULL-propagating). A model that wraps
 * each layer in a frame frees the layer's temporaries as soon as the layer is
 * done: in evaluation the peak is one layer's activations instead of the
 * whole forward's (the tape keeps what backward needs in training). */
pl_tensor *pl_frame_end_keep(pl_tensor *t);

/* ---- recording (used by ops and by custom ops of plugins) ------------ */

/* Record `out = op(inputs)` with saved tensors for backward. Retains inputs,
 * saved and out. No-op (returns PL_OK) when grad mode is off or no input
 * requires grad. Fails if the current backend has no backward for `op`. */
pl_status pl_autograd_record(pl_op op, const pl_op_params *p, pl_tensor *const *inputs,
                             int n_in, pl_tensor *const *saved, int n_saved, pl_tensor *out);

/* ---- custom ops registered by plugins -------------------------------- */

typedef struct pl_custom_op {
    const char *name;
    /* Same convention as pl_kernel_args (backend.h). Shapes of outputs are
     * set by `infer` before forward is called. */
    pl_status (*infer)(const pl_kernel_args *a, int *n_out, pl_dtype *dtypes, int *ndims,
                       int64_t (*shapes)[PL_MAX_DIMS]);
    pl_kernel_fn forward[2];  /* indexed by pl_device_type: [CPU], [CUDA] */
    pl_kernel_fn backward[2]; /* NULL: op is not differentiable */
    int n_saved_outputs;      /* outputs 1..n kept for backward */
} pl_custom_op;

/* Register a custom op; returns its id (>= PL_OP_CUSTOM_BASE) or -1. The
 * descriptor is borrowed and must outlive its use. */
int pl_custom_op_register(const pl_custom_op *op);
/* Apply a custom op; returns output 0 (others via `extra_outputs`, may be
 * NULL). Recorded on the tape like any built-in op. */
pl_tensor *pl_custom_op_apply(int id, pl_tensor *const *inputs, int n_in,
                              const pl_op_params *p, pl_tensor **extra_outputs);

#ifdef __cplusplus
}
#endif
#endif
