/* tensor.h - the one tensor type every stage computes with.
 *
 * A pl_tensor is a typed, shaped view (up to PL_MAX_DIMS dims, row-major) of a
 * reference-counted pl_storage buffer that lives on one device (CPU or
 * cuda:N) and comes from that device's caching allocator (see alloc.h).
 *
 * Views vs copies (the rule every op follows):
 *   - pl_tensor_view_rows()/pl_tensor_narrow(), pl_tensor_reshape() of a
 *     contiguous tensor and pl_tensor_as_strided() are VIEWS: they share the
 *     storage, no bytes move.
 *   - pl_transpose()/pl_permute() in ops.h are explicit COPIES (so every op
 *     kernel sees contiguous row-major memory); pl_contiguous() copies a
 *     strided view into fresh contiguous memory.
 *   - Kernels take contiguous inputs; an op handed a non-contiguous tensor
 *     makes it contiguous first.
 *
 * Reference counting: pl_tensor_retain()/pl_tensor_release() on the tensor
 * header; the header holds one reference on its storage. Functions returning
 * `pl_tensor *` return a NEW reference owned by the caller unless the
 * current thread has an open frame (pl_frame_begin in autograd.h), in which
 * case the frame owns it and releases it at pl_frame_end().
 *
 * NF4 (dtype PL_NF4): 4-bit NormalFloat codes packed two per byte (low nibble
 * first), with one f32 absmax per block of `nf4_block` elements stored in a
 * companion tensor (t->quant.absmax). Only ops that document nf4 support take
 * it; every other op fails with PL_ERR_DTYPE naming the op and the tensor.
 * Source: Dettmers et al. 2023, "QLoRA", and bitsandbytes' NF4 code table.
 */
#ifndef PIPELINE_TENSOR_H
#define PIPELINE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PL_MAX_DIMS 8
#define PL_NAME_MAX 96

typedef enum pl_dtype {
    PL_F32 = 0,
    PL_BF16,
    PL_F16,
    PL_I32,
    PL_I64,
    PL_U8,
    PL_NF4,
    PL_F64, /* host-only helper dtype for tests and reductions */
    PL_DTYPE_COUNT
} pl_dtype;

typedef enum pl_device_type { PL_DEVICE_CPU = 0, PL_DEVICE_CUDA = 1 } pl_device_type;

typedef struct pl_device {
    pl_device_type type;
    int index; /* 0 for cpu; N for cuda:N */
} pl_device;

#define PL_CPU ((pl_device){PL_DEVICE_CPU, 0})

struct pl_backend;

/* Reference-counted buffer. Owned by the allocator of `device`. */
typedef struct pl_storage {
    void *data;
    size_t nbytes;    /* usable bytes (>= what the tensor needs) */
    size_t capacity;  /* bytes of the allocator block */
    pl_device device;
    int refcount;
    bool external;    /* memory not from the allocator (pl_tensor_from_external) */
    void (*external_free)(void *data, void *ctx);
    void *external_ctx;
} pl_storage;

struct pl_node;

/* Quantization state of an nf4 tensor. */
typedef struct pl_quant_state {
    int64_t block;               /* elements per absmax block (64) */
    struct pl_tensor *absmax;    /* f32 [numel/block], or u8 codes if double-quantized */
    struct pl_tensor *absmax_scale; /* f32 [n_absmax/256] when double-quantized, else NULL */
    float absmax_mean;           /* offset subtracted before double quantization */
    pl_dtype orig_dtype;         /* dtype the tensor was quantized from */
} pl_quant_state;

typedef struct pl_tensor {
    pl_dtype dtype;
    int ndim;
    int64_t shape[PL_MAX_DIMS];
    int64_t stride[PL_MAX_DIMS]; /* in elements (nf4: in codes) */
    int64_t offset;              /* in elements from storage->data */
    pl_device device;
    pl_storage *storage;
    int refcount;

    /* autograd */
    bool requires_grad;          /* leaf parameter or result of a recorded op */
    /* How many pl_params lists hold this header (ABI 2.9; kept by
     * pl_params_add / pl_params_replace / pl_params_free; plugins only read
     * it): > 0 marks a parameter, which the tape may cast again in backward
     * instead of keeping its half copy. New headers, views included, start
     * at 0. In the padding after requires_grad: no other field moved. */
    uint16_t param_lists;
    struct pl_tensor *grad;      /* accumulated gradient of a leaf (owned) */
    struct pl_node *grad_fn;     /* node that produced it, NULL for leaves */

    pl_quant_state quant;        /* only for PL_NF4 */
    char name[PL_NAME_MAX];      /* parameter / dataset name for messages */
} pl_tensor;

/* ---- dtype helpers -------------------------------------------------- */

/* Bytes per element (nf4: 0, use pl_dtype_nbytes). */
size_t pl_dtype_size(pl_dtype dt);
/* Bytes needed for `numel` elements of `dt` (nf4: ceil(numel/2)). */
size_t pl_dtype_nbytes(pl_dtype dt, int64_t numel);
/* "f32", "bf16", "f16", "i32", "i64", "u8", "nf4", "f64". Static string. */
const char *pl_dtype_name(pl_dtype dt);
/* Parse a dtype name (also accepts "float32", "bfloat16", "float16",
 * "int32", "int64", "uint8"). Returns PL_ERR_INVALID on unknown names. */
pl_status pl_dtype_parse(const char *s, pl_dtype *out);
bool pl_dtype_is_float(pl_dtype dt);

/* f32 <-> bf16 with round-to-nearest-even (NaN stays NaN), f32 <-> f16 (IEEE
 * binary16, round-to-nearest-even, overflow to inf, subnormals kept). */
uint16_t pl_f32_to_bf16(float f);
float pl_bf16_to_f32(uint16_t h);
uint16_t pl_f32_to_f16(float f);
float pl_f16_to_f32(uint16_t h);

/* Device helpers. pl_device_str writes "cpu", or "<backend>:N" for the
 * accelerator slot, <backend> being the loaded backend's name ("cuda:0",
 * "strict:0"; "cuda" when none is loaded). pl_device_parse accepts "cpu",
 * "auto" (accelerator 0 if a backend is loaded and sees a device, else cpu)
 * and "NAME" or "NAME:N" where NAME is the name of the backend holding the
 * accelerator slot ("cuda", "strict"; N defaults to 0). A malformed string:
 * PL_ERR_INVALID; a NAME that is not the loaded backend, or none loaded:
 * PL_ERR_DEVICE naming both. Neither function touches the error state on
 * success. */
const char *pl_device_str(pl_device d, char *buf, size_t n);
pl_status pl_device_parse(const char *s, pl_device *out);
bool pl_device_eq(pl_device a, pl_device b);

/* ---- creation ------------------------------------------------------- */

/* New contiguous tensor, contents uninitialized. NULL on error (bad shape,
 * out of memory, no backend for device). Owned per the rule above. */
pl_tensor *pl_tensor_empty(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
pl_tensor *pl_tensor_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
pl_tensor *pl_tensor_full(pl_dtype dt, int ndim, const int64_t *shape, double value,
                          pl_device dev);
/* Owned variants: the same tensor as pl_tensor_empty()/pl_tensor_zeros()
 * (contiguous, `ndim` dims of `shape`, dtype `dt`, on `dev`; zeros: every
 * element 0, nf4 codes 0), but NEVER adopted by an open frame, whatever frame
 * is open: the caller holds the only reference and releases it with
 * pl_tensor_release(). For state that outlives a batch (a loader's batch
 * buffers, an optimizer's moments) created while the trainer has a frame
 * open. requires_grad is false, name "".
 * Errors (NULL returned, thread error set): PL_ERR_DTYPE (invalid dtype),
 * PL_ERR_SHAPE (ndim outside [0, PL_MAX_DIMS] or a negative size),
 * PL_ERR_NOMEM, PL_ERR_DEVICE / PL_ERR_UNSUPPORTED (no backend for dev). */
pl_tensor *pl_tensor_empty_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
pl_tensor *pl_tensor_zeros_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev);
/* Same shape/dtype/device as `like`. */
pl_tensor *pl_tensor_empty_like(const pl_tensor *like);
pl_tensor *pl_tensor_zeros_like(const pl_tensor *like);
/* Copy `numel` host values of type `dt` into a new tensor on `dev`. */
pl_tensor *pl_tensor_from_data(pl_dtype dt, int ndim, const int64_t *shape, const void *data,
                               pl_device dev);
/* Wrap memory the caller owns (CPU only). `free_fn(data, ctx)` is called when
 * the last reference goes (may be NULL). */
pl_tensor *pl_tensor_from_external(pl_dtype dt, int ndim, const int64_t *shape, void *data,
                                   void (*free_fn)(void *, void *), void *ctx);
/* Scalar convenience: 0-dim f32 tensor. */
pl_tensor *pl_tensor_scalar(float v, pl_device dev);

/* Shorthand for shapes: PL_SHAPE(2, 3) -> (int64_t[]){2, 3}, 2 */
#define PL_SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* ---- reference counting --------------------------------------------- */

pl_tensor *pl_tensor_retain(pl_tensor *t); /* returns t; NULL-safe */
void pl_tensor_release(pl_tensor *t);      /* NULL-safe */

/* ---- queries -------------------------------------------------------- */

int64_t pl_tensor_numel(const pl_tensor *t);
size_t pl_tensor_nbytes(const pl_tensor *t);  /* numel bytes of the view */
/* What the tensor costs in memory: pl_tensor_nbytes, plus for an NF4 tensor
 * its quantization state (absmax, absmax_scale, the mean: nf4.h's
 * pl_nf4_state_nbytes). The parameter storage summary.json reports
 * (frozen / trainable bytes) is the sum of this over the parameters, so no
 * caller special-cases a quantized dtype. (ABI 2.7) */
size_t pl_tensor_storage_nbytes(const pl_tensor *t);
bool pl_tensor_is_contiguous(const pl_tensor *t);
bool pl_tensor_same_shape(const pl_tensor *a, const pl_tensor *b);
/* True for a tape stub (autograd.h, "What the tape keeps"): a header the
 * autograd tape keeps in place of an op input whose data the op's backward
 * does not read. Shape, strides, dtype, device, name, requires_grad and
 * grad_fn are the input's; it holds no data: its data pointer is a host page
 * that no one may read or write (PROT_NONE; a read is a SIGSEGV on the CPU,
 * an illegal address on a GPU). A backend that validates or maps the
 * tensors handed to a kernel skips stubs. */
bool pl_tensor_is_stub(const pl_tensor *t);
/* Pointer to the first element of the view (device memory for CUDA). */
void *pl_tensor_data(const pl_tensor *t);
/* Typed host pointer; NULL (with error) if not CPU or dtype differs. */
float *pl_tensor_f32(const pl_tensor *t);
int64_t *pl_tensor_i64(const pl_tensor *t);
int32_t *pl_tensor_i32(const pl_tensor *t);
uint8_t *pl_tensor_u8(const pl_tensor *t);
/* Normalize a possibly negative dim; -1 if out of range. */
int pl_tensor_dim(const pl_tensor *t, int dim);
/* "f32[32, 50, 64] cpu 'model.layers.0.q_proj.weight'" into buf. */
const char *pl_tensor_describe(const pl_tensor *t, char *buf, size_t n);
void pl_tensor_set_name(pl_tensor *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Read element i (row-major logical index) as double (any dtype but nf4, CPU). */
double pl_tensor_get(const pl_tensor *t, int64_t i);
/* Single scalar value of a 1-element tensor, copied to host. NaN on error. */
double pl_tensor_item(const pl_tensor *t);

/* ---- views (share storage, no copy) ----------------------------------- */

/* Rows [start, start+len) along dim 0. Contiguous if `t` is. */
pl_tensor *pl_tensor_view_rows(pl_tensor *t, int64_t start, int64_t len);
/* Elements [start, start+len) along `dim` (strided view). */
pl_tensor *pl_tensor_narrow(pl_tensor *t, int dim, int64_t start, int64_t len);
/* View with a new shape; `t` must be contiguous; one entry may be -1. */
pl_tensor *pl_tensor_reshape(pl_tensor *t, int ndim, const int64_t *shape);
/* Arbitrary strided view (e.g. overlapping windows: stride[0] = F). Bounds
 * are checked against the storage. */
pl_tensor *pl_tensor_as_strided(pl_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *stride, int64_t offset);

/* ---- copies and conversion ------------------------------------------ */

/* Copy `src` into `dst` (same shape; dtype conversion f32/bf16/f16/f64 and
 * between integer types; devices may differ). Handles strided views. */
pl_status pl_tensor_copy_(pl_tensor *dst, const pl_tensor *src);
/* New contiguous tensor on `dev` with dtype `dt` (no autograd). */
pl_tensor *pl_tensor_to(const pl_tensor *t, pl_dtype dt, pl_device dev);
/* Fill every element with `value` (any non-nf4 dtype). */
pl_status pl_tensor_fill_(pl_tensor *t, double value);

/* ---- random init (counter-based, same result on any thread count) ----- */

/* Counter-based Philox4x32-10 stream: element i of a tensor filled with
 * (seed, stream) is a function of (seed, stream, i) only. */
pl_status pl_tensor_uniform_(pl_tensor *t, double lo, double hi, uint64_t seed, uint64_t stream);
pl_status pl_tensor_normal_(pl_tensor *t, double mean, double std, uint64_t seed,
                            uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif
