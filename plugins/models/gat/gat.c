/* gat - graph attention network for node classification and graph-level
 * regression, from the GATConv layers of gat_layers.c (the layer math and
 * its sources are there).
 *
 * The network: dropout(x) -> GAT -> ELU -> dropout -> ... -> GAT (output
 * layer: num_classes channels, output_heads heads averaged). Loss: cross
 * entropy over the nodes of the batch's `mask` (the split's nodes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gat.h"

#define IGNORE_INDEX (-100)

static pl_tensor *P(const gat_model *m, int idx) { return gat_param(m, idx); }

/* y where mask else IGNORE_INDEX, cached per split. */
static pl_status masked_target(gat_model *m, pl_data_split split, pl_tensor *y, pl_tensor *mask,
                               pl_tensor **out, int64_t *count) {
    char b1[256], b2[256];
    gat_target_cache *c = &m->target[split];
    int64_t n = pl_tensor_numel(y);
    if (y->ndim != 1 || pl_tensor_numel(mask) != n)
        return pl_error_set(PL_ERR_SHAPE, "gat: labels %s must be [N] and mask %s [N]",
                            pl_tensor_describe(y, b1, sizeof b1), pl_tensor_describe(mask, b2, sizeof b2));
    const void *ky = pl_tensor_data(y), *km = pl_tensor_data(mask);
    if (c->target && c->y_key == ky && c->mask_key == km && c->n == n) {
        *out = c->target;
        *count = c->count;
        return PL_OK;
    }
    pl_tensor_release(c->target);
    c->target = NULL;
    pl_status st = PL_OK;
    pl_frame_begin();
    pl_tensor *hy = pl_tensor_to(y, PL_I64, PL_CPU), *hm = pl_tensor_to(mask, PL_I64, PL_CPU);
    pl_tensor *t = hy && hm ? pl_tensor_empty(PL_I64, 1, &n, PL_CPU) : NULL;
    if (!t) st = pl_error_status();
    int64_t k = 0;
    if (!st) {
        const int64_t *vy = pl_tensor_data(hy), *vm = pl_tensor_data(hm);
        int64_t *vt = pl_tensor_data(t);
        for (int64_t i = 0; i < n; i++) {
            bool on = vm[i] != 0 && vy[i] >= 0;
            vt[i] = on ? vy[i] : IGNORE_INDEX;
            k += on;
        }
        pl_tensor *dt = pl_device_eq(m->ctx->device, PL_CPU) ? t : pl_tensor_to(t, PL_I64, m->ctx->device);
        if (!dt) st = pl_error_status();
        else c->target = pl_frame_keep(dt);
    }
    pl_frame_end();
    if (st) return st;
    c->y_key = ky;
    c->mask_key = km;
    c->n = n;
    c->count = k;
    *out = c->target;
    *count = k;
    return PL_OK;
}

pl_tensor *gat_logits(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training) {
    return gat_stack(m, x, src, dst, training, false);
}

/* ---- graph-level regression ------------------------------------------------------- */

pl_tensor *gat_readout_pool(pl_tensor *h, pl_tensor *batch, int64_t num_graphs, gat_readout r) {
    if (!h || !batch) return NULL;
    pl_tensor *sum = pl_scatter_add(h, 0, batch, num_graphs); /* [B, D]: PyG global_add_pool */
    if (!sum || r == GAT_READOUT_SUM) return sum;
    /* global_mean_pool: divide by each graph's node count, counted on the
     * device by the same scatter (no host round trip). count + 1e-12 is the
     * count itself in f32 for count >= 1, and an empty graph gives 0 / 1e-12
     * = 0, as PyG's scatter mean does. */
    pl_tensor *ones = pl_tensor_full(PL_F32, 2, (int64_t[]){h->shape[0], 1}, 1.0, h->device);
    pl_tensor *count = pl_scatter_add(ones, 0, batch, num_graphs); /* [B, 1] */
    return pl_div(sum, pl_add_scalar(count, 1e-12));
}

pl_tensor *gat_graph_predict(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst,
                             pl_tensor *batch, int64_t num_graphs, bool training) {
    pl_tensor *h = gat_readout_pool(gat_stack(m, x, src, dst, training, true), batch, num_graphs,
                                    m->o.readout);
    for (int i = 0; i < 2 && h && m->head_w[i] >= 0; i++) {
        if (i > 0) h = pl_elu(h, 1.0);
        h = pl_linear(h, P(m, m->head_w[i]), P(m, m->head_b[i]));
    }
    return h;
}

/* The loss of pred vs target f32 [G, K] (mean over the rows), or with
 * `w` f32 [G, 1] (1 a real graph, 0 a padding one; hdf5_graph's graph_mask)
 * the mean over the real rows only, on the device (no host read: the step
 * stays capturable): loss(w*pred, w*target) * G / sum(w). A padding row's
 * difference is exactly 0, so it adds 0 to the sum and its gradient is 0;
 * the result is the unpadded mean up to the rounding of the two scalings. */
static pl_tensor *graph_loss(const gat_model *m, pl_tensor *pred, pl_tensor *yt, pl_tensor *w) {
    if (w) {
        pred = pl_mul(pred, w);
        yt = pl_mul(yt, w);
    }
    pl_tensor *loss = m->o.loss == GAT_LOSS_MAE     ? pl_mae_loss(pred, yt)
                      : m->o.loss == GAT_LOSS_HUBER ? pl_huber_loss(pred, yt, m->o.huber_delta)
                                                    : pl_mse_loss(pred, yt);
    if (!w || !loss) return loss;
    return pl_div(pl_scale(loss, (double)w->shape[0]), pl_sum(w, PL_ALL_DIMS, false));
}

static pl_status graph_forward(gat_model *m, const pl_batch *b, bool training, pl_tensor **loss_out,
                               pl_metrics *metrics) {
    pl_tensor *x = pl_batch_get(b, "x"), *es = pl_batch_get(b, "edge_src"),
              *ed = pl_batch_get(b, "edge_dst"), *y = pl_batch_get(b, "y"),
              *bv = pl_batch_get(b, "batch");
    if (!x || !es || !ed || !y || !bv)
        return pl_error_prefix(pl_error_status(),
                               "gat (task = graph_regression): batch needs x, edge_src, edge_dst, batch, y "
                               "(hdf5_graph mode = graphs)");
    /* padded batches (hdf5_graph pad, jraph pad_with_graphs): G >= B + 1 graphs,
     * the padding ones masked out of the loss and the metrics */
    pl_tensor *gm = pl_batch_find(b, "graph_mask");
    char b1[256], b2[256];
    int64_t B = b->size, K = m->o.num_targets, G = gm ? pl_tensor_numel(gm) : B;
    if (x->ndim != 2 || x->shape[1] != m->o.in_features)
        return pl_error_set(PL_ERR_SHAPE, "gat: node features %s, expected [n, %lld]",
                            pl_tensor_describe(x, b1, sizeof b1), (long long)m->o.in_features);
    if (bv->ndim != 1 || bv->shape[0] != x->shape[0])
        return pl_error_set(PL_ERR_SHAPE, "gat: batch vector %s, expected [%lld] (one graph id per node)",
                            pl_tensor_describe(bv, b1, sizeof b1), (long long)x->shape[0]);
    if (gm && (gm->ndim != 1 || G <= B))
        return pl_error_set(
            PL_ERR_SHAPE,
            "gat: graph_mask %s, expected [n_graph] with n_graph > the batch's %lld "
            "graphs (the real ones and at least one padding graph)",
            pl_tensor_describe(gm, b1, sizeof b1), (long long)B);
    if (y->ndim != 2 || y->shape[0] != G || y->shape[1] != K)
        return pl_error_set(PL_ERR_SHAPE,
                            "gat: targets %s, expected [%lld, %lld] (%s, num_targets)",
                            pl_tensor_describe(y, b2, sizeof b2), (long long)G, (long long)K,
                            gm ? "graph_mask's graphs" : "batch size");
    pl_tensor *src = NULL, *dst = NULL;
    pl_status st = gat_edges_batch(m, es, ed, x->shape[0], &src, &dst);
    if (st) return st;
    pl_tensor *pred = gat_graph_predict(m, x, src, dst, bv, G, training);
    pl_tensor *yt = y->dtype == PL_F32 ? y : pl_tensor_to(y, PL_F32, y->device);
    pl_tensor *w = !gm ? NULL
                       : pl_reshape(gm->dtype == PL_F32 ? gm : pl_tensor_to(gm, PL_F32, gm->device),
                                    2, (int64_t[]){G, 1});
    pl_tensor *loss = graph_loss(m, pred, yt, w);
    if (!loss) return pl_error_prefix(pl_error_status(), "gat forward");
    *loss_out = loss;
    if (training || !metrics) return PL_OK;
    /* metrics in the target's original units (undo the loader's standardization),
     * over the real graphs */
    pl_tensor *hp = pl_tensor_to(pred, PL_F32, PL_CPU), *hy = pl_tensor_to(yt, PL_F32, PL_CPU);
    pl_tensor *hw = w ? pl_tensor_to(w, PL_F32, PL_CPU) : NULL;
    if (!hp || !hy || (w && !hw)) return pl_error_status();
    const float *pv = pl_tensor_data(hp), *yv = pl_tensor_data(hy),
                *wv = hw ? pl_tensor_data(hw) : NULL;
    double ae = 0, se = 0, base_ae = 0;
    int64_t real = 0;
    for (int64_t i = 0; i < G; i++) {
        if (wv && wv[i] == 0) continue;
        real++;
        for (int64_t k = 0; k < K; k++) {
            double sc = m->o.scale[k], sh = m->o.shift[k];
            double p = pv[i * K + k] * sc + sh, t = yv[i * K + k] * sc + sh;
            ae += fabs(p - t);
            se += (p - t) * (p - t);
            base_ae += fabs(sh - t); /* predicting the training mean */
        }
    }
    double n = (double)(real * K);
    pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * n, n);
    pl_metrics_add(metrics, "mae", ae, n);
    pl_metrics_add(metrics, "mse", se, n);
    pl_metrics_add(metrics, "train_mean_mae", base_ae, n);
    return PL_OK;
}

/* ---- plugin ---------------------------------------------------------------------- */

static const pl_option_spec gat_options[] = {
    {"layers", PL_OPT_INT, "2", 1, GAT_MAX_LAYERS, NULL, "GAT layers (the last one is the output layer)"},
    {"hidden", PL_OPT_INT, "8", 1, 1e6, NULL, "channels per head of each hidden layer"},
    {"heads", PL_OPT_INT, "8", 1, 256, NULL, "attention heads of each hidden layer"},
    {"output_heads", PL_OPT_INT, "1", 1, 256, NULL, "heads of the output layer (averaged)"},
    {"dropout", PL_OPT_FLOAT, "0.6", 0, 0.99, NULL, "dropout on every layer's input features"},
    {"attn_dropout", PL_OPT_FLOAT, "0.6", 0, 0.99, NULL, "dropout on the attention coefficients"},
    {"negative_slope", PL_OPT_FLOAT, "0.2", 0, 1, NULL, "LeakyReLU slope of the attention logits"},
    {"concat", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "hidden layers concatenate their heads (false: average them)"},
    {"residual", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "add a linear projection of each layer's input (PyG GATConv residual)"},
    {"add_self_loops", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "remove the graph's self loops and add one per node (each node attends to itself)"},
    {"bias", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL, "learnable bias after each layer"},
    {"in_features", PL_OPT_INT, "0", 0, 1e9, NULL, "input width (0: the loader's num_features)"},
    {"num_classes", PL_OPT_INT, "0", 0, 1e9, NULL, "classes (0: the loader's num_classes)"},
    {"task", PL_OPT_CHOICE, "node_classification", PL_NO_BOUNDS, "node_classification|graph_regression",
     "node_classification: masked cross entropy per node; graph_regression: readout over each graph of "
     "a batch of small graphs, then a head (hdf5_graph mode = graphs)"},
    {"readout", PL_OPT_CHOICE, "mean", PL_NO_BOUNDS, "mean|sum",
     "graph_regression: pool node states per graph (PyG global_mean_pool | global_add_pool)"},
    {"head_hidden", PL_OPT_INT, "0", 0, 1e6, NULL,
     "graph_regression: hidden width of the head after the readout (0: one linear layer)"},
    {"num_targets", PL_OPT_INT, "0", 0, GAT_MAX_TARGETS, NULL,
     "graph_regression: targets per graph (0: the loader's num_targets)"},
    {"loss", PL_OPT_CHOICE, "mse", PL_NO_BOUNDS, "mse|mae|huber",
     "graph_regression training loss on the standardized targets (torch mse_loss | l1_loss | huber_loss)"},
    {"huber_delta", PL_OPT_FLOAT, "1.0", 1e-9, 1e9, NULL, "delta of the huber loss"},
    PL_OPTIONS_END};

static pl_status gat_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    gat_opts o = {
        .layers = (int)pl_cfg_int(cfg, "layers", 2),
        .hidden = pl_cfg_int(cfg, "hidden", 8),
        .heads = (int)pl_cfg_int(cfg, "heads", 8),
        .output_heads = (int)pl_cfg_int(cfg, "output_heads", 1),
        .dropout = pl_cfg_float(cfg, "dropout", 0.6),
        .attn_dropout = pl_cfg_float(cfg, "attn_dropout", 0.6),
        .negative_slope = pl_cfg_float(cfg, "negative_slope", 0.2),
        .concat = pl_cfg_bool(cfg, "concat", true),
        .residual = pl_cfg_bool(cfg, "residual", false),
        .add_self_loops = pl_cfg_bool(cfg, "add_self_loops", true),
        .bias = pl_cfg_bool(cfg, "bias", true),
        .in_features = pl_cfg_int(cfg, "in_features", 0),
        .num_classes = pl_cfg_int(cfg, "num_classes", 0),
        .head_hidden = pl_cfg_int(cfg, "head_hidden", 0),
        .num_targets = pl_cfg_int(cfg, "num_targets", 0),
        .huber_delta = pl_cfg_float(cfg, "huber_delta", 1.0),
    };
    const char *task = pl_cfg_str(cfg, "task", "node_classification");
    o.task = !strcmp(task, "graph_regression") ? GAT_GRAPH_REGRESSION : GAT_NODE_CLASSIFICATION;
    o.readout = !strcmp(pl_cfg_str(cfg, "readout", "mean"), "sum") ? GAT_READOUT_SUM : GAT_READOUT_MEAN;
    const char *ls = pl_cfg_str(cfg, "loss", "mse");
    o.loss = !strcmp(ls, "mae") ? GAT_LOSS_MAE : !strcmp(ls, "huber") ? GAT_LOSS_HUBER : GAT_LOSS_MSE;
    pl_status st = PL_OK;
    if (!o.in_features) st = pl_meta_get_int(ctx->meta, "num_features", &o.in_features);
    if (o.task == GAT_NODE_CLASSIFICATION) {
        if (!st && !o.num_classes) st = pl_meta_get_int(ctx->meta, "num_classes", &o.num_classes);
        if (st)
            return pl_error_prefix(st, "gat: set in_features/num_classes or use a graph loader that "
                                   "publishes them (hdf5_graph)");
    } else {
        const char *lt = pl_meta_get_str(ctx->meta, "task");
        if (lt && strcmp(lt, "graph_regression"))
            return pl_error_set(PL_ERR_CONFIG, "gat: task = graph_regression but the loader serves '%s' "
                                "(use hdf5_graph with mode = graphs)", lt);
        if (!st && !o.num_targets) st = pl_meta_get_int(ctx->meta, "num_targets", &o.num_targets);
        if (st)
            return pl_error_prefix(st, "gat: set in_features/num_targets or use hdf5_graph with mode = graphs, "
                                   "which publishes them");
        o.num_classes = 1; /* unused */
        for (int64_t k = 0; k < o.num_targets && k < GAT_MAX_TARGETS; k++) {
            char key[64];
            double v;
            snprintf(key, sizeof key, "target_mean_%lld", (long long)k);
            o.shift[k] = pl_meta_get_float(ctx->meta, key, &v) == PL_OK ? v : 0.0;
            snprintf(key, sizeof key, "target_std_%lld", (long long)k);
            o.scale[k] = pl_meta_get_float(ctx->meta, key, &v) == PL_OK ? v : 1.0;
        }
        pl_error_clear();
    }
    gat_model *m;
    st = gat_model_new(&o, ctx, &m);
    if (!st) *self = m;
    return st;
}

static void gat_destroy(void *self) {
    gat_model *m = self;
    gat_model_free(m);
}

static pl_status gat_forward(void *self, const pl_batch *b, pl_data_split split, bool training,
                             pl_tensor **loss_out, pl_metrics *metrics) {
    gat_model *m = self;
    if (m->o.task == GAT_GRAPH_REGRESSION) return graph_forward(m, b, training, loss_out, metrics);
    pl_tensor *x = pl_batch_get(b, "x"), *es = pl_batch_get(b, "edge_src"),
              *ed = pl_batch_get(b, "edge_dst"), *y = pl_batch_get(b, "y"),
              *mask = pl_batch_get(b, "mask");
    if (!x || !es || !ed || !y || !mask)
        return pl_error_prefix(pl_error_status(), "gat: batch needs x, edge_src, edge_dst, y, mask");
    char b1[256];
    if (x->ndim != 2 || x->shape[1] != m->o.in_features)
        return pl_error_set(PL_ERR_SHAPE, "gat: node features %s, expected [N, %lld]",
                            pl_tensor_describe(x, b1, sizeof b1), (long long)m->o.in_features);
    int64_t N = x->shape[0];
    pl_tensor *src = NULL, *dst = NULL, *target = NULL;
    int64_t count = 0;
    pl_status st = gat_edges(m, es, ed, N, &src, &dst);
    if (!st) st = masked_target(m, split, y, mask, &target, &count);
    if (st) return st;
    if (count == 0)
        return pl_error_set(PL_ERR_INVALID, "gat: the %s mask selects no labelled node",
                            pl_split_name(split));
    pl_tensor *logits = gat_logits(m, x, src, dst, training);
    pl_tensor *loss = pl_cross_entropy(logits, target, IGNORE_INDEX, 0.0);
    if (!loss) return pl_error_prefix(pl_error_status(), "gat forward");
    *loss_out = loss;
    if (!metrics) return PL_OK;
    /* the loss is a mean over the masked nodes: in training their count weights this
     * rank's part of the graph in a data-parallel run (the loader shards the mask) */
    pl_metrics_add(metrics, "loss", pl_tensor_item(loss) * (double)count, (double)count);
    if (training) return PL_OK;
    pl_tensor *hl = pl_tensor_to(logits, PL_F32, PL_CPU), *ht = pl_tensor_to(target, PL_I64, PL_CPU);
    if (!hl || !ht) return pl_error_status();
    const float *lv = pl_tensor_data(hl);
    const int64_t *tv = pl_tensor_data(ht);
    int64_t K = hl->shape[1], correct = 0;
    for (int64_t i = 0; i < N; i++) {
        if (tv[i] == IGNORE_INDEX) continue;
        int64_t best = 0;
        for (int64_t j = 1; j < K; j++)
            if (lv[i * K + j] > lv[i * K + best]) best = j;
        correct += best == tv[i];
    }
    pl_metrics_add(metrics, "accuracy", (double)correct, (double)count);
    return PL_OK;
}

/* Node classification reads one graph (x, edges, labels, the split's node
 * mask); graph regression reads batches of graphs (PyG's `batch` vector
 * maps nodes to graphs, y [G, K] targets). */
static pl_status gat_batch_needs(const pl_config_section *cfg, pl_field_list *out) {
    bool graphs = !strcmp(pl_cfg_str(cfg, "task", "node_classification"), "graph_regression");
    pl_status st = pl_fields_add(out, "x", PL_DTYPE_FLOAT, 2, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_DTYPE_INDEX, 1, false);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_DTYPE_INDEX, 1, false);
    if (!st && graphs) st = pl_fields_add(out, "batch", PL_DTYPE_INDEX, 1, false);
    if (!st && graphs) st = pl_fields_add(out, "y", PL_DTYPE_FLOAT, 2, false);
    /* padded batches (hdf5_graph pad): 1 a real graph, 0 a padding one */
    if (!st && graphs) st = pl_fields_add(out, "graph_mask", PL_DTYPE_FLOAT, 1, true);
    if (!st && !graphs) st = pl_fields_add(out, "y", PL_DTYPE_INDEX, 1, false);
    if (!st && !graphs) st = pl_fields_add(out, "mask", PL_U8, 1, false);
    return st;
}

/* ---- pipeline predict ----------------------------------------------------------------
 * OUT.h5 (docs/run-files.md), rows in the split's order:
 *   node classification (one graph; the rows are the nodes of the split's
 *   mask, every node when the batch has no mask):
 *     node  i64 [N]     the node's row in the input's features
 *     probs f32 [N, C]  softmax of the logits
 *     pred  i64 [N]     argmax of the logits (first maximum, as the accuracy metric)
 *     label i64 [N]     the file's label (-1: unlabeled), when the input has labels
 *   graph regression (batches of graphs):
 *     graph      i64 [G]     the graph's index in the input file (the loader's
 *                            `graph` field; else its position in the split)
 *     prediction f32 [G, K]  in the targets' original units (v * std + mean,
 *                            the statistics the loader published: for predict
 *                            the run's standardization.json)
 *     target     f32 [G, K]  the same units, when the input has targets */

static pl_status gat_predict_needs(const pl_config_section *cfg, pl_field_list *out) {
    bool graphs = !strcmp(pl_cfg_str(cfg, "task", "node_classification"), "graph_regression");
    pl_status st = pl_fields_add(out, "x", PL_DTYPE_FLOAT, 2, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_DTYPE_INDEX, 1, false);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_DTYPE_INDEX, 1, false);
    if (!st && graphs) st = pl_fields_add(out, "batch", PL_DTYPE_INDEX, 1, false);
    if (!st && graphs) st = pl_fields_add(out, "y", PL_DTYPE_FLOAT, 2, true);
    if (!st && graphs) st = pl_fields_add(out, "graph", PL_DTYPE_INDEX, 1, true);
    if (!st && !graphs) st = pl_fields_add(out, "y", PL_DTYPE_INDEX, 1, true);
    if (!st && !graphs) st = pl_fields_add(out, "mask", PL_U8, 1, true);
    return st;
}

static pl_status gat_outputs_begin(void *self, pl_outputs_purpose purpose, pl_outputs *out) {
    (void)out;
    gat_model *m = self;
    if (purpose != PL_OUTPUTS_PREDICT)
        return pl_error_set(PL_ERR_UNSUPPORTED, "gat: no outputs but predict's");
    m->pred_rows = 0;
    return PL_OK;
}

static pl_status predict_nodes(gat_model *m, const pl_batch *b, pl_outputs *out) {
    char d1[256];
    pl_tensor *x = pl_batch_get(b, "x"), *es = pl_batch_get(b, "edge_src"),
              *ed = pl_batch_get(b, "edge_dst");
    if (!x || !es || !ed) return pl_error_prefix(pl_error_status(), "gat predict");
    pl_tensor *y = pl_batch_find(b, "y"), *mask = pl_batch_find(b, "mask");
    if (x->ndim != 2 || x->shape[1] != m->o.in_features)
        return pl_error_set(PL_ERR_SHAPE, "gat: node features %s, expected [N, %lld]",
                            pl_tensor_describe(x, d1, sizeof d1), (long long)m->o.in_features);
    int64_t N = x->shape[0], C = m->o.num_classes;
    if (y && (y->ndim != 1 || y->shape[0] != N))
        return pl_error_set(PL_ERR_SHAPE, "gat: labels %s, expected [%lld]",
                            pl_tensor_describe(y, d1, sizeof d1), (long long)N);
    if (mask && (mask->ndim != 1 || mask->shape[0] != N))
        return pl_error_set(PL_ERR_SHAPE, "gat: mask %s, expected [%lld]",
                            pl_tensor_describe(mask, d1, sizeof d1), (long long)N);
    pl_tensor *src = NULL, *dst = NULL;
    pl_status st = gat_edges(m, es, ed, N, &src, &dst);
    if (st) return st;
    pl_tensor *hl = pl_contiguous(pl_tensor_to(gat_logits(m, x, src, dst, false), PL_F32, PL_CPU));
    pl_tensor *hm = mask ? pl_tensor_to(mask, PL_U8, PL_CPU) : NULL;
    pl_tensor *hy = y ? pl_tensor_to(y, PL_I64, PL_CPU) : NULL;
    if (!hl || (mask && !hm) || (y && !hy))
        return pl_error_prefix(pl_error_status(), "gat predict");
    if (hl->ndim != 2 || hl->shape[0] != N || hl->shape[1] != C)
        return pl_error_set(PL_ERR_SHAPE, "gat: logits %s, expected [%lld, %lld]",
                            pl_tensor_describe(hl, d1, sizeof d1), (long long)N, (long long)C);
    const uint8_t *mv = hm ? pl_tensor_data(hm) : NULL;
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++)
        n += !mv || mv[i];
    pl_tensor *node = pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU);
    pl_tensor *probs = pl_tensor_empty(PL_F32, 2, (int64_t[]){n, C}, PL_CPU);
    pl_tensor *pred = pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU);
    pl_tensor *label = hy ? pl_tensor_empty(PL_I64, 1, (int64_t[]){n}, PL_CPU) : NULL;
    if (!node || !probs || !pred || (hy && !label)) return pl_error_status();
    const float *lv = pl_tensor_f32(hl);
    const int64_t *yv = hy ? pl_tensor_data(hy) : NULL;
    int64_t *nv = pl_tensor_data(node), *pv = pl_tensor_data(pred),
            *lab = label ? pl_tensor_data(label) : NULL;
    float *qv = pl_tensor_data(probs);
    for (int64_t i = 0, r = 0; i < N; i++) {
        if (mv && !mv[i]) continue;
        const float *l = lv + i * C;
        int64_t best = 0;
        for (int64_t j = 1; j < C; j++)
            if (l[j] > l[best]) best = j;
        double z = 0;
        for (int64_t j = 0; j < C; j++)
            z += exp((double)l[j] - l[best]);
        for (int64_t j = 0; j < C; j++)
            qv[r * C + j] = (float)(exp((double)l[j] - l[best]) / z);
        nv[r] = i;
        pv[r] = best;
        if (lab) lab[r] = yv[i];
        r++;
    }
    st = pl_outputs_add(out, "node", node);
    if (!st) st = pl_outputs_add(out, "probs", probs);
    if (!st) st = pl_outputs_add(out, "pred", pred);
    if (!st && label) st = pl_outputs_add(out, "label", label);
    return st;
}

/* [B, K] standardized values -> a new f32 CPU tensor in original units. */
static pl_tensor *original_units(const gat_model *m, pl_tensor *v) {
    pl_tensor *h = pl_contiguous(pl_tensor_to(v, PL_F32, PL_CPU));
    if (!h) return NULL;
    int64_t B = h->shape[0], K = m->o.num_targets;
    pl_tensor *out = pl_tensor_empty(PL_F32, 2, (int64_t[]){B, K}, PL_CPU);
    if (!out) return NULL;
    const float *src = pl_tensor_f32(h);
    float *dst = pl_tensor_data(out);
    for (int64_t i = 0; i < B; i++)
        for (int64_t k = 0; k < K; k++)
            dst[i * K + k] = (float)(src[i * K + k] * m->o.scale[k] + m->o.shift[k]);
    return out;
}

static pl_status predict_graphs(gat_model *m, const pl_batch *b, pl_outputs *out) {
    char d1[256];
    pl_tensor *x = pl_batch_get(b, "x"), *es = pl_batch_get(b, "edge_src"),
              *ed = pl_batch_get(b, "edge_dst"), *bv = pl_batch_get(b, "batch");
    if (!x || !es || !ed || !bv) return pl_error_prefix(pl_error_status(), "gat predict");
    pl_tensor *y = pl_batch_find(b, "y"), *gid = pl_batch_find(b, "graph");
    int64_t B = b->size, K = m->o.num_targets;
    if (x->ndim != 2 || x->shape[1] != m->o.in_features)
        return pl_error_set(PL_ERR_SHAPE, "gat: node features %s, expected [n, %lld]",
                            pl_tensor_describe(x, d1, sizeof d1), (long long)m->o.in_features);
    if (bv->ndim != 1 || bv->shape[0] != x->shape[0])
        return pl_error_set(PL_ERR_SHAPE,
                            "gat: batch vector %s, expected [%lld] (one graph id per node)",
                            pl_tensor_describe(bv, d1, sizeof d1), (long long)x->shape[0]);
    if (y && (y->ndim != 2 || y->shape[0] != B || y->shape[1] != K))
        return pl_error_set(PL_ERR_SHAPE,
                            "gat: targets %s, expected [%lld, %lld] (batch size, num_targets)",
                            pl_tensor_describe(y, d1, sizeof d1), (long long)B, (long long)K);
    if (gid && (gid->ndim != 1 || gid->shape[0] != B))
        return pl_error_set(PL_ERR_SHAPE, "gat: graph ids %s, expected [%lld]",
                            pl_tensor_describe(gid, d1, sizeof d1), (long long)B);
    pl_tensor *src = NULL, *dst = NULL;
    pl_status st = gat_edges_batch(m, es, ed, x->shape[0], &src, &dst);
    if (st) return st;
    pl_tensor *pred = gat_graph_predict(m, x, src, dst, bv, B, false);
    if (!pred) return pl_error_prefix(pl_error_status(), "gat predict");
    pl_tensor *ids = gid ? pl_tensor_to(gid, PL_I64, PL_CPU) : NULL;
    if (!gid) { /* no file index: the graph's position in the split */
        ids = pl_tensor_empty(PL_I64, 1, (int64_t[]){B}, PL_CPU);
        if (ids) {
            int64_t *iv = pl_tensor_data(ids);
            for (int64_t i = 0; i < B; i++)
                iv[i] = m->pred_rows + i;
        }
    }
    if (!ids) return pl_error_status();
    st = pl_outputs_add(out, "graph", ids);
    if (!st) st = pl_outputs_add(out, "prediction", original_units(m, pred));
    if (!st && y) st = pl_outputs_add(out, "target", original_units(m, y));
    if (!st) m->pred_rows += B;
    return st;
}

static pl_status gat_outputs_batch(void *self, pl_outputs_purpose purpose, const pl_batch *b,
                                   pl_data_split split, pl_outputs *out) {
    (void)split;
    (void)purpose;
    gat_model *m = self;
    return m->o.task == GAT_GRAPH_REGRESSION ? predict_graphs(m, b, out)
                                             : predict_nodes(m, b, out);
}

static const pl_model_vtable gat_vtable = {
    .create = gat_create,
    .destroy = gat_destroy,
    .forward = gat_forward,
    .batch_needs = gat_batch_needs,
    .predict_needs = gat_predict_needs,
    .outputs_begin = gat_outputs_begin,
    .outputs_batch = gat_outputs_batch,
};

PL_PLUGIN_DEFINE(gat, PL_KIND_MODEL, "1.0.0",
                 "graph attention network (Velickovic et al. 2018; PyG GATConv): node classification, graph regression",
                 gat_options, &gat_vtable)
