/* crash.c - what a crash report names, kept by the core (see crash.h): the
 * stack of calls into plugins and the table of memory-mapped files. The
 * handler that prints them on a fatal signal is the run's
 * (core/run/crash_handler.c), so nothing here calls up out of the base layer. */
#include "crash.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#define MAX_CTX 8
static _Thread_local char tl_ctx[MAX_CTX][256];
static _Thread_local int tl_depth;

void pl_crash_context_push(const char *fmt, ...) {
    if (tl_depth < MAX_CTX) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tl_ctx[tl_depth], sizeof tl_ctx[0], fmt, ap);
        va_end(ap);
    }
    tl_depth++;
}

void pl_crash_context_pop(void) {
    if (tl_depth > 0) tl_depth--;
}

const char *pl_crash_context_top(void) {
    if (tl_depth <= 0) return NULL;
    return tl_ctx[tl_depth <= MAX_CTX ? tl_depth - 1 : MAX_CTX - 1];
}

/* ---- mapped files ---------------------------------------------------------
 * Writers take g_map_lock; the handler reads without it. A slot is claimed
 * by setting `base` last (release) and freed by clearing it first, so a
 * reader that sees a base sees its size and path (a slot reused while the
 * handler runs could name the wrong file: a crash message, never a
 * crash). */
#define MAP_SLOTS 256
static struct map_slot {
    uintptr_t base; /* 0: free */
    size_t size;
    char path[512];
} g_maps[MAP_SLOTS];
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;

void pl_crash_map_register(const void *base, size_t size, const char *path) {
    if (!base || !size) return;
    pthread_mutex_lock(&g_map_lock);
    for (int i = 0; i < MAP_SLOTS; i++)
        if (!__atomic_load_n(&g_maps[i].base, __ATOMIC_RELAXED)) {
            g_maps[i].size = size;
            snprintf(g_maps[i].path, sizeof g_maps[i].path, "%s", path ? path : "?");
            __atomic_store_n(&g_maps[i].base, (uintptr_t)base, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_map_lock);
}

void pl_crash_map_unregister(const void *base) {
    if (!base) return;
    pthread_mutex_lock(&g_map_lock);
    for (int i = 0; i < MAP_SLOTS; i++)
        if (__atomic_load_n(&g_maps[i].base, __ATOMIC_RELAXED) == (uintptr_t)base) {
            __atomic_store_n(&g_maps[i].base, 0, __ATOMIC_RELEASE);
            break;
        }
    pthread_mutex_unlock(&g_map_lock);
}

_Bool pl_crash_map_lookup(const void *addr, char *buf, size_t n, size_t *offset) {
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < MAP_SLOTS; i++) {
        uintptr_t b = __atomic_load_n(&g_maps[i].base, __ATOMIC_ACQUIRE);
        if (!b || a < b || a - b >= g_maps[i].size) continue;
        if (buf && n) { /* strncpy-like, async-signal-safe */
            size_t k = 0;
            for (; k + 1 < n && g_maps[i].path[k]; k++) buf[k] = g_maps[i].path[k];
            buf[k] = 0;
        }
        if (offset) *offset = (size_t)(a - b);
        return 1;
    }
    return 0;
}
