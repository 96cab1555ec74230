/* alloc.c - per-device caching allocator (see alloc.h).
 *
 * Size classes: requests are rounded up to a power of two below 1 MiB and to
 * a multiple of 1/8 of the enclosing power of two above it (at most 12.5 %
 * waste). Each class keeps a LIFO free list of blocks; pl_free pushes, pl_alloc
 * pops, and only a miss calls the backend's raw_alloc. Lists are small
 * dynamic arrays (grown geometrically, so steady state does not allocate).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PL_MAX_DEVICES 8
#define N_CLASSES 512

typedef struct free_list {
    size_t size;
    void **blocks;
    int n, cap;
} free_list;

typedef struct device_cache {
    pthread_mutex_t mu;
    free_list lists[N_CLASSES];
    int n_lists;
    pl_alloc_stats st;
} device_cache;

static device_cache g_caches[2][PL_MAX_DEVICES];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_caches(void) {
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < PL_MAX_DEVICES; d++) pthread_mutex_init(&g_caches[t][d].mu, NULL);
}

static device_cache *cache_for(pl_device dev) {
    pthread_once(&g_once, init_caches);
    if ((unsigned)dev.type > 1 || dev.index < 0 || dev.index >= PL_MAX_DEVICES) return NULL;
    return &g_caches[dev.type][dev.index];
}

static size_t round_size(size_t n) {
    if (n < 256) return 256;
    size_t p = 256;
    while (p < n) p <<= 1;
    if (p <= (1u << 20)) return p;
    size_t step = p / 16; /* p/2 < n <= p; classes every p/16 in (p/2, p] */
    return (n + step - 1) / step * step;
}

static free_list *find_list(device_cache *c, size_t size) {
    for (int i = 0; i < c->n_lists; i++)
        if (c->lists[i].size == size) return &c->lists[i];
    if (c->n_lists == N_CLASSES) return NULL;
    free_list *l = &c->lists[c->n_lists++];
    memset(l, 0, sizeof *l);
    l->size = size;
    return l;
}

static void *raw_alloc(pl_device dev, size_t size) {
    if (dev.type == PL_DEVICE_CPU) return aligned_alloc(64, size);
    const pl_backend *b = pl_backend_get(dev.type);
    return b && b->raw_alloc ? b->raw_alloc(dev.index, size) : NULL;
}

static void raw_free(pl_device dev, void *p) {
    if (dev.type == PL_DEVICE_CPU) {
        free(p);
        return;
    }
    const pl_backend *b = pl_backend_get(dev.type);
    if (b && b->raw_free) b->raw_free(dev.index, p);
}

void *pl_alloc(pl_device dev, size_t nbytes, size_t *capacity) {
    device_cache *c = cache_for(dev);
    if (!c) {
        pl_error_set(PL_ERR_DEVICE, "pl_alloc: invalid device (type %d index %d)", dev.type,
                     dev.index);
        return NULL;
    }
    size_t size = round_size(nbytes ? nbytes : 1);
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    c->st.allocations++;
    free_list *l = find_list(c, size);
    if (l && l->n > 0) {
        p = l->blocks[--l->n];
        c->st.cache_hits++;
        c->st.bytes_cached -= size;
    }
    pthread_mutex_unlock(&c->mu);
    if (!p) {
        p = raw_alloc(dev, size);
        if (!p) {
            /* give cached blocks back and try once more */
            pl_alloc_empty_cache(dev);
            p = raw_alloc(dev, size);
        }
        if (!p) {
            pl_error_set(PL_ERR_NOMEM, "out of memory allocating %zu bytes on %s", size,
                         dev.type == PL_DEVICE_CPU ? "cpu" : "cuda");
            return NULL;
        }
        pthread_mutex_lock(&c->mu);
        c->st.system_allocs++;
        c->st.bytes_reserved += size;
        if (c->st.bytes_reserved > c->st.peak_reserved_bytes)
            c->st.peak_reserved_bytes = c->st.bytes_reserved;
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_lock(&c->mu);
    c->st.bytes_in_use += size;
    if (c->st.bytes_in_use > c->st.peak_bytes) c->st.peak_bytes = c->st.bytes_in_use;
    pthread_mutex_unlock(&c->mu);
    if (capacity) *capacity = size;
    return p;
}

void pl_free(pl_device dev, void *ptr, size_t capacity) {
    if (!ptr) return;
    device_cache *c = cache_for(dev);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->st.bytes_in_use -= capacity;
    free_list *l = find_list(c, capacity);
    bool cached = false;
    if (l) {
        if (l->n == l->cap) {
            int nc = l->cap ? l->cap * 2 : 8;
            void **nb = realloc(l->blocks, (size_t)nc * sizeof(void *));
            if (nb) {
                l->blocks = nb;
                l->cap = nc;
            }
        }
        if (l->n < l->cap) {
            l->blocks[l->n++] = ptr;
            c->st.bytes_cached += capacity;
            cached = true;
        }
    }
    if (!cached) c->st.bytes_reserved -= capacity;
    pthread_mutex_unlock(&c->mu);
    if (!cached) raw_free(dev, ptr);
}

pl_alloc_stats pl_alloc_get_stats(pl_device dev) {
    pl_alloc_stats s = {0};
    device_cache *c = cache_for(dev);
    if (!c) return s;
    pthread_mutex_lock(&c->mu);
    s = c->st;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void pl_alloc_reset_peak(pl_device dev) {
    device_cache *c = cache_for(dev);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->st.peak_bytes = c->st.bytes_in_use;
    c->st.peak_reserved_bytes = c->st.bytes_reserved;
    pthread_mutex_unlock(&c->mu);
}

void pl_alloc_empty_cache(pl_device dev) {
    device_cache *c = cache_for(dev);
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_lists; i++) {
        free_list *l = &c->lists[i];
        for (int j = 0; j < l->n; j++) raw_free(dev, l->blocks[j]);
        c->st.bytes_cached -= (size_t)l->n * l->size;
        c->st.bytes_reserved -= (size_t)l->n * l->size;
        l->n = 0;
    }
    pthread_mutex_unlock(&c->mu);
}
