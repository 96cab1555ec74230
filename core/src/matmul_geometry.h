/* matmul_geometry.h - batch geometry of pl_matmul shared by every backend
 * (core only; the CUDA plugin includes it too, so keep it plain C that is
 * also valid C++).
 *
 * C[..., M, N] = op(A)[..., M, K] @ op(B)[..., K, N]: batch dims of C are the
 * broadcast of A's and B's; matrix bi of C uses matrix ia of A and ib of B
 * (pl_mm_batch_off), a broadcast dim having stride 0. */
#ifndef PL_MATMUL_GEOMETRY_H
#define PL_MATMUL_GEOMETRY_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/tensor.h"

typedef struct pl_mm_geo {
    int64_t M, N, K;
    bool ta, tb;
    int bnd;                                  /* batch dims of the output */
    int64_t bshape[PL_MAX_DIMS];
    int64_t sa[PL_MAX_DIMS], sb[PL_MAX_DIMS]; /* matrix-index strides per batch dim */
    int64_t nbatch, na, nb;                   /* matrices in C, A, B */
    bool collapse; /* B shared and A un-transposed: one GEMM of nbatch*M rows */
} pl_mm_geo;

/* flags: bit0 transpose A, bit1 transpose B (PL_OP_MATMUL's p.flags). */
static inline void pl_mm_geo_init(pl_mm_geo *g, const pl_tensor *A, const pl_tensor *B,
                                  const pl_tensor *C, int flags) {
    g->ta = flags & 1;
    g->tb = (flags & 2) != 0;
    int na = A->ndim, nb = B->ndim;
    g->M = g->ta ? A->shape[na - 1] : A->shape[na - 2];
    g->K = g->ta ? A->shape[na - 2] : A->shape[na - 1];
    g->N = g->tb ? B->shape[nb - 2] : B->shape[nb - 1];
    g->bnd = C->ndim - 2;
    g->nbatch = 1;
    for (int d = 0; d < g->bnd; d++) {
        g->bshape[d] = C->shape[d];
        g->nbatch *= C->shape[d];
    }
    int64_t s1 = 1, s2 = 1;
    for (int d = g->bnd - 1; d >= 0; d--) {
        int da = d - (g->bnd - (na - 2)), db = d - (g->bnd - (nb - 2));
        int64_t ea = da >= 0 ? A->shape[da] : 1, eb = db >= 0 ? B->shape[db] : 1;
        g->sa[d] = ea == 1 ? 0 : s1;
        g->sb[d] = eb == 1 ? 0 : s2;
        s1 *= ea;
        s2 *= eb;
    }
    g->na = s1;
    g->nb = s2;
    g->collapse = !g->ta && g->nb == 1 && g->na == g->nbatch;
}

/* Matrix indices into A and B of output matrix bi. */
static inline void pl_mm_batch_off(const pl_mm_geo *g, int64_t bi, int64_t *ia, int64_t *ib) {
    *ia = 0;
    *ib = 0;
    for (int d = g->bnd - 1; d >= 0; d--) {
        int64_t i = bi % g->bshape[d];
        bi /= g->bshape[d];
        *ia += i * g->sa[d];
        *ib += i * g->sb[d];
    }
}

#endif
