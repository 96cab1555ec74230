/* hdf5_graph.h - internal to the hdf5_graph plugin: the loader's state and
 * the helpers its files share. Nothing here is exported from the .so (the
 * plugin is built with hidden visibility). */
#ifndef HDF5_GRAPH_H
#define HDF5_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"
#include <cjson/cJSON.h>

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
    pl_tensor *gmask;            /* padding only: f32 [nb_all * pad_graphs] 1 real, 0 padding */
    int64_t xrows, erows, yrows; /* staging rows: nodes, edges, graphs (padded: nb_all * budget) */
    int64_t arranged_epoch;               /* train: epoch whose order is staged; -1 none */
} gsplit;

typedef struct graph {
    pl_run_context *ctx;
    char path[1024];
    bool graphs_mode;
    void *panel; /* deprecated mode = panel: the hdf5_panel loader it forwards to; else NULL */
    int predict; /* `pipeline predict`: the one split served (meta predict_split); -1 training */
    bool has_y;  /* labels (node) / targets (graphs) in the file: always when training */
    /* node mode */
    pl_tensor *x, *src, *dst, *y, *mask[PL_SPLIT_COUNT];
    /* data parallel (g_shard): this rank's part of each split's mask, NULL unsharded */
    pl_tensor *rank_mask[PL_SPLIT_COUNT];
    int64_t N, F, E, C, count[PL_SPLIT_COUNT];
    /* graphs mode: host copies (after self loops, normalization, standardization) */
    int64_t NG, K, B;
    bool shuffle, drop_last;
    /* static-shape batches (jraph pad_with_graphs): every batch padded to
     * pad_nodes nodes, pad_edges edges and pad_graphs graphs; off: 0 */
    bool pad;
    int64_t pad_nodes, pad_edges, pad_graphs;
    bool pad_derived;     /* the node / edge budgets were derived (largest possible batch) */
    int64_t *nptr, *eptr; /* [NG + 1] */
    float *hx, *hy;       /* [N, F], [NG, K] */
    int64_t *hsrc, *hdst; /* [E] graph-local ids */
    gsplit sp[PL_SPLIT_COUNT];
    /* host scratch for a non-CPU device (sized for the largest split) */
    float *sx, *sy;
    int64_t *ssrc, *sdst, *sbatch;
    float *sgmask;
    pl_tensor *views[NB_FIELDS];
    int nviews;
    /* every mode: the epoch cursor */
    int cur;
    int64_t cur_batch; /* next batch of split `cur` */
    pl_loader_stats st;
} graph;

/* ctx->device (the CPU without a context). */
static inline pl_device dev_of(const graph *G) {
    return G->ctx ? G->ctx->device : PL_CPU;
}

/* ---- graph_io.c: both modes' reading helpers ---------------------------- */

/* Dataset `name` of open file f read whole as `memtype` into a new malloc'd
 * *out (lk_read_ds: rank in [min_rank, max_rank], axis i == want[i] where
 * want[i] >= 0; errors name G->path and the dataset); dims receives the
 * shape, *rank (may be NULL) the rank; the bytes count in G->st. */
pl_status read_ds(graph *G, hid_t f, const char *name, hid_t memtype, int min_rank, int max_rank,
                  const int64_t *want, void **out, int64_t *dims, int *rank);
/* x = (x - min) / clamp(row sum of (x - min), 1) over rows [r0, r1) of [*, F]. */
void normalize_rows(float *x, int64_t r0, int64_t r1, int64_t F);
/* The first edge e in [e0, e1) of ei ([2, E]) with an end outside 0..n-1
 * (*row: which end), or -1. */
int64_t bad_edge(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n, int *row);
/* Edges [e0, e1) into src / dst from k on, without self loops, then (i, i)
 * for every node when `loops`; returns the new k. */
int64_t copy_edges(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n, bool loops,
                   int64_t *src, int64_t *dst, int64_t k);
/* The mask options' names (and default datasets): train_mask, val_mask, test_mask. */
extern const char *const split_mask_key[PL_SPLIT_COUNT];
/* Predict: the mask of split G->predict ([n] u8) into *out, or every entry
 * when the file has no mask at all; under the HDF5 lock. */
pl_status read_predict_mask(graph *G, hid_t f, const pl_config_section *cfg, int64_t n,
                            const char *unit, uint8_t **out);
/* Write `root` (consumed) as ctx->run_dir/NAME; a no-op without a run dir. */
pl_status run_json_write(const graph *G, const char *name, cJSON *root);
/* Parse ctx->run_dir/NAME into *out (NULL and PL_OK when absent). */
pl_status run_json_read(const graph *G, const char *name, char *path, size_t np, cJSON **out);
/* A member of `root` that must be an integer in [lo, hi]. */
pl_status json_int(const cJSON *root, const char *path, const char *key, int64_t lo, int64_t hi,
                   int64_t *v);

/* ---- graph_node.c: mode = node ------------------------------------------- */

/* Read, check and cache the one graph (README "mode = node"). */
pl_status gr_create_node(graph *G, const pl_config_section *cfg, pl_run_context *ctx);

/* ---- graph_batches.c: mode = graphs --------------------------------------- */

/* Read, check, standardize and stage the graphs (README "mode = graphs");
 * features_set: the `features` option was given (else the dataset is x). */
pl_status gr_create_graphs(graph *G, const pl_config_section *cfg, pl_run_context *ctx,
                           bool features_set);
/* Lay split S out in S->order into its staging tensors; `epoch`: the train
 * epoch whose order it is (-1: val / test), named by a padding error (a
 * batch over the pad_nodes / pad_edges budget: PL_ERR_CONFIG). */
pl_status gr_arrange(graph *G, gsplit *S, int64_t epoch);
/* The train order of `epoch` (seed + epoch; file order without shuffle). */
void gr_train_order(graph *G, int64_t epoch);

#endif
