/* alloc.c - per-device caching allocator (see alloc.h).
 *
 * Size classes: a power of two up to 64 KiB, then multiples of 1/8 of the
 * enclosing power of two up to 1 MiB and of 1/64 above (issue 31: 1/16
 * classes held 4 % of qlora4's peak at 1.1 B, powers of two up to 1 MiB
 * 80 MiB of the 7B qlora4 + checkpointing step's 5,625). A miss above
 * 64 KiB takes the smallest cached block at most 1/8 larger (1/2 in host
 * memory: pretrain's 23-29 MB logits kept 502 MiB reserved, now 223), so
 * batches whose shapes vary (graphs of molecules) keep reusing blocks after
 * the first epoch; a miss that the device refuses empties the cache and
 * retries once. Each class keeps a LIFO free list of blocks; pl_free pushes,
 * pl_alloc pops, and only a miss calls the backend's raw_alloc. Lists are small
 * dynamic arrays (grown geometrically, so steady state does not allocate).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_internal.h"
#include "internal.h"

#define PL_MAX_DEVICES 8
#define N_CLASSES 1024

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

/* A graph-private pool (graph_internal.h): while it is the calling thread's
 * current pool, that thread's allocations on its device come from it. Its
 * blocks (owned[], sorted) return to it when freed, from any thread, and are
 * handed out again only while it is current: addresses a captured graph
 * uses are never given to other work. A miss takes a block of the class
 * from the device's free list before asking the backend. Guarded by the
 * device cache's mutex. */
struct pl_mempool {
    pl_device dev;
    free_list lists[N_CLASSES];
    int n_lists;
    void **owned; /* [n_owned] sorted by address */
    size_t n_owned, cap_owned;
    bool released; /* its graph is gone: blocks go back to the device's cache */
};
#define MAX_POOLS 16
static pl_mempool *g_pools[2][PL_MAX_DEVICES][MAX_POOLS];
static _Thread_local pl_mempool *tl_pool;
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
    if (p <= (64u << 10)) return p;
    /* p/2 < n <= p; classes every p/8 in (p/2, p] up to 1 MiB, every p/64 above */
    size_t step = p <= (1u << 20) ? p / 8 : p / 64;
    return (n + step - 1) / step * step;
}

/* A miss above 64 KiB takes the smallest cached block at most `slack`
 * bytes larger (a batch of another shape reuses the last one's blocks, as under
 * classes of 1/8, without their rounding on every block). NULL if none. */
static free_list *best_fit(device_cache *c, size_t size, size_t slack) {
    free_list *best = NULL;
    for (int i = 0; i < c->n_lists; i++) {
        free_list *l = &c->lists[i];
        if (l->n > 0 && l->size > size && l->size - size <= slack &&
            (!best || l->size < best->size))
            best = l;
    }
    return best;
}

static free_list *find_list_in(free_list *lists, int *n_lists, size_t size) {
    for (int i = 0; i < *n_lists; i++)
        if (lists[i].size == size) return &lists[i];
    if (*n_lists == N_CLASSES) return NULL;
    free_list *l = &lists[(*n_lists)++];
    memset(l, 0, sizeof *l);
    l->size = size;
    return l;
}

static free_list *find_list(device_cache *c, size_t size) {
    return find_list_in(c->lists, &c->n_lists, size);
}

/* Push ptr on l (grown geometrically); false when it cannot grow. */
static bool list_push(free_list *l, void *ptr) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 8;
        void **nb = realloc(l->blocks, (size_t)nc * sizeof(void *));
        if (!nb) return false;
        l->blocks = nb;
        l->cap = nc;
    }
    l->blocks[l->n++] = ptr;
    return true;
}

/* ---- graph-private pools (caller holds the device cache's mutex) ---- */

static size_t owned_pos(const pl_mempool *p, const void *ptr) {
    size_t lo = 0, hi = p->n_owned;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)p->owned[mid] < (uintptr_t)ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool pool_owns(const pl_mempool *p, const void *ptr) {
    size_t i = owned_pos(p, ptr);
    return i < p->n_owned && p->owned[i] == ptr;
}

static bool pool_adopt(pl_mempool *p, void *ptr) {
    if (p->n_owned == p->cap_owned) {
        size_t nc = p->cap_owned ? 2 * p->cap_owned : 64;
        void **nb = realloc(p->owned, nc * sizeof *nb);
        if (!nb) return false;
        p->owned = nb;
        p->cap_owned = nc;
    }
    size_t i = owned_pos(p, ptr);
    memmove(&p->owned[i + 1], &p->owned[i], (p->n_owned - i) * sizeof *p->owned);
    p->owned[i] = ptr;
    p->n_owned++;
    return true;
}

static void pool_disown(pl_mempool *p, void *ptr) {
    size_t i = owned_pos(p, ptr);
    if (i < p->n_owned && p->owned[i] == ptr) {
        memmove(&p->owned[i], &p->owned[i + 1], (p->n_owned - i - 1) * sizeof *p->owned);
        p->n_owned--;
    }
}

static pl_mempool *owning_pool(pl_device dev, const void *ptr) {
    for (int i = 0; i < MAX_POOLS; i++) {
        pl_mempool *p = g_pools[dev.type][dev.index][i];
        if (p && pool_owns(p, ptr)) return p;
    }
    return NULL;
}

static void pool_free_struct(pl_mempool *p) {
    for (int i = 0; i < MAX_POOLS; i++)
        if (g_pools[p->dev.type][p->dev.index][i] == p) g_pools[p->dev.type][p->dev.index][i] = NULL;
    for (int i = 0; i < p->n_lists; i++) free(p->lists[i].blocks);
    free(p->owned);
    free(p);
}

/* set while this thread's pl_alloc calls the backend's raw_alloc
 * (pl_alloc_in_raw_alloc: a capturing backend tells the core's own
 * allocations, which a graph's pool accounts for, from any other) */
static _Thread_local bool tl_in_raw;

bool pl_alloc_in_raw_alloc(void) { return tl_in_raw; }

static void *raw_alloc(pl_device dev, size_t size) {
    if (dev.type == PL_DEVICE_CPU) return aligned_alloc(64, size);
    const pl_backend *b = pl_backend_get(dev.type);
    tl_in_raw = true;
    void *p = b && b->raw_alloc ? b->raw_alloc(dev.index, size) : NULL;
    tl_in_raw = false;
    return p;
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
    pl_mempool *pool = tl_pool && pl_device_eq(tl_pool->dev, dev) ? tl_pool : NULL;
    pthread_mutex_lock(&c->mu);
    c->st.allocations++;
    free_list *pl = pool ? find_list_in(pool->lists, &pool->n_lists, size) : NULL;
    if (pl && pl->n > 0) { /* the pool's own free block */
        p = pl->blocks[--pl->n];
        c->st.cache_hits++;
        c->st.bytes_cached -= size;
    }
    free_list *l = p ? NULL : find_list(c, size);
    if (!p && (!l || l->n == 0) && size > (64u << 10)) {
        free_list *b = best_fit(c, size, dev.type == PL_DEVICE_CPU ? size / 2 : size / 8);
        if (b) {
            l = b;
            size = b->size;
        }
    }
    if (l && l->n > 0) {
        p = l->blocks[--l->n];
        c->st.cache_hits++;
        c->st.bytes_cached -= size;
        if (pool && !pool_adopt(pool, p)) { /* cannot track it: give it back */
            l->n++;
            c->st.cache_hits--;
            c->st.bytes_cached += size;
            p = NULL;
            pool = NULL;
            pthread_mutex_unlock(&c->mu);
            pl_error_set(PL_ERR_NOMEM, "pl_alloc: the graph pool's block list");
            return NULL;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (!p) {
        char before[200], why[200], dn[32];
        snprintf(before, sizeof before, "%s", pl_error_message());
        p = raw_alloc(dev, size);
        if (!p) { /* give cached blocks back and try once more */
            pl_alloc_empty_cache(dev);
            p = raw_alloc(dev, size);
        }
        if (!p) { /* as torch's OutOfMemoryError, with the backend's reason when it gave one */
            const char *m = pl_error_message();
            snprintf(why, sizeof why, "%s", strcmp(m, before) ? m : "");
            pl_alloc_stats as = pl_alloc_get_stats(dev);
            pl_error_set(PL_ERR_NOMEM, "out of memory allocating %.2f MiB on %s: %.2f MiB held by "
                         "tensors (peak %.2f MiB), cached blocks released and the allocation "
                         "retried%s%s", size / 1048576.0, pl_device_str(dev, dn, sizeof dn),
                         as.bytes_in_use / 1048576.0, as.peak_bytes / 1048576.0,
                         why[0] ? "; " : "", why);
            return NULL;
        }
        pthread_mutex_lock(&c->mu);
        if (pool && !pool_adopt(pool, p)) {
            pthread_mutex_unlock(&c->mu);
            raw_free(dev, p);
            pl_error_set(PL_ERR_NOMEM, "pl_alloc: the graph pool's block list");
            return NULL;
        }
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
    pl_mempool *pool = dev.type != PL_DEVICE_CPU ? owning_pool(dev, ptr) : NULL;
    if (pool && !pool->released) {
        free_list *pl = find_list_in(pool->lists, &pool->n_lists, capacity);
        if (pl && list_push(pl, ptr)) {
            c->st.bytes_cached += capacity;
            pthread_mutex_unlock(&c->mu);
            return;
        }
        pool_disown(pool, ptr); /* cannot keep it: the device's cache takes it */
    } else if (pool) {
        pool_disown(pool, ptr);
        if (pool->n_owned == 0) pool_free_struct(pool);
    }
    free_list *l = find_list(c, capacity);
    bool cached = l && list_push(l, ptr);
    if (cached) c->st.bytes_cached += capacity;
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

/* ---- graph-private pools (graph_internal.h) ---- */

pl_mempool *pl_alloc_pool_new(pl_device dev) {
    device_cache *c = cache_for(dev);
    if (!c || dev.type == PL_DEVICE_CPU) {
        pl_error_set(PL_ERR_DEVICE, "pl_alloc_pool_new: a graph pool needs an accelerator device");
        return NULL;
    }
    pl_mempool *p = calloc(1, sizeof *p);
    if (!p) {
        pl_error_set(PL_ERR_NOMEM, "pl_alloc_pool_new");
        return NULL;
    }
    p->dev = dev;
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < MAX_POOLS && slot < 0; i++)
        if (!g_pools[dev.type][dev.index][i]) slot = i;
    if (slot >= 0) g_pools[dev.type][dev.index][slot] = p;
    pthread_mutex_unlock(&c->mu);
    if (slot < 0) {
        free(p);
        pl_error_set(PL_ERR_INVALID, "pl_alloc_pool_new: more than %d graph pools", MAX_POOLS);
        return NULL;
    }
    return p;
}

pl_mempool *pl_alloc_pool_use(pl_mempool *p) {
    pl_mempool *prev = tl_pool;
    tl_pool = p;
    return prev;
}

size_t pl_alloc_pool_blocks(pl_mempool *p) {
    if (!p) return 0;
    device_cache *c = cache_for(p->dev);
    pthread_mutex_lock(&c->mu);
    size_t n = p->n_owned;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static int by_base(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const pl_step_block *)a)->base, y = (uintptr_t)((const pl_step_block *)b)->base;
    return x < y ? -1 : x > y;
}

pl_step_block *pl_alloc_pool_free_blocks(pl_mempool *p, size_t *n) {
    *n = 0;
    device_cache *c = p ? cache_for(p->dev) : NULL;
    if (!c) return NULL;
    pthread_mutex_lock(&c->mu);
    size_t total = 0;
    for (int i = 0; i < p->n_lists; i++) total += (size_t)p->lists[i].n;
    pl_step_block *b = total ? malloc(total * sizeof *b) : NULL;
    for (int i = 0; b && i < p->n_lists; i++)
        for (int j = 0; j < p->lists[i].n; j++)
            b[(*n)++] = (pl_step_block){p->lists[i].blocks[j], p->lists[i].size};
    pthread_mutex_unlock(&c->mu);
    if (b) qsort(b, *n, sizeof *b, by_base);
    return b;
}

void pl_alloc_pool_release(pl_mempool *p) {
    if (!p) return;
    if (tl_pool == p) tl_pool = NULL;
    device_cache *c = cache_for(p->dev);
    pthread_mutex_lock(&c->mu);
    /* its free blocks go to the device's cache; blocks still in use follow
     * when they are freed (pl_free), and the last one frees the pool */
    for (int i = 0; i < p->n_lists; i++) {
        free_list *pl = &p->lists[i];
        free_list *l = find_list(c, pl->size);
        for (int j = 0; j < pl->n; j++) {
            pool_disown(p, pl->blocks[j]);
            if (!l || !list_push(l, pl->blocks[j])) {
                c->st.bytes_cached -= pl->size;
                c->st.bytes_reserved -= pl->size;
                raw_free(p->dev, pl->blocks[j]);
            }
        }
        pl->n = 0;
    }
    p->released = true;
    if (p->n_owned == 0) pool_free_struct(p);
    pthread_mutex_unlock(&c->mu);
}
