/* hdf5_panel.h - internals of the hdf5_panel loader shared by its files (not
 * part of the SDK; nothing here is exported from the .so).
 *
 *   hdf5_panel.c   the plugin: options, vtable, create/destroy, epochs,
 *                  batches (views of the split's staging)
 *   panel_read.c   reading and checking the panel file, splits by date,
 *                  normalization, meta
 *   panel_stage.c  the day-graphs (top-k |corr|), the per-split staging on
 *                  the device and its layout in epoch order
 *
 * Calls go one way: hdf5_panel.c -> panel_read.c -> panel_stage.c (and
 * hdf5_panel.c -> panel_stage.c for an epoch's layout and per-batch graphs).
 */
#ifndef HDF5_PANEL_H
#define HDF5_PANEL_H

#include <hdf5.h>
#include <stdbool.h>
#include <stdint.h>

#include "loader_kit.h"
#include "pipeline/pipeline.h"

/* One split: its days, their epoch order, and its staging tensors. */
typedef struct psplit {
    int64_t nd;                               /* days (usable rows) in the split */
    int64_t B;                                /* days per batch */
    int64_t nb;                               /* batches served per epoch (after drop_last) */
    int64_t *rows;                            /* the days' rows t, file order */
    int64_t *order;                           /* the days' rows t, epoch order */
    pl_tensor *x, *src, *dst, *y, *ret, *fac; /* fac: NULL without factors */
    int64_t arranged_epoch;                   /* train: epoch whose order is staged; -1 none */
} psplit;

/* Scratch of one day's graph: the centered series [S, L], their sums of
 * squares [S] and the |corr| matrix [S, S]. */
typedef struct dscratch {
    double *c, *ss, *a;
} dscratch;

typedef struct panel {
    pl_run_context *ctx;
    char path[1024];
    pl_loader_stats st;
    lk_views views; /* the current batch's views */
    int cur;        /* the epoch cursor: split (-1 before any epoch_begin), next batch */
    int64_t cur_batch;
    int64_t T, S, F, K; /* rows, stocks, features, factors (0: none) */
    int64_t W, L, k;    /* window, lookback, top k */
    int64_t t0;         /* first usable row: max(W, L) - 1 */
    int64_t E_day;      /* edges per day: S * k (+ S self loops) */
    bool loops, per_batch, shuffle;
    float *hx;            /* [T, S, F] features (standardized) */
    float *g;             /* [T, S] graph_feature, as in the file */
    float *hy, *hret;     /* [T, S] normalized target, target as in the file */
    float *hfac;          /* [T, S, K] factors as in the file */
    int64_t *esrc, *edst; /* once: [(T - t0) * E_day] each usable day's edges, stock ids */
    psplit sp[PL_SPLIT_COUNT];
    pl_tensor *batch; /* i64 [B_max * S]: node d*S + s -> d */
    /* host scratch for a non-CPU device, sized for the largest split */
    float *sx, *sy, *sret, *sfac;
    int64_t *ssrc, *sdst; /* also per_batch's edges of one batch on such a device */
    dscratch ds;          /* per_batch: the graph builder's scratch */
    int64_t graphs_built;
    double build_ms;
} panel;

static inline pl_device pn_dev(const panel *P) {
    return P->ctx ? P->ctx->device : PL_CPU;
}

/* a * b * c into *out when it stays below 2^58 elements (file sizes are untrusted). */
static inline bool pn_size3(int64_t a, int64_t b, int64_t c, int64_t *out) {
    int64_t ab;
    return !__builtin_mul_overflow(a, b, &ab) && !__builtin_mul_overflow(ab, c, out) &&
           *out < ((int64_t)1 << 58);
}

/* ---- panel_read.c ---- */
/* Read, check and stage the panel file cfg names (README "Layout"); P holds
 * ctx and path. On error P may be partly built: pn_free frees it. */
pl_status pn_read(panel *P, const pl_config_section *cfg);

/* ---- panel_stage.c ---- */
pl_status pn_dscratch_init(dscratch *d, int64_t S, int64_t L);
void pn_dscratch_free(dscratch *d);
/* graphs = once: every usable day's graph into P->esrc / P->edst. */
pl_status pn_build_all(panel *P);
/* Staging tensors of every split, the shared batch vector and, for a
 * non-CPU device, the host scratch. */
pl_status pn_make_staging(panel *P);
/* Lay split Sp out in Sp->order into its staging tensors. */
pl_status pn_arrange(panel *P, psplit *Sp);
/* graphs = per_batch: days [d0, d0 + n) of Sp's order rebuilt into the
 * batch's edge rows (batch-local ids). */
pl_status pn_rebuild_batch(panel *P, psplit *Sp, int64_t d0, int64_t n);

#endif
