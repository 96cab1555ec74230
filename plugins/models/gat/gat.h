/* gat.h - graph attention network internals shared by the plugin and its
 * test (not part of the SDK; the plugin exports only pl_plugin_entry).
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
    pl_run_context *ctx; /* borrowed; live counters read at every forward */
    gat_graph_cache graph;
    gat_target_cache target[PL_SPLIT_COUNT];
} gat_model;

/* Create the parameters into ctx->params (Glorot init from ctx->seed). */
pl_status gat_model_new(const gat_opts *o, pl_run_context *ctx, gat_model **out);
void gat_model_free(gat_model *m);

/* One GATConv (PyG semantics, edges already self-looped as wanted):
 * x [N, F_in] -> [N, H*C] (concat) or [N, C] (mean over heads). */
pl_tensor *gat_conv(gat_model *m, const gat_layer *L, pl_tensor *x, pl_tensor *src, pl_tensor *dst,
                    double attn_p, uint64_t counter, bool training);

/* Edges as the layers see them (cached per graph): self loops applied when
 * the option is set. Returned tensors are borrowed from the cache. */
pl_status gat_edges(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                    pl_tensor **src, pl_tensor **dst);

/* Whole network: logits [N, num_classes]. Dropout counters come from
 * ctx->micro_step (training only). */
pl_tensor *gat_logits(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training);

#endif
