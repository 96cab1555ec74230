/* internal.h - helpers shared by the core's own sources (not installed).
 *
 * How an op is written (see ops_*.c):
 *
 *   pl_tensor *pl_silu(pl_tensor *a) {
 *       if (!a) return NULL;                                   // NULL-propagation
 *       if (pl_check_float("silu", a, true)) return NULL;      // dtype gate (refuses nf4)
 *       pl_tensor *x = pl_contiguous_owned(a);                 // +1 ref, copy if strided
 *       pl_tensor *out = pl_tensor_new_owned(a->dtype, x->ndim, x->shape, x->device);
 *       pl_kernel_args k = {.op = PL_OP_SILU, .n_in = 1, .in = {x}, .n_out = 1, .out = {out}};
 *       if (!out || pl_kernel_forward(&k) ||
 *           pl_autograd_record(PL_OP_SILU, &k.p, k.in, 1, NULL, 0, out)) {
 *           pl_tensor_release(x); pl_tensor_release(out); return NULL;
 *       }
 *       pl_tensor_release(x);
 *       return pl_op_result(out);                              // frame adopts it
 *   }
 *
 * Backward kernels: args.in[0] = grad of output (f32, output's shape),
 * args.in[1..1+n_in) = the op's inputs, then the saved tensors (first the
 * output itself where pl_autograd_saves_output: relu, softmax, ...);
 * args.out[i] = grad of input i (f32, input's shape, uninitialized) or NULL.
 * Gradients are always f32 whatever the dtype of the tensor.
 */
#ifndef PL_INTERNAL_H
#define PL_INTERNAL_H

#include <stdio.h>

#include "pipeline/backend_util.h"
#include "pipeline/pipeline.h"

/* New tensor owned by the caller and NOT adopted by the open frame
 * (tensor.c; the zeroed one runs a fill kernel: tensor_init.c). */
pl_tensor *pl_tensor_new_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
pl_tensor *pl_tensor_new_owned_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
/* tensor.c's helpers for tensor_init.c and tensor_views.c: t's strides set
 * contiguous; shape checked (0 <= ndim <= PL_MAX_DIMS, every size >= 0; the
 * error set otherwise). One element of any dtype: pl_elem_load /
 * pl_elem_store / pl_strided_offset (backend_util.h). */
void pl_tensor_set_contiguous_strides(pl_tensor *t);
pl_status pl_tensor_check_shape(int ndim, const int64_t *shape);
/* pl_tensor_from_external, owned by the caller, not adopted (tensor.c). */
pl_tensor *pl_tensor_from_external_owned(pl_dtype dt, int ndim, const int64_t *shape, void *data,
                                         void (*free_fn)(void *, void *), void *ctx);
/* Hand an owned tensor to the innermost open frame (if any); returns t
 * (frame.c). */
pl_tensor *pl_op_result(pl_tensor *t);
/* New tensor header sharing t's storage (view); owned by caller. */
pl_tensor *pl_tensor_view_owned(pl_tensor *t);
/* A tape stub of t (pl_tensor_is_stub): t's shape, strides, dtype, device,
 * name, requires_grad and grad_fn, no data, no quantization state. Owned by
 * the caller; NULL with PL_ERR_NOMEM set. */
pl_tensor *pl_tensor_stub_owned(const pl_tensor *t);

/* half_io.c: does kernel call a (an op whose kernels compute on f32 data,
 * with a bf16 / f16 tensor among its inputs or outputs) need its half
 * tensors widened around backend b's kernel (not when b's half_native verb
 * says its kernel reads them itself)? backward: a is a backward call (in[0]
 * the gradient). pl_half_io_call runs fn on f32 copies of a's half inputs
 * and rounds its f32 results into a's half outputs (temporaries freed
 * before it returns); errors as fn's or the cast kernel's. */
bool pl_half_io_needed(const pl_backend *b, const pl_kernel_args *a, bool backward);
pl_status pl_half_io_call(const pl_backend *b, pl_kernel_fn fn, const pl_kernel_args *a);
/* Called by pl_tensor_release for a dying header that has a grad_fn: the
 * node that produced it forgets it (tape.c). */
void pl_autograd_forget_out(pl_tensor *t);

/* The backend registered for `type`, or NULL; unlike pl_backend_get it leaves
 * the error state alone (for callers that only ask). */
const pl_backend *pl_backend_peek(pl_device_type type);
/* Whether device d's backend promises a capability, by accepting the
 * setting (key, "true") (backend.h, set_option: "optimizer_step_count",
 * "lora_add_dropout", "linear_cross_entropy"); the CPU's always does.
 * Leaves no error set. */
bool pl_backend_promises(pl_device d, const char *key);
/* backend_loader.c hands backend_registry.c, when the library is loaded,
 * the function that finds and registers the cpu plugin: called once, by the
 * first CPU lookup (pl_backend_get). */
void pl_backend_set_cpu_loader(pl_status (*load)(void));
/* Wait until every kernel queued on device d has run (its backend's
 * synchronize; PL_OK at once on the CPU, whose kernels return when done):
 * the op profiler and the run's steady-state clock (backend_registry.c). */
pl_status pl_device_synchronize(pl_device d);
/* Split a device string "NAME" or "NAME:N" (NAME: letters, digits, '_';
 * N: 0..2^31-1) into the backend name and index; "cpu" and "auto" come back
 * as themselves with index 0. PL_ERR_INVALID naming the string otherwise. */
/* op_profile.c: PL_PROFILE_OPS=1 times every dispatched kernel between two
 * synchronizes of its device and prints the table at exit (stderr). */
bool pl_op_profile_on(void);           /* reads PL_PROFILE_OPS once */
void pl_op_profile_enable(bool on);    /* tests: on/off, and the table emptied */
double pl_op_profile_begin(pl_device d);
void pl_op_profile_end(int op, bool backward, const pl_tensor *first, pl_device d, double t0);
void pl_op_profile_report(FILE *f);    /* largest total first; nothing when empty */
/* The precision plugin's convert_param behind pl_params_seal (the trainer
 * sets it between the precision's create and setup; NULL fn: none). */
void pl_params_set_seal(pl_params *ps, pl_status (*fn)(void *ud, pl_params *ps, int i),
                        void *ud);
pl_status pl_device_spec(const char *s, char *name, size_t n, int *index);

/* Run the forward kernel of a->op on the backend of a->in[0]'s device (or
 * a->out[0]'s if there are no inputs). PL_ERR_UNSUPPORTED if missing
 * (dispatch.c, with the gates below). */
pl_status pl_kernel_forward(pl_kernel_args *a);

/* PL_OK when b's struct_size covers the ABI 2.0 layout and it has a kernel
 * lookup; else PL_ERR_ABI naming `where` (a path or the backend's name). */
pl_status pl_backend_check_layout(const pl_backend *b, const char *where);

/* Gates used at op entry; each sets an error naming the op and tensor. */
pl_status pl_check_float(const char *op, const pl_tensor *t, bool allow_half);
pl_status pl_check_index(const char *op, const pl_tensor *t); /* i32 or i64 */
pl_status pl_check_same_device(const char *op, pl_tensor *const *ts, int n);
pl_status pl_check_ndim(const char *op, const pl_tensor *t, int min_ndim, int max_ndim);
/* t retained if contiguous, else a contiguous (non-recorded) copy; caller releases.
 * Autograd: if t is a non-contiguous tensor that requires grad, the copy is
 * recorded via pl_contiguous semantics (ops_index.c). */
pl_tensor *pl_contiguous_owned(pl_tensor *t);
/* The end of every op (tape.c): run k's kernel (pl_kernel_forward), record
 * the node with `saved` (n_saved tensors kept beside the inputs for backward),
 * release k's inputs and its extra outputs out[1..], and hand out[0] to the
 * open frame. NULL (out[0] released, the error set) when an output is NULL,
 * the kernel fails or the recording does. */
pl_tensor *pl_op_finish(pl_kernel_args *k, pl_tensor *const *saved, int n_saved);
/* Release ts[0..n) (NULL entries skipped by pl_tensor_release). */
void pl_tensors_release(pl_tensor **ts, int n);
bool pl_any_requires_grad(pl_tensor *const *ts, int n);

/* NumPy broadcast of two shapes into (ndim, shape); PL_ERR_SHAPE naming op. */
pl_status pl_broadcast_shapes(const char *op, const pl_tensor *a, const pl_tensor *b, int *ndim,
                              int64_t *shape);

/* True while some pl_params list holds t: t->param_lists > 0 (tensor.c). */
bool pl_tensor_is_param(const pl_tensor *t);
/* For the node the next recorded op pushes (tape.c): its input `dst`,
 * slot 0 or 1, is src cast to the autocast dtype. Where src is a frozen,
 * contiguous parameter (not requiring grad, held by a pl_params list, so
 * nothing rewrites it during the step) and backward needs dst, the tape
 * keeps a stub of dst and casts src again when backward runs, instead of
 * keeping the half copy beside the f32 parameter. NULL dst clears the slot;
 * pl_matmul's autocast path sets both slots around its inner matmul and
 * clears them after. */
void pl_autocast_recast_hint(int slot, const pl_tensor *dst, pl_tensor *src);

/* torch.autocast's cast cache (autocast_cache.c). Between begin and end
 * (nestable; the trainer brackets each model forward), pl_autocast_operand
 * casts a trainable f32 leaf parameter to dt once and hands the same tensor
 * to every later use; an entry made with grad mode off is not reused with
 * grad mode on (it would cut the gradient). end releases the cache's
 * references (the tape keeps what backward reads). Outside a scope, and for
 * any other tensor (activations, frozen weights), it is pl_cast. */
void pl_autocast_cache_begin(void);
void pl_autocast_cache_end(void);
pl_tensor *pl_autocast_operand(pl_tensor *a, pl_dtype dt);
/* This thread's counts since the last reset: operand casts asked of
 * pl_autocast_operand (dtype changes only), casts made, cache hits. */
typedef struct pl_autocast_cache_stats {
    uint64_t casts_requested, casts, hits;
} pl_autocast_cache_stats;
pl_autocast_cache_stats pl_autocast_cache_stats_get(void);
void pl_autocast_cache_stats_reset(void);

/* Per-thread frame stack (frame.c). */
void pl_frame_adopt(pl_tensor *t);

#endif
