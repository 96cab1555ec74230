/* hdf5_graph.c - graph loader, two layouts (README.md: options, layouts, batches).
 *
 * mode = node (default): one graph, transductive node classification. Reads
 * features [N, F], edge_index [2, E], labels [N] and the three split masks
 * once at create, applies optional self loops / row normalization, moves
 * everything to the device once and serves every epoch from that cache: each
 * split yields ONE batch {x, edge_src, edge_dst, y, mask} whose tensors are
 * the cached ones (no per-epoch rebuild, no copy).
 *
 * mode = graphs: many small graphs (molecules), graph-level regression. The
 * file holds the graphs concatenated (x [N_total, F], edge_index [2, E_total]
 * with graph-local node ids) plus CSR offsets node_ptr / edge_ptr [G+1],
 * targets y [G, K] and per-graph split masks. Everything is read, validated,
 * self-looped / normalized / standardized once at create. Each split owns
 * staging tensors on the device sized for the whole split (mega-batch); an
 * epoch lays the split's graphs out in epoch order into them (train:
 * shuffled per epoch; val/test: once at create) with batch-local edge ids and
 * the `batch` vector precomputed for the fixed batch boundaries, and next()
 * returns views (pl_tensor_view_rows) of the staging tensors: no copy and no
 * allocation per batch.
 *
 * mode = panel is deprecated: it forwards to the hdf5_panel loader (linked
 * in), after the mode checks below, with one deprecation line.
 *
 * `pipeline predict` (meta predict_split): one split only (every node / graph
 * when the file has no masks), labels / targets optional, and the run's
 * graph_meta.json (node) / standardization.json (graphs) instead of
 * statistics of the new file; both are written into ctx->run_dir by training.
 *
 * Batch order (plugin.h loader contract, both modes): a split's order is a
 * pure function of (ctx->seed, epoch) - node mode has one batch, graphs mode
 * shuffles the train graphs with seed + epoch - so epoch_begin(split, epoch,
 * k) starts at batch k of that order; the loader keeps no position state.
 *
 * HDF5 is only touched at create (and by batch_fields, which reads nothing),
 * through the shared helpers and under the process-wide lock of pl_h5.h.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_graph.h"
#include "hdf5_panel_api.h"

static const pl_option_spec own_opts[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL,
     "HDF5 file (node: tools/planetoid_to_h5.py layout; graphs: tools/molecules_to_h5.py layout)"},
    {"mode", PL_OPT_CHOICE, "node", PL_NO_BOUNDS, "node|graphs|panel",
     "node: one graph, node classification; graphs: many small graphs batched, graph "
     "regression; panel: deprecated, use plugin = hdf5_panel"},
    {"features", PL_OPT_STRING, "features", PL_NO_BOUNDS, NULL,
     "node features [N, F] (any float/int type, read as f32); mode = graphs: default 'x'"},
    {"edge_index", PL_OPT_STRING, "edge_index", PL_NO_BOUNDS, NULL,
     "edges [2, E] (source row 0, target row 1); graphs: node ids local to each graph"},
    {"labels", PL_OPT_STRING, "labels", PL_NO_BOUNDS, NULL,
     "mode = node: node classes [N] (-1: unlabeled)"},
    {"train_mask", PL_OPT_STRING, "train_mask", PL_NO_BOUNDS, NULL,
     "u8 mask of the train split ([N] nodes / [G] graphs)"},
    {"val_mask", PL_OPT_STRING, "val_mask", PL_NO_BOUNDS, NULL,
     "u8 mask of the val split ([N] nodes / [G] graphs)"},
    {"test_mask", PL_OPT_STRING, "test_mask", PL_NO_BOUNDS, NULL,
     "u8 mask of the test split ([N] nodes / [G] graphs)"},
    {"add_self_loops", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "remove existing self loops, then add (i, i) for every node (PyG remove_self_loops + "
     "add_self_loops; "
     "graphs: per graph)"},
    {"row_normalize", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "x = (x - min(x)) / clamp(row sum, min 1) (PyG NormalizeFeatures; graphs: min per graph)"},
    {"node_ptr", PL_OPT_STRING, "node_ptr", PL_NO_BOUNDS, NULL,
     "mode = graphs: i64 [G+1] CSR offsets of each graph's x rows"},
    {"edge_ptr", PL_OPT_STRING, "edge_ptr", PL_NO_BOUNDS, NULL,
     "mode = graphs: i64 [G+1] CSR offsets of each graph's edge_index columns"},
    {"targets", PL_OPT_STRING, "y", PL_NO_BOUNDS, NULL,
     "mode = graphs: graph targets [G] or [G, K] (read as f32)"},
    {"batch_size", PL_OPT_INT, "32", 1, 1e9, NULL,
     "mode = graphs: graphs per batch"},
    {"shuffle", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "mode = graphs: shuffle the train graphs each epoch (seed + epoch)"},
    {"drop_last", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "mode = graphs: drop the last partial train batch"},
    {"standardize_targets", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "mode = graphs: serve (y - mean) / std, mean and unbiased std of the train graphs"},
    {"pad", PL_OPT_CHOICE, "off", PL_NO_BOUNDS, "off|on|auto",
     "mode = graphs: static batch shapes as jraph pad_with_graphs: every batch padded to "
     "pad_nodes / pad_edges / pad_graphs with a padding graph (zero features) and empty graphs, "
     "masked by the graph_mask field; auto: on when pipeline.device is not cpu (cuda_graphs); "
     "never for pipeline predict"},
    {"pad_nodes", PL_OPT_INT, "0", 0, 1e12, NULL,
     "mode = graphs, pad: nodes per padded batch (jraph n_node; > the real nodes); 0: the "
     "batch_size largest graphs of a split + 1"},
    {"pad_edges", PL_OPT_INT, "0", 0, 1e12, NULL,
     "mode = graphs, pad: edges per padded batch (jraph n_edge, self loops counted); 0: the "
     "edges of the batch_size graphs with most edges"},
    {"pad_graphs", PL_OPT_INT, "0", 0, 1e9, NULL,
     "mode = graphs, pad: graphs per padded batch (jraph n_graph, >= batch_size + 1); 0: "
     "batch_size + 1"},
    PL_OPTIONS_END};

/* The schema: own_opts, then hdf5_panel's options for the deprecated mode =
 * panel (an old config validates as before; hdf5_panel documents them). */
static pl_option_spec opts[64];

__attribute__((constructor)) static void merge_options(void) {
    const pl_option_spec *const lists[] = {own_opts, hdf5_panel_options};
    lk_merge_options(opts, (int)(sizeof opts / sizeof *opts), lists, 2);
    for (pl_option_spec *o = opts; o->name; o++) {
        bool own = false;
        for (const pl_option_spec *w = own_opts; w->name && !own; w++)
            own = !strcmp(w->name, o->name);
        if (!own) o->doc = "mode = panel (deprecated): see plugin hdf5_panel";
    }
}

/* The modes each option applies to (a bit per mode); one set in another
 * mode is an error, so a config cannot silently mean something else. */
enum { M_NODE = 1, M_GRAPHS = 2, M_PANEL = 4 };
static const struct {
    const char *key;
    unsigned modes;
} opt_modes[] = {
    {"edge_index", M_NODE | M_GRAPHS},    {"labels", M_NODE},
    {"train_mask", M_NODE | M_GRAPHS},    {"val_mask", M_NODE | M_GRAPHS},
    {"test_mask", M_NODE | M_GRAPHS},     {"row_normalize", M_NODE | M_GRAPHS},
    {"node_ptr", M_GRAPHS},               {"edge_ptr", M_GRAPHS},
    {"targets", M_GRAPHS},                {"standardize_targets", M_GRAPHS},
    {"pad", M_GRAPHS},                    {"pad_nodes", M_GRAPHS},
    {"pad_edges", M_GRAPHS},              {"pad_graphs", M_GRAPHS},
    {"batch_size", M_GRAPHS | M_PANEL},   {"shuffle", M_GRAPHS | M_PANEL},
    {"drop_last", M_GRAPHS | M_PANEL},    {"target", M_PANEL},
    {"time", M_PANEL},                    {"target_time", M_PANEL},
    {"factors", M_PANEL},                 {"train_end", M_PANEL},
    {"val_end", M_PANEL},                 {"test_end", M_PANEL},
    {"window", M_PANEL},                  {"graph_lookback", M_PANEL},
    {"graph_top_k", M_PANEL},             {"graph_feature", M_PANEL},
    {"graphs", M_PANEL},                  {"standardize_features", M_PANEL},
    {"target_norm", M_PANEL},             {"eval_batch_size", M_PANEL},
};

/* True when `key` was given a value other than its schema default. A run's
 * resolved config.ini (what `pipeline predict` loads) lists every default
 * as a set key, so "set" alone cannot tell a user's choice from it. */
static bool cfg_changed(const pl_config_section *cfg, const char *key) {
    if (!pl_cfg_is_set(cfg, key)) return false;
    const char *v = pl_cfg_get(cfg, key);
    for (const pl_option_spec *o = opts; o->name; o++)
        if (!strcmp(o->name, key)) return !o->default_value || !v || strcmp(v, o->default_value);
    return true;
}

/* ---- destroy ------------------------------------------------------------ */

static void release_views(graph *G) {
    for (int i = 0; i < G->nviews; i++)
        pl_tensor_release(G->views[i]);
    G->nviews = 0;
}

static void g_destroy(void *self) {
    graph *G = self;
    if (!G) return;
    release_views(G);
    pl_tensor_release(G->x);
    pl_tensor_release(G->src);
    pl_tensor_release(G->dst);
    pl_tensor_release(G->y);
    for (int i = 0; i < PL_SPLIT_COUNT; i++) {
        pl_tensor_release(G->mask[i]);
        pl_tensor_release(G->rank_mask[i]);
        gsplit *S = &G->sp[i];
        pl_tensor_release(S->x);
        pl_tensor_release(S->src);
        pl_tensor_release(S->dst);
        pl_tensor_release(S->batch);
        pl_tensor_release(S->y);
        pl_tensor_release(S->gid);
        pl_tensor_release(S->gmask);
        free(S->ids);
        free(S->order);
        free(S->bnode);
        free(S->bedge);
    }
    free(G->nptr);
    free(G->eptr);
    free(G->hx);
    free(G->hy);
    free(G->hsrc);
    free(G->hdst);
    free(G->sx);
    free(G->sy);
    free(G->ssrc);
    free(G->sdst);
    free(G->sbatch);
    free(G->sgmask);
    if (G->panel) hdf5_panel_vtable.destroy(G->panel);
    free(G);
}

/* ======================================================================
 * vtable
 * ====================================================================== */

static pl_status g_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    graph *G = calloc(1, sizeof *G);
    if (!G) return pl_error_set(PL_ERR_NOMEM, "hdf5_graph: out of memory");
    G->ctx = ctx;
    G->cur = -1;
    snprintf(G->path, sizeof G->path, "%s", pl_cfg_str(cfg, "path", ""));
    const char *mode = pl_cfg_str(cfg, "mode", "node");
    G->graphs_mode = !strcmp(mode, "graphs");
    bool panel_mode = !strcmp(mode, "panel");
    G->predict = lk_predict_split(ctx);
    G->has_y = true;
    pl_status st = PL_OK;
    unsigned m = panel_mode ? M_PANEL : G->graphs_mode ? M_GRAPHS : M_NODE;
    static const char *mode_names[8] = {"",      "node",         "graphs",         "node or graphs",
                                        "panel", "node or panel", "graphs or panel", ""};
    for (size_t i = 0; i < sizeof opt_modes / sizeof *opt_modes && !st; i++)
        if (!(opt_modes[i].modes & m) && cfg_changed(cfg, opt_modes[i].key))
            st = pl_error_set(PL_ERR_CONFIG,
                              "hdf5_graph: option '%s' applies to mode = %s only (this section "
                              "has mode = %s)",
                              opt_modes[i].key, mode_names[opt_modes[i].modes], mode);
    if (!st && panel_mode) lk_deprecated("hdf5_graph", " (mode = panel)", "hdf5_panel");
    if (!st)
        st = panel_mode       ? hdf5_panel_vtable.create(cfg, ctx, &G->panel)
             : G->graphs_mode ? gr_create_graphs(G, cfg, ctx, cfg_changed(cfg, "features"))
                              : gr_create_node(G, cfg, ctx);
    if (st) {
        g_destroy(G);
        return st;
    }
    *self = G;
    return PL_OK;
}

static int64_t g_num_batches(void *self, pl_data_split split) {
    graph *G = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    if (G->panel) return hdf5_panel_vtable.num_batches(G->panel, split);
    if (G->graphs_mode) return G->sp[split].nb;
    return G->count[split] > 0 ? 1 : 0;
}

static pl_status g_epoch_begin(void *self, pl_data_split split, int64_t epoch, int64_t start_batch) {
    graph *G = self;
    if (G->panel) return hdf5_panel_vtable.epoch_begin(G->panel, split, epoch, start_batch);
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_graph: bad split %d", (int)split);
    if (!G->graphs_mode && G->count[split] == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (its mask has no node)",
                            G->path, pl_split_name(split));
    pl_status cst =
        lk_check_start("hdf5_graph", split, epoch, start_batch, g_num_batches(G, split), G->path);
    if (cst) return cst;
    release_views(G);
    /* graphs mode: lay the train graphs out in this epoch's order (the whole split:
     * batch boundaries depend on every graph before them; nothing is read) */
    if (split == PL_SPLIT_TRAIN && G->graphs_mode && G->shuffle &&
        G->sp[PL_SPLIT_TRAIN].arranged_epoch != epoch) {
        G->sp[PL_SPLIT_TRAIN].arranged_epoch = -1;
        gr_train_order(G, epoch);
        pl_status st = gr_arrange(G, &G->sp[PL_SPLIT_TRAIN], epoch);
        if (st) return st;
        G->sp[PL_SPLIT_TRAIN].arranged_epoch = epoch;
    }
    G->cur = split;
    G->cur_batch = start_batch;
    return PL_OK;
}

static int emit(graph *G, pl_batch *out, const char *name, pl_tensor *v) {
    if (!v) return -1;
    G->views[G->nviews++] = v;
    out->names[out->n] = name;
    out->fields[out->n++] = v;
    return 0;
}

static int next_graphs(graph *G, pl_batch *out) {
    gsplit *S = &G->sp[G->cur];
    int64_t b = G->cur_batch;
    if (b >= S->nb) return 0;
    int64_t n0 = S->bnode[b], nn = S->bnode[b + 1] - n0, e0 = S->bedge[b],
            ne = S->bedge[b + 1] - e0;
    int64_t g0 = b * G->B, ng = S->ng - g0 < G->B ? S->ng - g0 : G->B;
    /* padded: pad_graphs rows of y and graph_mask (the real ones first) */
    int64_t y0 = G->pad ? b * G->pad_graphs : g0, yn = G->pad ? G->pad_graphs : ng;
    if (emit(G, out, "x", lk_view_rows(S->x, n0, nn)) ||
        emit(G, out, "edge_src", lk_view_rows(S->src, e0, ne)) ||
        emit(G, out, "edge_dst", lk_view_rows(S->dst, e0, ne)) ||
        emit(G, out, "batch", lk_view_rows(S->batch, n0, nn)) ||
        (S->y && emit(G, out, "y", lk_view_rows(S->y, y0, yn))) ||
        (S->gmask && emit(G, out, "graph_mask", lk_view_rows(S->gmask, y0, yn))) ||
        (S->gid && emit(G, out, "graph", lk_view_rows(S->gid, g0, ng)))) {
        release_views(G);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->size = ng; /* the real graphs (padded too: samples/s counts these) */
    out->index = b;
    G->cur_batch = b + 1;
    return 1;
}

static int g_next(void *self, pl_batch *out) {
    graph *G = self;
    if (G->panel) return hdf5_panel_vtable.next(G->panel, out);
    release_views(G);
    memset(out, 0, sizeof *out);
    if (G->cur < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_graph: next() before epoch_begin()");
        return -1;
    }
    int r;
    if (G->graphs_mode) {
        r = next_graphs(G, out);
    } else if (G->cur_batch >= 1) {
        r = 0; /* node mode: one batch per split */
    } else {
        G->cur_batch = 1;
        const char *names[5] = {"x", "edge_src", "edge_dst", "y", "mask"};
        pl_tensor *mk = G->rank_mask[G->cur] ? G->rank_mask[G->cur] : G->mask[G->cur];
        pl_tensor *f[5] = {G->x, G->src, G->dst, G->y, mk};
        out->n = 0;
        for (int i = 0; i < 5; i++) {
            if (i == 3 && !G->has_y) continue; /* predict: a file without labels */
            out->names[out->n] = names[i];
            out->fields[out->n++] = f[i]; /* borrowed: the cached tensors themselves */
        }
        out->size = G->N;
        out->index = 0;
        r = 1;
    }
    return r;
}

/* Node mode: x f32 [N, F], edge_src / edge_dst i64 [E], y i64 [N], mask u8 [N];
 * graphs mode: x f32 [n, F], edge_src / edge_dst i64 [e], batch i64 [n],
 * y f32 [B, K] (targets [G] are served as [B, 1]); with pad (on / auto)
 * graph_mask f32 [n_graph] too (1 real graph, 0 padding; x, edges, batch and
 * y then have the pad_* totals: README "Static shapes"; declared optional
 * for auto, which pads only off the CPU). Both are fixed by the
 * mode, whatever the file's types (the loader converts), so nothing is read.
 * Training batches only: `pipeline predict` batches leave y out when the file
 * has no labels / targets, and in graphs mode add graph i64 [B] (each graph's
 * index in the file), which predict_needs of a model may ask for as optional.
 * mode = panel (deprecated): hdf5_panel's. */
static pl_status g_batch_fields(const pl_config_section *cfg, pl_field_list *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(pl_cfg_str(cfg, "mode", "node"), "panel")) return hdf5_panel_vtable.batch_fields(cfg, out);
    bool graphs = !strcmp(pl_cfg_str(cfg, "mode", "node"), "graphs");
    pl_status st = pl_fields_add(out, "x", PL_F32, 2, false);
    if (!st) st = pl_fields_add(out, "edge_src", PL_I64, 1, false);
    if (!st) st = pl_fields_add(out, "edge_dst", PL_I64, 1, false);
    if (graphs) {
        if (!st) st = pl_fields_add(out, "batch", PL_I64, 1, false);
        if (!st) st = pl_fields_add(out, "y", PL_F32, 2, false);
        /* pad = on: graph_mask in every batch; auto: only where it pads (a
         * device other than the CPU, which this call does not see): optional */
        const char *pad = pl_cfg_str(cfg, "pad", "off");
        if (!st && strcmp(pad, "off"))
            st = pl_fields_add(out, "graph_mask", PL_F32, 1, !strcmp(pad, "auto"));
    } else {
        if (!st) st = pl_fields_add(out, "y", PL_I64, 1, false);
        if (!st) st = pl_fields_add(out, "mask", PL_U8, 1, false);
    }
    return st;
}

/* Data parallel, node mode: every rank serves the whole graph (message passing needs
 * every node's neighbours) with its share of each split's labelled nodes: the j-th
 * node of a mask (in node order) goes to rank j mod world_size. The ranks' masks
 * partition the split's, so summed metrics are the split's, and the trainer weights
 * each rank's mean loss by its node count. Graphs mode declines (PL_ERR_UNSUPPORTED):
 * the trainer then gives the ranks whole batches in turn. */
static pl_status g_shard(void *self, int rank, int world_size) {
    graph *G = self;
    if (G->graphs_mode || G->panel)
        return pl_error_set(PL_ERR_UNSUPPORTED, "hdf5_graph: %s mode is sharded by batch",
                            G->panel ? "panel" : "graphs");
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return pl_error_set(PL_ERR_INVALID, "hdf5_graph: shard(rank %d, world %d)", rank, world_size);
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        pl_tensor_release(G->rank_mask[s]);
        G->rank_mask[s] = NULL;
    }
    if (world_size == 1) return PL_OK;
    pl_status st = PL_OK;
    uint8_t *h = malloc((size_t)(G->N ? G->N : 1));
    if (!h) return pl_error_set(PL_ERR_NOMEM, "%s: shard mask", G->path);
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        if (!G->mask[s]) continue;
        if (G->count[s] < world_size) {
            st = pl_error_set(PL_ERR_CONFIG, "%s: split '%s' has %lld labelled node(s), fewer "
                              "than the %d ranks of the data-parallel run", G->path,
                              pl_split_name((pl_data_split)s), (long long)G->count[s], world_size);
            break;
        }
        const pl_backend *be = pl_backend_get(G->mask[s]->device.type);
        if (!be || be->memcpy(h, PL_CPU, pl_tensor_data(G->mask[s]), G->mask[s]->device,
                              (size_t)G->N)) {
            st = pl_error_set(PL_ERR_DEVICE, "%s: reading the %s mask", G->path,
                              pl_split_name((pl_data_split)s));
            break;
        }
        int64_t j = 0;
        for (int64_t i = 0; i < G->N; i++)
            if (h[i]) h[i] = (uint8_t)(j++ % world_size == rank);
        G->rank_mask[s] = lk_to_device(dev_of(G), PL_U8, 1, (int64_t[]){G->N}, h);
        if (!G->rank_mask[s]) st = pl_error_status();
    }
    free(h);
    return st;
}

static pl_loader_stats g_stats(void *self) {
    graph *G = self;
    return G->panel ? hdf5_panel_vtable.stats(G->panel) : G->st;
}

static const pl_loader_vtable vt = {
    .create = g_create,
    .destroy = g_destroy,
    .epoch_begin = g_epoch_begin,
    .next = g_next,
    .num_batches = g_num_batches,
    .stats = g_stats,
    .batch_fields = g_batch_fields,
    .shard = g_shard,
};

PL_PLUGIN_DEFINE(hdf5_graph, PL_KIND_LOADER, "0.4.0",
                 "graph HDF5 loader: one graph (node mode), many small graphs batched on the "
                 "device (graphs mode), or a stock panel's daily correlation graphs (panel mode)",
                 opts, &vt)
