/* gat_layers.c - the GAT layers: parameters, edge preprocessing, GATConv
 * and the layer stack. Compiled into the gat plugin and into every plugin
 * that reuses the layer (stock_gat), so there is one copy of the code.
 *
 * Velickovic et al. 2018, "Graph Attention Networks" (ICLR), in the form of
 * PyTorch Geometric's GATConv (torch_geometric/nn/conv/gat_conv.py), per
 * layer and head h, for every edge j -> i:
 *
 *   z       = x W^T                          [N, H*C]   (one matmul, all heads)
 *   a_src   = sum_c z[:, h, c] att_src[h, c]  [N, H]
 *   a_dst   = sum_c z[:, h, c] att_dst[h, c]  [N, H]
 *   e_ij    = LeakyReLU(a_src[j] + a_dst[i])  [E, H]
 *   alpha   = softmax of e over the incoming edges of i (pl_segment_softmax by dst)
 *   alpha   = dropout(alpha, attn_dropout)
 *   out_i   = sum_j alpha_ij z_j              (pl_scatter_add by dst)
 *   out     = concat over heads | mean over heads, + x W_res^T (residual) + bias
 *
 * Init: Glorot-uniform weights and attention vectors, zero bias (PyG).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gat.h"

/* ---- parameters ----------------------------------------------------------- */

pl_status gat_add_param(pl_run_context *ctx, const char *who, const char *name, int ndim,
                        const int64_t *shape, double bound, uint64_t stream, unsigned tags,
                        const char *role, int *idx) {
    pl_frame_begin(); /* the frame owns our reference; params keeps its own */
    pl_tensor *t = pl_tensor_empty(PL_F32, ndim, shape, ctx->device);
    pl_status st = t ? PL_OK : pl_error_status();
    if (!st) st = bound > 0 ? pl_tensor_uniform_(t, -bound, bound, ctx->seed, stream)
                            : pl_tensor_fill_(t, 0.0);
    if (!st) {
        pl_tensor_set_requires_grad(t, true);
        st = pl_params_add(ctx->params, name, t, tags, role);
    }
    pl_frame_end();
    if (st) return pl_error_prefix(st, "%s: parameter %s", who, name);
    *idx = pl_params_count(ctx->params) - 1;
    return PL_OK;
}

static pl_status add_param(gat_model *m, const char *name, int ndim, const int64_t *shape,
                           double bound, uint64_t stream, unsigned tags, const char *role, int *idx) {
    return gat_add_param(m->ctx, "gat", name, ndim, shape, bound, stream, tags, role, idx);
}

pl_tensor *gat_param(const gat_model *m, int idx) {
    return idx < 0 ? NULL : pl_params_at(m->ctx->params, idx)->t;
}

static pl_tensor *P(const gat_model *m, int idx) { return gat_param(m, idx); }

static double glorot(int64_t fan_a, int64_t fan_b) { return sqrt(6.0 / (double)(fan_a + fan_b)); }

pl_status gat_model_new(const gat_opts *o, pl_run_context *ctx, gat_model **out) {
    *out = NULL;
    if (o->layers < 1 || o->layers > GAT_MAX_LAYERS)
        return pl_error_set(PL_ERR_CONFIG, "gat: layers = %d outside [1, %d]", o->layers, GAT_MAX_LAYERS);
    if (o->in_features < 1 || o->num_classes < 1)
        return pl_error_set(PL_ERR_CONFIG, "gat: in_features %lld and num_classes %lld must be >= 1",
                            (long long)o->in_features, (long long)o->num_classes);
    gat_model *m = calloc(1, sizeof *m);
    if (!m) return pl_error_set(PL_ERR_NOMEM, "gat: out of memory");
    m->o = *o;
    m->ctx = ctx;
    pl_status st = PL_OK;
    int64_t in = o->in_features;
    for (int l = 0; l < o->layers && !st; l++) {
        gat_layer *L = &m->layer[l];
        /* graph regression: every GAT layer is a hidden one; the head follows the readout */
        bool last = l == o->layers - 1 && o->task == GAT_NODE_CLASSIFICATION;
        L->in = in;
        L->out = last ? o->num_classes : o->hidden;
        L->heads = last ? o->output_heads : o->heads;
        L->concat = last ? false : o->concat;
        L->att_src = L->att_dst = L->bias = L->res = -1;
        int64_t H = L->heads, C = L->out, total = L->concat ? H * C : C;
        uint64_t s0 = 16 * (uint64_t)l;
        char name[PL_NAME_MAX];
        snprintf(name, sizeof name, "gat.layers.%d.lin.weight", l);
        st = add_param(m, name, 2, (int64_t[]){H * C, in}, glorot(in, H * C), s0, 0, NULL, &L->w);
        snprintf(name, sizeof name, "gat.layers.%d.att_src", l);
        if (!st) st = add_param(m, name, 2, (int64_t[]){H, C}, glorot(H, C), s0 + 1, 0, NULL, &L->att_src);
        snprintf(name, sizeof name, "gat.layers.%d.att_dst", l);
        if (!st) st = add_param(m, name, 2, (int64_t[]){H, C}, glorot(H, C), s0 + 2, 0, NULL, &L->att_dst);
        if (o->residual) {
            snprintf(name, sizeof name, "gat.layers.%d.res.weight", l);
            if (!st)
                st = add_param(m, name, 2, (int64_t[]){total, in}, glorot(in, total), s0 + 3, 0, NULL, &L->res);
        }
        if (o->bias) {
            snprintf(name, sizeof name, "gat.layers.%d.bias", l);
            if (!st)
                st = add_param(m, name, 1, (int64_t[]){total}, 0, s0 + 4,
                               PL_TAG_NO_DECAY, last ? "head" : NULL, &L->bias);
        }
        in = total;
    }
    m->head_w[0] = m->head_w[1] = m->head_b[0] = m->head_b[1] = -1;
    if (!st && o->task == GAT_GRAPH_REGRESSION) {
        if (o->num_targets < 1 || o->num_targets > GAT_MAX_TARGETS)
            st = pl_error_set(PL_ERR_CONFIG, "gat: num_targets %lld outside [1, %d]", (long long)o->num_targets,
                              GAT_MAX_TARGETS);
        int n_lin = o->head_hidden > 0 ? 2 : 1;
        for (int i = 0; i < n_lin && !st; i++) {
            int64_t fan_out = i == n_lin - 1 ? o->num_targets : o->head_hidden;
            char name[PL_NAME_MAX];
            /* torch.nn.Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias */
            double bound = 1.0 / sqrt((double)in);
            snprintf(name, sizeof name, "gat.head.%d.weight", i);
            st = add_param(m, name, 2, (int64_t[]){fan_out, in}, bound, 16 * GAT_MAX_LAYERS + 2 * (uint64_t)i, 0, "head", &m->head_w[i]);
            snprintf(name, sizeof name, "gat.head.%d.bias", i);
            if (!st)
                st = add_param(m, name, 1, (int64_t[]){fan_out}, bound, 16 * GAT_MAX_LAYERS + 2 * (uint64_t)i + 1,
                               PL_TAG_NO_DECAY, "head", &m->head_b[i]);
            in = fan_out;
        }
    }
    if (st) {
        gat_model_free(m);
        return st;
    }
    *out = m;
    return PL_OK;
}

void gat_model_free(gat_model *m) {
    if (!m) return;
    pl_tensor_release(m->graph.src);
    pl_tensor_release(m->graph.dst);
    for (int s = 0; s < PL_SPLIT_COUNT; s++) pl_tensor_release(m->target[s].target);
    free(m);
}

/* ---- graph preprocessing (once per graph, cached) -------------------------- */

static pl_status edges_build(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                             bool cache, pl_tensor **src, pl_tensor **dst);

pl_status gat_edges(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                    pl_tensor **src, pl_tensor **dst) {
    return edges_build(m, edge_src, edge_dst, n_nodes, true, src, dst);
}

pl_status gat_edges_batch(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                          pl_tensor **src, pl_tensor **dst) {
    return edges_build(m, edge_src, edge_dst, n_nodes, false, src, dst);
}

/* cache = false (batches of small graphs, a new graph every step, possibly
 * at the same addresses): the edges are built into the caller's frame. */
static pl_status edges_build(gat_model *m, pl_tensor *edge_src, pl_tensor *edge_dst, int64_t n_nodes,
                             bool cache, pl_tensor **src, pl_tensor **dst) {
    char b1[256], b2[256];
    gat_graph_cache *g = &m->graph;
    if (!edge_src || !edge_dst) return pl_error_prefix(pl_error_status(), "gat");
    int64_t E = pl_tensor_numel(edge_src);
    if (edge_src->ndim != 1 || edge_dst->ndim != 1 || pl_tensor_numel(edge_dst) != E)
        return pl_error_set(PL_ERR_SHAPE, "gat: edge_src %s and edge_dst %s must be 1-D of equal length",
                            pl_tensor_describe(edge_src, b1, sizeof b1),
                            pl_tensor_describe(edge_dst, b2, sizeof b2));
    const void *ks = pl_tensor_data(edge_src), *kd = pl_tensor_data(edge_dst);
    if (!cache && !m->o.add_self_loops && edge_src->dtype == PL_I64 && edge_dst->dtype == PL_I64) {
        /* the loader's edges as they are (pl_index_select range-checks them) */
        *src = edge_src;
        *dst = edge_dst;
        return PL_OK;
    }
    if (cache && g->src && g->src_key == ks && g->dst_key == kd && g->n_edges == E && g->n_nodes == n_nodes) {
        *src = g->src;
        *dst = g->dst;
        return PL_OK;
    }
    if (cache) {
        pl_tensor_release(g->src);
        pl_tensor_release(g->dst);
        g->src = g->dst = NULL;
    }
    pl_status st = PL_OK;
    pl_tensor *ts = NULL, *td = NULL;
    if (cache) pl_frame_begin(); /* uncached: everything lives in the caller's frame */
    pl_tensor *hs = pl_tensor_to(edge_src, PL_I64, PL_CPU), *hd = pl_tensor_to(edge_dst, PL_I64, PL_CPU);
    int64_t *s = NULL, *d = NULL;
    if (!hs || !hd) st = pl_error_status();
    int64_t cap = E + (m->o.add_self_loops ? n_nodes : 0), k = 0;
    if (!st) {
        s = malloc(sizeof *s * (size_t)(cap ? cap : 1));
        d = malloc(sizeof *d * (size_t)(cap ? cap : 1));
        if (!s || !d) st = pl_error_set(PL_ERR_NOMEM, "gat: out of memory for %lld edges", (long long)cap);
    }
    if (!st) {
        const int64_t *vs = pl_tensor_data(hs), *vd = pl_tensor_data(hd);
        for (int64_t e = 0; e < E && !st; e++) {
            if (vs[e] < 0 || vs[e] >= n_nodes || vd[e] < 0 || vd[e] >= n_nodes) {
                st = pl_error_set(PL_ERR_INVALID, "gat: edge %lld (%lld -> %lld) outside the %lld nodes",
                                  (long long)e, (long long)vs[e], (long long)vd[e], (long long)n_nodes);
                break;
            }
            /* PyG remove_self_loops + add_self_loops: existing loops replaced */
            if (m->o.add_self_loops && vs[e] == vd[e]) continue;
            s[k] = vs[e];
            d[k++] = vd[e];
        }
        if (m->o.add_self_loops)
            for (int64_t i = 0; i < n_nodes; i++) {
                s[k] = i;
                d[k++] = i;
            }
    }
    if (!st) {
        ts = pl_tensor_from_data(PL_I64, 1, &k, s, m->ctx->device);
        td = pl_tensor_from_data(PL_I64, 1, &k, d, m->ctx->device);
        if (!ts || !td) st = pl_error_status();
        else if (cache) {
            g->src = pl_frame_keep(ts);
            g->dst = pl_frame_keep(td);
        }
    }
    if (cache) pl_frame_end();
    free(s);
    free(d);
    if (st) return st;
    if (!cache) {
        *src = ts;
        *dst = td;
        return PL_OK;
    }
    g->src_key = ks;
    g->dst_key = kd;
    g->n_edges = E;
    g->n_nodes = n_nodes;
    *src = g->src;
    *dst = g->dst;
    return PL_OK;
}

/* ---- forward ------------------------------------------------------------------ */

pl_tensor *gat_conv(gat_model *m, const gat_layer *L, pl_tensor *x, pl_tensor *src, pl_tensor *dst,
                    double attn_p, uint64_t counter, bool training) {
    if (!x) return NULL;
    int64_t N = x->shape[0], H = L->heads, C = L->out, E = pl_tensor_numel(src);
    pl_tensor *z = pl_linear(x, P(m, L->w), NULL);             /* [N, H*C] */
    pl_tensor *z3 = pl_reshape(z, 3, (int64_t[]){N, H, C});    /* [N, H, C] */
    pl_tensor *a_src = pl_sum(pl_mul(z3, P(m, L->att_src)), -1, false); /* [N, H] */
    pl_tensor *a_dst = pl_sum(pl_mul(z3, P(m, L->att_dst)), -1, false);
    pl_tensor *e = pl_add(pl_index_select(a_src, 0, src), pl_index_select(a_dst, 0, dst)); /* [E, H] */
    e = pl_leaky_relu(e, m->o.negative_slope);
    pl_tensor *alpha = pl_segment_softmax(e, dst, N);
    alpha = pl_dropout(alpha, attn_p, m->ctx->seed, counter, training);
    pl_tensor *msg = pl_mul(pl_index_select(z3, 0, src), pl_reshape(alpha, 3, (int64_t[]){E, H, 1}));
    pl_tensor *out = pl_scatter_add(msg, 0, dst, N); /* [N, H, C] */
    out = L->concat ? pl_reshape(out, 2, (int64_t[]){N, H * C}) : pl_mean(out, 1, false);
    if (L->res >= 0) out = pl_add(out, pl_linear(x, P(m, L->res), NULL));
    if (L->bias >= 0) out = pl_add(out, P(m, L->bias));
    return out;
}

/* The GAT stack: dropout -> GATConv -> ELU per layer; the ELU after the last
 * layer only when `elu_last` (graph regression and encoders, where more follows). */
pl_tensor *gat_stack(gat_model *m, pl_tensor *x, pl_tensor *src, pl_tensor *dst, bool training,
                     bool elu_last) {
    if (!x) return NULL;
    /* dropout streams: 2 per layer per training forward, unique over the run */
    uint64_t base = (uint64_t)m->ctx->micro_step * 2 * GAT_MAX_LAYERS;
    pl_tensor *h = x;
    if (h->dtype != PL_F32) h = pl_tensor_to(h, PL_F32, h->device);
    for (int l = 0; l < m->o.layers && h; l++) {
        h = pl_dropout(h, m->o.dropout, m->ctx->seed, base + 2 * (uint64_t)l, training);
        h = gat_conv(m, &m->layer[l], h, src, dst, m->o.attn_dropout, base + 2 * (uint64_t)l + 1,
                     training);
        if (elu_last || l < m->o.layers - 1) h = pl_elu(h, 1.0);
    }
    return h;
}
