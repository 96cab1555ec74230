/* backend_loader.c - find a device's backend plugin ("cpu", "cuda",
 * "strict", or another by name) and register its table. See
 * backend_loader.h. */
#include "backend_loader.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static const char *backend_plugin_name(pl_device_type type) {
    return type == PL_DEVICE_CUDA ? "cuda" : type == PL_DEVICE_CPU ? "cpu" : NULL;
}

/* The first CPU lookup (backend_registry.c): the cpu plugin from the default
 * plugin dirs. Absent, the message names every dir searched (and loads
 * nothing else: the registry's "did you mean" would open every plugin). */
static pl_status load_cpu_backend(void) {
    pl_registry *reg = pl_registry_new();
    if (!reg) return pl_error_status();
    pl_status st = pl_registry_add_default_dirs(reg);
    bool found = false;
    char dirs[2048] = "";
    size_t off = 0;
    for (int i = 0; !st && i < pl_registry_dir_count(reg); i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/cpu.so", pl_registry_dir_at(reg, i));
        found |= access(p, F_OK) == 0;
        if (off < sizeof dirs)
            off += (size_t)snprintf(dirs + off, sizeof dirs - off, "%s%s", i ? ":" : "",
                                    pl_registry_dir_at(reg, i));
    }
    if (!st && !found) {
        pl_hint_set("the CPU backend is the plugin cpu.so (plugins/backends/cpu): build or install "
                    "it, or name its directory in PIPELINE_PLUGIN_PATH");
        st = pl_error_set(PL_ERR_DEVICE, "the CPU backend plugin cpu.so was not found (searched: %s)",
                          dirs[0] ? dirs : "no plugin directory: PIPELINE_PLUGIN_PATH is unset "
                                           "and neither the build tree's nor the installed "
                                           "plugin dir exists");
    }
    if (!st) st = pl_backend_load_named(reg, PL_DEVICE_CPU, "cpu");
    pl_registry_free(reg);
    return st;
}

__attribute__((constructor)) static void install_cpu_loader(void) {
    pl_backend_set_cpu_loader(load_cpu_backend);
}

pl_status pl_backend_load(pl_registry *reg, pl_device_type type) {
    return pl_backend_load_named(reg, type, NULL);
}

pl_status pl_backend_load_named(pl_registry *reg, pl_device_type type, const char *name) {
    const char *dev = backend_plugin_name(type); /* the device's word in messages */
    if (!name || !name[0]) name = dev;
    if (!name || !dev)
        return pl_error_set(PL_ERR_INVALID, "pl_backend_load: unknown device type %d", (int)type);
    /* already registered (by an earlier call): nothing to do */
    const pl_backend *have = pl_backend_peek(type);
    if (have) {
        if (have->name && strcmp(have->name, name) != 0)
            return pl_error_set(PL_ERR_DEVICE,
                                "device %s requested but backend '%s' already holds that device "
                                "slot in this process (one accelerator backend per process)",
                                name, have->name);
        return PL_OK;
    }
    pl_registry *own = NULL;
    if (!reg) {
        own = pl_registry_new();
        if (!own) return pl_error_status();
        if (pl_registry_add_default_dirs(own)) {
            pl_registry_free(own);
            return pl_error_status();
        }
        reg = own;
    }
    const pl_plugin_desc *desc = NULL;
    pl_status st = pl_registry_find(reg, name, PL_KIND_BACKEND, &desc, NULL);
    if (st) {
        /* keep the registry's reason (not found / ABI / kind) and say what it was for */
        pl_error_prefix(st, "device %s requested: backend plugin '%s' (%s.so) could not be loaded",
                        dev, name, name);
        pl_registry_free(own);
        return st;
    }
    const char *path = pl_registry_path_of(reg, name);
    char where[1024];
    snprintf(where, sizeof where, "%s", path ? path : name);
    pl_registry_free(own);
    const pl_backend *b = desc ? (const pl_backend *)desc->vtable : NULL;
    if (!b)
        return pl_error_set(PL_ERR_ABI, "backend plugin %s: descriptor has no pl_backend vtable",
                            where);
    /* struct_size first: the other fields are only meaningful in a known layout */
    pl_status lay = pl_backend_check_layout(b, where);
    if (lay) return lay;
    if (b->type != type || !b->name || strcmp(b->name, name) != 0 || !b->raw_alloc || !b->raw_free || !b->memcpy ||
        !b->memset || !b->synchronize || !b->device_count)
        return pl_error_set(PL_ERR_ABI,
                            "backend plugin %s: vtable is not a usable %s backend (type %d, "
                            "expected %d; name '%s', expected '%s'; raw memory functions and "
                            "device_count are required)",
                            where, dev, (int)b->type, (int)type, b->name ? b->name : "(null)",
                            name);
    pl_error_clear();
    int n = b->device_count();
    if (n <= 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", pl_error_message());
        return pl_error_set(PL_ERR_DEVICE, "backend plugin %s loaded but no %s device is visible%s%s",
                            where, dev, why[0] ? ": " : "", why);
    }
    return pl_backend_register(b);
}
