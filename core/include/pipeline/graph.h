/* graph.h - capture a stretch of device work once, replay it many times
 * (CUDA graphs; torch.cuda.graph / torch.cuda.make_graphed_callables).
 *
 * Between pl_graph_capture_begin and pl_graph_capture_end, the work the
 * calling thread issues on the device (op kernels, device-to-device copies,
 * memsets) is recorded by the backend (pl_backend.capture_begin, backend.h)
 * and NOT run; pl_graph_replay runs it, in order, with the same pointers and
 * the same kernel arguments. The trainer captures a whole training step
 * ([trainer] cuda_graphs) and replays it for every later batch of the same
 * shapes. What that demands of the step, as torch.cuda.graphs does:
 *  - Static inputs: a replay reads the tensors the capture read. The caller
 *    copies each new batch into the captured input tensors.
 *  - A graph-private memory pool: while capturing, the capturing thread's
 *    allocations on the device come from a pool owned by the graph (alloc.c);
 *    its blocks, freed or not, are never handed to other work while the
 *    graph lives, so a replay writes where the capture wrote and nothing
 *    else lives there. Released with the graph (pl_graph_release).
 *  - No host synchronization inside: a host read (pl_tensor_item, a copy to
 *    the CPU), a host write (a copy from the CPU: its source is not read
 *    again on a replay), synchronize or a device-side random fill while
 *    capturing is an error naming the call (the backend's violation, which
 *    pl_graph_capture_end reports again).
 *  - Values that change between replays live on the device: kernel
 *    arguments are baked at capture. Two kinds are handled here:
 *      * the optimizer's per-step coefficients (learning rate from the
 *        schedulers, AdamW's bias correction from its step count, onecycle's
 *        momentum): while capturing, pl_adamw_step_ / pl_sgd_step_ put their
 *        coefficients into a device table slot that the kernel reads (p.flags
 *        bit0, in[2]); before each replay the optimizer's step() runs again
 *        on the host between pl_graph_refresh_begin / _end, which computes
 *        every call's coefficients (advancing the optimizer's own counts)
 *        into the table without launching anything, then copies the table to
 *        the device in one host-to-device copy;
 *      * dropout's counter, a function of the micro-step that every model
 *        computes as A + micro_step * K per call site: the calls of the step
 *        before the capture are recorded (pl_graph_dropout_learn), the
 *        capture derives each call's K from the difference, and the kernel
 *        adds K * delta, delta (an i64 on the device) being the micro-steps
 *        since the capture (pl_graph_set_micro_delta, before each replay).
 *    Anything else the host decides per step is baked; the trainer keeps
 *    such runs eager (a host-side loss scale other than 1, data parallel:
 *    trainer docs; fp16's scale lives on the device, plugin.h ABI 2.11,
 *    and is captured); gradient accumulation is captured as one graph per micro-batch
 *    index of a step (core/run/graph_step.c).
 * The CPU has no graphs (pl_graph_supported is false); the strict device
 * records each kernel call and replays the list, enforcing the same rules.
 * When the capture ends, a backend with capture_end_step (ABI 2.11) learns
 * which of the pool's blocks the step released and may fuse calls whose
 * intermediates are provably dead (backend.h, "Seeing the step");
 * PL_GRAPH_FUSION=0 in the environment turns that off (pl_graph_fused).
 * One capture at a time per thread. Not thread-safe across threads sharing
 * one graph.
 */
#ifndef PIPELINE_GRAPH_H
#define PIPELINE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/status.h"
#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pl_graph pl_graph;

/* Whether device d's backend can capture (has the ABI 2.8 verbs). No error
 * is set either way. */
bool pl_graph_supported(pl_device d);

/* Start recording the calling thread's work on d (see above). Allocates the
 * graph's pool and its dropout offset before recording.
 * Errors: PL_ERR_UNSUPPORTED (d's backend cannot capture, naming it);
 * PL_ERR_INVALID (this thread is already capturing); the backend's error. */
pl_status pl_graph_capture_begin(pl_device d);
/* Stop recording. PL_OK: *out = the graph (owned; pl_graph_release), whose
 * recorded work has NOT run yet: replay it once to run the captured stretch.
 * Otherwise *out = NULL, the graph's pool is released and the error is the
 * first violation (the backend's, or the core's: dropout calls that do not
 * match the learned step, PL_ERR_INVALID). Error PL_ERR_INVALID when this
 * thread is not capturing. */
pl_status pl_graph_capture_end(pl_graph **out);
/* Whether the calling thread is capturing. */
bool pl_graph_capturing(void);
/* Run the recorded work (asynchronous on a GPU). The coefficient table and
 * the dropout offset must have been set for this replay (refresh, delta).
 * Errors: PL_ERR_INVALID for NULL; the backend's. */
pl_status pl_graph_replay(pl_graph *g);
/* How many groups of calls the backend fused into one when the capture
 * ended (pl_backend.capture_end_step, backend.h "Seeing the step"; 0 for a
 * backend without it, or with PL_GRAPH_FUSION=0 in the environment), and
 * in *patterns (when non-NULL; owned by g) which, e.g. "matmul+bias x2". */
int pl_graph_fused(const pl_graph *g, const char **patterns);
/* Free the graph, its backend handle and (when no block of it is in use)
 * its pool; blocks still in use return to the device's cache when freed.
 * NULL is a no-op. */
void pl_graph_release(pl_graph *g);

/* Optimizer coefficients. Between begin and end, the calling thread's
 * pl_adamw_step_ / pl_sgd_step_ calls launch nothing: call i (in order) must
 * update the parameter that captured call i updated, and its coefficients
 * go into slot i. end copies the table to the device (one host-to-device
 * copy). Errors (end, or the step call): PL_ERR_INVALID naming the
 * parameter when the calls differ from the captured ones (another
 * parameter, another op, fewer or more calls). */
pl_status pl_graph_refresh_begin(pl_graph *g);
pl_status pl_graph_refresh_end(pl_graph *g);
/* How many optimizer calls the capture recorded. */
int pl_graph_optim_calls(const pl_graph *g);

/* Dropout: on = record the counters of the calling thread's dropout calls
 * (a training step, with dropout active, one micro-step before the
 * capture); off stops recording and keeps the list for the next capture,
 * which uses it up.
 * pl_graph_set_micro_delta writes delta = micro-steps since the capture
 * into the graph's device i64 (one host-to-device copy, between replays). */
void pl_graph_dropout_learn(bool on);
pl_status pl_graph_set_micro_delta(pl_graph *g, int64_t delta);
/* Dropout calls the capture recorded with a counter offset. */
int pl_graph_dropout_calls(const pl_graph *g);

#ifdef __cplusplus
}
#endif
#endif
