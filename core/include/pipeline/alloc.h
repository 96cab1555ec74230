/* alloc.h - per-device caching allocator and its counters.
 *
 * Blocks are rounded up to size classes (powers of two up to 64 KiB, then
 * multiples of 1/8 of the enclosing power of two up to 1 MiB and of 1/64
 * above) and freed blocks are kept on per-class free lists; a miss above
 * 64 KiB takes the smallest cached block at most 1/8 larger (1/2 in host
 * memory), so a loop over varying batch shapes reaches a steady state in
 * which no system allocation (malloc / cudaMalloc) happens.
 *
 * Counters mirror PyTorch's caching allocator (torch.cuda.memory_stats):
 *   bytes_in_use        = torch.cuda.memory_allocated()     (blocks handed out)
 *   peak_bytes          = torch.cuda.max_memory_allocated()
 *   bytes_reserved      = torch.cuda.memory_reserved()      (handed out + cached)
 *   peak_reserved_bytes = torch.cuda.max_memory_reserved()
 * Sizes are the size-class rounded block sizes (PyTorch counts its 512-byte
 * rounded sizes the same way). pl_alloc_reset_peak is
 * torch.cuda.reset_peak_memory_stats: both peaks restart at the current
 * values. On the CUDA backend every kernel of a thread runs on one stream
 * (the thread's default stream; the trainer computes on one thread), so a
 * block freed by the host and handed out again is only touched by kernels
 * issued after the ones that used it: stream-ordered reuse without events.
 * A captured graph's allocations come from a pool of its own whose blocks
 * no other work gets while the graph lives (graph.h; alloc.c). The strict device (plugins/backends/strict) sits under the same
 * allocator, so it reports the same pair without a GPU.
 * Thread-safe (one mutex per device).
 */
#ifndef PIPELINE_ALLOC_H
#define PIPELINE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pl_alloc_stats {
    size_t bytes_in_use;    /* bytes of blocks handed out (size-class rounded) */
    size_t peak_bytes;      /* max of bytes_in_use since start / last reset */
    size_t bytes_cached;    /* bytes held in free lists */
    size_t bytes_reserved;  /* bytes obtained from the system and not returned */
    size_t peak_reserved_bytes; /* max of bytes_reserved since start / last reset */
    uint64_t allocations;   /* pl_alloc calls */
    uint64_t cache_hits;    /* pl_alloc calls served from a free list */
    uint64_t system_allocs; /* calls to the device's raw allocator */
} pl_alloc_stats;

/* Allocate a block of at least `nbytes` on `dev` (64-byte aligned on CPU).
 * Returns NULL with PL_ERR_NOMEM set on failure. `*capacity` (may be NULL)
 * receives the block's real size. */
void *pl_alloc(pl_device dev, size_t nbytes, size_t *capacity);
/* Return a block obtained from pl_alloc (goes to the cache, not the system). */
void pl_free(pl_device dev, void *ptr, size_t capacity);
/* Counters of one device. */
pl_alloc_stats pl_alloc_get_stats(pl_device dev);
/* Set peak_bytes = bytes_in_use and peak_reserved_bytes = bytes_reserved
 * (start of a new phase; torch.cuda.reset_peak_memory_stats). */
void pl_alloc_reset_peak(pl_device dev);
/* Give cached blocks back to the system. */
void pl_alloc_empty_cache(pl_device dev);
/* Whether the calling thread is inside pl_alloc's call of the backend's
 * raw_alloc. A backend capturing a graph (backend.h, capture_begin) accepts
 * a raw allocation from the capturing thread only then: the core's
 * allocator serves a capture from the graph's pool (graph.h); a raw
 * allocation from anywhere else (a kernel's own scratch) would not be
 * reserved for the graph. (ABI 2.8) */
bool pl_alloc_in_raw_alloc(void);

#ifdef __cplusplus
}
#endif
#endif
