/* teacher_export.c - the ilora model's teacher-output exporter
 * (teacher_export.h): every train/val/test batch's top-K logits, written
 * through the shared HDF5 helpers under the process-wide HDF5 lock (pl_h5.h;
 * the model's forward runs outside it).
 *
 * Export layout of OUTPUTS/teacher_outputs.h5 (K = export_top_k, L = max_len):
 *   /train/input_ids   i32 [N_rows, L]  the training rows in the order the loader
 *   /train/labels      i32 [N_rows, L]  gave them (copies, so the file stands alone
 *                                       whatever the loader's shuffling)
 *   /train/source_row  i32 [N_rows]     row of the data file's /train/input_ids when the
 *                                       batch has the `row_field` field, else -1
 *   /train/topk_ids    i32 [N_pos, K]   best K item ids per labelled training position
 *   /train/topk_logits f32 [N_pos, K]   their logits / T, descending
 *   /train/lognorm     f32 [N_pos]      log-normalizer over every item 1..N of logits / T:
 *                                       logsumexp_i (z_i / T), so the teacher's softened
 *                                       probability of item k is exp(topk_logit - lognorm)
 *                                       and 1 - sum_k of them is the mass beyond the top K
 *   /train/row         i32 [N_pos]      row of /train/input_ids OF THIS FILE
 *   /train/pos         i32 [N_pos]      position 0..L-1 within the row
 *   /train/label       i32 [N_pos]      the true next item at that position
 *   /val|test/topk_ids, topk_logits     [U, K] for the last position of each user row
 *   /val|test/lognorm  f32 [U]          as /train/lognorm, for that position
 *   /val|test/user     i32 [U]          user index (batch field `user_field`, else the
 *                                       running row number)
 *   /val|test/target   i32 [U]          held-out item (0 if the batch has none)
 * Root attributes: temperature (T), top_k, num_items, num_experts, adapters, model.
 * Every dataset is chunked and extendible (H5S_UNLIMITED rows) and grows per
 * batch. The padding id 0 is never exported; history items are NOT removed
 * (these are the model's raw preferences, for distillation).
 */
#include "teacher_export.h"

#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ilora.h"
#include "pl_h5.h"
#include "ranking.h"

/* A/B/C: row,pos,label | user,target; IN/LAB/SRC: train row copies */
enum { DS_IDS, DS_LOGITS, DS_LOGNORM, DS_A, DS_B, DS_C, DS_IN, DS_LAB, DS_SRC, DS_N };

struct ilora_export {
    hid_t file;
    hid_t ds[PL_SPLIT_COUNT][DS_N];
    int64_t rows[PL_SPLIT_COUNT];
    int64_t counter[PL_SPLIT_COUNT]; /* rows seen per split */
    char path[4096]; /* where it is being written: final + ".tmp.<pid>" */
    char final[4096]; /* renamed to this once complete (export_end) */
};

static pl_status append(ilora_export *e, hid_t d, hid_t memtype, int64_t start, int64_t n,
                        int64_t width, const void *data) {
    return pl_h5_append_rows(e->path, d, memtype, start, n, width, data);
}

static void close_datasets(ilora_export *e) {
    pl_h5_lock();
    for (int s = 0; s < PL_SPLIT_COUNT; s++)
        for (int k = 0; k < DS_N; k++)
            if (e->ds[s][k] > 0) H5Dclose(e->ds[s][k]);
    pl_h5_unlock();
    memset(e->ds, 0, sizeof e->ds);
}

pl_status ilora_export_begin(void *self, const char *outputs_dir) {
    ilora_model *m = self;
    if (m->exp) ilora_export_end(m);
    ilora_export *e = calloc(1, sizeof *e);
    if (!e) return pl_error_set(PL_ERR_NOMEM, "ilora: out of memory");
    /* written under a temporary name and renamed when complete, so a failed
     * or interrupted export (disk full) never leaves a partial file under
     * the final name */
    snprintf(e->final, sizeof e->final, "%s/teacher_outputs.h5", outputs_dir);
    snprintf(e->path, sizeof e->path, "%s.tmp.%ld", e->final, (long)getpid());
    pl_status st = pl_h5_create(e->path, &e->file);
    if (st) {
        free(e);
        return pl_error_prefix(st, "ilora export");
    }
    m->exp = e;
    int64_t K = m->o.export_top_k < m->vocab - 1 ? m->o.export_top_k : m->vocab - 1;
    const char *p = e->path;
    for (int s = 0; s < PL_SPLIT_COUNT && !st; s++) {
        hid_t g;
        pl_h5_lock();
        H5E_BEGIN_TRY {
            g = H5Gcreate2(e->file, pl_split_name((pl_data_split)s), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT);
        }
        H5E_END_TRY;
        pl_h5_unlock();
        if (g < 0) {
            st = pl_error_set(PL_ERR_IO, "%s: cannot create group /%s", p,
                              pl_split_name((pl_data_split)s));
            break;
        }
        hid_t *ds = e->ds[s];
        st = pl_h5_create_rows(p, g, "topk_ids", H5T_STD_I32LE, K, &ds[DS_IDS]);
        if (!st) st = pl_h5_create_rows(p, g, "topk_logits", H5T_IEEE_F32LE, K, &ds[DS_LOGITS]);
        if (!st) st = pl_h5_create_rows(p, g, "lognorm", H5T_IEEE_F32LE, 0, &ds[DS_LOGNORM]);
        if (s == PL_SPLIT_TRAIN) {
            if (!st) st = pl_h5_create_rows(p, g, "row", H5T_STD_I32LE, 0, &ds[DS_A]);
            if (!st) st = pl_h5_create_rows(p, g, "pos", H5T_STD_I32LE, 0, &ds[DS_B]);
            if (!st) st = pl_h5_create_rows(p, g, "label", H5T_STD_I32LE, 0, &ds[DS_C]);
            if (!st) st = pl_h5_create_rows(p, g, "input_ids", H5T_STD_I32LE, m->o.max_len, &ds[DS_IN]);
            if (!st) st = pl_h5_create_rows(p, g, "labels", H5T_STD_I32LE, m->o.max_len, &ds[DS_LAB]);
            if (!st) st = pl_h5_create_rows(p, g, "source_row", H5T_STD_I32LE, 0, &ds[DS_SRC]);
        } else {
            if (!st) st = pl_h5_create_rows(p, g, "user", H5T_STD_I32LE, 0, &ds[DS_A]);
            if (!st) st = pl_h5_create_rows(p, g, "target", H5T_STD_I32LE, 0, &ds[DS_B]);
            for (int k = DS_C; k < DS_N; k++)
                ds[k] = H5I_INVALID_HID;
        }
        pl_h5_lock();
        H5Gclose(g);
        pl_h5_unlock();
    }
    static const char *const ad[] = {"none", "lora", "moe_lora"};
    if (!st) st = pl_h5_attr_write_double(p, e->file, "temperature", m->o.export_temperature);
    if (!st) st = pl_h5_attr_write_int(p, e->file, "top_k", K);
    if (!st) st = pl_h5_attr_write_int(p, e->file, "num_items", m->vocab - 1);
    if (!st) st = pl_h5_attr_write_int(p, e->file, "num_experts", m->o.num_experts);
    if (!st) st = pl_h5_attr_write_str(p, e->file, "adapters", ad[m->o.adapters]);
    if (!st) st = pl_h5_attr_write_str(p, e->file, "model", "ilora");
    if (!st)
        st = pl_h5_attr_write_str(p, e->file, "logits",
                                  "topk_logits = model logits / temperature, best first; item 0 "
                                  "(padding) never exported; history items not removed; lognorm = "
                                  "logsumexp over items 1..num_items of logits / temperature");
    if (st) {
        pl_error_prefix(st, "ilora export");
        ilora_export_end(m);
    }
    return st;
}

/* Top-K of each row of logits [n, V] (host f32) with item 0 removed and / T,
 * and the row's log-normalizer logsumexp_{i >= 1} (z_i / T) (in double). */
static void topk_rows(const float *lg, int64_t n, int64_t V, int64_t K, double T, int32_t *ids,
                      float *vals, float *lognorm) {
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
            double mx = -INFINITY, sum = 0;
            for (int64_t v = 1; v < V; v++)
                if (row[v] / T > mx) mx = row[v] / T;
            for (int64_t v = 1; v < V; v++)
                sum += expf((float)(row[v] / T - mx));
            lognorm[i] = (float)(mx + log(sum));
        }
        free(row);
    }
}

static pl_tensor *host_i64(pl_tensor *t) {
    return t ? pl_tensor_to(t, PL_I64, PL_CPU) : NULL;
}

pl_status ilora_export_batch(void *self, const pl_batch *b, pl_data_split split) {
    ilora_model *m = self;
    ilora_export *e = m->exp;
    if (!e) return pl_error_set(PL_ERR_INVALID, "ilora: export_batch before export_begin");
    pl_tensor *ids = pl_batch_find(b, m->o.input_field);
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
        pl_tensor *lab = host_i64(pl_batch_find(b, m->o.label_field));
        if (!lab || lab->ndim != 2 || lab->shape[0] != B || lab->shape[1] != L)
            return pl_error_set(PL_ERR_INVALID, "ilora export: train batch has no [B, L] field "
                                "'%s'", m->o.label_field);
        if (L != m->o.max_len)
            return pl_error_set(PL_ERR_SHAPE, "ilora export: train rows have %lld positions, "
                                "max_len is %lld (the export stores [rows, max_len])",
                                (long long)L, (long long)m->o.max_len);
        pl_tensor *src = host_i64(pl_batch_find(b, m->o.row_field));
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
        pl_tensor *us = host_i64(pl_batch_find(b, m->o.user_field));
        pl_tensor *tg = host_i64(pl_batch_find(b, m->o.target_field));
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
    float *tvals = NULL, *tnorm = NULL;
    if (!st && n > 0) {
        pl_tensor *lg = pl_tensor_to(ilora_logits(m, sel), PL_F32, PL_CPU);
        tids = malloc((size_t)(n * K) * sizeof *tids);
        tvals = malloc((size_t)(n * K) * sizeof *tvals);
        tnorm = malloc((size_t)n * sizeof *tnorm);
        if (!lg) st = pl_error_status();
        else if (!tids || !tvals || !tnorm)
            st = pl_error_set(PL_ERR_NOMEM, "ilora export: out of memory");
        else topk_rows(pl_tensor_f32(lg), n, V, K, m->o.export_temperature, tids, tvals, tnorm);
    }
    int64_t r0 = e->rows[split];
    hid_t *ds = e->ds[split];
    if (!st) st = append(e, ds[DS_IDS], H5T_NATIVE_INT32, r0, n, K, tids);
    if (!st) st = append(e, ds[DS_LOGITS], H5T_NATIVE_FLOAT, r0, n, K, tvals);
    if (!st) st = append(e, ds[DS_LOGNORM], H5T_NATIVE_FLOAT, r0, n, 0, tnorm);
    if (!st) st = append(e, ds[DS_A], H5T_NATIVE_INT32, r0, n, 0, a);
    if (!st) st = append(e, ds[DS_B], H5T_NATIVE_INT32, r0, n, 0, bb);
    if (!st && split == PL_SPLIT_TRAIN) st = append(e, ds[DS_C], H5T_NATIVE_INT32, r0, n, 0, c);
    if (!st) e->rows[split] += n;
    free(a);
    free(bb);
    free(c);
    free(tids);
    free(tvals);
    free(tnorm);
    return st;
}

pl_status ilora_export_end(void *self) {
    ilora_model *m = self;
    ilora_export *e = m->exp;
    if (!e) return PL_OK;
    close_datasets(e);
    pl_status st = pl_h5_close(e->path, e->file);
    if (!st && rename(e->path, e->final) != 0)
        st = pl_error_set(PL_ERR_IO, "%s: renaming to %s failed: %s", e->path, e->final,
                          strerror(errno));
    if (st) unlink(e->path);
    free(e);
    m->exp = NULL;
    return st ? pl_error_prefix(st, "ilora export") : PL_OK;
}

void ilora_export_abort(void *self) {
    ilora_model *m = self;
    ilora_export *e = m->exp;
    if (!e) return;
    close_datasets(e);
    pl_h5_close(e->path, e->file);
    pl_error_clear(); /* the error that aborted the export is the one to report */
    unlink(e->path);
    free(e);
    m->exp = NULL;
}
