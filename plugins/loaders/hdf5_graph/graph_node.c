/* graph_node.c - hdf5_graph mode = node: one graph, transductive node
 * classification. Reads features [N, F], edge_index [2, E], labels [N] and
 * the three split masks once at create, applies optional self loops / row
 * normalization and moves everything to the device once: each split's ONE
 * batch is the cached tensors themselves.
 *
 * gr_create_node runs the steps in order over one `node_in` (the host
 * arrays read), each step a function below.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_graph.h"

/* What the steps of gr_create_node hand on to each other. */
typedef struct node_in {
    const char *xname, *lname;  /* features, labels datasets */
    float *x;                   /* [N, F] */
    int64_t *ei, E;             /* edge_index [2, E] */
    int64_t *y;                 /* labels [N] (-1: unlabeled) */
    uint8_t *m[PL_SPLIT_COUNT]; /* masks [N]; predict: that split's only */
    int64_t *src, *dst;         /* edges after self loops */
    bool loops;
} node_in;

static void node_in_free(node_in *in) {
    free(in->x);
    free(in->ei);
    free(in->y);
    free(in->src);
    free(in->dst);
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        free(in->m[s]);
}

/* Features (finite), labels (predict: may be absent), edges, masks; under
 * the HDF5 lock. */
static pl_status node_read(graph *G, hid_t f, const pl_config_section *cfg, node_in *in) {
    int64_t dx[2], de[2], dy[1], dm[1];
    pl_status st =
        read_ds(G, f, in->xname, H5T_NATIVE_FLOAT, 2, 2, NULL, (void **)&in->x, dx, NULL);
    if (st) return st;
    G->N = dx[0];
    G->F = dx[1];
    /* NaN / Inf in the features is refused (README "Missing values") */
    if ((st = pl_h5_check_finite(G->path, in->xname, PL_F32, in->x, 0, G->N, 2, dx, NULL, NULL, 0)))
        return st;
    int64_t wn[1] = {G->N}, we[2] = {2, -1};
    G->has_y = G->predict < 0 || pl_h5_exists(f, in->lname); /* predict: maybe no labels */
    if (G->has_y) {
        if ((st = read_ds(G, f, in->lname, H5T_NATIVE_INT64, 1, 1, wn, (void **)&in->y, dy, NULL)))
            return st;
    } else if (!(in->y = malloc(sizeof *in->y * (size_t)(G->N ? G->N : 1)))) {
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    } else {
        for (int64_t i = 0; i < G->N; i++)
            in->y[i] = -1;
    }
    if ((st = read_ds(G, f, pl_cfg_str(cfg, "edge_index", "edge_index"), H5T_NATIVE_INT64, 2, 2, we,
                      (void **)&in->ei, de, NULL)))
        return st;
    in->E = de[1];
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if (G->predict >= 0) { /* predict: that split's mask alone (or every node) */
            if (s == G->predict && (st = read_predict_mask(G, f, cfg, G->N, "node", &in->m[s])))
                return st;
            continue;
        }
        if ((st = read_ds(G, f, pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]),
                          H5T_NATIVE_UINT8, 1, 1, wn, (void **)&in->m[s], dm, NULL)))
            return st;
    }
    return PL_OK;
}

/* Predict: the run's graph_meta.json must agree with the file; its class
 * count wins. *C: the file's (attribute, -1 none), has_c whether it has one. */
static pl_status node_run_classes(graph *G, const node_in *in, int64_t *C, bool has_c) {
    char jp[2048];
    cJSON *j = NULL;
    int64_t run_f = -1, run_c = -1;
    pl_status st = run_json_read(G, "graph_meta.json", jp, sizeof jp, &j);
    if (!st && j) st = json_int(j, jp, "num_classes", 1, INT32_MAX, &run_c);
    if (!st && j) st = json_int(j, jp, "num_features", 0, INT64_MAX / 2, &run_f);
    cJSON_Delete(j);
    if (st) return st;
    if (run_f >= 0 && run_f != G->F)
        return pl_error_set(PL_ERR_SHAPE,
                            "%s: dataset '%s' has %lld features per node; the run "
                            "was trained on %lld (%s)",
                            G->path, in->xname, (long long)G->F, (long long)run_f, jp);
    if (run_c > 0 && has_c && *C != run_c)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: attribute num_classes = %lld; the run was "
                            "trained with %lld classes (%s)",
                            G->path, (long long)*C, (long long)run_c, jp);
    if (run_c > 0)
        *C = run_c;
    else if (*C < 0 && !G->has_y)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: neither the run (%s) nor the file (attribute "
                            "num_classes, labels '%s') gives the number of classes",
                            G->path, jp, in->lname);
    return PL_OK;
}

/* The class count: attribute num_classes if present, else max label + 1
 * (predict: the run's); every label in -1..C-1. Under the HDF5 lock. */
static pl_status node_classes(graph *G, hid_t f, const node_in *in) {
    int64_t C = -1;
    bool has_c;
    pl_status st = pl_h5_attr_read_int(G->path, f, "num_classes", &C, &has_c);
    if (st) return st;
    if (!has_c) C = -1;
    if (G->predict >= 0 && (st = node_run_classes(G, in, &C, has_c))) return st;
    int64_t ymax = -1;
    for (int64_t i = 0; i < G->N; i++) {
        /* classes are < 2^31 so that max label + 1 (the class count) cannot overflow */
        if (in->y[i] < -1 || in->y[i] > INT32_MAX - 1)
            return pl_error_set(PL_ERR_INVALID,
                                "%s: labels[%lld] = %lld; expected a class in 0..%d or -1", G->path,
                                (long long)i, (long long)in->y[i], INT32_MAX - 1);
        if (in->y[i] > ymax) ymax = in->y[i];
    }
    if (C < 0) C = ymax + 1;
    if (C < 1)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: num_classes = %lld (attribute, or max label + 1 with every "
                            "label -1); expected >= 1",
                            G->path, (long long)C);
    if (ymax >= C)
        return pl_error_set(PL_ERR_INVALID, "%s: label %lld >= num_classes %lld", G->path,
                            (long long)ymax, (long long)C);
    G->C = C;
    return PL_OK;
}

/* The file, read under the process-wide HDF5 lock. */
static pl_status node_read_file(graph *G, const pl_config_section *cfg, node_in *in) {
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    pl_status st = pl_h5_open_read(G->path, "run tools/prepare_data.sh", &f);
    if (!st) st = node_read(G, f, cfg, in);
    if (!st) st = node_classes(G, f, in);
    if (f >= 0) pl_h5_close(G->path, f);
    pl_h5_unlock();
    return st;
}

/* Edges: range check, optional self loops; row normalization. */
static pl_status node_edges(graph *G, const pl_config_section *cfg, node_in *in) {
    int r;
    int64_t E = in->E, e = bad_edge(in->ei, E, 0, E, G->N, &r);
    if (e >= 0)
        return pl_error_set(PL_ERR_INVALID,
                            "%s: edge_index[%d][%lld] = %lld is outside 0..%lld (num_nodes %lld)",
                            G->path, r, (long long)e, (long long)in->ei[r * E + e],
                            (long long)G->N - 1, (long long)G->N);
    in->loops = pl_cfg_bool(cfg, "add_self_loops", false);
    int64_t cap = E + (in->loops ? G->N : 0);
    in->src = malloc(sizeof *in->src * (size_t)(cap ? cap : 1));
    in->dst = malloc(sizeof *in->dst * (size_t)(cap ? cap : 1));
    if (!in->src || !in->dst) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    G->E = copy_edges(in->ei, E, 0, E, G->N, in->loops, in->src, in->dst, 0);
    if (pl_cfg_bool(cfg, "row_normalize", false)) normalize_rows(in->x, 0, G->N, G->F);
    return PL_OK;
}

/* Everything to the device, once; the masks' node counts. */
static pl_status node_upload(graph *G, const node_in *in) {
    pl_device dev = dev_of(G);
    G->x = lk_to_device(dev, PL_F32, 2, (int64_t[]){G->N, G->F}, in->x);
    G->y = lk_to_device(dev, PL_I64, 1, (int64_t[]){G->N}, in->y);
    G->src = lk_to_device(dev, PL_I64, 1, (int64_t[]){G->E}, in->src);
    G->dst = lk_to_device(dev, PL_I64, 1, (int64_t[]){G->E}, in->dst);
    bool masks_ok = true;
    for (int s = 0; s < PL_SPLIT_COUNT && G->x; s++) {
        if (!in->m[s]) continue; /* predict: another split's */
        G->mask[s] = lk_to_device(dev, PL_U8, 1, (int64_t[]){G->N}, in->m[s]);
        if (!G->mask[s]) {
            masks_ok = false;
            break;
        }
        for (int64_t i = 0; i < G->N; i++)
            G->count[s] += in->m[s][i] != 0;
    }
    if (!G->x || !G->y || !G->src || !G->dst || !masks_ok)
        return pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
    pl_tensor_set_name(G->x, "x");
    pl_tensor_set_name(G->y, "y");
    pl_tensor_set_name(G->src, "edge_src");
    pl_tensor_set_name(G->dst, "edge_dst");
    return PL_OK;
}

/* What was loaded, for the run's data line: nodes with no edge other than a
 * self loop (in the file's edges) and nodes without a label (-1). */
static void node_meta(graph *G, pl_meta *meta, const node_in *in) {
    int64_t isolated = 0, unlabeled = 0, E = in->E;
    unsigned char *touched = calloc((size_t)G->N + 1, 1);
    if (touched) {
        for (int64_t k = 0; k < E; k++)
            if (in->ei[k] != in->ei[E + k]) touched[in->ei[k]] = touched[in->ei[E + k]] = 1;
        for (int64_t i = 0; i < G->N; i++)
            isolated += !touched[i];
        free(touched);
    }
    for (int64_t i = 0; i < G->N; i++)
        unlabeled += in->y[i] < 0;
    pl_meta_set_int(meta, "num_nodes", G->N);
    pl_meta_set_int(meta, "num_features", G->F);
    pl_meta_set_int(meta, "num_classes", G->C);
    pl_meta_set_int(meta, "num_edges", G->E);
    pl_meta_set_int(meta, "num_isolated_nodes", isolated);
    pl_meta_set_int(meta, "num_unlabeled_nodes", unlabeled);
    pl_meta_set_int(meta, "num_train", G->count[0]);
    pl_meta_set_int(meta, "num_val", G->count[1]);
    pl_meta_set_int(meta, "num_test", G->count[2]);
    char line[512];
    snprintf(line, sizeof line,
             "%s: %lld nodes, %lld edges%s, %lld features, %lld classes; %lld isolated, "
             "%lld unlabeled nodes; train %lld, val %lld, test %lld nodes",
             G->path, (long long)G->N, (long long)G->E, in->loops ? " (self loops added)" : "",
             (long long)G->F, (long long)G->C, (long long)isolated, (long long)unlabeled,
             (long long)G->count[0], (long long)G->count[1], (long long)G->count[2]);
    pl_meta_set_str(meta, "data_summary", line);
}

/* What `pipeline predict` needs of this run (README "Predict"). */
static pl_status node_run_meta(const graph *G) {
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddStringToObject(j, "mode", "node");
        cJSON_AddNumberToObject(j, "num_features", (double)G->F);
        cJSON_AddNumberToObject(j, "num_classes", (double)G->C);
        cJSON_AddStringToObject(j, "source", G->path);
    }
    return run_json_write(G, "graph_meta.json", j);
}

pl_status gr_create_node(graph *G, const pl_config_section *cfg, pl_run_context *ctx) {
    node_in in = {0};
    in.xname = pl_cfg_str(cfg, "features", "features");
    in.lname = pl_cfg_str(cfg, "labels", "labels");
    pl_status st = node_read_file(G, cfg, &in);
    if (!st) st = node_edges(G, cfg, &in);
    if (!st) st = node_upload(G, &in);
    if (!st && ctx && ctx->meta) node_meta(G, ctx->meta, &in);
    if (!st && G->predict < 0) st = node_run_meta(G);
    if (!st) G->st.chunks_loaded = 1;
    node_in_free(&in);
    return st;
}
