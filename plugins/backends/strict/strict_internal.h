/* strict_internal.h - what strict.c shares with strict_fuse.c: a captured
 * graph's recorded calls and the fusion pass over them (backend.h, "Seeing
 * the step"). Not installed. */
#ifndef PL_STRICT_INTERNAL_H
#define PL_STRICT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "pipeline/backend.h"

/* One recorded call of a captured step, in issue order. REC_KERNEL: a deep
 * copy of its pl_kernel_args (strict.c, rec_kernel); REC_COPY / REC_MEMSET:
 * a device-to-device copy / memset of n bytes; REC_FUSED: calls the fusion
 * pass replaced by one, run as the kernel `fused` on `a` (one kernel call);
 * REC_NONE: a call a fusion took in (skipped). */
typedef enum { REC_KERNEL, REC_COPY, REC_MEMSET, REC_FUSED, REC_NONE } rec_kind;

typedef struct rec {
    rec_kind kind;
    bool backward;
    pl_kernel_args a;
    pl_kernel_fn fused;
    void *dst;
    const void *src;
    size_t n;
    int v;
} rec;

/* The fusion pass (strict_fuse.c): fuses, in r[0..n), each square (f32,
 * contiguous) followed by a sum over all of its elements whose squares are
 * dead after the sum (backend.h's liveness rule with facts->released), into
 * one REC_FUSED sum of squares (with the add of a running total after it);
 * and each f32 matmul followed by the add of a bias row whose product is
 * dead after the add, into one REC_FUSED GEMM with a bias epilogue. The
 * records taken in become REC_NONE. Writes
 * facts->n_fused and facts->fused. Returns how many it fused. */
int st_fuse_step(rec *r, size_t n, pl_step_facts *facts);

#endif
