/* graph_batches.c - hdf5_graph mode = graphs: many small graphs (molecules),
 * graph-level regression. The file holds the graphs concatenated (x
 * [N_total, F], edge_index [2, E_total] with graph-local node ids) plus CSR
 * offsets node_ptr / edge_ptr [G+1], targets y [G, K] and per-graph split
 * masks. Everything is read, validated, self-looped / normalized /
 * standardized once at create. Each split owns staging tensors on the
 * device sized for the whole split (mega-batch); an epoch lays the split's
 * graphs out in epoch order into them (train: shuffled per epoch; val/test:
 * once at create) with batch-local edge ids and the `batch` vector
 * precomputed for the fixed batch boundaries, and next() returns views of
 * the staging tensors: no copy and no allocation per batch.
 *
 * gr_create_graphs runs the steps in order over one `graphs_in`, each step a
 * function below.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_graph.h"

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

/* Padding (jraph pad_with_graphs): batch b's real node and edge totals
 * against the budgets; a batch over them is PL_ERR_CONFIG naming it. */
static pl_status check_pad_budget(const graph *G, const gsplit *S, int64_t b, int64_t nodes,
                                  int64_t edges, int64_t epoch) {
    if (nodes < G->pad_nodes && edges <= G->pad_edges) return PL_OK;
    char ep[64] = "";
    if (epoch >= 0) snprintf(ep, sizeof ep, " in the order of epoch %lld", (long long)epoch);
    pl_hint_set("raise pad_nodes / pad_edges, or set them to 0: the loader then derives the "
                "largest batch any order can make (the batch_size largest graphs of a split)");
    return pl_error_set(PL_ERR_CONFIG,
                        "%s: batch %lld of split '%s'%s has %lld nodes and %lld edges; the padding "
                        "budget is pad_nodes = %lld (at most %lld real nodes: one padding node at "
                        "least) and pad_edges = %lld",
                        G->path, (long long)b, pl_split_name((pl_data_split)(S - G->sp)), ep,
                        (long long)nodes, (long long)edges, (long long)G->pad_nodes,
                        (long long)G->pad_nodes - 1, (long long)G->pad_edges);
}

/* Lay the split's graphs out in S->order into the staging tensors: x rows,
 * batch-local edge ids, the batch vector, y rows and the batch boundaries
 * (batch b = order positions [b*B, (b+1)*B)). Host-side gather straight into
 * the tensors (CPU) or into the scratch buffers, then one copy per tensor.
 * Padding: batch b owns rows [b*PN, (b+1)*PN) of x / batch, [b*PE, ...) of
 * the edges and [b*PG, ...) of y / graph_mask; after its r real graphs come
 * the padding graph (graph id r: every padding node, zero features, every
 * padding edge as a loop on its first node) and the empty graphs r+1..PG-1,
 * whose targets are 0 and graph_mask 0 (jraph pad_with_graphs). */
pl_status gr_arrange(graph *G, gsplit *S, int64_t epoch) {
    const int64_t F = G->F, K = G->K, B = G->B;
    const bool pad = G->pad;
    const int64_t PN = G->pad_nodes, PE = G->pad_edges, PG = G->pad_graphs;
    bool cpu = pl_device_eq(dev_of(G), PL_CPU);
    float *px = cpu ? pl_tensor_data(S->x) : G->sx;
    float *py = !S->y ? NULL : cpu ? pl_tensor_data(S->y) : G->sy; /* NULL: no targets */
    float *pm = !pad ? NULL : cpu ? pl_tensor_data(S->gmask) : G->sgmask;
    int64_t *psrc = cpu ? pl_tensor_data(S->src) : G->ssrc,
            *pdst = cpu ? pl_tensor_data(S->dst) : G->sdst;
    int64_t *pbatch = cpu ? pl_tensor_data(S->batch) : G->sbatch;
    /* batch boundaries (staging rows), sequential: O(ng); padded: fixed, and
     * each batch's real totals checked against the budget first */
    int64_t no = 0, eo = 0;
    for (int64_t i = 0; i < S->ng; i++) {
        if (i % B == 0) {
            if (pad && i > 0) {
                pl_status st = check_pad_budget(G, S, i / B - 1, no, eo, epoch);
                if (st) return st;
                no = eo = 0;
            }
            S->bnode[i / B] = pad ? (i / B) * PN : no;
            S->bedge[i / B] = pad ? (i / B) * PE : eo;
        }
        int64_t g = S->order[i];
        no += G->nptr[g + 1] - G->nptr[g];
        eo += G->eptr[g + 1] - G->eptr[g];
    }
    if (pad) {
        pl_status st = check_pad_budget(G, S, S->nb_all - 1, no, eo, epoch);
        if (st) return st;
    }
    S->bnode[S->nb_all] = pad ? S->nb_all * PN : no;
    S->bedge[S->nb_all] = pad ? S->nb_all * PE : eo;
    /* per-graph copy; a graph's staging offsets follow from its batch's start
     * plus the graphs before it in that batch, so batches go in parallel */
#pragma omp parallel for schedule(dynamic, 4) if (S->nodes > 65536)
    for (int64_t b = 0; b < S->nb_all; b++) {
        int64_t n0 = S->bnode[b], e0 = S->bedge[b];
        int64_t nn = n0, ee = e0;
        int64_t i1 = (b + 1) * B < S->ng ? (b + 1) * B : S->ng;
        int64_t y0 = pad ? b * PG - b * B : 0; /* y row of order position i: y0 + i */
        for (int64_t i = b * B; i < i1; i++) {
            int64_t g = S->order[i], gn = G->nptr[g + 1] - G->nptr[g];
            memcpy(px + nn * F, G->hx + G->nptr[g] * F, sizeof *px * (size_t)(gn * F));
            if (py) memcpy(py + (y0 + i) * K, G->hy + g * K, sizeof *py * (size_t)K);
            if (pm) pm[y0 + i] = 1.0f;
            int64_t off = nn - n0; /* node offset of graph g within its batch */
            for (int64_t e = G->eptr[g]; e < G->eptr[g + 1]; e++, ee++) {
                psrc[ee] = G->hsrc[e] + off;
                pdst[ee] = G->hdst[e] + off;
            }
            for (int64_t v = 0; v < gn; v++)
                pbatch[nn + v] = i - b * B;
            nn += gn;
        }
        if (!pad) continue;
        int64_t r = i1 - b * B, first = nn - n0; /* real graphs; the first padding node */
        memset(px + nn * F, 0, sizeof *px * (size_t)((n0 + PN - nn) * F));
        for (int64_t v = nn; v < n0 + PN; v++)
            pbatch[v] = r; /* the padding graph */
        for (; ee < e0 + PE; ee++)
            psrc[ee] = pdst[ee] = first;
        for (int64_t j = r; j < PG; j++) {
            if (py) memset(py + (b * PG + j) * K, 0, sizeof *py * (size_t)K);
            pm[b * PG + j] = 0.0f;
        }
    }
    if (cpu) return PL_OK;
    const pl_backend *be = pl_backend_get(dev_of(G).type);
    if (!be) return pl_error_status();
    struct {
        pl_tensor *t;
        const void *h;
        size_t bytes;
    } cp[6] = {{S->x, px, sizeof(float) * (size_t)(S->xrows * F)},
               {S->y, py, sizeof(float) * (size_t)(S->yrows * K)},
               {S->src, psrc, sizeof(int64_t) * (size_t)S->erows},
               {S->dst, pdst, sizeof(int64_t) * (size_t)S->erows},
               {S->batch, pbatch, sizeof(int64_t) * (size_t)S->xrows},
               {S->gmask, pm, sizeof(float) * (size_t)S->yrows}};
    for (int i = 0; i < 6; i++) {
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
void gr_train_order(graph *G, int64_t epoch) {
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
 * hdf5_series' plus num_features, so `pipeline predict` serves
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

/* What the steps of gr_create_graphs hand on to each other. */
typedef struct graphs_in {
    const char *xname, *einame, *npname, *epname, *yname; /* datasets */
    bool loops, norm, standardize;
    int64_t *ei, *np, *ep;      /* edge_index, node_ptr, edge_ptr as read */
    uint8_t *m[PL_SPLIT_COUNT]; /* masks [G]; predict: that split's only */
    int64_t dx[2], dy[2], E;
    int yrank;
    double *mean, *sd; /* target statistics (train graphs; predict: the run's) */
} graphs_in;

static void graphs_in_free(graphs_in *in) {
    free(in->ei);
    free(in->np);
    free(in->ep);
    free(in->mean);
    free(in->sd);
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        free(in->m[s]);
}

/* The split masks (predict: that split's alone, or every graph). */
static pl_status graphs_read_masks(graph *G, hid_t f, const pl_config_section *cfg, graphs_in *in) {
    int64_t dm[1];
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        pl_status st;
        if (G->predict >= 0) {
            if (s == G->predict && (st = read_predict_mask(G, f, cfg, G->NG, "graph", &in->m[s])))
                return st;
            continue;
        }
        const char *mk = pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]);
        if ((st = read_ds(G, f, mk, H5T_NATIVE_UINT8, 1, 1, (int64_t[]){G->NG}, (void **)&in->m[s],
                          dm, NULL)))
            return pl_error_prefix(st, "graph masks: one entry per graph (G = %lld from '%s')",
                                   (long long)G->NG, in->npname);
    }
    return PL_OK;
}

/* x, edge_index, the CSR offsets, the targets, the masks; under the lock. */
static pl_status graphs_read(graph *G, hid_t f, const pl_config_section *cfg, graphs_in *in) {
    int64_t de[2], dnp[1], dep[1];
    pl_status st;
    if ((st = read_ds(G, f, in->xname, H5T_NATIVE_FLOAT, 2, 2, NULL, (void **)&G->hx, in->dx,
                      NULL)) ||
        (st = read_ds(G, f, in->einame, H5T_NATIVE_INT64, 2, 2, (int64_t[]){2, -1},
                      (void **)&in->ei, de, NULL)) ||
        (st = read_ds(G, f, in->npname, H5T_NATIVE_INT64, 1, 1, NULL, (void **)&in->np, dnp, NULL)))
        return st;
    G->N = in->dx[0];
    G->F = in->dx[1];
    in->E = de[1];
    if (dnp[0] < 2)
        return pl_error_set(PL_ERR_SHAPE,
                            "%s: dataset '%s' has %lld entries; expected G+1 >= 2 (CSR offsets "
                            "of G >= 1 graphs)",
                            G->path, in->npname, (long long)dnp[0]);
    G->NG = dnp[0] - 1;
    if ((st = read_ds(G, f, in->epname, H5T_NATIVE_INT64, 1, 1, (int64_t[]){G->NG + 1},
                      (void **)&in->ep, dep, NULL)))
        return pl_error_prefix(st, "'%s' and '%s' must both have G+1 entries", in->npname,
                               in->epname);
    G->has_y = G->predict < 0 || pl_h5_exists(f, in->yname); /* predict: maybe no targets */
    if (G->has_y && (st = read_ds(G, f, in->yname, H5T_NATIVE_FLOAT, 1, 2, (int64_t[]){G->NG, -1},
                                  (void **)&G->hy, in->dy, &in->yrank)))
        return pl_error_prefix(st, "targets: one row per graph (G = %lld from '%s')",
                               (long long)G->NG, in->npname);
    G->K = !G->has_y ? 0 : in->yrank == 2 ? in->dy[1] : 1;
    return graphs_read_masks(G, f, cfg, in);
}

/* The file, read under the process-wide HDF5 lock. */
static pl_status graphs_read_file(graph *G, const pl_config_section *cfg, graphs_in *in) {
    hid_t f = H5I_INVALID_HID;
    pl_h5_lock();
    pl_status st = pl_h5_open_read(G->path, "run tools/prepare_data.sh", &f);
    if (!st) st = graphs_read(G, f, cfg, in);
    if (f >= 0) {
        pl_status cs = pl_h5_close(G->path, f);
        if (!st) st = cs;
    }
    pl_h5_unlock();
    return st;
}

/* CSR offsets, targets present, finite values, edges within their graph;
 * predict: the run's target statistics. */
static pl_status graphs_check(graph *G, graphs_in *in) {
    pl_status st;
    if ((st = check_ptr(G, in->npname, in->np, G->NG + 1, G->N, in->xname, "rows")) ||
        (st = check_ptr(G, in->epname, in->ep, G->NG + 1, in->E, in->einame, "columns")))
        return st;
    if (G->has_y && G->K < 1)
        return pl_error_set(PL_ERR_SHAPE, "%s: dataset '%s' has 0 targets per graph", G->path,
                            in->yname);
    /* predict: the number of targets and their scale are the run's */
    if (G->predict >= 0 && (st = read_run_standardization(G, in->yname, &in->mean, &in->sd)))
        return st;
    /* NaN / Inf in node features or targets is refused (README "Missing values") */
    if ((st = pl_h5_check_finite(G->path, in->xname, PL_F32, G->hx, 0, G->N, 2, in->dx, NULL, NULL,
                                 0)) ||
        (G->has_y && (st = pl_h5_check_finite(G->path, in->yname, PL_F32, G->hy, 0, G->NG,
                                              in->yrank, in->dy, NULL, NULL, 0))))
        return st;
    const int64_t E = in->E, *np = in->np, *ep = in->ep;
    for (int64_t g = 0; g < G->NG; g++) {
        int64_t n = np[g + 1] - np[g];
        int r;
        int64_t e = bad_edge(in->ei, E, ep[g], ep[g + 1], n, &r);
        if (e >= 0)
            return pl_error_set(PL_ERR_INVALID,
                                "%s: graph %lld: edge %lld of the graph (%s[%d][%lld]) = %lld is "
                                "outside its local node ids 0..%lld (the graph has %lld nodes)",
                                G->path, (long long)g, (long long)(e - ep[g]), in->einame, r,
                                (long long)e, (long long)in->ei[r * E + e], (long long)n - 1,
                                (long long)n);
    }
    return PL_OK;
}

/* Per-graph self loops (drop (i, i), then append (i, i) for every node) and
 * per-graph row normalization. */
static pl_status graphs_edges(graph *G, graphs_in *in) {
    int64_t cap = in->E + (in->loops ? G->N : 0);
    G->hsrc = malloc(sizeof *G->hsrc * (size_t)(cap ? cap : 1));
    G->hdst = malloc(sizeof *G->hdst * (size_t)(cap ? cap : 1));
    G->nptr = in->np;
    in->np = NULL;
    G->eptr = malloc(sizeof *G->eptr * (size_t)(G->NG + 1));
    if (!G->hsrc || !G->hdst || !G->eptr)
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    G->eptr[0] = 0;
    for (int64_t g = 0; g < G->NG; g++)
        G->eptr[g + 1] =
            copy_edges(in->ei, in->E, in->ep[g], in->ep[g + 1], G->nptr[g + 1] - G->nptr[g],
                       in->loops, G->hsrc, G->hdst, G->eptr[g]);
    G->E = G->eptr[G->NG];
    if (in->norm) {
#pragma omp parallel for schedule(dynamic, 64) if (G->N > 65536)
        for (int64_t g = 0; g < G->NG; g++)
            normalize_rows(G->hx, G->nptr[g], G->nptr[g + 1], G->F);
    }
    return PL_OK;
}

/* Split s's graphs from its mask: counts, batches, ids in file order. */
static pl_status graphs_split(graph *G, const pl_config_section *cfg, const uint8_t *m, int s) {
    gsplit *S = &G->sp[s];
    for (int64_t g = 0; g < G->NG; g++)
        S->ng += m[g] != 0;
    if (S->ng == 0)
        return pl_error_set(PL_ERR_CONFIG, "%s: split '%s' is empty: mask '%s' selects no graph",
                            G->path, pl_split_name((pl_data_split)s),
                            pl_cfg_str(cfg, split_mask_key[s], split_mask_key[s]));
    bool drop = s == PL_SPLIT_TRAIN && G->drop_last && G->predict < 0;
    if (drop && S->ng < G->B)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: train split has %lld graphs < batch_size %lld with drop_last = "
                            "true: no batch",
                            G->path, (long long)S->ng, (long long)G->B);
    S->nb_all = lk_batches(S->ng, G->B, false);
    S->nb = lk_batches(S->ng, G->B, drop);
    S->ids = malloc(sizeof *S->ids * (size_t)S->ng);
    S->order = malloc(sizeof *S->order * (size_t)S->ng);
    S->bnode = malloc(sizeof *S->bnode * (size_t)(S->nb_all + 1));
    S->bedge = malloc(sizeof *S->bedge * (size_t)(S->nb_all + 1));
    if (!S->ids || !S->order || !S->bnode || !S->bedge)
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    int64_t j = 0;
    for (int64_t g = 0; g < G->NG; g++)
        if (m[g]) {
            S->ids[j++] = g;
            S->nodes += G->nptr[g + 1] - G->nptr[g];
            S->edges += G->eptr[g + 1] - G->eptr[g];
        }
    memcpy(S->order, S->ids, sizeof *S->order * (size_t)S->ng);
    return PL_OK;
}

/* Target standardization: mean and unbiased (n - 1) std over the train
 * graphs (predict: the run's, read by graphs_check), applied to every graph. */
static pl_status graphs_standardize(graph *G, graphs_in *in) {
    const int ps = G->predict;
    if (ps < 0) {
        in->mean = calloc((size_t)G->K + 1, sizeof *in->mean);
        in->sd = calloc((size_t)G->K + 1, sizeof *in->sd);
    }
    if (!in->mean || !in->sd) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    double *mean = in->mean, *sd = in->sd;
    const gsplit *T = &G->sp[PL_SPLIT_TRAIN];
    for (int64_t kk = 0; kk < G->K && ps < 0; kk++) {
        if (!in->standardize) {
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
    if ((in->standardize || ps >= 0) && G->has_y)
        for (int64_t g = 0; g < G->NG; g++)
            for (int64_t kk = 0; kk < G->K; kk++)
                G->hy[g * G->K + kk] = (float)((G->hy[g * G->K + kk] - mean[kk]) / sd[kk]);
    return PL_OK;
}

static int cmp_desc_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The sum of the k largest of v[0..n) (v is sorted in place). */
static int64_t sum_largest(int64_t *v, int64_t n, int64_t k) {
    qsort(v, (size_t)n, sizeof *v, cmp_desc_i64);
    int64_t t = 0;
    for (int64_t i = 0; i < n && i < k; i++)
        t += v[i];
    return t;
}

/* Padding budgets (README "Static shapes"): pad_graphs 0 -> batch_size + 1;
 * pad_nodes / pad_edges 0 -> the largest batch any order of a served split
 * can make (the sum of its batch_size largest graphs' nodes, + 1 padding
 * node; edges likewise, no padding edge needed), so no batch can overflow.
 * A budget set below what one batch needs fails that batch (gr_arrange). */
static pl_status graphs_pad_budgets(graph *G, const pl_config_section *cfg) {
    G->pad_graphs = pl_cfg_int(cfg, "pad_graphs", 0);
    G->pad_nodes = pl_cfg_int(cfg, "pad_nodes", 0);
    G->pad_edges = pl_cfg_int(cfg, "pad_edges", 0);
    if (G->pad_graphs == 0) G->pad_graphs = G->B + 1;
    if (G->pad_graphs < G->B + 1)
        return pl_error_set(PL_ERR_CONFIG,
                            "%s: pad_graphs = %lld; expected >= batch_size + 1 = %lld (the batch's "
                            "graphs and one padding graph, jraph pad_with_graphs' n_graph)",
                            G->path, (long long)G->pad_graphs, (long long)G->B + 1);
    G->pad_derived = G->pad_nodes == 0 && G->pad_edges == 0;
    if (G->pad_nodes > 0 && G->pad_edges > 0) return PL_OK;
    int64_t *v = malloc(sizeof *v * (size_t)(G->NG + 1));
    if (!v) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    int64_t mn = 0, me = 0;
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        const gsplit *S = &G->sp[s];
        if (!S->ids) continue; /* not served */
        for (int64_t i = 0; i < S->ng; i++)
            v[i] = G->nptr[S->ids[i] + 1] - G->nptr[S->ids[i]];
        int64_t n = sum_largest(v, S->ng, G->B);
        for (int64_t i = 0; i < S->ng; i++)
            v[i] = G->eptr[S->ids[i] + 1] - G->eptr[S->ids[i]];
        int64_t e = sum_largest(v, S->ng, G->B);
        mn = n > mn ? n : mn;
        me = e > me ? e : me;
    }
    free(v);
    if (G->pad_nodes == 0) G->pad_nodes = mn + 1;
    if (G->pad_edges == 0) G->pad_edges = me;
    return PL_OK;
}

/* Staging tensors (device) of the splits served, host scratch for a
 * non-CPU device; val/test (and an unshuffled train) laid out once.
 * Padded: each split's staging holds nb_all batches of the fixed totals. */
static pl_status graphs_staging(graph *G) {
    pl_device dev = dev_of(G);
    const int ps = G->predict;
    int64_t max_nodes = 0, max_edges = 0, max_ng = 0;
    static const char *fname[NB_FIELDS] = {"x", "edge_src", "edge_dst",  "batch",
                                           "y", "graph",    "graph_mask"};
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        gsplit *S = &G->sp[s];
        if (ps >= 0 && s != ps) continue; /* predict: one split */
        if (G->pad && (G->pad_nodes > INT64_MAX / 64 / (G->F + 1) / S->nb_all ||
                       G->pad_edges > INT64_MAX / 64 / S->nb_all ||
                       G->pad_graphs > INT64_MAX / 64 / (G->K + 1) / S->nb_all))
            return pl_error_set(PL_ERR_CONFIG,
                                "%s: pad_nodes = %lld, pad_edges = %lld, pad_graphs = %lld: %lld "
                                "batches of split '%s' at these totals overflow a tensor's size",
                                G->path, (long long)G->pad_nodes, (long long)G->pad_edges,
                                (long long)G->pad_graphs, (long long)S->nb_all,
                                pl_split_name((pl_data_split)s));
        S->xrows = G->pad ? S->nb_all * G->pad_nodes : S->nodes;
        S->erows = G->pad ? S->nb_all * G->pad_edges : S->edges;
        S->yrows = G->pad ? S->nb_all * G->pad_graphs : S->ng;
        S->x = lk_new_tensor(PL_F32, 2, (int64_t[]){S->xrows, G->F}, dev);
        S->src = lk_new_tensor(PL_I64, 1, (int64_t[]){S->erows}, dev);
        S->dst = lk_new_tensor(PL_I64, 1, (int64_t[]){S->erows}, dev);
        S->batch = lk_new_tensor(PL_I64, 1, (int64_t[]){S->xrows}, dev);
        if (G->has_y) S->y = lk_new_tensor(PL_F32, 2, (int64_t[]){S->yrows, G->K}, dev);
        if (G->pad) S->gmask = lk_new_tensor(PL_F32, 1, (int64_t[]){S->yrows}, dev);
        /* predict: each graph's index in the file, in serving (file) order */
        if (ps >= 0) S->gid = lk_to_device(dev, PL_I64, 1, (int64_t[]){S->ng}, S->ids);
        if (!S->x || !S->src || !S->dst || !S->batch || (G->has_y && !S->y) ||
            (ps >= 0 && !S->gid) || (G->pad && !S->gmask))
            return pl_error_prefix(pl_error_status() ? pl_error_status() : PL_ERR_NOMEM,
                                   "%s: staging tensors of split '%s'", G->path,
                                   pl_split_name((pl_data_split)s));
        pl_tensor *t[NB_FIELDS] = {S->x, S->src, S->dst, S->batch, S->y, S->gid, S->gmask};
        for (int i = 0; i < NB_FIELDS; i++)
            if (t[i]) pl_tensor_set_name(t[i], "%s", fname[i]);
        max_nodes = S->xrows > max_nodes ? S->xrows : max_nodes;
        max_edges = S->erows > max_edges ? S->erows : max_edges;
        max_ng = S->yrows > max_ng ? S->yrows : max_ng;
    }
    if (!pl_device_eq(dev, PL_CPU)) {
        G->sx = malloc(sizeof *G->sx * (size_t)(max_nodes * G->F + 1));
        G->sy = malloc(sizeof *G->sy * (size_t)(max_ng * G->K + 1));
        G->ssrc = malloc(sizeof *G->ssrc * (size_t)(max_edges + 1));
        G->sdst = malloc(sizeof *G->sdst * (size_t)(max_edges + 1));
        G->sbatch = malloc(sizeof *G->sbatch * (size_t)(max_nodes + 1));
        G->sgmask = malloc(sizeof *G->sgmask * (size_t)(max_ng + 1));
        if (!G->sx || !G->sy || !G->ssrc || !G->sdst || !G->sbatch || !G->sgmask)
            return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", G->path);
    }
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        if ((s == PL_SPLIT_TRAIN && G->shuffle) || G->sp[s].ng == 0) continue;
        pl_status st = gr_arrange(G, &G->sp[s], -1);
        if (st) return st;
        G->sp[s].arranged_epoch = 0;
    }
    return PL_OK;
}

/* The graphs' counts and target statistics as meta; the data line. */
static void graphs_meta(const graph *G, pl_meta *meta, const graphs_in *in) {
    pl_meta_set_int(meta, "num_features", G->F);
    pl_meta_set_int(meta, "num_targets", G->K);
    pl_meta_set_int(meta, "num_graphs", G->NG);
    pl_meta_set_int(meta, "num_train", G->sp[0].ng);
    pl_meta_set_int(meta, "num_val", G->sp[1].ng);
    pl_meta_set_int(meta, "num_test", G->sp[2].ng);
    for (int64_t kk = 0; kk < G->K; kk++) {
        char key[64];
        snprintf(key, sizeof key, "target_mean_%lld", (long long)kk);
        pl_meta_set_float(meta, key, in->mean[kk]);
        snprintf(key, sizeof key, "target_std_%lld", (long long)kk);
        pl_meta_set_float(meta, key, in->sd[kk]);
    }
    pl_meta_set_str(meta, "task", "graph_regression");
    char line[512];
    snprintf(line, sizeof line,
             "%s: %lld graphs, %lld node features, %lld targets; train %lld, val %lld, test %lld "
             "graphs",
             G->path, (long long)G->NG, (long long)G->F, (long long)G->K, (long long)G->sp[0].ng,
             (long long)G->sp[1].ng, (long long)G->sp[2].ng);
    if (G->pad) {
        int64_t n = strlen(line) < sizeof line ? (int64_t)strlen(line) : 0;
        snprintf(line + n, sizeof line - (size_t)n,
                 "; padded to %lld nodes, %lld edges, %lld graphs a batch%s",
                 (long long)G->pad_nodes, (long long)G->pad_edges, (long long)G->pad_graphs,
                 G->pad_derived ? " (the largest possible batch)" : "");
    }
    pl_meta_set_int(meta, "pad_graphs", G->pad ? G->pad_graphs : 0);
    pl_meta_set_str(meta, "data_summary", line);
}

pl_status gr_create_graphs(graph *G, const pl_config_section *cfg, pl_run_context *ctx,
                           bool features_set) {
    graphs_in in = {0};
    in.xname = features_set ? pl_cfg_str(cfg, "features", "x") : "x";
    in.einame = pl_cfg_str(cfg, "edge_index", "edge_index");
    in.npname = pl_cfg_str(cfg, "node_ptr", "node_ptr");
    in.epname = pl_cfg_str(cfg, "edge_ptr", "edge_ptr");
    in.yname = pl_cfg_str(cfg, "targets", "y");
    in.loops = pl_cfg_bool(cfg, "add_self_loops", false);
    in.norm = pl_cfg_bool(cfg, "row_normalize", false);
    in.standardize = pl_cfg_bool(cfg, "standardize_targets", true);
    G->B = pl_cfg_int(cfg, "batch_size", 32);
    G->shuffle = G->predict < 0 && pl_cfg_bool(cfg, "shuffle", true); /* predict: file order */
    G->drop_last = pl_cfg_bool(cfg, "drop_last", false);
    /* pad: static batch shapes; auto: on a device other than the CPU
     * (cuda_graphs captures a step of fixed shapes); predict: never */
    const char *pad = pl_cfg_str(cfg, "pad", "off");
    G->pad = G->predict < 0 &&
             (!strcmp(pad, "on") || (!strcmp(pad, "auto") && !pl_device_eq(dev_of(G), PL_CPU)));
    pl_status st = graphs_read_file(G, cfg, &in);
    if (!st) st = graphs_check(G, &in);
    if (!st) st = graphs_edges(G, &in);
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        G->sp[s].arranged_epoch = -1;
        if (in.m[s]) st = graphs_split(G, cfg, in.m[s], s); /* predict: one split */
    }
    if (!st) st = graphs_standardize(G, &in);
    if (!st && G->pad) st = graphs_pad_budgets(G, cfg);
    if (!st) st = graphs_staging(G);
    if (!st && ctx && ctx->meta) graphs_meta(G, ctx->meta, &in);
    if (!st && G->predict < 0)
        st = write_run_standardization(G, in.yname, in.mean, in.sd, in.standardize);
    if (!st) G->st.chunks_loaded = 1;
    graphs_in_free(&in);
    return st;
}
