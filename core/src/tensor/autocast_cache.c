/* autocast_cache.c - torch.autocast's cast cache: inside a forward (the
 * trainer opens a scope around each model forward), a trainable parameter's
 * cast to the autocast dtype is made once and every further matmul / linear
 * of the forward reuses it, instead of one cast per use. The scope's end
 * releases the cache's references; the tape keeps what backward reads.
 *
 * What is cached is torch's rule (aten/src/ATen/autocast_mode.h,
 * cached_cast): an f32 leaf that requires grad (a trainable parameter), cast
 * to the autocast dtype. Frozen weights are not: their casts are transient
 * unless the tape keeps them for dX, and caching them would pin a half
 * copy of every weight through a checkpointed (no-grad) forward. One
 * difference from torch: an entry made with grad mode off (not recorded:
 * the router's no-grad pass, a checkpointed layer) is not handed to a use
 * with grad mode on, where it would cut the parameter's gradient; that use
 * casts again and replaces the entry.
 *
 * Thread-local, like the tape. The cache retains the source tensor, so its
 * address cannot be reused by another tensor while the entry lives. */
#include <stdlib.h>

#include "internal.h"

typedef struct entry {
    pl_tensor *src; /* retained */
    pl_tensor *dst; /* retained: src cast to dt */
    pl_dtype dt;
    bool recorded; /* made with grad mode on (dst carries the cast's node) */
} entry;

static _Thread_local entry *tl_cache;
static _Thread_local int tl_n, tl_cap, tl_depth;
static _Thread_local pl_autocast_cache_stats tl_stats;

void pl_autocast_cache_begin(void) {
    tl_depth++;
}

void pl_autocast_cache_end(void) {
    if (tl_depth > 0 && --tl_depth > 0) return;
    for (int i = 0; i < tl_n; i++) {
        pl_tensor_release(tl_cache[i].dst);
        pl_tensor_release(tl_cache[i].src);
    }
    tl_n = 0;
}

pl_autocast_cache_stats pl_autocast_cache_stats_get(void) {
    return tl_stats;
}

void pl_autocast_cache_stats_reset(void) {
    tl_stats = (pl_autocast_cache_stats){0};
}

pl_tensor *pl_autocast_operand(pl_tensor *a, pl_dtype dt) {
    if (!a || a->dtype == dt) return pl_cast(a, dt);
    bool grad = pl_grad_enabled();
    bool cacheable = tl_depth > 0 && a->dtype == PL_F32 && a->requires_grad && !a->grad_fn;
    tl_stats.casts_requested++;
    if (!cacheable) {
        tl_stats.casts++;
        return pl_cast(a, dt);
    }
    int slot = -1;
    for (int i = 0; i < tl_n; i++)
        if (tl_cache[i].src == a && tl_cache[i].dt == dt) {
            if (tl_cache[i].recorded || !grad) { /* a hit */
                tl_stats.hits++;
                return pl_op_result(pl_tensor_retain(tl_cache[i].dst));
            }
            slot = i; /* made without grad, wanted with it: cast again */
            break;
        }
    tl_stats.casts++;
    pl_tensor *r = pl_cast(a, dt);
    if (!r) return NULL;
    if (slot < 0) {
        if (tl_n == tl_cap) {
            int nc = tl_cap ? 2 * tl_cap : 64;
            entry *ne = realloc(tl_cache, (size_t)nc * sizeof *ne);
            if (!ne) return r; /* no cache entry: still a correct cast */
            tl_cache = ne;
            tl_cap = nc;
        }
        slot = tl_n++;
        tl_cache[slot].src = pl_tensor_retain(a);
    } else {
        pl_tensor_release(tl_cache[slot].dst);
    }
    tl_cache[slot].dst = pl_tensor_retain(r);
    tl_cache[slot].dt = dt;
    tl_cache[slot].recorded = grad;
    return r;
}
