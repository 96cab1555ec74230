/* graph_internal.h - what the core's ops and allocator share with graph.c
 * (graph.h is the public side). Not installed. */
#ifndef PL_GRAPH_INTERNAL_H
#define PL_GRAPH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "pipeline/backend.h"
#include "pipeline/graph.h"

/* ---- alloc.c: graph-private pools ----
 * A pool on an accelerator device. While it is the calling thread's current
 * pool (pl_alloc_pool_use), that thread's pl_alloc on its device is served
 * from it (its own free blocks, then a block taken from the device's cache,
 * then raw_alloc); its blocks return to it when freed, from any thread, and
 * are handed out only while it is current. NULL with the error set. */
typedef struct pl_mempool pl_mempool;
pl_mempool *pl_alloc_pool_new(pl_device dev);
/* Make p (NULL: none) the calling thread's current pool; returns the previous. */
pl_mempool *pl_alloc_pool_use(pl_mempool *p);
/* Blocks the pool owns (in use or free in it). */
size_t pl_alloc_pool_blocks(pl_mempool *p);
/* The pool's free blocks (base, capacity) sorted by base, in a new array
 * (free()) of *n; NULL with *n 0 when there are none or no memory (then a
 * backend sees nothing released and fuses nothing: safe). */
pl_step_block *pl_alloc_pool_free_blocks(pl_mempool *p, size_t *n);
/* Give the pool's free blocks to the device's cache; blocks in use follow
 * when freed; the pool is freed with its last block. NULL: no-op. */
void pl_alloc_pool_release(pl_mempool *p);

/* ---- ops_optim.c: the optimizer calls while capturing / refreshing ----
 * 0: eager (coefficients by value in p.extra); 1: capturing; 2: refreshing. */
int pl_graph_optim_mode(void);
/* Capturing: a new slot for this call (op, param) holding coef (n bytes,
 * <= 64); returns its device view (f32 [16]; a view owned by the caller, the
 * memory by the graph), or NULL
 * with the error set. */
pl_tensor *pl_graph_optim_slot(pl_op op, const pl_tensor *param, const void *coef, size_t n);
/* Capturing, a multi-tensor call (ops.def's *_step_multi): `count` (1..64)
 * adjacent slots, slot j for param[j] holding the n bytes at coef + j *
 * stride; returns their device view (f32 [16 * count], owned by the
 * caller), or NULL with the error set. Each slot is one call of the list,
 * refreshed as (op, param[j]). */
pl_tensor *pl_graph_optim_slots(pl_op op, const pl_tensor *const *param, const void *coef,
                                size_t n, size_t stride, int count);
/* Refreshing: store coef for the next call, which must be (op, param). */
pl_status pl_graph_optim_refresh(pl_op op, const pl_tensor *param, const void *coef, size_t n);

/* ---- ops_index.c: dropout ----
 * Called by pl_dropout for an active dropout (training, p > 0) with its
 * counter. Learning: records it, returns NULL. Capturing: returns the
 * graph's device offset (i64 [1], borrowed) and sets *stride to this call's
 * counter step per micro-step; NULL with the error set when the calls do
 * not match the learned ones. Otherwise NULL, error untouched. */
pl_tensor *pl_graph_dropout_offset(uint64_t counter, int64_t *stride);
/* Whether pl_dropout must consult pl_graph_dropout_offset. */
bool pl_graph_dropout_active(void);

/* A core-side violation while capturing (kept as the capture's first error
 * unless one is kept already); returns the status given. */
pl_status pl_graph_violation(pl_status s);

#endif
