/* backend_registry.c - the backend registry: which backend table serves
 * each device type (one per type and process: the cpu plugin in the CPU
 * slot, loaded on the first CPU lookup; an accelerator plugin's table once
 * pl_backend_register accepted its layout), and kernel dispatch through a
 * table (pl_backend_kernel). Backend plugins are found and loaded by
 * backend_loader.c, a layer above: it hands this file the function that
 * loads the CPU backend (pl_backend_set_cpu_loader) when the library is
 * loaded, so that this file calls nothing above it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* the slots: read by every op call of every thread, written once per slot
 * (pl_backend_register), hence the acquire / release pairs */
static const pl_backend *g_backends[2];

static const pl_backend *slot_get(pl_device_type type) {
    return __atomic_load_n(&g_backends[type], __ATOMIC_ACQUIRE);
}

static pl_status (*g_cpu_loader)(void);
void pl_backend_set_cpu_loader(pl_status (*load)(void)) {
    g_cpu_loader = load;
}

/* The CPU backend's load: once per process, whichever thread asks first.
 * Its failure is kept and told again to every later CPU lookup. */
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;
static pl_status g_cpu_status;
static char g_cpu_error[1536];

static void load_cpu(void) {
    if (slot_get(PL_DEVICE_CPU)) return; /* registered by the program itself */
    pl_status st = g_cpu_loader ? g_cpu_loader()
                                : pl_error_set(PL_ERR_DEVICE, "no backend loader in this core");
    if (st || !slot_get(PL_DEVICE_CPU)) {
        g_cpu_status = st ? st : PL_ERR_DEVICE;
        snprintf(g_cpu_error, sizeof g_cpu_error, "%s", st ? pl_error_message() : "not registered");
    }
}

/* The CPU slot, loading the cpu plugin the first time; the caller's error
 * state is kept when it loads. NULL with PL_ERR_DEVICE when it cannot. */
static const pl_backend *cpu_backend(void) {
    const pl_backend *b = slot_get(PL_DEVICE_CPU);
    if (b) return b;
    pl_status had = pl_error_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", had ? pl_error_message() : "");
    pthread_once(&g_cpu_once, load_cpu);
    b = slot_get(PL_DEVICE_CPU);
    if (b) {
        if (had)
            pl_error_set(had, "%s", msg);
        else
            pl_error_clear();
        return b;
    }
    pl_error_set(PL_ERR_DEVICE, "no CPU backend: %s", g_cpu_error);
    return NULL;
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
    if (!b) return pl_error_set(PL_ERR_INVALID, "pl_backend_register: NULL backend table");
    pl_status st = pl_backend_check_layout(
        b, b->struct_size >= PL_BACKEND_MIN_SIZE && b->name ? b->name : "(unnamed)");
    if (st) return st;
    if ((unsigned)b->type > PL_DEVICE_CUDA)
        return pl_error_set(PL_ERR_INVALID,
                            "pl_backend_register: backend '%s' has invalid "
                            "device type %d",
                            b->name ? b->name : "?", (int)b->type);
    if (b->type != PL_DEVICE_CPU) { /* the loader keeps it to one per process */
        __atomic_store_n(&g_backends[b->type], b, __ATOMIC_RELEASE);
        return PL_OK;
    }
    /* the CPU slot is filled once: tensors already made hold its memory */
    const pl_backend *none = NULL;
    if (__atomic_compare_exchange_n(&g_backends[PL_DEVICE_CPU], &none, b, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE) ||
        none == b)
        return PL_OK;
    return pl_error_set(PL_ERR_INVALID,
                        "pl_backend_register: backend '%s' cannot take the cpu slot: backend '%s' "
                        "holds it (the CPU backend is registered once per process)",
                        b->name ? b->name : "?", none->name ? none->name : "?");
}

const pl_backend *pl_backend_get(pl_device_type type) {
    if (type == PL_DEVICE_CPU) return cpu_backend();
    if ((unsigned)type > PL_DEVICE_CUDA || !slot_get(type)) {
        pl_error_set(PL_ERR_DEVICE, "no backend loaded for device type %s",
                     type == PL_DEVICE_CUDA ? "cuda (load the 'cuda' backend plugin)" : "?");
        return NULL;
    }
    return slot_get(type);
}

const pl_backend *pl_backend_cpu(void) {
    return pl_backend_get(PL_DEVICE_CPU);
}

const pl_backend *pl_backend_peek(pl_device_type type) {
    return (unsigned)type > PL_DEVICE_CUDA ? NULL : slot_get(type);
}

bool pl_backend_promises(pl_device d, const char *key) {
    if (d.type == PL_DEVICE_CPU) return true;
    const pl_backend *be = pl_backend_peek(d.type);
    bool ok = be && PL_BACKEND_HAS(be, set_option) && be->set_option &&
              be->set_option(key, "true") == PL_OK;
    pl_error_clear();
    return ok;
}

const char *pl_backend_info(pl_device_type type, const char *key, char *buf, size_t n) {
    if (!buf || !n) return buf;
    snprintf(buf, n, "unknown");
    if (!key || (unsigned)type > PL_DEVICE_CUDA) return buf;
    pl_status had = pl_error_status();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", had ? pl_error_message() : "");
    const pl_backend *b = type == PL_DEVICE_CPU ? cpu_backend() : pl_backend_peek(type);
    if (b && PL_BACKEND_HAS(b, get_option) && b->get_option && b->get_option(key, buf, n))
        snprintf(buf, n, "unknown");
    if (had)
        pl_error_set(had, "%s", msg);
    else
        pl_error_clear();
    return buf;
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

pl_status pl_device_synchronize(pl_device d) {
    if (d.type == PL_DEVICE_CPU) return PL_OK; /* the CPU's kernels return when done */
    const pl_backend *b = pl_backend_get(d.type);
    return b && b->synchronize ? b->synchronize(d.index) : PL_OK;
}
