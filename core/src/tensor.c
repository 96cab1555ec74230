/* tensor.c - tensor headers, storage, views, copies, conversions, init. */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- dtypes ---------------------------------------------------------- */

static const struct {
    const char *name, *alt;
    size_t size;
} g_dtypes[PL_DTYPE_COUNT] = {
    [PL_F32] = {"f32", "float32", 4}, [PL_BF16] = {"bf16", "bfloat16", 2},
    [PL_F16] = {"f16", "float16", 2}, [PL_I32] = {"i32", "int32", 4},
    [PL_I64] = {"i64", "int64", 8},   [PL_U8] = {"u8", "uint8", 1},
    [PL_NF4] = {"nf4", "nf4", 0},     [PL_F64] = {"f64", "float64", 8},
};

size_t pl_dtype_size(pl_dtype dt) { return (unsigned)dt < PL_DTYPE_COUNT ? g_dtypes[dt].size : 0; }
const char *pl_dtype_name(pl_dtype dt) {
    return (unsigned)dt < PL_DTYPE_COUNT ? g_dtypes[dt].name : "?";
}
size_t pl_dtype_nbytes(pl_dtype dt, int64_t numel) {
    if (dt == PL_NF4) return (size_t)((numel + 1) / 2);
    return (size_t)numel * pl_dtype_size(dt);
}
bool pl_dtype_is_float(pl_dtype dt) {
    return dt == PL_F32 || dt == PL_BF16 || dt == PL_F16 || dt == PL_F64;
}
pl_status pl_dtype_parse(const char *s, pl_dtype *out) {
    for (int i = 0; i < PL_DTYPE_COUNT; i++)
        if (!strcmp(s, g_dtypes[i].name) || !strcmp(s, g_dtypes[i].alt)) {
            *out = (pl_dtype)i;
            return PL_OK;
        }
    return pl_error_set(PL_ERR_INVALID,
                        "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u8, nf4, f64)", s);
}

/* RNE, NaN stays a quiet NaN: the bits every backend uses (kernel_math.h) */
uint16_t pl_f32_to_bf16(float f) {
    return pl_bf16_round(f);
}
float pl_bf16_to_f32(uint16_t h) {
    return pl_bf16_widen(h);
}
uint16_t pl_f32_to_f16(float f) {
    return pl_f16_round(f); /* IEEE binary16, RNE */
}
float pl_f16_to_f32(uint16_t u) {
    return pl_f16_widen(u);
}

/* ---- devices ----------------------------------------------------------- */

const char *pl_device_str(pl_device d, char *buf, size_t n) {
    const pl_backend *b = d.type == PL_DEVICE_CPU ? NULL : pl_backend_peek(d.type);
    if (d.type == PL_DEVICE_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "%s:%d", b && b->name ? b->name : "cuda", d.index);
    return buf;
}
bool pl_device_eq(pl_device a, pl_device b) { return a.type == b.type && a.index == b.index; }

pl_status pl_device_spec(const char *s, char *name, size_t n, int *index) {
    size_t ln = strcspn(s, ":");
    long idx = 0;
    char *end = NULL;
    bool ok = ln > 0 && ln < n && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_") == ln;
    if (ok) {
        memcpy(name, s, ln);
        name[ln] = 0;
    }
    if (ok && s[ln] == ':') { /* an index, but not for cpu or auto */
        errno = 0;
        idx = strtol(s + ln + 1, &end, 10);
        ok = end != s + ln + 1 && !*end && errno == 0 && idx >= 0 && idx <= INT32_MAX &&
             strcmp(name, "cpu") != 0 && strcmp(name, "auto") != 0;
    }
    if (!ok)
        return pl_error_set(PL_ERR_INVALID, "bad device '%s' (expected cpu, auto, a backend name "
                            "such as cuda or strict, or NAME:N)", s);
    *index = (int)idx;
    return PL_OK;
}

pl_status pl_device_parse(const char *s, pl_device *out) {
    char name[64];
    int idx;
    if (pl_device_spec(s, name, sizeof name, &idx)) return pl_error_status();
    if (!strcmp(name, "cpu")) {
        *out = PL_CPU;
        return PL_OK;
    }
    const pl_backend *b = pl_backend_peek(PL_DEVICE_CUDA);
    if (!strcmp(name, "auto")) {
        *out = (b && b->device_count && b->device_count() > 0) ? (pl_device){PL_DEVICE_CUDA, 0}
                                                                : PL_CPU;
        return PL_OK;
    }
    /* NAME[:N]: the backend of that name must be the one holding the accelerator slot */
    if (!b)
        return pl_error_set(PL_ERR_DEVICE,
                            "device '%s' requested but no backend plugin is loaded for it", s);
    if (strcmp(b->name, name) != 0)
        return pl_error_set(PL_ERR_DEVICE,
                            "device '%s' requested but the accelerator backend loaded in this "
                            "process is '%s'",
                            s, b->name);
    *out = (pl_device){PL_DEVICE_CUDA, idx};
    return PL_OK;
}

/* ---- storage and headers --------------------------------------------- */

static pl_storage *storage_new(pl_device dev, size_t nbytes) {
    pl_storage *s = calloc(1, sizeof *s);
    if (!s) {
        pl_error_set(PL_ERR_NOMEM, "out of memory (storage header)");
        return NULL;
    }
    s->data = pl_alloc(dev, nbytes, &s->capacity);
    if (!s->data) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->device = dev;
    s->refcount = 1;
    return s;
}

static void storage_release(pl_storage *s) {
    if (!s || --s->refcount > 0) return;
    if (s->external) {
        if (s->external_free) s->external_free(s->data, s->external_ctx);
    } else {
        pl_free(s->device, s->data, s->capacity);
    }
    free(s);
}

/* Tensor headers come from a small free list so steady-state ops do not
 * hit malloc for them. */
static _Thread_local pl_tensor *tl_header_pool[256];
static _Thread_local int tl_header_n;

static pl_tensor *header_new(void) {
    pl_tensor *t = tl_header_n ? tl_header_pool[--tl_header_n] : malloc(sizeof *t);
    if (!t) {
        pl_error_set(PL_ERR_NOMEM, "out of memory (tensor header)");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->refcount = 1;
    return t;
}

static void header_free(pl_tensor *t) {
    if (tl_header_n < 256)
        tl_header_pool[tl_header_n++] = t;
    else
        free(t);
}

static void set_contiguous_strides(pl_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static pl_status check_shape(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > PL_MAX_DIMS)
        return pl_error_set(PL_ERR_SHAPE, "tensor rank %d out of range [0, %d]", ndim, PL_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return pl_error_set(PL_ERR_SHAPE, "negative size %lld in dim %d", (long long)shape[i], i);
    return PL_OK;
}

pl_tensor *pl_tensor_new_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    if ((unsigned)dt >= PL_DTYPE_COUNT) {
        pl_error_set(PL_ERR_DTYPE, "invalid dtype %d", (int)dt);
        return NULL;
    }
    if (check_shape(ndim, shape)) return NULL;
    pl_tensor *t = header_new();
    if (!t) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    set_contiguous_strides(t);
    t->device = dev;
    t->storage = storage_new(dev, pl_dtype_nbytes(dt, pl_tensor_numel(t)));
    if (!t->storage) {
        header_free(t);
        return NULL;
    }
    return t;
}

pl_tensor *pl_tensor_new_owned_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (t && pl_tensor_fill_(t, 0.0)) {
        pl_tensor_release(t);
        return NULL;
    }
    return t;
}

pl_tensor *pl_op_result(pl_tensor *t) {
    if (t) pl_frame_adopt(t);
    return t;
}

pl_tensor *pl_tensor_view_owned(pl_tensor *t) {
    pl_tensor *v = header_new();
    if (!v) return NULL;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    memcpy(v->stride, t->stride, sizeof v->stride);
    v->offset = t->offset;
    v->device = t->device;
    v->storage = t->storage;
    v->storage->refcount++;
    v->quant = t->quant;
    if (v->quant.absmax) pl_tensor_retain(v->quant.absmax);
    if (v->quant.absmax_scale) pl_tensor_retain(v->quant.absmax_scale);
    memcpy(v->name, t->name, sizeof v->name);
    return v;
}

/* ---- tape stubs (tape.c: what the tape keeps) ---- */

static void *g_stub_page; /* one PROT_NONE page: every stub's data */
static pl_storage g_stub_storage = {.external = true, .refcount = 1 << 30};
static pthread_once_t g_stub_once = PTHREAD_ONCE_INIT;

static void stub_init(void) {
    long pg = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, (size_t)(pg > 0 ? pg : 4096), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    g_stub_page = p == MAP_FAILED ? NULL : p;
    g_stub_storage.data = g_stub_page;
}

bool pl_tensor_is_stub(const pl_tensor *t) { return t && t->storage == &g_stub_storage; }

bool pl_tensor_is_param(const pl_tensor *t) { return t && t->param_lists > 0; }

pl_tensor *pl_tensor_stub_owned(const pl_tensor *t) {
    pthread_once(&g_stub_once, stub_init);
    if (!g_stub_page) {
        pl_error_set(PL_ERR_NOMEM, "tape stub: mmap of a guard page failed");
        return NULL;
    }
    pl_tensor *v = header_new();
    if (!v) return NULL;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    memcpy(v->stride, t->stride, sizeof v->stride);
    v->offset = 0;
    v->device = t->device;
    /* shared by every stub; never freed (its refcount cannot reach 0: the
     * count is only ever a few million references at most) */
    v->storage = &g_stub_storage;
    __atomic_add_fetch(&g_stub_storage.refcount, 1, __ATOMIC_RELAXED);
    v->requires_grad = t->requires_grad;
    v->grad_fn = t->grad_fn;
    v->quant.block = t->quant.block;
    v->quant.orig_dtype = t->quant.orig_dtype;
    memcpy(v->name, t->name, sizeof v->name);
    return v;
}

pl_tensor *pl_tensor_empty_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_tensor_new_owned(dt, ndim, shape, dev);
}
pl_tensor *pl_tensor_zeros_owned(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_tensor_new_owned_zeros(dt, ndim, shape, dev);
}

pl_tensor *pl_tensor_empty(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_op_result(pl_tensor_new_owned(dt, ndim, shape, dev));
}
pl_tensor *pl_tensor_zeros(pl_dtype dt, int ndim, const int64_t *shape, pl_device dev) {
    return pl_op_result(pl_tensor_new_owned_zeros(dt, ndim, shape, dev));
}
pl_tensor *pl_tensor_full(pl_dtype dt, int ndim, const int64_t *shape, double value,
                          pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (t && pl_tensor_fill_(t, value)) {
        pl_tensor_release(t);
        return NULL;
    }
    return pl_op_result(t);
}
pl_tensor *pl_tensor_empty_like(const pl_tensor *like) {
    if (!like) return NULL;
    return pl_tensor_empty(like->dtype, like->ndim, like->shape, like->device);
}
pl_tensor *pl_tensor_zeros_like(const pl_tensor *like) {
    if (!like) return NULL;
    return pl_tensor_zeros(like->dtype, like->ndim, like->shape, like->device);
}
pl_tensor *pl_tensor_scalar(float v, pl_device dev) {
    return pl_tensor_full(PL_F32, 0, NULL, v, dev);
}

pl_tensor *pl_tensor_from_data(pl_dtype dt, int ndim, const int64_t *shape, const void *data,
                               pl_device dev) {
    pl_tensor *t = pl_tensor_new_owned(dt, ndim, shape, dev);
    if (!t) return NULL;
    size_t nb = pl_tensor_nbytes(t);
    if (dev.type == PL_DEVICE_CPU) {
        if (nb) memcpy(t->storage->data, data, nb);
    } else {
        const pl_backend *b = pl_backend_get(dev.type);
        if (!b || b->memcpy(t->storage->data, dev, data, PL_CPU, nb)) {
            pl_tensor_release(t);
            return NULL;
        }
    }
    return pl_op_result(t);
}

pl_tensor *pl_tensor_from_external(pl_dtype dt, int ndim, const int64_t *shape, void *data,
                                   void (*free_fn)(void *, void *), void *ctx) {
    if (check_shape(ndim, shape)) return NULL;
    pl_tensor *t = header_new();
    if (!t) return NULL;
    pl_storage *s = calloc(1, sizeof *s);
    if (!s) {
        header_free(t);
        pl_error_set(PL_ERR_NOMEM, "out of memory (storage header)");
        return NULL;
    }
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    set_contiguous_strides(t);
    t->device = PL_CPU;
    s->data = data;
    s->nbytes = s->capacity = pl_dtype_nbytes(dt, pl_tensor_numel(t));
    s->device = PL_CPU;
    s->refcount = 1;
    s->external = true;
    s->external_free = free_fn;
    s->external_ctx = ctx;
    t->storage = s;
    return pl_op_result(t);
}

pl_tensor *pl_tensor_retain(pl_tensor *t) {
    if (t) t->refcount++;
    return t;
}

void pl_tensor_release(pl_tensor *t) {
    if (!t || --t->refcount > 0) return;
    if (t->storage == &g_stub_storage) { /* a stub: its node outlives it, nothing to forget */
        __atomic_sub_fetch(&g_stub_storage.refcount, 1, __ATOMIC_RELAXED);
        header_free(t);
        return;
    }
    if (t->grad_fn) pl_autograd_forget_out(t);
    storage_release(t->storage);
    pl_tensor_release(t->grad);
    pl_tensor_release(t->quant.absmax);
    pl_tensor_release(t->quant.absmax_scale);
    header_free(t);
}

/* ---- queries ------------------------------------------------------------ */

int64_t pl_tensor_numel(const pl_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
size_t pl_tensor_nbytes(const pl_tensor *t) { return pl_dtype_nbytes(t->dtype, pl_tensor_numel(t)); }

size_t pl_tensor_storage_nbytes(const pl_tensor *t) {
    if (!t) return 0;
    return t->dtype == PL_NF4 ? pl_nf4_code_nbytes(t) + pl_nf4_state_nbytes(t) : pl_tensor_nbytes(t);
}

bool pl_tensor_is_contiguous(const pl_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool pl_tensor_same_shape(const pl_tensor *a, const pl_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

void *pl_tensor_data(const pl_tensor *t) {
    if (!t) return NULL;
    if (t->dtype == PL_NF4) return (uint8_t *)t->storage->data + t->offset / 2;
    return (char *)t->storage->data + (size_t)t->offset * pl_dtype_size(t->dtype);
}

static void *typed_ptr(const pl_tensor *t, pl_dtype want) {
    char buf[256];
    if (!t) return NULL;
    if (t->dtype != want || t->device.type != PL_DEVICE_CPU) {
        pl_error_set(PL_ERR_DTYPE, "expected a %s tensor on cpu, found %s", pl_dtype_name(want),
                     pl_tensor_describe(t, buf, sizeof buf));
        return NULL;
    }
    return pl_tensor_data(t);
}
float *pl_tensor_f32(const pl_tensor *t) { return typed_ptr(t, PL_F32); }
int64_t *pl_tensor_i64(const pl_tensor *t) { return typed_ptr(t, PL_I64); }
int32_t *pl_tensor_i32(const pl_tensor *t) { return typed_ptr(t, PL_I32); }
uint8_t *pl_tensor_u8(const pl_tensor *t) { return typed_ptr(t, PL_U8); }

int pl_tensor_dim(const pl_tensor *t, int dim) {
    int d = dim < 0 ? dim + t->ndim : dim;
    return (d < 0 || d >= t->ndim) ? -1 : d;
}

const char *pl_tensor_describe(const pl_tensor *t, char *buf, size_t n) {
    if (!t) {
        snprintf(buf, n, "(null)");
        return buf;
    }
    size_t k = (size_t)snprintf(buf, n, "%s[", pl_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    char dev[32];
    if (k < n)
        k += (size_t)snprintf(buf + k, n - k, "] %s", pl_device_str(t->device, dev, sizeof dev));
    if (t->name[0] && k < n) snprintf(buf + k, n - k, " '%s'", t->name);
    return buf;
}

void pl_tensor_set_name(pl_tensor *t, const char *fmt, ...) {
    if (!t) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
}

/* Storage offset (elements) of logical row-major index i. */
static int64_t strided_offset(const pl_tensor *t, int64_t i) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t sz = t->shape[d];
        off += (i % sz) * t->stride[d];
        i /= sz;
    }
    return off;
}

static double load_elem(const void *base, pl_dtype dt, int64_t off) {
    switch (dt) {
    case PL_F32: return ((const float *)base)[off];
    case PL_F64: return ((const double *)base)[off];
    case PL_BF16: return pl_bf16_to_f32(((const uint16_t *)base)[off]);
    case PL_F16: return pl_f16_to_f32(((const uint16_t *)base)[off]);
    case PL_I32: return ((const int32_t *)base)[off];
    case PL_I64: return (double)((const int64_t *)base)[off];
    case PL_U8: return ((const uint8_t *)base)[off];
    default: return NAN;
    }
}

static void store_elem(void *base, pl_dtype dt, int64_t off, double v) {
    switch (dt) {
    case PL_F32: ((float *)base)[off] = (float)v; break;
    case PL_F64: ((double *)base)[off] = v; break;
    case PL_BF16: ((uint16_t *)base)[off] = pl_f32_to_bf16((float)v); break;
    case PL_F16: ((uint16_t *)base)[off] = pl_f32_to_f16((float)v); break;
    case PL_I32: ((int32_t *)base)[off] = (int32_t)v; break;
    case PL_I64: ((int64_t *)base)[off] = (int64_t)v; break;
    case PL_U8: ((uint8_t *)base)[off] = (uint8_t)v; break;
    default: break;
    }
}

double pl_tensor_get(const pl_tensor *t, int64_t i) {
    if (!t || t->dtype == PL_NF4 || t->device.type != PL_DEVICE_CPU) return NAN;
    return load_elem(t->storage->data, t->dtype, strided_offset(t, i));
}

double pl_tensor_item(const pl_tensor *t) {
    if (!t || pl_tensor_numel(t) != 1) {
        pl_error_set(PL_ERR_SHAPE, "item() needs a 1-element tensor");
        return NAN;
    }
    if (t->device.type == PL_DEVICE_CPU) return pl_tensor_get(t, 0);
    /* owned, not adopted by the open frame (pl_tensor_to's result would be) */
    pl_tensor *h = pl_tensor_new_owned(PL_F64, t->ndim, t->shape, PL_CPU);
    double v = h && !pl_tensor_copy_(h, t) ? ((double *)pl_tensor_data(h))[0] : NAN;
    pl_tensor_release(h);
    return v;
}

/* ---- views ---------------------------------------------------------------- */

static pl_status check_view_bounds(const pl_tensor *v) {
    /* every reachable element must lie inside the storage */
    int64_t lo = v->offset, hi = v->offset;
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] == 0) return PL_OK;
        int64_t span = (v->shape[i] - 1) * v->stride[i];
        if (span < 0) lo += span; else hi += span;
    }
    int64_t cap = v->dtype == PL_NF4 ? (int64_t)v->storage->nbytes * 2
                                      : (int64_t)(v->storage->nbytes / pl_dtype_size(v->dtype));
    if (lo < 0 || hi >= cap)
        return pl_error_set(PL_ERR_SHAPE, "view [%lld, %lld] outside storage of %lld elements",
                            (long long)lo, (long long)hi, (long long)cap);
    return PL_OK;
}

pl_tensor *pl_tensor_view_rows(pl_tensor *t, int64_t start, int64_t len) {
    if (!t) return NULL;
    return pl_tensor_narrow(t, 0, start, len);
}

pl_tensor *pl_tensor_narrow(pl_tensor *t, int dim, int64_t start, int64_t len) {
    if (!t) return NULL;
    int d = pl_tensor_dim(t, dim);
    if (d < 0 || start < 0 || len < 0 || start + len > t->shape[d]) {
        char buf[256];
        pl_error_set(PL_ERR_SHAPE, "narrow(dim %d, start %lld, len %lld) out of range for %s", dim,
                     (long long)start, (long long)len, pl_tensor_describe(t, buf, sizeof buf));
        return NULL;
    }
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->offset += start * t->stride[d];
    v->shape[d] = len;
    return pl_op_result(v);
}

static pl_status infer_reshape(const pl_tensor *t, int ndim, const int64_t *shape, int64_t *out) {
    int64_t numel = pl_tensor_numel(t), known = 1;
    int infer = -1;
    if (ndim < 0 || ndim > PL_MAX_DIMS) return pl_error_set(PL_ERR_SHAPE, "reshape: bad rank %d", ndim);
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return pl_error_set(PL_ERR_SHAPE, "reshape: more than one -1");
            infer = i;
        } else
            known *= shape[i];
    }
    if (infer >= 0) out[infer] = known ? numel / known : 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= out[i];
    if (n != numel) {
        char buf[256];
        return pl_error_set(PL_ERR_SHAPE, "reshape: %lld elements cannot become %lld (%s)",
                            (long long)numel, (long long)n, pl_tensor_describe(t, buf, sizeof buf));
    }
    return PL_OK;
}

pl_tensor *pl_tensor_reshape(pl_tensor *t, int ndim, const int64_t *shape) {
    if (!t) return NULL;
    if (!pl_tensor_is_contiguous(t)) {
        pl_error_set(PL_ERR_SHAPE, "reshape of a non-contiguous view; call pl_contiguous first");
        return NULL;
    }
    int64_t sh[PL_MAX_DIMS];
    if (infer_reshape(t, ndim, shape, sh)) return NULL;
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->ndim = ndim;
    memcpy(v->shape, sh, sizeof(int64_t) * (size_t)ndim);
    set_contiguous_strides(v);
    return pl_op_result(v);
}

pl_tensor *pl_tensor_as_strided(pl_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *stride, int64_t offset) {
    if (!t) return NULL;
    if (check_shape(ndim, shape)) return NULL;
    pl_tensor *v = pl_tensor_view_owned(t);
    if (!v) return NULL;
    v->ndim = ndim;
    memcpy(v->shape, shape, sizeof(int64_t) * (size_t)ndim);
    memcpy(v->stride, stride, sizeof(int64_t) * (size_t)ndim);
    v->offset = offset;
    if (check_view_bounds(v)) {
        pl_tensor_release(v);
        return NULL;
    }
    return pl_op_result(v);
}

/* ---- copy / convert ----------------------------------------------------- */

/* Contiguous-to-contiguous conversion loop over n elements (CPU). */
static void convert_contig(void *dst, pl_dtype dd, const void *src, pl_dtype sd, int64_t n) {
    if (dd == sd) {
        memcpy(dst, src, pl_dtype_nbytes(dd, n));
        return;
    }
    if (sd == PL_F32 && dd == PL_BF16) {
        const float *s = src;
        uint16_t *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_f32_to_bf16(s[i]);
        return;
    }
    if (sd == PL_BF16 && dd == PL_F32) {
        const uint16_t *s = src;
        float *d = dst;
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = pl_bf16_to_f32(s[i]);
        return;
    }
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) store_elem(dst, dd, i, load_elem(src, sd, i));
}

/* PL_OP_COPY forward kernel: out[0] (contiguous) <- in[0] (any strides). */
static pl_status cpu_copy_forward(const pl_kernel_args *a) {
    const pl_tensor *src = a->in[0];
    pl_tensor *dst = a->out[0];
    int64_t n = pl_tensor_numel(src);
    if (pl_tensor_is_contiguous(src)) {
        convert_contig(pl_tensor_data(dst), dst->dtype, pl_tensor_data(src), src->dtype, n);
        return PL_OK;
    }
    const void *sb = src->storage->data;
    void *db = pl_tensor_data(dst);
    /* fast path: innermost dim contiguous, same dtype */
    int nd = src->ndim;
    if (src->dtype == dst->dtype && nd > 0 && src->stride[nd - 1] == 1) {
        int64_t inner = src->shape[nd - 1], rows = n / (inner ? inner : 1);
        size_t es = pl_dtype_size(src->dtype);
#pragma omp parallel for if (n > 65536) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t off = strided_offset(src, r * inner);
            memcpy((char *)db + (size_t)(r * inner) * es, (const char *)sb + (size_t)off * es,
                   (size_t)inner * es);
        }
        return PL_OK;
    }
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        store_elem(db, dst->dtype, i, load_elem(sb, src->dtype, strided_offset(src, i)));
    return PL_OK;
}

pl_status pl_tensor_copy_(pl_tensor *dst, const pl_tensor *src) {
    char b1[256], b2[256];
    if (!dst || !src) return pl_error_set(PL_ERR_INVALID, "copy: NULL tensor");
    if (pl_tensor_numel(dst) != pl_tensor_numel(src))
        return pl_error_set(PL_ERR_SHAPE, "copy: %s <- %s: element counts differ",
                            pl_tensor_describe(dst, b1, sizeof b1),
                            pl_tensor_describe(src, b2, sizeof b2));
    if (dst->dtype == PL_NF4 || src->dtype == PL_NF4) {
        if (dst->dtype != src->dtype)
            return pl_error_set(PL_ERR_DTYPE, "copy: cannot convert %s <- %s (nf4 converts only via "
                                "the NF4 quantizer, pl_nf4_quantize)", pl_tensor_describe(dst, b1, sizeof b1),
                                pl_tensor_describe(src, b2, sizeof b2));
    }
    bool same_dev = pl_device_eq(dst->device, src->device);
    if (same_dev && dst->device.type == PL_DEVICE_CPU && pl_tensor_is_contiguous(dst)) {
        pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {(pl_tensor *)src}, .n_out = 1,
                            .out = {dst}};
        return cpu_copy_forward(&k);
    }
    if (same_dev && dst->device.type == PL_DEVICE_CPU) {
        int64_t n = pl_tensor_numel(dst);
        for (int64_t i = 0; i < n; i++)
            store_elem(dst->storage->data, dst->dtype, strided_offset(dst, i),
                       load_elem(src->storage->data, src->dtype, strided_offset(src, i)));
        return PL_OK;
    }
    /* cross-device: stage through contiguous tensors of the destination dtype */
    if (!pl_tensor_is_contiguous(dst))
        return pl_error_set(PL_ERR_UNSUPPORTED, "copy: cross-device copy into a strided view");
    pl_tensor *s = (pl_tensor *)src;
    pl_tensor *tmp = NULL;
    if (!pl_tensor_is_contiguous(src) || src->dtype != dst->dtype) {
        tmp = pl_tensor_new_owned(dst->dtype, src->ndim, src->shape, src->device);
        if (!tmp) return pl_error_status();
        pl_kernel_args k = {.op = PL_OP_COPY, .n_in = 1, .in = {s}, .n_out = 1, .out = {tmp}};
        pl_status st = pl_kernel_forward(&k);
        if (st) {
            pl_tensor_release(tmp);
            return st;
        }
        s = tmp;
    }
    const pl_backend *b = pl_backend_get(dst->device.type != PL_DEVICE_CPU ? dst->device.type
                                                                            : src->device.type);
    pl_status st = b ? b->memcpy(pl_tensor_data(dst), dst->device, pl_tensor_data(s), s->device,
                                 pl_tensor_nbytes(dst))
                     : pl_error_status();
    pl_tensor_release(tmp);
    return st;
}

pl_tensor *pl_tensor_to(const pl_tensor *t, pl_dtype dt, pl_device dev) {
    if (!t) return NULL;
    pl_tensor *o = pl_tensor_new_owned(dt, t->ndim, t->shape, dev);
    if (!o) return NULL;
    if (pl_tensor_copy_(o, t)) {
        pl_tensor_release(o);
        return NULL;
    }
    return pl_op_result(o);
}

pl_status pl_tensor_fill_(pl_tensor *t, double v) {
    if (!t) return pl_error_set(PL_ERR_INVALID, "fill: NULL tensor");
    if (t->dtype == PL_NF4) return pl_error_set(PL_ERR_DTYPE, "fill: nf4 tensor '%s'", t->name);
    int64_t n = pl_tensor_numel(t);
    if (t->device.type != PL_DEVICE_CPU) {
        if (v == 0.0 && pl_tensor_is_contiguous(t)) {
            const pl_backend *b = pl_backend_get(t->device.type);
            return b ? b->memset(pl_tensor_data(t), t->device, 0, pl_tensor_nbytes(t))
                     : pl_error_status();
        }
        if (pl_tensor_is_contiguous(t) && (t->dtype == PL_F32 || t->dtype == PL_BF16)) {
            /* on the device, no copy from the host (a captured graph cannot
             * contain one, graph.h, and a GPU waits for a pageable one): zero,
             * then add v in place (the same value: 0 + (float)v, rounded to
             * t's dtype as the host's store would) */
            const pl_backend *b = pl_backend_get(t->device.type);
            pl_status s = b ? b->memset(pl_tensor_data(t), t->device, 0, pl_tensor_nbytes(t))
                            : pl_error_status();
            pl_kernel_args k = {.op = PL_OP_ADD_SCALAR, .n_in = 1, .in = {t}, .n_out = 1,
                                .out = {t}, .p.alpha = v};
            return s ? s : pl_kernel_forward(&k);
        }
        pl_tensor *h = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, PL_CPU);
        if (!h) return pl_error_status();
        pl_status s = pl_tensor_fill_(h, v);
        if (!s) s = pl_tensor_copy_(t, h);
        pl_tensor_release(h);
        return s;
    }
    if (pl_tensor_is_contiguous(t)) {
        void *d = pl_tensor_data(t);
        if (v == 0.0) {
            memset(d, 0, pl_tensor_nbytes(t));
            return PL_OK;
        }
        if (t->dtype == PL_F32) {
            float *f = d, fv = (float)v;
#pragma omp parallel for if (n > 65536) schedule(static)
            for (int64_t i = 0; i < n; i++) f[i] = fv;
            return PL_OK;
        }
        for (int64_t i = 0; i < n; i++) store_elem(d, t->dtype, i, v);
        return PL_OK;
    }
    for (int64_t i = 0; i < n; i++) store_elem(t->storage->data, t->dtype, strided_offset(t, i), v);
    return PL_OK;
}

/* ---- random init --------------------------------------------------------- */

static pl_status random_fill(pl_tensor *t, int normal, double a, double b, uint64_t seed,
                             uint64_t stream) {
    if (!t) return pl_error_set(PL_ERR_INVALID, "random init: NULL tensor");
    if (!pl_dtype_is_float(t->dtype))
        return pl_error_set(PL_ERR_DTYPE, "random init of non-float tensor '%s'", t->name);
    int64_t n = pl_tensor_numel(t);
    if (t->device.type != PL_DEVICE_CPU && pl_tensor_is_contiguous(t) &&
        (t->dtype == PL_F32 || t->dtype == PL_BF16 || t->dtype == PL_F16)) {
        const pl_backend *be = pl_backend_get(t->device.type);
        if (be && PL_BACKEND_HAS(be, fill_random) && be->fill_random)
            return n ? be->fill_random(t, normal, a, b, seed, stream) : PL_OK; /* on the device */
        pl_error_clear(); /* pl_backend_get's miss: the host draws */
    }
    pl_tensor *h = t;
    if (t->device.type != PL_DEVICE_CPU || t->dtype != PL_F32 || !pl_tensor_is_contiguous(t)) {
        h = pl_tensor_new_owned(PL_F32, t->ndim, t->shape, PL_CPU);
        if (!h) return pl_error_status();
    }
    float *d = pl_tensor_data(h);
    int64_t nblk = (n + 3) / 4;
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        float v[4];
        pl_init_draw((uint64_t)blk, seed, stream, normal, a, b, v); /* kernel_math.h */
        for (int k = 0; k < 4; k++)
            if (blk * 4 + k < n) d[blk * 4 + k] = v[k];
    }
    if (h != t) {
        pl_status s = pl_tensor_copy_(t, h);
        pl_tensor_release(h);
        return s;
    }
    return PL_OK;
}

pl_status pl_tensor_uniform_(pl_tensor *t, double lo, double hi, uint64_t seed, uint64_t stream) {
    return random_fill(t, 0, lo, hi, seed, stream);
}
pl_status pl_tensor_normal_(pl_tensor *t, double mean, double std, uint64_t seed,
                            uint64_t stream) {
    return random_fill(t, 1, mean, std, seed, stream);
}
