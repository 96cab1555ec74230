/* hdf5_graph.c - whole-graph loader (transductive node classification).
 *
 * Reads features [N, F], edge_index [2, E], labels [N] and the three split
 * masks once at create, applies optional self loops / row normalization,
 * moves everything to the device once and serves every epoch from that
 * cache: each split yields ONE batch {x, edge_src, edge_dst, y, mask} whose
 * tensors are the cached ones (no per-epoch rebuild, no copy).
 */
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/pipeline.h"

static pthread_mutex_t g_h5_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct graph {
    pl_run_context *ctx;
    char path[1024];
    pl_tensor *x, *src, *dst, *y, *mask[PL_SPLIT_COUNT];
    int64_t N, F, E, C, count[PL_SPLIT_COUNT];
    int cur;
    bool done;
    pl_loader_stats st;
} graph;

static const pl_option_spec opts[] = {
    {"path", PL_OPT_STRING, NULL, PL_NO_BOUNDS, NULL, "HDF5 file (layout of tools/planetoid_to_h5.py)"},
    {"features", PL_OPT_STRING, "features", PL_NO_BOUNDS, NULL, "node features [N, F] (any float/int type, read as f32)"},
    {"edge_index", PL_OPT_STRING, "edge_index", PL_NO_BOUNDS, NULL, "edges [2, E] (source row 0, target row 1)"},
    {"labels", PL_OPT_STRING, "labels", PL_NO_BOUNDS, NULL, "node classes [N] (-1: unlabeled)"},
    {"train_mask", PL_OPT_STRING, "train_mask", PL_NO_BOUNDS, NULL, "u8 [N] mask of the train split"},
    {"val_mask", PL_OPT_STRING, "val_mask", PL_NO_BOUNDS, NULL, "u8 [N] mask of the val split"},
    {"test_mask", PL_OPT_STRING, "test_mask", PL_NO_BOUNDS, NULL, "u8 [N] mask of the test split"},
    {"add_self_loops", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "remove existing self loops, then add (i, i) for every node (PyG remove_self_loops + add_self_loops)"},
    {"row_normalize", PL_OPT_BOOL, "false", PL_NO_BOUNDS, NULL,
     "x = (x - min(x)) / clamp(row sum, min 1) (PyG NormalizeFeatures)"},
    PL_OPTIONS_END};

/* Own a tensor even inside a caller's pl_frame. */
static pl_tensor *own_empty(pl_dtype dt, int nd, const int64_t *shape, pl_device dev) {
    pl_frame_begin();
    pl_tensor *t = pl_tensor_empty(dt, nd, shape, dev);
    if (t) pl_frame_keep(t);
    pl_frame_end();
    return t;
}

static pl_status read_ds(graph *G, hid_t f, const char *name, hid_t memtype, int want_rank,
                         const int64_t *want, void **out, int64_t *dims) {
    hid_t ds = -1;
    H5E_BEGIN_TRY {
        if (H5Lexists(f, name, H5P_DEFAULT) > 0) ds = H5Dopen2(f, name, H5P_DEFAULT);
    }
    H5E_END_TRY;
    if (ds < 0) return pl_error_set(PL_ERR_IO, "%s: dataset '%s' not found", G->path, name);
    pl_status st = PL_OK;
    hid_t dcpl = H5Dget_create_plist(ds);
    int nfl = H5Pget_nfilters(dcpl);
    for (int i = 0; i < nfl && !st; i++) {
        unsigned flags, cd[8];
        size_t ncd = 8;
        char nm[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof nm, nm, NULL);
        if (id >= 0 && H5Zfilter_avail(id) <= 0)
            st = pl_error_set(PL_ERR_IO, "%s: dataset '%s' uses HDF5 filter %d (%s) which this HDF5 library cannot decode",
                              G->path, name, (int)id, nm[0] ? nm : "unknown");
    }
    H5Pclose(dcpl);
    hid_t sp = H5Dget_space(ds);
    hsize_t d[H5S_MAX_RANK];
    int nd = H5Sget_simple_extent_dims(sp, d, NULL);
    H5Sclose(sp);
    if (!st && nd != want_rank)
        st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has rank %d; expected %d", G->path, name, nd, want_rank);
    size_t n = 1;
    for (int i = 0; i < nd && !st; i++) {
        dims[i] = (int64_t)d[i];
        if (want && want[i] >= 0 && want[i] != dims[i])
            st = pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has %lld entries on axis %d; expected %lld", G->path,
                              name, (long long)dims[i], i, (long long)want[i]);
        n *= (size_t)d[i];
    }
    if (!st) {
        *out = malloc((n ? n : 1) * H5Tget_size(memtype));
        if (!*out) st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory for '%s'", G->path, name);
        else if (H5Dread(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
            st = pl_error_set(PL_ERR_IO, "%s: reading '%s' failed", G->path, name);
        else
            G->st.bytes_read += n * H5Tget_size(memtype);
    }
    H5Dclose(ds);
    return st;
}

static pl_tensor *to_device(graph *G, pl_dtype dt, int nd, const int64_t *shape, const void *host) {
    pl_tensor *t = own_empty(dt, nd, shape, G->ctx ? G->ctx->device : PL_CPU);
    if (!t) return NULL;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    size_t bytes = pl_dtype_nbytes(dt, n);
    if (bytes == 0) return t;
    const pl_backend *be = pl_backend_get(t->device.type);
    if (!be || be->memcpy(pl_tensor_data(t), t->device, host, PL_CPU, bytes)) {
        pl_tensor_release(t);
        return NULL;
    }
    return t;
}

static void g_destroy(void *self) {
    graph *G = self;
    if (!G) return;
    pl_tensor_release(G->x);
    pl_tensor_release(G->src);
    pl_tensor_release(G->dst);
    pl_tensor_release(G->y);
    for (int i = 0; i < PL_SPLIT_COUNT; i++) pl_tensor_release(G->mask[i]);
    free(G);
}

static pl_status g_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    graph *G = calloc(1, sizeof *G);
    if (!G) return pl_error_set(PL_ERR_NOMEM, "hdf5_graph: out of memory");
    G->ctx = ctx;
    G->cur = -1;
    snprintf(G->path, sizeof G->path, "%s", pl_cfg_str(cfg, "path", ""));
    pl_status st = PL_OK;
    float *x = NULL;
    int64_t *ei = NULL, *y = NULL, *src = NULL, *dst = NULL;
    uint8_t *m[3] = {NULL, NULL, NULL};
    hid_t f = -1;
    FILE *probe = fopen(G->path, "rb");
    if (!probe) {
        st = pl_error_set(PL_ERR_IO, "%s: cannot open (missing file?); run tools/prepare_data.sh", G->path);
        g_destroy(G);
        return st;
    }
    fclose(probe);
    pthread_mutex_lock(&g_h5_lock);
    htri_t is5;
    H5E_BEGIN_TRY { is5 = H5Fis_hdf5(G->path); }
    H5E_END_TRY;
    if (is5 <= 0) {
        st = pl_error_set(PL_ERR_IO, "%s: not an HDF5 file", G->path);
        goto out;
    }
    H5E_BEGIN_TRY { f = H5Fopen(G->path, H5F_ACC_RDONLY, H5P_DEFAULT); }
    H5E_END_TRY;
    if (f < 0) {
        st = pl_error_set(PL_ERR_IO, "%s: HDF5 cannot open the file", G->path);
        goto out;
    }
    int64_t dx[2], de[2], dy[1], dm[1];
    if ((st = read_ds(G, f, pl_cfg_str(cfg, "features", "features"), H5T_NATIVE_FLOAT, 2, NULL, (void **)&x, dx)))
        goto out;
    G->N = dx[0];
    G->F = dx[1];
    int64_t wn[1] = {G->N}, we[2] = {2, -1};
    if ((st = read_ds(G, f, pl_cfg_str(cfg, "labels", "labels"), H5T_NATIVE_INT64, 1, wn, (void **)&y, dy)) ||
        (st = read_ds(G, f, pl_cfg_str(cfg, "edge_index", "edge_index"), H5T_NATIVE_INT64, 2, we, (void **)&ei, de)))
        goto out;
    const char *mk[3] = {"train_mask", "val_mask", "test_mask"};
    for (int s = 0; s < 3; s++)
        if ((st = read_ds(G, f, pl_cfg_str(cfg, mk[s], mk[s]), H5T_NATIVE_UINT8, 1, wn, (void **)&m[s], dm))) goto out;
    /* attribute num_classes if present, else max label + 1 */
    int64_t C = -1;
    H5E_BEGIN_TRY {
        if (H5Aexists(f, "num_classes") > 0) {
            hid_t a = H5Aopen(f, "num_classes", H5P_DEFAULT);
            if (H5Aread(a, H5T_NATIVE_INT64, &C) < 0) C = -1;
            H5Aclose(a);
        }
    }
    H5E_END_TRY;
    int64_t ymax = -1;
    for (int64_t i = 0; i < G->N; i++) {
        if (y[i] < -1) {
            st = pl_error_set(PL_ERR_INVALID, "%s: labels[%lld] = %lld; expected a class >= 0 or -1", G->path,
                              (long long)i, (long long)y[i]);
            goto out;
        }
        if (y[i] > ymax) ymax = y[i];
    }
    if (C < 0) C = ymax + 1;
    if (ymax >= C) {
        st = pl_error_set(PL_ERR_INVALID, "%s: label %lld >= num_classes %lld", G->path, (long long)ymax, (long long)C);
        goto out;
    }
    G->C = C;
    /* edges: range check, optional self loops */
    int64_t E = de[1];
    for (int64_t e = 0; e < E; e++) {
        for (int r = 0; r < 2; r++) {
            int64_t v = ei[r * E + e];
            if (v < 0 || v >= G->N) {
                st = pl_error_set(PL_ERR_INVALID, "%s: edge_index[%d][%lld] = %lld is outside 0..%lld (num_nodes %lld)",
                                  G->path, r, (long long)e, (long long)v, (long long)G->N - 1, (long long)G->N);
                goto out;
            }
        }
    }
    bool loops = pl_cfg_bool(cfg, "add_self_loops", false);
    int64_t cap = E + (loops ? G->N : 0);
    src = malloc(sizeof *src * (size_t)(cap ? cap : 1));
    dst = malloc(sizeof *dst * (size_t)(cap ? cap : 1));
    if (!src || !dst) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
        goto out;
    }
    int64_t k = 0;
    for (int64_t e = 0; e < E; e++) {
        if (loops && ei[e] == ei[E + e]) continue;
        src[k] = ei[e];
        dst[k++] = ei[E + e];
    }
    if (loops)
        for (int64_t i = 0; i < G->N; i++) src[k] = dst[k] = i, k++;
    G->E = k;
    if (pl_cfg_bool(cfg, "row_normalize", false) && G->N * G->F > 0) {
        float mn = x[0];
        for (int64_t i = 0; i < G->N * G->F; i++) mn = x[i] < mn ? x[i] : mn;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < G->N; i++) {
            float *r = x + i * G->F;
            double s = 0;
            for (int64_t j = 0; j < G->F; j++) s += (double)(r[j] - mn);
            float d = (float)(s < 1.0 ? 1.0 : s);
            for (int64_t j = 0; j < G->F; j++) r[j] = (r[j] - mn) / d;
        }
    }
    G->x = to_device(G, PL_F32, 2, (int64_t[]){G->N, G->F}, x);
    G->y = to_device(G, PL_I64, 1, (int64_t[]){G->N}, y);
    G->src = to_device(G, PL_I64, 1, (int64_t[]){G->E}, src);
    G->dst = to_device(G, PL_I64, 1, (int64_t[]){G->E}, dst);
    for (int s = 0; s < 3 && G->x; s++) {
        G->mask[s] = to_device(G, PL_U8, 1, (int64_t[]){G->N}, m[s]);
        if (!G->mask[s]) break;
        for (int64_t i = 0; i < G->N; i++) G->count[s] += m[s][i] != 0;
    }
    if (!G->x || !G->y || !G->src || !G->dst || !G->mask[0] || !G->mask[1] || !G->mask[2]) {
        st = pl_error_status() ? pl_error_status() : PL_ERR_NOMEM;
        goto out;
    }
    pl_tensor_set_name(G->x, "x");
    pl_tensor_set_name(G->y, "y");
    pl_tensor_set_name(G->src, "edge_src");
    pl_tensor_set_name(G->dst, "edge_dst");
    if (ctx && ctx->meta) {
        pl_meta_set_int(ctx->meta, "num_nodes", G->N);
        pl_meta_set_int(ctx->meta, "num_features", G->F);
        pl_meta_set_int(ctx->meta, "num_classes", G->C);
        pl_meta_set_int(ctx->meta, "num_edges", G->E);
        pl_meta_set_int(ctx->meta, "num_train", G->count[0]);
        pl_meta_set_int(ctx->meta, "num_val", G->count[1]);
        pl_meta_set_int(ctx->meta, "num_test", G->count[2]);
    }
    G->st.chunks_loaded = 1;
out:
    if (f >= 0) H5Fclose(f);
    pthread_mutex_unlock(&g_h5_lock);
    free(x);
    free(ei);
    free(y);
    free(src);
    free(dst);
    for (int s = 0; s < 3; s++) free(m[s]);
    if (st) {
        g_destroy(G);
        return st;
    }
    *self = G;
    return PL_OK;
}

static pl_status g_epoch_begin(void *self, pl_data_split split, int64_t epoch) {
    (void)epoch;
    graph *G = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT)
        return pl_error_set(PL_ERR_INVALID, "hdf5_graph: bad split %d", (int)split);
    if (G->count[split] == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty (its mask has no node)", G->path,
                            pl_split_name(split));
    G->cur = split;
    G->done = false;
    return PL_OK;
}

static int g_next(void *self, pl_batch *out) {
    graph *G = self;
    memset(out, 0, sizeof *out);
    if (G->cur < 0) {
        pl_error_set(PL_ERR_INVALID, "hdf5_graph: next() before epoch_begin()");
        return -1;
    }
    if (G->done) return 0;
    G->done = true;
    const char *names[5] = {"x", "edge_src", "edge_dst", "y", "mask"};
    pl_tensor *f[5] = {G->x, G->src, G->dst, G->y, G->mask[G->cur]};
    for (int i = 0; i < 5; i++) {
        out->names[i] = names[i];
        out->fields[i] = f[i]; /* borrowed: the cached tensors themselves */
    }
    out->n = 5;
    out->size = G->N;
    out->index = 0;
    return 1;
}

static int64_t g_num_batches(void *self, pl_data_split split) {
    graph *G = self;
    if ((int)split < 0 || split >= PL_SPLIT_COUNT) return 0;
    return G->count[split] > 0 ? 1 : 0;
}

static pl_loader_stats g_stats(void *self) { return ((graph *)self)->st; }

static const pl_loader_vtable vt = {
    .create = g_create,
    .destroy = g_destroy,
    .epoch_begin = g_epoch_begin,
    .next = g_next,
    .num_batches = g_num_batches,
    .stats = g_stats,
    .state = NULL,
};

PL_PLUGIN_DEFINE(hdf5_graph, PL_KIND_LOADER, "0.1.0",
                 "whole-graph HDF5 loader (features, edges, labels, split masks), built once", opts, &vt)
