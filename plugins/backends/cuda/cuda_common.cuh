/* cuda_common.cuh - helpers shared by the CUDA backend's translation units.
 *
 * Kernels here keep launch geometry and memory access only: every formula
 * (activations, softmax / loss terms, normalization, dropout, RoPE, NF4
 * decode, dtype rounding) is a PL_HD function of pipeline/kernel_math.h,
 * the same text the CPU backend runs, reached through backend_util.h.
 *
 * Everything a thread issues runs on that thread's default stream
 * (cudaStreamPerThread: the plugin is compiled with nvcc --default-stream
 * per-thread, and cuBLAS / cuDNN are set to it), so kernels, cuBLAS calls,
 * memsets and copies are ordered with each other and a scratch block
 * returned to the caching allocator may be reused by the next op without a
 * synchronization. The trainer issues all compute from one thread; a
 * loader's background copies order themselves after it (cuda_memory.cu).
 * Why not the legacy NULL stream, as before: a CUDA graph cannot be
 * captured from it (cudaStreamBeginCapture refuses cudaStreamLegacy), and
 * the trainer captures whole steps ([trainer] cuda_graphs, graph.h).
 * cudaMemset and device-to-device cudaMemcpy are redirected below to their
 * Async forms on that stream: the synchronous forms may not run while a
 * stream captures, and the Async forms are ordered the same way.
 *
 * The op kernels (cuda_dense.cu, cuda_norm.cu, cuda_index.cu, cuda_attention.cu,
 * cuda_copy.cu, cuda_matmul.cu, cuda_nf4.cu, cuda_optim.cu, cuda_lstm.cu, cuda_lstm_native.cu): semantics,
 * argument layout and saved tensors follow the CPU kernels op for op; see backend.h for
 * the calling convention. They hold launch geometry, reductions and memory access; the
 * formula of every element is the PL_HD function of pipeline/kernel_math.h that the CPU
 * kernel calls too. Sums that the CPU does in double are done in double here too;
 * scatter-style backwards use atomicAdd, so their summation order (not their value
 * beyond rounding) differs from the CPU.
 *
 * The files: cuda_backend.cu holds the pl_backend table and the plugin descriptor and
 * calls the others (the verbs and register functions declared at the end of this file);
 * they do not call it back. cuda_memory.cu: devices, memory, transfers, graph capture;
 * cuda_stats.cu: device stats (NVML); cuda_fault.cu: the deferred index checks.
 */
#ifndef PL_CUDA_COMMON_CUH
#define PL_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "pipeline/backend_util.h"
#include "pipeline/pipeline.h"

#define PL_CUDA_THREADS 256
#define PL_CUDA_MAX_DEVICES 8 /* cuBLAS handles, NVML devices */
#define T_ROW 256             /* threads per block of the row kernels */

/* Blocks of a one-block-per-row launch over `rows` rows (grid-stride beyond). */
static inline unsigned row_grid(int64_t rows) {
    return (unsigned)(rows < 65535 * 16 ? (rows > 0 ? rows : 1) : 65535 * 16);
}

/* ---- the compute stream (see the top of this file) ---- */
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "the CUDA plugin is compiled with nvcc --default-stream per-thread (CMakeLists.txt)"
#endif
/* cudaMemset(p, v, n): asynchronous on the calling thread's stream. */
static inline cudaError_t pl_cu_memset_on_stream(void *p, int v, size_t n) {
    return cudaMemsetAsync(p, v, n, cudaStreamPerThread);
}
/* cudaMemcpy: device-to-device asynchronous on the calling thread's stream
 * (capturable); a copy with a host side stays synchronous (the host reads or
 * reuses its buffer right after). */
static inline cudaError_t pl_cu_memcpy_on_stream(void *d, const void *s, size_t n,
                                                 cudaMemcpyKind k) {
    if (k == cudaMemcpyDeviceToDevice) return cudaMemcpyAsync(d, s, n, k, cudaStreamPerThread);
    return cudaMemcpy(d, s, n, k);
}
#undef cudaMemset
#undef cudaMemcpy
#define cudaMemset(p, v, n) pl_cu_memset_on_stream((p), (v), (n))
#define cudaMemcpy(d, s, n, k) pl_cu_memcpy_on_stream((d), (s), (n), (k))

/* Turn a CUDA runtime error into a pl_status naming the call site. */
#define CUDA_TRY(expr)                                                                         \
    do {                                                                                       \
        cudaError_t _e = (expr);                                                               \
        if (_e != cudaSuccess)                                                                 \
            return pl_error_set(PL_ERR_DEVICE, "cuda backend: %s failed: %s (%s:%d)", #expr,   \
                                cudaGetErrorString(_e), __FILE__, __LINE__);                   \
    } while (0)

/* After a kernel launch: launch-configuration errors are reported at once. */
#define CUDA_LAUNCHED(opname)                                                                  \
    do {                                                                                       \
        cudaError_t _e = cudaGetLastError();                                                   \
        if (_e != cudaSuccess)                                                                 \
            return pl_error_set(PL_ERR_DEVICE, "cuda backend: kernel of op '%s' failed: %s",   \
                                opname, cudaGetErrorString(_e));                               \
    } while (0)

static inline unsigned pl_cu_blocks(int64_t n) {
    int64_t b = (n + PL_CUDA_THREADS - 1) / PL_CUDA_THREADS;
    if (b < 1) b = 1;
    if (b > 65535 * 16) b = 65535 * 16; /* kernels use grid-stride loops */
    return (unsigned)b;
}

#define GRID_LOOP(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (int64_t)blockDim.x * gridDim.x)

/* Select the device of tensor t for the following launches. */
static inline pl_status pl_cu_set_device(const pl_tensor *t) {
    CUDA_TRY(cudaSetDevice(t->device.index));
    return PL_OK;
}

static inline const float *cf(const pl_tensor *t) { return (const float *)pl_tensor_data(t); }
static inline float *fp(const pl_tensor *t) { return (float *)pl_tensor_data(t); }

/* ---- dtype load / store (bit-identical to the CPU conversions) ----------- */

/* The core's roundings (RNE, NaN stays NaN), kernel_math.h: the same
 * functions the CPU backend converts with. */
__device__ __forceinline__ float pl_d_bf16_to_f32(uint16_t h) {
    return pl_bf16_widen(h);
}
__device__ __forceinline__ uint16_t pl_d_f32_to_bf16(float f) {
    return pl_bf16_round(f);
}
__device__ __forceinline__ float pl_d_f16_to_f32(uint16_t h) {
    return pl_f16_widen(h);
}
__device__ __forceinline__ uint16_t pl_d_f32_to_f16(float f) {
    return pl_f16_round(f);
}

/* Float load/store of a float dtype (f32, bf16, f16, f64). */
__device__ __forceinline__ float pl_d_ldf(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PL_BF16: return pl_d_bf16_to_f32(((const uint16_t *)p)[i]);
    case PL_F16: return pl_d_f16_to_f32(((const uint16_t *)p)[i]);
    case PL_F64: return (float)((const double *)p)[i];
    default: return ((const float *)p)[i];
    }
}
__device__ __forceinline__ void pl_d_stf(void *p, int dt, int64_t i, float v) {
    switch (dt) {
    case PL_BF16: ((uint16_t *)p)[i] = pl_d_f32_to_bf16(v); break;
    case PL_F16: ((uint16_t *)p)[i] = pl_d_f32_to_f16(v); break;
    case PL_F64: ((double *)p)[i] = (double)v; break;
    default: ((float *)p)[i] = v; break;
    }
}

__device__ __forceinline__ int64_t pl_d_idx(const void *p, int dt, int64_t i) {
    return dt == PL_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Block-wide sum / max of one value per thread (blockDim.x <= 1024, multiple
 * of 32). Every thread gets the result. `sh` holds 32 entries. */
template <typename T> __device__ __forceinline__ T pl_d_warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float pl_d_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = pl_max_step(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> __device__ __forceinline__ T pl_d_block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = pl_d_warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    return pl_d_warp_sum(r);
}
__device__ __forceinline__ float pl_d_block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = pl_d_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : -INFINITY;
    return pl_d_warp_max(r);
}

/* ---- scratch device memory from the caching allocator ---------------------- */

typedef struct pl_cu_scratch {
    void *p;
    size_t cap;
    pl_device dev;
} pl_cu_scratch;

static inline void *pl_cu_scratch_get(pl_cu_scratch *s, pl_device dev, size_t nbytes) {
    s->dev = dev;
    s->p = pl_alloc(dev, nbytes ? nbytes : 1, &s->cap);
    if (!s->p) pl_error_set(PL_ERR_NOMEM, "cuda backend: out of device memory (%zu bytes scratch)", nbytes);
    return s->p;
}
static inline void pl_cu_scratch_free(pl_cu_scratch *s) {
    if (s->p) pl_free(s->dev, s->p, s->cap);
    s->p = NULL;
}

/* ---- shared entry points between the translation units --------------------- */

/* dst (contiguous, dtype ddt) <- n elements of src seen with (shape, stride)
 * in elements, dtype sdt; dst_stride NULL means contiguous dst. Conversion
 * f32/bf16/f16/f64 and between integer types as pl_tensor_copy_ does. */
typedef struct pl_cu_geom {
    int nd;
    int64_t shape[PL_MAX_DIMS];
    int64_t sstride[PL_MAX_DIMS];
    int64_t dstride[PL_MAX_DIMS];
} pl_cu_geom;
pl_status pl_cu_strided_copy(void *dst, int ddt, const void *src, int sdt, const pl_cu_geom *g,
                             int64_t n, bool dst_contig);
/* g: the geometry of a contiguous tensor of `shape` (nd dims), source and
 * destination strides alike. cuda_copy.cu. */
void pl_cu_geom_contig(pl_cu_geom *g, int nd, const int64_t *shape);

/* f32 copy of a float tensor (its own data when already f32). */
const float *pl_cu_as_f32(const pl_tensor *t, pl_cu_scratch *s, pl_status *st);

/* PL_OK when this thread is not capturing a graph; else the capture is
 * poisoned with PL_ERR_UNSUPPORTED naming `op` and `why` (what CUDA would
 * refuse inside it), which capture_end returns, so [trainer] cuda_graphs =
 * auto falls back to eager with that reason. */
pl_status pl_cu_refuse_capture(const char *op, const char *why);

/* A contiguous copy of t converted to dt (rounded to nearest even) in scratch
 * s, which the caller frees; NULL with *st set on failure. The backward GEMMs
 * of half operands round their f32 grad_output with it, to run on the tensor
 * cores as PyTorch's bf16 / f16 autograd does. */
const void *pl_cu_as_dtype(const pl_tensor *t, pl_dtype dt, pl_cu_scratch *s, pl_status *st);

/* ---- deferred error checks (index ranges, cross-entropy targets) ----------- */

/* What a kernel found wrong in its inputs, in mapped pinned host memory that
 * every device writes to directly (no copy, no synchronization): the first
 * fault since the last check claims it (atomicCAS on `set`) and writes the
 * rest; later ones are dropped until the host clears it. The host reads it
 * only at a point where it waits for the device anyway (pl_cu_fault_check,
 * called by the backend's device-to-host memcpy and synchronize), so the
 * checks put no host sync inside a training step. Kernels that use an index
 * also skip (or write 0 for) an index out of range, so a bad index never
 * reads or writes out of bounds while its report is pending. */
enum { PL_CU_FAULT_INDEX = 1, PL_CU_FAULT_TARGET = 2 };
typedef struct pl_cu_fault {
    unsigned int set; /* 0: none; 1: claimed */
    int op;           /* pl_op of the kernel that found it */
    int kind;         /* PL_CU_FAULT_INDEX / PL_CU_FAULT_TARGET */
    int pad;
    long long pos, value, bound, ignore; /* position, bad value, [0, bound), ignore_index */
} pl_cu_fault;

/* Record a fault (device side). */
__device__ __forceinline__ void pl_d_fault(pl_cu_fault *f, int op, int kind, int64_t pos,
                                           int64_t value, int64_t bound, int64_t ignore) {
    if (atomicCAS(&f->set, 0u, 1u) == 0u) {
        f->op = op;
        f->kind = kind;
        f->pos = pos;
        f->value = value;
        f->bound = bound;
        f->ignore = ignore;
    }
}

/* idx[i] when it lies in [0, n), else -1: the kernels that address memory
 * with an index skip the element (the bad index was recorded by
 * pl_cu_check_indices and is reported at the next read). */
__device__ __forceinline__ int64_t pl_d_idx_in(const void *p, int dt, int64_t i, int64_t n) {
    int64_t v = pl_d_idx(p, dt, i);
    return v >= 0 && v < n ? v : -1;
}

/* The process's fault record as kernels address it (created on first use,
 * cudaHostAlloc mapped + portable), or NULL with PL_ERR_DEVICE set. */
pl_cu_fault *pl_cu_fault_record(void);
/* The recorded fault, if any, as PL_ERR_INVALID naming the op and the bad
 * index (or target) and its position, then cleared; PL_OK when there is none.
 * Call only after the device work that may have recorded it has completed
 * (after a synchronous copy to the host or a device synchronize). */
pl_status pl_cu_fault_check(void);

/* Launch the range check of idx (values must lie in [0, n)) for op: an index
 * outside it is recorded (pl_d_fault) and reported by the next
 * pl_cu_fault_check as "OP: index V at position P is out of range [0, n)".
 * Asynchronous: no copy, no allocation. Errors: PL_ERR_DEVICE when the
 * record cannot be created or the launch fails. */
pl_status pl_cu_check_indices(pl_op op, const pl_tensor *idx, int64_t n);

/* pl_backend.fill_random: t (contiguous f32 / bf16 / f16 on its device)
 * filled with pl_init_draw's values for (seed, stream), one launch, no
 * copy. cuda_index.cu. */
pl_status pl_cu_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                            uint64_t stream);

/* The cuBLAS handle of device `dev` (created on first use; legacy default
 * stream, f32 GEMMs without TF32), or NULL with the error set. Borrowed: it
 * lives as long as the process. cuda_matmul.cu. */
cublasHandle_t pl_cu_blas_handle(int dev);
/* "CUBLAS_STATUS_..." for an error message. Static string. */
const char *pl_cu_blas_status(cublasStatus_t s);

/* The kernel table behind the backend's lookup: cuda_backend.cu calls each
 * file's register function once, before the table is handed out. */
void pl_cuda_register_dense(pl_kernel_table *t);     /* cuda_dense.cu: binary, scalar, sum / mean,
                                                        activations, swiglu */
void pl_cuda_register_norm(pl_kernel_table *t);      /* cuda_norm.cu: softmax, losses, norms */
void pl_cuda_register_index(pl_kernel_table *t);     /* cuda_index.cu: embedding, index_select,
                                                        gather, scatter_add, segment_softmax,
                                                        dropout */
void pl_cuda_register_attention(pl_kernel_table *t); /* cuda_attention.cu: rope, causal_softmax */
void pl_cuda_register_copy(pl_kernel_table *t);      /* cuda_copy.cu: copy, reshape, cast,
                                                        permute, slice, concat */
void pl_cuda_register_matmul(pl_kernel_table *t);    /* cuda_matmul.cu: matmul */
void pl_cuda_register_nf4(pl_kernel_table *t);     /* cuda_nf4.cu: nf4_matmul */
void pl_cuda_register_optim(pl_kernel_table *t);   /* cuda_optim.cu: clamp, adamw_step, sgd_step */
void pl_cuda_register_lstm(pl_kernel_table *t);    /* cuda_lstm_native.cu: lstm (cuDNN's or
                                                      the native one) */
#ifdef PL_CUDA_HAVE_CUDNN
/* cuda_lstm.cu: lstm through cuDNN's RNN API, forward / backward (called by
 * cuda_lstm_native.cu's choice) */
pl_status pl_cu_lstm_cudnn_fwd(const pl_kernel_args *a);
pl_status pl_cu_lstm_cudnn_bwd(const pl_kernel_args *a);
#endif
/* cuda_lstm_native.cu: set_option("lstm", auto | cudnn | native) */
pl_status pl_cu_lstm_option(const char *value);

/* ---- the verbs of cuda_backend.cu's pl_backend table (see backend.h) ---- */

/* cuda_memory.cu: devices, memory, transfers */
int cu_device_count(void);
void *cu_raw_alloc(int device, size_t n);
void cu_raw_free(int device, void *p);
pl_status cu_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n);
pl_status cu_memcpy_h2d_background(void *dst, pl_device dd, const void *src, size_t n);
pl_status cu_memset(void *dst, pl_device dev, int v, size_t n);
pl_status cu_sync(int device);
pl_status cu_mem_info(int device, size_t *free_b, size_t *total_b);
void *cu_host_alloc(size_t n);
void cu_host_free(void *p);
/* cuda_memory.cu: graph capture, and fill_random (refused while capturing) */
pl_status cu_capture_begin(int device);
pl_status cu_capture_end(int device, void **graph);
pl_status cu_graph_replay(void *graph);
void cu_graph_release(void *graph);
pl_status cu_fill_random(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                         uint64_t stream);
/* cuda_memory.cu: whether this thread is capturing a graph */
bool pl_cu_capturing(void);
pl_status cu_capture_end_step(int device, pl_step_facts *facts, void **graph);
/* cuda_dense.cu: the fused square + sum over all of x's n elements into o[0]
 * (o NULL: not stored; the squares also into t unless t is NULL), then, when
 * u is not NULL, u[0] = a[0] + the sum (first: sum + a[0]); and its kernel's
 * address */
pl_status pl_cu_sum_squares(const float *x, float *t, float *o, const float *a, float *u, int first,
                            int64_t n);
const void *pl_cu_sum_squares_kernel(void);
/* cuda_fuse.cu: seeing the step (backend.h, capture_end_step). While this
 * thread captures: every kernel call goes through pl_cu_fuse_call (f is the
 * op's kernel), device-to-device copies and memsets through
 * pl_cu_fuse_write; a square (then a square and its sum) may be held back
 * until the next call (fused with a sum of all of it, then an add of that
 * sum); pl_cu_fuse_flush issues what is held back. pl_cu_fuse_begin at
 * capture_begin; pl_cu_fuse_end after cudaStreamEndCapture, before
 * instantiation: drops the store of dead squares from g's fused nodes and
 * fills facts (NULL: capture_end, nothing dropped). pl_cu_fuse_option:
 * set_option("fuse", value). */
void pl_cu_fuse_begin(void);
pl_status pl_cu_fuse_call(pl_kernel_fn f, const pl_kernel_args *a, bool backward);
pl_status pl_cu_fuse_write(void *dst, const void *src, size_t n);
pl_status pl_cu_fuse_flush(void);
pl_status pl_cu_fuse_end(cudaGraph_t g, pl_step_facts *facts);
pl_status pl_cu_fuse_option(const char *value);
/* cuda_matmul.cu: [pipeline] allow_tf32 */
pl_status cu_set_option(const char *key, const char *value);
/* cuda_stats.cu: NVML */
pl_status cu_device_stats(int device, uint64_t *cursor, pl_device_stats *out);

#endif
