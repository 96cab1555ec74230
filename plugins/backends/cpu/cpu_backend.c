/* cpu_backend.c - the CPU backend: host memory and the CPU's kernel table.
 * Kernels live in kernels_*.c, each file registering its own ops into that
 * table, which the backend's lookup answers from. The plugin's entry point
 * is cpu_plugin.c; the core finds it on the first CPU lookup (README.md).
 * Which backend serves which device type is the core's backend_registry.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"

static void *cpu_raw_alloc(int device, size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
static void cpu_raw_free(int device, void *p) { free(p); }
static int cpu_device_count(void) { return 1; }

static pl_status cpu_memcpy(void *dst, pl_device dd, const void *src, pl_device sd, size_t n) {
    if (dd.type != PL_DEVICE_CPU || sd.type != PL_DEVICE_CPU)
        return pl_error_set(PL_ERR_DEVICE, "cpu backend cannot copy to/from a CUDA device");
    memmove(dst, src, n);
    return PL_OK;
}
static pl_status cpu_memset(void *dst, pl_device dev, int v, size_t n) {
    memset(dst, v, n);
    return PL_OK;
}
static pl_status cpu_sync(int device) { return PL_OK; }
static pl_status cpu_mem_info(int device, size_t *free_b, size_t *total_b) {
    long pages = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES),
         psz = sysconf(_SC_PAGESIZE);
    *free_b = (size_t)pages * (size_t)psz;
    *total_b = (size_t)total * (size_t)psz;
    return PL_OK;
}

/* Filled once by init_cpu() before the table is handed out. */
static pl_kernel_table g_cpu_kernels;

static pl_kernel_fn cpu_kernel(pl_op op, bool backward) {
    return pl_kernel_table_get(&g_cpu_kernels, op, backward);
}

/* pl_backend.half_native: the CPU kernels that read bf16 in place
 * (kernels_dense.c), forward and backward: add / sub of two same-shape
 * f32-or-bf16 operands, scale and add_scalar of bf16, cross-entropy of bf16
 * logits. Every other f32-only kernel gets f32 copies (half_io.c). */
static bool cpu_half_native(const pl_kernel_args *a, bool backward) {
    const pl_tensor *x = a->in[backward ? 1 : 0]; /* backward: in[0] is the gradient */
    if (!x) return false;
    switch (a->op) {
    case PL_OP_ADD:
    case PL_OP_SUB: {
        const pl_tensor *y = a->in[backward ? 2 : 1];
        return y && pl_tensor_same_shape(x, y) && (x->dtype == PL_F32 || x->dtype == PL_BF16) &&
               (y->dtype == PL_F32 || y->dtype == PL_BF16);
    }
    case PL_OP_SCALE:
    case PL_OP_ADD_SCALAR:
    case PL_OP_CROSS_ENTROPY: return x->dtype == PL_BF16;
    default: return false;
    }
}

/* pl_backend.set_option: ("threads", "N"), OpenBLAS's pool size (the
 * caller sets OpenMP's). */
static pl_status cpu_set_option(const char *key, const char *value) {
    if (!key || strcmp(key, "threads") != 0)
        return pl_error_set(PL_ERR_UNSUPPORTED, "cpu backend: no option '%s'", key ? key : "(null)");
    char *end = NULL;
    long n = value ? strtol(value, &end, 10) : 0;
    if (!value || end == value || *end || n <= 0 || n > 1 << 20)
        return pl_error_set(PL_ERR_INVALID, "cpu backend: threads = '%s': expected an integer > 0",
                            value ? value : "(null)");
    pl_blas_set_threads((int)n);
    return PL_OK;
}

/* pl_backend.get_option: what the run's log and summary.json report. */
static pl_status cpu_get_option(const char *key, char *buf, size_t n) {
    if (!key || !buf || !n)
        return pl_error_set(PL_ERR_INVALID, "cpu backend: get_option: NULL key or buffer");
    if (!strcmp(key, "blas_threads"))
        snprintf(buf, n, "%d", pl_blas_threads());
    else if (!strcmp(key, "blas_core"))
        snprintf(buf, n, "%s", pl_blas_core());
    else if (!strcmp(key, "blas_parallel"))
        snprintf(buf, n, "%s", pl_blas_parallel());
    else if (!strcmp(key, "cpu_gemm_bf16"))
        snprintf(buf, n, "%s", pl_cpu_gemm_bf16());
    else if (!strcmp(key, "cpu_features"))
        pl_cpu_features(buf, n);
    else
        return pl_error_set(PL_ERR_UNSUPPORTED, "cpu backend: no value '%s'", key);
    return PL_OK;
}

/* the plugin's descriptor points here (cpu_plugin.c) */
const pl_backend pl_cpu_backend = {
    .struct_size = PL_BACKEND_STRUCT_SIZE,
    .name = "cpu",
    .type = PL_DEVICE_CPU,
    .device_count = cpu_device_count,
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .memcpy = cpu_memcpy,
    .memset = cpu_memset,
    .synchronize = cpu_sync,
    .mem_info = cpu_mem_info,
    .kernel = cpu_kernel,
    .set_option = cpu_set_option,
    .half_native = cpu_half_native,
    .get_option = cpu_get_option,
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_cpu(void) {
    pl_cpu_register_dense(&g_cpu_kernels);
    pl_cpu_register_index(&g_cpu_kernels);
    pl_cpu_register_nf4(&g_cpu_kernels);
    pl_cpu_register_optim(&g_cpu_kernels);
    pl_cpu_register_attention(&g_cpu_kernels);
}

const pl_backend *pl_cpu_backend_table(void) {
    pthread_once(&g_once, init_cpu);
    return &pl_cpu_backend;
}
