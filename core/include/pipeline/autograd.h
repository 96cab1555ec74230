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

/* ---- what the tape keeps --------------------------------------------- */

/* Which inputs' DATA the backward of built-in op `op` (a pl_op) reads, as a
 * bit mask (bit j = input j), given which of its `n_in` inputs require a
 * gradient (`grad_mask`, bit j = input j). The tape keeps those inputs; the
 * others become stubs (pl_tensor_is_stub: shape and autograd links, no
 * data), so the activation is freed once the forward lets go of it. A
 * parameter (a leaf requiring grad) is always kept, as is every input of a
 * custom op and of a checkpoint node, and every extra output an op saves
 * (statistics, masks). A node does not hold its own output.
 * Examples: matmul(x, W) with W frozen and x requiring grad -> 0b10 (W, for
 * dx; nothing of x); with W trainable -> 0b11; add -> 0; silu -> 0b1;
 * relu -> 0 (it saves its output instead: pl_autograd_saves_output).
 * The rule per op is the `reads` column of pipeline/ops.def (after PyTorch's
 * tools/autograd/derivatives.yaml; the table in docs/ops.md, the bytes it
 * implies in docs/autograd-memory.md). Unknown ops and ops without a
 * backward: every input. */
unsigned pl_autograd_needed_inputs(int op, int n_in, unsigned grad_mask);
/* Whether built-in op `op` (a pl_op) saves its own output for backward, as
 * derivatives.yaml's formulas in `result` do (ops.def's saves_out): relu,
 * sigmoid, tanh, exp, softmax, log_softmax, causal_softmax and
 * segment_softmax. Their backward kernels read the
 * output as the first saved tensor, in[1 + n_in], and never the input, which
 * the tape keeps as a stub: in a chain where the next op keeps the output
 * too (relu -> matmul with a trainable weight), one tensor is kept, not two. */
bool pl_autograd_saves_output(int op);
/* Bytes the tape holds now: the distinct storages its nodes keep (inputs
 * kept whole, saved tensors), each once, attributed to
 * the op (pl_op; PL_OP_NONE = checkpoint nodes) of the oldest node keeping it
 * in per_op[0..n_ops) (may be NULL); leaves that require grad or have a
 * name (parameters, frozen weights, alive without the tape) are not counted. Block sizes as the
 * allocator hands them out. With PL_TAPE_REPORT=1 in the environment,
 * pl_backward prints this per op to stderr before each backward. */
pl_status pl_tape_held_bytes(size_t *per_op, int n_ops, size_t *total);

/* ---- activation (gradient) checkpointing ------------------------------ */

/* fn computes outputs from inputs (borrowed); returns one new tensor (owned by
 * the current frame, like any op result) or NULL with the error set. */
typedef pl_tensor *(*pl_checkpoint_fn)(void *ctx, pl_tensor *const *inputs, int n_in);

/* y = fn(ctx, inputs), keeping none of fn's activations for backward: they
 * are recomputed during backward. Trades one extra forward of fn for the
 * memory of its intermediate tensors (checkpointing every sqrt(n)-th of n
 * layers gives O(sqrt n) activation memory). Math and semantics: Chen et al.
 * 2016, "Training Deep Nets with Sublinear Memory Cost"; PyTorch's
 * torch.utils.checkpoint.checkpoint(use_reentrant=False).
 *
 * inputs: n_in (0..PL_MAX_OP_INPUTS) tensors of any shape/dtype fn accepts,
 * borrowed (the tape retains them, as any op's inputs). A NULL input returns
 * NULL (error left as set by the op that failed), like every op. Returns fn's
 * result (with grad mode on, a new header sharing the storage of fn's output:
 * same shape, strides and dtype), owned by the current frame, or by the
 * caller when no frame is open.
 *
 *   - Grad mode off: returns fn(ctx, inputs, n_in), nothing else.
 *   - Grad mode on: fn runs under no-grad inside its own frame (its
 *     temporaries are freed when it returns). If some op inside fn read a
 *     tensor requiring grad (an input or a parameter), ONE tape node is
 *     recorded: inputs -> y. Otherwise nothing is recorded.
 *   - Backward of that node: detached aliases of the inputs (sharing storage;
 *     requires_grad as the input's) are passed to fn again with grad mode on,
 *     recording onto the tape past its current end; the node's output
 *     gradient is back-propagated through that segment: parameters used in
 *     fn ACCUMULATE into .grad exactly as without checkpointing (grad_scale
 *     and several backward calls included), and the aliases' gradients are
 *     this node's input gradients, passed on through the outer tape. The
 *     segment and the recomputed activations are freed before the walk
 *     continues. A checkpointed fn may itself call pl_checkpoint (nested
 *     recomputation).
 *   - pl_tape_clear (or an error in backward) frees the node; ctx is never
 *     freed by the core.
 *
 * Contract on fn and ctx (borrowed): ctx must stay valid until the node is
 * consumed by pl_backward or pl_tape_clear, and fn must be deterministic
 * given ctx and the inputs: the same ops, shapes and values when recomputed.
 * Dropout is (counter-based Philox, pl_dropout): pass the seed and counter
 * fixed in ctx; do not advance a counter inside fn. Parameters (leaves) may be
 * read through ctx. A non-leaf tensor requiring grad should be passed in
 * `inputs`; one read through ctx gets its gradient too (its producing node
 * precedes this one on the tape, so the reverse walk reaches it later), but
 * it then must be the same tensor at recomputation.
 *
 * Errors (NULL returned, thread error set): PL_ERR_INVALID when fn is NULL,
 * n_in is outside 0..PL_MAX_OP_INPUTS, or fn returns NULL without setting an
 * error; whatever fn sets. In backward, pl_backward returns fn's error or
 * PL_ERR_INVALID when the recomputed output's shape or dtype differs from
 * the forward's, prefixed "backward of checkpoint". */
pl_tensor *pl_checkpoint(pl_checkpoint_fn fn, void *ctx, pl_tensor *const *inputs, int n_in);

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
