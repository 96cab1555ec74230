/* graph_io.c - hdf5_graph: what node and graphs mode both need to read a
 * file and a run directory: datasets, edges (range check, self loops), row
 * normalization, the split masks under `pipeline predict`, the run's JSON
 * files. Calls nothing of the plugin's other files. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5_graph.h"

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
void normalize_rows(float *x, int64_t r0, int64_t r1, int64_t F) {
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
int64_t bad_edge(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n, int *row) {
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
int64_t copy_edges(const int64_t *ei, int64_t E, int64_t e0, int64_t e1, int64_t n, bool loops,
                   int64_t *src, int64_t *dst, int64_t k) {
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

const char *const split_mask_key[PL_SPLIT_COUNT] = {"train_mask", "val_mask", "test_mask"};

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
pl_status read_predict_mask(graph *G, hid_t f, const pl_config_section *cfg, int64_t n,
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
pl_status run_json_write(const graph *G, const char *name, cJSON *root) {
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
pl_status run_json_read(const graph *G, const char *name, char *path, size_t np, cJSON **out) {
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
pl_status json_int(const cJSON *root, const char *path, const char *key, int64_t lo, int64_t hi,
                   int64_t *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return pl_error_set(PL_ERR_IO, "%s: '%s' must be an integer in %lld..%lld", path, key,
                            (long long)lo, (long long)hi);
    *v = (int64_t)it->valuedouble;
    return PL_OK;
}
