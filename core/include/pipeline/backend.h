/* backend.h - the per-device backend vtable and the op kernel table.
 *
 * A backend fills one pl_backend: raw memory (alloc/free/copy/memset/sync)
 * and one forward and one backward kernel per op (indexed by pl_op). The CPU
 * backend is built into the core and implements every op; a CUDA backend is a
 * plugin .so (kind PL_KIND_BACKEND) whose vtable is a pl_backend, registered
 * with pl_backend_register(). Ops dispatch on the device of their inputs;
 * a NULL kernel means "not supported on this backend" and the op fails with
 * PL_ERR_UNSUPPORTED naming the op and backend (ggml's supports_op idea).
 *
 * Kernel calling convention (pl_kernel_args):
 *   forward : in[0..n_in) are the op's inputs (contiguous), out[0] is the
 *             preallocated output, out[1..] extra outputs saved for backward
 *             (e.g. layer_norm mean/rstd, dropout mask); p holds parameters.
 *   backward: in[0] = grad of the output, in[1..] = the op's inputs followed
 *             by its saved tensors (in that order); out[i] = grad of input i,
 *             preallocated with that input's shape, or NULL when input i needs
 *             no gradient. Backward kernels OVERWRITE out[i] (the autograd
 *             engine does the accumulation).
 */
#ifndef PIPELINE_BACKEND_H
#define PIPELINE_BACKEND_H

#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every op the tensor interface knows. Keep in sync with pl_op_name(). */
typedef enum pl_op {
    PL_OP_NONE = 0,
    PL_OP_COPY,          /* strided -> contiguous copy / dtype cast */
    PL_OP_MATMUL,        /* p.flags: bit0 trans_a, bit1 trans_b */
    PL_OP_ADD,
    PL_OP_SUB,
    PL_OP_MUL,
    PL_OP_DIV,
    PL_OP_SCALE,         /* p.alpha */
    PL_OP_ADD_SCALAR,    /* p.alpha */
    PL_OP_SUM,           /* p.dim, p.flags bit0 keepdim; p.dim = PL_ALL_DIMS for all */
    PL_OP_MEAN,
    PL_OP_RELU,
    PL_OP_LEAKY_RELU,    /* p.alpha = negative slope */
    PL_OP_ELU,           /* p.alpha */
    PL_OP_GELU,          /* p.flags bit0: tanh approximation */
    PL_OP_SILU,
    PL_OP_SIGMOID,
    PL_OP_TANH,
    PL_OP_EXP,
    PL_OP_LOG,
    PL_OP_SQUARE,
    PL_OP_SQRT,
    PL_OP_SOFTMAX,       /* last dim */
    PL_OP_LOG_SOFTMAX,   /* last dim */
    PL_OP_CROSS_ENTROPY, /* p.ignore_index, p.alpha = label_smoothing */
    PL_OP_MSE,
    PL_OP_MAE,
    PL_OP_HUBER,         /* p.alpha = delta */
    PL_OP_EMBEDDING,
    PL_OP_INDEX_SELECT,  /* p.dim */
    PL_OP_GATHER,        /* p.dim */
    PL_OP_SCATTER_ADD,   /* p.dim, p.shape[0] = size of output along dim */
    PL_OP_SEGMENT_SOFTMAX, /* p.num_segments */
    PL_OP_LAYER_NORM,    /* p.eps */
    PL_OP_RMS_NORM,      /* p.eps */
    PL_OP_DROPOUT,       /* p.alpha = p, p.seed, p.counter */
    PL_OP_CONCAT,        /* p.dim */
    PL_OP_SLICE,         /* p.dim, p.start, p.end */
    PL_OP_PERMUTE,       /* p.perm[] */
    PL_OP_RESHAPE,
    PL_OP_ROPE,          /* p.alpha = theta, p.start = position offset */
    PL_OP_CAUSAL_SOFTMAX, /* p.alpha = scale applied before masking */
    PL_OP_CAST,          /* dtype conversion with autograd (f32 <-> bf16/f16) */
    PL_OP_NF4_MATMUL,    /* x[.., K] @ dequant(W nf4 [N, K])^T, W frozen */
    PL_OP_LSTM,          /* fused LSTM layer (see ops.h) */
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

typedef struct pl_backend {
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
    pl_kernel_fn forward[PL_OP_COUNT];
    pl_kernel_fn backward[PL_OP_COUNT];
} pl_backend;

/* Register a backend for its device type (the CPU backend is registered by
 * the core). The table is borrowed and must outlive the process. */
pl_status pl_backend_register(const pl_backend *b);
/* Backend for a device type, or NULL (with error set) if none is loaded. */
const pl_backend *pl_backend_get(pl_device_type type);
/* The built-in CPU backend. */
const pl_backend *pl_backend_cpu(void);
/* "matmul", "softmax", ... Static string. */
const char *pl_op_name(pl_op op);

#ifdef __cplusplus
}
#endif
#endif
