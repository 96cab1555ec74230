/* backend.h - the per-device backend vtable and the op kernel lookup.
 *
 * A backend fills one pl_backend: raw memory (alloc/free/copy/memset/sync)
 * and a kernel lookup, kernel(op, backward), that returns the forward or
 * backward kernel of an op, or NULL when the backend does not implement it
 * (ggml's supports_op idea). Every backend is a plugin .so (kind
 * PL_KIND_BACKEND) whose vtable is a pl_backend, registered with
 * pl_backend_register(): the CPU backend, cpu.so (plugins/backends/cpu,
 * every op; the core loads it on the first pl_backend_get(PL_DEVICE_CPU),
 * ggml's ggml-cpu), and one accelerator backend, cuda.so or strict.so.
 * Ops dispatch on the device of their inputs through
 * pl_backend_kernel(); a NULL kernel means "not supported on this backend"
 * and the op fails with PL_ERR_UNSUPPORTED naming the op and backend.
 *
 * Why a lookup and not a table indexed by op: a table sized PL_OP_COUNT is
 * part of the struct layout, so a core with one more op would read past the
 * table of a backend built before it. The lookup is asked about any op id,
 * including ids the backend was built without; it answers NULL for those
 * (a backend bounds-checks against the PL_OP_COUNT it was compiled with,
 * pl_kernel_table_get() in backend_util.h does it). Op ids are stable: a new
 * op is appended just before PL_OP_COUNT; an id is never renumbered or reused.
 *
 * Layout check: struct_size is the first field and holds sizeof(pl_backend)
 * as the backend was compiled (PL_BACKEND_STRUCT_SIZE). Fields are only ever
 * appended; pl_backend_register() refuses (PL_ERR_ABI) a table smaller than
 * the ABI 2.0 layout (PL_BACKEND_MIN_SIZE) or without a kernel lookup, and a
 * field appended later is read only when struct_size covers it.
 *
 * Kernel calling convention (pl_kernel_args):
 *   forward : in[0..n_in) are the op's inputs (contiguous), out[0] is the
 *             preallocated output, out[1..] extra outputs saved for backward
 *             (e.g. layer_norm mean/rstd, dropout mask); p holds parameters.
 *   backward: in[0] = grad of the output, in[1..] = the op's inputs followed
 *             by its saved tensors (in that order); out[i] = grad of input i,
 *             preallocated with that input's shape, or NULL when input i needs
 *             no gradient. Backward kernels OVERWRITE out[i] (the autograd
 *             engine does the accumulation). An input whose data the op's
 *             backward does not need is a tape stub (shape, no data:
 *             pl_autograd_needed_inputs, ops.def's `reads`). An op whose
 *             ops.def row has saves_out (relu, sigmoid, tanh, exp, softmax,
 *             log_softmax, causal_softmax, segment_softmax) saves its output:
 *             it is in[1 + n_in], and its float input is a stub.
 * How many inputs and outputs each op's calls have, and what it saves, is
 * its row in pipeline/ops.def (ABI 2.8); the core checks every call against
 * it before a kernel runs.
 *   captured graphs (ABI 2.8, graph.h): values that change every step come
 *             from device memory instead of the launch. adamw_step / sgd_step
 *             with p.flags bit0 set: p.extra is NULL, in[1] is the found_inf
 *             flag or NULL, in[2] holds the pl_adamw_coef / pl_sgd_coef bytes
 *             (f32 [16] on the device). adamw_step_multi / sgd_step_multi
             (optim_math.h's pl_optim_multi in p.extra, one call for up to
             32 parameters): with p.flags bit0, in[1] holds 16 floats of
             coefficients per tensor. dropout with p.extra set: p.extra is
 *             an i64 [1] device tensor d, and the counter used is
 *             p.counter + p.start * d[0] (wrapping, as uint64).
 * Shape / index / broadcast geometry and the RoPE table every backend needs
 * are in backend_util.h.
 */
#ifndef PIPELINE_BACKEND_H
#define PIPELINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every op the tensor interface knows: one row each in pipeline/ops.def (its
 * inputs, outputs, what backward saves, its parameters), which generates
 * this enum and pl_op_name(). Append only (ids are ABI, see above). Which ops
 * belong here and which live with a plugin as custom ops: CONTRIBUTING.md,
 * "Where an op lives". */
typedef enum pl_op {
    PL_OP_NONE = 0, /* not an op: checkpoint nodes, custom ops' kernel args */
#define PL_OP_DEF(id, ...) PL_OP_##id,
#include "pipeline/ops.def"
    PL_OP_COUNT,
    PL_OP_CUSTOM_BASE = 1000 /* ids of ops registered by plugins */
} pl_op;

#define PL_ALL_DIMS (-100)
#define PL_MAX_OP_INPUTS 8
#define PL_MAX_OP_OUTPUTS 8

/* Parameters of one op call. Fields an op does not use are zero. */
typedef struct pl_op_params {
    double alpha, beta, eps;
    int64_t dim, start, end, ignore_index, num_segments;
    int64_t perm[PL_MAX_DIMS];
    int64_t shape[PL_MAX_DIMS];
    int ndim;
    uint64_t seed, counter;
    int flags;
    pl_dtype dtype;
    void *extra; /* op-specific pointer (custom ops); borrowed */
} pl_op_params;

typedef struct pl_kernel_args {
    pl_op op;
    int n_in, n_out;
    pl_tensor *in[PL_MAX_OP_INPUTS];
    pl_tensor *out[PL_MAX_OP_OUTPUTS];
    pl_op_params p;
} pl_kernel_args;

typedef pl_status (*pl_kernel_fn)(const pl_kernel_args *a);

/* Kernel lookup of a backend: the forward (backward = false) or backward
 * kernel of `op`, or NULL when this backend does not implement it. Must
 * answer NULL, without reading out of bounds, for ANY op id it does not
 * know (negative, >= its own PL_OP_COUNT, custom ids). Called on every op
 * call from any thread: a pure, lock-free function of (op, backward). */
typedef pl_kernel_fn (*pl_kernel_lookup_fn)(pl_op op, bool backward);

struct pl_backend_counters;
struct pl_step_facts;
/* What a device says about its own load over an interval (pl_backend's
 * device_stats; what Lightning's DeviceStatsMonitor shows): the driver's view,
 * not the caching allocator's. A field the device cannot tell is NAN. */
typedef struct pl_device_stats {
    /* fraction (0..1) of the interval in which a kernel ran on the device:
     * the mean of the driver's utilization samples taken after the cursor
     * (n_samples of them), or its latest reading when there are none
     * (n_samples 0) */
    double utilization;
    int n_samples;
    /* device memory in use by every process, and the device's total, in bytes */
    double memory_used_bytes;
    double memory_total_bytes;
} pl_device_stats;

typedef struct pl_backend {
    /* sizeof(pl_backend) as compiled by the backend: PL_BACKEND_STRUCT_SIZE.
     * First field, so it can be read whatever the rest of the layout. */
    uint32_t struct_size;
    const char *name;          /* "cpu", "cuda" */
    pl_device_type type;
    int (*device_count)(void);
    /* raw memory; the caching allocator sits on top of these */
    void *(*raw_alloc)(int device, size_t nbytes);
    void (*raw_free)(int device, void *ptr);
    /* copy nbytes; kind inferred from the two devices */
    pl_status (*memcpy)(void *dst, pl_device dst_dev, const void *src, pl_device src_dev,
                        size_t nbytes);
    pl_status (*memset)(void *dst, pl_device dev, int value, size_t nbytes);
    pl_status (*synchronize)(int device);
    /* free/total bytes of device memory (for the loader's 75 % rule) */
    pl_status (*mem_info)(int device, size_t *free_bytes, size_t *total_bytes);
    /* pinned host memory for async transfers (NULL: use pl_alloc on CPU) */
    void *(*host_alloc_pinned)(size_t nbytes);
    void (*host_free_pinned)(void *ptr);
    /* required: the op kernels (see pl_kernel_lookup_fn) */
    pl_kernel_lookup_fn kernel;
    /* ---- ABI 2.2 (read only when struct_size covers it; may be NULL) ----
     * Host-to-device copy for a background thread (a loader's prefetch):
     * copies nbytes from host src (pinned from host_alloc_pinned for a truly
     * asynchronous copy) to device dst on a copy stream of its own, ordered
     * after all work already issued on the compute stream (so a buffer that
     * queued kernels still read is not overwritten), and returns when the copy
     * has completed. The calling thread blocks; the compute stream does not,
     * so the copy overlaps compute (the reports' ChunkDataLoader). After it
     * returns, work issued later on the compute stream sees the data. NULL:
     * callers use memcpy. */
    pl_status (*memcpy_h2d_background)(void *dst, pl_device dst_dev, const void *src,
                                       size_t nbytes);
    /* A run-wide backend setting from the config, e.g. ("allow_tf32", "true"):
     * PyTorch's torch.backends.cuda.matmul.allow_tf32, off by default. Called
     * by the trainer before any op; PL_ERR_UNSUPPORTED for a key the backend
     * does not know (the trainer ignores that for keys that are no-ops on
     * such a device). NULL: no settings.
     * ("optimizer_found_inf", "true"): asked by the trainer before a fit;
     * PL_OK promises that this backend's adamw_step / sgd_step kernels obey
     * the found_inf flag in[1] (pl_optim_set_found_inf, ops.h: no update when
     * it is non-zero or NaN). Without that answer the trainer reads the loss
     * back every step instead of keeping it on the device.
     * ("optimizer_step_count", "true") (ABI 2.12): asked by an optimizer
     * (pl_optim_counts_on_device, ops.h); PL_OK promises that the kernels
     * take counted calls: adamw_step's out[4], sgd_step's out[2] and the
     * multi forms' pl_optim_multi.count[] (optim_math.h), a step count on
     * the device incremented unless found_inf, whose value the update uses.
     * Without it the optimizer keeps its count on the host.
     * ("lora_add_dropout", "true") (ABI 2.12): asked by pl_lora_add_dropout
     * (ops.h); PL_OK promises that lora_add's kernels honour p.flags bit1
     * (the dropout of x inside the op). Without it the core records the
     * chain pl_dropout then pl_lora_add (the same values).
     * ("linear_cross_entropy", "true") (ABI 2.13): asked by
     * pl_linear_cross_entropy (ops.h); PL_OK promises a kernel for op
     * linear_cross_entropy, forward and backward. Without it the core
     * records the chain matmul then cross_entropy (the same values to f32
     * rounding, the [N, V] logits on the tape). */
    pl_status (*set_option)(const char *key, const char *value);
    /* ---- appended in ABI 2.6 (read only when struct_size covers it; may be NULL) ----
     * What would stall a GPU, counted since the backend was loaded (the
     * trainer's device_stats in summary.json, per optimizer step): fills *out
     * with monotonic counters. The caller sets out->struct_size to
     * sizeof(pl_backend_counters) as it was compiled; the backend fills the
     * fields that size covers and leaves the rest alone. Any thread; the
     * values of one call are each exact, not a snapshot taken together.
     * NULL: the backend counts nothing (the CUDA backend today). */
    pl_status (*counters)(struct pl_backend_counters *out);
    /* ---- appended in ABI 2.6 (read only when struct_size covers it; may be NULL) ----
     * Utilization and memory of `device` as its driver reports them (the cuda
     * backend: NVML, libnvidia-ml.so.1 opened at run time, no link-time
     * dependency). *cursor is the driver's timestamp of the last utilization
     * sample read: the call averages the samples after it and moves it, so one
     * call per epoch with one cursor gives the epoch's mean; with *cursor 0 (a
     * first call) it gives the latest reading and sets the cursor.
     * Host-side only: it neither waits for nor touches the device's queue.
     * PL_ERR_UNSUPPORTED (message saying why) when the driver library is
     * absent or refuses; callers then report nothing and go on. NULL: the
     * backend has no such numbers (CPU). The strict device answers with a
     * stand-in: the share of wall time inside its (synchronous) kernels and
     * the bytes it has mapped. Use pl_backend_device_stats. */
    pl_status (*device_stats)(int device, uint64_t *cursor, pl_device_stats *out);
    /* Optional (ABI 2.7; read when struct_size covers it): fill the
     * contiguous f32 / bf16 / f16 tensor t, in this backend's memory, with
     * the parameter-init values of pl_init_draw (kernel_math.h) for (seed,
     * stream): normal != 0 draws N(a, b^2), else U[a, b); each value is
     * rounded to f32, then to t's dtype (RNE), as pl_tensor_normal_ /
     * pl_tensor_uniform_ do on the host. Drawing on the device, a random 7B
     * backbone (model.backbone_weights = random) starts in seconds; without
     * it (NULL) the core draws on the host in f32 and copies (20 s of the 7B
     * load on an H200). PL_ERR_DEVICE on a failed launch. */
    pl_status (*fill_random)(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                             uint64_t stream);
    /* ---- appended in ABI 2.8 (read when struct_size covers all four; each may be
     * NULL, and a backend either fills all four or none) ----
     * Graph capture (CUDA graphs; torch.cuda.graph). The core's pl_graph_*
     * (graph.h) is the only caller; it also routes the capturing thread's
     * allocations to a graph-private pool (alloc.c), so the addresses the
     * recorded work uses stay reserved for the graph.
     *
     * capture_begin(device): from now on the work the CALLING THREAD issues
     * on `device` (op kernels, device-to-device memcpy, memset) is recorded,
     * NOT run; other threads (a loader's memcpy_h2d_background) run as
     * usual. While capturing, these from the calling thread are violations:
     * a memcpy with a host side (a host read such as pl_tensor_item, or a
     * host write, whose source a replay could not see again), synchronize,
     * and fill_random. A violation fails at once (PL_ERR_DEVICE, the message
     * names the call and its size) and poisons the capture: capture_end then
     * returns that same first error. raw_alloc stays allowed (the pool
     * grows). Errors: PL_ERR_INVALID when this thread is already capturing;
     * PL_ERR_DEVICE when the driver refuses.
     * capture_end(device, &graph): stops recording. PL_OK: *graph is an owned
     * handle for graph_replay / graph_release; nothing recorded has run yet
     * (replay it once to run the captured step). On a poisoned capture or a
     * driver error: *graph = NULL and the error (the first violation).
     * graph_replay(graph): runs the recorded work in order on the calling
     * thread's compute stream, with the pointers and parameter values of the
     * capture (kernel arguments are baked: a value that changes between
     * replays must be read by the kernel from device memory, as the
     * optimizer's coefficients and dropout's counter offset are, graph.h).
     * Asynchronous on a GPU, like any launch. Errors: PL_ERR_DEVICE; a
     * kernel's own error (strict runs the kernels then).
     * graph_release(graph): frees the handle; NULL is a no-op. The memory
     * the graph used is the core's (its pool), not freed here. */
    pl_status (*capture_begin)(int device);
    pl_status (*capture_end)(int device, void **graph);
    pl_status (*graph_replay)(void *graph);
    void (*graph_release)(void *graph);
    /* Optional (ABI 2.8; read when struct_size covers it): true when this
     * backend's kernel for the call `a` (backward: a backward call, in[0] the
     * f32 gradient) reads and writes its bf16 / f16 tensors itself, computing
     * in f32 registers and rounding each half output once (RNE) - the same
     * bits as on f32 copies. Asked only for the ops whose kernels otherwise
     * compute on f32 data (elementwise, reductions, losses, norms): when it is
     * NULL or answers false, the core widens the half inputs into transient
     * f32 copies around the kernel and rounds its f32 results into the half
     * outputs (core/src/tensor/half_io.c), three launches more on a GPU. Gradients
     * (out[] of a backward call) are f32 either way. Any thread; no side
     * effects. */
    bool (*half_native)(const pl_kernel_args *a, bool backward);
    /* Optional (ABI 2.9; read when struct_size covers it): the read side of
     * set_option, for the run's log and summary.json: writes the backend's
     * value of `key` as a NUL-terminated string into buf (n bytes, truncated
     * to fit) and returns PL_OK; PL_ERR_UNSUPPORTED for a key it does not
     * know (nothing written). The CPU backend answers "blas_threads"
     * (OpenBLAS's pool size, decimal), "blas_core" (the kernels OpenBLAS
     * chose when it loaded: "SkylakeX", "Haswell", "Prescott" ...; since
     * ABI 2.11), "blas_parallel" ("openmp",
     * "pthreads", "serial"), "cpu_gemm_bf16" (the kernel bf16 GEMMs run on
     * now: "avx512bf16", "avx2", "scalar") and "cpu_features" (what cpuid
     * found, /proc/cpuinfo's spelling, e.g. "avx2 avx512f avx512bw avx512vl
     * avx512_bf16"); its set_option takes ("threads", "N"), OpenBLAS's pool
     * size (N > 0; OpenMP's is the caller's omp_set_num_threads). Any
     * thread; no effect on the device. NULL: no such values. Use
     * pl_backend_info. */
    pl_status (*get_option)(const char *key, char *buf, size_t n);
    /* Optional (ABI 2.11; read when struct_size covers it; NULL: capture_end
     * as before): capture_end with what only the core knows about the
     * recorded step, so that the backend may fuse calls inside it (ggml's
     * backend graph_compute fusion). See "Seeing the step" below for the
     * contract. The core calls it INSTEAD of capture_end when the backend has
     * it and the environment does not set PL_GRAPH_FUSION=0; every rule,
     * error and result of capture_end holds (*graph, poisoned captures,
     * nothing has run). The backend writes facts->n_fused and facts->fused
     * (the core logs them once per capture). */
    pl_status (*capture_end_step)(int device, struct pl_step_facts *facts, void **graph);
    /* new fields go here, after the last one; see "Layout check" above */
} pl_backend;

/* ---- Seeing the step (ABI 2.11, pl_backend.capture_end_step) -----------------
 * Who records: the backend. Between capture_begin and capture_end it already
 * sees, in issue order, every call of the step: each kernel call's
 * pl_kernel_args (op id, forward or backward, parameters, and for each
 * tensor its data pointer, dtype, shape, strides and bytes), each
 * device-to-device memcpy and each memset, and it keeps what it needs to
 * replay them (strict: a deep copy of each call; cuda: the stream capture,
 * plus a note of each call's byte ranges). The core hands over at the end
 * only the fact it alone has:
 *   released: the device blocks (base, capacity in bytes; sorted by base,
 *             disjoint) of the graph's private pool (graph.h) that were free
 *             again when the capture ended. Every allocation of the capture
 *             came from that pool and no block of it is ever handed to other
 *             work, so no tensor alive after the step points into a released
 *             block, nothing outside the graph reads it, and a replay finds
 *             nothing of the previous replay there that it may read (the
 *             first access of the step to a block new in the capture is a
 *             write). Blocks still held when the capture ends (the loss, a
 *             gradient made in the step, ...) are not in the list, nor is
 *             memory allocated before the capture (parameters, optimizer
 *             state, static inputs).
 * Liveness rule: bytes [p, p + n) written by the step's call i are DEAD after
 * call j >= i when they lie inside one released block and no call after j
 * (in issue order) reads any of them before a call writes all of them. A
 * kernel reads its inputs (and the tensors behind p.extra: dropout's offset,
 * a multi-tensor optimizer's lists) and writes its outputs whole (a
 * contiguous output; backward kernels overwrite out[i]); a copy reads its
 * source and writes its destination; a memset writes.
 * Fusion rule: the backend may replace consecutive calls i..j by one call
 * that gives every byte that is not dead after j, and every output, the
 * same bits as the calls it replaces, and need not write the dead ones (an
 * intermediate that no one reads again). It must not fuse otherwise; a
 * fusion is an optimization, never an approximation, and op ids, the
 * public op set and the kernels' contracts do not change. A backend counts
 * a fused call as one kernel call (pl_backend_counters).
 * What is fused is the backend's: strict and cuda fuse square + sum over
 * all dims into one sum of squares, with the add of the norm's running
 * total after it when there is one (the gradient norm's per-parameter
 * chain, which the trainer replaced by sum_squares_multi). strict also fuses pl_linear's
 * f32 matmul and the add of its bias row into one GEMM with a bias
 * epilogue (the product is never written; one group per linear layer with
 * a bias in the forward). strict fuses only when the intermediates are
 * dead; cuda launches one kernel for every square + sum group while
 * capturing and drops its stores of the intermediates, in the graph, where
 * they are dead, and leaves matmul + bias as two launches (its README)
 * (plugins/backends/strict/README.md, plugins/backends/cuda/README.md).
 * A backend reads the fields of pl_step_facts that facts->struct_size
 * covers (appended only, as pl_backend). */
typedef struct pl_step_block {
    const void *base;
    size_t bytes;
} pl_step_block;

typedef struct pl_step_facts {
    uint32_t struct_size; /* set by the core: sizeof(pl_step_facts) as it was compiled */
    const pl_step_block *released; /* [n_released] (see above); borrowed for the call */
    size_t n_released;
    /* written by the backend (the core zeroes them): how many groups of
     * calls it fused into one, and which, e.g. "matmul+bias x2" */
    int n_fused;
    char fused[192];
} pl_step_facts;

/* Whether [p, p + n) lies inside one block of facts->released (binary
 * search): half of the liveness rule above; the other half is the backend's
 * scan of the calls after the fused ones. */
static inline bool pl_step_released(const pl_step_facts *facts, const void *p, size_t n) {
    size_t lo = 0, hi = facts ? facts->n_released : 0;
    uintptr_t a = (uintptr_t)p;
    while (lo < hi) { /* the first block with base > a */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)facts->released[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return false;
    const pl_step_block *b = &facts->released[lo - 1];
    return a + n <= (uintptr_t)b->base + b->bytes;
}

/* Counters of a backend (pl_backend.counters), all monotonic from the
 * backend's load. Append-only, like pl_backend; struct_size first.
 *   host_reads     device-to-host copies (memcpy with a device source and a
 *                  host destination): on a GPU each waits for the stream, so
 *                  the host stops issuing work (pl_tensor_item is one).
 *   host_writes    host-to-device copies (memcpy and memcpy_h2d_background).
 *   allocations    raw device allocations (raw_alloc calls: cudaMalloc on a
 *                  GPU, a device-wide sync); the caching allocator's cache
 *                  hits do not reach the backend and are not counted.
 *   kernel_calls   op kernels run (forward and backward), memsets and
 *                  device-to-device copies: each one launch on a GPU. */
typedef struct pl_backend_counters {
    uint32_t struct_size; /* set by the caller: sizeof(pl_backend_counters) */
    uint64_t host_reads, host_read_bytes;
    uint64_t host_writes, host_write_bytes;
    uint64_t allocations, allocation_bytes;
    uint64_t kernel_calls;
} pl_backend_counters;

#define PL_BACKEND_STRUCT_SIZE ((uint32_t)sizeof(pl_backend))
/* Size of the ABI 2.0 layout (up to and including `kernel`): the smallest
 * table pl_backend_register() accepts. Stays fixed when fields are appended. */
#define PL_BACKEND_MIN_SIZE ((uint32_t)(offsetof(pl_backend, kernel) + sizeof(pl_kernel_lookup_fn)))

/* Whether backend table b (built against some ABI 2.x backend.h) has the
 * field `f`: fields appended after ABI 2.0 are read only when it does, e.g.
 * `PL_BACKEND_HAS(b, memcpy_h2d_background) && b->memcpy_h2d_background`. */
#define PL_BACKEND_HAS(b, f) ((b)->struct_size >= offsetof(pl_backend, f) + sizeof((b)->f))

/* Register a backend for its device type. The CPU slot is filled once per
 * process (registering the table that holds it again is PL_OK); the
 * accelerator slot takes the table given (the core's loader keeps it to
 * one accelerator backend per process). The table is borrowed and must
 * outlive the process. The core registers what
 * it loads (the cpu plugin on the first CPU lookup, an accelerator plugin
 * for [pipeline] device); a program that links a CPU backend's code itself
 * (the tests of plugins/backends/cpu) registers it before any CPU tensor.
 * Errors: PL_ERR_ABI when struct_size < PL_BACKEND_MIN_SIZE (built for
 * another layout) or kernel is NULL, naming the backend; PL_ERR_INVALID for
 * a bad device type, or when another CPU backend holds the CPU slot (both
 * named). */
pl_status pl_backend_register(const pl_backend *b);
/* Backend for a device type, or NULL (with error set) if none is loaded.
 * PL_DEVICE_CPU: the first call (of any thread; once per process) finds
 * and registers the cpu plugin (cpu.so, kind backend) in the plugin search
 * path (PIPELINE_PLUGIN_PATH, then the build tree's plugin dir for a
 * program or core of the build tree, else the install dirs: plugin.h's
 * registry rules); when it is absent or refused, this and every later CPU
 * lookup return NULL with PL_ERR_DEVICE naming cpu.so, the dirs searched
 * and the reason. The thread's error state is left alone on success. */
const pl_backend *pl_backend_get(pl_device_type type);
/* The CPU backend: pl_backend_get(PL_DEVICE_CPU). */
const pl_backend *pl_backend_cpu(void);
/* The value of `key` from the get_option verb of type's backend (loaded or,
 * for the CPU, loaded now) into buf (n > 0 bytes), or "unknown" when the
 * backend is absent, predates the verb or does not know the key. Returns
 * buf; never sets the error state. For logs and summary.json. */
const char *pl_backend_info(pl_device_type type, const char *key, char *buf, size_t n);
/* The kernel of `op` on backend `b` (b->kernel(op, backward)), or NULL when
 * b is NULL, has no lookup or does not implement the op. Any op id is safe.
 * Does not set the error: callers report PL_ERR_UNSUPPORTED naming the op
 * (pl_op_name) and the backend (b->name). */
pl_kernel_fn pl_backend_kernel(const pl_backend *b, pl_op op, bool backward);
/* pl_backend_kernel(b, op, backward) != NULL. */
bool pl_backend_supports(const pl_backend *b, pl_op op, bool backward);
/* The device_stats of d's backend (pl_backend.device_stats): *out filled (NAN
 * where unknown) and PL_OK, or PL_ERR_UNSUPPORTED with *out all NAN when the
 * device is the CPU, its backend is not loaded, predates the field or has
 * none, or the driver cannot tell. `cursor` as in device_stats (NULL: the
 * latest reading only). */
pl_status pl_backend_device_stats(pl_device d, uint64_t *cursor, pl_device_stats *out);
/* "matmul", "softmax", ... Static string; "custom" for ids from
 * PL_OP_CUSTOM_BASE, "unknown" for other ids this core does not know. */
const char *pl_op_name(pl_op op);

#ifdef __cplusplus
}
#endif
#endif
