/* gat.h - graph attention network internals shared by the plugin, its test
 * and the plugins that compile the layer source gat_layers.c in (stock_gat)
 * (not part of the SDK; each plugin exports only pl_plugin_entry).
 *
 * Shapes: N nodes, E edges (j -> i stored as src[e] = j, dst[e] = i),
 * F_in input features, H heads, C channels per head.
 */
#ifndef PL_MODEL_GAT_H
#define PL_MODEL_GAT_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline/pipeline.h"

#define GAT_MAX_LAYERS 16
#define GAT_MAX_TARGETS 64

/* GAT_ENCODER: every layer a hidden one (heads concatenated or averaged,
 * ELU after each via gat_stack(..., true)), no output layer and no head: the
 * GAT part of another model (stock_gat), which owns the loss. */
typedef enum gat_task { GAT_NODE_CLASSIFICATION = 0, GAT_GRAPH_REGRESSION, GAT_ENCODER } gat_task;
typedef enum gat_readout { GAT_READOUT_MEAN = 0, GAT_READOUT_SUM } gat_readout;
typedef enum gat_loss { GAT_LOSS_MSE = 0, GAT_LOSS_MAE, GAT_LOSS_HUBER } gat_loss;

typedef struct gat_opts {
    int layers;            /* GAT layers (>= 1) */
    int64_t hidden;        /* channels per head of every hidden layer */
    int heads;             /* heads of every hidden layer */
    int output_heads;      /* heads of the output layer (always averaged) */
    double dropout;        /* dropout on each layer's input features */
    double attn_dropout;   /* dropout on the attention coefficients */
    double negative_slope; /* LeakyReLU slope of the attention logits */
    bool concat;           /* hidden layers: concatenate heads (else average) */
    bool residual;         /* PyG residual: out += x @ W_res^T */
    bool add_self_loops;   /* remove existing self loops, add one per node */
    bool bias;
    int64_t in_features, num_classes;
    /* graph-level regression (task = graph_regression): every GAT layer is a
     * hidden layer (ELU after each), then a readout over each graph's nodes
     * and a head: Linear(D, K), or Linear(D, head_hidden) -> ELU -> Linear(., K) */
    gat_task task;
    gat_readout readout;
    gat_loss loss;
    double huber_delta;
    int64_t head_hidden;  /* 0: linear head */
    int64_t num_targets;  /* K (graph_regression) */
    double shift[GAT_MAX_TARGETS], scale[GAT_MAX_TARGETS]; /* y = y_std * scale + shift */
} gat_opts;

/* One GATConv: parameter indices into ctx->params (-1 when absent). */
typedef struct gat_layer {
    int64_t in, out; /* F_in, C */
    int heads;
    bool concat;
    int w, att_src, att_dst, bias, res; /* w: [H*C, F_in]; att_*: [H, C] */
} gat_layer;

typedef struct gat_graph_cache {
    const void *src_key, *dst_key; /* data pointers of the batch's edge tensors */
    int64_t n_edges, n_nodes;
    pl_tensor *src, *dst;          /* edges used by the layers (self loops applied) */
} gat_graph_cache;

typedef struct gat_target_cache {
    const void *y_key, *mask_key;
    int64_t n;
    pl_tensor *target; /* i64 [N]: y where mask else -100 (ignored) */
    int64_t count;     /* masked nodes */
} gat_target_cache;

typedef struct gat_model {
    gat_opts o;
    gat_layer layer[GAT_MAX_LAYERS];
    int head_w[2], head_b[2]; /* graph_regression head (index -1: absent) */
    pl_run_context *ctx; /* borrowed; live counters read at every forward */
    gat_graph_cache graph;
    gat_target_cache target[PL_SPLIT_COUNT];
    int64_t pred_rows; /* `pipeline predict`: rows named so far (outputs_batch) */
} gat_model;

/* ---- gat_layers.c: the layers, shared with stock_gat ---- */

/* Create the parameters into ctx->params (Glorot init from ctx->seed):
 * gat.layers.<l>.{lin.weight, att_src, att_dst, res.weight, bias}, and
 * gat.head.* for graph regression. */
pl_status gat_model_new(const gat_opts *o, pl_run_context *ctx, gat_model **out);
/* Frees the caches and the model. */
void gat_model_free(gat_model *m);

/* A new f32 parameter of `shape` on ctx's device, U(-bound, bound) from
 * (ctx->seed, stream) (bound 0: zeros), requires_grad, registered in
 * ctx->params under `name` with `tags` / `role`; its index in *idx. Errors
 * are prefixed "<who>: parameter <name>". */
pl_status gat_add_param(pl_run_context *ctx, const char *who, const char *name, int ndim,
                        const int64_t *shape, double bound, uint64_t stream, unsigned tags,
                        const char *role, int *idx);
/* Parameter `idx` of ctx->params (borrowed); NULL for -1 (absent). */
pl_tensor *gat_param(const gat_model *m, int idx);

/* One GATConv (PyG semantics, edges already self-looped as wanted):
 * x [N, F_in] -> [N, H*C] (concat) or [N, C] (mean over heads). */
pl_tensor *gat_conv(gat_model *m, const gat_layer *L, pl_tensor *x, pl_tensor *src, pl_tensor *dst,
                    double attn_p, uint64_t counter, bool training);

/* Edges as the layers see them (cached per graph): self loops applied when
 * the option is set. Returned tensors are borrowed from the cache. */
pl_status gat_edges(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                    pl_tensor **src, pl_tensor **dst);

/* Edges of one batch of small graphs, not cached (each batch is a new graph,
 * possibly at the addresses of an earlier one): self loops applied when the
 * option is set, else the batch's own i64 tensors are returned. The results
 * belong to the caller's frame. */
pl_status gat_edges_batch(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                          pl_tensor **src, pl_tensor **dst);

/* The layer stack on x [N, F_in]: per layer dropout(o.dropout) -> GATConv
 * -> ELU, the ELU after the last layer only when `elu_last`. Dropout
 * counters: 2 per layer from ctx->micro_step * 2 * GAT_MAX_LAYERS (training
 * only; another user of ctx->seed must draw its counters elsewhere). */
pl_tensor *gat_stack(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training,
                     bool elu_last);

/* ---- gat.c: the gat plugin's networks ---- */

/* Whole network: logits [N, num_classes]. Dropout counters come from
 * ctx->micro_step (training only). */
pl_tensor *gat_logits(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training);

/* Graph-level regression: per-graph predictions f32 [B, K] (standardized
 * target units) for nodes x f32 [n, F_in] with edges src/dst i64 [e]
 * (batch-local node ids, self loops as wanted) and graph ids `batch` i64 [n]
 * in [0, num_graphs). Network: the GAT stack with ELU after every layer,
 * gat_readout_pool, then the head (PyG GATConv + global_*_pool + Linear).
 * Returns a tensor of the current frame; NULL with the pl error set on a
 * shape mismatch or an id out of range (named by the failing op). */
pl_tensor *gat_graph_predict(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst,
                             pl_tensor *batch, int64_t num_graphs, bool training);

/* Readout alone: sum (PyG global_add_pool) or mean (global_mean_pool) of
 * h f32 [n, D] over the nodes of each graph, `batch` i64 [n] in
 * [0, num_graphs) -> f32 [B, D]; a graph without nodes gives zeros (PyG's
 * scatter mean). Differentiable in h. NULL with the pl error set when an id
 * is out of range (scatter_add names it). */
pl_tensor *gat_readout_pool(pl_tensor *h, pl_tensor *batch, int64_t num_graphs, gat_readout r);

#endif
