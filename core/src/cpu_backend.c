/* cpu_backend.c - the built-in CPU backend, the backend registry and kernel
 * dispatch (pl_backend_kernel). Kernels live in cpu/kernels_*.c, each file
 * registering its own ops into the CPU's kernel table, which the CPU
 * backend's lookup answers from. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

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

/* Kernel files that are not linked in leave their ops unsupported. */
__attribute__((weak)) void pl_cpu_register_dense(pl_kernel_table *b) {
    (void)b;
}
__attribute__((weak)) void pl_cpu_register_index(pl_kernel_table *b) {
    (void)b;
}
__attribute__((weak)) void pl_cpu_register_nf4(pl_kernel_table *b) {
    (void)b;
}
__attribute__((weak)) void pl_cpu_register_optim(pl_kernel_table *b) {
    (void)b;
}

/* Filled once by init_cpu() before g_cpu is handed out. */
static pl_kernel_table g_cpu_kernels;

static pl_kernel_fn cpu_kernel(pl_op op, bool backward) {
    return pl_kernel_table_get(&g_cpu_kernels, op, backward);
}

static pl_backend g_cpu = {
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
};

static const pl_backend *g_backends[2];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_cpu(void) {
    pl_cpu_register_copy(&g_cpu_kernels);
    pl_cpu_register_dense(&g_cpu_kernels);
    pl_cpu_register_index(&g_cpu_kernels);
    pl_cpu_register_nf4(&g_cpu_kernels);
    pl_cpu_register_optim(&g_cpu_kernels);
    g_backends[PL_DEVICE_CPU] = &g_cpu;
}

const pl_backend *pl_backend_cpu(void) {
    pthread_once(&g_once, init_cpu);
    return &g_cpu;
}

pl_status pl_backend_check_layout(const pl_backend *b, const char *where) {
    if (!b) return pl_error_set(PL_ERR_ABI, "backend %s: no pl_backend table", where);
    if (b->struct_size < PL_BACKEND_MIN_SIZE)
        return pl_error_set(PL_ERR_ABI,
                            "backend %s: pl_backend.struct_size is %u bytes, the ABI %d.%d layout "
                            "needs at least %u (built against another backend.h: rebuild it)",
                            where, (unsigned)b->struct_size, PL_ABI_MAJOR, PL_ABI_MINOR,
                            (unsigned)PL_BACKEND_MIN_SIZE);
    if (!b->kernel)
        return pl_error_set(PL_ERR_ABI,
                            "backend %s: pl_backend.kernel (the op kernel lookup) is "
                            "NULL",
                            where);
    return PL_OK;
}

pl_status pl_backend_register(const pl_backend *b) {
    pthread_once(&g_once, init_cpu);
    if (!b) return pl_error_set(PL_ERR_INVALID, "pl_backend_register: NULL backend table");
    pl_status st = pl_backend_check_layout(
        b, b->struct_size >= PL_BACKEND_MIN_SIZE && b->name ? b->name : "(unnamed)");
    if (st) return st;
    if ((unsigned)b->type > PL_DEVICE_CUDA)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_backend_register: backend '%s' has invalid "
                            "device type %d",
                            b->name ? b->name : "?", (int)b->type);
    if (b->type == PL_DEVICE_CPU)
        return pl_error_set(PL_ERR_INVALID, "the CPU backend is built in and cannot be replaced");
    g_backends[b->type] = b;
    return PL_OK;
}

const pl_backend *pl_backend_get(pl_device_type type) {
    pthread_once(&g_once, init_cpu);
    if ((unsigned)type > PL_DEVICE_CUDA || !g_backends[type]) {
        pl_error_set(PL_ERR_DEVICE, "no backend loaded for device type %s",
                     type == PL_DEVICE_CUDA ? "cuda (load the 'cuda' backend plugin)" : "?");
        return NULL;
    }
    return g_backends[type];
}

const pl_backend *pl_backend_peek(pl_device_type type) {
    pthread_once(&g_once, init_cpu);
    return (unsigned)type > PL_DEVICE_CUDA ? NULL : g_backends[type];
}

pl_status pl_backend_device_stats(pl_device d, uint64_t *cursor, pl_device_stats *out) {
    if (!out) return pl_error_set(PL_ERR_INVALID, "pl_backend_device_stats: NULL out");
    *out = (pl_device_stats){NAN, 0, NAN, NAN};
    const pl_backend *b = d.type == PL_DEVICE_CPU ? NULL : pl_backend_peek(d.type);
    if (!b || !PL_BACKEND_HAS(b, device_stats) || !b->device_stats)
        return pl_error_set(PL_ERR_UNSUPPORTED, "device stats: %s has none",
                            d.type == PL_DEVICE_CPU ? "the CPU"
                            : b                     ? b->name
                                                    : "no backend loaded for the device");
    uint64_t latest = 0;
    pl_status st = b->device_stats(d.index, cursor ? cursor : &latest, out);
    if (st) *out = (pl_device_stats){NAN, 0, NAN, NAN};
    return st;
}

pl_kernel_fn pl_backend_kernel(const pl_backend *b, pl_op op, bool backward) {
    return b && b->kernel ? b->kernel(op, backward) : NULL;
}

bool pl_backend_supports(const pl_backend *b, pl_op op, bool backward) {
    return pl_backend_kernel(b, op, backward) != NULL;
}

