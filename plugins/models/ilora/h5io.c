/* h5io.c - the ilora model's HDF5 I/O: reading the per-user history CSR
 * (items to exclude at ranking) and exporting teacher outputs.
 *
 * Export layout of OUTPUTS/teacher_outputs.h5 (K = export_top_k, L = max_len):
 *   /train/input_ids   i32 [N_rows, L]  the training rows in the order the loader
 *   /train/labels      i32 [N_rows, L]  gave them (copies, so the file stands alone
 *                                       whatever the loader's shuffling)
 *   /train/source_row  i32 [N_rows]     row of the data file's /train/input_ids when the
 *                                       batch has the `row_field` field, else -1
 *   /train/topk_ids    i32 [N_pos, K]   best K item ids per labelled training position
 *   /train/topk_logits f32 [N_pos, K]   their logits / T, descending
 *   /train/row         i32 [N_pos]      row of /train/input_ids OF THIS FILE
 *   /train/pos         i32 [N_pos]      position 0..L-1 within the row
 *   /train/label       i32 [N_pos]      the true next item at that position
 *   /val|test/topk_ids, topk_logits     [U, K] for the last position of each user row
 *   /val|test/user     i32 [U]          user index (batch field `user_field`, else the
 *                                       running row number)
 *   /val|test/target   i32 [U]          held-out item (0 if the batch has none)
 * Root attributes: temperature (T), top_k, num_items, num_experts, adapters, model.
 * Every dataset is chunked and extendible (H5S_UNLIMITED rows) and grows per
 * batch. The padding id 0 is never exported; history items are NOT removed
 * (these are the model's raw preferences, for distillation).
 */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ilora.h"
#include "ranking.h"

/* ---- history CSR ---------------------------------------------------------------------------- */

static pl_status read_1d(hid_t f, const char *path, hid_t memtype, size_t esize, void **out,
                         int64_t *n, const char *file) {
    *out = NULL;
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    if (d < 0) return pl_error_set(PL_ERR_IO, "%s: dataset %s missing", file, path);
    hid_t sp = H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    int nd = H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    pl_status st = PL_OK;
    if (nd != 1) {
        st = pl_error_set(PL_ERR_IO, "%s: %s has %d dims, expected 1", file, path, nd);
    } else {
        *n = (int64_t)dims[0];
        *out = malloc(dims[0] ? dims[0] * esize : 1);
        if (!*out) st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory reading %s", file, path);
        else if (dims[0] && H5Dread(d, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
            st = pl_error_set(PL_ERR_IO, "%s: cannot read %s", file, path);
    }
    H5Dclose(d);
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

pl_status ilora_hist_load(ilora_model *m, const char *path) {
    H5E_auto2_t fn;
    void *cd;
    H5Eget_auto2(H5E_DEFAULT, &fn, &cd);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    pl_status st = PL_OK;
    if (f < 0) {
        st = pl_error_set(PL_ERR_IO, "ilora: history_path %s: cannot open as HDF5", path);
        goto out;
    }
    const pl_data_split sp[2] = {PL_SPLIT_VAL, PL_SPLIT_TEST};
    for (int s = 0; s < 2 && !st; s++) {
        char po[64], pi[64];
        snprintf(po, sizeof po, "/%s/history/offsets", pl_split_name(sp[s]));
        snprintf(pi, sizeof pi, "/%s/history/items", pl_split_name(sp[s]));
        ilora_hist *h = &m->hist[sp[s]];
        int64_t no = 0, ni = 0;
        st = read_1d(f, po, H5T_NATIVE_INT64, sizeof(int64_t), (void **)&h->offsets, &no, path);
        if (!st)
            st = read_1d(f, pi, H5T_NATIVE_INT32, sizeof(int32_t), (void **)&h->items, &ni, path);
        if (st) break;
        h->n_users = no - 1;
        if (no < 1 || h->offsets[0] != 0 || h->offsets[no - 1] != ni) {
            st = pl_error_set(PL_ERR_IO, "%s: %s is not a CSR over %s (%lld offsets, last %lld, "
                              "%lld items)", path, po, pi, (long long)no,
                              no ? (long long)h->offsets[no - 1] : -1LL, (long long)ni);
            break;
        }
        for (int64_t u = 0; u + 1 < no; u++)
            if (h->offsets[u + 1] < h->offsets[u]) {
                st = pl_error_set(PL_ERR_IO, "%s: %s decreases at user %lld", path, po,
                                  (long long)u);
                break;
            }
    }
    H5Fclose(f);
out:
    H5Eset_auto2(H5E_DEFAULT, fn, cd);
    if (st) ilora_hist_free(m);
    else m->have_hist = true;
    return st;
}

void ilora_hist_free(ilora_model *m) {
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        free(m->hist[s].offsets);
        free(m->hist[s].items);
        memset(&m->hist[s], 0, sizeof m->hist[s]);
    }
    m->have_hist = false;
}

/* ---- export ----------------------------------------------------------------------------------- */

/* A/B/C: row,pos,label | user,target; IN/LAB/SRC: train row copies */
enum { DS_IDS, DS_LOGITS, DS_A, DS_B, DS_C, DS_IN, DS_LAB, DS_SRC, DS_N };

struct ilora_export {
    hid_t file;
    hid_t ds[PL_SPLIT_COUNT][DS_N];
    int64_t rows[PL_SPLIT_COUNT];
    int64_t counter[PL_SPLIT_COUNT]; /* rows seen per split */
    char path[4096];
};

static hid_t make_ds(hid_t g, const char *name, hid_t type, int64_t width) {
    int nd = width > 0 ? 2 : 1;
    hsize_t dims[2] = {0, (hsize_t)width}, maxd[2] = {H5S_UNLIMITED, (hsize_t)width};
    hsize_t chunk[2] = {width > 0 ? (hsize_t)(width > 256 ? 64 : 1024) : 8192, (hsize_t)width};
    hid_t sp = H5Screate_simple(nd, dims, maxd);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(pl, nd, chunk);
    hid_t d = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    H5Pclose(pl);
    H5Sclose(sp);
    return d;
}

static pl_status append(ilora_export *e, hid_t d, hid_t memtype, int64_t start, int64_t n,
                        int64_t width, const void *data) {
    if (n == 0) return PL_OK;
    int nd = width > 0 ? 2 : 1;
    hsize_t size[2] = {(hsize_t)(start + n), (hsize_t)width};
    hsize_t off[2] = {(hsize_t)start, 0}, cnt[2] = {(hsize_t)n, (hsize_t)width};
    if (H5Dset_extent(d, size) < 0)
        return pl_error_set(PL_ERR_IO, "%s: cannot extend a dataset to %lld rows", e->path,
                            (long long)(start + n));
    hid_t fs = H5Dget_space(d);
    hid_t ms = H5Screate_simple(nd, cnt, NULL);
    herr_t r = H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL);
    if (r >= 0) r = H5Dwrite(d, memtype, ms, fs, H5P_DEFAULT, data);
    H5Sclose(ms);
    H5Sclose(fs);
    return r < 0 ? pl_error_set(PL_ERR_IO, "%s: write of %lld rows failed", e->path, (long long)n)
                 : PL_OK;
}

static pl_status attr_double(hid_t obj, const char *name, double v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t r = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return r < 0 ? pl_error_set(PL_ERR_IO, "cannot write attribute %s", name) : PL_OK;
}
static pl_status attr_int(hid_t obj, const char *name, int64_t v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_NATIVE_INT64, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t r = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT64, &v);
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return r < 0 ? pl_error_set(PL_ERR_IO, "cannot write attribute %s", name) : PL_OK;
}
static pl_status attr_str(hid_t obj, const char *name, const char *v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t r = a < 0 ? -1 : H5Awrite(a, t, v);
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
    return r < 0 ? pl_error_set(PL_ERR_IO, "cannot write attribute %s", name) : PL_OK;
}

pl_status ilora_export_begin(void *self, const char *outputs_dir) {
    ilora_model *m = self;
    if (m->exp) ilora_export_end(m);
    ilora_export *e = calloc(1, sizeof *e);
    if (!e) return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    snprintf(e->path, sizeof e->path, "%s/teacher_outputs.h5", outputs_dir);
    e->file = H5Fcreate(e->path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (e->file < 0) {
        free(e);
        return pl_error_set(PL_ERR_IO, "ilora: cannot create %s/teacher_outputs.h5", outputs_dir);
    }
    m->exp = e;
    int64_t K = m->o.export_top_k < m->vocab - 1 ? m->o.export_top_k : m->vocab - 1;
    pl_status st = PL_OK;
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        hid_t g = H5Gcreate2(e->file, pl_split_name((pl_data_split)s), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT);
        if (g < 0) {
            st = pl_error_set(PL_ERR_IO, "%s: cannot create group", e->path);
            break;
        }
        e->ds[s][DS_IDS] = make_ds(g, "topk_ids", H5T_STD_I32LE, K);
        e->ds[s][DS_LOGITS] = make_ds(g, "topk_logits", H5T_IEEE_F32LE, K);
        if (s == PL_SPLIT_TRAIN) {
            e->ds[s][DS_A] = make_ds(g, "row", H5T_STD_I32LE, 0);
            e->ds[s][DS_B] = make_ds(g, "pos", H5T_STD_I32LE, 0);
            e->ds[s][DS_C] = make_ds(g, "label", H5T_STD_I32LE, 0);
            e->ds[s][DS_IN] = make_ds(g, "input_ids", H5T_STD_I32LE, m->o.max_len);
            e->ds[s][DS_LAB] = make_ds(g, "labels", H5T_STD_I32LE, m->o.max_len);
            e->ds[s][DS_SRC] = make_ds(g, "source_row", H5T_STD_I32LE, 0);
        } else {
            e->ds[s][DS_A] = make_ds(g, "user", H5T_STD_I32LE, 0);
            e->ds[s][DS_B] = make_ds(g, "target", H5T_STD_I32LE, 0);
            for (int k = DS_C; k < DS_N; k++)
                e->ds[s][k] = H5I_INVALID_HID;
        }
        H5Gclose(g);
        for (int k = 0; k < (s == PL_SPLIT_TRAIN ? DS_N : DS_C); k++)
            if (e->ds[s][k] < 0)
                st = pl_error_set(PL_ERR_IO, "%s: cannot create the datasets of /%s", e->path,
                                  pl_split_name((pl_data_split)s));
    }
    static const char *const ad[] = {"none", "lora", "moe_lora"};
    if (!st) st = attr_double(e->file, "temperature", m->o.export_temperature);
    if (!st) st = attr_int(e->file, "top_k", K);
    if (!st) st = attr_int(e->file, "num_items", m->vocab - 1);
    if (!st) st = attr_int(e->file, "num_experts", m->o.num_experts);
    if (!st) st = attr_str(e->file, "adapters", ad[m->o.adapters]);
    if (!st) st = attr_str(e->file, "model", "ilora");
    if (!st)
        st = attr_str(e->file, "logits",
                      "topk_logits = model logits / temperature, best first; item 0 (padding) "
                      "never exported; history items not removed");
    if (st) {
        pl_error_prefix(st, "ilora export");
        ilora_export_end(m);
    }
    return st;
}

/* Top-K of each row of logits [n, V] (host f32) with item 0 removed and / T. */
static void topk_rows(const float *lg, int64_t n, int64_t V, int64_t K, double T, int32_t *ids,
                      float *vals) {
#pragma omp parallel
    {
        float *row = malloc((size_t)V * sizeof *row);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            if (!row) continue;
            memcpy(row, lg + i * V, (size_t)V * sizeof *row);
            row[0] = -INFINITY;
            ilora_topk(row, V, K, ids + i * K, vals + i * K);
            for (int64_t j = 0; j < K; j++)
                vals[i * K + j] = (float)(vals[i * K + j] / T);
        }
        free(row);
    }
}

static pl_tensor *field(const pl_batch *b, const char *name) {
    for (int i = 0; i < b->n; i++)
        if (b->names[i] && !strcmp(b->names[i], name)) return b->fields[i];
    return NULL;
}

static pl_tensor *host_i64(pl_tensor *t) {
    return t ? pl_tensor_to(t, PL_I64, PL_CPU) : NULL;
}

pl_status ilora_export_batch(void *self, const pl_batch *b, pl_data_split split) {
    ilora_model *m = self;
    ilora_export *e = m->exp;
    if (!e) return pl_error_set(PL_ERR_INVALID, "ilora: export_batch before export_begin");
    pl_tensor *ids = field(b, m->o.input_field);
    if (!ids || ids->ndim != 2)
        return pl_error_set(PL_ERR_INVALID, "ilora export: batch has no [B, L] field '%s'",
                            m->o.input_field);
    int64_t B = ids->shape[0], L = ids->shape[1], V = m->vocab;
    int64_t K = m->o.export_top_k < V - 1 ? m->o.export_top_k : V - 1;
    pl_status st = PL_OK;
    pl_tensor *h = ilora_hidden(m, ids, false);
    if (!h) return pl_error_status();
    int64_t n = 0;
    int32_t *a = NULL, *bb = NULL, *c = NULL;
    pl_tensor *sel = NULL;
    if (split == PL_SPLIT_TRAIN) {
        pl_tensor *lab = host_i64(field(b, m->o.label_field));
        if (!lab || lab->ndim != 2 || lab->shape[0] != B || lab->shape[1] != L)
            return pl_error_set(PL_ERR_INVALID, "ilora export: train batch has no [B, L] field "
                                "'%s'", m->o.label_field);
        if (L != m->o.max_len)
            return pl_error_set(PL_ERR_SHAPE, "ilora export: train rows have %lld positions, "
                                "max_len is %lld (the export stores [rows, max_len])",
                                (long long)L, (long long)m->o.max_len);
        pl_tensor *src = host_i64(field(b, m->o.row_field));
        pl_tensor *idh = host_i64(ids);
        if (!idh) return pl_error_status();
        const int64_t *lv = pl_tensor_data(lab), *iv = pl_tensor_data(idh);
        int64_t *pos = malloc((size_t)(B * L) * sizeof *pos);
        a = malloc((size_t)(B * L) * sizeof *a);
        bb = malloc((size_t)(B * L) * sizeof *bb);
        c = malloc((size_t)(B * L) * sizeof *c);
        int32_t *cin = malloc((size_t)(B * L) * sizeof *cin);
        int32_t *clab = malloc((size_t)(B * L) * sizeof *clab);
        int32_t *csrc = malloc((size_t)B * sizeof *csrc);
        if (!pos || !a || !bb || !c || !cin || !clab || !csrc)
            st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        for (int64_t i = 0; !st && i < B * L; i++) {
            cin[i] = (int32_t)iv[i];
            clab[i] = (int32_t)lv[i];
            if (i % L == 0)
                csrc[i / L] = src ? (int32_t)((const int64_t *)pl_tensor_data(src))[i / L] : -1;
            if (lv[i] == 0) continue;
            a[n] = (int32_t)(e->counter[split] + i / L);
            bb[n] = (int32_t)(i % L);
            c[n] = (int32_t)lv[i];
            pos[n++] = i;
        }
        int64_t r0 = e->counter[split];
        hid_t *ds = e->ds[split];
        if (!st) st = append(e, ds[DS_IN], H5T_NATIVE_INT32, r0, B, L, cin);
        if (!st) st = append(e, ds[DS_LAB], H5T_NATIVE_INT32, r0, B, L, clab);
        if (!st) st = append(e, ds[DS_SRC], H5T_NATIVE_INT32, r0, B, 0, csrc);
        free(cin);
        free(clab);
        free(csrc);
        e->counter[split] += B;
        if (!st && n > 0) {
            pl_tensor *pi = pl_tensor_from_data(PL_I64, 1, (int64_t[]){n}, pos, m->ctx->device);
            sel = pl_index_select(pl_reshape(h, 2, (int64_t[]){-1, m->o.dim}), 0, pi);
            if (!sel) st = pl_error_status();
        }
        free(pos);
    } else {
        n = B;
        pl_tensor *us = host_i64(field(b, m->o.user_field));
        pl_tensor *tg = host_i64(field(b, m->o.target_field));
        a = malloc((size_t)B * sizeof *a);
        bb = malloc((size_t)B * sizeof *bb);
        if (!a || !bb) st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        for (int64_t i = 0; !st && i < B; i++) {
            a[i] = (int32_t)(us ? ((const int64_t *)pl_tensor_data(us))[i] : e->counter[split] + i);
            bb[i] = tg ? (int32_t)((const int64_t *)pl_tensor_data(tg))[i] : 0;
        }
        e->counter[split] += B;
        if (!st) {
            sel = pl_reshape(pl_slice(h, 1, L - 1, L), 2, (int64_t[]){B, m->o.dim});
            if (!sel) st = pl_error_status();
        }
    }
    int32_t *tids = NULL;
    float *tvals = NULL;
    if (!st && n > 0) {
        pl_tensor *lg = pl_tensor_to(ilora_logits(m, sel), PL_F32, PL_CPU);
        tids = malloc((size_t)(n * K) * sizeof *tids);
        tvals = malloc((size_t)(n * K) * sizeof *tvals);
        if (!lg) st = pl_error_status();
        else if (!tids || !tvals) st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        else topk_rows(pl_tensor_f32(lg), n, V, K, m->o.export_temperature, tids, tvals);
    }
    int64_t r0 = e->rows[split];
    hid_t *ds = e->ds[split];
    if (!st) st = append(e, ds[DS_IDS], H5T_NATIVE_INT32, r0, n, K, tids);
    if (!st) st = append(e, ds[DS_LOGITS], H5T_NATIVE_FLOAT, r0, n, K, tvals);
    if (!st) st = append(e, ds[DS_A], H5T_NATIVE_INT32, r0, n, 0, a);
    if (!st) st = append(e, ds[DS_B], H5T_NATIVE_INT32, r0, n, 0, bb);
    if (!st && split == PL_SPLIT_TRAIN) st = append(e, ds[DS_C], H5T_NATIVE_INT32, r0, n, 0, c);
    if (!st) e->rows[split] += n;
    free(a);
    free(bb);
    free(c);
    free(tids);
    free(tvals);
    return st;
}

pl_status ilora_export_end(void *self) {
    ilora_model *m = self;
    ilora_export *e = m->exp;
    if (!e) return PL_OK;
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        for (int k = 0; k < DS_N; k++)
            if (e->ds[s][k] > 0) H5Dclose(e->ds[s][k]);
    herr_t r = H5Fclose(e->file);
    pl_status st = r < 0 ? pl_error_set(PL_ERR_IO, "ilora: closing %s failed", e->path) : PL_OK;
    free(e);
    m->exp = NULL;
    return st;
}
