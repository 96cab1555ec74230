/* tape_internal.h - the tape's node and what the autograd layer (autograd.c:
 * backward, activation checkpointing, custom ops) reads of the recording side
 * (tape.c, in the tensor + ops layer). Core only, not installed.
 *
 * The split (issue 33, docs/architecture.md "Layers"): ops record nodes as
 * they run (tape.c, below the ops' callers), backward walks the nodes and
 * calls ops and kernels (autograd.c, above the ops); nothing in tape.c calls
 * autograd.c. */
#ifndef PL_TAPE_INTERNAL_H
#define PL_TAPE_INTERNAL_H

#include "internal.h"

#define PL_TAPE_MAX_SAVED 8

typedef struct pl_node {
    int op; /* pl_op or custom id */
    pl_op_params p;
    int n_in, n_saved;
    pl_tensor *in[PL_MAX_OP_INPUTS];
    pl_tensor *saved[PL_TAPE_MAX_SAVED];
    pl_tensor *out;      /* weak (cleared when out's header dies) */
    /* a checkpoint node: a stub of its output (shape, dtype; no data), for
     * the recompute check. It held the output itself until 2026-11-27, which
     * kept a checkpointed branch's output alive for nothing (issue 31) */
    pl_tensor *out_meta;
    pl_device dev;       /* out's device: the backend whose backward runs */
    pl_tensor *grad_out; /* accumulated d(loss)/d(out), f32 */
    const pl_custom_op *custom;
    pl_checkpoint_fn ckpt_fn; /* checkpoint node: backward recomputes fn(ckpt_ctx, in) */
    void *ckpt_ctx;           /* borrowed */
    /* in[j] is a stub of a frozen parameter's autocast copy: backward casts
     * recast[j] (retained) again instead of the tape keeping that copy */
    pl_tensor *recast[PL_MAX_OP_INPUTS];
} pl_node;

/* Node i (0 <= i < pl_tape_size()) of this thread's tape, oldest first. */
pl_node *pl_tape_at(int64_t i);
/* Append a node out = op(inputs) (op: a pl_op, a custom id with `custom`, or
 * PL_OP_NONE without `custom` for a checkpoint node, which holds out); keeps
 * of the inputs what backward reads (the rest as stubs) and the saved
 * tensors. NULL with the error set (out of memory). */
pl_node *pl_tape_push(int op, const pl_custom_op *custom, const pl_op_params *p,
                      pl_tensor *const *inputs, int n_in, pl_tensor *const *saved, int n_saved,
                      pl_tensor *out);
/* Record a custom op's node (pl_autograd_record's checks, then pl_tape_push). */
pl_status pl_tape_record_custom(int id, const pl_custom_op *custom, const pl_op_params *p,
                                pl_tensor *const *inputs, int n_in, pl_tensor *const *saved,
                                int n_saved, pl_tensor *out);
/* After n's backward has run and handed its gradients on: release what it
 * kept for backward (activations become stubs; parameters and n's own links
 * stay), as PyTorch frees a node's saved tensors once its backward ran
 * (retain_graph=False). A tensor other nodes still keep stays alive. */
void pl_tape_node_drop_saved(pl_node *n);
/* Free the nodes tape[mark..] (newest first) and what they hold. */
void pl_tape_truncate(int64_t mark);
/* The backward kernel of op on device type dev (custom: its own), or NULL. */
pl_kernel_fn pl_tape_backward_fn(int op, const pl_custom_op *custom, pl_device_type dev);
/* The name of the backend serving dev, for messages. */
const char *pl_tape_backend_name(pl_device_type dev);

/* Grad mode depth (pl_no_grad_begin nesting): read and set, for a
 * checkpoint's backward, which recomputes with grad on. */
int pl_no_grad_depth(void);
void pl_no_grad_set_depth(int depth);
/* Set when an op under no-grad had an input requiring grad (pl_checkpoint's
 * forward learns from it whether fn's result would have been recorded):
 * returns the flag and sets it to v. */
bool pl_no_grad_saw_grad_swap(bool v);

#endif
