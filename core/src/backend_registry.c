/* backend_registry.c - the backend registry: which backend table serves
 * each device type (the built-in CPU backend, cpu_backend.c, in its slot
 * from the first lookup; a backend plugin's table once pl_backend_register
 * accepted its layout), and kernel dispatch through a table
 * (pl_backend_kernel). Backend plugins are found and loaded by
 * backend_loader.c; this file only keeps what they registered. */
#include <math.h>
#include <pthread.h>

#include "internal.h"

static const pl_backend *g_backends[2];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_registry(void) { g_backends[PL_DEVICE_CPU] = pl_backend_cpu(); }

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
    pthread_once(&g_once, init_registry);
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
    pthread_once(&g_once, init_registry);
    if ((unsigned)type > PL_DEVICE_CUDA || !g_backends[type]) {
        pl_error_set(PL_ERR_DEVICE, "no backend loaded for device type %s",
                     type == PL_DEVICE_CUDA ? "cuda (load the 'cuda' backend plugin)" : "?");
        return NULL;
    }
    return g_backends[type];
}

const pl_backend *pl_backend_peek(pl_device_type type) {
    pthread_once(&g_once, init_registry);
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

