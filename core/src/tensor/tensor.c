/* tensor.c - tensor headers and storage: owned tensors (new, views of the
 * same storage, the tape's stubs, external memory), retain / release, and
 * the queries (numel, bytes, contiguity, data, describe, element reads on the
 * host). The bottom of the tensor layer above dtype.c and alloc.c: it calls
 * no kernel and knows no frame; tensor_init.c and tensor_views.c build on it. */
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
#include "tape_internal.h"

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

void pl_tensor_set_contiguous_strides(pl_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

pl_status pl_tensor_check_shape(int ndim, const int64_t *shape) {
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
    if (pl_tensor_check_shape(ndim, shape)) return NULL;
    pl_tensor *t = header_new();
    if (!t) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    pl_tensor_set_contiguous_strides(t);
    t->device = dev;
    t->storage = storage_new(dev, pl_dtype_nbytes(dt, pl_tensor_numel(t)));
    if (!t->storage) {
        header_free(t);
        return NULL;
    }
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

pl_tensor *pl_tensor_from_external_owned(pl_dtype dt, int ndim, const int64_t *shape, void *data,
                                         void (*free_fn)(void *, void *), void *ctx) {
    if (pl_tensor_check_shape(ndim, shape)) return NULL;
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
    pl_tensor_set_contiguous_strides(t);
    t->device = PL_CPU;
    s->data = data;
    s->nbytes = s->capacity = pl_dtype_nbytes(dt, pl_tensor_numel(t));
    s->device = PL_CPU;
    s->refcount = 1;
    s->external = true;
    s->external_free = free_fn;
    s->external_ctx = ctx;
    t->storage = s;
    return t;
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
double pl_tensor_get(const pl_tensor *t, int64_t i) {
    if (!t || t->dtype == PL_NF4 || t->device.type != PL_DEVICE_CPU) return NAN;
    return pl_elem_load(t->storage->data, t->dtype, pl_strided_offset(t, i));
}

size_t pl_nf4_code_nbytes(const pl_tensor *q) {
    return q ? pl_dtype_nbytes(PL_NF4, pl_tensor_numel(q)) : 0;
}

size_t pl_nf4_state_nbytes(const pl_tensor *q) {
    if (!q || !q->quant.absmax) return 0;
    size_t n = pl_tensor_nbytes(q->quant.absmax);
    if (q->quant.absmax_scale) n += pl_tensor_nbytes(q->quant.absmax_scale) + sizeof(float);
    return n;
}

void pl_autograd_forget_out(pl_tensor *t) {
    pl_node *n = t->grad_fn;
    if (n && n->out == t) n->out = NULL;
    t->grad_fn = NULL;
}
