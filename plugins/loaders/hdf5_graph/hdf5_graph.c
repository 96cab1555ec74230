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

/* ---- tensors ------------------------------------------------------------ */

pl_device dev_of(const graph *G) {
    return G->ctx ? G->ctx->device : PL_CPU;
}

/* ---- reading ------------------------------------------------------------ */

/* Read dataset `name` as `memtype` (pl_h5_read_alloc: rank in [min_rank,
 * max_rank], axis i == want[i] where want[i] >= 0) and count its bytes. dims
 * receives the shape, *rank (may be NULL) the rank. */
pl_status read_ds(graph *G, hid_t f, const char *name, hid_t memtype, int min_rank, int max_rank,
                  const int64_t *want, void **out, int64_t *dims, int *rank) {
    return lk_read_ds(G->path, f, name, memtype, min_rank, max_rank, want, out, dims, rank,
                      &G->st.bytes_read);
}

/* x = (x - min) / clamp(row sum of (x - min), 1) over rows [r0, r1) (min over those rows). */
static void normalize_rows(float *x, int64_t r0, int64_t r1, int64_t F) {
    if (r1 <= r0 || F == 0) return;
    float mn = x[r0 * F];
    for (int64_t i = r0 * F; i < r1 * F; i++)
        mn = x[i] < mn ? x[i] : mn;
    /* node mode: one big graph in parallel; nested inside graphs mode's loop: serial */
#pragma omp parallel for schedule(static) if ((r1 - r0) * F > 65536)
    for (int64_t i = r0; i < r1; i++) {
        float *r = x + i * F;
        double s = 0;
        for (int64_t j = 0; j < F; j++)
            s += (double)(r[j] - mn);
        float d = (float)(s < 1.0 ? 1.0 : s);
        for (int64_t j = 0; j < F; j++)
            r[j] = (r[j] - mn) / d;
    }
}

/* First endpoint of edges [e0, e1) of ei [2, E] outside 0..n-1: returns its
 * column and sets *row, or -1 when all are in range. */
static int64_t bad_edge(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n, int *row) {
    for (int64_t e = e0; e < e1; e++)
        for (int r = 0; r < 2; r++)
            if (ei[r * E + e] < 0 || ei[r * E + e] >= n) {
                *row = r;
                return e;
            }
    return -1;
}

/* Copy edges [e0, e1) of ei [2, E] to src/dst from position k; with loops,
 * drop (i, i) and append (i, i) for i in 0..n-1 (PyG remove_self_loops +
 * add_self_loops). Returns the new end position. */
static int64_t copy_edges(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n,
                          bool loops, int64_t *src, int64_t *dst, int64_t k) {
    for (int64_t e = e0; e < e1; e++) {
        if (loops && ei[e] == ei[E + e]) continue;
        src[k] = ei[e];
        dst[k++] = ei[E + e];
    }
    if (loops)
        for (int64_t i = 0; i < n; i++, k++)
            src[k] = dst[k] = i;
    return k;
}

static const char *split_mask_key[PL_SPLIT_COUNT] = {"train_mask", "val_mask", "test_mask"};

/* ---- `pipeline predict` (plugin.h ABI 2.4) -------------------------------
 * Meta "predict_split" names the one split to serve. The new file needs no
 * other split and may lack labels / targets; what the model's shape and the
 * target scale come from is read from the files the run wrote into its
 * directory (never from the new file): node mode graph_meta.json
 * (num_features, num_classes), graphs mode standardization.json (the train
 * graphs' target mean and std). */

/* Predict: the mask of split G->predict ([n] u8) into *out, or every entry
 * selected when the file has none of the three masks (new data without a
 * split). A file with some masks but not this split's is refused, naming the
 * dataset. Called under the HDF5 lock. */
static pl_status read_predict_mask(graph *G, hid_t f, const pl_config_section *cfg, int64_t n,
                                   const char *unit, uint8_t **out) {
    const char *key = split_mask_key[G->predict];
    const char *mk = pl_cfg_str(cfg, key, key);
    if (!pl_h5_exists(f, mk)) {
        for (int s = 0; s < PL_SPLIT_COUNT; s++) {
            const char *o = pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]);
            if (pl_h5_exists(f, o))
                return pl_error_set(PL_ERR_IO,
                                    "%s: no mask dataset '%s' for split '%s' (the file "
                                    "has '%s'; a file without any mask predicts every %s)",
                                    G->path, mk, pl_split_name((pl_data_split)G->predict), o, unit);
        }
        *out = malloc((size_t)(n > 0 ? n : 1));
        if (!*out) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        memset(*out, 1, (size_t)n);
        return PL_OK;
    }
    int64_t dm[1];
    pl_status st =
        read_ds(G, f, mk, H5T_NATIVE_UINT8, 1, 1, (int64_t[]){n}, (void **)out, dm, NULL);
    if (st) return pl_error_prefix(st, "split mask: one entry per %s (%lld)", unit, (long long)n);
    return PL_OK;
}

/* Write `root` (consumed) as ctx->run_dir/NAME; a no-op without a run dir. */
static pl_status run_json_write(const graph *G, const char *name, cJSON *root) {
    if (!G->ctx || !G->ctx->run_dir || !root) {
        cJSON_Delete(root);
        return PL_OK;
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", G->ctx->run_dir, name);
    FILE *f = txt ? fopen(p, "w") : NULL;
    pl_status st = PL_OK;
    if (!f || fputs(txt, f) < 0) st = pl_error_set(PL_ERR_IO, "%s: cannot write", p);
    if (f && fclose(f) && !st) st = pl_error_set(PL_ERR_IO, "%s: cannot write", p);
    free(txt);
    return st;
}

/* Parse ctx->run_dir/NAME into *out (the caller checks every member: the
 * file is untrusted). *out = NULL and PL_OK when the file does not exist. */
static pl_status run_json_read(const graph *G, const char *name, char *path, size_t np,
                               cJSON **out) {
    *out = NULL;
    snprintf(path, np, "%s/%s", G->ctx && G->ctx->run_dir ? G->ctx->run_dir : ".", name);
    FILE *f = pl_file_fopen_read(path, NULL);
    if (!f && !errno) return pl_error_status(); /* not a regular file */
    if (!f) {
        pl_error_clear();
        return PL_OK;
    }
    char *txt = NULL;
    long n = -1;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && n < (1L << 24) && !fseek(f, 0, SEEK_SET)) {
        txt = malloc((size_t)n + 1);
        if (txt && fread(txt, 1, (size_t)n, f) == (size_t)n) {
            txt[n] = 0;
        } else {
            free(txt);
            txt = NULL;
        }
    }
    fclose(f);
    if (!txt) return pl_error_set(PL_ERR_IO, "%s: cannot read (or larger than 16 MiB)", path);
    *out = cJSON_Parse(txt);
    free(txt);
    if (!*out) return pl_error_set(PL_ERR_IO, "%s: not valid JSON", path);
    return PL_OK;
}

/* A member of `root` that must be an integer in [lo, hi]. */
static pl_status json_int(const cJSON *root, const char *path, const char *key, int64_t lo,
                          int64_t hi, int64_t *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return pl_error_set(PL_ERR_IO, "%s: '%s' must be an integer in %lld..%lld", path, key,
                            (long long)lo, (long long)hi);
    *v = (int64_t)it->valuedouble;
    return PL_OK;
}

/* ---- destroy ------------------------------------------------------------ */

void release_views(graph *G) {
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
    if (G->panel) hdf5_panel_vtable.destroy(G->panel);
    free(G);
}

/* ======================================================================
 * mode = node
 * ====================================================================== */

static pl_status create_node(graph *G, const pl_config_section *cfg, pl_run_context *ctx) {
    pl_status st = PL_OK;
    float *x = NULL;
    int64_t *ei = NULL, *y = NULL, *src = NULL, *dst = NULL;
    uint8_t *m[3] = {NULL, NULL, NULL};
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    if ((st = pl_h5_open_read(G->path, "run tools/prepare_data.sh", &f))) goto out;
    int64_t dx[2], de[2], dy[1], dm[1];
    if ((st = read_ds(G, f, pl_cfg_str(cfg, "features", "features"), H5T_NATIVE_FLOAT, 2, 2, NULL,
                      (void **)&x, dx, NULL)))
        goto out;
    G->N = dx[0];
    G->F = dx[1];
    /* NaN / Inf in the features is refused (README "Missing values") */
    if ((st = pl_h5_check_finite(G->path, pl_cfg_str(cfg, "features", "features"), PL_F32, x, 0,
                                 G->N, 2, dx, NULL, NULL, 0)))
        goto out;
    int64_t wn[1] = {G->N}, we[2] = {2, -1};
    const int ps = G->predict;
    const char *lname = pl_cfg_str(cfg, "labels", "labels");
    G->has_y = ps < 0 || pl_h5_exists(f, lname); /* predict: new nodes may have no labels */
    if (G->has_y) {
        if ((st = read_ds(G, f, lname, H5T_NATIVE_INT64, 1, 1, wn, (void **)&y, dy, NULL)))
            goto out;
    } else if (!(y = malloc(sizeof *y * (size_t)(G->N ? G->N : 1)))) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out;
    } else {
        for (int64_t i = 0; i < G->N; i++)
            y[i] = -1;
    }
    if ((st = read_ds(G, f, pl_cfg_str(cfg, "edge_index", "edge_index"), H5T_NATIVE_INT64, 2, 2, we,
                      (void **)&ei, de, NULL)))
        goto out;
    for (int s = 0; s < 3; s++) {
        if (ps >= 0) { /* predict: that split's mask alone (or every node) */
            if (s == ps && (st = read_predict_mask(G, f, cfg, G->N, "node", &m[s]))) goto out;
            continue;
        }
        if ((st = read_ds(G, f, pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]),
                          H5T_NATIVE_UINT8, 1, 1, wn, (void **)&m[s], dm, NULL)))
            goto out;
    }
    /* attribute num_classes if present, else max label + 1; predict: the run's */
    int64_t C = -1, run_c = -1;
    bool has_c;
    if ((st = pl_h5_attr_read_int(G->path, f, "num_classes", &C, &has_c))) goto out;
    if (!has_c) C = -1;
    if (ps >= 0) {
        char jp[2048];
        cJSON *j = NULL;
        int64_t run_f = -1;
        st = run_json_read(G, "graph_meta.json", jp, sizeof jp, &j);
        if (!st && j) st = json_int(j, jp, "num_classes", 1, INT32_MAX, &run_c);
        if (!st && j) st = json_int(j, jp, "num_features", 0, INT64_MAX / 2, &run_f);
        cJSON_Delete(j);
        if (st) goto out;
        if (run_f >= 0 && run_f != G->F) {
            st = pl_error_set(PL_ERR_SHAPE,
                              "%s: dataset '%s' has %lld features per node; the run "
                              "was trained on %lld (%s)",
                              G->path, pl_cfg_str(cfg, "features", "features"), (long long)G->F,
                              (long long)run_f, jp);
            goto out;
        }
        if (run_c > 0 && has_c && C != run_c) {
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: attribute num_classes = %lld; the run was "
                              "trained with %lld classes (%s)",
                              G->path, (long long)C, (long long)run_c, jp);
            goto out;
        }
        if (run_c > 0)
            C = run_c;
        else if (C < 0 && !G->has_y) {
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: neither the run (%s) nor the file (attribute "
                              "num_classes, labels '%s') gives the number of classes",
                              G->path, jp, lname);
            goto out;
        }
    }
    int64_t ymax = -1;
    for (int64_t i = 0; i < G->N; i++) {
        /* classes are < 2^31 so that max label + 1 (the class count) cannot overflow */
        if (y[i] < -1 || y[i] > INT32_MAX - 1) {
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: labels[%lld] = %lld; expected a class in 0..%d or -1", G->path,
                              (long long)i, (long long)y[i], INT32_MAX - 1);
            goto out;
        }
        if (y[i] > ymax) ymax = y[i];
    }
    if (C < 0) C = ymax + 1;
    if (C < 1) {
        st = pl_error_set(PL_ERR_INVALID,
                          "%s: num_classes = %lld (attribute, or max label + 1 with every label "
                          "-1); expected >= 1",
                          G->path, (long long)C);
        goto out;
    }
    if (ymax >= C) {
        st = pl_error_set(PL_ERR_INVALID, "%s: label %lld >= num_classes %lld", G->path,
                          (long long)ymax, (long long)C);
        goto out;
    }
    G->C = C;
    /* edges: range check, optional self loops */
    int64_t E = de[1];
    int r;
    int64_t e = bad_edge(ei, E, 0, E, G->N, &r);
    if (e >= 0) {
        st = pl_error_set(PL_ERR_INVALID,
                          "%s: edge_index[%d][%lld] = %lld is outside 0..%lld (num_nodes %lld)",
                          G->path, r, (long long)e, (long long)ei[r * E + e], (long long)G->N - 1,
                          (long long)G->N);
        goto out;
    }
    bool loops = pl_cfg_bool(cfg, "add_self_loops", false);
    int64_t cap = E + (loops ? G->N : 0);
    src = malloc(sizeof *src * (size_t)(cap ? cap : 1));
    dst = malloc(sizeof *dst * (size_t)(cap ? cap : 1));
    if (!src || !dst) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out;
    }
    G->E = copy_edges(ei, E, 0, E, G->N, loops, src, dst, 0);
    if (pl_cfg_bool(cfg, "row_normalize", false)) normalize_rows(x, 0, G->N, G->F);
    G->x = lk_to_device(dev_of(G), PL_F32, 2, (int64_t[]){G->N, G->F}, x);
    G->y = lk_to_device(dev_of(G), PL_I64, 1, (int64_t[]){G->N}, y);
    G->src = lk_to_device(dev_of(G), PL_I64, 1, (int64_t[]){G->E}, src);
    G->dst = lk_to_device(dev_of(G), PL_I64, 1, (int64_t[]){G->E}, dst);
    bool masks_ok = true;
    for (int s = 0; s < 3 && G->x; s++) {
        if (!m[s]) continue; /* predict: another split's */
        G->mask[s] = lk_to_device(dev_of(G), PL_U8, 1, (int64_t[]){G->N}, m[s]);
        if (!G->mask[s]) {
            masks_ok = false;
            break;
        }
        for (int64_t i = 0; i < G->N; i++)
            G->count[s] += m[s][i] != 0;
    }
    if (!G->x || !G->y || !G->src || !G->dst || !masks_ok) {
        st = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        goto out;
    }
    pl_tensor_set_name(G->x, "x");
    pl_tensor_set_name(G->y, "y");
    pl_tensor_set_name(G->src, "edge_src");
    pl_tensor_set_name(G->dst, "edge_dst");
    if (ctx && ctx->meta) {
        /* what was loaded, for the run's data line: nodes with no edge other than a
         * self loop (in the file's edges) and nodes without a label (-1) */
        int64_t isolated = 0, unlabeled = 0;
        unsigned char *touched = calloc((size_t)G->N, 1);
        if (touched) {
            for (int64_t k = 0; k < E; k++)
                if (ei[k] != ei[E + k]) touched[ei[k]] = touched[ei[E + k]] = 1;
            for (int64_t i = 0; i < G->N; i++)
                isolated += !touched[i];
            free(touched);
        }
        for (int64_t i = 0; i < G->N; i++)
            unlabeled += y[i] < 0;
        pl_meta_set_int(ctx->meta, "num_nodes", G->N);
        pl_meta_set_int(ctx->meta, "num_features", G->F);
        pl_meta_set_int(ctx->meta, "num_classes", G->C);
        pl_meta_set_int(ctx->meta, "num_edges", G->E);
        pl_meta_set_int(ctx->meta, "num_isolated_nodes", isolated);
        pl_meta_set_int(ctx->meta, "num_unlabeled_nodes", unlabeled);
        pl_meta_set_int(ctx->meta, "num_train", G->count[0]);
        pl_meta_set_int(ctx->meta, "num_val", G->count[1]);
        pl_meta_set_int(ctx->meta, "num_test", G->count[2]);
        char line[512];
        snprintf(line, sizeof line,
                 "%s: %lld nodes, %lld edges%s, %lld features, %lld classes; %lld isolated, "
                 "%lld unlabeled nodes; train %lld, val %lld, test %lld nodes",
                 G->path, (long long)G->N, (long long)G->E, loops ? " (self loops added)" : "",
                 (long long)G->F, (long long)G->C, (long long)isolated, (long long)unlabeled,
                 (long long)G->count[0], (long long)G->count[1], (long long)G->count[2]);
        pl_meta_set_str(ctx->meta, "data_summary", line);
    }
    if (ps < 0) { /* what `pipeline predict` needs of this run (README "Predict") */
        cJSON *j = cJSON_CreateObject();
        if (j) {
            cJSON_AddStringToObject(j, "mode", "node");
            cJSON_AddNumberToObject(j, "num_features", (double)G->F);
            cJSON_AddNumberToObject(j, "num_classes", (double)G->C);
            cJSON_AddStringToObject(j, "source", G->path);
        }
        if ((st = run_json_write(G, "graph_meta.json", j))) goto out;
    }
    G->st.chunks_loaded = 1;
out:
    if (f >= 0) pl_h5_close(G->path, f);
    pl_h5_unlock();
    free(x);
    free(ei);
    free(y);
    free(src);
    free(dst);
    for (int s = 0; s < 3; s++)
        free(m[s]);
    return st;
}

/* ======================================================================
 * mode = graphs
 * ====================================================================== */

/* ptr [n] must start at 0, never decrease and end at `total` (the rows of `of`). */
static pl_status check_ptr(const graph *G, const char *name, const int64_t *ptr, int64_t n,
                           int64_t total, const char *of, const char *what) {
    if (ptr[0] != 0)
        return pl_error_set(PL_ERR_INVALID, "%s: %s[0] = %lld; expected 0 (CSR offsets start at 0)",
                            G->path, name, (long long)ptr[0]);
    for (int64_t i = 0; i + 1 < n; i++)
        if (ptr[i + 1] < ptr[i])
            return pl_error_set(PL_ERR_INVALID,
                                "%s: %s is not monotone: %s[%lld] = %lld < %s[%lld] = %lld",
                                G->path, name, name, (long long)i + 1, (long long)ptr[i + 1], name,
                                (long long)i, (long long)ptr[i]);
    if (ptr[n - 1] != total)
        return pl_error_set(
            PL_ERR_INVALID, "%s: %s[%lld] = %lld (last entry); expected %lld, the %s of '%s'",
            G->path, name, (long long)n - 1, (long long)ptr[n - 1], (long long)total, what, of);
    return PL_OK;
}

/* Lay the split's graphs out in S->order into the staging tensors: x rows,
 * batch-local edge ids, the batch vector, y rows and the batch boundaries
 * (batch b = order positions [b*B, (b+1)*B)). Host-side gather straight into
 * the tensors (CPU) or into the scratch buffers, then one copy per tensor. */
static pl_status arrange(graph *G, gsplit *S) {
    const int64_t F = G->F, K = G->K, B = G->B;
    bool cpu = pl_device_eq(dev_of(G), PL_CPU);
    float *px = cpu ? pl_tensor_data(S->x) : G->sx;
    float *py = !S->y ? NULL : cpu ? pl_tensor_data(S->y) : G->sy; /* NULL: no targets */
    int64_t *psrc = cpu ? pl_tensor_data(S->src) : G->ssrc,
            *pdst = cpu ? pl_tensor_data(S->dst) : G->sdst;
    int64_t *pbatch = cpu ? pl_tensor_data(S->batch) : G->sbatch;
    /* batch boundaries (staging rows), sequential: O(ng) */
    int64_t no = 0, eo = 0;
    for (int64_t i = 0; i < S->ng; i++) {
        if (i % B == 0) {
            S->bnode[i / B] = no;
            S->bedge[i / B] = eo;
        }
        int64_t g = S->order[i];
        no += G->nptr[g + 1] - G->nptr[g];
        eo += G->eptr[g + 1] - G->eptr[g];
    }
    S->bnode[S->nb_all] = no;
    S->bedge[S->nb_all] = eo;
    /* per-graph copy; a graph's staging offsets follow from its batch's start
     * plus the graphs before it in that batch, so batches go in parallel */
#pragma omp parallel for schedule(dynamic, 4) if (S->nodes > 65536)
    for (int64_t b = 0; b < S->nb_all; b++) {
        int64_t n0 = S->bnode[b], e0 = S->bedge[b];
        int64_t nn = n0, ee = e0;
        int64_t i1 = (b + 1) * B < S->ng ? (b + 1) * B : S->ng;
        for (int64_t i = b * B; i < i1; i++) {
            int64_t g = S->order[i], gn = G->nptr[g + 1] - G->nptr[g];
            memcpy(px + nn * F, G->hx + G->nptr[g] * F, sizeof *px * (size_t)(gn * F));
            if (py) memcpy(py + i * K, G->hy + g * K, sizeof *py * (size_t)K);
            int64_t off = nn - n0; /* node offset of graph g within its batch */
            for (int64_t e = G->eptr[g]; e < G->eptr[g + 1]; e++, ee++) {
                psrc[ee] = G->hsrc[e] + off;
                pdst[ee] = G->hdst[e] + off;
            }
            for (int64_t v = 0; v < gn; v++)
                pbatch[nn + v] = i - b * B;
            nn += gn;
        }
    }
    if (cpu) return PL_OK;
    const pl_backend *be = pl_backend_get(dev_of(G).type);
    if (!be) return pl_error_status();
    struct {
        pl_tensor *t;
        const void *h;
        size_t bytes;
    } cp[5] = {{S->x, px, sizeof(float) * (size_t)(S->nodes * F)},
               {S->y, py, sizeof(float) * (size_t)(S->ng * K)},
               {S->src, psrc, sizeof(int64_t) * (size_t)S->edges},
               {S->dst, pdst, sizeof(int64_t) * (size_t)S->edges},
               {S->batch, pbatch, sizeof(int64_t) * (size_t)S->nodes}};
    for (int i = 0; i < 5; i++) {
        if (!cp[i].bytes || !cp[i].t) continue;
        pl_status st =
            be->memcpy(pl_tensor_data(cp[i].t), cp[i].t->device, cp[i].h, PL_CPU, cp[i].bytes);
        if (st)
            return pl_error_prefix(st, "%s: copying the %s staging of split to the device", G->path,
                                   cp[i].t->name);
    }
    return PL_OK;
}

/* The train order of `epoch`: the split's graphs (file order) shuffled with
 * seed = ctx->seed + epoch. Depends on nothing else (resume relies on it). */
static void train_order(graph *G, int64_t epoch) {
    gsplit *S = &G->sp[PL_SPLIT_TRAIN];
    if (!G->shuffle) {
        memcpy(S->order, S->ids, sizeof *S->order * (size_t)S->ng);
        return;
    }
    lk_shuffle_order(S->order, S->ids, S->ng, (G->ctx ? G->ctx->seed : 0) + (uint64_t)epoch);
}

/* Target k's name in standardization.json: "y[k]" (the dataset and column). */
static void target_column(char *b, size_t n, const char *yname, int64_t k) {
    snprintf(b, n, "%s[%lld]", yname, (long long)k);
}

/* Training: run_dir/standardization.json with the train graphs' target mean
 * and std (mean 0, std 1 with standardize_targets = false), the layout of
 * hdf5_chunk's series mode plus num_features, so `pipeline predict` serves
 * new graphs in the units the model was trained in. */
static pl_status write_run_standardization(const graph *G, const char *yname, const double *mean,
                                           const double *sd, bool standardized) {
    cJSON *root = cJSON_CreateObject();
    cJSON *c = cJSON_AddArrayToObject(root, "columns");
    cJSON *m = cJSON_AddArrayToObject(root, "mean");
    cJSON *s = cJSON_AddArrayToObject(root, "std");
    if (!root || !c || !m || !s) {
        cJSON_Delete(root);
        return pl_error_set(PL_ERR_NOMEM, "hdf5_graph: out of memory");
    }
    for (int64_t k = 0; k < G->K; k++) {
        char nb[128];
        target_column(nb, sizeof nb, yname, k);
        cJSON_AddItemToArray(c, cJSON_CreateString(nb));
        cJSON_AddItemToArray(m, cJSON_CreateNumber(mean[k]));
        cJSON_AddItemToArray(s, cJSON_CreateNumber(sd[k]));
    }
    cJSON_AddBoolToObject(root, "standardized", standardized);
    cJSON_AddNumberToObject(root, "train_graphs", (double)G->sp[PL_SPLIT_TRAIN].ng);
    cJSON_AddNumberToObject(root, "num_features", (double)G->F);
    cJSON_AddStringToObject(root, "source", G->path);
    cJSON_AddStringToObject(root, "formula",
                            "y_std = (y - mean) / std, unbiased std of the train graphs' targets");
    return run_json_write(G, "standardization.json", root);
}

/* Predict: the run's standardization.json into new *mean / *sd and G->K (the
 * file's targets, when present, must have as many columns). The file is
 * untrusted: arrays of equal length 1..64 (the gat limit is checked by the
 * model), finite means, finite std > 0, columns named as this config's. */
static pl_status read_run_standardization(graph *G, const char *yname, double **mean, double **sd) {
    char p[2048];
    cJSON *root = NULL;
    pl_status st = run_json_read(G, "standardization.json", p, sizeof p, &root);
    if (st) return st;
    if (!root) {
        pl_hint_set("a run trained before hdf5_graph saved its target statistics cannot predict "
                    "in original units; retrain it");
        return pl_error_set(PL_ERR_IO,
                            "%s: cannot open (the run's target standardization: "
                            "predict needs it to read new graphs)",
                            p);
    }
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "columns");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "mean");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "std");
    int K = cJSON_IsArray(c) ? cJSON_GetArraySize(c) : -1;
    int64_t nf = -1;
    if (K < 1 || K > 1024 || !cJSON_IsArray(m) || !cJSON_IsArray(d) || cJSON_GetArraySize(m) != K ||
        cJSON_GetArraySize(d) != K)
        st = pl_error_set(PL_ERR_IO,
                          "%s: expected arrays columns, mean and std of equal length "
                          "1..1024",
                          p);
    if (!st) st = json_int(root, p, "num_features", 0, INT64_MAX / 2, &nf);
    if (!st && nf != G->F)
        st = pl_error_set(PL_ERR_SHAPE,
                          "%s: node features have %lld columns; the run was trained "
                          "on %lld (%s)",
                          G->path, (long long)G->F, (long long)nf, p);
    if (!st && G->has_y && G->K != K)
        st = pl_error_set(PL_ERR_SHAPE,
                          "%s: dataset '%s' has %lld targets per graph; the run was "
                          "trained on %d (%s)",
                          G->path, yname, (long long)G->K, K, p);
    if (!st) {
        *mean = calloc((size_t)K, sizeof **mean);
        *sd = calloc((size_t)K, sizeof **sd);
        if (!*mean || !*sd) st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    }
    for (int k = 0; !st && k < K; k++) {
        const cJSON *ck = cJSON_GetArrayItem(c, k), *mk = cJSON_GetArrayItem(m, k),
                    *dk = cJSON_GetArrayItem(d, k);
        char nb[128];
        target_column(nb, sizeof nb, yname, k);
        if (!cJSON_IsString(ck) || strcmp(ck->valuestring, nb))
            st = pl_error_set(PL_ERR_IO, "%s: column %d is '%s'; this config's targets are '%s'", p,
                              k, cJSON_IsString(ck) ? ck->valuestring : "?", nb);
        else if (!cJSON_IsNumber(mk) || !cJSON_IsNumber(dk) || !isfinite(mk->valuedouble) ||
                 !isfinite(dk->valuedouble) || !(dk->valuedouble > 0))
            st = pl_error_set(PL_ERR_IO,
                              "%s: mean/std of column '%s' must be finite numbers, "
                              "std > 0",
                              p, nb);
        else {
            (*mean)[k] = mk->valuedouble;
            (*sd)[k] = dk->valuedouble;
        }
    }
    cJSON_Delete(root);
    if (!st) G->K = K;
    return st;
}

static pl_status create_graphs(graph *G, const pl_config_section *cfg, pl_run_context *ctx) {
    const char *xname = cfg_changed(cfg, "features") ? pl_cfg_str(cfg, "features", "x") : "x";
    const char *einame = pl_cfg_str(cfg, "edge_index", "edge_index");
    const char *npname = pl_cfg_str(cfg, "node_ptr", "node_ptr");
    const char *epname = pl_cfg_str(cfg, "edge_ptr", "edge_ptr");
    const char *yname = pl_cfg_str(cfg, "targets", "y");
    const int ps = G->predict;
    G->B = pl_cfg_int(cfg, "batch_size", 32);
    G->shuffle = ps < 0 && pl_cfg_bool(cfg, "shuffle", true); /* predict: file order */
    G->drop_last = pl_cfg_bool(cfg, "drop_last", false);
    bool loops = pl_cfg_bool(cfg, "add_self_loops", false),
         norm = pl_cfg_bool(cfg, "row_normalize", false);
    bool standardize = pl_cfg_bool(cfg, "standardize_targets", true);

    pl_status st = PL_OK;
    int64_t *ei = NULL, *np = NULL, *ep = NULL;
    uint8_t *m[3] = {NULL, NULL, NULL};
    double *mean = NULL, *sd = NULL;
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    if ((st = pl_h5_open_read(G->path, "run tools/prepare_data.sh", &f))) goto out;
    int64_t dx[2], de[2], dnp[1], dep[1], dy[2], dm[1];
    int yrank = 0;
    if ((st = read_ds(G, f, xname, H5T_NATIVE_FLOAT, 2, 2, NULL, (void **)&G->hx, dx, NULL)) ||
        (st = read_ds(G, f, einame, H5T_NATIVE_INT64, 2, 2, (int64_t[]){2, -1}, (void **)&ei, de,
                      NULL)) ||
        (st = read_ds(G, f, npname, H5T_NATIVE_INT64, 1, 1, NULL, (void **)&np, dnp, NULL)))
        goto out;
    G->N = dx[0];
    G->F = dx[1];
    int64_t E = de[1];
    if (dnp[0] < 2) {
        st = pl_error_set(
            PL_ERR_SHAPE,
            "%s: dataset '%s' has %lld entries; expected G+1 >= 2 (CSR offsets of G >= 1 graphs)",
            G->path, npname, (long long)dnp[0]);
        goto out;
    }
    G->NG = dnp[0] - 1;
    if ((st = read_ds(G, f, epname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){G->NG + 1}, (void **)&ep,
                      dep, NULL))) {
        pl_error_prefix(st, "'%s' and '%s' must both have G+1 entries", npname, epname);
        goto out;
    }
    G->has_y = ps < 0 || pl_h5_exists(f, yname); /* predict: new graphs may have no targets */
    if (G->has_y && (st = read_ds(G, f, yname, H5T_NATIVE_FLOAT, 1, 2, (int64_t[]){G->NG, -1},
                                  (void **)&G->hy, dy, &yrank))) {
        pl_error_prefix(st, "targets: one row per graph (G = %lld from '%s')", (long long)G->NG,
                        npname);
        goto out;
    }
    G->K = !G->has_y ? 0 : yrank == 2 ? dy[1] : 1;
    for (int s = 0; s < 3; s++) {
        if (ps >= 0) { /* predict: that split's mask alone (or every graph) */
            if (s == ps && (st = read_predict_mask(G, f, cfg, G->NG, "graph", &m[s]))) goto out;
            continue;
        }
        const char *mk = pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]);
        if ((st = read_ds(G, f, mk, H5T_NATIVE_UINT8, 1, 1, (int64_t[]){G->NG}, (void **)&m[s], dm,
                          NULL))) {
            pl_error_prefix(st, "graph masks: one entry per graph (G = %lld from '%s')",
                            (long long)G->NG, npname);
            goto out;
        }
    }
    st = pl_h5_close(G->path, f);
    f = H5I_INVALID_HID;
    pl_h5_unlock();
    if (st) goto out_unlocked;

    /* CSR offsets and edges within their own graph */
    if ((st = check_ptr(G, npname, np, G->NG + 1, G->N, xname, "rows")) ||
        (st = check_ptr(G, epname, ep, G->NG + 1, E, einame, "columns")))
        goto out_unlocked;
    if (G->has_y && G->K < 1) {
        st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has 0 targets per graph", G->path, yname);
        goto out_unlocked;
    }
    /* predict: the number of targets and their scale are the run's */
    if (ps >= 0 && (st = read_run_standardization(G, yname, &mean, &sd))) goto out_unlocked;
    /* NaN / Inf in node features or targets is refused (README "Missing values") */
    if ((st = pl_h5_check_finite(G->path, xname, PL_F32, G->hx, 0, G->N, 2, dx, NULL, NULL, 0)) ||
        (G->has_y && (st = pl_h5_check_finite(G->path, yname, PL_F32, G->hy, 0, G->NG, yrank, dy,
                                              NULL, NULL, 0))))
        goto out_unlocked;
    for (int64_t g = 0; g < G->NG; g++) {
        int64_t n = np[g + 1] - np[g];
        int r;
        int64_t e = bad_edge(ei, E, ep[g], ep[g + 1], n, &r);
        if (e >= 0) {
            st = pl_error_set(PL_ERR_INVALID,
                              "%s: graph %lld: edge %lld of the graph (%s[%d][%lld]) = %lld is "
                              "outside its local node ids 0..%lld (the graph has %lld nodes)",
                              G->path, (long long)g, (long long)(e - ep[g]), einame, r,
                              (long long)e, (long long)ei[r * E + e], (long long)n - 1,
                              (long long)n);
            goto out_unlocked;
        }
    }
    /* per-graph self loops: drop (i, i) then append (i, i) for every node */
    int64_t cap = E + (loops ? G->N : 0);
    G->hsrc = malloc(sizeof *G->hsrc * (size_t)(cap ? cap : 1));
    G->hdst = malloc(sizeof *G->hdst * (size_t)(cap ? cap : 1));
    G->nptr = np;
    np = NULL;
    G->eptr = malloc(sizeof *G->eptr * (size_t)(G->NG + 1));
    if (!G->hsrc || !G->hdst || !G->eptr) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out_unlocked;
    }
    G->eptr[0] = 0;
    for (int64_t g = 0; g < G->NG; g++)
        G->eptr[g + 1] = copy_edges(ei, E, ep[g], ep[g + 1], G->nptr[g + 1] - G->nptr[g], loops,
                                    G->hsrc, G->hdst, G->eptr[g]);
    G->E = G->eptr[G->NG];
    if (norm) {
#pragma omp parallel for schedule(dynamic, 64) if (G->N > 65536)
        for (int64_t g = 0; g < G->NG; g++)
            normalize_rows(G->hx, G->nptr[g], G->nptr[g + 1], G->F);
    }

    /* splits */
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        gsplit *S = &G->sp[s];
        S->arranged_epoch = -1;
        if (!m[s]) continue; /* predict: another split's */
        for (int64_t g = 0; g < G->NG; g++)
            S->ng += m[s][g] != 0;
        if (S->ng == 0) {
            st = pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty: mask '%s' selects no graph",
                              G->path, pl_split_name((pl_data_split)s),
                              pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]));
            goto out_unlocked;
        }
        bool drop = s == PL_SPLIT_TRAIN && G->drop_last && ps < 0;
        if (drop && S->ng < G->B) {
            st = pl_error_set(
                PL_ERR_CONFIG,
                "%s: train split has %lld graphs < batch_size %lld with drop_last = true: "
                "no batch",
                G->path, (long long)S->ng, (long long)G->B);
            goto out_unlocked;
        }
        S->nb_all = (S->ng + G->B - 1) / G->B;
        S->nb = drop ? S->ng / G->B : S->nb_all;
        S->ids = malloc(sizeof *S->ids * (size_t)S->ng);
        S->order = malloc(sizeof *S->order * (size_t)S->ng);
        S->bnode = malloc(sizeof *S->bnode * (size_t)(S->nb_all + 1));
        S->bedge = malloc(sizeof *S->bedge * (size_t)(S->nb_all + 1));
        if (!S->ids || !S->order || !S->bnode || !S->bedge) {
            st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
            goto out_unlocked;
        }
        int64_t j = 0;
        for (int64_t g = 0; g < G->NG; g++)
            if (m[s][g]) {
                S->ids[j++] = g;
                S->nodes += G->nptr[g + 1] - G->nptr[g];
                S->edges += G->eptr[g + 1] - G->eptr[g];
            }
        memcpy(S->order, S->ids, sizeof *S->order * (size_t)S->ng);
    }

    /* target standardization: mean and unbiased (n - 1) std over the train graphs
     * (predict: the run's, read above) */
    if (ps < 0) {
        mean = calloc((size_t)G->K, sizeof *mean);
        sd = calloc((size_t)G->K, sizeof *sd);
    }
    if (!mean || !sd) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out_unlocked;
    }
    for (int64_t kk = 0; kk < G->K && ps < 0; kk++) {
        const gsplit *T = &G->sp[PL_SPLIT_TRAIN];
        if (!standardize) {
            sd[kk] = 1.0;
            continue;
        }
        double s = 0, ss = 0;
        for (int64_t i = 0; i < T->ng; i++)
            s += G->hy[T->ids[i] * G->K + kk];
        mean[kk] = s / (double)T->ng;
        for (int64_t i = 0; i < T->ng; i++) {
            double d = G->hy[T->ids[i] * G->K + kk] - mean[kk];
            ss += d * d;
        }
        sd[kk] = T->ng > 1 ? sqrt(ss / (double)(T->ng - 1)) : 0.0;
        if (!(sd[kk] > 0)) sd[kk] = 1.0; /* constant target or one train graph: center only */
    }
    if ((standardize || ps >= 0) && G->has_y)
        for (int64_t g = 0; g < G->NG; g++)
            for (int64_t kk = 0; kk < G->K; kk++)
                G->hy[g * G->K + kk] = (float)((G->hy[g * G->K + kk] - mean[kk]) / sd[kk]);

    /* staging tensors (device) + host scratch for a non-CPU device */
    pl_device dev = dev_of(G);
    int64_t max_nodes = 0, max_edges = 0, max_ng = 0;
    static const char *fname[NB_FIELDS] = {"x", "edge_src", "edge_dst", "batch", "y", "graph"};
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        gsplit *S = &G->sp[s];
        if (ps >= 0 && s != ps) continue; /* predict: one split */
        S->x = lk_new_tensor(PL_F32, 2, (int64_t[]){S->nodes, G->F}, dev);
        S->src = lk_new_tensor(PL_I64, 1, (int64_t[]){S->edges}, dev);
        S->dst = lk_new_tensor(PL_I64, 1, (int64_t[]){S->edges}, dev);
        S->batch = lk_new_tensor(PL_I64, 1, (int64_t[]){S->nodes}, dev);
        if (G->has_y) S->y = lk_new_tensor(PL_F32, 2, (int64_t[]){S->ng, G->K}, dev);
        /* predict: each graph's index in the file, in serving (file) order */
        if (ps >= 0) S->gid = lk_to_device(dev_of(G), PL_I64, 1, (int64_t[]){S->ng}, S->ids);
        if (!S->x || !S->src || !S->dst || !S->batch || (G->has_y && !S->y) ||
            (ps >= 0 && !S->gid)) {
            st = pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                 "%s: staging tensors of split '%s'", G->path,
                                 pl_split_name((pl_data_split)s));
            goto out_unlocked;
        }
        pl_tensor *t[NB_FIELDS] = {S->x, S->src, S->dst, S->batch, S->y, S->gid};
        for (int i = 0; i < NB_FIELDS; i++)
            if (t[i]) pl_tensor_set_name(t[i], "%s", fname[i]);
        max_nodes = S->nodes > max_nodes ? S->nodes : max_nodes;
        max_edges = S->edges > max_edges ? S->edges : max_edges;
        max_ng = S->ng > max_ng ? S->ng : max_ng;
    }
    if (!pl_device_eq(dev, PL_CPU)) {
        G->sx = malloc(sizeof *G->sx * (size_t)(max_nodes * G->F + 1));
        G->sy = malloc(sizeof *G->sy * (size_t)(max_ng * G->K + 1));
        G->ssrc = malloc(sizeof *G->ssrc * (size_t)(max_edges + 1));
        G->sdst = malloc(sizeof *G->sdst * (size_t)(max_edges + 1));
        G->sbatch = malloc(sizeof *G->sbatch * (size_t)(max_nodes + 1));
        if (!G->sx || !G->sy || !G->ssrc || !G->sdst || !G->sbatch) {
            st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
            goto out_unlocked;
        }
    }
    /* val/test (and an unshuffled train) never change order: lay out once */
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if ((s == PL_SPLIT_TRAIN && G->shuffle) || G->sp[s].ng == 0) continue;
        if ((st = arrange(G, &G->sp[s]))) goto out_unlocked;
        G->sp[s].arranged_epoch = 0;
    }
    if (ctx && ctx->meta) {
        pl_meta_set_int(ctx->meta, "num_features", G->F);
        pl_meta_set_int(ctx->meta, "num_targets", G->K);
        pl_meta_set_int(ctx->meta, "num_graphs", G->NG);
        pl_meta_set_int(ctx->meta, "num_train", G->sp[0].ng);
        pl_meta_set_int(ctx->meta, "num_val", G->sp[1].ng);
        pl_meta_set_int(ctx->meta, "num_test", G->sp[2].ng);
        for (int64_t kk = 0; kk < G->K; kk++) {
            char key[64];
            snprintf(key, sizeof key, "target_mean_%lld", (long long)kk);
            pl_meta_set_float(ctx->meta, key, mean[kk]);
            snprintf(key, sizeof key, "target_std_%lld", (long long)kk);
            pl_meta_set_float(ctx->meta, key, sd[kk]);
        }
        pl_meta_set_str(ctx->meta, "task", "graph_regression");
        char line[512];
        snprintf(line, sizeof line,
                 "%s: %lld graphs, %lld node features, %lld targets; train %lld, val %lld, "
                 "test %lld graphs",
                 G->path, (long long)G->NG, (long long)G->F, (long long)G->K,
                 (long long)G->sp[0].ng, (long long)G->sp[1].ng, (long long)G->sp[2].ng);
        pl_meta_set_str(ctx->meta, "data_summary", line);
    }
    if (ps < 0 && (st = write_run_standardization(G, yname, mean, sd, standardize)))
        goto out_unlocked;
    G->st.chunks_loaded = 1;
    goto out_unlocked;
out:
    if (f >= 0) pl_h5_close(G->path, f);
    pl_h5_unlock();
out_unlocked:
    free(ei);
    free(np);
    free(ep);
    free(mean);
    free(sd);
    for (int s = 0; s < 3; s++)
        free(m[s]);
    return st;
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
             : G->graphs_mode ? create_graphs(G, cfg, ctx)
                              : create_node(G, cfg, ctx);
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
    int64_t nb = g_num_batches(G, split);
    if (start_batch < 0 || start_batch > nb)
        return pl_error_set(PL_ERR_INVALID,
                            "hdf5_graph: epoch_begin(%s, epoch %lld, start_batch %lld): start_batch "
                            "must lie in 0..%lld, split '%s' has %lld batches (%s)",
                            pl_split_name(split), (long long)epoch, (long long)start_batch,
                            (long long)nb, pl_split_name(split), (long long)nb, G->path);
    release_views(G);
    /* graphs mode: lay the train graphs out in this epoch's order (the whole split:
     * batch boundaries depend on every graph before them; nothing is read) */
    if (split == PL_SPLIT_TRAIN && G->graphs_mode && G->shuffle &&
        G->sp[PL_SPLIT_TRAIN].arranged_epoch != epoch) {
        G->sp[PL_SPLIT_TRAIN].arranged_epoch = -1;
        train_order(G, epoch);
        pl_status st = arrange(G, &G->sp[PL_SPLIT_TRAIN]);
        if (st) return st;
        G->sp[PL_SPLIT_TRAIN].arranged_epoch = epoch;
    }
    G->cur = split;
    G->cur_batch = start_batch;
    return PL_OK;
}

int emit(graph *G, pl_batch *out, const char *name, pl_tensor *v) {
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
    if (emit(G, out, "x", lk_view_rows(S->x, n0, nn)) ||
        emit(G, out, "edge_src", lk_view_rows(S->src, e0, ne)) ||
        emit(G, out, "edge_dst", lk_view_rows(S->dst, e0, ne)) ||
        emit(G, out, "batch", lk_view_rows(S->batch, n0, nn)) ||
        (S->y && emit(G, out, "y", lk_view_rows(S->y, g0, ng))) ||
        (S->gid && emit(G, out, "graph", lk_view_rows(S->gid, g0, ng)))) {
        release_views(G);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->size = ng;
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
 * y f32 [B, K] (targets [G] are served as [B, 1]). Both are fixed by the
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
