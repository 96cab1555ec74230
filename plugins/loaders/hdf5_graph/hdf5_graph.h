/* hdf5_graph.h - internal to the hdf5_graph plugin: the loader's state and
 * the helpers its files share. Nothing here is exported from the .so (the
 * plugin is built with hidden visibility). */
#ifndef HDF5_GRAPH_H
#define HDF5_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"
#include "loader_kit.h"

enum { NB_FIELDS = 8 }; /* batch fields of the widest mode (panel: 7) */

/* One split of graphs mode: its graphs, their epoch order, the batch
 * boundaries and the staging tensors (device) holding the whole split. */
typedef struct gsplit {
    int64_t ng;                           /* graphs in the split */
    int64_t nodes, edges;                 /* totals over the split (edges after self loops) */
    int64_t nb;                           /* batches served per epoch (after drop_last) */
    int64_t nb_all;                       /* ceil(ng / B): batches laid out in staging */
    int64_t *ids;                         /* graph ids in file order */
    int64_t *order;                       /* graph ids in the current epoch order */
    int64_t *bnode, *bedge;               /* [nb_all + 1] staging row offsets of each batch */
    pl_tensor *x, *src, *dst, *batch, *y; /* y: NULL when predicting without targets */
    pl_tensor *gid;                       /* predict only: i64 [ng] file index of each graph */
    int64_t arranged_epoch;               /* train: epoch whose order is staged; -1 none */
} gsplit;

typedef struct graph {
    pl_run_context *ctx;
    char path[1024];
    bool graphs_mode;
    void *panel;  /* deprecated mode = panel: the hdf5_panel loader it forwards to; else NULL */
    int predict;  /* `pipeline predict`: the one split served (meta predict_split); -1 training */
    bool has_y;   /* labels (node) / targets (graphs) in the file: always when training */
    /* node mode */
    pl_tensor *x, *src, *dst, *y, *mask[PL_SPLIT_COUNT];
    /* data parallel (g_shard): this rank's part of each split's mask, NULL unsharded */
    pl_tensor *rank_mask[PL_SPLIT_COUNT];
    int64_t N, F, E, C, count[PL_SPLIT_COUNT];
    /* graphs mode: host copies (after self loops, normalization, standardization) */
    int64_t NG, K, B;
    bool shuffle, drop_last;
    int64_t *nptr, *eptr; /* [NG + 1] */
    float *hx, *hy;       /* [N, F], [NG, K] */
    int64_t *hsrc, *hdst; /* [E] graph-local ids */
    gsplit sp[PL_SPLIT_COUNT];
    /* host scratch for a non-CPU device (sized for the largest split) */
    float *sx, *sy;
    int64_t *ssrc, *sdst, *sbatch;
    pl_tensor *views[NB_FIELDS];
    int nviews;
    /* every mode: the epoch cursor */
    int cur;
    int64_t cur_batch; /* next batch of split `cur` */
    pl_loader_stats st;
} graph;

/* ---- helpers of hdf5_graph.c ------------------------------------------- */

/* ctx->device (the CPU without a context). */
pl_device dev_of(const graph *G);
/* Dataset `name` of open file f read whole as `memtype` into a new malloc'd
 * *out (pl_h5_read_alloc: rank in [min_rank, max_rank], axis i == want[i]
 * where want[i] >= 0; errors name G->path and the dataset); dims receives
 * the shape, *rank (may be NULL) the rank; the bytes count in G->st. */
pl_status read_ds(graph *G, hid_t f, const char *name, hid_t memtype, int min_rank, int max_rank,
                  const int64_t *want, void **out, int64_t *dims, int *rank);
/* Add view `v` (owned by G until release_views) to batch `out` as `name`;
 * -1 when v is NULL. */
int emit(graph *G, pl_batch *out, const char *name, pl_tensor *v);
void release_views(graph *G);

#endif
